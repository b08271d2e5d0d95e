//! Which rule a request falls under: method and path pattern, first match wins.
//!
//! Rules match the *normalised* path, so that `/api/videos/trending/`,
//! `//api/videos/trending`, `/api/./videos/trending` and
//! `/api/videos/%74rending` — which most upstreams serve as the same
//! resource — fall under the same rule. The request itself is forwarded
//! with its URI as received.
//!
//! The principle: slidegate never matches less than a widely used router
//! would. Routers disagree — Express keeps `%2F` inside a segment and treats
//! `;` as text, WSGI decodes `%2F` into a separator, Tomcat strips `;param`s,
//! IIS reads `\` as `/` and ignores trailing dots and spaces — so a rule
//! matches when it matches either reading: the [strict](normalize_path) one
//! or the [lenient](lenient_path) one. Literal text compares without regard
//! to ASCII case unless the pattern is [case
//! sensitive](PathPattern::case_sensitive) (Express, ASP.NET and IIS route
//! case-insensitively by default). Methods compare without regard to ASCII
//! case too (Django and Flask upper-case the method, so `get` is routed as
//! `GET`). A rule may also accept a [format
//! suffix](PathPattern::format_suffix) (`/x.json` as `/x`: Rails, Spring
//! before 5.3).

use std::borrow::Cow;
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
/// # Ok::<(), slidegate_http::PathPatternError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    text: String,
    parts: Vec<Part>,
    /// Literal text compares byte for byte; otherwise ASCII letters match
    /// either case.
    case_sensitive: bool,
    /// A path whose last segment has a `.suffix` also matches without it.
    format_suffix: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    Star,
    Param,
}

/// Why a path pattern could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid path pattern {pattern:?}: {reason}; expected e.g. \"/api/search\", \"/api/search*\" or \"/api/videos/{{id}}\""
)]
#[non_exhaustive]
pub struct PathPatternError {
    /// The pattern as written.
    pub pattern: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl FromStr for PathPattern {
    type Err = PathPatternError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason: &'static str| PathPatternError { pattern: s.to_owned(), reason };
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
        if s.len() > 1 && s.ends_with('/') {
            return Err(bad(
                "paths are matched without a trailing '/', so a pattern ending in '/' never matches",
            ));
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        Ok(PathPattern { text: s.to_owned(), parts, case_sensitive: false, format_suffix: false })
    }
}

impl fmt::Display for PathPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl PathPattern {
    /// Whether `path` (without query) matches: as it is or, with a [format
    /// suffix](Self::format_suffix), without the suffix of its last segment.
    pub fn matches(&self, path: &str) -> bool {
        match_parts(&self.parts, path, self.case_sensitive)
            || (self.format_suffix
                && without_format_suffixes(path).any(|p| match_parts(&self.parts, p, self.case_sensitive)))
    }

    /// Whether a path also matches without a format suffix on its last
    /// segment (default `false`): `/api/feed.json` and `/api/feed.xml` as
    /// `/api/feed`. Turn it on for routers that serve those from the
    /// handler of `/api/feed`: Rails (every route ends in an optional
    /// `(.:format)`), Spring MVC before 5.3 (suffix pattern matching on by
    /// default), Django REST framework's `format_suffix_patterns`. The
    /// suffix is cut at the last dot (Rails) and at the first (Spring's
    /// `/x.*`), never leaving the segment empty.
    ///
    /// ```
    /// use slidegate_http::PathPattern;
    ///
    /// let p: PathPattern = "/api/feed".parse()?;
    /// assert!(!p.matches("/api/feed.json"));
    /// let p = p.format_suffix(true);
    /// assert!(p.matches("/api/feed.json") && p.matches("/api/feed.tar.gz"));
    /// assert!(!p.matches("/api/feed/x.json") && !p.matches("/api/feedx.json"));
    /// # Ok::<(), slidegate_http::PathPatternError>(())
    /// ```
    #[must_use]
    pub fn format_suffix(mut self, format_suffix: bool) -> Self {
        self.format_suffix = format_suffix;
        self
    }

