//! `slidegate serve`: a rate-limiting reverse proxy in front of one upstream,
//! built on `slidegate-http`'s limiter, and its TOML configuration.
//!
//! - [`Config`]: the configuration file, read by [`Config::load`] /
//!   [`Config::parse`] with every error located by file, line and column
//!   ([`ConfigError`]). Its `limiter` part is the
//!   [`LimiterConfig`](slidegate_http::LimiterConfig) a
//!   [`RateLimiter`](slidegate_http::RateLimiter) is built from.
//! - [`serve`]: the proxy: [`Server`] binds the listeners, runs one
//!   single-threaded runtime per worker thread, forwards to the upstream and
//!   serves the admin endpoints (`/v1/check`, `/metrics`, `/healthz`, the
//!   top offenders) where the config puts them.
//! - [`AnyStore`] and [`LazyRedis`]: the store chosen at run time, embedded
//!   or Redis, connected in the background when Redis is down at start.
//!
//! ```
//! use slidegate::MemoryStore;
//! use slidegate_http::RateLimiter;
//! use slidegate_server::Config;
//!
//! let config = Config::parse(r#"
//! [identity]
//! api_key_header = "x-api-key"
//!
//! [[rules]]
//! name = "search"
//! path = "/api/search*"
//! limits = [{ limit = 10, window = "1s" }, { limit = 500, window = "1h" }]
//! "#, "slidegate.toml")?;
//! let limiter = RateLimiter::from_config(&config.limiter, MemoryStore::new())?;
//! assert_eq!(limiter.rule_names(), ["search"]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The binary (`slidegate-cli`) parses arguments, sets up logging and turns
//! signals into the shutdown future [`Server::run`] takes.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod config;
pub mod envoy;
pub mod serve;
mod store;
#[cfg(test)]
mod test_timing;

/// The operator's guide to `slidegate serve` (`docs/serve.md`): the
/// configuration, identities, failure handling, security notes and every
/// option. Pulled in here so it is searchable with the API and its links
/// are checked by `cargo doc`.
#[doc = include_str!("../../../docs/serve.md")]
pub mod guide {}

pub use config::{
    AccessLogConfig, AccessLogPath, Config, ConfigError, LogFormat, OnCorruptSnapshot, Password,
    ServerConfig, SnapshotConfig, StoreConfig,
};
pub use serve::{
    redis_options, AccessLogReopen, ReloadError, Reloaded, Reloader, ServeBody, ServeError, Server,
};
pub use store::{AnyStore, LazyRedis, LAYOUT_RECORD_MIN};
