//! `[store]`: which store and how to log in to it ([`StoreConfig`]), and the
//! keys of the limiter's [`StoreGuard`], written into the runtime type over
//! its defaults.

use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use slidegate::protect::LeasePolicy;
use slidegate::{Engine, Layout, RedisTarget};
use slidegate_http::config::{OnError, TimeSpan};
use slidegate_http::StoreGuard;
use toml::Spanned;

use super::super::error::ConfigError;
use super::super::raw::{RawLease, RawStore};
use super::super::types::{Password, StoreConfig};
use super::super::values::Millis;
use super::Validator;

/// The identities the packed layout is sized for when `expected_identities`
/// is not given: a million, 32,768 buckets.
const DEFAULT_EXPECTED_IDENTITIES: u64 = 1_000_000;

impl Validator<'_> {
    /// Everything of `[store]` but the guard's keys, which are left in `raw`.
    pub(super) fn store(&self, raw: &mut RawStore) -> Result<StoreConfig, ConfigError> {
        let mut store = StoreConfig::default();
        if let Some(url) = &raw.url {
            let u = url.get_ref();
            if !(u.starts_with("redis://") || u.starts_with("rediss://") || u.starts_with("redis+unix://")) {
                return Err(
                    self.err(url.span(), format!("invalid store url {u:?}: expected redis://host:port"))
                );
            }
        }
        if let Some(prefix) = raw.prefix.take() {
            if prefix.get_ref().contains(['{', '}']) {
                // Braces would make Redis Cluster hash only what is between
                // them: every key of every rule in one slot, or a CROSSSLOT error.
                return Err(self.err(
                    prefix.span(),
                    format!(
                        "invalid store prefix {:?}: braces choose Redis Cluster hash slots and slidegate \
                         places its own; expected a prefix without '{{' or '}}'",
                        prefix.get_ref()
                    ),
                ));
            }
            store.prefix = Some(prefix.into_inner());
        }
        if let Some(fallback) = raw.fallback.take() {
            self.legacy_fallback(fallback, raw.on_error)?;
        }
        if let Some(on_error) = raw.on_error {
            store.on_error = on_error;
        }
        store.redis = self.redis_target(raw)?;
        store.snapshot = self.snapshot(raw, store.redis.is_some())?;
        self.redis_login(raw, &mut store)?;
        self.redis_layout(raw, &mut store)?;
        Ok(store)
    }

    /// The former `fallback = true|false` beside `on_error`: one option now,
    /// `on_error = "fallback" | "allow" | "deny"`. An old file loads where
    /// its meaning is unchanged (`fallback = true` with no `on_error`, or
    /// `"fallback"`; `fallback = false` with `"allow"` or `"deny"`), and
    /// otherwise fails at the key with what to write instead.
    fn legacy_fallback(&self, fallback: Spanned<bool>, on_error: Option<OnError>) -> Result<(), ConfigError> {
        let span = fallback.span();
        match (*fallback.get_ref(), on_error) {
            (true, None | Some(OnError::Fallback)) | (false, Some(OnError::Allow | OnError::Deny)) => Ok(()),
            (true, Some(other)) => Err(self.err(
                span,
                format!(
                    "`fallback = true` and `on_error = \"{}\"` disagree: the fallback limiter is now \
                     `on_error = \"fallback\"` (the default); delete `fallback` and keep the `on_error` you mean",
                    on_error_name(other)
                ),
            )),
            (false, _) => Err(self.err(
                span,
                "`fallback` was replaced by `on_error`: a store failure is now decided by the fallback limiter \
                 (`on_error = \"fallback\"`, the default); for what `fallback = false` did, write \
                 `on_error = \"allow\"` (let requests through) or `on_error = \"deny\"` (503) instead",
            )),
        }
    }

    /// `url`, `cluster` or `sentinel` with `master_name`: at most one of them.
    fn redis_target(&self, raw: &mut RawStore) -> Result<Option<RedisTarget>, ConfigError> {
        // One target: the second key named is the one reported.
        let mut named: Vec<(&str, Range<usize>)> = Vec::new();
        if let Some(url) = &raw.url {
            named.push(("url", url.span()));
        }
        if let Some(cluster) = &raw.cluster {
            named.push(("cluster", cluster.span()));
        }
        if let Some(sentinel) = &raw.sentinel {
            named.push(("sentinel", sentinel.span()));
        }
        named.sort_by_key(|(_, span)| span.start);
        if let [(first, _), (second, span), ..] = named.as_slice() {
            return Err(self.err(
                span.clone(),
                format!(
                    "`{second}` and `{first}` both name the Redis store: expected one of `url` (one server), \
                     `cluster` (seed nodes of a Redis Cluster) or `sentinel` (with `master_name`)"
                ),
            ));
        }
        let cluster = match raw.cluster.take() {
            None => None,
            Some(list) => {
                let example = "[\"redis://127.0.0.1:7000\", \"redis://127.0.0.1:7001\"]";
                Some(RedisTarget::Cluster(self.redis_urls("cluster", list, example)?))
            }
        };
        let sentinel = match (raw.sentinel.take(), raw.master_name.take()) {
            (None, None) => None,
            (None, Some(name)) => {
                return Err(self.err(
                    name.span(),
                    "master_name is the master Sentinel is asked for: expected `sentinel = [\"redis://host:26379\"]` beside it",
                ))
            }
            (Some(list), None) => {
                return Err(self.err(
                    list.span(),
                    "sentinel needs `master_name`, the name the sentinels monitor the master by, such as \"mymaster\"",
                ))
            }
            (Some(list), Some(name)) => {
                if name.get_ref().is_empty() {
                    return Err(self.err(name.span(), "master_name must not be empty"));
                }
                let sentinels = self.redis_urls("sentinel", list, "[\"redis://127.0.0.1:26379\"]")?;
                Some(RedisTarget::Sentinel { sentinels, master_name: name.into_inner() })
            }
        };
        let single = raw.url.take().map(|url| RedisTarget::Single(url.into_inner()));
        Ok(cluster.or(sentinel).or(single))
    }

    /// `layout` and `expected_identities`: only beside a Redis target, the
    /// second only for the packed layout.
    fn redis_layout(&self, raw: &mut RawStore, store: &mut StoreConfig) -> Result<(), ConfigError> {
        let expected = raw.expected_identities.take();
        let Some(layout) = raw.layout.take() else {
            return match expected {
                Some(e) => Err(self.err(
                    e.span(),
                    "expected_identities sizes the packed layout's buckets: expected `layout = \"packed\"` in [store]",
                )),
                None => Ok(()),
            };
        };
        if store.redis.is_none() {
            return Err(self.err(
                layout.span(),
                "layout applies to a Redis store: expected `url`, `cluster` or `sentinel` in [store]",
            ));
        }
        store.layout = match layout.get_ref().as_str() {
            "per_key" => {
                if let Some(e) = expected {
                    return Err(
                        self.err(e.span(), "expected_identities applies to `layout = \"packed\"` only")
                    );
                }
                Layout::PerKey
            }
            "packed" => {
                let identities = match expected {
                    Some(e) if *e.get_ref() == 0 => {
                        return Err(self.err(e.span(), "expected_identities must be at least 1"));
                    }
                    Some(e) => *e.get_ref(),
                    None => DEFAULT_EXPECTED_IDENTITIES,
                };
                Layout::packed_for(identities)
            }
            other => {
                return Err(self.err(
                    layout.span(),
                    format!(
                        "unknown layout {other:?}: expected \"per_key\" (a key per identity and limit, the \
                         default) or \"packed\" (counts as fields of shared hashes)"
                    ),
                ))
            }
        };
        Ok(())
    }

    /// `username`, `password_env`, `tls_ca` and `engine`: only beside a Redis target.
    fn redis_login(&self, raw: &mut RawStore, store: &mut StoreConfig) -> Result<(), ConfigError> {
        let has_redis = store.redis.is_some();
        let needs_redis = |key: &str, span: Range<usize>| {
            self.err(
                span,
                format!("{key} applies to a Redis store: expected `url`, `cluster` or `sentinel` in [store]"),
            )
        };
        if let Some(u) = raw.username.take() {
            if !has_redis {
                return Err(needs_redis("username", u.span()));
            }
            if u.get_ref().is_empty() {
                return Err(self.err(u.span(), "username must not be empty"));
            }
            store.username = Some(u.into_inner());
        }
        if let Some(var) = raw.password_env.take() {
            if !has_redis {
                return Err(needs_redis("password_env", var.span()));
            }
            let holds =
                "password_env names the variable holding the Redis password (so the file holds no secret)";
            let value = self.env_value(&var, holds)?;
            store.password = Some(Password::from_env(var.into_inner(), value));
        }
        if let Some(ca) = raw.tls_ca.take() {
            if !has_redis {
                return Err(needs_redis("tls_ca", ca.span()));
            }
            store.tls_ca = Some(self.tls_ca(ca, store.redis.as_ref())?);
        }
        if let Some(e) = raw.engine.take() {
            if !has_redis {
                return Err(needs_redis("engine", e.span()));
            }
            store.engine = e.get_ref().parse::<Engine>().map_err(|_| {
                self.err(
                    e.span(),
                    format!(
                        "unknown engine {:?}: expected \"auto\" (the native module where Redis has it, else \
                         Lua), \"lua\" or \"module\"",
                        e.get_ref()
                    ),
                )
            })?;
        }
        Ok(())
    }

    /// `tls_ca`: a readable file, for a server or cluster reached over `rediss://`.
    fn tls_ca(&self, ca: Spanned<String>, target: Option<&RedisTarget>) -> Result<PathBuf, ConfigError> {
        let tls = |u: &String| u.starts_with("rediss://");
        let plain = match target {
            Some(RedisTarget::Single(url)) => !tls(url),
            Some(RedisTarget::Cluster(seeds)) => !seeds.iter().all(tls),
            _ => false,
        };
        if plain {
            return Err(self.err(
                ca.span(),
                "tls_ca is the CA trusted for TLS, but the store URLs are not rediss://: \
                 expected rediss://host:port URLs with tls_ca",
            ));
        }
        let path = PathBuf::from(ca.get_ref());
        if let Err(e) = std::fs::metadata(&path) {
            return Err(self.err(
                ca.span(),
                format!("cannot read tls_ca {}: {e}: expected a PEM CA certificate file", path.display()),
            ));
        }
        Ok(path)
    }

    /// A non-empty list of `redis://` or `rediss://` URLs for the key `key`.
    fn redis_urls(
        &self,
        key: &str,
        list: Spanned<Vec<Spanned<String>>>,
        example: &str,
    ) -> Result<Vec<String>, ConfigError> {
        let span = list.span();
        let list = list.into_inner();
        if list.is_empty() {
            return Err(
                self.err(span, format!("{key} is empty: expected at least one URL, such as {example}"))
            );
        }
        list.into_iter()
            .map(|u| {
                let text = u.get_ref();
                if text.starts_with("redis://") || text.starts_with("rediss://") {
                    Ok(u.into_inner())
                } else {
                    Err(self.err(
                        u.span(),
                        format!(
                            "invalid {key} URL {text:?}: expected redis://host:port or rediss://host:port"
                        ),
                    ))
                }
            })
            .collect()
    }

    /// The guard's keys of `[store]`, each written over [`StoreGuard::default`].
    pub(super) fn guard(&self, raw: RawStore) -> Result<StoreGuard, ConfigError> {
        let mut guard = StoreGuard::default();
        self.set_millis(&mut guard.calls.timeout, "timeout_ms", raw.timeout_ms, 1)?;
        self.set_count(&mut guard.calls.breaker.failures, "breaker_failures", raw.breaker_failures)?;
        self.set_millis(&mut guard.calls.probe_interval, "probe_interval_ms", raw.probe_interval_ms, 1)?;
        self.set_millis(&mut guard.calls.breaker.window, "breaker_window_ms", raw.breaker_window_ms, 10)?;
        self.set_count(&mut guard.calls.breaker.min_calls, "breaker_min_calls", raw.breaker_min_calls)?;
        if let Some(r) = raw.breaker_failure_rate {
            if !(1..=100).contains(r.get_ref()) {
                return Err(self.err(
                    r.span(),
                    format!("breaker_failure_rate is a percentage from 1 to 100, got {}", r.get_ref()),
                ));
            }
            guard.calls.breaker.failure_rate = *r.get_ref();
        }
        let trial = raw.breaker_trial_interval_ms;
        self.set_millis(&mut guard.calls.breaker.trial_interval, "breaker_trial_interval_ms", trial, 1)?;
        self.set_count(&mut guard.fallback.instances, "instances", raw.instances)?;
        if let Some(n) = raw.deny_cache {
            // A u32 in the file: at most 4 Gi slots, which fits every usize we build for.
            guard.deny_cache = *n.get_ref() as usize;
        }
        if let Some(lease) = raw.lease {
            guard.lease = Some(self.lease(lease.into_inner())?);
        }
        Ok(guard)
    }

    /// `lease = { max = …, horizon = "…" }`: max 2 to 10000 permits (1 would
    /// lease nothing), the horizon from 1 ms to 10 s.
    fn lease(&self, raw: RawLease) -> Result<LeasePolicy, ConfigError> {
        let mut policy = LeasePolicy::default();
        let max = *raw.max.get_ref();
        if !(2..=10_000).contains(&max) {
            return Err(self.err(raw.max.span(), format!("lease max is 2 to 10000 permits, got {max}")));
        }
        policy.max = max;
        if let Some(h) = raw.horizon {
            if h.duration < Duration::from_millis(1) || h.duration > Duration::from_secs(10) {
                return Err(self.err(h.span, format!("lease horizon is 1ms to 10s, got {:?}", h.text)));
            }
            policy.horizon = TimeSpan::from_millis(h.duration.as_millis() as u64);
        }
        Ok(policy)
    }

    /// Sets `field` to `value`, which must be at least `least_ms`, when the key is there.
    fn set_millis(
        &self,
        field: &mut TimeSpan,
        key: &str,
        value: Option<Millis>,
        least_ms: u64,
    ) -> Result<(), ConfigError> {
        match value {
            Some(v) if v.delay.as_millis() < least_ms => {
                Err(self.err(v.span, format!("{key} must be at least {least_ms}")))
            }
            Some(v) => {
                *field = v.delay;
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Sets `field` to `value`, which must be at least 1, when the key is there.
    fn set_count(&self, field: &mut u32, key: &str, value: Option<Spanned<u32>>) -> Result<(), ConfigError> {
        match value {
            Some(v) if *v.get_ref() == 0 => Err(self.err(v.span(), format!("{key} must be at least 1"))),
            Some(v) => {
                *field = *v.get_ref();
                Ok(())
            }
            None => Ok(()),
        }
    }
}

/// `on_error`'s value as a file spells it.
fn on_error_name(on_error: OnError) -> &'static str {
    match on_error {
        OnError::Fallback => "fallback",
        OnError::Allow => "allow",
        OnError::Deny => "deny",
    }
}
