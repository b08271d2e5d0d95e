//! `[[plans]]`, `[identity] plans_file` and `default_plan`: which limits the
//! API keys of each plan get, and which key is on which plan.
//!
//! The keys file has one key a line: `KEY PLAN`, or `hash:<32 hex digits>
//! PLAN` for a key given as its identity digest (`slidegate identity hash
//! --full`); blank lines and lines starting with `#` are skipped. Its errors
//! are located in the keys file, by its own line and column. Where the hash
//! secret is configured, keys are hashed here and only their digests are
//! kept; without one, each process hashes them with the secret it draws.

use std::collections::HashMap;
use std::io::Read as _;
use std::ops::Range;
use std::path::{Path, PathBuf};

use slidegate::{Digest, IdentityHasher, Source};
use slidegate_http::config::{IdentityConfig, IdentityKind, PlanConfig, PlansConfig, RuleConfig, RuleLimits};
use toml::Spanned;

use super::super::error::ConfigError;
use super::super::raw::RawPlan;
use super::Validator;

/// The largest keys file read: about a million keys. A larger one is refused
/// before it is read whole.
pub(crate) const MAX_PLANS_FILE_BYTES: u64 = 64 << 20;
/// The longest key a line may hold (longer header values are not API keys).
const MAX_KEY_BYTES: usize = 1024;
/// What a keys file line looks like, for errors.
const LINE_FORM: &str = "expected `KEY PLAN` or `k:<32 hex digits> PLAN`";

/// Which parts the plans refer to could not be read or validated (their
/// errors are found already): what they would name is not reported missing.
pub(super) struct Partial {
    /// Some `[[rules]]` entry.
    pub(super) rules: bool,
    /// Some `[[plans]]` entry.
    pub(super) plans: bool,
    /// `[identity]`.
    pub(super) identity: bool,
}

/// `[identity] plans_file` and `default_plan`, as written.
pub(super) struct RawPlanKeys {
    pub(super) plans_file: Option<Spanned<String>>,
    pub(super) default_plan: Option<Spanned<String>>,
}

