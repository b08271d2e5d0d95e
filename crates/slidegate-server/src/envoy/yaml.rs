//! envoyproxy/ratelimit's YAML configuration, read as it is documented
//! (`domain`, nested `descriptors` with `key` and an optional `value`, which
//! may be a wildcard such as `files/*`, `rate_limit: {unit,
//! requests_per_unit, unlimited, name, replaces}`, `shadow_mode`,
//! `quota_mode`, `share_threshold`, `detailed_metric`, `value_to_metric`),
//! plus slidegate's additive keys under `rate_limit`: `algorithm` (default
//! `sliding_window_counter`) and `window` (a duration that need not be one
//! `unit`).
//!
//! Each configured limit becomes one limiter rule, named after its place in
//! the tree, which no HTTP request can match: Envoy's decisions go through
//! the same `RateLimiter` and layered store as the proxy's. Every error is
//! located by file, line and column.

use std::path::{Path, PathBuf};
use std::time::Duration;

use http::Method;
use serde::Deserialize;
use slidegate::{Algorithm, Limit, Quota};
use slidegate_http::config::{IdentityKind, LimitConfig, OnError, RuleConfig, RuleLimits};

use super::descriptors::{EnvoyConfig, Level, LimitKind, Node, NodeLimit};
use super::proto::Unit;

/// Why an `[envoy] config` could not be read; the configuration's
/// validation turns it into a located `ConfigError`.
#[derive(Debug)]
#[non_exhaustive]
pub enum YamlError {
    /// A file or directory could not be read.
    Read {
        /// What could not be read.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// A file is not a valid configuration.
    Invalid {
        /// The file.
        path: PathBuf,
        /// Its text, to locate `index` in.
        text: String,
        /// The byte offset of the problem, when known.
        index: Option<usize>,
        /// What was wrong and what was expected.
        message: String,
    },
}

/// The prefix of every rule made from an Envoy descriptor.
pub const RULE_PREFIX: &str = "envoy/";

/// The path of the rules made from descriptors: the strict reading of a
/// request path never holds a NUL (`%00` is not decoded there) and the
/// lenient one ends at it, so no HTTP request matches it.
const NO_HTTP_PATH: &str = "/\u{0}envoy";

/// The deepest descriptor tree read.
const MAX_DEPTH: usize = 16;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    domain: String,
    #[serde(default)]
    descriptors: Siblings,
    /// slidegate's extension: the request's descriptors decided all or
    /// nothing, in one store call.
    #[serde(default)]
    all_or_nothing: bool,
}

/// The descriptors of one level, each `key` and `value` at most once:
/// checked as they are read, so a repeated one is located.
#[derive(Deserialize, Default)]
#[serde(try_from = "Vec<Descriptor>")]
struct Siblings(Vec<RawDescriptor>);

impl TryFrom<Vec<Descriptor>> for Siblings {
    type Error = String;

