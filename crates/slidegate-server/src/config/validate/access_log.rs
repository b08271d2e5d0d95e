//! `[access_log]`: where decisions are logged and which allowed ones.

use std::path::PathBuf;

use toml::Spanned;

use super::super::error::ConfigError;
use super::super::raw::RawAccessLog;
use super::super::types::{AccessLogConfig, AccessLogPath};
use super::Validator;

impl Validator<'_> {
    pub(super) fn access_log(&self, table: Spanned<RawAccessLog>) -> Result<AccessLogConfig, ConfigError> {
        let span = table.span();
        let raw = table.into_inner();
        let path = match raw.path {
            None => {
                return Err(self.err(
                    span,
                    "[access_log] has no path: expected path = \"/var/log/slidegate/access.jsonl\" \
                     (or \"-\" for standard output)",
                ))
            }
            Some(path) if path.get_ref().is_empty() || path.get_ref().contains('\0') => {
                return Err(self.err(
                    path.span(),
                    "access_log path must be a file name (or \"-\" for standard output), \
                     not empty, without NUL",
                ))
            }
            Some(path) if path.get_ref() == "-" => AccessLogPath::Stdout,
            Some(path) => AccessLogPath::File(PathBuf::from(path.into_inner())),
        };
        let sample_allowed = match raw.sample_allowed {
            None => 1.0,
            Some(rate) => {
                let value = *rate.get_ref();
                // The sampler counts in millionths: a smaller share would log nothing.
                if !(value == 0.0 || (1e-6..=1.0).contains(&value)) {
                    return Err(self.err(
                        rate.span(),
                        format!(
                            "sample_allowed {value} is out of range: expected 0 (no allowed request), \
                             1 (every one) or a share in between no smaller than 0.000001, such as 0.01"
                        ),
                    ));
                }
                value
            }
        };
        Ok(AccessLogConfig { path, sample_allowed })
    }
}
