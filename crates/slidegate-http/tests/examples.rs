//! Each example, served as its `main` serves it, on a real loopback socket,
//! answering real requests: exact statuses and rate limit headers.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use slidegate::MemoryStore;
use slidegate_http::{LimiterConfig, RateLimiter};
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::Endpoint;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

// Each example's `main` is not called here.
#[allow(dead_code)]
#[path = "../examples/axum.rs"]
mod axum_example;
#[allow(dead_code)]
#[path = "../examples/hyper.rs"]
mod hyper_example;
#[allow(dead_code)]
#[path = "../examples/tonic.rs"]
mod tonic_example;

fn limiter(config: Result<LimiterConfig, Box<dyn std::error::Error>>) -> RateLimiter<MemoryStore> {
    RateLimiter::from_config(&config.unwrap(), MemoryStore::new()).unwrap()
}

async fn loopback() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (listener, addr)
}

/// One HTTP/1.1 GET on a fresh connection: a new source port each time, the
/// same client address.
async fn get(addr: SocketAddr, path: &str, api_key: Option<&str>) -> (StatusCode, HeaderMap, String) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(connection);
    let mut request = Request::get(path).header("host", addr.to_string());
    if let Some(key) = api_key {
        request = request.header("x-api-key", key);
    }
    let response = sender.send_request(request.body(Empty::<Bytes>::new()).unwrap()).await.unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (parts.status, parts.headers, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn the_axum_example_limits_each_client_by_its_socket_address() {
    let (listener, addr) = loopback().await;
    let app = axum_example::app(limiter(axum_example::config()));
    tokio::spawn(axum_example::serve(listener, app));

    for remaining in [2, 1, 0] {
        let (status, headers, body) = get(addr, "/api/videos/trending", None).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "trending videos\n"));
        assert_eq!(headers["ratelimit-policy"], "\"trending\";q=3;w=10");
        assert_eq!(headers["ratelimit"], format!("\"trending\";r={remaining};t=10"));
    }
    let (status, headers, body) = get(addr, "/api/videos/trending", None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["retry-after"], "10");
    assert_eq!(headers["content-type"], "application/problem+json");
    assert!(body.contains("\"status\":429"), "{body}");
    // An API key has its own, larger quota; an unmatched path no headers.
    let (status, headers, _) = get(addr, "/api/videos/trending", Some("alice")).await;
    assert_eq!((status, &headers["ratelimit"]), (StatusCode::OK, &"\"trending\";r=9;t=10".parse().unwrap()));
    let (status, headers, _) = get(addr, "/", None).await;
    assert_eq!((status, headers.get("ratelimit")), (StatusCode::OK, None));
}

#[tokio::test]
async fn the_axum_example_refuses_to_run_without_connect_info() {
    // Served without `into_make_service_with_connect_info`, the peer is
    // unknown: a 500, not every client counted as one.
    let (listener, addr) = loopback().await;
    let app = axum_example::app(limiter(axum_example::config()));
    tokio::spawn(async move { axum::serve(listener, app).await });
    assert_eq!(get(addr, "/api/search", None).await.0, StatusCode::INTERNAL_SERVER_ERROR);
}

#[tokio::test]
async fn the_hyper_example_limits_each_client_by_its_socket_address() {
    let (listener, addr) = loopback().await;
    tokio::spawn(hyper_example::serve(listener, limiter(hyper_example::config())));

    for remaining in [1, 0] {
        let (status, headers, body) = get(addr, "/api/hello", None).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "hello from /api/hello\n"));
        assert_eq!(headers["ratelimit-policy"], "\"hello\";q=2;w=60");
        assert_eq!(headers["ratelimit"], format!("\"hello\";r={remaining};t=60"));
        assert_eq!(headers["x-ratelimit-remaining"], remaining.to_string());
    }
    let (status, headers, _) = get(addr, "/api/hello", None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["retry-after"], "60");
    assert_eq!(headers["ratelimit"], "\"hello\";r=0;t=60");
    let (status, headers, _) = get(addr, "/elsewhere", None).await;
    assert_eq!((status, headers.get("ratelimit")), (StatusCode::OK, None));
}

#[tokio::test]
async fn the_tonic_example_fails_calls_over_the_limit_as_resource_exhausted() {
    let (listener, addr) = loopback().await;
    tokio::spawn(tonic_example::serve(listener, limiter(tonic_example::config())));

    let channel = Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    let mut client = HealthClient::new(channel);
    for remaining in [1, 0] {
        let response = client.check(HealthCheckRequest { service: String::new() }).await.unwrap();
        assert_eq!(response.get_ref().status(), ServingStatus::Serving);
        assert_eq!(response.metadata().get("ratelimit").unwrap(), &format!("\"health\";r={remaining};t=60"));
    }
    let status = client.check(HealthCheckRequest { service: String::new() }).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(status.message(), "policy \"health\" allows 2 requests per 60 s; retry in 60 s");
    assert_eq!(status.metadata().get("retry-after").unwrap(), "60");
}
