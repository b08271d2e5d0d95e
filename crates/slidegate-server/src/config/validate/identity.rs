//! `[identity]`: who a request is.

use slidegate_http::config::IdentityConfig;

use super::super::error::ConfigError;
use super::super::raw::RawIdentity;
use super::super::values::Cidr;
use super::Validator;

impl Validator<'_> {
    pub(super) fn identity(&self, raw: RawIdentity) -> Result<IdentityConfig, ConfigError> {
        let mut identity = IdentityConfig::default();
        if let Some(var) = raw.ip_hash_secret_env {
            let holds = "ip_hash_secret_env names the variable holding the identity hash secret (every \
                         instance sharing a store needs the same one)";
            identity.secret = Some(self.env_value(&var, holds)?.into_bytes());
        }
        if let Some(p) = raw.ipv6_prefix {
            if !(1..=128).contains(p.get_ref()) {
                return Err(self.err(p.span(), format!("ipv6_prefix must be 1 to 128, got {}", p.get_ref())));
            }
            identity.ipv6_prefix = *p.get_ref();
        }
        identity.api_key_header = raw.api_key_header.map(|h| h.0);
        identity.trusted_proxies = self.each::<Cidr>(raw.trusted_proxies)?.into_iter().map(|c| c.0).collect();
        if let Some(header) = raw.forwarded_header {
            identity.forwarded_header = header.0;
        }
        Ok(identity)
    }
}
