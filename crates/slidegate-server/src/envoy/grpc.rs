//! The gRPC methods of `[server] grpc_listen`, routed by path: Envoy's
//! rate limit service and the standard health service
//! (`grpc.health.v1.Health`). `serve`'s worker threads serve them over
//! HTTP/2 with hyper, on their own current-thread runtimes, as they serve
//! the HTTP listeners (`serve::worker`); this module only answers calls.

use std::convert::Infallible;
use std::sync::Arc;

use tonic::codegen::{Body, Service, StdError};
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};

use super::proto::{RateLimitServiceServer, SHOULD_RATE_LIMIT};
use super::service::{Current, EnvoyService};

/// The largest request message decoded (a request carries at most
/// `MAX_DESCRIPTORS` descriptors; Envoy's are a few hundred bytes).
const MAX_MESSAGE: usize = 1 << 20;

/// The prefix of the health service's methods (`Check`, `Watch`).
const HEALTH: &str = "/grpc.health.v1.Health/";

/// What `grpc.health.v1.Health` answers: SERVING for the server (`""`) and
/// for the rate limit service, for as long as the process serves. Made once,
/// shared by every worker.
#[derive(Clone)]
pub struct GrpcHealth(HealthServer<HealthService>);

impl GrpcHealth {
    /// Both services SERVING.
    pub async fn serving() -> Self {
        let reporter = HealthReporter::new();
        reporter.set_serving::<RateLimitServiceServer<EnvoyService>>().await;
        Self(HealthServer::new(HealthService::from_health_reporter(reporter)))
    }
}

/// The methods of the gRPC listener, for one worker thread.
#[derive(Clone)]
pub struct GrpcRoutes {
    rate_limit: RateLimitServiceServer<EnvoyService>,
    health: HealthServer<HealthService>,
}

impl GrpcRoutes {
    /// `ShouldRateLimit` decided by whatever `current` holds at each call
    /// (a reload replaces it), and `health`.
    pub fn new(current: Arc<Current>, health: &GrpcHealth) -> Self {
        Self {
            rate_limit: RateLimitServiceServer::new(EnvoyService::new(current), MAX_MESSAGE),
            health: health.0.clone(),
        }
    }

    /// Answers one gRPC call: `ShouldRateLimit` (written out by hand), the
    /// health service (tonic's), or a
    /// trailers-only `UNIMPLEMENTED` for any other path.
    pub async fn call<B>(&self, request: http::Request<B>) -> http::Response<tonic::body::Body>
    where
        B: Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<StdError> + Send + 'static,
    {
        let path = request.uri().path();
        // The health service is always ready (its `poll_ready` is `Ready`):
        // `call` at once.
        let answer: Result<_, Infallible> = if path == SHOULD_RATE_LIMIT {
            Ok(self.rate_limit.should_rate_limit(request).await)
        } else if path.starts_with(HEALTH) {
            self.health.clone().call(request).await
        } else {
            let method = path.get(..200).unwrap_or(path);
            Ok(tonic::Status::unimplemented(format!("no method {method} on this server")).into_http())
        };
        match answer {
            Ok(response) => response,
            Err(never) => match never {},
        }
    }
}
