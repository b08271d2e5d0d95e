//! The configuration file of `slidegate serve`: TOML read into typed values
//! with every key known and every error located.
//!
//! - [`Config`]: the validated file; its `limiter` part is
//!   `slidegate-http`'s [`LimiterConfig`](slidegate_http::LimiterConfig).
//! - [`ConfigError`]: what was wrong, at which file, line and column.
//! - `Config::load` reads and validates a file, `Config::parse` a string, and
//!   `Config::parse_with_env` takes the environment as an argument;
//!   `Config::load_to_serve` also asks for what the proxy needs, and
//!   `Config::load_limiter` only for what the limiter does. Any
//!   error — a TOML syntax error, an unknown key, a value of the wrong form,
//!   a rule that contradicts itself — names the file, line and column and
//!   the form that was expected.
//!
//! Inside: `raw` is the file as written (serde, with positions), `values`
//! parses single values, and `validate` turns raw into typed, one section
//! per file.

mod connections;
mod error;
mod protocols;
mod raw;
mod types;
mod validate;
mod values;

pub use connections::{ConnectionLimits, ListenerConnections};
pub use error::ConfigError;
pub use protocols::{load_certificates, load_roots, Http2Limits, ListenerTls, TlsFileError};
pub use types::{
    AccessLogConfig, AccessLogPath, Config, GrpcDenialStatus, LogFormat, OnCorruptSnapshot, Password,
    ServerConfig, SnapshotConfig, StoreConfig,
};

#[cfg(test)]
mod errors_tests;
#[cfg(test)]
mod lists_tests;
#[cfg(test)]
mod plans_tests;
#[cfg(test)]
mod server_tests;
#[cfg(test)]
mod store_tests;
#[cfg(test)]
mod tests;
