//! From the TOML mirror to a [`Config`]: every rule the types cannot express
//! (ranges, contradictions, duplicates, environment variables) is checked
//! here, and every error is located at the offending value.

use std::fmt;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::Path;
use std::str::FromStr;

use http::Uri;
use slidegate::{check_charge, Limit, Quota, QuotaError, StoreError};
use toml::Spanned;

use super::error::ConfigError;
use super::raw::{RawConfig, RawIdentity, RawLimit, RawPenalty, RawRule, RawServer, RawStore};
use super::types::{
    Config, HeadersConfig, IdentityConfig, IdentityKind, LimitConfig, OnError, Password, RedisEngine,
    RuleConfig, RuleLimits, ServerConfig, StoreConfig,
};
use super::values::{Cidr, MethodName};

impl Config {
    /// Reads and validates the configuration in `path`, reading the variables
    /// it names from the process environment.
    ///
    /// # Errors
    /// [`ConfigError::Read`] when the file cannot be read, [`ConfigError::Invalid`]
    /// with line and column for anything wrong inside it.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let bytes =
            std::fs::read(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        Self::parse(decode(path, &bytes)?, path)
    }

    /// Validates the configuration text `source`; `path` names it in errors.
    /// Environment variables named by the config (the hash secret) are read
    /// from the process environment now; [`Config::parse_with_env`] takes them
    /// from elsewhere.
    ///
    /// ```
    /// use slidegate_http::Config;
    ///
    /// let err = Config::parse("[server]\nlisten = \"127.0.0.1:8080\"\nlisten_on = 1\n", "demo.toml")
    ///     .unwrap_err();
    /// assert_eq!(err.location(), Some((3, 1)));
    /// assert!(err.to_string().starts_with("demo.toml:3:1: unknown field `listen_on`"));
    /// ```
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the line and column of the first problem.
    pub fn parse(source: &str, path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        Self::parse_with_env(source, path, &|name| std::env::var(name).ok())
    }

    /// [`Config::parse`] with the environment given: `env(name)` is the value
    /// of the variable `name`, or `None` when it is unset.
    ///
    /// ```
    /// use slidegate_http::Config;
    ///
    /// let source = "[identity]\nip_hash_secret_env = \"HASH_SECRET\"\n";
    /// let env = |name: &str| (name == "HASH_SECRET").then(|| "s3cret".to_owned());
    /// let config = Config::parse_with_env(source, "demo.toml", &env)?;
    /// assert_eq!(config.identity.secret.as_deref(), Some(&b"s3cret"[..]));
    /// # Ok::<(), slidegate_http::ConfigError>(())
    /// ```
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the line and column of the first problem.
    pub fn parse_with_env(
        source: &str,
        path: impl AsRef<Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let fail = |span: Option<Range<usize>>, message: String| ConfigError::at(path, source, span, message);
        let raw: RawConfig = toml::from_str(source).map_err(|e| fail(e.span(), e.message().to_owned()))?;
        Validator { fail: &fail, env }.config(raw)
    }
}

/// The text of a configuration file; invalid UTF-8 is located at its first
/// bad byte like any other error (a plain read would say only "invalid data").
pub(super) fn decode<'b>(path: &Path, bytes: &'b [u8]) -> Result<&'b str, ConfigError> {
    std::str::from_utf8(bytes).map_err(|e| {
        let valid = e.valid_up_to();
        // The prefix before the bad byte is valid UTF-8 by definition.
        let before = std::str::from_utf8(&bytes[..valid]).unwrap_or_default();
        ConfigError::at(
            path,
            before,
            Some(valid..valid),
            format!("invalid UTF-8 (byte 0x{:02x}): expected a UTF-8 text file", bytes[valid]),
        )
    })
}

/// The `[store]` keys that say which Redis and how to log in, validated.
struct RedisDeployment {
    cluster: Vec<String>,
    sentinel: Vec<String>,
    master_name: Option<String>,
    username: Option<String>,
    password: Option<Password>,
    tls_ca: Option<std::path::PathBuf>,
    engine: RedisEngine,
}

