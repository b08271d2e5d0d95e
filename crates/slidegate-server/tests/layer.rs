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
use slidegate::{MemoryStore, Store, StoreError, Unavailable};
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
            return Err(StoreError::Unavailable(Unavailable::UnexpectedReply("switched off".into())));
        }
        store.memory.decide_sync(request)
    }

    /// Never: the test switches it off or hangs it.
    fn decide_now(&self, _request: slidegate::Request<'_>) -> Option<Result<slidegate::Outcome, StoreError>> {
        None
    }

    fn distinct(&self) -> Option<impl slidegate::DistinctStore + '_> {
        None::<slidegate::NoDistinct>
    }

    fn tables(&self) -> Option<impl slidegate::SharedTables + '_> {
        None::<slidegate::NoTables>
    }

    fn leases(&self) -> Option<impl slidegate::LeaseStore + '_> {
        None::<slidegate::NoLeases>
    }

    fn joint(&self) -> Option<impl slidegate::JointStore + '_> {
        None::<slidegate::NoJoint>
    }

    async fn lift_penalty(
        &self,
        identity: &slidegate::Identity,
        _deadline: Option<std::time::Instant>,
    ) -> Result<Option<std::time::Duration>, StoreError> {
        self.0.memory.lift_penalty_sync(identity)
    }

    fn has_outages(&self) -> bool {
        true
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
    use slidegate_http::grpc::GrpcDenialStatus;
    let config = Config::parse(RULES, "rules.toml").unwrap();
    let app = |denial| {
        let limiter = RateLimiter::from_config(&config.limiter, MemoryStore::new()).unwrap();
        Router::new()
            .route("/api/search", axum::routing::post(|| async { "results" }).get(|| async { "results" }))
            .layer(RateLimitLayer::new(limiter).grpc_denial(denial))
            .layer(middleware::map_request(peer_addr))
    };
    let call = |method: Method| {
        let mut request = Request::builder()
            .method(method)
            .uri("/api/search")
            .header("content-type", "application/grpc+proto")
            .body(Body::empty())
            .unwrap();
        request.extensions_mut().insert(ConnectInfo("198.51.100.9:1".parse::<SocketAddr>().unwrap()));
        request
    };
    for (denial, code) in [(GrpcDenialStatus::ResourceExhausted, "8"), (GrpcDenialStatus::Unavailable, "14")]
    {
        let app = app(denial);
        for _ in 0..2 {
            assert_eq!(app.clone().oneshot(call(Method::POST)).await.unwrap().status(), StatusCode::OK);
        }
        let response = app.clone().oneshot(call(Method::POST)).await.unwrap();
        // Trailers-only: HTTP 200, the status in the headers, no message.
        assert_eq!(response.status(), StatusCode::OK);
        let headers = response.headers().clone();
        assert_eq!(headers["content-type"], "application/grpc+proto", "the call's own content type");
        assert_eq!(headers["grpc-status"], code);
        assert_eq!(headers["grpc-message"], "policy \"search\" allows 2 requests per 60 s; retry in 60 s");
        assert_eq!(
            (&headers["retry-after"], &headers["ratelimit"]),
            (&"60".parse().unwrap(), &"\"search\";r=0;t=60".parse().unwrap())
        );
        assert!(axum::body::to_bytes(response.into_body(), 1024).await.unwrap().is_empty());
        // A GET claiming gRPC is no gRPC call: HTTP's 429, which no cache
        // stores as a success.
        let response = app.clone().oneshot(call(Method::GET)).await.unwrap();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers().get("grpc-status"), None);
    }
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

// ------------------------------------------------ charged after the response

const PRICED: &str = r#"
[[rules]]
name = "priced"
path = "/api/priced/*"
limits = [{ limit = 10, window = "60s", algorithm = "sliding_log" }]
cost_header = "x-ratelimit-cost"
max_cost = 4
max_in_flight = 2

[[rules]]
name = "probes"
path = "/api/probe/*"
limits = [{ limit = 10, window = "60s", algorithm = "sliding_log" }]
count_status = [404]
"#;

