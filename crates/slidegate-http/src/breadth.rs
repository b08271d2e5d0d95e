//! Crawl breadth: how many distinct paths (or values of one path parameter,
//! or of one query parameter) an identity may touch per window — a scraper
//! walking a catalogue at a polite rate, which no request-rate limit notices.
//!
//! Every request a breadth rule matches is counted under some value: the
//! value is read from the reading of the path that matched the rule
//! ([`RuleMatch`](crate::RuleMatch)), so a spelling that only the lenient
//! reading matches (`/api/videos%2F7`, `/api/videos/x/..;/7`) counts as the
//! id a WSGI or Tomcat router serves, and a value that cannot be read is
//! one fixed value, never a reason to step aside. Two spellings of one
//! resource may count as two values; two resources never as one.
//!
//! Counted with a HyperLogLog ([`slidegate::distinct`]: Redis `PFADD` /
//! `PFCOUNT` in one script, the same estimate bit for bit in the embedded
//! store). Windows are aligned to multiples of the window since the epoch.
//! A value already seen in the window is always admitted; a new one while
//! the estimate of values seen is below `distinct`. So a denial is a new
//! value past the limit, and it is never added.
//!
//! Order in the limiter: breadth is decided first, then the rate limits, and
//! only when breadth admitted. A breadth denial is never charged to the rate
//! limits; a request the rate limits then deny has already been added to the
//! breadth sketch (two store calls cannot be all-or-nothing; a re-visit of
//! that value is free, so the scraper pays at most one slot per value).

use std::borrow::Cow;

use slidegate::Quota;

use crate::rules::percent_decode;

/// The value counted when a matched rule's value cannot be read (never, by
/// construction: kept so that a broken invariant counts, not exempts). No
/// path reading holds the byte 0xFF.
const UNREADABLE: &[u8] = b"\xFFunreadable";

/// Longest value sent to the store as it is; the limiter counts a longer
/// one by its keyed digest (`IdentityExtractor::value_digest`), so one
/// request sends at most this many bytes of it to Redis.
pub(crate) const MAX_VALUE_BYTES: usize = 256;

/// Longest `query:<name>` name.
const MAX_QUERY_NAME: usize = 128;

/// What a breadth limit counts.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BreadthOf {
    /// The normalised path.
    Path,
    /// The value of one `{param}` of the rule's path pattern.
    Param {
        /// The parameter's name, as in the pattern.
        name: String,
        /// Its `/`-separated segment index in the path (the pattern has no
        /// `*` before it, so the index is fixed).
        segment: usize,
    },
    /// The values of one query parameter (`?id=7`), as routers read them:
    /// see [`BreadthOf::value`].
    Query {
        /// The parameter's name, as configured.
        name: String,
    },
}

/// A rule's crawl-breadth limit: at most `quota.permits()` distinct values
/// per `quota.window()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreadthConfig {
    /// Distinct values per window.
    pub quota: Quota,
    /// What is counted.
    pub of: BreadthOf,
}

/// Why `of = "param:<name>"` cannot be counted for a pattern.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BreadthOfError {
    /// Neither `path`, `param:<name>` nor `query:<name>`.
    #[error("expected \"path\", \"param:<name>\" or \"query:<name>\", got {0:?}")]
    Unknown(String),
    /// A query parameter name that is empty, too long, or holds a
    /// character other than a letter, a digit, `-`, `_`, `.` or `~`.
    #[error(
        "invalid query parameter name {0:?}: expected 1 to 128 letters, digits, '-', '_', '.' or '~' \
         (the name as decoded, e.g. \"query:id\")"
    )]
    QueryName(String),
    /// The pattern has no such `{param}`, or a `*` before it.
    #[error("the path pattern {pattern:?} has no {{{name}}} at a fixed segment (without a '*' before it)")]
    NoSuchParam {
        /// The parameter asked for.
        name: String,
        /// The rule's pattern.
        pattern: String,
    },
}

impl BreadthOf {
    /// Reads `of` for a rule whose path pattern is `pattern`.
    ///
    /// # Errors
    /// [`BreadthOfError`] for an unknown kind or a parameter the pattern lacks.
    pub fn parse(of: &str, pattern: &str) -> Result<Self, BreadthOfError> {
        if of == "path" {
            return Ok(BreadthOf::Path);
        }
        if let Some(name) = of.strip_prefix("query:") {
            let plain = |b: u8| b.is_ascii_alphanumeric() || b"-_.~".contains(&b);
            if name.is_empty() || name.len() > MAX_QUERY_NAME || !name.bytes().all(plain) {
                return Err(BreadthOfError::QueryName(name.to_owned()));
            }
            return Ok(BreadthOf::Query { name: name.to_owned() });
        }
        let Some(name) = of.strip_prefix("param:").filter(|n| !n.is_empty()) else {
            return Err(BreadthOfError::Unknown(of.to_owned()));
        };
        let wanted = format!("{{{name}}}");
        let missing = || BreadthOfError::NoSuchParam { name: name.to_owned(), pattern: pattern.to_owned() };
        let segments: Vec<&str> = pattern.split('/').collect();
        let segment = segments.iter().position(|s| *s == wanted).ok_or_else(missing)?;
        if segments[..segment].iter().any(|s| s.contains('*')) {
            return Err(missing());
        }
        Ok(BreadthOf::Param { name: name.to_owned(), segment })
    }