impl Validator<'_> {
    /// The plans, their keys and the default plan, checked against `rules`
    /// and `identity`.
    pub(super) fn plans(
        &self,
        raw: Vec<Spanned<RawPlan>>,
        keys: RawPlanKeys,
        rules: &[RuleConfig],
        identity: &IdentityConfig,
        partial: Partial,
    ) -> Result<PlansConfig, ConfigError> {
        let mut config = PlansConfig::default();
        if partial.identity {
            return Ok(config);
        }
        self.unique_plans(&raw)?;
        let first_span = raw.first().map(Spanned::span);
        for spanned in raw {
            let plan = self.plan(spanned.into_inner(), rules, partial.rules)?;
            config.plans.push(plan);
        }
        let needs_key = first_span
            .or_else(|| keys.plans_file.as_ref().map(Spanned::span))
            .or_else(|| keys.default_plan.as_ref().map(Spanned::span));
        if let (Some(span), None) = (needs_key, &identity.api_key_header) {
            return Err(self.err(
                span,
                "plans apply to API keys: set [identity] api_key_header to the header clients send theirs in",
            ));
        }
        if partial.plans {
            // The keys file and `default_plan` may name a plan that did not read.
            return Ok(config);
        }
        if let Some(default) = keys.default_plan {
            config.default_plan = Some(self.plan_named(&config, &default)?);
        }
        if let Some(file) = keys.plans_file {
            config.keys = self.keys_file(&file, &config, identity)?;
        }
        Ok(config)
    }

    /// One plan; `rules_partial` when some rule failed (a plan naming a rule
    /// not in `rules` is then not reported).
    fn plan(
        &self,
        raw: RawPlan,
        rules: &[RuleConfig],
        rules_partial: bool,
    ) -> Result<PlanConfig, ConfigError> {
        let name = raw.name.get_ref();
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            return Err(self.err(
                raw.name.span(),
                format!("invalid plan name {name:?}: expected letters, digits, '-', '_' or '.'"),
            ));
        }
        let mut plan = PlanConfig::new(name.clone());
        for (rule_name, list) in raw.limits {
            let Some(rule) = rules.iter().find(|r| r.name == *rule_name.get_ref()) else {
                if rules_partial {
                    continue;
                }
                let known: Vec<&str> = rules.iter().map(|r| r.name.as_str()).collect();
                return Err(self.err(
                    rule_name.span(),
                    format!(
                        "plan {name:?} sets limits for rule {:?}, which no [[rules]] entry names; rules: {}",
                        rule_name.get_ref(),
                        names_or_none(&known)
                    ),
                ));
            };
            if matches!(rule.limits, RuleLimits::Shared { identity: IdentityKind::Ip, .. }) {
                return Err(self.err(
                    rule_name.span(),
                    format!(
                        "rule {:?} counts by client IP (identity = \"ip\"): plans apply to API keys, \
                         so a plan cannot change its limits",
                        rule.name
                    ),
                ));
            }
            // Unnamed limits are named after the plan and the rule: `pro-search`.
            let limits = self.limits(&format!("{name}-{}", rule.name), list)?;
            plan.limits.push((rule.name.clone(), limits));
        }
        Ok(plan)
    }

    /// Finds a duplicate plan name, at its `name`.
    fn unique_plans(&self, raw: &[Spanned<RawPlan>]) -> Result<(), ConfigError> {
        for (i, plan) in raw.iter().enumerate() {
            let name = plan.get_ref().name.get_ref();
            if raw[..i].iter().any(|p| p.get_ref().name.get_ref() == name) {
                return Err(self.err(
                    plan.get_ref().name.span(),
                    format!("duplicate plan name {name:?}: plan names must be unique"),
                ));
            }
        }
        Ok(())
    }

    /// The index of the plan `name` names, or an error at it listing the plans.
    fn plan_named(&self, config: &PlansConfig, name: &Spanned<String>) -> Result<usize, ConfigError> {
        config.position(name.get_ref()).ok_or_else(|| {
            let known: Vec<&str> = config.plans.iter().map(|p| p.name.as_str()).collect();
            self.err(
                name.span(),
                format!("unknown plan {:?}: [[plans]] defines {}", name.get_ref(), names_or_none(&known)),
            )
        })
    }

    /// Reads and checks the keys file `file` names (relative to the
    /// configuration's directory).
    fn keys_file(
        &self,
        file: &Spanned<String>,
        config: &PlansConfig,
        identity: &IdentityConfig,
    ) -> Result<slidegate_http::config::PlanKeys, ConfigError> {
        let path = self.relative(file.get_ref());
        let bytes = read_bounded(&path).map_err(|why| {
            self.err(file.span(), format!("plans_file {:?} ({}): {why}", file.get_ref(), path.display()))
        })?;
        let source = super::decode(&path, &bytes).map_err(without_excerpt)?;
        let hasher = identity.secret.as_deref().map(IdentityHasher::new);
        KeysFile { path: &path, source, plans: config, hasher }.parse()
    }

    /// `name` relative to the directory of the configuration file.
    fn relative(&self, name: &str) -> PathBuf {
        let dir = self.path.parent().unwrap_or(Path::new(""));
        dir.join(name)
    }
}

/// The file's bytes, unless it cannot be read or is over the bound (which is
/// found without reading more than one byte past it).
fn read_bounded(path: &Path) -> Result<Vec<u8>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read it: {e}"))?;
    let mut bytes = Vec::new();
    file.take(MAX_PLANS_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read it: {e}"))?;
    if bytes.len() as u64 > MAX_PLANS_FILE_BYTES {
        return Err(format!(
            "larger than {} MiB: expected at most that (about a million keys), one `KEY PLAN` a line",
            MAX_PLANS_FILE_BYTES >> 20
        ));
    }
    Ok(bytes)
}

/// `err` without the excerpt of its line (a keys file's line holds a key).
fn without_excerpt(mut err: ConfigError) -> ConfigError {
    if let ConfigError::Invalid { snippet, .. } = &mut err {
        snippet.clear();
    }
    err
}

fn names_or_none(names: &[&str]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.iter().map(|n| format!("{n:?}")).collect::<Vec<_>>().join(", ")
    }
}

