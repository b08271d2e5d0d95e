//! The tower layer inside an axum app, and the limiter's failure policy
//! (deadline, circuit breaker, fallback limiter, shadow mode) on a store that can be
//! switched off. Time is tokio's paused clock: nothing here sleeps for real.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use axum::routing::get;
use axum::{middleware, Router};
use http::{HeaderMap, Method, StatusCode};
use slidegate::{MemoryStore, Store, StoreError};
use slidegate_http::{DecisionSource, PeerAddr, RateLimitLayer, RateLimiter};
use slidegate_server::Config;
use tower::ServiceExt;

const RULES: &str = r#"
[identity]
api_key_header = "x-api-key"

[[rules]]
name = "search"
path = "/api/search*"
limits = [{ limit = 2, window = "60s", algorithm = "sliding_log" }]

[[rules]]
name = "feed"
path = "/api/feed"
shadow = true
limits = [{ limit = 1, window = "60s", algorithm = "sliding_log" }]
"#;

/// axum's `ConnectInfo`, copied to the `PeerAddr` the layer reads.
async fn peer_addr(ConnectInfo(addr): ConnectInfo<SocketAddr>, mut request: Request) -> Request {
    request.extensions_mut().insert(PeerAddr(addr));
    request
}

fn app(limiter: RateLimiter<MemoryStore>) -> Router {
    Router::new()
        .route("/api/search", get(|| async { "results" }))
        .route("/api/feed", get(|| async { "feed" }))
        .route("/", get(|| async { "home" }))
        .layer(RateLimitLayer::new(limiter))
        .layer(middleware::map_request(peer_addr))
}

async fn call(app: &Router, path: &str, peer: &str) -> (StatusCode, HeaderMap) {
    let mut request = Request::builder().uri(path).body(Body::empty()).unwrap();
    request.extensions_mut().insert(ConnectInfo(peer.parse::<SocketAddr>().unwrap()));
    let response = app.clone().oneshot(request).await.unwrap();
    (response.status(), response.headers().clone())
}

#[tokio::test]
async fn the_layer_limits_an_axum_router_per_client_address() {
    let config = Config::parse(RULES, "rules.toml").unwrap();
    let app = app(RateLimiter::from_config(&config.limiter, MemoryStore::new()).unwrap());
    let (status, headers) = call(&app, "/api/search?q=1", "198.51.100.1:4000").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["ratelimit-policy"], "\"search\";q=2;w=60");
    assert_eq!(headers["ratelimit"], "\"search\";r=1;t=60");
    assert_eq!(call(&app, "/api/search", "198.51.100.1:4001").await.0, StatusCode::OK);
    let (status, headers) = call(&app, "/api/search", "198.51.100.1:4002").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["retry-after"], "60");
    // Another address, its own quota; an unmatched path, no headers at all.
    assert_eq!(call(&app, "/api/search", "198.51.100.2:4000").await.0, StatusCode::OK);
    let (status, headers) = call(&app, "/", "198.51.100.1:4000").await;
    assert_eq!((status, headers.get("ratelimit")), (StatusCode::OK, None));
}

#[tokio::test]
async fn shadow_rules_decide_and_count_but_never_block() {
    let config = Config::parse(RULES, "rules.toml").unwrap();
    let limiter = RateLimiter::from_config(&config.limiter, MemoryStore::new()).unwrap();
    let app = app(limiter.clone());
    assert_eq!(call(&app, "/api/feed", "198.51.100.1:1").await.0, StatusCode::OK);
    let (status, headers) = call(&app, "/api/feed", "198.51.100.1:1").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["ratelimit"], "\"feed\";r=0;t=60");
    assert_eq!(headers.get("retry-after"), None);
    let text = limiter.render_metrics();
    assert!(text.contains("slidegate_requests_shadow_denied_total{rule=\"feed\"} 1\n"), "{text}");
    assert!(text.contains("slidegate_requests_allowed_total{rule=\"feed\"} 1\n"), "{text}");
    assert!(text.contains("slidegate_requests_denied_total{rule=\"feed\"} 0\n"), "{text}");
}

