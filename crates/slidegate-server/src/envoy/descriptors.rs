//! The descriptor tree of envoyproxy/ratelimit's configuration, compiled,
//! and its matching rules: pure lookups, no I/O.
//!
//! A request descriptor is a list of entries `(key, value)`. Its entries are
//! walked down the domain's tree: at each level an entry picks the node
//! configured for its exact `key` and `value`, else the first node of its
//! `key` (in configuration order) whose wildcard value (`files/*`,
//! `/api/*/action`) matches, else the node configured for its `key` alone
//! (which counts each value apart), else nothing. The limit that applies is
//! the one of the node the *last* entry reached; a descriptor that stops
//! early, or ends on a node without a limit, is not limited — as the
//! reference service documents.
//!
//! Request values are attacker input and patterns the operator's: a
//! [`Pattern`] matches without allocating and without backtracking, in time
//! linear in the value's length (see [`Pattern::matches`]).

use std::collections::{HashMap, HashSet};

use slidegate::Quota;

use super::proto::Unit;

/// Every domain of an `[envoy] config`, compiled. Empty by default.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EnvoyConfig {
    domains: HashMap<String, Level>,
    /// The domains whose descriptors are decided all or nothing
    /// (`all_or_nothing: true`, a slidegate extension).
    joint: HashSet<String>,
    /// Whether a descriptor's `limit` from Envoy replaces the configured
    /// one (`[envoy] limit_overrides = "apply"`).
    overrides: bool,
}

/// One level of a domain's tree: its nodes by key, then by value.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Level {
    keys: HashMap<String, Keyed>,
}

/// The nodes of one key: for exact values, for wildcard values (in
/// configuration order, the first match wins), and for any value.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Keyed {
    exact: HashMap<String, Node>,
    wildcards: Vec<(Pattern, Node)>,
    any: Option<Node>,
}

/// A configured value holding `*`, each `*` matching zero or more
/// characters: kept as the literal parts between the stars.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Pattern {
    /// At least two: the text before the first `*`, between each two, and
    /// after the last.
    parts: Vec<String>,
}

impl Pattern {
    /// The pattern `text` spells; `None` when it holds no `*` (an exact value).
    pub(crate) fn new(text: &str) -> Option<Self> {
        text.contains('*').then(|| Self { parts: text.split('*').map(str::to_owned).collect() })
    }

    /// Whether `value` matches.
    ///
    /// The first part must begin `value` and the last end it; the middle
    /// parts are then found in order, each at its leftmost place after the
    /// previous one, in what lies between. With `*` the only wildcard, the
    /// leftmost place is never worse than a later one (whatever a later
    /// place leaves for the next parts, the leftmost leaves more), so one
    /// forward scan decides: no backtracking, each search linear in what
    /// it scans, and no allocation.
    pub(crate) fn matches(&self, value: &str) -> bool {
        let (Some((first, rest)), Some(last)) = (self.parts.split_first(), self.parts.last()) else {
            return false;
        };
        let Some(middle) = rest.split_last().map(|(_, middle)| middle) else {
            return value == first;
        };
        if value.len() < first.len() + last.len() || !value.starts_with(first.as_str()) {
            return false;
        }
        if !value.ends_with(last.as_str()) {
            return false;
        }
        // On char boundaries: just after a matched prefix, just before a matched suffix.
        let Some(mut between) = value.get(first.len()..value.len() - last.len()) else {
            return false;
        };
        for part in middle {
            match between.find(part.as_str()) {
                Some(at) => between = &between[at + part.len()..],
                None => return false,
            }
        }
        true
    }
}

/// One configured descriptor.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub(crate) limit: Option<NodeLimit>,
    pub(crate) children: Level,
}

/// What a node's `rate_limit` says.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NodeLimit {
    /// The limiter rule deciding this node (its scope in the store).
    pub(crate) rule: String,
    /// What is enforced.
    pub(crate) kind: LimitKind,
    /// The limit as Envoy is told it.
    pub(crate) requests_per_unit: u32,
    /// The unit as Envoy is told it.
    pub(crate) unit: Unit,
    /// `rate_limit.name`, which `replaces` of other limits name.
    pub(crate) name: Option<String>,
    /// Names of the limits this one replaces when both match a request.
    pub(crate) replaces: Vec<String>,
    /// Decided and counted, never over limit.
    pub(crate) shadow: bool,
    /// `quota_mode`: over this limit, a request is over limit only when
    /// every quota-mode limit it matched is.
    pub(crate) quota: bool,
    /// For each entry of a descriptor reaching this limit, the wildcard
    /// value counted in place of the entry's own (`share_threshold`), if
    /// any; empty when no entry shares.
    pub(crate) shared: Vec<Option<String>>,
}

