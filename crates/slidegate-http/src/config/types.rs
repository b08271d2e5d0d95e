//! The validated configuration, as plain types a program can also build in
//! code, and their defaults — the one place each default is written.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use http::{HeaderName, Method, Uri};
use ipnet::IpNet;
use serde::Deserialize;
use slidegate::{check_charge, Limit, StoreError};

use super::duration::Delay;
use crate::guard::StoreGuard;
use crate::identity::ForwardedHeader;
use crate::rules::PathPattern;

/// A validated configuration.
///
/// `Config::parse` reads one from TOML (feature `config`); without it, start
/// from [`Config::default`] and set the fields.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Config {
    /// `[server]`: where to listen, where to forward.
    pub server: ServerConfig,
    /// `[store]`: where limiter state lives and what to do when it fails.
    pub store: StoreConfig,
    /// `[identity]`: who a request is.
    pub identity: IdentityConfig,
    /// `[headers]`: which response headers to send.
    pub headers: HeadersConfig,
    /// `[[rules]]`, in file order; the first rule that matches a request decides it.
    pub rules: Vec<RuleConfig>,
}

/// `[server]`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerConfig {
    /// The address `serve` listens on (port 0 picks a free port).
    pub listen: SocketAddr,
    /// The one upstream every non-admin request is forwarded to (`http://host:port`).
    pub upstream: Option<Uri>,
    /// The prefix of the admin endpoints (`{prefix}/v1/check`, `/metrics`, `/healthz`); empty by default.
    pub admin_prefix: String,
    /// A separate address for the admin endpoints; when set they are served
    /// only there, and the public listener forwards those paths upstream.
    pub admin_listen: Option<SocketAddr>,
    /// How long a graceful shutdown waits for open connections.
    pub shutdown_grace: Delay,
    /// Worker threads, each with its own runtime and upstream pool; `None`: one per CPU.
    pub threads: Option<usize>,
    /// Whether the admin endpoints are served on the public listener (under
    /// `admin_prefix`). Off by default: without it or `admin_listen` no
    /// admin endpoint is served at all, and their paths are forwarded.
    pub admin_on_public: bool,
    /// The bearer token `/v1/check` requires (read from the variable
    /// `check_token_env` names); `None`: no token is asked for.
    pub check_token: Option<String>,
    /// How long a request body may stay silent before the request is
    /// abandoned with 408 and its upstream connection released.
    pub body_timeout: Delay,
    /// Open upstream connections (busy or idle), over all worker threads; a
    /// request needing one more waits up to [`ServerConfig::UPSTREAM_QUEUE_WAIT`]
    /// for one to close, then gets 503.
    pub max_upstream_connections: usize,
}

impl ServerConfig {
    /// How long a request waits for an upstream slot when
    /// `max_upstream_connections` are busy, before it is answered 503.
    pub const UPSTREAM_QUEUE_WAIT: Delay = Delay::from_secs(1);
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            upstream: None,
            admin_prefix: String::new(),
            admin_listen: None,
            shutdown_grace: Delay::from_secs(10),
            threads: None,
            admin_on_public: false,
            check_token: None,
            body_timeout: Delay::from_secs(30),
            max_upstream_connections: 1024,
        }
    }
}

/// What to do with a request when the store failed or timed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Fail open: let the request through (logged and counted).
    #[default]
    Allow,
    /// Fail closed: answer 503.
    Deny,
}

