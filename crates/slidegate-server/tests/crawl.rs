//! The tower layer with the scraper defences that need the response or a
//! distinct-value sketch: status-based counting, upstream-set costs and
//! crawl breadth, on the embedded store.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::{ConnectInfo, Path, Request};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{middleware, Router};
use http::HeaderMap;
use slidegate::MemoryStore;
use slidegate_http::{PeerAddr, RateLimitLayer, RateLimiter};
use slidegate_server::Config;
use tower::ServiceExt;

const RULES: &str = r#"
[[rules]]
name = "users"
path = "/api/users/{id}"
limits = [{ limit = 2, window = "60s", algorithm = "sliding_log" }]
count_status = [404]

[[rules]]
name = "search"
path = "/api/search"
limits = [{ limit = 10, window = "60s", algorithm = "sliding_log" }]
cost_header = "x-ratelimit-cost"
max_cost = 10

[[rules]]
name = "videos"
path = "/api/videos/{id}"
limits = [{ limit = 100000, window = "60s" }]
breadth = { distinct = 50, window = "10m", of = "param:id" }

[[rules]]
name = "items"
path = "/api/items"
limits = [{ limit = 100000, window = "60s" }]
breadth = { distinct = 10, window = "10m", of = "query:id" }
"#;

async fn peer_addr(ConnectInfo(addr): ConnectInfo<SocketAddr>, mut request: Request) -> Request {
    request.extensions_mut().insert(PeerAddr(addr));
    request
}

fn app() -> Router {
    let config = Config::parse(RULES, "t.toml").unwrap();
    let limiter = RateLimiter::from_config(&config.limiter, MemoryStore::new()).unwrap();
    Router::new()
        .route(
            "/api/users/{id}",
            get(|Path(id): Path<String>| async move {
                if id.starts_with("missing") {
                    StatusCode::NOT_FOUND.into_response()
                } else {
                    "user".into_response()
                }
            }),
        )
        .route("/api/search", get(|| async { ([("x-ratelimit-cost", "5")], "results") }))
        .route("/api/videos/{id}", get(|| async { "video" }))
        .route("/api/items", get(|| async { "item" }))
        .layer(RateLimitLayer::new(limiter))
        .layer(middleware::map_request(peer_addr))
}

async fn call(app: &Router, path: &str) -> (StatusCode, HeaderMap) {
    let mut request = Request::builder().uri(path).body(Body::empty()).unwrap();
    request.extensions_mut().insert(ConnectInfo("192.0.2.1:4000".parse::<SocketAddr>().unwrap()));
    let response = app.clone().oneshot(request).await.unwrap();
    (response.status(), response.headers().clone())
}

fn ratelimit(headers: &HeaderMap) -> &str {
    headers.get("ratelimit").and_then(|v| v.to_str().ok()).unwrap_or("")
}

#[tokio::test]
async fn only_404s_count_and_the_next_request_after_the_last_is_refused() {
    let app = app();
    for i in 0..5 {
        let (status, headers) = call(&app, &format!("/api/users/{i}")).await;
        // Nothing counted yet: the full quota, nothing to reset.
        assert_eq!((status, ratelimit(&headers)), (StatusCode::OK, "\"users\";r=2;t=0"));
    }
    let (status, headers) = call(&app, "/api/users/missing1").await;
    assert_eq!((status, ratelimit(&headers)), (StatusCode::NOT_FOUND, "\"users\";r=1;t=60"));
    let (status, headers) = call(&app, "/api/users/missing2").await;
    assert_eq!((status, ratelimit(&headers)), (StatusCode::NOT_FOUND, "\"users\";r=0;t=60"));
    let (status, _) = call(&app, "/api/users/3").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn the_inner_service_sets_the_cost() {
    let app = app();
    let (_, headers) = call(&app, "/api/search").await;
    assert_eq!(ratelimit(&headers), "\"search\";r=5;t=60");
    let (_, headers) = call(&app, "/api/search").await;
    assert_eq!(ratelimit(&headers), "\"search\";r=0;t=60");
    assert_eq!(call(&app, "/api/search").await.0, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn a_walk_past_its_breadth_is_refused_and_revisits_pass() {
    let app = app();
    let mut admitted = 0;
    for id in 0..80 {
        if call(&app, &format!("/api/videos/{id}")).await.0 == StatusCode::OK {
            admitted += 1;
        }
    }
    // Below ~100 values the estimate is exact here (measured: the first 100
    // distinct values estimate 1..=100), so exactly 50 pass.
    assert_eq!(admitted, 50);
    let (status, headers) = call(&app, "/api/videos/0").await;
    assert_eq!(status, StatusCode::OK, "a revisit");
    assert_eq!(
        headers.get("ratelimit-policy").unwrap(),
        "\"videos\";q=100000;w=60, \"videos-breadth\";q=50;w=600"
    );
}

/// The layer hands the query to the limiter: ids in it are counted, and a
/// lenient spelling of a path id is that id.
#[tokio::test]
async fn the_layer_counts_ids_in_the_query_and_in_lenient_spellings() {
    let app = app();
    let mut admitted = Vec::new();
    for id in 0..30 {
        if call(&app, &format!("/api/items?id={id}")).await.0 == StatusCode::OK {
            admitted.push(id);
        }
    }
    assert_eq!(admitted, (0..10).collect::<Vec<_>>());
    assert_eq!(call(&app, "/api/items?ID=%33").await.0, StatusCode::OK, "a revisit of id 3");
    assert_eq!(call(&app, "/api/items?id=3&id=4").await.0, StatusCode::TOO_MANY_REQUESTS);
    // Videos seen plainly are revisits when spelled as Tomcat serves them.
    for id in 0..5 {
        assert_eq!(call(&app, &format!("/api/videos/{id}")).await.0, StatusCode::OK);
        let (status, headers) = call(&app, &format!("/api/videos/x/..;/{id}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "axum routes it nowhere");
        let left = format!("\"videos-breadth\";r={};", 49 - id);
        assert!(ratelimit(&headers).contains(&left), "id {id} is no new value: {headers:?}");
    }
}
