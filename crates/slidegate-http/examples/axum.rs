//! slidegate as a tower layer in an axum app.
//!
//! ```text
//! cargo run -p slidegate-http --example axum            # listens on 127.0.0.1:3000
//! curl -i http://127.0.0.1:3000/api/search?q=cats       # RateLimit headers; 429 after 5 in 10 s
//! curl -i -H 'x-api-key: alice' http://127.0.0.1:3000/api/videos/trending
//! ```
//!
//! Set `SLIDEGATE_EXAMPLE_ADDR` to listen elsewhere, and `REDIS_URL` to keep
//! the limits in Redis instead of in this process. `tests/examples.rs` serves
//! this same app on a real socket.

use std::error::Error;
use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{ConnectInfo, Request};
use axum::routing::get;
use axum::{middleware, Router};
use slidegate::{Algorithm, Limit, MemoryStore, Quota, RedisStore, Store};
use slidegate_http::config::{IdentityKind, LimitConfig, RuleConfig, RuleLimits};
use slidegate_http::{LimiterConfig, PeerAddr, RateLimitLayer, RateLimiter};
use tokio::net::TcpListener;

/// The rules of this example: `GET /api/videos/trending` 3 per 10 s without
/// an API key and 10 with one (counted per key); `/api/search*` 5 per 10 s
/// and 100 an hour.
pub fn config() -> Result<LimiterConfig, Box<dyn Error>> {
    let limit = |algorithm, permits, secs| -> Result<Limit, Box<dyn Error>> {
        Ok(Limit::new(algorithm, Quota::new(permits, Duration::from_secs(secs))?))
    };
    let mut config = LimiterConfig::default();
    config.identity.api_key_header = Some(http::HeaderName::from_static("x-api-key"));
    let mut trending = RuleConfig::new(
        "trending",
        "/api/videos/trending".parse()?,
        RuleLimits::Split {
            anonymous: vec![LimitConfig::new("trending", limit(Algorithm::SlidingLog, 3, 10)?, 1)?],
            authenticated: vec![LimitConfig::new("trending", limit(Algorithm::SlidingLog, 10, 10)?, 1)?],
        },
    );
    trending.methods = vec![http::Method::GET];
    config.rules.push(trending);
    let counter = Algorithm::SlidingWindowCounter;
    config.rules.push(RuleConfig::new(
        "search",
        "/api/search*".parse()?,
        RuleLimits::Shared {
            identity: IdentityKind::ApiKey,
            limits: vec![
                LimitConfig::new("search-10s", limit(counter, 5, 10)?, 1)?,
                LimitConfig::new("search-1h", limit(counter, 100, 3600)?, 1)?,
            ],
        },
    ));
    Ok(config)
}

/// The app: three routes, two of them rate-limited by `limiter`.
pub fn app<S: Store + 'static>(limiter: RateLimiter<S>) -> Router {
    Router::new()
        .route("/api/videos/trending", get(|| async { "trending videos\n" }))
        .route("/api/search", get(|| async { "search results\n" }))
        .route("/", get(|| async { "not limited\n" }))
        .layer(RateLimitLayer::new(limiter))
        // Added last, so it runs first: the rate limit layer reads `PeerAddr`.
        .layer(middleware::map_request(peer_addr))
}

/// Copies the socket peer from axum's `ConnectInfo` to the [`PeerAddr`] the
/// layer reads. Served without connect info, the app answers 500 here
/// rather than counting every client as one.
pub async fn peer_addr(ConnectInfo(addr): ConnectInfo<SocketAddr>, mut request: Request) -> Request {
    request.extensions_mut().insert(PeerAddr(addr));
    request
}

/// Serves `app` on `listener`, with the connect info [`peer_addr`] reads.
pub async fn serve(listener: TcpListener, app: Router) -> std::io::Result<()> {
    axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let config = config()?;
    let addr = std::env::var("SLIDEGATE_EXAMPLE_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let listener = TcpListener::bind(&addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    match std::env::var("REDIS_URL") {
        Ok(url) => {
            let store = RedisStore::connect(&url).await?;
            serve(listener, app(RateLimiter::from_config(&config, store)?)).await?;
        }
        Err(_) => serve(listener, app(RateLimiter::from_config(&config, MemoryStore::new())?)).await?,
    }
    Ok(())
}