/// `/api/priced/slow` and `/api/probe/slow` never answer (their client can
/// only hang up), counting the calls that reached them in `reached`;
/// `/api/priced/free` costs 0, `/api/priced/fast` says 5 (clamped to 4);
/// `/api/probe/found` is a 200 (free), every other probe a 404.
fn priced_app(reached: &Arc<AtomicUsize>) -> Router {
    let config = Config::parse(PRICED, "priced.toml").unwrap();
    let limiter = RateLimiter::from_config(&config.limiter, MemoryStore::new()).unwrap();
    let slow = |reached: Arc<AtomicUsize>| {
        get(move || async move {
            reached.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<&'static str>().await
        })
    };
    Router::new()
        .route("/api/priced/slow", slow(Arc::clone(reached)))
        .route("/api/probe/slow", slow(Arc::clone(reached)))
        .route("/api/probe/found", get(|| async { "found" }))
        .route("/api/priced/free", get(|| async { ([("x-ratelimit-cost", "0")], "cached") }))
        .route("/api/priced/fast", get(|| async { ([("x-ratelimit-cost", "5")], "results") }))
        .route("/api/probe/priced", get(|| async { ([("x-ratelimit-cost", "7")], "probed") }))
        .route("/elsewhere/priced", get(|| async { ([("x-ratelimit-cost", "7")], "unlimited") }))
        .layer(RateLimitLayer::new(limiter))
        .layer(middleware::map_request(peer_addr))
}

const CLIENT: &str = "203.0.113.9:5000";

/// A request whose client hangs up after 20 ms, before any answer.
async fn hang_up(app: &Router, path: &str) {
    let mut request = Request::builder().uri(path).body(Body::empty()).unwrap();
    request.extensions_mut().insert(ConnectInfo(CLIENT.parse::<SocketAddr>().unwrap()));
    let answer = tokio::time::timeout(Duration::from_millis(20), app.clone().oneshot(request)).await;
    assert!(answer.is_err(), "the slow route answered");
}

/// The `r=` of a response's `RateLimit`.
fn left(headers: &HeaderMap) -> Option<u64> {
    let value = headers.get("ratelimit")?.to_str().ok()?;
    value.split(';').find_map(|p| p.strip_prefix("r=")).and_then(|r| r.parse().ok())
}

/// Waits (a bounded number of short sleeps) until `path`, which costs
/// nothing, shows `expected` left: a hung-up request is charged in a task.
async fn wait_for_left(app: &Router, path: &str, expected: u64) {
    let mut seen = None;
    for _ in 0..500 {
        seen = left(&call(app, path, CLIENT).await.1);
        if seen == Some(expected) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("{path}: {seen:?} left, expected {expected}");
}

/// Before: nothing was charged (10 left): the charge waited for an answer
/// that the dropped future would never give.
#[tokio::test]
async fn a_hung_up_request_is_charged_the_most_its_answer_could_cost() {
    let reached = Arc::new(AtomicUsize::new(0));
    let app = priced_app(&reached);
    wait_for_left(&app, "/api/priced/free", 10).await;
    hang_up(&app, "/api/priced/slow").await;
    assert_eq!(reached.load(Ordering::SeqCst), 1);
    // max_cost, not what a finished answer might have said.
    wait_for_left(&app, "/api/priced/free", 6).await;
    // A rule counting statuses: the answer might have been a 404, so 1.
    let (status, headers) = call(&app, "/api/probe/none", CLIENT).await;
    assert_eq!((status, left(&headers)), (StatusCode::NOT_FOUND, Some(9)), "no route: a 404, counted");
    hang_up(&app, "/api/probe/slow").await;
    wait_for_left(&app, "/api/probe/found", 8).await;
    assert_eq!(reached.load(Ordering::SeqCst), 2);
}

/// `max_in_flight = 2`: a third request of the identity while two are in
/// flight gets 429 and never reaches the inner service; when one ends,
/// the identity may send again. Before: `max_in_flight` was an unknown key.
#[tokio::test]
async fn at_most_max_in_flight_requests_of_one_identity_reach_the_inner_service() {
    let reached = Arc::new(AtomicUsize::new(0));
    let app = priced_app(&reached);
    let held: Vec<_> = (0..2)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { call(&app, "/api/priced/slow", CLIENT).await })
        })
        .collect();
    for _ in 0..500 {
        if reached.load(Ordering::SeqCst) == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(reached.load(Ordering::SeqCst), 2);
    let mut request = Request::builder().uri("/api/priced/slow").body(Body::empty()).unwrap();
    request.extensions_mut().insert(ConnectInfo(CLIENT.parse::<SocketAddr>().unwrap()));
    let refused = tokio::time::timeout(Duration::from_secs(5), app.clone().oneshot(request))
        .await
        .expect("an answer: the third request must not reach the inner service")
        .unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "1");
    assert_eq!(refused.headers()["ratelimit"], "\"priced\";r=10;t=0");
    let body = axum::body::to_bytes(refused.into_body(), 4096).await.unwrap();
    let body = String::from_utf8_lossy(&body);
    assert!(
        body.contains("at most 2 requests of one client may be in flight under rule \\\"priced\\\""),
        "{body}"
    );
    assert_eq!(reached.load(Ordering::SeqCst), 2, "the third never reached the inner service");
    // Another client is not held back.
    assert_eq!(call(&app, "/api/priced/fast", "203.0.113.10:5000").await.0, StatusCode::OK);
    // One hangs up: it is charged 4, and its place is free again.
    held[0].abort();
    wait_for_left(&app, "/api/priced/free", 6).await;
    held[1].abort();
    wait_for_left(&app, "/api/priced/free", 2).await;
}

