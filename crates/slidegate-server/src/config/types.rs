//! The validated file, as plain types a program can also build in code, and
//! the defaults of the proxy's own settings. What the limiter is built from
//! ([`LimiterConfig`]: rules, identities, headers, the store guard) is
//! `slidegate-http`'s, held here as it is.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use http::Uri;
use slidegate::{Engine, Layout, RedisTarget};
use slidegate_http::config::{LimiterConfig, OnError, TimeSpan};

/// A validated configuration file.
///
/// `Config::parse` reads one from TOML; a program may also start from
/// [`Config::default`] and set the fields.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Config {
    /// `[server]`: where to listen, where to forward.
    pub server: ServerConfig,
    /// `[store]`: where limiter state lives and how to reach it.
    pub store: StoreConfig,
    /// `[identity]`, `[headers]`, `[[rules]]`, and `[store]`'s deadline,
    /// breaker, fallback and deny cache keys (its `guard`): what the limiter
    /// is built from.
    pub limiter: LimiterConfig,
    /// `[access_log]`: one JSON line per decision; `None` (no table): off.
    pub access_log: Option<AccessLogConfig>,
    /// `[envoy] config`: the descriptors Envoy's requests are matched to
    /// (their limits are rules of `limiter`, named `envoy/…`); empty without it.
    pub envoy: std::sync::Arc<crate::envoy::EnvoyConfig>,
}

/// `[access_log]`: where decisions are logged, one JSON object a line, and
/// which share of the allowed ones (denials are always logged).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct AccessLogConfig {
    /// The file appended to (created if missing), or standard output.
    pub path: AccessLogPath,
    /// The share of allowed requests logged, 0 to 1: every request whose
    /// running count of allowed requests crosses a multiple of
    /// `1 / sample_allowed` (exact counts, no randomness).
    pub sample_allowed: f64,
}

/// Where the access log goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessLogPath {
    /// `path = "-"`.
    Stdout,
    /// A file, opened for appending.
    File(PathBuf),
}

/// `[server] log_format`: how the process log (stderr) is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum LogFormat {
    /// One human-readable line per event (the default).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `[server] grpc_denial_status`: the gRPC status of a rate limit denial
/// of a gRPC call.
pub use slidegate_http::grpc::GrpcDenialStatus;

/// `[server]`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerConfig {
    /// The address `serve` listens on (port 0 picks a free port).
    pub listen: SocketAddr,
    /// The one upstream every non-admin request is forwarded to (`http://host:port` or `https://host:port`).
    pub upstream: Option<Uri>,
    /// The prefix of the admin endpoints (`{prefix}/v1/check`, `/metrics`, `/healthz`); empty by default.
    pub admin_prefix: String,
    /// A separate address for the admin endpoints; when set they are served
    /// only there, and the public listener forwards those paths upstream.
    pub admin_listen: Option<SocketAddr>,
    /// Where Envoy's rate limit service (gRPC, `ShouldRateLimit`) is
    /// served; `None`: nowhere. See docs/envoy.md.
    pub grpc_listen: Option<SocketAddr>,
    /// Where a proxy's forward-auth hook (nginx `auth_request`, Traefik
    /// `forwardAuth`, Caddy `forward_auth`) asks for decisions; `None`:
    /// nowhere. See docs/forward-auth.md.
    pub auth_listen: Option<SocketAddr>,
    /// How long a graceful shutdown waits for open connections.
    pub shutdown_grace: TimeSpan,
    /// How long after `SIGTERM` new connections are still accepted, with
    /// `/readyz` answering 503, so a load balancer can stop sending first.
    pub drain_delay: TimeSpan,
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
    pub body_timeout: TimeSpan,
    /// Open upstream connections (busy or idle), over all worker threads; a
    /// request needing one more waits up to [`ServerConfig::UPSTREAM_QUEUE_WAIT`]
    /// for one to close, then gets 503.
    pub max_upstream_connections: usize,
    /// The average rate, in bytes per second, below which a request body is
    /// abandoned with 408 once it has taken `body_rate_grace`; 0: no minimum.
    pub min_body_rate: u32,
    /// How long a request body may take before `min_body_rate` applies.
    pub body_rate_grace: TimeSpan,
    /// Requests one client (its address, as the limits group it) may have
    /// forwarded at once, waiting for or holding an upstream connection; one
    /// more gets 429. `None`: [`ServerConfig::upstream_connections_per_client`]'s default.
    pub max_upstream_connections_per_client: Option<usize>,
    /// How the process log is written (`log_format`): text or JSON lines.
    pub log_format: LogFormat,
    /// Whether `slidegate serve` re-reads its configuration file when it
    /// changes (`watch_config`), as on `SIGHUP`; off by default.
    pub watch_config: bool,
    /// How long a WebSocket tunnel may pass no byte either way before it
    /// is closed (`websocket_idle_timeout`), its upstream slot with it.
    pub websocket_idle_timeout: TimeSpan,
    /// The gRPC status a denied gRPC call gets (`grpc_denial_status`).
    pub grpc_denial_status: GrpcDenialStatus,
    /// TLS on the listener (`tls`): its certificate and key, re-read by a
    /// reload; `None`: cleartext (HTTP/1.1 and prior-knowledge HTTP/2).
    pub tls: Option<super::ListenerTls>,
    /// The CA (PEM) an `https://` upstream's certificate must chain to
    /// (`upstream_ca`); `None`: the system's roots.
    pub upstream_ca: Option<std::path::PathBuf>,
    /// Whether requests go to the upstream over HTTP/2 (`upstream_http2`,
    /// gRPC needs it); HTTP/1.1 by default.
    pub upstream_http2: bool,
    /// What one client HTTP/2 connection may ask for (`http2`).
    pub http2: super::Http2Limits,
    /// What bounds each listener's client connections (`connections`).
    pub connections: super::ListenerConnections,
}

