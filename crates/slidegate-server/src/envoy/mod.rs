//! Envoy's rate limit service (`envoy.service.ratelimit.v3.RateLimitService`)
//! on `[server] grpc_listen`, configured by envoyproxy/ratelimit's YAML
//! (`[envoy] config`). See docs/envoy.md.
//!
//! - `proto`: the API's messages and service, written by hand with prost.
//! - `descriptors`: the compiled descriptor tree and its matching rules.
//! - `yaml`: the reference service's YAML, read into the tree and into one
//!   limiter rule per configured limit (called by `config`'s validation).
//! - `service`: `ShouldRateLimit`, deciding through the limiter.
//! - `grpc`: the gRPC methods of the listener routed by path, with the
//!   standard health service (served by `serve`'s workers).
//!
//! `descriptors`, `proto` and `yaml` sit below `config`; `service` and
//! `grpc` above `store.rs`, below `serve`.

mod descriptors;
mod grpc;
pub mod proto;
mod service;
mod yaml;

pub use descriptors::EnvoyConfig;
pub use grpc::{GrpcHealth, GrpcRoutes};
pub use service::{Current, EnvoyService, MAX_DESCRIPTORS, MAX_ENTRIES, MAX_OVERRIDES};
pub use yaml::{load, override_domain, YamlError, RULE_PREFIX};
