//! slidegate as a tower layer in front of a plain hyper 1 server.
//!
//! ```text
//! cargo run -p slidegate-http --example hyper           # listens on 127.0.0.1:3000
//! curl -i http://127.0.0.1:3000/api/hello               # RateLimit headers; 429 after 2 a minute
//! ```
//!
//! Set `SLIDEGATE_EXAMPLE_ADDR` to listen elsewhere. `tests/examples.rs`
//! serves this same service on a real socket.

use std::convert::Infallible;
use std::error::Error;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use slidegate::{Algorithm, Limit, MemoryStore, Quota, Store};
use slidegate_http::config::{IdentityKind, LimitConfig, RuleConfig, RuleLimits};
use slidegate_http::{LimiterConfig, PeerAddr, RateLimitLayer, RateLimiter};
use tokio::net::TcpListener;
use tower::ServiceBuilder;

/// The rules of this example: every path under `/api/`, 2 a minute per client.
pub fn config() -> Result<LimiterConfig, Box<dyn Error>> {
    let limit = Limit::new(Algorithm::SlidingLog, Quota::per_minute(2)?);
    let limits = vec![LimitConfig::new("hello", limit, 1)?];
    let mut config = LimiterConfig::default();
    let rule = RuleConfig::new(
        "hello",
        "/api/*".parse()?,
        RuleLimits::Shared { identity: IdentityKind::ApiKey, limits },
    );
    config.rules.push(rule);
    Ok(config)
}

/// The application: answers every request.
async fn hello(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::from(format!("hello from {}\n", request.uri().path()))))
}

/// Accepts connections on `listener` and serves each with [`hello`] behind
/// the rate limit layer, until accepting fails.
pub async fn serve<S: Store + 'static>(
    listener: TcpListener,
    limiter: RateLimiter<S>,
) -> std::io::Result<()> {
    let layer = RateLimitLayer::new(limiter);
    loop {
        let (stream, peer) = listener.accept().await?;
        // hyper knows nothing of sockets: the peer is known here, per connection.
        let service = ServiceBuilder::new()
            .map_request(move |mut request: Request<Incoming>| {
                request.extensions_mut().insert(PeerAddr(peer));
                request
            })
            .layer(layer.clone())
            .service_fn(hello);
        tokio::spawn(async move {
            let connection = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
            if let Err(error) = connection.await {
                eprintln!("connection from {peer}: {error}");
            }
        });
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let limiter = RateLimiter::from_config(&config()?, MemoryStore::new())?;
    let addr = std::env::var("SLIDEGATE_EXAMPLE_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let listener = TcpListener::bind(&addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    serve(listener, limiter).await?;
    Ok(())
}