    /// Whether a format suffix is ignored.
    pub fn is_format_suffix(&self) -> bool {
        self.format_suffix
    }

    /// Whether literal text compares with case (default `false`: `/API/Search`
    /// matches `/api/search`, as Express, ASP.NET and IIS route). Set it only
    /// when the upstream routes case-sensitively; otherwise every spelling in
    /// another case would be an unlimited path to the same handler.
    ///
    /// ```
    /// use slidegate_http::PathPattern;
    ///
    /// let p: PathPattern = "/api/search".parse()?;
    /// assert!(p.matches("/API/Search"));
    /// assert!(!p.case_sensitive(true).matches("/API/Search"));
    /// # Ok::<(), slidegate_http::PathPatternError>(())
    /// ```
    #[must_use]
    pub fn case_sensitive(mut self, case_sensitive: bool) -> Self {
        self.case_sensitive = case_sensitive;
        self
    }

    /// Whether literal text compares with case.
    pub fn is_case_sensitive(&self) -> bool {
        self.case_sensitive
    }
}

/// `path` without the suffix of its last segment: cut at the last dot, then
/// at the first (two readings at most, so matching stays linear); none when
/// the segment has no dot after its first byte.
fn without_format_suffixes(path: &str) -> impl Iterator<Item = &str> {
    let start = path.rfind('/').map_or(0, |i| i + 1);
    let segment = &path[start..];
    let last = segment.rfind('.').filter(|&i| i > 0);
    let first = segment.find('.').filter(|&i| i > 0 && Some(i) != last);
    [last, first].into_iter().flatten().map(move |dot| &path[..start + dot])
}

/// Matches in time linear in `parts.len() * path.len()`: tokens are matched
/// left to right and, on a mismatch, only the most recent `*` takes one more
/// byte — never an earlier one. That suffices because what lies between two
/// stars (literals and `{param}`s) matched at an earlier position always ends
/// no later than matched at a later one (a literal has a fixed length, a
/// param runs to the next `/`), so the leftmost match of each star-free run
/// leaves the most room for the rest.
fn match_parts(parts: &[Part], path: &str, case_sensitive: bool) -> bool {
    let text = path.as_bytes();
    let (mut pi, mut ti) = (0, 0);
    // The part after the last `*` seen, and where in `text` that star stopped.
    let mut backtrack: Option<(usize, usize)> = None;
    loop {
        let step = match parts.get(pi) {
            Some(Part::Star) => {
                backtrack = Some((pi + 1, ti));
                Some(ti)
            }
            Some(Part::Literal(lit)) => {
                let lit = lit.as_bytes();
                let same = match text.get(ti..ti + lit.len()) {
                    Some(here) if case_sensitive => here == lit,
                    Some(here) => here.eq_ignore_ascii_case(lit),
                    None => false,
                };
                same.then_some(ti + lit.len())
            }
            Some(Part::Param) => {
                let len = text[ti..].iter().position(|&b| b == b'/').unwrap_or(text.len() - ti);
                (len > 0).then_some(ti + len)
            }
            None if ti == text.len() => return true,
            None => None,
        };
        match step {
            Some(next) => {
                pi += 1;
                ti = next;
            }
            None => match backtrack {
                // The star may stop at the end of the text but not past it.
                Some((after_star, star_ti)) if star_ti < text.len() => {
                    backtrack = Some((after_star, star_ti + 1));
                    (pi, ti) = (after_star, star_ti + 1);
                }
                _ => return false,
            },
        }
    }
}

/// Matches requests to rules: by method (any when the list is empty) and path.
#[derive(Debug, Clone)]
pub struct RuleMatcher {
    entries: Vec<(Vec<Method>, PathPattern)>,
}

/// The rule a request falls under, and the reading of its path that matched
/// the rule: what a breadth limit reads its value from, so that a value is
/// never looked for in a reading the rule did not match.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RuleMatch<'p> {
    /// The rule's index.
    pub index: usize,
    /// The path [normalised](normalize_path), or its [lenient
    /// reading](lenient_path) when only that matched.
    pub path: Cow<'p, str>,
}

