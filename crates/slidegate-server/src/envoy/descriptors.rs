//! The descriptor tree of envoyproxy/ratelimit's configuration, compiled,
//! and its matching rules: pure lookups, no I/O.
//!
//! A request descriptor is a list of entries `(key, value)`. Its entries are
//! walked down the domain's tree: at each level an entry picks the node
//! configured for its exact `key` and `value`, else the node configured for
//! its `key` alone (which counts each value apart), else nothing. The limit
//! that applies is the one of the node the *last* entry reached; a
//! descriptor that stops early, or ends on a node without a limit, is not
//! limited — as the reference service documents.

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
}

/// One level of a domain's tree: its nodes by key, then by value.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Level {
    keys: HashMap<String, Keyed>,
}

/// The nodes of one key: for exact values, and for any value.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Keyed {
    exact: HashMap<String, Node>,
    any: Option<Node>,
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
            let node = keyed.exact.get(value).or(keyed.any.as_ref())?;
            if entries.peek().is_none() {
                return node.limit.as_ref();
            }
            level = &node.children;
        }
        None
    }
}

impl Level {
    /// Adds `node` for `key` (and `value`, if given); `false` when that
    /// place is taken.
    pub(crate) fn insert(&mut self, key: String, value: Option<String>, node: Node) -> bool {
        let keyed = self.keys.entry(key).or_default();
        match value {
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
}