/// Before: the client received `x-ratelimit-cost: 5`.
#[tokio::test]
async fn the_inner_services_cost_header_is_not_passed_to_the_client() {
    let reached = Arc::new(AtomicUsize::new(0));
    let app = priced_app(&reached);
    let (status, headers) = call(&app, "/api/priced/fast", CLIENT).await;
    assert_eq!((status, left(&headers)), (StatusCode::OK, Some(6)), "charged 5, clamped to max_cost 4");
    assert_eq!(headers.get("x-ratelimit-cost"), None);
    let (status, headers) = call(&app, "/api/priced/free", CLIENT).await;
    assert_eq!((status, headers.get("x-ratelimit-cost")), (StatusCode::OK, None));
}

/// In shadow mode a request over `max_in_flight` is let through, counted as
/// a shadow denial, and still charged when its answer comes; an enforced
/// rule's refusal is counted as a denial, not as the peek that allowed it.
#[tokio::test]
async fn max_in_flight_refusals_are_counted_and_shadow_rules_let_them_through() {
    let rules = |shadow: bool| {
        format!(
            "[[rules]]\nname = \"s\"\npath = \"/s\"\nshadow = {shadow}\n\
             limits = [{{ limit = 10, window = \"60s\", algorithm = \"sliding_log\" }}]\n\
             cost_header = \"x-cost\"\nmax_cost = 5\nmax_in_flight = 1\n"
        )
    };
    let peer = Some("192.0.2.1".parse().unwrap());
    let mut priced = HeaderMap::new();
    priced.insert("x-cost", "3".parse().unwrap());
    for shadow in [false, true] {
        let config = Config::parse(&rules(shadow), "s.toml").unwrap();
        let limiter = RateLimiter::from_config(&config.limiter, MemoryStore::new()).unwrap();
        let mut first = limiter.check_request(&Method::GET, "/s", &HeaderMap::new(), peer).await.unwrap();
        assert!(first.allowed() && first.over_in_flight().is_none());
        let first = first.take_pending().unwrap();
        let mut second = limiter.check_request(&Method::GET, "/s", &HeaderMap::new(), peer).await.unwrap();
        assert_eq!((second.allowed(), second.blocks(), second.over_in_flight()), (false, !shadow, Some(1)));
        let counters = limiter.metrics().rule(0);
        let (allowed, denied, shadow_denied) = (
            counters.allowed.load(Ordering::Relaxed),
            counters.denied.load(Ordering::Relaxed),
            counters.shadow_denied.load(Ordering::Relaxed),
        );
        assert_eq!((allowed, denied, shadow_denied), (1, u64::from(!shadow), u64::from(shadow)));
        // Enforced: nothing to charge. Shadow: charged like any other.
        let second = second.take_pending();
        assert_eq!(second.is_some(), shadow);
        let charged = limiter.charge_response(&first, StatusCode::OK, &priced).await.unwrap();
        assert_eq!(charged.policies[0].decision.remaining, 7);
        if let Some(second) = second {
            let charged = limiter.charge_response(&second, StatusCode::OK, &priced).await.unwrap();
            assert_eq!(charged.policies[0].decision.remaining, 4);
        }
        // Both places are free again.
        drop(first);
        let mut third = limiter.check_request(&Method::GET, "/s", &HeaderMap::new(), peer).await.unwrap();
        assert!(third.allowed() && third.take_pending().is_some(), "shadow {shadow}");
    }
}