impl RuleMatcher {
    /// A matcher over `(methods, pattern)` pairs, in priority order.
    pub fn new(entries: Vec<(Vec<Method>, PathPattern)>) -> Self {
        Self { entries }
    }

    /// The index of the first entry matching `method` and `path`, the path
    /// [normalised](normalize_path) first, or [leniently](lenient_path): an
    /// entry matches when either reading does, so no spelling a common router
    /// serves from the limited handler escapes the rule. `HEAD` counts as
    /// `GET` (it is a GET without the body), so a rule on `GET` cannot be
    /// sidestepped with `HEAD`. Methods compare without regard to ASCII
    /// case (`get` is `GET`, as Django and Flask route it); the request is
    /// forwarded with its method as received.
    pub fn find(&self, method: &Method, path: &str) -> Option<usize> {
        self.matching(method, path).map(|m| m.index)
    }

    /// As [`find`](Self::find), with the reading of the path that matched:
    /// the normalised one when it does, else the lenient one.
    pub fn matching<'p>(&self, method: &Method, path: &'p str) -> Option<RuleMatch<'p>> {
        let strict = normalize_path(path);
        // Most paths read the same both ways: skip the second reading then.
        let lenient = needs_lenient(path).then(|| lenient_path(path));
        let method = method.as_str();
        let head = method.eq_ignore_ascii_case("HEAD");
        let applies = |methods: &[Method]| {
            methods.is_empty()
                || methods.iter().any(|m| {
                    m.as_str().eq_ignore_ascii_case(method)
                        || (head && m.as_str().eq_ignore_ascii_case("GET"))
                })
        };
        for (index, (methods, pattern)) in self.entries.iter().enumerate() {
            if !applies(methods) {
                continue;
            }
            if pattern.matches(&strict) {
                return Some(RuleMatch { index, path: strict });
            }
            if let Some(l) = &lenient {
                if pattern.matches(l) {
                    return lenient.map(|path| RuleMatch { index, path });
                }
            }
        }
        None
    }
}

/// `path` as rules see it: percent-encoded unreserved characters
/// (`A-Z a-z 0-9 - . _ ~`) decoded, repeated `/` merged, `.` and `..`
/// segments resolved (`..` never climbs above the root) and a trailing `/`
/// dropped except for the root itself. Other escapes (`%2F`, `%20`, …) stay
/// as they are. Borrows, allocating nothing, when `path` is already normal;
/// a path not starting with `/` (`*`, an absolute URI) is returned as is.
///
/// ```
/// use slidegate_http::normalize_path;
///
/// assert_eq!(normalize_path("/api//videos/./%74rending/"), "/api/videos/trending");
/// assert_eq!(normalize_path("/a/b/../c%2Fd"), "/a/c%2Fd");
/// assert!(matches!(normalize_path("/api/videos"), std::borrow::Cow::Borrowed(_)));
/// ```
pub fn normalize_path(path: &str) -> Cow<'_, str> {
    if !path.starts_with('/') || is_normal(path) {
        return Cow::Borrowed(path);
    }
    let mut decoded = String::with_capacity(path.len());
    let mut rest = path;
    while let Some(i) = rest.find('%') {
        decoded.push_str(&rest[..i]);
        match unreserved_escape(&rest.as_bytes()[i..]) {
            Some(c) => {
                decoded.push(char::from(c));
                rest = &rest[i + 3..];
            }
            None => {
                decoded.push('%');
                rest = &rest[i + 1..];
            }
        }
    }
    decoded.push_str(rest);
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(decoded.len());
    for segment in &segments {
        out.push('/');
        out.push_str(segment);
    }
    if out.is_empty() {
        out.push('/');
    }
    Cow::Owned(out)
}

