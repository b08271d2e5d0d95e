//! slidegate over HTTP: rate limiting in front of an API.
//!
//! - [`Config`]: the TOML configuration, every error located by file, line and column.
//! - [`RateLimiter`]: rules ([`PathPattern`]s per method), identities
//!   ([`IdentityExtractor`]: API key or client IP, kept only as keyed hashes), a
//!   store behind a deadline and a circuit breaker, and [`Metrics`].
//! - [`RateLimitLayer`]: the tower middleware for axum, hyper and tonic.
//! - [`headers`]: `RateLimit-Policy` / `RateLimit` (draft-ietf-httpapi-ratelimit-headers-11),
//!   `X-RateLimit-*`, 429 with `Retry-After` and an RFC 9457 problem body.
//! - [`serve`]: the reverse proxy behind `slidegate serve`.
//!
//! ```
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
//! let limiter = RateLimiter::from_config(&config, MemoryStore::new());
//! // Wrap any tower service of `http::Request<B>`, e.g. an axum Router:
//! let layer = RateLimitLayer::new(limiter);
//! # drop(layer);
//! # Ok::<(), slidegate_http::ConfigError>(())
//! ```

#![cfg_attr(test, allow(clippy::unwrap_used))]

mod breaker;
pub mod config;
pub mod headers;
mod identity;
mod layer;
mod limiter;
mod metrics;
mod rules;
pub mod serve;
mod store;

pub use config::{Config, ConfigError, OnError};
pub use identity::{ForwardedHeader, IdentityExtractor, IdentitySource};
pub use layer::{PeerAddr, RateLimit, RateLimitBody, RateLimitLayer, ResponseFuture};
pub use limiter::{CheckError, DecisionSource, PolicyResult, RateLimiter, StorePolicy, Verdict};
pub use metrics::{Metrics, RuleCounters, StoreCounters};
pub use rules::{normalize_path, PathPattern, RuleMatcher};
pub use store::{AnyStore, LazyRedis};