impl Config {
    /// What `check-config` warns of and `serve` logs at start: settings
    /// that are valid but leave a door open ([`ServerConfig::warnings`]),
    /// or a listener that can only refuse.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = self.server.warnings();
        if let Some(addr) = self.server.auth_listen {
            if self.limiter.identity.trusted_proxies.is_empty() {
                warnings.push(format!(
                    "auth_listen {addr} is set and [identity] trusted_proxies is empty: every forward-auth request \
                     will be refused (403); list the proxies that ask it"
                ));
            }
        }
        warnings
    }
}

impl ServerConfig {
    /// The warnings of `[server]` alone: settings that
    /// are valid but leave a door open. The admin endpoints reload the
    /// configuration, set overrides and lift penalties; reachable beyond
    /// this host without a token, anyone who reaches them can.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if self.check_token.is_some() {
            return warnings;
        }
        const WHY: &str = "no token is set; anyone who reaches it can reload the configuration, set overrides and lift penalties: \
                           set check_token_env to require a bearer token";
        if let Some(addr) = self.admin_listen.filter(|a| !a.ip().is_loopback()) {
            warnings.push(format!("admin_listen {addr} is not a loopback address and {WHY}"));
        }
        if self.admin_on_public {
            warnings
                .push(format!("the admin endpoints are on the public listener (admin_on_public) and {WHY}"));
        }
        warnings
    }

    /// How long a request waits for an upstream slot when
    /// `max_upstream_connections` are busy, before it is answered 503.
    pub const UPSTREAM_QUEUE_WAIT: TimeSpan = TimeSpan::from_secs(1);

    /// The upstream connections one client may hold at once: as configured,
    /// or by default a sixteenth of `max_upstream_connections` (at least 1),
    /// so that fewer than sixteen clients cannot take the whole pool.
    pub fn upstream_connections_per_client(&self) -> usize {
        self.max_upstream_connections_per_client.unwrap_or(self.max_upstream_connections / 16).max(1)
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            upstream: None,
            admin_prefix: String::new(),
            admin_listen: None,
            grpc_listen: None,
            auth_listen: None,
            shutdown_grace: TimeSpan::from_secs(10),
            drain_delay: TimeSpan::from_secs(0),
            threads: None,
            admin_on_public: false,
            check_token: None,
            body_timeout: TimeSpan::from_secs(30),
            max_upstream_connections: 1024,
            min_body_rate: 500,
            body_rate_grace: TimeSpan::from_secs(10),
            max_upstream_connections_per_client: None,
            log_format: LogFormat::Text,
            watch_config: false,
            websocket_idle_timeout: TimeSpan::from_secs(300),
            grpc_denial_status: GrpcDenialStatus::ResourceExhausted,
            tls: None,
            upstream_ca: None,
            upstream_http2: false,
            http2: super::Http2Limits::default(),
            connections: super::ListenerConnections::default(),
        }
    }
}