/// `path` as the most lenient of common routers reads it — the union of what
/// WSGI (Flask, Django), Tomcat/Spring and IIS do — for rule matching beside
/// [`normalize_path`]:
///
/// - `;param` path parameters are cut from every segment (Tomcat, Spring),
///   so `..;` is `..`;
/// - every escape is decoded once, `%2F` and `%5C` included (WSGI
///   `PATH_INFO`), and `\` separates segments like `/` (IIS);
/// - a decoded NUL ends the path (what a C-string router sees; `serve`
///   refuses such a request anyway, see [`refused_path`]);
/// - `.` and `..` segments are resolved, empty segments dropped, trailing
///   dots and spaces cut from every other segment (IIS), and leading and
///   trailing control characters and spaces, `%09` `%0A` `%0D` `%20` among
///   them (what Java's `String.trim` cuts: Spring's trimmed path tokens);
/// - the result is re-encoded canonically: only unreserved characters,
///   sub-delimiters other than `;`, `:` and `@` stay as they are, every other
///   byte is `%XX` with upper-case hex.
///
/// Idempotent, and always a path starting with `/`; a path not starting with
/// `/` (`*`, an absolute URI) is returned as is.
///
/// ```
/// use slidegate_http::lenient_path;
///
/// assert_eq!(lenient_path("/api%2Fsearch;jsessionid=1"), "/api/search");
/// assert_eq!(lenient_path("/api\\x\\..;\\search.%20"), "/api/search");
/// assert_eq!(lenient_path("/caf%c3%a9/a%20b"), "/caf%C3%A9/a%20b");
/// assert_eq!(lenient_path("/api/%20search%09%0D%0A"), "/api/search");
/// ```
pub fn lenient_path(path: &str) -> Cow<'_, str> {
    if !path.starts_with('/') {
        return Cow::Borrowed(path);
    }
    let mut segments: Vec<Vec<u8>> = Vec::new();
    for raw in path.split(['/', '\\']) {
        // Path parameters are cut before decoding, as Tomcat does: an
        // encoded `%3B` is text.
        let raw = raw.split(';').next().unwrap_or_default();
        let decoded = percent_decode(raw.as_bytes());
        let (decoded, ends) = match decoded.iter().position(|&b| b == 0) {
            Some(nul) => (&decoded[..nul], true),
            None => (&decoded[..], false),
        };
        for segment in decoded.split(|&b| b == b'/' || b == b'\\') {
            match segment {
                b"." => {}
                b".." => {
                    segments.pop();
                }
                s => {
                    let blank = |b: &&u8| **b <= b' ';
                    let start = s.iter().take_while(blank).count();
                    let end = s.len() - s.iter().rev().take_while(|&b| blank(&b) || *b == b'.').count();
                    if start < end {
                        segments.push(s[start..end].to_vec());
                    }
                }
            }
        }
        if ends {
            break;
        }
    }
    let mut out = String::with_capacity(path.len());
    for segment in &segments {
        out.push('/');
        for &b in segment {
            if b.is_ascii_alphanumeric() || b"-._~!$&'()*+,=:@".contains(&b) {
                out.push(char::from(b));
            } else {
                const HEX: &[u8; 16] = b"0123456789ABCDEF";
                out.push('%');
                out.push(char::from(HEX[usize::from(b >> 4)]));
                out.push(char::from(HEX[usize::from(b & 15)]));
            }
        }
    }
    if out.is_empty() {
        out.push('/');
    }
    if out == path {
        Cow::Borrowed(path)
    } else {
        Cow::Owned(out)
    }
}

/// Whether [`lenient_path`] may read `path` differently from
/// [`normalize_path`]: only with a byte outside the plain path characters
/// (`%`, `;`, `\`, …) or a segment ending in a dot.
fn needs_lenient(path: &str) -> bool {
    let plain = |b: &u8| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,=:@/".contains(b);
    !path.bytes().all(|b| plain(&b)) || path.split('/').any(|segment| segment.ends_with('.'))
}