/// `[store]`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StoreConfig {
    /// A Redis URL; `None` for the embedded store.
    pub url: Option<String>,
    /// A prefix for every Redis key.
    pub prefix: Option<String>,
    /// The deadline of one store call.
    pub timeout: Delay,
    /// What every rule does when the store fails, unless the rule says otherwise.
    pub on_error: OnError,
    /// Consecutive failures that open the circuit breaker.
    pub breaker_failures: u32,
    /// How often an open breaker probes the store in the background.
    pub probe_interval: Delay,
    /// Whether an embedded fallback limiter applies the rules while the store
    /// is unavailable (TOML key `fallback`, formerly `insurance`).
    pub fallback: bool,
    /// The window over which the breaker measures the failure rate (`breaker_window_ms`).
    pub breaker_window: Delay,
    /// Calls the window must hold before its failure rate counts (`breaker_min_calls`).
    pub breaker_min_calls: u32,
    /// Percentage of failed calls that opens the breaker (`breaker_failure_rate`).
    pub breaker_failure_rate: u8,
    /// While open, one decision per interval tries the store (`breaker_trial_interval_ms`).
    pub breaker_trial_interval: Delay,
    /// Instances sharing the store; the fallback enforces `limit / instances` (`instances`).
    pub instances: u32,
    /// Seed nodes of a Redis Cluster (`cluster`); empty unless the store is a cluster.
    /// At most one of `url`, `cluster` and `sentinel` is set.
    pub cluster: Vec<String>,
    /// Sentinels that know where the master `master_name` is (`sentinel`);
    /// empty unless the store is found through Sentinel.
    pub sentinel: Vec<String>,
    /// The master the sentinels are asked for (`master_name`); set exactly when `sentinel` is.
    pub master_name: Option<String>,
    /// The ACL user for the Redis data nodes (`username`), overriding a URL's.
    pub username: Option<String>,
    /// The password for the Redis data nodes, read from the variable `password_env` names.
    pub password: Option<Password>,
    /// A CA certificate (PEM) trusted for `rediss://` (`tls_ca`); `None`: the system roots.
    pub tls_ca: Option<PathBuf>,
    /// Capacity of the exact local deny cache, in denied identities; 0 is off (`deny_cache`).
    pub deny_cache: usize,
    /// What decides inside Redis (`engine`): the native module where every
    /// node has it, else the Lua scripts (the default), or one of them forced.
    pub engine: RedisEngine,
}

/// What decides inside Redis: `engine = "auto" | "lua" | "module"` in
/// `[store]`, the store's `slidegate::Engine`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedisEngine {
    /// The native module `slidegate-redis-module` where Redis has it, else Lua.
    #[default]
    Auto,
    /// Always the Lua scripts.
    Lua,
    /// Always the native module: a Redis without it fails every decision
    /// (but those with a sliding log, which the scripts decide).
    Module,
}

impl RedisEngine {
    /// The engine named `name`: `auto`, `lua` or `module`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "auto" => Some(Self::Auto),
            "lua" => Some(Self::Lua),
            "module" => Some(Self::Module),
            _ => None,
        }
    }
}

#[cfg(feature = "redis")]
impl From<RedisEngine> for slidegate::Engine {
    fn from(engine: RedisEngine) -> Self {
        match engine {
            RedisEngine::Auto => slidegate::Engine::Auto,
            RedisEngine::Lua => slidegate::Engine::Lua,
            RedisEngine::Module => slidegate::Engine::Module,
        }
    }
}

/// A password taken from an environment variable: its `Debug` names the
/// variable, never the value, so a logged configuration holds no secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Password {
    variable: String,
    value: String,
}

impl Password {
    /// The password `value`, read from the environment variable `variable`.
    pub fn from_env(variable: impl Into<String>, value: impl Into<String>) -> Self {
        Self { variable: variable.into(), value: value.into() }
    }

    /// The variable it was read from.
    pub fn variable(&self) -> &str {
        &self.variable
    }

    /// The password itself, for logging in.
    pub fn expose(&self) -> &str {
        &self.value
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Password(from ${})", self.variable)
    }
}

