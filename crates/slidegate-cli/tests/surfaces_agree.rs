//! The tower layer in an axum app and `slidegate serve`, under the same
//! rules, answer the same requests the same way: one table of requests
//! (allowed, denied, listed, an ambiguous API key, a refused path, a key
//! header spelled with underscores, gRPC calls by POST and a GET claiming
//! gRPC, over cost, delayed) sent to both, in the same order; status, the rate limit
//! headers, the gRPC status and message, and every answer slidegate makes
//! itself compared byte for byte. Both run [`RateLimiter::admit`].

#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;

use axum::extract::ConnectInfo;
use axum::Router;
use common::{config_head, request, Reply, Slidegate, Upstream, SECRET_ENV};
use slidegate::MemoryStore;
use slidegate_http::{RateLimitLayer, RateLimiter};
use slidegate_server::Config;

/// The rules both surfaces decide by; `{keys}` is the deny list's key file.
const RULES: &str = r#"
[identity]
api_key_header = "x-api-key"
ip_hash_secret_env = "SECRET"

[lists]
deny = { keys_file = "{keys}" }

[[rules]]
name = "search"
path = "/api/search*"
limits = [{ limit = 5, window = "10s", algorithm = "sliding_log" }]

[[rules]]
name = "heavy"
path = "/api/heavy"
limits = [{ limit = 3, window = "10s", cost = 2, algorithm = "sliding_log" }]

[[rules]]
name = "paced"
path = "/api/paced"
limits = [{ limit = 10, window = "1s", algorithm = "gcra" }]
delay = { max_wait = "500ms", per_identity = 1 }
"#;

/// The headers compared on every answer: what the limiter or slidegate's
/// own answer sets. (`date` differs; the body of an allowed request is the
/// inner service's or the upstream's own.)
const COMPARED: [&str; 9] = [
    "ratelimit",
    "ratelimit-policy",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "retry-after",
    "grpc-status",
    "grpc-message",
    "cache-control",
];

/// The layer's side: an axum app answering `ok` on every path, behind
/// `RateLimitLayer` reading axum's `ConnectInfo`, on a thread of its own.
fn layer_app(rules: &str) -> SocketAddr {
    let env = |name: &str| (name == "SECRET").then(|| "agreement".to_owned());
    let config = Config::parse_with_env(rules, "rules.toml", &env).unwrap();
    let limiter = RateLimiter::from_config(&config.limiter, MemoryStore::new()).unwrap();
    let layer =
        RateLimitLayer::new(limiter).peer_from(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0));
    let app = Router::new().fallback(|| async { "ok" }).layer(layer);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await.unwrap();
        });
    });
    addr
}

