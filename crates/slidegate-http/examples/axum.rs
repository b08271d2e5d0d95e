//! slidegate as a tower layer in an axum app.
//!
//! ```text
//! cargo run -p slidegate-http --example axum            # listens on 127.0.0.1:3000
//! curl -i http://127.0.0.1:3000/api/search?q=cats       # RateLimit headers; 429 after 5 in 10 s
//! curl -i -H 'x-api-key: alice' http://127.0.0.1:3000/api/videos/trending
//! ```
//!
//! Set `SLIDEGATE_EXAMPLE_ADDR` to listen elsewhere, and `REDIS_URL` to keep
//! the limits in Redis instead of in this process.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Request};
use axum::routing::get;
use axum::Router;
use slidegate::{MemoryStore, RedisStore};
use slidegate_http::{AnyStore, Config, RateLimitLayer, RateLimiter};

const CONFIG: &str = r#"
[identity]
api_key_header = "x-api-key"

[[rules]]
name = "trending"
path = "/api/videos/trending"
methods = ["GET"]
anonymous = [{ limit = 3, window = "10s" }]
authenticated = [{ limit = 10, window = "10s", algorithm = "sliding_log" }]

[[rules]]
name = "search"
path = "/api/search*"
limits = [{ limit = 5, window = "10s" }, { limit = 100, window = "1h" }]
"#;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = Config::parse(CONFIG, "examples/axum.rs")?;
    let store = match std::env::var("REDIS_URL") {
        Ok(url) => AnyStore::Redis(slidegate_http::LazyRedis::from_store(RedisStore::connect(&url).await?)),
        Err(_) => AnyStore::Memory(MemoryStore::new()),
    };
    let limiter = RateLimiter::from_config(&config, store);
    // axum puts the peer address in `ConnectInfo` (see `into_make_service_with_connect_info` below).
    let layer = RateLimitLayer::new(limiter).peer_addr(|request: &Request| {
        request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip())
    });

    let app = Router::new()
        .route("/api/videos/trending", get(|| async { "trending videos\n" }))
        .route("/api/search", get(|| async { "search results\n" }))
        .route("/", get(|| async { "not limited\n" }))
        .layer(layer);

    let addr = std::env::var("SLIDEGATE_EXAMPLE_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
    Ok(())
}