/// Where the store's data lives, as `[store]` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreLocation<'a> {
    /// No Redis: the embedded store.
    Embedded,
    /// One Redis server (`url`).
    Single(&'a str),
    /// A Redis Cluster (`cluster`), by seed nodes.
    Cluster(&'a [String]),
    /// A master found through Sentinel (`sentinel`, `master_name`).
    Sentinel {
        /// The sentinels' URLs.
        sentinels: &'a [String],
        /// The master's name.
        master_name: &'a str,
    },
}

impl StoreConfig {
    /// How the limiter treats the store: deadline, breaker, fallback.
    pub fn guard(&self) -> StoreGuard {
        StoreGuard {
            timeout: self.timeout,
            breaker_failures: self.breaker_failures,
            probe_interval: self.probe_interval,
            fallback: self.fallback,
            breaker_window: self.breaker_window,
            breaker_min_calls: self.breaker_min_calls,
            breaker_failure_rate: self.breaker_failure_rate,
            breaker_trial_interval: self.breaker_trial_interval,
            instances: self.instances,
            deny_cache: self.deny_cache,
        }
    }
}

impl StoreConfig {
    /// Where the data lives: embedded, one Redis, a cluster or through Sentinel.
    pub fn location(&self) -> StoreLocation<'_> {
        if let Some(url) = &self.url {
            StoreLocation::Single(url)
        } else if !self.cluster.is_empty() {
            StoreLocation::Cluster(&self.cluster)
        } else if let (false, Some(master_name)) = (self.sentinel.is_empty(), &self.master_name) {
            StoreLocation::Sentinel { sentinels: &self.sentinel, master_name }
        } else {
            StoreLocation::Embedded
        }
    }

    /// The store in one line for logs and `check-config`, without secrets:
    /// a password written in a URL shows as `***`, one from the environment
    /// by its variable's name.
    ///
    /// ```
    /// use slidegate_http::config::StoreConfig;
    ///
    /// let mut store = StoreConfig::default();
    /// assert_eq!(store.describe(), "embedded");
    /// store.cluster = vec!["redis://:hunter2@127.0.0.1:7000".into(), "redis://127.0.0.1:7001".into()];
    /// assert_eq!(store.describe(), "Redis Cluster redis://:***@127.0.0.1:7000, redis://127.0.0.1:7001");
    /// ```
    pub fn describe(&self) -> String {
        let list = |urls: &[String]| urls.iter().map(|u| redact_url(u)).collect::<Vec<_>>().join(", ");
        let mut out = match self.location() {
            StoreLocation::Embedded => return "embedded".to_owned(),
            StoreLocation::Single(url) => format!("Redis {}", redact_url(url)),
            StoreLocation::Cluster(seeds) => format!("Redis Cluster {}", list(seeds)),
            StoreLocation::Sentinel { sentinels, master_name } => {
                format!("Redis master {master_name:?} through Sentinel {}", list(sentinels))
            }
        };
        if let Some(user) = &self.username {
            out.push_str(&format!(", user {user}"));
        }
        if let Some(password) = &self.password {
            out.push_str(&format!(", password from ${}", password.variable()));
        }
        if let Some(ca) = &self.tls_ca {
            out.push_str(&format!(", CA {}", ca.display()));
        }
        match self.engine {
            RedisEngine::Auto => {}
            RedisEngine::Lua => out.push_str(", engine lua"),
            RedisEngine::Module => out.push_str(", engine module"),
        }
        out
    }
}

/// `url` with the password of its user information replaced by `***`.
fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else { return url.to_owned() };
    let userinfo = &rest[..at];
    let user = match userinfo.split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        None => userinfo.to_owned(),
    };
    format!("{scheme}://{user}{}", &rest[at..])
}

impl Default for StoreConfig {
    fn default() -> Self {
        let guard = StoreGuard::default();
        Self {
            url: None,
            prefix: None,
            timeout: guard.timeout,
            on_error: OnError::default(),
            breaker_failures: guard.breaker_failures,
            probe_interval: guard.probe_interval,
            fallback: guard.fallback,
            breaker_window: guard.breaker_window,
            breaker_min_calls: guard.breaker_min_calls,
            breaker_failure_rate: guard.breaker_failure_rate,
            breaker_trial_interval: guard.breaker_trial_interval,
            instances: guard.instances,
            cluster: Vec::new(),
            sentinel: Vec::new(),
            master_name: None,
            username: None,
            password: None,
            tls_ca: None,
            deny_cache: guard.deny_cache,
            engine: RedisEngine::Auto,
        }
    }
}

/// `[identity]`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct IdentityConfig {
    /// The header carrying the API key, if clients send one.
    pub api_key_header: Option<HeaderName>,
    /// The secret keying the identity hashes; `None` draws a random one per process.
    pub secret: Option<Vec<u8>>,
    /// Peers whose forwarding header is believed.
    pub trusted_proxies: Vec<IpNet>,
    /// The one forwarding header trusted proxies write (`X-Forwarded-For` by default).
    pub forwarded_header: ForwardedHeader,
    /// IPv6 clients are grouped by this prefix length (64 by default: one
    /// identity per /64, the smallest network a host or home is given, so a
    /// client cannot take a fresh quota from each of its 2^64 addresses; 128:
    /// no grouping).
    pub ipv6_prefix: u8,
}

impl Default for IdentityConfig {
    fn default() -> Self {
        Self {
            api_key_header: None,
            secret: None,
            trusted_proxies: Vec::new(),
            forwarded_header: ForwardedHeader::default(),
            ipv6_prefix: 64,
        }
    }
}

