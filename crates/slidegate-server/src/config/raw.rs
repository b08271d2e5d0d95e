//! The TOML file as written: a serde mirror of [`Config`](super::Config) that
//! keeps every value's position for errors. A key left out is `None` here;
//! validation fills in the default from the typed configuration.

use std::net::SocketAddr;

use http::HeaderName;
use serde::Deserialize;
use slidegate_http::config::{IdentityKind, OnError, TimeSpan};
use slidegate_http::{ForwardedHeader, PathPattern};
use toml::Spanned;

use super::values::{AlgorithmName, Millis, Parsed, WindowValue};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    /// Spanned: a missing `upstream` is reported at the table.
    pub(super) server: Option<Spanned<RawServer>>,
    #[serde(default)]
    pub(super) store: RawStore,
    #[serde(default)]
    pub(super) identity: RawIdentity,
    #[serde(default)]
    pub(super) headers: RawHeaders,
    #[serde(default)]
    pub(super) rules: Vec<Spanned<RawRule>>,
    pub(super) access_log: Option<Spanned<RawAccessLog>>,
    #[serde(default)]
    pub(super) lists: RawLists,
    #[serde(default)]
    pub(super) plans: Vec<Spanned<RawPlan>>,
    /// `[envoy]`: the rate limit service's descriptors (`grpc_listen`).
    pub(super) envoy: Option<RawEnvoy>,
}

/// `[envoy] config = "ratelimit.yaml"`: envoyproxy/ratelimit's YAML, a
/// file or a directory of them, relative to this file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEnvoy {
    pub(super) config: Spanned<String>,
    /// `"apply"` (the default) or `"ignore"`: the descriptor `limit` Envoy may send.
    pub(super) limit_overrides: Option<Spanned<String>>,
}

/// `[[plans]] name = "pro"` with `limits.<rule> = [ … ]`: the limits that
/// replace each named rule's own for the keys on the plan.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPlan {
    pub(super) name: Spanned<String>,
    #[serde(default)]
    pub(super) limits: std::collections::BTreeMap<Spanned<String>, Spanned<Vec<Spanned<RawLimit>>>>,
}

/// `[lists]`: the global allow and deny lists.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLists {
    pub(super) allow: Option<RawClientList>,
    pub(super) deny: Option<RawClientList>,
}

/// `allow = { cidrs = ["10.0.0.0/8"], keys_file = "partners.txt" }`, and `deny`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClientList {
    #[serde(default)]
    pub(super) cidrs: Vec<Spanned<String>>,
    pub(super) keys_file: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAccessLog {
    pub(super) path: Option<Spanned<String>>,
    pub(super) sample_allowed: Option<Spanned<f64>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServer {
    pub(super) listen: Option<Parsed<SocketAddr>>,
    pub(super) upstream: Option<Spanned<String>>,
    pub(super) admin_prefix: Option<Spanned<String>>,
    pub(super) admin_listen: Option<Spanned<Parsed<SocketAddr>>>,
    /// The Envoy rate limit service's gRPC listener.
    pub(super) grpc_listen: Option<Spanned<Parsed<SocketAddr>>>,
    /// The forward-auth listener (a proxy's auth hook).
    pub(super) auth_listen: Option<Spanned<Parsed<SocketAddr>>>,
    pub(super) shutdown_grace: Option<Parsed<TimeSpan>>,
    pub(super) drain_delay: Option<Spanned<Parsed<TimeSpan>>>,
    pub(super) threads: Option<Spanned<u16>>,
    pub(super) admin_on_public: Option<Spanned<bool>>,
    pub(super) check_token_env: Option<Spanned<String>>,
    pub(super) body_timeout: Option<Spanned<Parsed<TimeSpan>>>,
    pub(super) max_upstream_connections: Option<Spanned<u32>>,
    pub(super) min_body_rate: Option<Spanned<u32>>,
    pub(super) body_rate_grace: Option<Spanned<Parsed<TimeSpan>>>,
    pub(super) max_upstream_connections_per_client: Option<Spanned<u32>>,
    pub(super) log_format: Option<Spanned<String>>,
    pub(super) watch_config: Option<bool>,
    /// The limiter's cap on requests held by rules' `delay` (`LimiterConfig::max_delayed`).
    pub(super) max_delayed: Option<Spanned<u32>>,
    pub(super) websocket_idle_timeout: Option<Spanned<Parsed<TimeSpan>>>,
    pub(super) grpc_denial_status: Option<Spanned<String>>,
    // Protocols: TLS on the listener, https:// upstreams, HTTP/2.
    pub(super) tls: Option<Spanned<RawTls>>,
    pub(super) upstream_ca: Option<Spanned<String>>,
    pub(super) upstream_http2: Option<Spanned<bool>>,
    pub(super) http2: Option<Spanned<RawHttp2>>,
    /// `connections.<listener> = { max, header_timeout, idle_timeout }`.
    pub(super) connections: Option<Spanned<RawConnections>>,
}

/// `connections = { public = { ... }, admin = { ... }, auth = { ... }, grpc = { ... } }`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConnections {
    pub(super) public: Option<Spanned<RawConnectionLimits>>,
    pub(super) admin: Option<Spanned<RawConnectionLimits>>,
    pub(super) auth: Option<Spanned<RawConnectionLimits>>,
    pub(super) grpc: Option<Spanned<RawConnectionLimits>>,
}

