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
/// as they are, and so does a `%` starting none, unless decoding put an
/// escape's two hex digits after it: that one is written `%25`. Borrows,
/// allocating nothing, when `path` is already normal; a path not starting
/// with `/` (`*`, an absolute URI) is returned as is.
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
    // Where a `%` starting no escape went: a decoding beside it may make it
    // start one (`/%4%41` reads `/%4A`), which a second normalising would
    // decode again (`/J`); such a `%` is written as its own escape, `%25`.
    let mut bare = Vec::new();
    let mut rest = path;
    while let Some(i) = rest.find('%') {
        decoded.push_str(&rest[..i]);
        match unreserved_escape(&rest.as_bytes()[i..]) {
            Some(c) => {
                decoded.push(char::from(c));
                rest = &rest[i + 3..];
            }
            None => {
                if !is_escape(&rest.as_bytes()[i..]) {
                    bare.push(decoded.len());
                }
                decoded.push('%');
                rest = &rest[i + 1..];
            }
        }
    }
    decoded.push_str(rest);
    for &at in bare.iter().rev() {
        if is_escape(&decoded.as_bytes()[at..]) {
            decoded.insert_str(at + 1, "25");
        }
    }
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
                push_escape(&mut out, b);
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

/// Appends `b` to `out` as `%XX`, in upper-case hex (RFC 3986 and the gRPC
/// spec alike).
pub(crate) fn push_escape(out: &mut String, b: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push('%');
    out.push(char::from(HEX[usize::from(b >> 4)]));
    out.push(char::from(HEX[usize::from(b & 15)]));
}

/// Why slidegate refuses a path outright, if it does (`serve` and the
/// tower layer alike, in [`crate::RateLimiter::admit`]): a NUL (`%00`), which
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

/// Whether `bytes` starts with an escape: `%` and two hex digits.
fn is_escape(bytes: &[u8]) -> bool {
    bytes.len() >= 3 && bytes[0] == b'%' && bytes[1].is_ascii_hexdigit() && bytes[2].is_ascii_hexdigit()
}

/// The unreserved character `%XX` at the start of `bytes` encodes, if any.
fn unreserved_escape(bytes: &[u8]) -> Option<u8> {
    let hex = |b: u8| char::from(b).to_digit(16);
    let (hi, lo) = (hex(*bytes.get(1)?)?, hex(*bytes.get(2)?)?);
    let c = u8::try_from(hi * 16 + lo).ok()?;
    (c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~')).then_some(c)
}

#[cfg(test)]
mod tests;