/// `[headers]`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct HeadersConfig {
    /// Whether `X-RateLimit-Limit`, `-Remaining` and `-Reset` are sent besides the IETF headers.
    pub legacy: bool,
}

impl Default for HeadersConfig {
    fn default() -> Self {
        Self { legacy: true }
    }
}

/// Whose quota a rule's `limits` count against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdentityKind {
    /// The API key when the request carries one, the hashed client IP otherwise.
    #[default]
    ApiKey,
    /// The hashed client IP, always.
    Ip,
}

/// One `[[rules]]` entry.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RuleConfig {
    /// The rule's name: in metrics, policy names and `/v1/check`.
    pub name: String,
    /// The path pattern.
    pub path: PathPattern,
    /// The methods it applies to; empty: all.
    pub methods: Vec<Method>,
    /// Who is counted, and against which limits.
    pub limits: RuleLimits,
    /// What to do when the store fails, overriding `[store] on_error`.
    pub on_error: OnError,
    /// Decide, count and send headers, but never block.
    pub shadow: bool,
    /// The largest `cost` one `/v1/check` call may charge under this rule
    /// (and the most a `cost_header` may charge).
    pub max_cost: u64,
    /// How many distinct paths or parameter values an identity may touch per window.
    pub breadth: Option<crate::BreadthConfig>,
    /// Charge after the response: by status, or by a header's cost.
    pub response_cost: crate::ResponseCost,
    /// The penalty box: identities denied too often are blocked for a while.
    pub penalty: Option<slidegate::Penalty>,
}

impl RuleConfig {
    /// A rule named `name` for every method on `path`, failing open, not in shadow mode.
    ///
    /// ```
    /// use slidegate::{Algorithm, Limit, Quota};
    /// use slidegate_http::config::{IdentityKind, LimitConfig, RuleConfig, RuleLimits};
    ///
    /// let limit = Limit::new(Algorithm::SlidingWindowCounter, Quota::per_second(10)?);
    /// let rule = RuleConfig::new(
    ///     "search",
    ///     "/api/search*".parse()?,
    ///     RuleLimits::Shared { identity: IdentityKind::Ip, limits: vec![LimitConfig::new("search", limit, 1)?] },
    /// );
    /// assert_eq!(rule.name, "search");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(name: impl Into<String>, path: PathPattern, limits: RuleLimits) -> Self {
        Self {
            name: name.into(),
            path,
            methods: Vec::new(),
            limits,
            on_error: OnError::default(),
            shadow: false,
            max_cost: Self::DEFAULT_MAX_COST,
            breadth: None,
            response_cost: crate::ResponseCost::default(),
            penalty: None,
        }
    }

    /// `max_cost` unless the rule says otherwise: a `/v1/check` call charges
    /// what one proxied request charges, no more.
    pub const DEFAULT_MAX_COST: u64 = 1;
}

/// The limits of a rule, by identity.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum RuleLimits {
    /// One list for everybody, counted per `identity`.
    Shared {
        /// Whose quota.
        identity: IdentityKind,
        /// The limits, decided together.
        limits: Vec<LimitConfig>,
    },
    /// Separate lists for requests with an API key (counted per key) and
    /// without (counted per hashed IP).
    Split {
        /// For requests carrying an API key.
        authenticated: Vec<LimitConfig>,
        /// For the others.
        anonymous: Vec<LimitConfig>,
    },
}

/// One limit of a rule: a named policy in the `RateLimit-Policy` sense.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LimitConfig {
    /// The policy name in headers and problem bodies.
    pub name: String,
    /// The algorithm and quota.
    pub limit: Limit,
    /// Permits one request costs.
    pub cost: u64,
}

impl LimitConfig {
    /// Permits a request costs unless the limit says otherwise.
    pub const DEFAULT_COST: u64 = 1;

    /// The policy `name`: `limit`, each request costing `cost` permits.
    ///
    /// # Errors
    /// What [`slidegate::check_charge`] says of `(limit, cost)`: a cost above
    /// the limit, or a sliding log too large to keep.
    pub fn new(name: impl Into<String>, limit: Limit, cost: u64) -> Result<Self, StoreError> {
        check_charge(&limit, cost)?;
        Ok(Self { name: name.into(), limit, cost })
    }
}
