//! What a [`RateLimiter`](crate::RateLimiter) is built from: typed values a
//! program builds in code.
//!
//! - [`LimiterConfig`]: the rules ([`RuleConfig`], [`LimitConfig`]), the
//!   identity settings, the header switches and the [`StoreGuard`].
//! - [`TimeSpan`] and [`parse_duration`] (re-exported): lengths of time that
//!   are not windows.
//!
//! The module keeps the name `config` because these are the library's
//! configuration; reading them from a TOML file, with every error located, is
//! the application's job (`slidegate-server`'s `Config`, which holds a
//! [`LimiterConfig`] beside the proxy's own settings).

mod plans;
mod types;

pub use plans::{PlanConfig, PlanKeys, PlansConfig};
pub use slidegate::protect::{BreakerPolicy, FallbackPolicy, GuardPolicy, LeasePolicy, StoreGuard};
pub use slidegate::{parse_duration, DurationError, TimeSpan};
pub use types::{
    DelayConfig, DelayError, HeadersConfig, IdentityConfig, IdentityKind, LimitConfig, LimiterConfig,
    OnError, RuleConfig, RuleLimits,
};
