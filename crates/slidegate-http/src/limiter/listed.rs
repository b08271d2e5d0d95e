//! The allow and deny lists as the limiter applies them: a listed request is
//! answered before any store call (see `crate::lists`).

use std::net::IpAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use slidegate::Source;

use super::RateLimiter;
use crate::lists::ListScope;
use crate::offenders::IdentityHash;
use crate::verdict::{DecisionSource, Policies, Verdict};

impl<S> RateLimiter<S> {
    /// The verdict of a request the lists name, counted; `None` when they
    /// name nobody it is (the rules decide). `rule` is the matched rule's
    /// number, `None` when none matched; `client` the client's address
    /// after the trusted-proxy logic (a spoofed forwarding header from an
    /// untrusted peer is never read).
    pub(super) fn listed(
        &self,
        rule: Option<usize>,
        client: Option<IpAddr>,
        api_key: Option<&[u8]>,
    ) -> Option<Verdict<'_>> {
        let lists = &self.inner.lists;
        if lists.is_empty() {
            return None;
        }
        let ip = client.filter(|_| lists.needs_ip());
        let key = api_key.filter(|_| lists.needs_key());
        self.listed_client(rule, ip, key)
    }

    /// The verdict of a client at `ip` with `key` that the lists name,
    /// counted: [`RateLimiter::listed`] once the request is read, and
    /// `/v1/check` for the key it is asked about.
    pub(super) fn listed_client(
        &self,
        rule: Option<usize>,
        ip: Option<IpAddr>,
        key: Option<&[u8]>,
    ) -> Option<Verdict<'_>> {
        let extractor = &self.inner.identity;
        let listed = self.inner.lists.judge(rule, ip, key)?;
        let counters = match (listed.scope, rule) {
            (ListScope::Rule, Some(rule)) => &self.inner.metrics.rule(rule).lists,
            _ => self.inner.metrics.global_lists(),
        };
        let counter = if listed.denied { &counters.denied } else { &counters.exempt };
        counter.fetch_add(1, Relaxed);
        let name = rule.map_or("", |i| self.inner.rules[i].name.as_str());
        // Whom the lists named, hashed as the offenders page shows it.
        let scope: Arc<str> = Arc::from("");
        let identity = match (listed.by, key, ip) {
            (Source::ApiKey, Some(key), _) => extractor.identity(&scope, Source::ApiKey, key),
            (_, _, ip) => {
                let bytes = ip.map(|ip| extractor.ip_bytes(ip)).unwrap_or_default();
                extractor.identity(&scope, Source::Ip, &bytes)
            }
        };
        let source = if listed.denied {
            DecisionSource::DenyList(listed.scope)
        } else {
            DecisionSource::AllowList(listed.scope)
        };
        Some(Verdict {
            rule: name,
            policies: Policies::default(),
            source,
            shadow: false,
            pending: None,
            blocked: false,
            set_values: None,
            cost_header: None,
            over_in_flight: None,
            identity: IdentityHash::from(&identity),
            cached: false,
            delayed: None,
        })
    }
}