    /// The value counted for a request whose path read as `reading` when it
    /// matched the rule ([`RuleMatch::path`](crate::RuleMatch)) and whose
    /// query is `query`. Always a value:
    ///
    /// - `path`: the reading itself;
    /// - `param:<name>`: its segment of the reading (a fixed value if absent,
    ///   which a reading that matched the pattern never is);
    /// - `query:<name>`: every value of every parameter named so, in order,
    ///   each length-prefixed, so that repeating the name (PHP and Django
    ///   serve the last, Flask the first, Express all) still counts each
    ///   combination apart. Names and values are decoded (`%XX`, `+` as a
    ///   space); names compare without ASCII case (ASP.NET), `.` and a space
    ///   as `_` (PHP), and with an array suffix cut (`id[]`, `id[0]`: PHP,
    ///   Rails, Express's `qs`). When the query holds a `;`, the values of a
    ///   second reading splitting on `;` too (older Python, Perl CGI) are
    ///   appended. No such parameter is one value (empty); `id=` another.
    ///
    /// The value's length is bounded by the request target's; the limiter
    /// sends a value longer than 256 bytes as its 16-byte keyed digest.
    pub fn value<'p>(&self, reading: &'p str, query: Option<&str>) -> Cow<'p, [u8]> {
        match self {
            BreadthOf::Path => Cow::Borrowed(reading.as_bytes()),
            BreadthOf::Param { segment, .. } => {
                match reading.split('/').nth(*segment).filter(|s| !s.is_empty()) {
                    Some(value) => Cow::Borrowed(value.as_bytes()),
                    None => Cow::Borrowed(UNREADABLE),
                }
            }
            BreadthOf::Query { name } => Cow::Owned(query.map_or_else(Vec::new, |q| query_values(q, name))),
        }
    }
}

/// The values of `name` in `query` (see [`BreadthOf::value`]).
fn query_values(query: &str, name: &str) -> Vec<u8> {
    let mut out = Vec::new();
    append_values(&mut out, query.split('&'), name);
    if query.contains(';') {
        // No length prefix is 0xFFFFFFFF (a query is far shorter): the
        // readings cannot run together.
        out.extend_from_slice(&[0xFF; 4]);
        append_values(&mut out, query.split(['&', ';']), name);
    }
    out
}

fn append_values<'q>(out: &mut Vec<u8>, pairs: impl Iterator<Item = &'q str>, name: &str) {
    for pair in pairs {
        let (raw_name, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
        if !is_named(&form_decode(raw_name), name) {
            continue;
        }
        let value = form_decode(raw_value);
        let len = u32::try_from(value.len()).unwrap_or(u32::MAX - 1);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&value);
    }
}

/// A query component as form decoding reads it: `+` is a space, `%XX` a
/// byte. Borrowed when there is nothing to decode (the common name).
fn form_decode(raw: &str) -> Cow<'_, [u8]> {
    if raw.contains('+') {
        Cow::Owned(percent_decode(raw.replace('+', " ").as_bytes()))
    } else if raw.contains('%') {
        Cow::Owned(percent_decode(raw.as_bytes()))
    } else {
        Cow::Borrowed(raw.as_bytes())
    }
}