/// Every `%XX` escape decoded; a `%` not followed by two hex digits stays.
pub(crate) fn percent_decode(bytes: &[u8]) -> Vec<u8> {
    let hex = |b: u8| char::from(b).to_digit(16).and_then(|d| u8::try_from(d).ok());
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| Some(hex(*bytes.get(i + 1)?)? * 16 + hex(*bytes.get(i + 2)?)?))
            .flatten();
        match escaped {
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    out
}

/// Why `serve` refuses a path outright, if it does: a NUL (`%00`), which
/// routers variously reject, keep, or treat as the end of the path — no
/// rule reading could stand for all of them, and no real resource needs it.
///
/// ```
/// assert!(slidegate_http::refused_path("/api/search%00.png").is_some());
/// assert!(slidegate_http::refused_path("/api/search%2000").is_none());
/// ```
pub fn refused_path(path: &str) -> Option<&'static str> {
    let bytes = path.as_bytes();
    let nul = bytes.contains(&0) || bytes.windows(3).any(|w| w == b"%00");
    nul.then_some("the path holds an encoded NUL (%00), which upstreams read in incompatible ways")
}

/// Whether `path` (starting with `/`) is already what [`normalize_path`] returns.
fn is_normal(path: &str) -> bool {
    if path == "/" {
        return true;
    }
    let bytes = path.as_bytes();
    if bytes.iter().enumerate().any(|(i, &b)| b == b'%' && unreserved_escape(&bytes[i..]).is_some()) {
        return false;
    }
    path[1..].split('/').all(|segment| !matches!(segment, "" | "." | ".."))
}