/// `[store]`: which store, and how to reach it. The keys that say how the
/// limiter treats a failing store are [`LimiterConfig::guard`].
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct StoreConfig {
    /// Redis: one server (`url`), a Cluster (`cluster`) or a master found
    /// through Sentinel (`sentinel`, `master_name`); `None` for the embedded store.
    pub redis: Option<RedisTarget>,
    /// A prefix for every Redis key.
    pub prefix: Option<String>,
    /// What every rule does when the store fails, unless the rule says
    /// otherwise (each [`RuleConfig`](slidegate_http::config::RuleConfig)
    /// holds the outcome).
    pub on_error: OnError,
    /// The ACL user for the Redis data nodes (`username`), overriding a URL's.
    pub username: Option<String>,
    /// The password for the Redis data nodes, read from the variable `password_env` names.
    pub password: Option<Password>,
    /// A CA certificate (PEM) trusted for `rediss://` (`tls_ca`); `None`: the system roots.
    pub tls_ca: Option<PathBuf>,
    /// What decides inside Redis (`engine`): the native module where every
    /// node has it, else the Lua scripts (the default), or one of them forced.
    pub engine: Engine,
    /// How the state is laid out in Redis (`layout`, and for the packed
    /// layout `expected_identities`, which sizes its buckets).
    pub layout: Layout,
    /// The embedded store's snapshot (`snapshot`), if it keeps one.
    pub snapshot: Option<SnapshotConfig>,
}

/// `[store] snapshot`: where the embedded store's counters and penalty box
/// are kept across restarts, how often they are written, and what a start
/// does with a file it cannot read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SnapshotConfig {
    /// The file (`snapshot`), relative to the configuration's directory when relative.
    pub path: PathBuf,
    /// How often it is written while serving (`snapshot_interval`); it is
    /// also written at the end of a drain.
    pub interval: std::time::Duration,
    /// What a start does when the file is there but unusable (`snapshot_corrupt`).
    pub on_corrupt: OnCorruptSnapshot,
}

impl SnapshotConfig {
    /// `snapshot_interval`'s default: a crash loses at most this much.
    pub const DEFAULT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);
}

/// What `serve` does at start with a snapshot file it cannot use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnCorruptSnapshot {
    /// Log the error, move the file aside (`<file>.corrupt`) and start with
    /// an empty store, as without a file (`"start-empty"`, the default).
    #[default]
    StartEmpty,
    /// Exit with the error (`"refuse"`).
    Refuse,
}

impl StoreConfig {
    /// The store in one line for logs and `check-config`, without secrets:
    /// a password written in a URL shows as `***`, one from the environment
    /// by its variable's name.
    ///
    /// ```
    /// use slidegate::RedisTarget;
    /// use slidegate_server::StoreConfig;
    ///
    /// let mut store = StoreConfig::default();
    /// assert_eq!(store.describe(), "embedded");
    /// store.redis = Some(RedisTarget::Cluster(vec![
    ///     "redis://:hunter2@127.0.0.1:7000".into(),
    ///     "redis://127.0.0.1:7001".into(),
    /// ]));
    /// assert_eq!(store.describe(), "Redis Cluster redis://:***@127.0.0.1:7000, redis://127.0.0.1:7001");
    /// ```
    pub fn describe(&self) -> String {
        let list = |urls: &[String]| urls.iter().map(|u| redact_url(u)).collect::<Vec<_>>().join(", ");
        let mut out = match &self.redis {
            None => {
                return match &self.snapshot {
                    None => "embedded".to_owned(),
                    Some(s) => format!("embedded, snapshot {} every {:?}", s.path.display(), s.interval),
                }
            }
            Some(RedisTarget::Single(url)) => format!("Redis {}", redact_url(url)),
            Some(RedisTarget::Cluster(seeds)) => format!("Redis Cluster {}", list(seeds)),
            Some(RedisTarget::Sentinel { sentinels, master_name }) => {
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
        if self.engine != Engine::Auto {
            out.push_str(&format!(", engine {}", self.engine));
        }
        if self.layout != Layout::PerKey {
            out.push_str(&format!(", layout {}", self.layout));
        }
        out
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