/// `{ max = 10000, header_timeout = "30s", idle_timeout = "60s" }`. `max`
/// is read signed, so a negative count is refused with the range expected.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConnectionLimits {
    pub(super) max: Option<Spanned<i64>>,
    pub(super) header_timeout: Option<Spanned<Parsed<TimeSpan>>>,
    pub(super) idle_timeout: Option<Spanned<Parsed<TimeSpan>>>,
}

/// `tls = { cert = "server.crt", key = "server.key" }`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    pub(super) cert: Spanned<String>,
    pub(super) key: Spanned<String>,
}

/// `http2 = { max_concurrent_streams = 100, max_header_list_size = 32768, ... }`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHttp2 {
    pub(super) max_concurrent_streams: Option<Spanned<u32>>,
    pub(super) max_header_list_size: Option<Spanned<u32>>,
    pub(super) max_pending_reset_streams: Option<Spanned<u32>>,
    pub(super) max_local_error_resets: Option<Spanned<u32>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStore {
    pub(super) url: Option<Spanned<String>>,
    pub(super) prefix: Option<Spanned<String>>,
    pub(super) timeout_ms: Option<Millis>,
    pub(super) on_error: Option<OnError>,
    pub(super) breaker_failures: Option<Spanned<u32>>,
    pub(super) probe_interval_ms: Option<Millis>,
    /// Replaced by `on_error = "fallback"`; read (also as `insurance`) so
    /// that an old file loads where its meaning is the same, or gets a
    /// located error saying what to write.
    #[serde(alias = "insurance")]
    pub(super) fallback: Option<Spanned<bool>>,
    pub(super) breaker_window_ms: Option<Millis>,
    pub(super) breaker_min_calls: Option<Spanned<u32>>,
    pub(super) breaker_failure_rate: Option<Spanned<u8>>,
    pub(super) breaker_trial_interval_ms: Option<Millis>,
    pub(super) instances: Option<Spanned<u32>>,
    // Where Redis is besides `url`, and how to log in to it.
    pub(super) cluster: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) sentinel: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) master_name: Option<Spanned<String>>,
    pub(super) username: Option<Spanned<String>>,
    pub(super) password_env: Option<Spanned<String>>,
    pub(super) tls_ca: Option<Spanned<String>>,
    pub(super) deny_cache: Option<Spanned<u32>>,
    pub(super) engine: Option<Spanned<String>>,
    pub(super) layout: Option<Spanned<String>>,
    pub(super) expected_identities: Option<Spanned<u64>>,
    /// Quota leases: `lease = { max = 64, horizon = "50ms" }`.
    pub(super) lease: Option<Spanned<RawLease>>,
    /// The embedded store's snapshot file, how often it is written, and
    /// what a start does with one it cannot read.
    pub(super) snapshot: Option<Spanned<String>>,
    pub(super) snapshot_interval: Option<WindowValue>,
    pub(super) snapshot_corrupt: Option<Spanned<String>>,
}

