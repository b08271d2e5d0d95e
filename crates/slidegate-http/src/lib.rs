//! slidegate over HTTP: rate limiting in front of an API, as a tower layer.
//!
//! - [`LimiterConfig`]: what the limiter is built from, in code — rules
//!   ([`PathPattern`]s per method, each with its limits), identities, headers
//!   and the [`StoreGuard`]. (`slidegate-server` reads the same types from a
//!   TOML file.)
//! - [`RateLimiter`]: rules, identities ([`IdentityExtractor`]: API key or
//!   client IP, kept only as keyed hashes), a store behind a deadline, a
//!   circuit breaker ([`BreakerPolicy`]) and a fallback limiter deciding
//!   while the store fails ([`OnError`], [`StoreGuard`]), and [`Metrics`].
//! - [`RateLimitLayer`]: the tower middleware for axum, hyper and tonic.
//! - [`headers`]: `RateLimit-Policy` / `RateLimit` (draft-ietf-httpapi-ratelimit-headers-11),
//!   `X-RateLimit-*`, 429 with `Retry-After` and an RFC 9457 problem body.
//! - [`offenders`]: the identities refused most, in fixed memory.
//!
//! The crate has no features and none of a server's dependencies: no
//! sockets, no TOML, no Redis client. The reverse proxy `slidegate serve`
//! and its configuration file live in `slidegate-server`.
//!
//! ```
//! use slidegate::{Algorithm, Limit, MemoryStore, Quota};
//! use slidegate_http::config::{IdentityKind, LimitConfig, RuleConfig, RuleLimits};
//! use slidegate_http::{LimiterConfig, RateLimitLayer, RateLimiter};
//!
//! let per_second = Limit::new(Algorithm::SlidingWindowCounter, Quota::per_second(10)?);
//! let per_hour = Limit::new(Algorithm::SlidingWindowCounter, Quota::per_hour(500)?);
//! let mut config = LimiterConfig::default();
//! config.identity.api_key_header = Some(http::HeaderName::from_static("x-api-key"));
//! config.rules.push(RuleConfig::new(
//!     "search",
//!     "/api/search*".parse()?,
//!     RuleLimits::Shared {
//!         identity: IdentityKind::ApiKey,
//!         limits: vec![LimitConfig::new("search-1s", per_second, 1)?, LimitConfig::new("search-1h", per_hour, 1)?],
//!     },
//! ));
//! let limiter = RateLimiter::from_config(&config, MemoryStore::new())?;
//! // Wrap any tower service of `http::Request<B>`, e.g. an axum Router:
//! let layer = RateLimitLayer::new(limiter);
//! # drop(layer);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![cfg_attr(test, allow(clippy::unwrap_used))]

mod breadth;
pub mod client_share;
pub mod config;
mod cost_headers;
pub mod delay;
mod extractor;
pub mod grpc;
pub mod headers;
mod in_flight;
mod layer;
pub mod lift;
mod limiter;
mod lists;
mod metrics;
pub mod offenders;
mod plans;
mod response_cost;
mod rules;
mod verdict;

pub use breadth::{BreadthConfig, BreadthOf, BreadthOfError};
pub use config::{BreakerPolicy, LimiterConfig, OnError, StoreGuard};
pub use cost_headers::CostHeaders;
pub use extractor::{AmbiguousKey, ForwardedHeader, IdentityExtractor, UnknownForwardedHeader};
pub use layer::{PeerAddr, PeerFn, RateLimit, RateLimitBody, RateLimitLayer, ResponseFuture};
pub use limiter::{Admission, CheckError, KeyCheck, LimiterError, RateLimiter};
pub use lists::{canonical_net, AccessLists, ClientList, KeyHasher, KeyList, ListScope};
pub use metrics::{ListCounters, Metrics, RuleCounters, StoreCounters};
pub use plans::{PlanOverride, PlanOverrides};
pub use response_cost::ResponseCost;
pub use rules::{
    lenient_path, normalize_path, refused_path, PathPattern, PathPatternError, RuleMatch, RuleMatcher,
};
pub use slidegate::{parse_duration, DurationError, TimeSpan};
pub use verdict::{DecisionSource, PendingCharge, Policies, PolicyResult, Verdict};
