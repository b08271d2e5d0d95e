//! Which plan an API key is on: the plan set for it at run time (an
//! override), else the plan the keys file maps it to, else the default plan.
//!
//! Keys are looked up by their identity digest, which the limiter makes once
//! per request; no raw key is kept. The table of the file's keys is built
//! when a limiter is, so a reload swaps it with the rest of the
//! configuration. Overrides are a table of their own ([`PlanOverrides`]),
//! shared by every limiter a reload builds from the first: the server fills
//! it from the shared store in the background, and a request only reads it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::SystemTime;

use slidegate::Digest;

use crate::config::PlansConfig;
use crate::extractor::IdentityExtractor;

/// A plan, by its place in [`PlansConfig::plans`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PlanId(pub(crate) usize);

/// The plans of one configuration, compiled.
#[derive(Debug, Default)]
pub(crate) struct Plans {
    names: Vec<Arc<str>>,
    by_key: HashMap<Digest, PlanId>,
    default: Option<PlanId>,
}

impl Plans {
    /// The plans of `config`, its keys given as they are hashed by `extractor`
    /// (the limiter's, so they match the digests of requests). A key mapped
    /// twice keeps its first plan; configuration files refuse that anyway.
    pub(crate) fn compile(config: &PlansConfig, extractor: &IdentityExtractor) -> Self {
        let mut by_key = HashMap::with_capacity(config.keys.len());
        let known = |plan: usize| plan < config.plans.len();
        for &(digest, plan) in config.keys.digests() {
            if known(plan) {
                by_key.entry(digest).or_insert(PlanId(plan));
            }
        }
        for (key, plan) in config.keys.raw_keys() {
            if known(plan) {
                by_key.entry(extractor.key_digest(key)).or_insert(PlanId(plan));
            }
        }
        Self {
            names: config.plans.iter().map(|p| Arc::from(p.name.as_str())).collect(),
            by_key,
            default: config.default_plan.filter(|&p| known(p)).map(PlanId),
        }
    }

    /// The plan names, in order.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(|n| &**n)
    }

    /// The plan of the API key whose digest is `digest`: its override, if
    /// it has one naming a plan of this configuration, else its plan in the
    /// keys file, else the default plan.
    pub(crate) fn of(&self, digest: &Digest, overrides: &PlanOverrides) -> Option<PlanId> {
        if let Some(name) = overrides.plan(digest) {
            if let Some(i) = self.names.iter().position(|n| *n == name) {
                return Some(PlanId(i));
            }
        }
        self.by_key.get(digest).copied().or(self.default)
    }
}

/// One key's plan set at run time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanOverride {
    /// The plan's name (an override naming no plan of the running
    /// configuration is ignored until one does).
    pub plan: Arc<str>,
    /// When it ends; `None`: when it is deleted.
    pub expires_at: Option<SystemTime>,
}

/// The plans set for single keys at run time, by key digest, as last read
/// from wherever they are kept (`slidegate serve`: the shared store).
#[derive(Debug, Default)]
pub struct PlanOverrides {
    table: RwLock<Arc<HashMap<Digest, PlanOverride>>>,
    /// Whether the table has any entry: the common request has no override
    /// to look for and takes no lock.
    any: AtomicBool,
}

impl PlanOverrides {
    /// Replaces every override with `table`.
    pub fn replace(&self, table: HashMap<Digest, PlanOverride>) {
        let any = !table.is_empty();
        *self.table.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(table);
        self.any.store(any, Ordering::Release);
    }

    /// How many overrides are held (expired ones included until the next `replace`).
    pub fn len(&self) -> usize {
        self.table.read().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Whether no override is held.
    pub fn is_empty(&self) -> bool {
        !self.any.load(Ordering::Acquire)
    }

    /// The plan set for `digest`, unless it has expired.
    fn plan(&self, digest: &Digest) -> Option<Arc<str>> {
        if self.is_empty() {
            return None;
        }
        let table = Arc::clone(&self.table.read().unwrap_or_else(PoisonError::into_inner));
        let entry = table.get(digest)?;
        match entry.expires_at {
            Some(at) if at <= SystemTime::now() => None,
            _ => Some(Arc::clone(&entry.plan)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::PlanConfig;

    fn config() -> PlansConfig {
        let mut config = PlansConfig {
            plans: vec![PlanConfig::new("free"), PlanConfig::new("pro")],
            default_plan: Some(0),
            ..PlansConfig::default()
        };
        config.keys.push_key(b"alice", 1);
        config
    }

    #[test]
    fn file_then_default_then_override() {
        let extractor = IdentityExtractor::new(b"s");
        let plans = Plans::compile(&config(), &extractor);
        let none = PlanOverrides::default();
        assert_eq!(plans.of(&extractor.key_digest(b"alice"), &none), Some(PlanId(1)));
        assert_eq!(plans.of(&extractor.key_digest(b"bob"), &none), Some(PlanId(0)));
        let overrides = PlanOverrides::default();
        let bob = extractor.key_digest(b"bob");
        let alice = extractor.key_digest(b"alice");
        overrides.replace(HashMap::from([
            (bob, PlanOverride { plan: "pro".into(), expires_at: None }),
            (alice, PlanOverride { plan: "gone".into(), expires_at: None }),
        ]));
        assert_eq!(plans.of(&bob, &overrides), Some(PlanId(1)));
        // An override naming no plan of this configuration is ignored.
        assert_eq!(plans.of(&alice, &overrides), Some(PlanId(1)));
        let past = SystemTime::now() - Duration::from_secs(1);
        overrides
            .replace(HashMap::from([(bob, PlanOverride { plan: "pro".into(), expires_at: Some(past) })]));
        assert_eq!(plans.of(&bob, &overrides), Some(PlanId(0)), "an expired override is over");
    }

    #[test]
    fn keys_hash_with_the_limiters_secret() {
        let mut config = config();
        config.default_plan = None;
        let one = IdentityExtractor::new(b"one");
        let plans = Plans::compile(&config, &one);
        let none = PlanOverrides::default();
        assert_eq!(plans.of(&one.key_digest(b"alice"), &none), Some(PlanId(1)));
        let two = IdentityExtractor::new(b"two");
        assert_eq!(plans.of(&two.key_digest(b"alice"), &none), None, "no default plan: the rule's own");
        assert_eq!(plans.names().collect::<Vec<_>>(), ["free", "pro"]);
    }
}