/// What a matched limit enforces.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum LimitKind {
    /// A quota decided by the limiter's store.
    Quota(Quota),
    /// `unlimited: true`: always under the limit, no store call.
    Unlimited,
    /// `requests_per_unit: 0`: always over the limit, no store call.
    Blocked,
    /// A limit Envoy sent with the descriptor (its `limit` override, with
    /// `[envoy] limit_overrides = "apply"`), decided by the limiter's store
    /// under the domain's override rule, counted apart from every
    /// configured limit.
    Chosen(slidegate::Limit),
}

impl EnvoyConfig {
    /// Whether no domain is configured.
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// The domains, sorted.
    pub fn domains(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.domains.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// Whether a descriptor's `limit` from Envoy is applied.
    pub(crate) fn applies_overrides(&self) -> bool {
        self.overrides
    }

    /// Applies descriptors' `limit` overrides.
    pub(crate) fn set_overrides(&mut self, apply: bool) {
        self.overrides = apply;
    }

    /// Whether `domain`'s descriptors are decided all or nothing.
    pub(crate) fn all_or_nothing(&self, domain: &str) -> bool {
        !self.joint.is_empty() && self.joint.contains(domain)
    }

    /// Decides `domain`'s descriptors all or nothing.
    pub(crate) fn set_all_or_nothing(&mut self, domain: &str) {
        self.joint.insert(domain.to_owned());
    }

    pub(crate) fn insert_domain(&mut self, domain: String, root: Level) -> bool {
        if self.domains.contains_key(&domain) {
            return false;
        }
        self.domains.insert(domain, root);
        true
    }

    /// The limit of the descriptor `entries` in `domain`, by the documented
    /// rules; `None` when nothing applies.
    pub(crate) fn find<'e, I>(&self, domain: &str, entries: I) -> Option<&NodeLimit>
    where
        I: IntoIterator<Item = (&'e str, &'e str)>,
    {
        let mut level = self.domains.get(domain)?;
        let mut entries = entries.into_iter().peekable();
        while let Some((key, value)) = entries.next() {
            let keyed = level.keys.get(key)?;
            let node = keyed
                .exact
                .get(value)
                .or_else(|| keyed.wildcards.iter().find(|(p, _)| p.matches(value)).map(|(_, n)| n))
                .or(keyed.any.as_ref())?;
            if entries.peek().is_none() {
                return node.limit.as_ref();
            }
            level = &node.children;
        }
        None
    }
}

impl Level {
    /// Adds `node` for `key` (and `value`, if given: a wildcard one when it
    /// holds `*`, matched after the wildcards already added); `false` when
    /// that place is taken.
    pub(crate) fn insert(&mut self, key: String, value: Option<String>, node: Node) -> bool {
        let keyed = self.keys.entry(key).or_default();
        match value {
            Some(value) if value.contains('*') => {
                let Some(pattern) = Pattern::new(&value) else { return false };
                if keyed.wildcards.iter().any(|(p, _)| *p == pattern) {
                    return false;
                }
                keyed.wildcards.push((pattern, node));
            }
            Some(value) => {
                if keyed.exact.contains_key(&value) {
                    return false;
                }
                keyed.exact.insert(value, node);
            }
            None => {
                if keyed.any.is_some() {
                    return false;
                }
                keyed.any = Some(node);
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(rule: &str) -> Option<NodeLimit> {
        Some(NodeLimit {
            rule: rule.into(),
            kind: LimitKind::Unlimited,
            requests_per_unit: 1,
            unit: Unit::Second,
            name: None,
            replaces: Vec::new(),
            shadow: false,
            quota: false,
            shared: Vec::new(),
        })
    }

    fn node(rule: Option<&str>, children: Level) -> Node {
        Node { limit: rule.and_then(limit), children }
    }

    #[test]
    fn exact_value_beats_key_only_and_the_last_entry_decides() {
        let mut inner = Level::default();
        assert!(inner.insert("path".into(), None, node(Some("path"), Level::default())));
        let mut root = Level::default();
        assert!(root.insert("k".into(), None, node(Some("any"), inner)));
        assert!(root.insert("k".into(), Some("v".into()), node(Some("exact"), Level::default())));
        assert!(!root.insert("k".into(), Some("v".into()), node(None, Level::default())));
        let mut config = EnvoyConfig::default();
        assert!(config.insert_domain("d".into(), root));
        let rule =
            |entries: &[(&str, &str)]| config.find("d", entries.iter().copied()).map(|l| l.rule.clone());
        assert_eq!(rule(&[("k", "v")]).as_deref(), Some("exact"));
        assert_eq!(rule(&[("k", "w")]).as_deref(), Some("any"));
        assert_eq!(rule(&[("k", "w"), ("path", "/x")]).as_deref(), Some("path"));
        // The exact node has no children: the longer descriptor stops there.
        assert_eq!(rule(&[("k", "v"), ("path", "/x")]), None);
        assert_eq!(rule(&[("k", "w"), ("path", "/x"), ("more", "1")]), None);
        assert_eq!(rule(&[("other", "v")]), None);
        assert_eq!(rule(&[]), None);
        assert_eq!(config.find("unknown", [("k", "v")]).map(|l| l.rule.clone()), None);
    }

    #[test]
    fn wildcards_after_the_exact_value_in_order_before_the_key_alone() {
        let mut root = Level::default();
        assert!(root.insert("k".into(), Some("files/*".into()), node(Some("files"), Level::default())));
        assert!(root.insert("k".into(), Some("*.pdf".into()), node(Some("pdf"), Level::default())));
        assert!(root.insert("k".into(), Some("files/a".into()), node(Some("exact"), Level::default())));
        assert!(root.insert("k".into(), None, node(Some("any"), Level::default())));
        assert!(!root.insert("k".into(), Some("files/*".into()), node(None, Level::default())));
        let mut config = EnvoyConfig::default();
        assert!(config.insert_domain("d".into(), root));
        let rule = |value: &str| config.find("d", [("k", value)]).map(|l| l.rule.clone());
        assert_eq!(rule("files/a").as_deref(), Some("exact"));
        // Both patterns match: the first configured wins.
        assert_eq!(rule("files/b.pdf").as_deref(), Some("files"));
        assert_eq!(rule("b.pdf").as_deref(), Some("pdf"));
        assert_eq!(rule("b.csv").as_deref(), Some("any"));
        assert_eq!(rule("").as_deref(), Some("any"));
    }

    fn matches(pattern: &str, value: &str) -> bool {
        Pattern::new(pattern).expect("a wildcard").matches(value)
    }

    #[test]
    fn a_star_matches_zero_or_more_characters_anywhere() {
        assert_eq!(Pattern::new("value"), None);
        for (pattern, value, expected) in [
            ("value*", "value", true),
            ("value*", "value1", true),
            ("value*", "valu", false),
            ("value*", "xvalue1", false),
            ("/api/*/action", "/api/123/action", true),
            ("/api/*/action", "/api//action", true),
            ("/api/*/action", "/api/123/other", false),
            // Prefix and suffix may not overlap.
            ("ab*ba", "aba", false),
            ("ab*ba", "abba", true),
            ("/api/*/resource/*/action", "/api/v1/resource/123/action", true),
            ("/api/*/resource/*/action", "/api/v1/resource/action", false),
            ("/api/*/resource/*/action", "/api/resource/x/resource/y/action", true),
            ("*", "", true),
            ("*", "anything", true),
            ("**", "", true),
            ("a*b*c", "abc", true),
            ("a*b*c", "acb", false),
            ("a*b*c", "aXbYbZc", true),
            // A middle part may not use the suffix's characters.
            ("a*bc*c", "abc", false),
            ("a*bc*c", "abcc", true),
            ("é*ü", "éxü", true),
            ("é*ü", "éü", true),
            ("é*ü", "ü", false),
        ] {
            assert_eq!(matches(pattern, value), expected, "{pattern:?} against {value:?}");
        }
    }

    #[test]
    fn hostile_values_are_matched_in_one_forward_scan() {
        // Backtracking traps: many stars against a long value that almost
        // matches (a backtracking matcher takes exponential time on these;
        // this one scans the value once per pattern part at most).
        let value = "a".repeat(1 << 20);
        let started = std::time::Instant::now();
        assert!(!matches(&("*a".repeat(64) + "b*"), &value));
        assert!(matches(&("*a".repeat(64) + "*"), &value));
        assert!(!matches(&("a*".repeat(64) + "b"), &value));
        assert!(matches(&("a*".repeat(64) + "b"), &(value.clone() + "b")));
        assert!(matches("*", &value));
        assert!(!matches("x*", &value));
        assert!(matches(&"*".repeat(10_000), ""));
        assert!(!matches(&"*x".repeat(10_000), ""));
        // A generous bound for a debug build; a backtracking matcher would never finish.
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "{:?}", started.elapsed());
    }
}
