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

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Request};
use axum::routing::get;
use axum::{middleware, Router};
use slidegate::{MemoryStore, RedisStore, Store};
use slidegate_http::{AnyStore, Config, LazyRedis, PeerAddr, RateLimitLayer, RateLimiter};
use tokio::net::TcpListener;

/// The rules of this example.
pub const CONFIG: &str = r#"
[identity]
api_key_header = "x-api-key"

[[rules]]
name = "trending"
path = "/api/videos/trending"
methods = ["GET"]
anonymous = [{ limit = 3, window = "10s", algorithm = "sliding_log" }]
authenticated = [{ limit = 10, window = "10s", algorithm = "sliding_log" }]

[[rules]]
name = "search"
path = "/api/search*"
limits = [{ limit = 5, window = "10s" }, { limit = 100, window = "1h" }]
"#;

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
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = Config::parse(CONFIG, "examples/axum.rs")?;
    let store = match std::env::var("REDIS_URL") {
        Ok(url) => AnyStore::Redis(LazyRedis::from_store(RedisStore::connect(&url).await?)),
        Err(_) => AnyStore::Memory(MemoryStore::new()),
    };
    let limiter = RateLimiter::from_config(&config, store)?;
    let addr = std::env::var("SLIDEGATE_EXAMPLE_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let listener = TcpListener::bind(&addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    serve(listener, app(limiter)).await?;
    Ok(())
}