/// Whether the decoded parameter name `decoded` names `wanted`: leading
/// spaces and an array suffix (`[…`) cut, ASCII case ignored, `.` and a
/// space read as `_`.
fn is_named(decoded: &[u8], wanted: &str) -> bool {
    let start = decoded.iter().take_while(|&&b| b == b' ').count();
    let end = decoded.iter().position(|&b| b == b'[').unwrap_or(decoded.len()).max(start);
    let decoded = &decoded[start..end];
    let fold = |b: u8| match b {
        b'.' | b' ' => b'_',
        b => b.to_ascii_lowercase(),
    };
    decoded.len() == wanted.len() && decoded.iter().zip(wanted.bytes()).all(|(&a, b)| fold(a) == fold(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    use http::Method;

    use crate::{PathPattern, RuleMatcher};

    /// The value a request to `target` counts under a rule on `pattern`
    /// counting `of`: `None` when the rule does not match.
    fn counted(pattern: &str, of: &str, target: &str) -> Option<Vec<u8>> {
        let of = BreadthOf::parse(of, pattern).unwrap();
        let m = RuleMatcher::new(vec![(vec![], pattern.parse::<PathPattern>().unwrap())]);
        let (path, query) = target.split_once('?').map_or((target, None), |(p, q)| (p, Some(q)));
        let reading = m.matching(&Method::GET, path)?;
        Some(of.value(&reading.path, query).into_owned())
    }

    #[test]
    fn params_are_found_by_segment_and_paths_normalised() {
        let of = BreadthOf::parse("param:id", "/api/videos/{id}/comments").unwrap();
        assert_eq!(of, BreadthOf::Param { name: "id".into(), segment: 3 });
        assert_eq!(of.value("/api/videos/42/comments", None).as_ref(), b"42");
        assert_eq!(of.value("/api/videos", None).as_ref(), UNREADABLE, "a fixed value, never none");
        assert_eq!(
            counted("/api/videos/{id}/comments", "param:id", "/api//videos/%34%32/comments").unwrap(),
            b"42"
        );
        assert_eq!(counted("/*", "path", "/a//b/").unwrap(), b"/a/b");
        assert!(BreadthOf::parse("param:id", "/api/*/{id}").is_err());
        assert!(BreadthOf::parse("param:slug", "/api/videos/{id}").is_err());
        assert!(BreadthOf::parse("query", "/api").is_err());
    }

    /// Every spelling class of the path table against breadth: ids spelled
    /// alike (or as the lenient reading a router serves) are the same
    /// value, and distinct ids stay distinct — no class reads one value for
    /// many ids, and none reads no value. Once, the lenient-only classes
    /// (`%2F`, `..;/`) stepped aside and `x/..;/N` counted as `x`.
    #[test]
    fn every_spelling_class_counts_the_id_it_serves() {
        /// A class, its spelling of id n, and whether it reads as the plain id.
        type Class = (&'static str, fn(u32) -> String, bool);
        let classes: &[Class] = &[
            ("plain", |n| format!("/api/videos/{n}"), true),
            ("case (Express, IIS)", |n| format!("/API/Videos/{n}"), true),
            ("encoded unreserved", |n| format!("/api/%76ideos/{n}"), true),
            ("repeated slashes, dot segments", |n| format!("//api/./videos//{n}/"), true),
            ("encoded slash (WSGI)", |n| format!("/api/videos%2F{n}"), true),
            ("encoded slashes (WSGI)", |n| format!("/api%2Fvideos%2f{n}"), true),
            ("backslash (IIS)", |n| format!("/api\\videos%5C{n}"), true),
            ("dot-dot path parameter (Tomcat)", |n| format!("/api/videos/x/..;/{n}"), true),
            ("dot-dot with a value (Tomcat)", |n| format!("/api/videos/x/..;a=b/{n}"), true),
            ("encoded dot segment", |n| format!("/api/x/%2e%2e/videos/{n}"), true),
            ("encoded dot-dot and slash", |n| format!("/api/x/%2e%2e%2fvideos/{n}"), true),
            ("path parameter (Tomcat)", |n| format!("/api/videos/{n};jsessionid=1"), false),
            ("trailing dot (IIS)", |n| format!("/api/videos/{n}."), false),
            ("trailing space (IIS)", |n| format!("/api/videos/{n}%20"), false),
            ("trailing tab (Spring)", |n| format!("/api/videos/{n}%09"), false),
            ("an encoded slash inside the id (Express)", |n| format!("/api/videos/{n}%2Fx"), false),
            ("leading whitespace (Spring)", |n| format!("/api/videos/%20%09{n}"), false),
            ("NUL (serve refuses it first)", |n| format!("/api/videos/{n}%00.json"), false),
            // The id segment takes the suffix: `7.json` and `7.xml` are two
            // values (an id fetched in two formats counts twice), never one
            // for many ids.
            ("format suffix (Rails, Spring before 5.3)", |n| format!("/api/videos/{n}.json"), false),
            ("double format suffix (Spring's /x.*)", |n| format!("/api/videos/{n}.tar.gz"), false),
            ("encoded format suffix", |n| format!("/api/videos/{n}%2Ejson"), false),
        ];
        let plain = |n: u32| n.to_string().into_bytes();
        for (class, spell, same) in classes {
            let values: Vec<Vec<u8>> = (1..=50)
                .map(|n| {
                    let target = spell(n);
                    counted("/api/videos/{id}", "param:id", &target)
                        .unwrap_or_else(|| panic!("{class}: {target:?} does not match the rule"))
                })
                .collect();
            let distinct: std::collections::HashSet<&Vec<u8>> = values.iter().collect();
            assert_eq!(distinct.len(), 50, "{class}: 50 ids read as {} values", distinct.len());
            if *same {
                assert!(values.iter().zip(1..).all(|(v, n)| *v == plain(n)), "{class}: {values:?}");
            }
            // Counting whole paths: distinct too.
            let paths: std::collections::HashSet<Vec<u8>> =
                (1..=50).filter_map(|n| counted("/api/videos/{id}", "path", &spell(n))).collect();
            assert_eq!(paths.len(), 50, "{class}: of = \"path\"");
        }
    }

    /// On a rule with `format_suffix`, a suffix on a later segment than the
    /// id leaves the id as it is, and the rule matches every format.
    #[test]
    fn a_format_suffix_after_the_id_counts_the_id() {
        let pattern = "/api/videos/{id}/comments";
        let of = BreadthOf::parse("param:id", pattern).unwrap();
        let parsed = pattern.parse::<PathPattern>().unwrap().format_suffix(true);
        let m = RuleMatcher::new(vec![(vec![], parsed)]);
        for suffix in ["", ".json", ".xml", ".tar.gz", "%2Ejson"] {
            let values: std::collections::HashSet<Vec<u8>> = (1..=50u32)
                .map(|n| {
                    let target = format!("/api/videos/{n}/comments{suffix}");
                    let reading = m.matching(&Method::GET, &target).unwrap_or_else(|| panic!("{target:?}"));
                    let value = of.value(&reading.path, None).into_owned();
                    assert_eq!(value, n.to_string().into_bytes(), "{target:?}");
                    value
                })
                .collect();
            assert_eq!(values.len(), 50, "{suffix:?}");
        }
    }

    #[test]
    fn query_values_are_read_as_routers_read_them() {
        let of = |target: &str| counted("/items", "query:id", target).unwrap();
        let one = |v: &[u8]| [&u32::try_from(v.len()).unwrap().to_be_bytes()[..], v].concat();
        assert_eq!(of("/items?id=7"), one(b"7"));
        // Decoded, the name in any case, encoded, array-suffixed, PHP-mangled.
        for same in [
            "/items?id=%37",
            "/items?ID=7",
            "/items?i%64=7",
            "/items?Id=7&x=1",
            "/items?x=1&id=7&y",
            "/items?id[]=7",
            "/items?id%5B0%5D=7",
            "/items?%20id=7",
            "/items?&&id=7&",
        ] {
            assert_eq!(of(same), one(b"7"), "{same}");
        }
        assert_eq!(of("/items?id=a+b%2Bc"), one(b"a b+c"));
        assert_eq!(counted("/items", "query:page_id", "/items?page.id=3").unwrap(), one(b"3"));
        // No such parameter is one value, an empty one another.
        assert_eq!(of("/items"), b"");
        assert_eq!(of("/items?"), b"");
        assert_eq!(of("/items?idx=7&xid=7&i=7"), b"");
        assert_eq!(of("/items?id="), one(b""));
        assert_eq!(of("/items?id"), one(b""));
        // Repeated: every value, in order, so the combination counts.
        assert_eq!(of("/items?id=1&id=2"), [one(b"1"), one(b"2")].concat());
        assert_ne!(of("/items?id=1&id=2"), of("/items?id=2&id=1"));
        assert_ne!(of("/items?id=1&id=2"), of("/items?id=1&id=3"));
        assert_ne!(of("/items?id=12"), of("/items?id=1&id=2"));
        // A `;` reads both ways, so neither reading can hide a varying id.
        let both = of("/items?x=1;id=9");
        assert_eq!(both, [&[0xFF; 4][..], &one(b"9")].concat());
        assert_ne!(of("/items?id=1;a"), of("/items?id=1;b"));
        assert_ne!(of("/items?id=1;id=2"), of("/items?id=1;id=3"));
        // Long values stay whole here (the limiter digests them): distinct.
        let long = "9".repeat(60_000);
        assert_ne!(of(&format!("/items?id={long}1")), of(&format!("/items?id={long}2")));
        assert_eq!(of(&format!("/items?id={long}")).len(), 60_004);
    }

    #[test]
    fn query_names_are_checked() {
        assert_eq!(BreadthOf::parse("query:id", "/items"), Ok(BreadthOf::Query { name: "id".into() }));
        assert!(BreadthOf::parse("query:page_id.x-y~", "/x").is_ok());
        for bad in ["query:", "query:a=b", "query:a&b", "query:a b", "query:%69d", "query:id[]", "query:é"] {
            assert!(matches!(BreadthOf::parse(bad, "/x"), Err(BreadthOfError::QueryName(_))), "{bad}");
        }
        assert!(BreadthOf::parse(&format!("query:{}", "a".repeat(129)), "/x").is_err());
        let error = BreadthOf::parse("qery:id", "/x").unwrap_err().to_string();
        assert!(error.contains("\"query:<name>\""), "{error}");
    }
}