struct Validator<'a> {
    fail: &'a dyn Fn(Option<Range<usize>>, String) -> ConfigError,
    env: &'a dyn Fn(&str) -> Option<String>,
}

impl Validator<'_> {
    fn err(&self, span: Range<usize>, message: impl Into<String>) -> ConfigError {
        (self.fail)(Some(span), message.into())
    }

    /// Parses each string of an array, reporting an error at the element.
    fn each<T>(&self, values: Vec<Spanned<String>>) -> Result<Vec<T>, ConfigError>
    where
        T: FromStr,
        T::Err: fmt::Display,
    {
        values
            .into_iter()
            .map(|v| v.get_ref().parse().map_err(|e: T::Err| self.err(v.span(), e.to_string())))
            .collect()
    }

    fn config(&self, raw: RawConfig) -> Result<Config, ConfigError> {
        let server = self.server(raw.server)?;
        // Any Redis store is shared by the instances pointed at it.
        let url_span = (raw.store.url.as_ref().map(Spanned::span))
            .or_else(|| raw.store.cluster.as_ref().map(Spanned::span))
            .or_else(|| raw.store.sentinel.as_ref().map(Spanned::span));
        let store = self.store(raw.store)?;
        let identity = self.identity(raw.identity)?;
        if let (Some(span), None) = (url_span, &identity.secret) {
            // Each instance would draw its own random secret: one client gets
            // a different key on each, and N instances admit N times the limit.
            return Err(self.err(
                span,
                "a shared store needs [identity] ip_hash_secret_env: without it each instance draws \
                 its own random hash secret, a client is counted under a different key on each, and \
                 instances sharing this store together admit a multiple of every limit",
            ));
        }
        let mut rules: Vec<RuleConfig> = Vec::with_capacity(raw.rules.len());
        for rule in raw.rules {
            let name_span = rule.get_ref().name.span();
            let rule = self.rule(rule, store.on_error)?;
            if rules.iter().any(|r| r.name == rule.name) {
                return Err(self.err(
                    name_span,
                    format!("duplicate rule name {:?}: rule names must be unique", rule.name),
                ));
            }
            rules.push(rule);
        }
        let headers = HeadersConfig { legacy: raw.headers.legacy.unwrap_or(HeadersConfig::default().legacy) };
        Ok(Config { server, store, identity, headers, rules })
    }

    fn server(&self, raw: RawServer) -> Result<ServerConfig, ConfigError> {
        let default = ServerConfig::default();
        let upstream = match raw.upstream {
            None => None,
            Some(u) => {
                let uri: Uri = u.get_ref().parse().map_err(|_| {
                    self.err(
                        u.span(),
                        format!("invalid upstream {:?}: expected http://host:port", u.get_ref()),
                    )
                })?;
                if uri.scheme_str() != Some("http") || uri.authority().is_none() {
                    return Err(self.err(
                        u.span(),
                        format!(
                            "invalid upstream {:?}: expected http://host:port (https is not supported)",
                            u.get_ref()
                        ),
                    ));
                }
                if let Some(authority) = uri.authority() {
                    if authority.as_str().contains('@') {
                        // hyper would drop them silently: the upstream never sees them.
                        return Err(self.err(
                            u.span(),
                            format!(
                                "invalid upstream {:?}: credentials in the URL are not sent; expected http://host:port",
                                u.get_ref()
                            ),
                        ));
                    }
                    // `http` reads a port that does not fit in 16 bits as no port at all.
                    let port =
                        authority.as_str().get(authority.host().len()..).and_then(|r| r.strip_prefix(':'));
                    if port.is_some_and(|p| !matches!(p.parse::<u16>(), Ok(1..))) {
                        // Otherwise the port is read as absent and 80 is used.
                        return Err(self.err(
                            u.span(),
                            format!("invalid upstream {:?}: the port must be 1 to 65535", u.get_ref()),
                        ));
                    }
                }
                if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
                    return Err(self.err(
                        u.span(),
                        format!(
                            "invalid upstream {:?}: expected no path, only http://host:port",
                            u.get_ref()
                        ),
                    ));
                }
                Some(uri)
            }
        };
        let admin_prefix = match raw.admin_prefix {
            None => default.admin_prefix,
            Some(p) => {
                let text = p.get_ref().trim_end_matches('/');
                if !text.is_empty() && (!text.starts_with('/') || text.contains(['?', '#', '*', '{'])) {
                    return Err(self.err(
                        p.span(),
                        format!(
                            "invalid admin_prefix {:?}: expected a path such as \"/_slidegate\"",
                            p.get_ref()
                        ),
                    ));
                }
                text.to_owned()
            }
        };
        let listen: SocketAddr = raw.listen.map_or(default.listen, |p| p.0);
        let admin_listen = match raw.admin_listen {
            None => None,
            Some(a) if a.get_ref().0 == listen && listen.port() != 0 => {
                return Err(self.err(
                    a.span(),
                    format!(
                        "admin_listen {} is the listen address: expected another address, such as \"127.0.0.1:9091\"",
                        a.get_ref().0
                    ),
                ))
            }
            Some(a) => Some(a.into_inner().0),
        };
        let admin_on_public =
            match raw.admin_on_public {
                Some(on) if *on.get_ref() && admin_listen.is_some() => return Err(self.err(
                    on.span(),
                    "admin_on_public and admin_listen both set: expected one place for the admin endpoints",
                )),
                Some(on) => *on.get_ref(),
                None => default.admin_on_public,
            };
        let check_token = match raw.check_token_env {
            None => default.check_token,
            Some(var) => match (self.env)(var.get_ref()) {
                Some(value) if !value.is_empty() => Some(value),
                _ => {
                    return Err(self.err(
                        var.span(),
                        format!(
                            "environment variable {} is not set: check_token_env names the variable holding \
                             the bearer token /v1/check requires",
                            var.get_ref()
                        ),
                    ))
                }
            },
        };
        let body_timeout = match raw.body_timeout {
            Some(t) if t.get_ref().0.get().is_zero() => {
                return Err(self.err(
                    t.span(),
                    "body_timeout must be longer than 0: expected a duration such as \"30s\"",
                ))
            }
            Some(t) => t.into_inner().0,
            None => default.body_timeout,
        };
        let max_upstream_connections = match raw.max_upstream_connections {
            Some(m) if *m.get_ref() == 0 => {
                return Err(self.err(m.span(), "max_upstream_connections must be at least 1"))
            }
            Some(m) => usize::try_from(*m.get_ref()).unwrap_or(usize::MAX),
            None => default.max_upstream_connections,
        };
        Ok(ServerConfig {
            listen,
            upstream,
            admin_prefix,
            admin_listen,
            shutdown_grace: raw.shutdown_grace.map_or(default.shutdown_grace, |g| g.0),
            threads: match raw.threads {
                Some(t) if *t.get_ref() == 0 => return Err(self.err(t.span(), "threads must be at least 1")),
                Some(t) => Some(usize::from(*t.get_ref())),
                None => default.threads,
            },
            admin_on_public,
            check_token,
            body_timeout,
            max_upstream_connections,
        })
    }

    fn store(&self, mut raw: RawStore) -> Result<StoreConfig, ConfigError> {
        let default = StoreConfig::default();
        if let Some(url) = &raw.url {
            let u = url.get_ref();
            if !(u.starts_with("redis://") || u.starts_with("rediss://") || u.starts_with("redis+unix://")) {
                return Err(
                    self.err(url.span(), format!("invalid store url {u:?}: expected redis://host:port"))
                );
            }
        }
        if let Some(prefix) = &raw.prefix {
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
        }
        let redis = self.redis_deployment(&mut raw)?;
        let timeout = match raw.timeout_ms {
            Some(t) if t.delay.get().is_zero() => {
                return Err(self.err(t.span, "timeout_ms must be at least 1"))
            }
            Some(t) => t.delay,
            None => default.timeout,
        };
        let breaker_failures = match raw.breaker_failures {
            Some(b) if *b.get_ref() == 0 => {
                return Err(self.err(b.span(), "breaker_failures must be at least 1"))
            }
            Some(b) => *b.get_ref(),
            None => default.breaker_failures,
        };
        let probe_interval = match raw.probe_interval_ms {
            Some(p) if p.delay.get().is_zero() => {
                return Err(self.err(p.span, "probe_interval_ms must be at least 1"))
            }
            Some(p) => p.delay,
            None => default.probe_interval,
        };
        let breaker_window = match raw.breaker_window_ms {
            Some(w) if w.delay.get() < std::time::Duration::from_millis(10) => {
                return Err(self.err(w.span, "breaker_window_ms must be at least 10"))
            }
            Some(w) => w.delay,
            None => default.breaker_window,
        };
        let breaker_min_calls = match raw.breaker_min_calls {
            Some(m) if *m.get_ref() == 0 => {
                return Err(self.err(m.span(), "breaker_min_calls must be at least 1"))
            }
            Some(m) => *m.get_ref(),
            None => default.breaker_min_calls,
        };
        let breaker_failure_rate = match raw.breaker_failure_rate {
            Some(r) if !(1..=100).contains(r.get_ref()) => {
                return Err(self.err(
                    r.span(),
                    format!("breaker_failure_rate is a percentage from 1 to 100, got {}", r.get_ref()),
                ))
            }
            Some(r) => *r.get_ref(),
            None => default.breaker_failure_rate,
        };
        let breaker_trial_interval = match raw.breaker_trial_interval_ms {
            Some(t) if t.delay.get().is_zero() => {
                return Err(self.err(t.span, "breaker_trial_interval_ms must be at least 1"))
            }
            Some(t) => t.delay,
            None => default.breaker_trial_interval,
        };
        let instances = match raw.instances {
            Some(n) if *n.get_ref() == 0 => return Err(self.err(n.span(), "instances must be at least 1")),
            Some(n) => *n.get_ref(),
            None => default.instances,
        };
        Ok(StoreConfig {
            url: raw.url.map(Spanned::into_inner),
            prefix: raw.prefix.map(Spanned::into_inner),
            timeout,
            on_error: raw.on_error.unwrap_or(default.on_error),
            breaker_failures,
            probe_interval,
            fallback: raw.fallback.unwrap_or(default.fallback),
            breaker_window,
            breaker_min_calls,
            breaker_failure_rate,
            breaker_trial_interval,
            instances,
            cluster: redis.cluster,
            sentinel: redis.sentinel,
            master_name: redis.master_name,
            username: redis.username,
            password: redis.password,
            tls_ca: redis.tls_ca,
            engine: redis.engine,
            // A u32 in the file: at most 4 Gi slots, which fits every usize we build for.
            deny_cache: raw.deny_cache.map_or(default.deny_cache, |n| *n.get_ref() as usize),
        })
    }

    /// `cluster`, `sentinel` and `master_name`, the credentials and the CA:
    /// checked against each other and against `url`, and taken out of `raw`.
    fn redis_deployment(&self, raw: &mut RawStore) -> Result<RedisDeployment, ConfigError> {
        // One deployment: the second key named is the one reported.
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
            None => Vec::new(),
            Some(list) => {
                self.redis_urls("cluster", list, "[\"redis://127.0.0.1:7000\", \"redis://127.0.0.1:7001\"]")?
            }
        };
        let (sentinel, master_name) = match (raw.sentinel.take(), raw.master_name.take()) {
            (None, None) => (Vec::new(), None),
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
                let urls = self.redis_urls("sentinel", list, "[\"redis://127.0.0.1:26379\"]")?;
                (urls, Some(name.into_inner()))
            }
        };
        let has_redis = !named.is_empty();
        let needs_redis = |key: &str, span: Range<usize>| {
            self.err(
                span,
                format!("{key} applies to a Redis store: expected `url`, `cluster` or `sentinel` in [store]"),
            )
        };
        let username = match raw.username.take() {
            None => None,
            Some(u) if !has_redis => return Err(needs_redis("username", u.span())),
            Some(u) if u.get_ref().is_empty() => return Err(self.err(u.span(), "username must not be empty")),
            Some(u) => Some(u.into_inner()),
        };
        let password = match raw.password_env.take() {
            None => None,
            Some(var) if !has_redis => return Err(needs_redis("password_env", var.span())),
            Some(var) => match (self.env)(var.get_ref()) {
                Some(value) if !value.is_empty() => Some(Password::from_env(var.get_ref().clone(), value)),
                _ => {
                    return Err(self.err(
                        var.span(),
                        format!(
                            "environment variable {} is not set: password_env names the variable holding \
                             the Redis password (so the file holds no secret)",
                            var.get_ref()
                        ),
                    ))
                }
            },
        };
        let tls_ca = match raw.tls_ca.take() {
            None => None,
            Some(ca) if !has_redis => return Err(needs_redis("tls_ca", ca.span())),
            Some(ca) => {
                let tls = |u: &String| u.starts_with("rediss://");
                let plain = raw.url.as_ref().is_some_and(|u| !tls(u.get_ref()))
                    || (!cluster.is_empty() && !cluster.iter().all(tls));
                if plain {
                    return Err(self.err(
                        ca.span(),
                        "tls_ca is the CA trusted for TLS, but the store URLs are not rediss://: \
                         expected rediss://host:port URLs with tls_ca",
                    ));
                }
                let path = std::path::PathBuf::from(ca.get_ref());
                if let Err(e) = std::fs::metadata(&path) {
                    return Err(self.err(
                        ca.span(),
                        format!(
                            "cannot read tls_ca {}: {e}: expected a PEM CA certificate file",
                            path.display()
                        ),
                    ));
                }
                Some(path)
            }
        };
        let engine = match raw.engine.take() {
            None => RedisEngine::Auto,
            Some(e) if !has_redis => return Err(needs_redis("engine", e.span())),
            Some(e) => RedisEngine::from_name(e.get_ref()).ok_or_else(|| {
                self.err(
                    e.span(),
                    format!(
                        "unknown engine {:?}: expected \"auto\" (the native module where Redis has it, else \
                         Lua), \"lua\" or \"module\"",
                        e.get_ref()
                    ),
                )
            })?,
        };
        Ok(RedisDeployment { cluster, sentinel, master_name, username, password, tls_ca, engine })
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

    fn identity(&self, raw: RawIdentity) -> Result<IdentityConfig, ConfigError> {
        let default = IdentityConfig::default();
        let secret = match raw.ip_hash_secret_env {
            None => default.secret,
            Some(var) => match (self.env)(var.get_ref()) {
                Some(value) if !value.is_empty() => Some(value.into_bytes()),
                _ => {
                    return Err(self.err(
                        var.span(),
                        format!(
                        "environment variable {} is not set: ip_hash_secret_env names the variable holding \
                             the identity hash secret (every instance sharing a store needs the same one)",
                        var.get_ref()
                    ),
                    ))
                }
            },
        };
        let prefix = match raw.ipv6_prefix {
            Some(p) if !(1..=128).contains(p.get_ref()) => {
                return Err(self.err(p.span(), format!("ipv6_prefix must be 1 to 128, got {}", p.get_ref())))
            }
            Some(p) => *p.get_ref(),
            None => default.ipv6_prefix,
        };
        Ok(IdentityConfig {
            api_key_header: raw.api_key_header.map(|h| h.0),
            secret,
            trusted_proxies: self.each::<Cidr>(raw.trusted_proxies)?.into_iter().map(|c| c.0).collect(),
            forwarded_header: raw.forwarded_header.map_or(default.forwarded_header, |h| h.0),
            ipv6_prefix: prefix,
        })
    }

    fn rule(&self, spanned: Spanned<RawRule>, store_on_error: OnError) -> Result<RuleConfig, ConfigError> {
        let rule_span = spanned.span();
        let raw = spanned.into_inner();
        let name = raw.name.get_ref().clone();
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            return Err(self.err(
                raw.name.span(),
                format!("invalid rule name {name:?}: expected letters, digits, '-', '_' or '.'"),
            ));
        }
        let limits = match (raw.limits, raw.authenticated, raw.anonymous) {
            (Some(limits), None, None) => RuleLimits::Shared {
                identity: raw.identity.map_or(IdentityKind::default(), |i| *i.get_ref()),
                limits: self.limits(&name, limits)?,
            },
            (None, Some(auth), Some(anon)) => {
                if let Some(identity) = raw.identity {
                    return Err(self.err(
                        identity.span(),
                        "identity applies to `limits` only: `authenticated` limits count per API key and \
                         `anonymous` limits per client IP",
                    ));
                }
                RuleLimits::Split { authenticated: self.limits(&name, auth)?, anonymous: self.limits(&name, anon)? }
            }
            (Some(limits), _, _) => {
                return Err(self.err(
                    limits.span(),
                    format!(
                        "rule {name:?} has both `limits` and `authenticated`/`anonymous`: expected either \
                         `limits` or both `authenticated` and `anonymous`"
                    ),
                ))
            }
            (None, Some(one), None) | (None, None, Some(one)) => {
                return Err(self.err(
                    one.span(),
                    format!("rule {name:?} needs both `authenticated` and `anonymous` limits, or `limits` alone"),
                ))
            }
            (None, None, None) => {
                return Err(self.err(
                    rule_span,
                    format!("rule {name:?} has no limits: expected `limits = [{{ limit = 10, window = \"1s\" }}]` or `authenticated` and `anonymous` lists"),
                ))
            }
        };
        let breadth = match raw.breadth {
            Some(b) => Some(self.breadth(b.into_inner(), &raw.path.0.to_string())?),
            None => None,
        };
        let mut count_status = Vec::new();
        for status in raw.count_status.map(Spanned::into_inner).unwrap_or_default() {
            if !(100..=599).contains(status.get_ref()) {
                return Err(self.err(status.span(), "count_status: expected HTTP statuses from 100 to 599"));
            }
            count_status.push(*status.get_ref());
        }
        let cost_header = match raw.cost_header {
            Some(h) => Some(http::HeaderName::from_bytes(h.get_ref().as_bytes()).map_err(|_| {
                self.err(h.span(), format!("invalid cost_header {:?}: expected a header name", h.get_ref()))
            })?),
            None => None,
        };
        Ok(RuleConfig {
            breadth,
            response_cost: crate::ResponseCost { count_status, cost_header },
            name,
            path: raw.path.0.case_sensitive(raw.case_sensitive),
            methods: self.each::<MethodName>(raw.methods)?.into_iter().map(|m| m.0).collect(),
            limits,
            on_error: raw.on_error.unwrap_or(store_on_error),
            shadow: raw.shadow,
            max_cost: match raw.max_cost {
                Some(m) if *m.get_ref() == 0 => return Err(self.err(m.span(), "max_cost must be at least 1")),
                Some(m) => *m.get_ref(),
                None => RuleConfig::DEFAULT_MAX_COST,
            },
            penalty: match raw.penalty {
                Some(p) => Some(self.penalty(p)?),
                None => None,
            },
        })
    }

    fn breadth(
        &self,
        raw: super::raw::RawBreadth,
        pattern: &str,
    ) -> Result<crate::BreadthConfig, ConfigError> {
        let quota = Quota::new(*raw.distinct.get_ref(), raw.window.duration).map_err(|e| {
            let at = if matches!(e, QuotaError::ZeroLimit) {
                raw.distinct.span()
            } else {
                raw.window.span.clone()
            };
            self.err(at, format!("invalid breadth: {e}"))
        })?;
        let of = match &raw.of {
            Some(of) => crate::BreadthOf::parse(of.get_ref(), pattern)
                .map_err(|e| self.err(of.span(), format!("invalid breadth `of`: {e}")))?,
            None => crate::BreadthOf::Path,
        };
        Ok(crate::BreadthConfig { quota, of })
    }

    fn penalty(&self, spanned: Spanned<RawPenalty>) -> Result<slidegate::Penalty, ConfigError> {
        let span = spanned.span();
        let raw = spanned.into_inner();
        let block = raw.block.0.get();
        // Without a cap, repeat offenders double up to a day (or the first block, if longer).
        let max_block =
            raw.max_block.map_or(block.max(std::time::Duration::from_secs(86_400)), |m| m.0.get());
        slidegate::Penalty::new(raw.after, raw.within.0.get(), block, max_block)
            .map_err(|e| self.err(span, format!("invalid penalty: {e}")))
    }

    fn limits(
        &self,
        rule: &str,
        list: Spanned<Vec<Spanned<RawLimit>>>,
    ) -> Result<Vec<LimitConfig>, ConfigError> {
        let list_span = list.span();
        let list = list.into_inner();
        if list.is_empty() {
            return Err(self.err(
                list_span,
                format!("rule {rule:?} has an empty limit list: expected at least one limit"),
            ));
        }
        let single = list.len() == 1;
        let mut out: Vec<LimitConfig> = Vec::with_capacity(list.len());
        for spanned in list {
            let span = spanned.span();
            let raw = spanned.into_inner();
            let quota = Quota::new(*raw.limit.get_ref(), raw.window.duration).map_err(|e| {
                let at = if matches!(e, QuotaError::ZeroLimit) {
                    raw.limit.span()
                } else {
                    raw.window.span.clone()
                };
                self.err(at, format!("invalid limit: {e}"))
            })?;
            let limit = Limit::new(raw.algorithm.0 .0, quota);
            let (cost, cost_span) = match &raw.cost {
                Some(c) => (*c.get_ref(), c.span()),
                None => (LimitConfig::DEFAULT_COST, raw.limit.span()),
            };
            if cost == 0 {
                return Err(self.err(cost_span, "cost must be at least 1, got 0"));
            }
            // The one check the stores make too: reported where it went wrong.
            if let Err(e) = check_charge(&limit, cost) {
                let at = match e {
                    StoreError::CostExceedsLimit { .. } => cost_span,
                    _ => raw.limit.span(),
                };
                return Err(self.err(at, format!("invalid limit: {e}")));
            }
            let name = match &raw.name {
                Some(n) => n.get_ref().clone(),
                None if single => rule.to_owned(),
                None => format!("{rule}-{}", raw.window.text),
            };
            if name.is_empty()
                || name.contains(['"', '\\'])
                || !name.bytes().all(|b| (0x20..=0x7e).contains(&b))
            {
                let at = raw.name.as_ref().map_or(span.clone(), Spanned::span);
                return Err(self.err(
                    at,
                    format!("invalid policy name {name:?}: expected printable ASCII without quotes"),
                ));
            }
            if let Some(dup) = out.iter().find(|l| l.name == name || l.limit == limit) {
                let what = if dup.limit == limit { "the same limit twice" } else { "two limits named alike" };
                return Err(self.err(
                    span,
                    format!("rule {rule:?} has {what} ({name:?}): give each limit its own `name` and window"),
                ));
            }
            out.push(LimitConfig { name, limit, cost });
        }
        Ok(out)
    }
}