/// A store that answers from memory, fails at once, or hangs, as told; counts calls.
#[derive(Default)]
struct Switchable {
    memory: MemoryStore,
    down: AtomicBool,
    hang: AtomicBool,
    calls: AtomicUsize,
}

/// The limiter's handle on a [`Switchable`] the test keeps too.
struct Shared(Arc<Switchable>);

impl Store for Shared {
    async fn decide(&self, request: slidegate::Request<'_>) -> Result<slidegate::Outcome, StoreError> {
        let store = &*self.0;
        store.calls.fetch_add(1, Ordering::SeqCst);
        if store.hang.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        if store.down.load(Ordering::SeqCst) {
            return Err(StoreError::UnexpectedReply("switched off".into()));
        }
        store.memory.decide_sync(request)
    }

    fn distinct(&self) -> Option<impl slidegate::DistinctStore + '_> {
        None::<slidegate::NoDistinct>
    }
}

fn limiter(store: &Arc<Switchable>, extra: &str) -> RateLimiter<Shared> {
    let text = format!("[store]\nbreaker_failures = 2\nprobe_interval_ms = 1000\n{extra}\n{RULES}");
    RateLimiter::from_config(&Config::parse(&text, "t.toml").unwrap().limiter, Shared(Arc::clone(store)))
        .unwrap()
}

async fn search(limiter: &RateLimiter<Shared>) -> slidegate_http::Verdict<'_> {
    let peer = Some("198.51.100.1".parse().unwrap());
    limiter.check_request(&Method::GET, "/api/search", &HeaderMap::new(), peer).await.unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_hanging_store_costs_the_deadline_until_the_breaker_opens_then_nothing() {
    let store = Arc::new(Switchable::default());
    let limiter = limiter(&store, "timeout_ms = 50\non_error = \"allow\"");
    store.hang.store(true, Ordering::SeqCst);
    let start = tokio::time::Instant::now();
    assert_eq!(search(&limiter).await.source, DecisionSource::FailOpen);
    assert_eq!(start.elapsed(), Duration::from_millis(50));
    assert_eq!(search(&limiter).await.source, DecisionSource::FailOpen);
    assert!(limiter.breaker_open());
    // Open: no store call, no waiting.
    let open_at = tokio::time::Instant::now();
    for _ in 0..100 {
        assert_eq!(search(&limiter).await.source, DecisionSource::FailOpen);
    }
    assert_eq!(open_at.elapsed(), Duration::ZERO);
    assert_eq!(store.calls.load(Ordering::SeqCst), 2);
    // The store recovers; the background probe notices within one interval.
    store.hang.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1001)).await;
    assert!(!limiter.breaker_open());
    assert_eq!(store.calls.load(Ordering::SeqCst), 3);
    assert_eq!(search(&limiter).await.source, DecisionSource::Store);
    let text = limiter.render_metrics();
    assert!(text.contains("slidegate_requests_fail_open_total{rule=\"search\"} 102\n"), "{text}");
    assert!(text.contains("slidegate_store_timeouts_total 2\n"), "{text}");
    assert!(text.contains("slidegate_store_skipped_total 100\n"), "{text}");
    assert!(text.contains("slidegate_store_probes_total 1\n"), "{text}");
}

#[tokio::test(start_paused = true)]
async fn the_fallback_limiter_applies_the_rules_while_the_store_is_down() {
    let store = Arc::new(Switchable::default());
    let limiter = limiter(&store, "fallback = true");
    store.down.store(true, Ordering::SeqCst);
    let verdicts: Vec<_> = [search(&limiter).await, search(&limiter).await, search(&limiter).await].into();
    assert!(verdicts.iter().all(|v| v.source == DecisionSource::Fallback));
    assert_eq!(verdicts.iter().map(|v| v.blocks()).collect::<Vec<_>>(), [false, false, true]);
    assert!(limiter.render_metrics().contains("slidegate_requests_fallback_total{rule=\"search\"} 3\n"));
}

