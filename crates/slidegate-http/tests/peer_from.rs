//! `RateLimitLayer::peer_from`: the layer reads the client address where the
//! server keeps it (axum's `ConnectInfo`), with no `map_request` copying it
//! into `PeerAddr`; without it, `PeerAddr` is what the layer reads.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use axum::routing::get;
use axum::Router;
use http::{HeaderMap, StatusCode};
use slidegate::{Algorithm, Limit, MemoryStore, Quota};
use slidegate_http::config::{IdentityKind, LimitConfig, RuleConfig, RuleLimits};
use slidegate_http::{LimiterConfig, PeerAddr, RateLimitLayer, RateLimiter};
use tower::ServiceExt;

/// Two requests a minute per client address on every path.
fn limiter() -> RateLimiter<MemoryStore> {
    let limit = Limit::new(Algorithm::SlidingLog, Quota::per_minute(2).unwrap());
    let limits = vec![LimitConfig::new("all", limit, 1).unwrap()];
    let mut config = LimiterConfig::default();
    config.rules.push(RuleConfig::new(
        "all",
        "/*".parse().unwrap(),
        RuleLimits::Shared { identity: IdentityKind::Ip, limits },
    ));
    RateLimiter::from_config(&config, MemoryStore::new()).unwrap()
}

fn connect_info(extensions: &http::Extensions) -> Option<SocketAddr> {
    extensions.get::<ConnectInfo<SocketAddr>>().map(|info| info.0)
}

fn app(layer: RateLimitLayer<MemoryStore>) -> Router {
    Router::new().route("/", get(|| async { "ok" })).layer(layer)
}

/// A request from `connect` (axum's `ConnectInfo`) and `peer` (`PeerAddr`).
async fn call(app: &Router, connect: Option<&str>, peer: Option<&str>) -> (StatusCode, HeaderMap) {
    let mut request = Request::builder().uri("/").body(Body::empty()).unwrap();
    if let Some(addr) = connect {
        request.extensions_mut().insert(ConnectInfo(addr.parse::<SocketAddr>().unwrap()));
    }
    if let Some(addr) = peer {
        request.extensions_mut().insert(PeerAddr(addr.parse().unwrap()));
    }
    let response = app.clone().oneshot(request).await.unwrap();
    (response.status(), response.headers().clone())
}

fn remaining(headers: &HeaderMap) -> &str {
    headers.get("x-ratelimit-remaining").unwrap().to_str().unwrap()
}

#[tokio::test]
async fn the_layer_counts_clients_by_the_address_peer_from_reads() {
    let app = app(RateLimitLayer::new(limiter()).peer_from(connect_info));
    let a = Some("10.0.0.1:4000");
    for left in ["1", "0"] {
        let (status, headers) = call(&app, a, None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(remaining(&headers), left);
        assert_eq!(headers.get("ratelimit").unwrap(), &format!("\"all\";r={left};t=60"));
        assert_eq!(headers.get("x-ratelimit-limit").unwrap(), "2");
    }
    let (status, headers) = call(&app, a, None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers.get("retry-after").unwrap(), "60");
    // Another port of the same host is the same client; another host is not.
    assert_eq!(call(&app, Some("10.0.0.1:4001"), None).await.0, StatusCode::TOO_MANY_REQUESTS);
    let (status, headers) = call(&app, Some("10.0.0.2:4000"), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(remaining(&headers), "1");
    // `PeerAddr` is not what this layer reads: a request carrying only it
    // is an unknown client, and so is one with neither; they share a count.
    assert_eq!(call(&app, None, Some("10.0.0.3:1")).await.0, StatusCode::OK);
    assert_eq!(call(&app, None, None).await.0, StatusCode::OK);
    assert_eq!(call(&app, None, Some("10.0.0.4:1")).await.0, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn without_peer_from_the_layer_reads_peer_addr_only() {
    let app = app(RateLimitLayer::new(limiter()));
    // Two hosts by `ConnectInfo` alone: unknown to this layer, one client.
    assert_eq!(call(&app, Some("10.0.0.1:1"), None).await.0, StatusCode::OK);
    assert_eq!(call(&app, Some("10.0.0.2:1"), None).await.0, StatusCode::OK);
    assert_eq!(call(&app, Some("10.0.0.3:1"), None).await.0, StatusCode::TOO_MANY_REQUESTS);
    // By `PeerAddr`, each host is counted on its own.
    let (status, headers) = call(&app, Some("10.0.0.9:1"), Some("10.0.0.1:1")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(remaining(&headers), "1");
}
