//! Work charged after the response (`cost_header`, `count_status`): a client
//! that hangs up before the upstream answers must pay what the upstream did,
//! and one identity may not hold more than `max_in_flight` such requests at
//! the upstream at once. Ordinary rules, charged before forwarding, are
//! checked against the same hang-ups. The upstream's cost header is its word
//! to slidegate, never passed on to the client.

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

use crate::common::*;

/// How long the upstream takes for `/slow/` paths.
const SLOW: Duration = Duration::from_millis(300);
/// When the client hangs up: well before the upstream answers.
const HANG_UP: Duration = Duration::from_millis(100);

/// An upstream that is slow where the tests need it: `/api/search/slow/*`
/// answers after [`SLOW`] with `x-ratelimit-cost: 5`; `/api/search/held/*`
/// answers (cost 5) once [`SlowUpstream::release`] is called;
/// `/api/search/free/*` answers at once with cost 0 (a peek at what is left);
/// `/api/search/fast/*` at once with cost 5; `/api/plain/slow/*` after
/// [`SLOW`] and `/api/plain/*` at once, without a cost, except any path
/// with `/priced/` (cost 7, whatever rule it falls under); any path with
/// `/held/` waits for the release too, and any with `/missing/` is a 404
/// (for the rule `probes`, which counts 404s). `hits` counts the
/// requests that reached it, except the free ones.
struct SlowUpstream {
    addr: SocketAddr,
    hits: Arc<AtomicUsize>,
    held: Arc<(Mutex<bool>, Condvar)>,
}

impl SlowUpstream {
    fn start() -> SlowUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        let held = Arc::new((Mutex::new(false), Condvar::new()));
        let (h, g) = (Arc::clone(&hits), Arc::clone(&held));
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let (h, g) = (Arc::clone(&h), Arc::clone(&g));
                thread::spawn(move || serve_slowly(stream, &h, &g));
            }
        });
        SlowUpstream { addr, hits, held }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    /// Lets every held request (and every later one) be answered.
    fn release(&self) {
        let (lock, wake) = &*self.held;
        *lock.lock().unwrap() = true;
        wake.notify_all();
    }
}

fn serve_slowly(stream: TcpStream, hits: &AtomicUsize, held: &(Mutex<bool>, Condvar)) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    while let Some((request_line, headers)) = read_head(&mut reader) {
        let target = request_line.split(' ').nth(1).unwrap_or("").to_owned();
        read_body(&mut reader, &headers);
        if !target.starts_with("/api/search/free") {
            hits.fetch_add(1, Ordering::SeqCst);
        }
        let cost = if target.starts_with("/api/search/free") {
            "x-ratelimit-cost: 0\r\n"
        } else if target.starts_with("/api/search") {
            "x-ratelimit-cost: 5\r\n"
        } else if target.contains("/priced/") {
            "x-ratelimit-cost: 7\r\n"
        } else {
            ""
        };
        if target.contains("/slow/") {
            thread::sleep(SLOW);
        }
        if target.contains("/held/") {
            let (lock, wake) = held;
            let mut released = lock.lock().unwrap();
            while !*released {
                released = wake.wait(released).unwrap();
            }
        }
        let status = if target.contains("/missing/") { "404 Not Found" } else { "200 OK" };
        let head = format!("HTTP/1.1 {status}\r\ncontent-length: 2\r\n{cost}\r\n");
        if writer.write_all(head.as_bytes()).and_then(|()| writer.write_all(b"ok")).is_err() {
            return;
        }
    }
}

