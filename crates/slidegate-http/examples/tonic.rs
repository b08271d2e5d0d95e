//! slidegate as a tower layer in a tonic gRPC server, in front of the
//! standard health service (`grpc.health.v1.Health`).
//!
//! ```text
//! cargo run -p slidegate-http --example tonic           # listens on 127.0.0.1:50051
//! grpcurl -plaintext 127.0.0.1:50051 grpc.health.v1.Health/Check   # RESOURCE_EXHAUSTED after 2 a minute
//! # or, without grpcurl, an empty request message by hand:
//! printf '\0\0\0\0\0' | curl -si --http2-prior-knowledge -H 'content-type: application/grpc' \
//!     --data-binary @- http://127.0.0.1:50051/grpc.health.v1.Health/Check
//! ```
//!
//! A denied call ends with `grpc-status` 8, `RESOURCE_EXHAUSTED`, a
//! `grpc-message` naming the wait, `Retry-After` and the `RateLimit`
//! headers as metadata: the answer `slidegate serve` gives the same call
//! (`RateLimitLayer::grpc_denial` makes it 14, `UNAVAILABLE`, for clients
//! whose retry policy retries only that). Set `SLIDEGATE_EXAMPLE_ADDR` to listen elsewhere.
//! `tests/examples.rs` makes real calls to this same server with a tonic
//! client.

use std::error::Error;

use slidegate::{Algorithm, Limit, MemoryStore, Quota, Store};
use slidegate_http::config::{IdentityKind, LimitConfig, RuleConfig, RuleLimits};
use slidegate_http::{LimiterConfig, PeerAddr, RateLimitLayer, RateLimiter};
use tokio::net::TcpListener;
use tonic::transport::server::{TcpConnectInfo, TcpIncoming};
use tonic::transport::Server;
use tower::ServiceBuilder;

/// The rules of this example: the health service, 2 calls a minute per client (gRPC paths are `/package.Service/Method`).
pub fn config() -> Result<LimiterConfig, Box<dyn Error>> {
    let limit = Limit::new(Algorithm::SlidingLog, Quota::per_minute(2)?);
    let limits = vec![LimitConfig::new("health", limit, 1)?];
    let mut config = LimiterConfig::default();
    let rule = RuleConfig::new(
        "health",
        "/grpc.health.v1.Health/*".parse()?,
        RuleLimits::Shared { identity: IdentityKind::ApiKey, limits },
    );
    config.rules.push(rule);
    Ok(config)
}

/// Copies the socket peer from tonic's `TcpConnectInfo` to the [`PeerAddr`]
/// the rate limit layer reads.
pub fn peer_addr<B>(mut request: http::Request<B>) -> http::Request<B> {
    let addr = request.extensions().get::<TcpConnectInfo>().and_then(TcpConnectInfo::remote_addr);
    if let Some(addr) = addr {
        request.extensions_mut().insert(PeerAddr(addr));
    }
    request
}

/// Serves the health service on `listener`, rate-limited by `limiter`.
pub async fn serve<S: Store + 'static>(
    listener: TcpListener,
    limiter: RateLimiter<S>,
) -> Result<(), tonic::transport::Error> {
    let (_reporter, health) = tonic_health::server::health_reporter();
    Server::builder()
        .layer(ServiceBuilder::new().map_request(peer_addr).layer(RateLimitLayer::new(limiter)))
        .add_service(health)
        .serve_with_incoming(TcpIncoming::from(listener))
        .await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let limiter = RateLimiter::from_config(&config()?, MemoryStore::new())?;
    let addr = std::env::var("SLIDEGATE_EXAMPLE_ADDR").unwrap_or_else(|_| "127.0.0.1:50051".into());
    let listener = TcpListener::bind(&addr).await?;
    println!("listening on http://{} (gRPC, HTTP/2 only)", listener.local_addr()?);
    serve(listener, limiter).await?;
    Ok(())
}
