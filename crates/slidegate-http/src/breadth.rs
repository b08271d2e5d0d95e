//! Crawl breadth: how many distinct paths (or values of one path parameter)
//! an identity may touch per window — a scraper walking a catalogue at a
//! polite rate, which no request-rate limit notices.
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

use crate::rules::normalize_path;

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
    /// Neither `path` nor `param:<name>`.
    #[error("expected \"path\" or \"param:<name>\", got {0:?}")]
    Unknown(String),
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

    /// The value counted for a request to `path` (as received); `None` when
    /// the path has no such segment (only a lenient reading matched the rule).
    pub fn value<'p>(&self, path: &'p str) -> Option<Cow<'p, [u8]>> {
        let path = normalize_path(path);
        match self {
            BreadthOf::Path => Some(match path {
                Cow::Borrowed(p) => Cow::Borrowed(p.as_bytes()),
                Cow::Owned(p) => Cow::Owned(p.into_bytes()),
            }),
            BreadthOf::Param { segment, .. } => {
                let value = path.split('/').nth(*segment).filter(|s| !s.is_empty())?;
                Some(Cow::Owned(value.as_bytes().to_vec()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_are_found_by_segment_and_paths_normalised() {
        let of = BreadthOf::parse("param:id", "/api/videos/{id}/comments").unwrap();
        assert_eq!(of, BreadthOf::Param { name: "id".into(), segment: 3 });
        assert_eq!(of.value("/api/videos/42/comments").as_deref(), Some(&b"42"[..]));
        assert_eq!(of.value("/api//videos/%34%32/comments").as_deref(), Some(&b"42"[..]));
        assert_eq!(BreadthOf::Path.value("/a//b/").as_deref(), Some(&b"/a/b"[..]));
        assert!(BreadthOf::parse("param:id", "/api/*/{id}").is_err());
        assert!(BreadthOf::parse("param:slug", "/api/videos/{id}").is_err());
        assert!(BreadthOf::parse("query", "/api").is_err());
    }
}
