//! The configuration: typed, buildable in code, and (with the `config`
//! feature) read from TOML with every key known and every error located.
//!
//! - [`types`](Config): the validated configuration and its defaults.
//! - [`Delay`] and [`parse_duration`]: lengths of time that are not windows.
//! - [`ConfigError`]: what was wrong, at which file, line and column.
//! - With `config`: `Config::load` reads and validates a file,
//!   `Config::parse` a string, and `Config::parse_with_env` takes the
//!   environment as an argument. Any error — a TOML syntax error, an unknown
//!   key, a value of the wrong form, a rule that contradicts itself — names
//!   the file, line and column and the form that was expected.

mod duration;
mod error;
#[cfg(feature = "config")]
mod raw;
mod types;
#[cfg(feature = "config")]
mod validate;
#[cfg(feature = "config")]
mod values;

pub use duration::{parse_duration, Delay, DurationError};
pub use error::ConfigError;
pub use types::{
    Config, HeadersConfig, IdentityConfig, IdentityKind, LimitConfig, OnError, Password, RedisEngine,
    RuleConfig, RuleLimits, ServerConfig, StoreConfig, StoreLocation,
};

#[cfg(all(test, feature = "config"))]
mod tests;
