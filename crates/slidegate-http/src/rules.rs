//! Which rule a request falls under: method and path pattern, first match wins.

use std::fmt;
use std::str::FromStr;

use http::Method;

/// A path pattern: literal text, `*` (any characters, `/` included) and
/// `{param}` (one non-empty path segment).
///
/// ```
/// use slidegate_http::PathPattern;
///
/// let p: PathPattern = "/api/videos/{id}/comments".parse()?;
/// assert!(p.matches("/api/videos/42/comments"));
/// assert!(!p.matches("/api/videos/42/7/comments"));
/// let glob: PathPattern = "/api/search*".parse()?;
/// assert!(glob.matches("/api/search") && glob.matches("/api/search/users"));
/// # Ok::<(), String>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    text: String,
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    Star,
    Param,
}

impl FromStr for PathPattern {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| {
            format!("invalid path pattern {s:?}: {why}; expected e.g. \"/api/search\", \"/api/search*\" or \"/api/videos/{{id}}\"")
        };
        if !s.starts_with(['/', '*']) {
            return Err(bad("it must start with '/' (or '*' for every path)"));
        }
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut chars = s.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '*' => {
                    if !literal.is_empty() {
                        parts.push(Part::Literal(std::mem::take(&mut literal)));
                    }
                    if parts.last() != Some(&Part::Star) {
                        parts.push(Part::Star);
                    }
                }
                '{' => {
                    if !literal.ends_with('/') {
                        return Err(bad("a {param} must fill a whole path segment"));
                    }
                    let mut name = String::new();
                    loop {
                        match chars.next() {
                            Some('}') => break,
                            Some(n) if n.is_ascii_alphanumeric() || n == '_' => name.push(n),
                            _ => return Err(bad("a '{' must be closed by '}' around a name")),
                        }
                    }
                    if name.is_empty() {
                        return Err(bad("a {param} needs a name"));
                    }
                    if !matches!(chars.peek(), None | Some('/')) {
                        return Err(bad("a {param} must fill a whole path segment"));
                    }
                    parts.push(Part::Literal(std::mem::take(&mut literal)));
                    parts.push(Part::Param);
                }
                '}' => return Err(bad("unmatched '}'")),
                '?' | '#' => return Err(bad("a pattern matches the path only, without query or fragment")),
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        Ok(PathPattern { text: s.to_owned(), parts })
    }
}

impl fmt::Display for PathPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl PathPattern {
    /// Whether `path` (without query) matches.
    pub fn matches(&self, path: &str) -> bool {
        match_parts(&self.parts, path)
    }
}

fn match_parts(parts: &[Part], path: &str) -> bool {
    match parts.split_first() {
        None => path.is_empty(),
        Some((Part::Literal(lit), rest)) => {
            path.strip_prefix(lit.as_str()).is_some_and(|p| match_parts(rest, p))
        }
        Some((Part::Param, rest)) => {
            let end = path.find('/').unwrap_or(path.len());
            end > 0 && match_parts(rest, &path[end..])
        }
        // Patterns are short and rarely hold more than one star: trying each
        // split point is cheap enough and obviously correct.
        Some((Part::Star, rest)) => {
            rest.is_empty()
                || path
                    .char_indices()
                    .map(|(i, _)| i)
                    .chain([path.len()])
                    .any(|i| match_parts(rest, &path[i..]))
        }
    }
}

/// Matches requests to rules: by method (any when the list is empty) and path.
#[derive(Debug, Clone)]
pub struct RuleMatcher {
    entries: Vec<(Vec<Method>, PathPattern)>,
}

impl RuleMatcher {
    /// A matcher over `(methods, pattern)` pairs, in priority order.
    pub fn new(entries: Vec<(Vec<Method>, PathPattern)>) -> Self {
        Self { entries }
    }

    /// The index of the first entry matching `method` and `path`. `HEAD`
    /// counts as `GET` (it is a GET without the body), so a rule on `GET`
    /// cannot be sidestepped with `HEAD`.
    pub fn find(&self, method: &Method, path: &str) -> Option<usize> {
        let applies = |methods: &[Method]| {
            methods.is_empty()
                || methods.contains(method)
                || (*method == Method::HEAD && methods.contains(&Method::GET))
        };
        self.entries.iter().position(|(methods, pattern)| applies(methods) && pattern.matches(path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PathPattern {
        s.parse().unwrap()
    }

    #[test]
    fn exact_patterns_match_only_themselves() {
        let exact = p("/api/videos/trending");
        assert!(exact.matches("/api/videos/trending"));
        assert!(!exact.matches("/api/videos/trending/"));
        assert!(!exact.matches("/api/videos/trendingx"));
        assert!(!exact.matches("/api/videos"));
    }

    #[test]
    fn stars_match_any_text_slashes_included() {
        let glob = p("/api/search*");
        for ok in ["/api/search", "/api/search/", "/api/searches", "/api/search/a/b"] {
            assert!(glob.matches(ok), "{ok}");
        }
        assert!(!glob.matches("/api/sear"));
        let middle = p("/static/*.png");
        assert!(middle.matches("/static/a/b.png"));
        assert!(!middle.matches("/static/a/b.jpg"));
        assert!(p("*").matches("/anything"));
        assert!(p("/a/*/c").matches("/a/b/x/c"));
    }

    #[test]
    fn params_match_exactly_one_non_empty_segment() {
        let param = p("/api/videos/{id}/comments");
        assert!(param.matches("/api/videos/42/comments"));
        assert!(!param.matches("/api/videos//comments"));
        assert!(!param.matches("/api/videos/4/2/comments"));
        let tail = p("/users/{id}");
        assert!(tail.matches("/users/7"));
        assert!(!tail.matches("/users/7/"));
        assert!(!tail.matches("/users/"));
    }

    #[test]
    fn malformed_patterns_say_why() {
        assert!("api".parse::<PathPattern>().unwrap_err().contains("must start with '/'"));
        assert!("/a{id}".parse::<PathPattern>().unwrap_err().contains("whole path segment"));
        assert!("/{id".parse::<PathPattern>().unwrap_err().contains("closed by '}'"));
        assert!("/{id}x".parse::<PathPattern>().unwrap_err().contains("whole path segment"));
        assert!("/{}".parse::<PathPattern>().unwrap_err().contains("needs a name"));
        assert!("/a?b=1".parse::<PathPattern>().unwrap_err().contains("without query"));
    }

    #[test]
    fn the_first_matching_rule_wins_and_methods_filter() {
        let m = RuleMatcher::new(vec![
            (vec![Method::GET], p("/api/videos/trending")),
            (vec![], p("/api/search*")),
            (vec![Method::POST], p("/api/*")),
        ]);
        assert_eq!(m.find(&Method::GET, "/api/videos/trending"), Some(0));
        assert_eq!(m.find(&Method::HEAD, "/api/videos/trending"), Some(0));
        assert_eq!(m.find(&Method::PUT, "/api/videos/trending"), None);
        assert_eq!(m.find(&Method::DELETE, "/api/search/x"), Some(1));
        assert_eq!(m.find(&Method::POST, "/api/videos/trending"), Some(2));
        assert_eq!(m.find(&Method::GET, "/health"), None);
    }
}