#[tokio::test(start_paused = true)]
async fn fail_closed_rules_block_when_the_store_fails() {
    let store = Arc::new(Switchable::default());
    let limiter = limiter(&store, "on_error = \"deny\"");
    store.down.store(true, Ordering::SeqCst);
    let verdict = search(&limiter).await;
    assert_eq!((verdict.source, verdict.blocks()), (DecisionSource::FailClosed, true));
}

#[tokio::test]
async fn a_peer_addr_extension_inserted_by_any_server_identifies_the_client() {
    let config = Config::parse(RULES, "rules.toml").unwrap();
    let layer = RateLimitLayer::new(RateLimiter::from_config(&config.limiter, MemoryStore::new()).unwrap());
    let app = Router::new().route("/api/search", get(|| async { "results" })).layer(layer);
    for (i, expected) in
        [StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS].into_iter().enumerate()
    {
        let mut request = Request::builder().uri("/api/search").body(Body::empty()).unwrap();
        request.extensions_mut().insert(PeerAddr(format!("203.0.113.7:{}", 1000 + i).parse().unwrap()));
        assert_eq!(app.clone().oneshot(request).await.unwrap().status(), expected);
    }
}

#[tokio::test]
async fn a_grpc_call_is_denied_in_grpc_terms_with_the_rate_limit_headers_as_metadata() {
    let config = Config::parse(RULES, "rules.toml").unwrap();
    let app = app(RateLimiter::from_config(&config.limiter, MemoryStore::new()).unwrap());
    let grpc = || {
        let mut request = Request::builder()
            .uri("/api/search")
            .header("content-type", "application/grpc+proto")
            .body(Body::empty())
            .unwrap();
        request.extensions_mut().insert(ConnectInfo("198.51.100.9:1".parse::<SocketAddr>().unwrap()));
        request
    };
    for _ in 0..2 {
        assert_eq!(app.clone().oneshot(grpc()).await.unwrap().status(), StatusCode::OK);
    }
    let response = app.clone().oneshot(grpc()).await.unwrap();
    // Trailers-only: HTTP 200, the status in the headers, no message.
    assert_eq!(response.status(), StatusCode::OK);
    let headers = response.headers().clone();
    assert_eq!(headers["content-type"], "application/grpc+proto");
    assert_eq!(headers["grpc-status"], "14");
    assert_eq!(headers["grpc-message"], "429 Too Many Requests; retry after 60 s");
    assert_eq!(
        (&headers["retry-after"], &headers["ratelimit"]),
        (&"60".parse().unwrap(), &"\"search\";r=0;t=60".parse().unwrap())
    );
    assert!(axum::body::to_bytes(response.into_body(), 1024).await.unwrap().is_empty());
}

#[test]
fn the_service_hands_out_its_inner_service() {
    let config = Config::parse(RULES, "rules.toml").unwrap();
    let layer = RateLimitLayer::new(RateLimiter::from_config(&config.limiter, MemoryStore::new()).unwrap());
    let mut service = tower::Layer::layer(&layer, vec![1]);
    service.get_mut().push(2);
    assert_eq!(service.get_ref(), &[1, 2]);
    assert_eq!(service.into_inner(), [1, 2]);
}