    fn try_from(list: Vec<Descriptor>) -> Result<Self, String> {
        let list: Vec<RawDescriptor> = list.into_iter().map(|d| d.0).collect();
        let mut seen = std::collections::HashSet::new();
        for d in &list {
            if !seen.insert((d.key.0.as_str(), d.value.as_deref())) {
                return Err(match &d.value {
                    Some(value) => {
                        format!("descriptor key {:?} with value {value:?} is configured twice", d.key.0)
                    }
                    None => format!("descriptor key {:?} without a value is configured twice", d.key.0),
                });
            }
        }
        Ok(Self(list))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDescriptor {
    key: DescriptorKey,
    value: Option<String>,
    rate_limit: Option<RateLimitSpec>,
    #[serde(default)]
    descriptors: Siblings,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    quota_mode: bool,
    /// Only with a wildcard `value`: every value it matches counts as one.
    #[serde(default)]
    share_threshold: bool,
    /// Accepted: metrics are per configured descriptor, never per value
    /// (values are identities, hashed before any log or metric).
    #[serde(default)]
    #[allow(dead_code)]
    detailed_metric: bool,
    /// Accepted, as `detailed_metric`.
    #[serde(default)]
    #[allow(dead_code)]
    value_to_metric: bool,
}

/// A descriptor checked while it is read, so its errors carry the
/// parser's position.
#[derive(Deserialize)]
#[serde(try_from = "RawDescriptor")]
struct Descriptor(RawDescriptor);

impl TryFrom<RawDescriptor> for Descriptor {
    type Error = String;

    fn try_from(mut raw: RawDescriptor) -> Result<Self, String> {
        // The reference service reads an empty value as none.
        if raw.value.as_deref() == Some("") {
            raw.value = None;
        }
        if raw.share_threshold && !raw.value.as_deref().is_some_and(|v| v.contains('*')) {
            return Err(format!(
                "descriptor key {:?}: share_threshold needs a wildcard value (one holding `*`, such as \"files/*\"), found {}",
                raw.key.0,
                raw.value.as_ref().map_or_else(|| "no value".to_owned(), |v| format!("value {v:?}")),
            ));
        }
        Ok(Self(raw))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRateLimit {
    unit: Option<UnitName>,
    requests_per_unit: Option<u32>,
    #[serde(default)]
    unlimited: bool,
    name: Option<PolicyName>,
    #[serde(default)]
    replaces: Vec<RawReplaces>,
    algorithm: Option<AlgorithmName>,
    window: Option<WindowText>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplaces {
    name: ReplacedName,
}

/// A value checked as it is read, so that its error carries the parser's
/// position: `FromStr` of the string, its error the message.
macro_rules! checked_scalar {
    ($name:ident($inner:ty), $parse:expr) => {
        struct $name($inner);

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = String::deserialize(d)?;
                let parse: fn(&str) -> Result<$inner, String> = $parse;
                parse(&text).map($name).map_err(serde::de::Error::custom)
            }
        }
    };
}

checked_scalar!(UnitName((Unit, u64)), |text| {
    unit(text).ok_or_else(|| {
        format!("rate_limit unit {text:?}: expected one of second, minute, hour, day, week, month, year")
    })
});
checked_scalar!(DescriptorKey(String), |text| {
    if text.is_empty() {
        Err("descriptor key is empty: expected a name such as \"remote_address\"".to_owned())
    } else {
        Ok(text.to_owned())
    }
});
checked_scalar!(PolicyName(String), |text| policy_name(text).map(|()| text.to_owned()));
checked_scalar!(ReplacedName(String), |text| {
    if text.is_empty() {
        Err("rate_limit replaces name is empty: expected the name of another rate_limit".to_owned())
    } else {
        Ok(text.to_owned())
    }
});
checked_scalar!(AlgorithmName(Algorithm), |text| {
    text.parse::<Algorithm>().map_err(|e| format!("rate_limit algorithm: {e}"))
});
checked_scalar!(WindowText(Duration), window);

/// A `rate_limit` checked while it is read, so its errors carry the
/// parser's position.
#[derive(Deserialize)]
#[serde(try_from = "RawRateLimit")]
struct RateLimitSpec {
    kind: SpecKind,
    requests_per_unit: u32,
    unit: Unit,
    name: Option<String>,
    replaces: Vec<String>,
}

enum SpecKind {
    Limit(Limit),
    Unlimited,
    Blocked,
}

impl TryFrom<RawRateLimit> for RateLimitSpec {
    type Error = String;

    fn try_from(raw: RawRateLimit) -> Result<Self, String> {
        let name = raw.name.map(|n| n.0);
        let replaces: Vec<String> = raw.replaces.into_iter().map(|r| r.name.0).collect();
        if let Some(name) = name.as_deref().filter(|name| replaces.iter().any(|r| r == name)) {
            return Err(format!("rate_limit {name:?} replaces itself: expected the names of other limits"));
        }
        let requests_per_unit = raw.requests_per_unit.unwrap_or(0);
        if raw.unlimited {
            // As the reference service: an unlimited limit has no unit to count in.
            if raw.unit.is_some() {
                return Err("rate_limit with unlimited: true takes no unit".into());
            }
            let unit = Unit::Unknown;
            return Ok(Self { kind: SpecKind::Unlimited, requests_per_unit, unit, name, replaces });
        }
        let Some(UnitName((unit, unit_ms))) = raw.unit else {
            return Err("rate_limit needs a unit: second, minute, hour, day, week, month or year".into());
        };
        let kind = if raw.requests_per_unit.is_none() {
            return Err("rate_limit needs requests_per_unit (or unlimited: true)".into());
        } else if requests_per_unit == 0 {
            SpecKind::Blocked
        } else {
            let window = raw.window.map_or(Duration::from_millis(unit_ms), |w| w.0);
            let algorithm = raw.algorithm.map_or(Algorithm::SlidingWindowCounter, |a| a.0);
            let quota = Quota::new(u64::from(requests_per_unit), window)
                .map_err(|e| format!("rate_limit {requests_per_unit} per {window:?}: {e}"))?;
            let limit = Limit::new(algorithm, quota);
            slidegate::check_charge(&limit, 1).map_err(|e| format!("rate_limit: {e}"))?;
            SpecKind::Limit(limit)
        };
        Ok(Self { kind, requests_per_unit, unit, name, replaces })
    }
}

/// The unit as Envoy names it, and its length; case does not matter, as
/// in the reference service.
fn unit(text: &str) -> Option<(Unit, u64)> {
    const SECOND: u64 = 1000;
    Some(match text.to_ascii_lowercase().as_str() {
        "second" => (Unit::Second, SECOND),
        "minute" => (Unit::Minute, 60 * SECOND),
        "hour" => (Unit::Hour, 3600 * SECOND),
        "day" => (Unit::Day, 86_400 * SECOND),
        "week" => (Unit::Week, 7 * 86_400 * SECOND),
        // As the reference service counts them.
        "month" => (Unit::Month, 30 * 86_400 * SECOND),
        "year" => (Unit::Year, 365 * 86_400 * SECOND),
        _ => return None,
    })
}

/// `window: 90s`: a number and `ms`, `s`, `m`, `h` or `d`.
fn window(text: &str) -> Result<Duration, String> {
    let bad =
        || format!("rate_limit window {text:?}: expected a duration such as \"1500ms\", \"90s\" or \"2h\"");
    let digits = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let n: u64 = text[..digits].parse().map_err(|_| bad())?;
    let ms = match &text[digits..] {
        "ms" => Some(n),
        "s" => n.checked_mul(1000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        "d" => n.checked_mul(86_400_000),
        _ => None,
    };
    match ms {
        Some(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
        _ => Err(bad()),
    }
}

/// A name that can be written in a `RateLimit-Policy` header as it is.
fn policy_name(name: &str) -> Result<(), String> {
    let fits = |c: char| c.is_ascii_alphanumeric() || "_-.:/=".contains(c);
    if name.is_empty() || name.len() > 128 || !name.chars().all(fits) {
        return Err(format!(
            "rate_limit name {name:?}: expected 1 to 128 letters, digits or _-.:/= (it is sent in RateLimit headers)"
        ));
    }
    Ok(())
}

/// `[envoy] config`: a YAML file, or a directory whose `*.yaml`/`*.yml`
/// files are each one domain (read in name order).
///
/// # Errors
/// [`YamlError::Read`] for a file or directory that cannot be read,
/// [`YamlError::Invalid`] at the position of anything wrong, and at
/// `all_or_nothing: true` when the store cannot decide jointly (`joint`
/// false: a Redis Cluster). With `overrides`, each domain also gets the
/// rule its descriptors' `limit` overrides are decided under
/// (`envoy/<domain>`).
pub fn load(
    path: &Path,
    on_error: OnError,
    joint: bool,
    overrides: bool,
) -> Result<(EnvoyConfig, Vec<RuleConfig>), YamlError> {
    let read_err = |path: &Path, source| YamlError::Read { path: path.to_owned(), source };
    let files: Vec<PathBuf> = if path.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| read_err(path, e))?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml") && p.is_file())
            .collect();
        files.sort();
        files
    } else {
        vec![path.to_owned()]
    };
    let mut config = EnvoyConfig::default();
    config.set_overrides(overrides);
    let mut rules = Vec::new();
    for file in files {
        let bytes = std::fs::read(&file).map_err(|e| read_err(&file, e))?;
        let text = std::str::from_utf8(&bytes).map_err(|e| YamlError::Invalid {
            path: file.clone(),
            text: String::new(),
            index: None,
            message: format!("invalid UTF-8 at byte {}: expected a UTF-8 text file", e.valid_up_to()),
        })?;
        let at = |index: Option<usize>, message: String| YamlError::Invalid {
            path: file.clone(),
            text: text.to_owned(),
            index,
            message,
        };
        let raw: RawFile = serde_norway::from_str(text).map_err(|e| {
            let message = e.to_string();
            // The message ends with " at line L column C": the excerpt says it.
            let message = message.split(" at line ").next().unwrap_or(&message).to_owned();
            at(e.location().map(|l| l.index()), message)
        })?;
        if raw.domain.is_empty() {
            return Err(at(text.find("domain"), "domain is empty: expected a name such as \"envoy\"".into()));
        }
        let mut root = Level::default();
        let mut ctx = Compile {
            domain: &raw.domain,
            on_error,
            rules: &mut rules,
            path: Vec::new(),
            shared: Vec::new(),
        };
        for descriptor in raw.descriptors.0 {
            ctx.descriptor(&mut root, descriptor).map_err(|m| at(text.find(&raw.domain), m))?;
        }
        if !config.insert_domain(raw.domain.clone(), root) {
            return Err(at(
                text.find(&raw.domain),
                format!("domain {:?} is configured twice: expected one file per domain", raw.domain),
            ));
        }
        if overrides {
            // Its limit is a placeholder: each override brings its own.
            let placeholder = Limit::new(
                Algorithm::SlidingWindowCounter,
                Quota::per_second(1).unwrap_or_else(|_| unreachable_quota()),
            );
            rules.push(rule_config(
                &override_rule(&raw.domain),
                OVERRIDE_POLICY.to_owned(),
                placeholder,
                false,
                on_error,
            ));
        }
        if raw.all_or_nothing {
            if !joint {
                return Err(at(
                    text.find("all_or_nothing"),
                    "all_or_nothing: true needs a store that decides several identities in one call: \
                     the embedded store or one Redis server; a Redis Cluster keeps them in different \
                     slots, which no single call can charge together"
                        .into(),
                ));
            }
            config.set_all_or_nothing(&raw.domain);
        }
    }
    Ok((config, rules))
}

/// What compiling one domain's tree keeps.
struct Compile<'a> {
    domain: &'a str,
    on_error: OnError,
    rules: &'a mut Vec<RuleConfig>,
    /// The places of the descriptors above, and the one compiled.
    path: Vec<String>,
    /// Along `path`, each descriptor's shared wildcard value (`share_threshold`).
    shared: Vec<Option<String>>,
}

impl Compile<'_> {
    fn descriptor(&mut self, level: &mut Level, raw: RawDescriptor) -> Result<(), String> {
        if self.path.len() >= MAX_DEPTH {
            return Err(format!("domain {:?}: descriptors nested deeper than {MAX_DEPTH}", self.domain));
        }
        let key = raw.key.0;
        self.path.push(match &raw.value {
            Some(value) => format!("{key}_{value}"),
            None => key.clone(),
        });
        self.shared.push(raw.value.clone().filter(|_| raw.share_threshold));
        let place = self.path.join(".");
        let modes = Modes { shadow: raw.shadow_mode, quota: raw.quota_mode };
        let limit = raw.rate_limit.map(|spec| self.limit(spec, &place, modes));
        let mut children = Level::default();
        for child in raw.descriptors.0 {
            self.descriptor(&mut children, child)?;
        }
        self.path.pop();
        self.shared.pop();
        if !level.insert(key, raw.value, Node { limit, children }) {
            return Err(format!("domain {:?}: descriptor {place:?} is configured twice", self.domain));
        }
        Ok(())
    }

    /// A node's limit, and the rule deciding it.
    fn limit(&mut self, spec: RateLimitSpec, place: &str, modes: Modes) -> NodeLimit {
        let Modes { shadow, quota } = modes;
        let rule = format!("{RULE_PREFIX}{}/{place}", self.domain);
        let kind = match spec.kind {
            SpecKind::Unlimited => LimitKind::Unlimited,
            SpecKind::Blocked => LimitKind::Blocked,
            SpecKind::Limit(limit) => {
                self.rules.push(rule_config(
                    &rule,
                    policy(spec.name.as_deref(), place),
                    limit,
                    shadow,
                    self.on_error,
                ));
                LimitKind::Quota(limit.quota)
            }
        };
        NodeLimit {
            rule,
            kind,
            requests_per_unit: spec.requests_per_unit,
            unit: spec.unit,
            name: spec.name,
            replaces: spec.replaces,
            shadow,
            quota,
            shared: if self.shared.iter().any(Option::is_some) { self.shared.clone() } else { Vec::new() },
        }
    }
}

/// A descriptor's modes, which its limit keeps.
#[derive(Clone, Copy)]
struct Modes {
    shadow: bool,
    quota: bool,
}

/// The policy name in the `RateLimit` headers: the limit's `name`, else
/// its place in the tree with anything a header cannot carry as `_`.
fn policy(name: Option<&str>, place: &str) -> String {
    name.map_or_else(
        || {
            place
                .chars()
                .take(128)
                .map(|c| if c.is_ascii_alphanumeric() || "_-.:/=".contains(c) { c } else { '_' })
                .collect()
        },
        str::to_owned,
    )
}

fn rule_config(rule: &str, policy: String, limit: Limit, shadow: bool, on_error: OnError) -> RuleConfig {
    // `check_charge` passed for a cost of 1 when the spec was read.
    let limits = match LimitConfig::new(policy, limit, 1) {
        Ok(limit) => vec![limit],
        Err(_) => Vec::new(),
    };
    let path = NO_HTTP_PATH.parse().unwrap_or_else(|_| unreachable_pattern());
    let mut config =
        RuleConfig::new(rule, path, RuleLimits::Shared { identity: IdentityKind::ApiKey, limits });
    // A method no client sends, besides the path no request has.
    config.methods = Method::from_bytes(b"ENVOY-RLS").into_iter().collect();
    config.shadow = shadow;
    config.on_error = on_error;
    // hits_addend is a uint32; a cost above a limit is over the limit.
    config.max_cost = u64::from(u32::MAX);
    config
}

/// The rule a domain's descriptor `limit` overrides are decided under:
/// `envoy/<domain>`, which no configured descriptor's rule
/// (`envoy/<domain>/<place>`) can be.
pub(crate) fn override_rule(domain: &str) -> String {
    format!("{RULE_PREFIX}{domain}")
}

/// The domain whose overrides the rule named `rule` decides, if it is
/// one (`envoy/<domain>`), for describing the rules.
pub fn override_domain(rule: &str) -> Option<&str> {
    rule.strip_prefix(RULE_PREFIX).filter(|domain| !domain.contains('/'))
}

/// The policy an override is named by in the `RateLimit` headers.
const OVERRIDE_POLICY: &str = "limit_override";

/// One permit a second is a valid quota.
fn unreachable_quota() -> Quota {
    panic!("one permit a second is a valid quota")
}

/// `NO_HTTP_PATH` is a valid pattern (a unit test reads it).
fn unreachable_pattern() -> slidegate_http::PathPattern {
    panic!("the envoy rules' path pattern is invalid")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rules_path_is_a_pattern_no_request_matches() {
        let pattern: slidegate_http::PathPattern = NO_HTTP_PATH.parse().expect("valid");
        let matcher = slidegate_http::RuleMatcher::new(vec![(Vec::new(), pattern)]);
        let envoy = Method::from_bytes(b"ENVOY-RLS").expect("a method");
        // A raw NUL is no URI's (`http::Uri` refuses it); every spelling a
        // request can have misses the pattern, whatever its method.
        for path in ["/", "/envoy", "/%00envoy", "//envoy", "/%2500envoy"] {
            assert!(path.parse::<http::Uri>().is_ok());
            assert_eq!(matcher.find(&Method::GET, path), None, "{path}");
            assert_eq!(matcher.find(&envoy, path), None, "{path}");
        }
        assert!("/\u{0}envoy".parse::<http::Uri>().is_err());
    }

    #[test]
    fn windows_and_units() {
        assert_eq!(window("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(window("1500ms"), Ok(Duration::from_millis(1500)));
        assert!(window("0s").is_err() && window("s").is_err() && window("5w").is_err());
        assert_eq!(unit("MINUTE"), Some((Unit::Minute, 60_000)));
        assert_eq!(unit("Week"), Some((Unit::Week, 7 * 86_400_000)));
        assert_eq!(unit("fortnight"), None);
    }
}