/// A keys file being parsed.
struct KeysFile<'a> {
    path: &'a Path,
    source: &'a str,
    plans: &'a PlansConfig,
    /// The configured secret's hasher: keys are hashed here when there is one.
    hasher: Option<IdentityHasher>,
}

impl KeysFile<'_> {
    /// An error at `field`, without the usual excerpt of the line: the line
    /// holds an API key, which is never printed or logged.
    fn err(&self, field: &str, message: impl Into<String>) -> ConfigError {
        without_excerpt(ConfigError::at(self.path, self.source, Some(self.span(field)), message))
    }

    /// The byte range of `field`, a slice of `source`.
    fn span(&self, field: &str) -> Range<usize> {
        let start = field.as_ptr() as usize - self.source.as_ptr() as usize;
        start..start + field.len()
    }

    fn parse(&self) -> Result<slidegate_http::config::PlanKeys, ConfigError> {
        let mut keys = slidegate_http::config::PlanKeys::default();
        // Each key's first line, to name it when the key comes again.
        let mut by_digest: HashMap<Digest, usize> = HashMap::new();
        let mut by_text: HashMap<&str, usize> = HashMap::new();
        // Numbered as they go: a line's number is never counted from the start.
        for (index, line) in self.source.lines().enumerate() {
            let text = line.trim();
            if text.is_empty() || text.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = text.split_ascii_whitespace().collect();
            let [key, plan] = fields[..] else {
                return Err(self.err(text, format!("{} fields: {LINE_FORM}", fields.len())));
            };
            let plan_index = self.plans.position(plan).ok_or_else(|| {
                let known: Vec<&str> = self.plans.plans.iter().map(|p| p.name.as_str()).collect();
                self.err(plan, format!("unknown plan {plan:?}: [[plans]] defines {}", names_or_none(&known)))
            })?;
            let digest = match key.strip_prefix("hash:").or_else(|| key.strip_prefix("k:")) {
                Some(hex) => Some(self.hash(key, hex)?),
                None => {
                    self.check_key(key)?;
                    self.hasher.as_ref().map(|h| h.digest(Source::ApiKey, key.as_bytes()))
                }
            };
            let line_no = index + 1;
            let first = match digest {
                Some(d) => by_digest.insert(d, line_no),
                None => by_text.insert(key, line_no),
            };
            if let Some(first) = first {
                return Err(
                    self.err(key, format!("this key is already mapped, at line {first}: one line per key"))
                );
            }
            match digest {
                Some(d) => keys.push_digest(d, plan_index),
                None => keys.push_key(key.as_bytes(), plan_index),
            }
        }
        Ok(keys)
    }

    /// A key given as its digest: 32 hex digits, under a configured secret.
    fn hash(&self, key: &str, hex: &str) -> Result<Digest, ConfigError> {
        let parsed = (hex.len() == 32).then(|| u128::from_str_radix(hex, 16).ok()).flatten();
        let Some(value) = parsed.filter(|_| hex.bytes().all(|b| b.is_ascii_hexdigit())) else {
            return Err(
                self.err(key, format!("invalid key hash: {LINE_FORM} (`slidegate identity hash --full`)"))
            );
        };
        if self.hasher.is_none() {
            return Err(self.err(
                key,
                "a key given as its hash needs [identity] ip_hash_secret_env: without it each process \
                 hashes with a random secret of its own, and no hash written here can match",
            ));
        }
        Ok(Digest(value.to_be_bytes()))
    }

    /// A key a request can carry: no comma (refused as ambiguous), no
    /// control character, bounded.
    fn check_key(&self, key: &str) -> Result<(), ConfigError> {
        let why = if key.len() > MAX_KEY_BYTES {
            format!("a key of {} bytes: expected at most {MAX_KEY_BYTES}", key.len())
        } else if key.contains(',') {
            "a key with a comma: serve refuses such a request with 400, and never counts it".to_owned()
        } else if key.chars().any(char::is_control) {
            "a key with a control character: it cannot be an HTTP header value".to_owned()
        } else {
            return Ok(());
        };
        Err(self.err(key, why))
    }
}