/// `[store] lease`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLease {
    pub(super) max: Spanned<u64>,
    pub(super) horizon: Option<WindowValue>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawIdentity {
    pub(super) api_key_header: Option<Parsed<HeaderName>>,
    pub(super) ip_hash_secret_env: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) trusted_proxies: Vec<Spanned<String>>,
    pub(super) forwarded_header: Option<Parsed<ForwardedHeader>>,
    pub(super) ipv6_prefix: Option<Spanned<u8>>,
    /// The file mapping API keys to plans, relative to the configuration's directory.
    pub(super) plans_file: Option<Spanned<String>>,
    pub(super) default_plan: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHeaders {
    pub(super) legacy: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRule {
    pub(super) name: Spanned<String>,
    pub(super) path: Parsed<PathPattern>,
    #[serde(default)]
    pub(super) methods: Vec<Spanned<String>>,
    pub(super) identity: Option<Spanned<IdentityKind>>,
    pub(super) limits: Option<Spanned<Vec<Spanned<RawLimit>>>>,
    pub(super) authenticated: Option<Spanned<Vec<Spanned<RawLimit>>>>,
    pub(super) anonymous: Option<Spanned<Vec<Spanned<RawLimit>>>>,
    pub(super) on_error: Option<OnError>,
    #[serde(default)]
    pub(super) shadow: bool,
    // Identity slice: path matching.
    /// Compare the path pattern's literal text with case (default: without).
    #[serde(default)]
    pub(super) case_sensitive: bool,
    /// Match `/x.json` as `/x` (Rails, Spring before 5.3).
    #[serde(default)]
    pub(super) format_suffix: bool,
    pub(super) max_cost: Option<Spanned<u64>>,
    // Crawl breadth and response-based charging.
    pub(super) breadth: Option<Spanned<RawBreadth>>,
    pub(super) count_status: Option<Spanned<Vec<Spanned<u16>>>>,
    pub(super) cost_header: Option<Spanned<String>>,
    pub(super) max_in_flight: Option<Spanned<u32>>,
    pub(super) penalty: Option<Spanned<RawPenalty>>,
    // Allow and deny lists of this rule.
    pub(super) allow: Option<RawClientList>,
    pub(super) deny: Option<RawClientList>,
    pub(super) delay: Option<Spanned<RawDelay>>,
}

/// `delay = { max_wait = "500ms", per_identity = 4 }`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDelay {
    pub(super) max_wait: Spanned<Parsed<TimeSpan>>,
    pub(super) per_identity: Option<Spanned<u32>>,
}

/// `breadth = { distinct = 200, window = "10m", of = "param:id" }`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBreadth {
    pub(super) distinct: Spanned<u64>,
    pub(super) window: WindowValue,
    pub(super) of: Option<Spanned<String>>,
}

/// `penalty = { after = 20, within = "1m", block = "10m", max_block = "24h" }`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPenalty {
    pub(super) after: Spanned<u64>,
    pub(super) within: Parsed<TimeSpan>,
    pub(super) block: Parsed<TimeSpan>,
    pub(super) max_block: Option<Parsed<TimeSpan>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimit {
    pub(super) name: Option<Spanned<String>>,
    pub(super) limit: Spanned<u64>,
    pub(super) window: WindowValue,
    #[serde(default)]
    pub(super) algorithm: Parsed<AlgorithmName>,
    pub(super) cost: Option<Spanned<u64>>,
}