/// The unreserved character `%XX` at the start of `bytes` encodes, if any.
fn unreserved_escape(bytes: &[u8]) -> Option<u8> {
    let hex = |b: u8| char::from(b).to_digit(16);
    let (hi, lo) = (hex(*bytes.get(1)?)?, hex(*bytes.get(2)?)?);
    let c = u8::try_from(hi * 16 + lo).ok()?;
    (c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~')).then_some(c)
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
        assert!("api".parse::<PathPattern>().unwrap_err().to_string().contains("must start with '/'"));
        assert!("/a{id}".parse::<PathPattern>().unwrap_err().to_string().contains("whole path segment"));
        assert!("/{id".parse::<PathPattern>().unwrap_err().to_string().contains("closed by '}'"));
        assert!("/{id}x".parse::<PathPattern>().unwrap_err().to_string().contains("whole path segment"));
        assert!("/{}".parse::<PathPattern>().unwrap_err().to_string().contains("needs a name"));
        assert!("/a?b=1".parse::<PathPattern>().unwrap_err().to_string().contains("without query"));
        assert!("/users/".parse::<PathPattern>().unwrap_err().to_string().contains("never matches"));
        assert!("/".parse::<PathPattern>().is_ok());
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

    /// Django and Flask upper-case the method before routing, so `get` is
    /// served as `GET`: a rule on `GET` must count it.
    #[test]
    fn methods_match_in_any_case() {
        let m = RuleMatcher::new(vec![
            (vec![Method::GET], p("/api/videos/trending")),
            (vec![Method::POST], p("*")),
        ]);
        let method = |s: &str| Method::from_bytes(s.as_bytes()).unwrap();
        for spelled in ["get", "Get", "gET", "GET", "head", "Head", "HEAD"] {
            assert_eq!(m.find(&method(spelled), "/api/videos/trending"), Some(0), "{spelled}");
        }
        for spelled in ["post", "Post"] {
            assert_eq!(m.find(&method(spelled), "/api/videos/trending"), Some(1), "{spelled}");
        }
        for other in ["put", "gett", "ge", "options", "PATCH"] {
            assert_eq!(m.find(&method(other), "/api/videos/trending"), None, "{other}");
        }
        // An extension method in the rule compares without case as well.
        let m = RuleMatcher::new(vec![(vec![method("PURGE")], p("*"))]);
        assert_eq!(m.find(&method("purge"), "/x"), Some(0));
    }

    #[test]
    fn format_suffixes_match_only_where_the_rule_asks() {
        let plain = RuleMatcher::new(vec![(vec![], p("/api/feed"))]);
        assert_eq!(plain.find(&Method::GET, "/api/feed.json"), None);
        let m = RuleMatcher::new(vec![
            (vec![], p("/api/feed").format_suffix(true)),
            (vec![], p("/api/v1.0/{id}/items").format_suffix(true)),
        ]);
        for spelling in [
            "/api/feed",
            "/api/feed.json",
            "/api/feed.xml",
            "/API/Feed.JSON",
            "/api/feed.tar.gz",
            "/api/feed.",
            "/api/feed..json",
            "/api/feed.json/",
            "/api/feed.json;jsessionid=1",
            "/api/feed.json%09",
            "/api/feed%2Ejson",
            "/api%2Ffeed.json",
            "/api/x/../feed.json",
        ] {
            assert_eq!(m.find(&Method::GET, spelling), Some(0), "{spelling}");
        }
        for other in
            ["/api/feedx.json", "/api/feed/x.json", "/api/.json", "/api/feed.json/x", "/api/fee.json"]
        {
            assert_eq!(m.find(&Method::GET, other), None, "{other}");
        }
        // A dot in the pattern's own text: the suffix is cut at the last dot.
        assert_eq!(m.find(&Method::GET, "/api/v1.0/7/items.json"), Some(1));
        assert_eq!(m.find(&Method::GET, "/api/v1.0/7/items"), Some(1));
        assert!(p("/api/feed").format_suffix(true).is_format_suffix());
        // Thousands of dots cost two more readings, not one per dot.
        let dots = format!("/api/feed{}", ".a".repeat(20_000));
        assert_eq!(m.find(&Method::GET, &dots), Some(0));
    }

    /// The reading a rule matched is the one handed on (breadth reads its
    /// value there): the normalised path when it matches, else the lenient.
    #[test]
    fn the_matching_reading_is_the_one_that_matched() {
        let m = RuleMatcher::new(vec![(vec![], p("/api/videos/{id}"))]);
        let path = |s: &str| m.matching(&Method::GET, s).map(|r| r.path.into_owned());
        assert_eq!(path("/api/videos/7").as_deref(), Some("/api/videos/7"));
        assert_eq!(path("/api//videos/%37/").as_deref(), Some("/api/videos/7"));
        assert_eq!(path("/api/videos%2F7").as_deref(), Some("/api/videos/7"));
        assert_eq!(path("/api/videos/x/..;/7").as_deref(), Some("/api/videos/7"));
        assert_eq!(path("/api/videos/7;x").as_deref(), Some("/api/videos/7;x"));
        assert_eq!(path("/api/videos"), None);
    }

    #[test]
    fn path_variants_fall_under_the_same_rule() {
        let m = RuleMatcher::new(vec![
            (vec![Method::GET], p("/api/videos/trending")),
            (vec![], p("/users/{id}")),
        ]);
        for variant in [
            "/api/videos/trending",
            "/api/videos/trending/",
            "//api/videos/trending",
            "/api//videos///trending//",
            "/api/videos/%74rending",
            "/%61pi/videos/TRENDING/../%74%72%65%6E%64%69%6e%67",
            "/api/./videos/trending",
            "/api/videos/./trending/.",
            "/api/x/../videos/trending",
            "/../../api/videos/trending",
            "/api/videos/%2e/trending",
        ] {
            assert_eq!(m.find(&Method::GET, variant), Some(0), "{variant}");
        }
        assert_eq!(m.find(&Method::GET, "/users/7/"), Some(1));
        // WSGI decodes %2F into a separator, so the lenient reading matches.
        assert_eq!(m.find(&Method::GET, "/api/videos%2Ftrending"), Some(0));
        assert_eq!(m.find(&Method::GET, "/api/videos/trending/x/.."), Some(0));
        assert_eq!(m.find(&Method::GET, "/api/videos/trending/x"), None);
    }

    /// Every spelling a common router serves from the handler of
    /// `/api/videos/trending` falls under a rule on it, whatever the rule's
    /// kind: slidegate must never match less than the upstream's router.
    #[test]
    fn router_spellings_fall_under_every_kind_of_rule() {
        let kinds = [
            ("exact", p("/api/videos/trending")),
            ("star", p("/api/*/trending")),
            ("param", p("/api/{section}/trending")),
        ];
        let classes: &[(&str, &[&str])] = &[
            (
                "case (Express, ASP.NET, IIS)",
                &["/API/Videos/TRENDING", "/api/videos/Trending", "/%41PI/videos/trending"],
            ),
            (
                "encoded slash (WSGI PATH_INFO)",
                &["/api%2Fvideos%2ftrending", "/api/videos%2Ftrending", "/api%2F%2Fvideos/trending"],
            ),
            (
                "backslash (IIS)",
                &["/api\\videos\\trending", "/api%5Cvideos%5ctrending", "/api\\videos/trending\\"],
            ),
            (
                "path parameters (Tomcat, Spring)",
                &[
                    "/api/videos/trending;jsessionid=1",
                    "/api;a/videos;b=2/trending;c",
                    "/api/videos/x/..;/trending",
                    "/api/videos/x/..;a=b/trending",
                ],
            ),
            (
                "trailing dots and spaces (IIS)",
                &[
                    "/api/videos/trending.",
                    "/api/videos./trending...",
                    "/api/videos/trending%20",
                    "/api/videos%20./trending%20%20",
                ],
            ),
            (
                "leading and trailing whitespace (Spring trims path tokens)",
                &[
                    "/api/videos/trending%09",
                    "/api/videos/trending%0D%0A",
                    "/api/videos/trending%0a",
                    "/api/videos/%20trending",
                    "/api%09/videos/trending%20%09",
                    "/api/videos/trending%09.%20",
                ],
            ),
            (
                "encoded dot segments",
                &[
                    "/api/x/%2e%2e/videos/trending",
                    "/api/x/.%2E/videos/trending",
                    "/api/videos/%2e/trending",
                    "/api/x/%2e%2e%2fvideos/trending",
                ],
            ),
            (
                "NUL (a C-string router stops there)",
                &["/api/videos/trending%00.json", "/api/videos/trending%00/x"],
            ),
        ];
        for (kind, pattern) in &kinds {
            let m = RuleMatcher::new(vec![(vec![Method::GET], pattern.clone())]);
            for (class, spellings) in classes {
                for spelling in *spellings {
                    assert_eq!(
                        m.find(&Method::GET, spelling),
                        Some(0),
                        "{class}: {spelling:?} against {kind} {pattern}"
                    );
                }
            }
            // Other resources stay other resources.
            for other in
                ["/api/videos/trendingx", "/api/videos/trend", "/api/videos/trending/x", "/api/trending"]
            {
                assert_eq!(m.find(&Method::GET, other), None, "{other:?} against {kind} {pattern}");
            }
        }
        // A case-sensitive rule does not fold, but the other classes still apply.
        let m = RuleMatcher::new(vec![(vec![], p("/api/videos/trending").case_sensitive(true))]);
        assert_eq!(m.find(&Method::GET, "/API/videos/trending"), None);
        assert_eq!(m.find(&Method::GET, "/api/videos%2Ftrending;x."), Some(0));
        // Express keeps %2F inside one segment: a {param} still matches it.
        let m = RuleMatcher::new(vec![(vec![], p("/users/{id}"))]);
        assert_eq!(m.find(&Method::GET, "/users/a%2Fb"), Some(0));
        assert_eq!(m.find(&Method::GET, "/users/a;b"), Some(0));
        assert!(refused_path("/api/videos/trending%00").is_some());
        assert!(refused_path("/api/videos/trending%0A").is_none());
    }

    #[test]
    fn lenient_paths_are_canonical() {
        for (path, expected) in [
            ("/", "/"),
            ("/a;b", "/a"),
            ("/;x", "/"),
            ("/a%3Bb", "/a%3Bb"),
            ("/a%3bb", "/a%3Bb"),
            ("/a%252F", "/a%252F"),
            ("/%zz", "/%25zz"),
            ("/a%2Fb%5Cc", "/a/b/c"),
            ("/a/.../b", "/a/b"),
            ("/a/b%00c/d", "/a/b"),
            ("/caf%c3%a9", "/caf%C3%A9"),
            ("/a b", "/a%20b"),
            ("/a/%2E%2E", "/"),
            ("/a%09", "/a"),
            ("/a\t\r\n /b ", "/a/b"),
            ("/%20a%20/%0D%0Ab%0A", "/a/b"),
            ("/a%09b", "/a%09b"),
            ("/a/%09%20/b", "/a/b"),
            ("/a/%20../b", "/a/b"),
            ("/a/..%09/b", "/a/b"),
            ("/a/%7F", "/a/%7F"),
            ("*", "*"),
        ] {
            assert_eq!(lenient_path(path), expected, "{path}");
        }
        assert!(matches!(lenient_path("/api/videos"), Cow::Borrowed(_)));
    }

    #[test]
    fn normal_paths_are_borrowed_and_others_rewritten() {
        for normal in ["/", "/api/videos/trending", "/a/b.c/%2F/%20/%zz/%4", "/a/...", "/a%", "*"] {
            assert!(matches!(normalize_path(normal), Cow::Borrowed(_)), "{normal}");
        }
        for (path, expected) in [
            ("//", "/"),
            ("/./", "/"),
            ("/..", "/"),
            ("/a/", "/a"),
            ("/a//b", "/a/b"),
            ("/a/./b/../c", "/a/c"),
            ("/%7Euser/%41%2f%25", "/~user/A%2f%25"),
            ("/a/%2E%2E/b", "/b"),
        ] {
            let normalised = normalize_path(path);
            assert!(matches!(normalised, Cow::Owned(_)), "{path}");
            assert_eq!(normalised, expected, "{path}");
        }
    }

    #[test]
    fn adversarial_globs_are_decided_without_exponential_backtracking() {
        // Exponential in the number of stars for a backtracking matcher
        // (35 s for 400 bytes); linear here.
        let glob = p("/*a*a*a*a*a*a*a*a*b");
        let long = format!("/{}", "a".repeat(4000));
        assert!(!glob.matches(&long));
        assert!(glob.matches(&format!("{long}b")));
        let segments = p("/*/{id}/*a*a*a*a*c/{x}");
        let path = format!("/{}/7/{}c/9", "a/".repeat(500), "a".repeat(2000));
        assert!(segments.matches(&path));
        assert!(!segments.matches(&format!("{path}/")));
    }

    #[test]
    fn stars_and_params_combine() {
        assert!(p("*/{id}").matches("/a/b/7"));
        assert!(!p("*/{id}").matches("/a/b/"));
        assert!(p("/a/*/{id}/x").matches("/a/b/c/7/x"));
        assert!(!p("/a/*/{id}/x").matches("/a/7/x"));
        assert!(p("/a*b").matches("/ab") && p("/a*b").matches("/axbyb") && !p("/a*b").matches("/abx"));
        assert!(p("/é*").matches("/éa") && p("*é").matches("/aé") && !p("*é").matches("/ae"));
        assert!(p("/*").matches("/") && !p("/*x").matches("/"));
    }
}