/// What must agree in one answer: the status, each compared header's
/// value, and the body when slidegate wrote it.
type Seen = (u16, Vec<(&'static str, Option<String>)>, Option<String>);

/// Whether two renderings of one answer agree: the same bytes, except that
/// a number of seconds left (`t=`, a whole `x-ratelimit-reset` or
/// `retry-after` value, "retry in N s") may differ by one, since each
/// surface reads its own clock a moment apart and rounds up to the second.
/// Every other number (`r=`, `q=`, a status) must be equal.
fn agree(name: &str, a: &str, b: &str) -> bool {
    let whole_seconds = matches!(name, "retry-after" | "x-ratelimit-reset");
    let split = |s: &str| {
        let mut parts: Vec<String> = Vec::new();
        for c in s.chars() {
            match parts.last_mut() {
                Some(last) if last.chars().all(|d| d.is_ascii_digit()) == c.is_ascii_digit() => last.push(c),
                _ => parts.push(c.to_string()),
            }
        }
        parts
    };
    let (a, b) = (split(a), split(b));
    a.len() == b.len()
        && a.iter().zip(&b).enumerate().all(|(i, (x, y))| {
            if x == y {
                return true;
            }
            let before = if i == 0 { "" } else { a[i - 1].as_str() };
            let seconds = whole_seconds || before.ends_with("t=") || before.ends_with("retry in ");
            match (x.parse::<u64>(), y.parse::<u64>()) {
                (Ok(x), Ok(y)) => seconds && x.abs_diff(y) <= 1,
                _ => false,
            }
        })
}

/// Whether two answers agree: see [`agree`].
fn answers_agree(a: &Seen, b: &Seen) -> bool {
    let same = |name: &str, x: &Option<String>, y: &Option<String>| match (x, y) {
        (Some(x), Some(y)) => agree(name, x, y),
        (x, y) => x == y,
    };
    a.0 == b.0 && a.1.iter().zip(&b.1).all(|((name, x), (_, y))| same(name, x, y)) && same("body", &a.2, &b.2)
}

/// One request of the table: what it is, method, target, headers.
type Case<'a> = (&'a str, &'a str, &'a str, Vec<(&'a str, &'a str)>);

/// What must agree in one answer.
fn seen(reply: &Reply) -> Seen {
    let headers = COMPARED.iter().map(|name| (*name, reply.header(name).map(str::to_owned))).collect();
    // A body slidegate wrote (a problem, an empty gRPC answer) is compared
    // too, with its content type; an admitted request's is the service's own.
    let own = reply.status != 200 || reply.header("grpc-status").is_some();
    let content_type = reply.header("content-type").unwrap_or_default();
    (reply.status, headers, own.then(|| format!("{content_type}\n{}", reply.body)))
}

#[test]
fn the_layer_and_serve_answer_every_request_alike() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("deny.txt");
    std::fs::write(&keys, "sk-banned\n").unwrap();
    let rules = RULES.replace("{keys}", &keys.display().to_string());
    let upstream = Upstream::start();
    let served = rules.replace("\"SECRET\"", &format!("\"{SECRET_ENV}\""));
    let serve = Slidegate::start(&format!("{}{served}", config_head(upstream.addr, "", "")));
    let layer = layer_app(&rules);

    let grpc: &[(&str, &str)] = &[("content-type", "application/grpc"), ("te", "trailers")];
    // (what, method, target, headers), sent to both in this order.
    let table: Vec<Case<'_>> = vec![
        ("allowed, anonymous", "GET", "/api/search?q=1", vec![]),
        ("allowed, a key", "GET", "/api/search", vec![("x-api-key", "sk-one")]),
        ("an unmatched path", "GET", "/elsewhere", vec![]),
        ("a refused path", "GET", "/api/search%00.png", vec![]),
        (
            "an ambiguous key, two lines",
            "GET",
            "/api/search",
            vec![("x-api-key", "sk-a"), ("x-api-key", "sk-b")],
        ),
        ("an ambiguous key, a comma", "GET", "/api/search", vec![("x-api-key", "sk-a, sk-b")]),
        ("a refused path of a gRPC call", "POST", "/api/search%00x", grpc.to_vec()),
        ("listed", "GET", "/api/search", vec![("x-api-key", "sk-banned")]),
        ("listed, gRPC", "POST", "/api/search", [grpc, &[("x-api-key", "sk-banned")]].concat()),
        ("an underscore spelling: anonymous", "GET", "/api/search", vec![("x_api_key", "sk-one")]),
        ("allowed, anonymous, 3 of 5", "GET", "/api/search", vec![]),
        ("allowed, a gRPC call, 4 of 5", "POST", "/api/search", grpc.to_vec()),
        ("allowed, 5 of 5", "GET", "/api/search", vec![]),
        ("denied", "GET", "/api/search", vec![]),
        ("denied, a gRPC call", "POST", "/api/search", grpc.to_vec()),
        ("denied, a GET claiming gRPC", "GET", "/api/search", grpc.to_vec()),
        ("denied, gRPC in capitals", "POST", "/api/search", vec![("content-type", "Application/GRPC+proto")]),
        ("denied, gRPC-Web", "POST", "/api/search", vec![("content-type", "application/grpc-web+proto")]),
        ("the key still has room", "GET", "/api/search", vec![("x-api-key", "sk-one")]),
        ("a request costing 2 of 3", "GET", "/api/heavy", vec![]),
        ("over cost: 2 asked, 1 left", "GET", "/api/heavy", vec![]),
        ("over cost, a gRPC call", "POST", "/api/heavy", grpc.to_vec()),
        ("paced: the first", "GET", "/api/paced", vec![("x-api-key", "sk-paced")]),
        ("paced: delayed, then allowed", "GET", "/api/paced", vec![("x-api-key", "sk-paced")]),
    ];
    for (what, method, target, headers) in &table {
        let body: &[u8] = if *method == "POST" { b"\0\0\0\0\0" } else { b"" };
        let by_serve = request(serve.addr, method, target, headers, body);
        let by_layer = request(layer, method, target, headers, body);
        if what.starts_with("paced: delayed") {
            // Held for the pace, then answered: when each surface's store
            // reads the clock differs by the hold, so the headers' numbers
            // may too; the answer and the headers present may not.
            assert_eq!(by_serve.status, 200, "{what}: {by_serve:?}");
            assert_eq!(by_layer.status, 200, "{what}: {by_layer:?}");
            let present = |r: &Reply| COMPARED.iter().filter(|n| r.header(n).is_some()).count();
            assert_eq!(present(&by_serve), present(&by_layer), "{what}");
            assert_eq!(by_serve.header("ratelimit-policy"), Some("\"paced\";q=10;w=1"), "{what}");
            continue;
        }
        let (a, b) = (seen(&by_serve), seen(&by_layer));
        assert!(answers_agree(&a, &b), "{what}:\nserve {by_serve:?}\nlayer {by_layer:?}");
    }

    // The table says what it should: the cases are the ones named.
    let status = |target: &str, headers: &[(&str, &str)], method: &str| {
        let body: &[u8] = if method == "POST" { b"\0\0\0\0\0" } else { b"" };
        let reply = request(layer, method, target, headers, body);
        (reply.status, reply.header("grpc-status").map(str::to_owned))
    };
    assert_eq!(status("/api/search", &[], "GET"), (429, None));
    assert_eq!(status("/api/search", grpc, "POST"), (200, Some("8".to_owned())));
    assert_eq!(status("/api/search", grpc, "GET"), (429, None));
    let web =
        request(layer, "POST", "/api/search", &[("content-type", "application/grpc-web")], b"\0\0\0\0\0");
    assert_eq!(web.header("content-type"), Some("application/grpc-web"), "the call's own content type");
    assert_eq!(status("/api/search", &[("x-api-key", "sk-banned")], "GET"), (403, None));
    assert_eq!(status("/api/search", &[("x-api-key", "a"), ("x-api-key", "b")], "GET"), (400, None));
    assert_eq!(status("/api/search%00", grpc, "POST"), (200, Some("3".to_owned())));
    assert_eq!(status("/api/heavy", &[], "GET"), (429, None));
}

#[test]
fn only_seconds_left_may_differ_by_one() {
    let rl = |a, b| agree("ratelimit", a, b);
    assert!(rl("\"search\";r=3;t=10", "\"search\";r=3;t=10"));
    assert!(rl("\"search\";r=3;t=10", "\"search\";r=3;t=9"));
    assert!(!rl("\"search\";r=3;t=10", "\"search\";r=2;t=10"), "what is left is exact");
    assert!(!rl("\"search\";r=3;t=10", "\"search\";r=3;t=8"));
    assert!(agree("retry-after", "60", "59"));
    assert!(!agree("x-ratelimit-remaining", "3", "2"), "a count is exact");
    assert!(!agree("ratelimit-policy", "\"search\";q=5;w=10", "\"search\";q=5;w=11"), "a window is exact");
    let body = |a, b| agree("body", a, b);
    assert!(body("allows 5 requests per 10 s; retry in 7 s", "allows 5 requests per 10 s; retry in 8 s"));
    assert!(!body("allows 5 requests per 10 s; retry in 7 s", "allows 6 requests per 10 s; retry in 7 s"));
}