/// Sends a GET of `target` with API key `key`, then hangs up after `after`
/// without reading anything.
fn hang_up(addr: SocketAddr, target: &str, key: &str, after: Duration) {
    let mut stream = TcpStream::connect(addr).unwrap();
    let head = format!("GET {target} HTTP/1.1\r\nhost: {addr}\r\nx-api-key: {key}\r\n\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    thread::sleep(after);
    drop(stream);
}

/// `n` clients at once, each sending `target` and hanging up after [`HANG_UP`].
fn hang_up_all(addr: SocketAddr, target: &str, key: &str, n: usize) {
    let clients: Vec<_> = (0..n)
        .map(|i| {
            let (target, key) = (format!("{target}{i}"), key.to_owned());
            thread::spawn(move || hang_up(addr, &target, &key, HANG_UP))
        })
        .collect();
    for client in clients {
        client.join().unwrap();
    }
}

/// What `key` has left under the search rule, asked with a request the
/// upstream prices 0 (so asking charges nothing).
fn search_left(gate: &Slidegate, key: &str) -> Option<u64> {
    remaining(&gate.get("/api/search/free/x", &[("x-api-key", key)]))
}

/// Waits until `key` has `left` permits under the search rule: the charges
/// of requests whose clients hung up land when the upstream answers.
fn wait_for_search_left(gate: &Slidegate, key: &str, left: u64) {
    wait_for(&format!("{key} to have {left} left"), Duration::from_secs(20), || {
        search_left(gate, key) == Some(left)
    });
}

fn gate(upstream: &SlowUpstream, store: &str, search: &str, plain_limit: u64) -> Slidegate {
    Slidegate::start(&format!(
        r#"{head}
[[rules]]
name = "search"
path = "/api/search/*"
limits = [{{ limit = 10, window = "60s", algorithm = "sliding_log" }}]
cost_header = "x-ratelimit-cost"
max_cost = 10
{search}

[[rules]]
name = "plain"
path = "/api/plain/*"
limits = [{{ limit = {plain_limit}, window = "60s", algorithm = "sliding_log" }}]

[[rules]]
name = "probes"
path = "/api/probe/*"
limits = [{{ limit = 10, window = "60s", algorithm = "sliding_log" }}]
count_status = [404]
"#,
        head = keyed_head(upstream.addr, "", store),
    ))
}

fn hung_up_requests_pay_what_the_upstream_did(store: &str) {
    let upstream = SlowUpstream::start();
    let gate = gate(&upstream, store, "", 100);
    assert_eq!(search_left(&gate, "k"), Some(10));
    // One client hangs up before its answer: the upstream still did the
    // work, priced 5.
    hang_up(gate.addr, "/api/search/slow/1", "k", HANG_UP);
    wait_for("the upstream to answer", Duration::from_secs(20), || upstream.hits() == 1);
    wait_for_search_left(&gate, "k", 5);
    // 40 more at once, held at the upstream until every client has hung up
    // (so no place in flight frees early): at most `max_in_flight` (8 by
    // default) reach the upstream, and what they cost exhausts the limit.
    hang_up_all(gate.addr, "/api/search/held/", "k", 40);
    upstream.release();
    wait_for_search_left(&gate, "k", 0);
    let reached = upstream.hits() - 1;
    assert_eq!(reached, 8, "8 of 40 reached the upstream");
    let denied = gate.get("/api/search/fast/1", &[("x-api-key", "k")]);
    assert_eq!((denied.status, remaining(&denied)), (429, Some(0)));
    assert_eq!(upstream.hits() - 1, 8, "the denial never reached the upstream");
}

/// Before: the identity still had all 10 permits (the charge ran in the
/// handler hyper dropped when the client hung up), and all 40 hung-up
/// requests did their work at the upstream.
#[test]
fn hung_up_requests_pay_what_the_upstream_did_embedded() {
    hung_up_requests_pay_what_the_upstream_did("");
}

#[test]
fn hung_up_requests_pay_what_the_upstream_did_on_redis() {
    let redis = RedisServer::spawn();
    hung_up_requests_pay_what_the_upstream_did(&redis_decides(&redis));
}

/// `n` requests of API key `k`, each from its own thread, held at the
/// upstream (until [`SlowUpstream::release`]) once this returns.
fn hold(gate: &Slidegate, upstream: &SlowUpstream, n: usize) -> Vec<thread::JoinHandle<Reply>> {
    let addr = gate.addr;
    let held = (0..n)
        .map(|i| thread::spawn(move || get(addr, &format!("/api/search/held/{i}"), &[("x-api-key", "k")])))
        .collect();
    wait_for(&format!("{n} requests held at the upstream"), Duration::from_secs(5), || upstream.hits() == n);
    held
}

/// K + 1 requests of one identity at once on a rule charged after the
/// response: exactly K reach the upstream, the other gets 429 with the
/// usual headers; once they are answered, the identity may send again.
#[test]
fn at_most_max_in_flight_requests_of_one_identity_reach_the_upstream() {
    let upstream = SlowUpstream::start();
    let gate = gate(&upstream, "", "max_in_flight = 3", 100);
    let held = hold(&gate, &upstream, 3);
    let refused = gate.get("/api/search/held/4", &[("x-api-key", "k")]);
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(upstream.hits(), 3, "the fourth never reached the upstream");
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(refused.header("content-type"), Some("application/problem+json"));
    assert_eq!(refused.header("ratelimit-policy"), Some("\"search\";q=10;w=60"));
    assert_eq!(refused.header("ratelimit"), Some("\"search\";r=10;t=0"));
    assert!(refused.body.contains("at most 3 requests"), "{}", refused.body);
    // Another identity is not held back.
    let other = gate.get("/api/search/fast/1", &[("x-api-key", "other")]);
    assert_eq!((other.status, remaining(&other)), (200, Some(5)));
    upstream.release();
    for reply in held {
        assert_eq!(reply.join().unwrap().status, 200);
    }
    // The three charged 5 each against 10: the limit is spent, and the
    // refusal says so now rather than the in-flight bound.
    let after = gate.get("/api/search/held/5", &[("x-api-key", "k")]);
    assert_eq!((after.status, remaining(&after)), (429, Some(0)));
    assert!(!after.body.contains("in flight"), "{}", after.body);
}

/// Without `max_in_flight`, a rule charged after the response admits 8
/// requests of one identity at once. Before: all 9 reached the upstream.
#[test]
fn the_default_in_flight_bound_of_a_rule_charged_after_the_response_is_8() {
    let upstream = SlowUpstream::start();
    let gate = gate(&upstream, "", "", 100);
    let held = hold(&gate, &upstream, 8);
    let ninth = gate.get("/api/search/held/9", &[("x-api-key", "k")]);
    assert_eq!((ninth.status, upstream.hits()), (429, 8));
    upstream.release();
    let statuses: Vec<u16> = held.into_iter().map(|h| h.join().unwrap().status).collect();
    assert_eq!(statuses, [200; 8]);
}

/// An ordinary rule charges before forwarding: of 10 requests whose
/// clients hang up, exactly `min(10, limit)` reach the upstream and each of
/// them is charged; the others were refused before the hang-up.
fn hung_up_requests_of_an_ordinary_rule(limit: u64) {
    let upstream = SlowUpstream::start();
    let gate = gate(&upstream, "", "", limit);
    hang_up_all(gate.addr, "/api/plain/slow/", "k", 10);
    let reached = limit.min(10);
    wait_for("the upstream to answer", Duration::from_secs(20), || upstream.hits() as u64 == reached);
    let next = gate.get("/api/plain/1", &[("x-api-key", "k")]);
    if limit <= 10 {
        assert_eq!((next.status, remaining(&next)), (429, Some(0)));
    } else {
        assert_eq!((next.status, remaining(&next)), (200, Some(limit - 11)));
    }
    assert_eq!(upstream.hits() as u64, reached + u64::from(limit > 10));
}

#[test]
fn hung_up_requests_of_an_ordinary_rule_under_its_limit_are_each_charged() {
    hung_up_requests_of_an_ordinary_rule(20);
}

/// A rule with `count_status` only: what a hung-up request costs is its
/// status, as the upstream gave it. 4 probes for missing ids (404) and 3
/// for existing ones (200), every client gone before the upstream answers.
fn hung_up_requests_pay_the_status_the_upstream_gave(store: &str) {
    let upstream = SlowUpstream::start();
    let gate = gate(&upstream, store, "", 100);
    let probes_left = || remaining(&gate.get("/api/probe/found", &[("x-api-key", "k")]));
    assert_eq!(probes_left(), Some(10));
    let reached = upstream.hits();
    hang_up_all(gate.addr, "/api/probe/held/missing/", "k", 4);
    hang_up_all(gate.addr, "/api/probe/held/found/", "k", 3);
    wait_for("7 probes at the upstream", Duration::from_secs(20), || upstream.hits() == reached + 7);
    upstream.release();
    wait_for("the 404s to be charged", Duration::from_secs(10), || probes_left() == Some(6));
    // The 200s cost nothing: a probe answered after them still sees 6.
    let after = gate.get("/api/probe/held/found/last", &[("x-api-key", "k")]);
    assert_eq!((after.status, remaining(&after)), (200, Some(6)));
    assert_eq!(probes_left(), Some(6));
}

/// A charge run in the handler hyper drops on a hang-up (as it was before
/// issue 16) would leave the 4 hung-up 404s free: 10 left, not 6.
#[test]
fn hung_up_requests_pay_the_status_the_upstream_gave_embedded() {
    hung_up_requests_pay_the_status_the_upstream_gave("");
}

#[test]
fn hung_up_requests_pay_the_status_the_upstream_gave_on_redis() {
    let redis = RedisServer::spawn();
    hung_up_requests_pay_the_status_the_upstream_gave(&redis_decides(&redis));
}

#[test]
fn hung_up_requests_of_an_ordinary_rule_over_its_limit_reach_the_upstream_limit_times() {
    hung_up_requests_of_an_ordinary_rule(3);
}

/// The cost header is the upstream's word to slidegate. Before: the client
/// received `x-ratelimit-cost: 5`.
#[test]
fn the_upstreams_cost_header_is_not_passed_to_the_client() {
    let upstream = SlowUpstream::start();
    let gate = gate(&upstream, "", "", 100);
    let reply = gate.get("/api/search/fast/1", &[("x-api-key", "k")]);
    assert_eq!((reply.status, remaining(&reply)), (200, Some(5)), "charged 5");
    assert_eq!(reply.header("x-ratelimit-cost"), None, "{:?}", reply.headers);
    // Also when nothing is charged (a cost of 0).
    let free = gate.get("/api/search/free/1", &[("x-api-key", "k")]);
    assert_eq!((free.status, free.header("x-ratelimit-cost")), (200, None));
    // Before: only the responses of the rule with `cost_header` lost it; a
    // path of another rule, or of none, showed the upstream's word.
    let other_rule = gate.get("/api/plain/priced/1", &[("x-api-key", "k")]);
    assert_eq!((other_rule.status, other_rule.header("x-ratelimit-cost")), (200, None));
    assert!(other_rule.header("ratelimit").is_some(), "{:?}", other_rule.headers);
    let no_rule = gate.get("/elsewhere/priced/1", &[("x-api-key", "k")]);
    assert_eq!((no_rule.status, no_rule.header("x-ratelimit-cost")), (200, None));
    assert_eq!(no_rule.header("ratelimit"), None, "{:?}", no_rule.headers);
    assert_eq!(search_left(&gate, "k"), Some(5), "neither was charged under search");
}
