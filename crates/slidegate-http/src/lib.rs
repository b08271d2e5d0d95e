//! slidegate over HTTP: rate limiting in front of an API.
//!
//! - [`Config`]: the configuration, built in code or (feature `config`) read
//!   from TOML with every error located by file, line and column.
//! - [`RateLimiter`]: rules ([`PathPattern`]s per method), identities
//!   ([`IdentityExtractor`]: API key or client IP, kept only as keyed hashes), a
//!   store behind a deadline, a circuit breaker and an optional fallback
//!   limiter ([`StoreGuard`]), and [`Metrics`].
//! - [`RateLimitLayer`]: the tower middleware for axum, hyper and tonic.
//! - [`headers`]: `RateLimit-Policy` / `RateLimit` (draft-ietf-httpapi-ratelimit-headers-11),
//!   `X-RateLimit-*`, 429 with `Retry-After` and an RFC 9457 problem body.
//! - `serve` (feature `serve`): the reverse proxy behind `slidegate serve`.
//!
//! # Features
//!
//! The default is only the library a tower user needs; nothing of the proxy.
//!
//! | feature  | adds |
//! |----------|------|
//! | `config` | `Config::load` / `Config::parse`: TOML (the `toml` crate) |
//! | `redis`  | `AnyStore` and `LazyRedis`: the store chosen at run time, Redis included |
//! | `serve`  | the `serve` module: the reverse proxy (hyper server and client); implies `config` and `redis` |
//!
//! ```
//! # #[cfg(feature = "config")] {
//! use slidegate::MemoryStore;
//! use slidegate_http::{Config, RateLimitLayer, RateLimiter};
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
//! let limiter = RateLimiter::from_config(&config, MemoryStore::new())?;
//! // Wrap any tower service of `http::Request<B>`, e.g. an axum Router:
//! let layer = RateLimitLayer::new(limiter);
//! # drop(layer);
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![cfg_attr(test, allow(clippy::unwrap_used))]

mod breadth;
mod breaker;
mod clock;
pub mod config;
mod deny_cache;
mod fallback;
mod guard;
pub mod headers;
mod identity;
mod layer;
mod limiter;
mod metrics;
pub mod offenders;
mod penalty;
mod response_cost;
mod rules;
#[cfg(feature = "serve")]
pub mod serve;
#[cfg(feature = "redis")]
mod store;
mod verdict;

/// The operator's guide to `slidegate serve` (`docs/serve.md`): the
/// configuration, identities, failure handling, security notes and every
/// option. Pulled in here so it is searchable with the API and its links
/// are checked by `cargo doc`.
#[doc = include_str!("../../../docs/serve.md")]
pub mod guide {}

pub use breadth::{BreadthConfig, BreadthOf, BreadthOfError};
pub use config::{Config, ConfigError, Delay, OnError};
pub use deny_cache::DenyCached;
pub use fallback::Fallback;
pub use guard::{Guarded, StoreGuard};
pub use identity::{ForwardedHeader, IdentityExtractor, UnknownForwardedHeader};
pub use layer::{PeerAddr, RateLimit, RateLimitBody, RateLimitLayer, ResponseFuture};
pub use limiter::{CheckError, LimiterError, RateLimiter};
pub use metrics::{Metrics, RuleCounters, StoreCounters};
pub use response_cost::ResponseCost;
pub use rules::{lenient_path, normalize_path, refused_path, PathPattern, PathPatternError, RuleMatcher};
#[cfg(feature = "redis")]
pub use store::{AnyStore, LazyRedis};
pub use verdict::{DecisionSource, PendingCharge, PolicyResult, Verdict};