/// The fallback limiter does not start from zero: an identity that used its
/// whole quota on the store gets nothing more from the fallback until the
/// store's reset time, then the normal quota again.
#[tokio::test(start_paused = true)]
async fn the_fallback_starts_from_what_the_store_last_said_was_left() {
    let store = Arc::new(Switchable::default());
    let limiter = limiter(&store, "fallback = true");
    assert_eq!(search(&limiter).await.source, DecisionSource::Store);
    assert_eq!(search(&limiter).await.source, DecisionSource::Store);
    store.down.store(true, Ordering::SeqCst);
    for _ in 0..5 {
        let verdict = search(&limiter).await;
        assert_eq!((verdict.source, verdict.blocks()), (DecisionSource::Fallback, true));
        // The wait is the store's: until its window is back to the full quota.
        let retry = verdict.decisive().unwrap().decision.retry_after.unwrap();
        assert!(retry > Duration::from_secs(59) && retry <= Duration::from_secs(60), "{retry:?}");
    }
    // Past the store's reset, the fallback applies the rule's quota itself.
    tokio::time::sleep(Duration::from_secs(61)).await;
    let verdicts = [search(&limiter).await, search(&limiter).await, search(&limiter).await];
    assert!(verdicts.iter().all(|v| v.source == DecisionSource::Fallback));
    assert_eq!(verdicts.iter().map(|v| v.blocks()).collect::<Vec<_>>(), [false, false, true]);
}

/// With `instances = 2` each instance's fallback enforces half the limit, so
/// two instances together admit the limit, not twice it; and what the store
/// said was left is halved too.
#[tokio::test(start_paused = true)]
async fn the_fallback_shares_the_quota_among_instances() {
    let store = Arc::new(Switchable::default());
    let unseeded = limiter(&store, "fallback = true\ninstances = 2");
    store.down.store(true, Ordering::SeqCst);
    let verdicts = [search(&unseeded).await, search(&unseeded).await];
    assert!(verdicts.iter().all(|v| v.source == DecisionSource::Fallback));
    assert_eq!(verdicts.iter().map(|v| v.blocks()).collect::<Vec<_>>(), [false, true]);
    // Another identity used 1 of 2 on the store: 1 left, half of it (0) here.
    let store = Arc::new(Switchable::default());
    let seeded = limiter(&store, "fallback = true\ninstances = 2");
    assert_eq!(search(&seeded).await.source, DecisionSource::Store);
    store.down.store(true, Ordering::SeqCst);
    let verdict = search(&seeded).await;
    assert_eq!((verdict.source, verdict.blocks()), (DecisionSource::Fallback, true));
}

/// One slow call amid busy traffic does not open the breaker; when it is open,
/// one decision per trial interval tries the store and the first success
/// closes it, without waiting for the background probe.
#[tokio::test(start_paused = true)]
async fn an_open_breaker_closes_on_the_first_successful_trial() {
    let store = Arc::new(Switchable::default());
    let limiter = limiter(&store, "breaker_trial_interval_ms = 20\non_error = \"allow\"");
    store.down.store(true, Ordering::SeqCst);
    search(&limiter).await;
    search(&limiter).await;
    assert!(limiter.breaker_open());
    store.down.store(false, Ordering::SeqCst);
    assert_eq!(search(&limiter).await.source, DecisionSource::FailOpen);
    tokio::time::sleep(Duration::from_millis(20)).await;
    // The probe is 1 s away; the trial is due now.
    assert_eq!(search(&limiter).await.source, DecisionSource::Store);
    assert!(!limiter.breaker_open());
    assert!(limiter.render_metrics().contains("slidegate_breaker_trials_total 1\n"));
}

/// Crawl breadth needs distinct-value sketches: a store without them is
/// refused when the limiter is built, never a limit silently off.
#[test]
fn a_breadth_rule_on_a_store_without_sketches_is_refused() {
    let text =
        "[[rules]]\nname = \"videos\"\npath = \"/v/{id}\"\nlimits = [{ limit = 10, window = \"1m\" }]\n\
                breadth = { distinct = 5, window = \"10m\", of = \"param:id\" }\n";
    let config = Config::parse(text, "t.toml").unwrap();
    let err = RateLimiter::from_config(&config.limiter, Shared(Arc::default())).unwrap_err();
    assert_eq!(
        err.to_string(),
        "rule \"videos\" limits crawl breadth (`breadth`), which this store cannot count: it keeps no distinct-value sketches"
    );
    // The embedded store keeps them.
    assert!(RateLimiter::from_config(&config.limiter, MemoryStore::new()).is_ok());
}
