//! [`CostHeaders`]: the names of every rule's `cost_header`, taken out of
//! every response.
//!
//! The upstream's word to slidegate (what a request cost) is not the
//! client's business, whichever rule matched: an upstream that sends
//! `x-ratelimit-cost` on every route would otherwise show it on the routes
//! of rules without `cost_header`, and on paths no rule matches.

use std::sync::Arc;

use http::{HeaderMap, HeaderName};

/// The configured cost header names, deduplicated; cheap to clone (`None`
/// when no rule has one, as most configurations).
#[derive(Debug, Clone, Default)]
pub struct CostHeaders(Option<Arc<[HeaderName]>>);

impl CostHeaders {
    /// The distinct names among `names`.
    pub(crate) fn new<'a>(names: impl IntoIterator<Item = Option<&'a HeaderName>>) -> Self {
        let mut distinct: Vec<HeaderName> = Vec::new();
        for name in names.into_iter().flatten() {
            if !distinct.contains(name) {
                distinct.push(name.clone());
            }
        }
        Self((!distinct.is_empty()).then(|| distinct.into()))
    }

    /// Removes every configured cost header from `headers`.
    pub fn strip(&self, headers: &mut HeaderMap) {
        for name in self.0.iter().flat_map(|names| names.iter()) {
            headers.remove(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    #[test]
    fn every_configured_name_is_removed_and_nothing_else() {
        let cost = HeaderName::from_static("x-ratelimit-cost");
        let units = HeaderName::from_static("x-units");
        let headers = CostHeaders::new([Some(&cost), None, Some(&units), Some(&cost)]);
        let mut map = HeaderMap::new();
        map.append(&cost, HeaderValue::from_static("5"));
        map.append(&cost, HeaderValue::from_static("6"));
        map.insert(&units, HeaderValue::from_static("2"));
        map.insert("x-other", HeaderValue::from_static("kept"));
        headers.strip(&mut map);
        assert_eq!(map.keys().map(HeaderName::as_str).collect::<Vec<_>>(), ["x-other"]);
        // None configured: nothing is removed.
        CostHeaders::new([None]).strip(&mut map);
        assert_eq!(map.len(), 1);
    }
}
