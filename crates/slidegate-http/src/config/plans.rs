//! Plans: named sets of limits per rule, and the API keys each plan is for.

use slidegate::Digest;

use super::LimitConfig;

/// The plans, the keys mapped to them, and the plan of a key mapped to none.
///
/// A plan replaces a rule's limits for the requests carrying an API key of
/// that plan, on the rules that count by API key (`identity = "api_key"`,
/// or the `authenticated` list of a split rule). A rule the plan says
/// nothing of keeps its own limits; requests without a key always do.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct PlansConfig {
    /// The plans, in order; a plan is named by its index here.
    pub plans: Vec<PlanConfig>,
    /// Which key is on which plan.
    pub keys: PlanKeys,
    /// The plan (index into `plans`) of a key `keys` does not map; `None`:
    /// such a key has the rule's own limits.
    pub default_plan: Option<usize>,
}

impl PlansConfig {
    /// The index of the plan named `name`.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.plans.iter().position(|p| p.name == name)
    }
}

/// One `[[plans]]` entry.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PlanConfig {
    /// The plan's name: in the keys file, `default_plan` and overrides.
    pub name: String,
    /// For each rule (by name) the plan changes, the limits that replace the
    /// rule's own, decided together.
    pub limits: Vec<(String, Vec<LimitConfig>)>,
}

impl PlanConfig {
    /// A plan named `name` with no limits of its own yet.
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into(), limits: Vec::new() }
    }

    /// The limits the plan gives rule `rule`, if it names it.
    pub fn limits_of(&self, rule: &str) -> Option<&[LimitConfig]> {
        self.limits.iter().find(|(name, _)| name == rule).map(|(_, limits)| limits.as_slice())
    }
}

/// API keys mapped to plans (by index into [`PlansConfig::plans`]).
///
/// A key is held as its identity digest when it can be: a key given as its
/// hash, or hashed where the secret is known. A key given as it is waits
/// here only until a limiter hashes it with its own secret (a random one
/// drawn by the process); its `Debug` form never shows it.
#[derive(Clone, Default, PartialEq)]
pub struct PlanKeys {
    digests: Vec<(Digest, usize)>,
    raw: Vec<(Box<[u8]>, usize)>,
}

impl PlanKeys {
    /// Maps the key whose identity digest is `digest` to plan `plan`.
    pub fn push_digest(&mut self, digest: Digest, plan: usize) {
        self.digests.push((digest, plan));
    }

    /// Maps the key `key` itself to plan `plan`: hashed when a limiter is built.
    pub fn push_key(&mut self, key: &[u8], plan: usize) {
        self.raw.push((key.into(), plan));
    }

    /// How many keys are mapped.
    pub fn len(&self) -> usize {
        self.digests.len() + self.raw.len()
    }

    /// Whether no key is mapped.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The keys given as digests.
    pub fn digests(&self) -> &[(Digest, usize)] {
        &self.digests
    }

    /// The keys given as they are, still to be hashed.
    pub fn raw_keys(&self) -> impl Iterator<Item = (&[u8], usize)> {
        self.raw.iter().map(|(key, plan)| (&key[..], *plan))
    }

    /// Drops the keys still held as they are: for a copy of a configuration
    /// kept after its limiter was built (which holds their digests).
    pub fn forget_raw_keys(&mut self) {
        self.raw = Vec::new();
    }
}

impl std::fmt::Debug for PlanKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanKeys")
            .field("digests", &self.digests.len())
            .field("raw", &self.raw.len())
            .finish()
    }
}