/// The store's clock on tokio's paused one (epoch-aligned to the second).
struct TokioClock(tokio::time::Instant);

impl slidegate::Clock for TokioClock {
    fn now_ms(&self) -> u64 {
        1_700_000_000_000 + self.0.elapsed().as_millis() as u64
    }
}

/// A rule's `delay` through the tower layer: the third request of a
/// 2-a-second rule is held 500 ms inside the layer's future and answered
/// 200 by the inner service; a fourth, beyond its identity's queue of one,
/// gets 429 at once.
#[tokio::test(start_paused = true)]
async fn the_layer_holds_a_request_its_rule_delays() {
    let config = Config::parse(
        r#"
[[rules]]
name = "sync"
path = "/api/sync"
limits = [{ limit = 2, window = "1s", algorithm = "gcra" }]
delay = { max_wait = "600ms", per_identity = 1 }
"#,
        "t.toml",
    )
    .unwrap();
    let store = MemoryStore::with_clock(TokioClock(tokio::time::Instant::now()));
    let limiter = RateLimiter::from_config(&config.limiter, store).unwrap();
    let app = Router::new()
        .route("/api/sync", get(|| async { "synced" }))
        .layer(RateLimitLayer::new(limiter.clone()))
        .layer(middleware::map_request(peer_addr));
    let start = tokio::time::Instant::now();
    for _ in 0..2 {
        assert_eq!(call(&app, "/api/sync", "198.51.100.7:1000").await.0, StatusCode::OK);
    }
    let held = tokio::spawn({
        let app = app.clone();
        async move { call(&app, "/api/sync", "198.51.100.7:1000").await.0 }
    });
    while limiter.delayed_now() == 0 {
        tokio::task::yield_now().await;
    }
    let (status, headers) = call(&app, "/api/sync", "198.51.100.7:1000").await;
    assert_eq!((status, headers["retry-after"].to_str().unwrap()), (StatusCode::TOO_MANY_REQUESTS, "1"));
    assert_eq!(start.elapsed(), Duration::ZERO, "refused at once");
    assert_eq!(held.await.unwrap(), StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::from_millis(500));
    assert!(limiter.render_metrics().contains("slidegate_requests_delayed_total{rule=\"sync\"} 1\n"));
}

/// The cost header is the inner service's word to the layer, on every
/// response. Before: only responses of the rule with `cost_header` lost it.
#[tokio::test]
async fn the_cost_header_is_stripped_from_every_response_whichever_rule_matched() {
    let app = priced_app(&Arc::default());
    let (status, headers) = call(&app, "/api/priced/fast", CLIENT).await;
    assert_eq!((status, headers.get("x-ratelimit-cost"), left(&headers)), (StatusCode::OK, None, Some(6)));
    // A path of another rule (count_status only), and a path of no rule.
    let (status, headers) = call(&app, "/api/probe/priced", CLIENT).await;
    assert_eq!((status, headers.get("x-ratelimit-cost"), left(&headers)), (StatusCode::OK, None, Some(10)));
    let (status, headers) = call(&app, "/elsewhere/priced", CLIENT).await;
    assert_eq!((status, headers.get("x-ratelimit-cost"), left(&headers)), (StatusCode::OK, None, None));
}
