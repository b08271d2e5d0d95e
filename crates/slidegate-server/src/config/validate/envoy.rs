//! `[envoy] config`: envoyproxy/ratelimit's YAML, read next to this file;
//! its limits join the rules (errors located in the YAML's own lines).

use std::sync::Arc;

use slidegate_http::config::{OnError, RuleConfig};

use super::super::error::ConfigError;
use super::super::raw::RawEnvoy;
use super::Validator;
use crate::envoy::{EnvoyConfig, YamlError};

impl Validator<'_> {
    /// The descriptors of `[envoy] config`, their rules appended to `rules`;
    /// `joint`: whether the store decides several identities in one call
    /// (not a Redis Cluster), which `all_or_nothing` domains need.
    pub(super) fn envoy(
        &self,
        raw: Option<RawEnvoy>,
        on_error: OnError,
        joint: bool,
        rules: &mut Vec<RuleConfig>,
    ) -> Result<Arc<EnvoyConfig>, ConfigError> {
        let Some(raw) = raw else { return Ok(Arc::default()) };
        let overrides = match &raw.limit_overrides {
            None => true,
            Some(value) if value.get_ref() == "apply" => true,
            Some(value) if value.get_ref() == "ignore" => false,
            Some(value) => {
                let other = value.get_ref();
                return Err(self.err(
                    value.span(),
                    format!(
                        "[envoy] limit_overrides {other:?}: expected \"apply\" (a descriptor's `limit` from \
                         Envoy replaces the configured one, as in envoyproxy/ratelimit) or \"ignore\""
                    ),
                ));
            }
        };
        let dir = self.path.parent().unwrap_or(std::path::Path::new(""));
        let path = dir.join(raw.config.get_ref());
        if !path.exists() {
            return Err(self.err(
                raw.config.span(),
                format!("[envoy] config {}: no such file or directory: expected a YAML file or a directory of them", path.display()),
            ));
        }
        let (config, envoy_rules) =
            crate::envoy::load(&path, on_error, joint, overrides).map_err(|err| match err {
                YamlError::Read { path, source } => ConfigError::Read { path, source },
                YamlError::Invalid { path, text, index, message } => {
                    ConfigError::at(&path, &text, index.map(|i| i..i + 1), message)
                }
            })?;
        // Domains and keys are free text: `a/b` + `c` and `a` + `b/c` would
        // name one rule, and one would decide by the other's limits.
        let mut names = std::collections::HashSet::new();
        if let Some(twice) = envoy_rules.iter().find(|r| !names.insert(r.name.as_str())) {
            return Err(self.err(
                raw.config.span(),
                format!(
                    "two descriptors (or a domain's limit overrides and a descriptor) would both be rule {:?}: \
                     a '/' in a domain or key makes their places meet; rename one",
                    twice.name
                ),
            ));
        }
        if let Some(taken) = envoy_rules.iter().find(|r| rules.iter().any(|t| t.name == r.name)) {
            return Err(self.err(
                raw.config.span(),
                format!(
                    "rule name {:?} is taken by a [[rules]] entry: rules named envoy/… are the descriptors'",
                    taken.name
                ),
            ));
        }
        rules.extend(envoy_rules);
        Ok(Arc::new(config))
    }
}
