//! Readiness apart from liveness, and the drain an orchestrator expects:
//! `/healthz` says the process lives, `/readyz` whether it should get
//! traffic (across a Redis outage, under each failure policy), and on
//! `SIGTERM` `/readyz` turns 503 at once, new connections are served for
//! `drain_delay`, then refused, and every request already started gets its
//! whole response, with the store work of requests whose clients left
//! settled before the process exits 0.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

use common::*;

// ---------------------------------------------------------------- readiness

/// Redis with a short deadline and a breaker that opens after 3 failures
/// and probes every 100 ms; `on_error` is each test's.
fn store(redis: &RedisServer, on_error: &str) -> String {
    format!(
        "[store]\nurl = \"{}\"\ntimeout_ms = 50\nbreaker_failures = 3\nprobe_interval_ms = 100\ndeny_cache = 0\n{on_error}\n",
        redis.url()
    )
}

/// Two rules: `search` (with `search_extra`, e.g. its own `on_error`) and `other`.
fn gate(upstream: &Upstream, store: &str, search_extra: &str) -> Slidegate {
    Slidegate::start(&format!(
        r#"{head}
[identity]
ip_hash_secret_env = "{SECRET_ENV}"

[[rules]]
name = "search"
path = "/api/search*"
limits = [{{ limit = 1000, window = "60s" }}]
{search_extra}

[[rules]]
name = "other"
path = "/api/other*"
limits = [{{ limit = 1000, window = "60s" }}]
"#,
        head = config_head(upstream.addr, "admin_on_public = true", store),
    ))
}

fn readyz(sg: &Slidegate) -> Reply {
    sg.get("/readyz", &[])
}

fn status_of(sg: &Slidegate, target: &str) -> u16 {
    sg.get(target, &[]).status
}

/// `/healthz` answers whatever the store does: the process lives.
fn assert_alive(sg: &Slidegate) {
    let health = sg.get("/healthz", &[]);
    assert_eq!((health.status, health.body.as_str()), (200, "ok\n"));
}

fn assert_ready(sg: &Slidegate) {
    let ready = readyz(sg);
    assert_eq!((ready.status, ready.body.as_str()), (200, "ready\n"), "{ready:?}");
    assert_eq!(ready.header("content-type"), Some("text/plain; charset=utf-8"));
}

/// 503 with a problem+json body whose detail contains each of `says`.
fn assert_not_ready(reply: &Reply, says: &[&str]) {
    assert_eq!(reply.status, 503, "{reply:?}");
    assert_eq!(reply.header("content-type"), Some("application/problem+json"));
    let json: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!((&json["status"], &json["title"]), (&503.into(), &"Service Unavailable".into()), "{json}");
    let detail = json["detail"].as_str().unwrap();
    for said in says {
        assert!(detail.contains(said), "{detail:?} should say {said:?}");
    }
}

/// Sends requests matching `search` until the breaker is open.
fn open_the_breaker(sg: &Slidegate) {
    wait_for("the breaker to open", Duration::from_secs(10), || {
        let _ = sg.get("/api/search", &[]);
        sg.metric("slidegate_breaker_open") == 1.0
    });
}

/// A rule with `on_error = "deny"` refuses every request it matches while
/// Redis is unreachable: the instance is not ready then, and says why; it
/// is ready again once Redis answers. Found without traffic (a check of its
/// own, a write as decisions make), with the breaker open, and on a Redis
/// that stalls rather than dies. `/healthz` answers 200 throughout.
/// Before: `/readyz` was forwarded to the upstream (200, its body).
#[test]
fn a_deny_rule_makes_the_instance_unready_while_redis_is_out() {
    let mut redis = RedisServer::spawn();
    let upstream = Upstream::start();
    let sg = gate(&upstream, &store(&redis, ""), "on_error = \"deny\"");
    assert_ready(&sg);
    assert_alive(&sg);
    assert_eq!(status_of(&sg, "/api/search"), 200);

    // Dead, and no request has told the breaker yet.
    redis.kill();
    wait_for("/readyz to turn 503", Duration::from_secs(10), || readyz(&sg).status == 503);
    assert_not_ready(&readyz(&sg), &["store", "\"search\"", "on_error = \"deny\""]);
    assert!(!readyz(&sg).body.contains("\"other\""), "only the deny rule is named");
    assert_alive(&sg);
    // The breaker open too: still 503, and requests of the rule are refused.
    open_the_breaker(&sg);
    assert_not_ready(&readyz(&sg), &["circuit breaker open", "\"search\""]);
    assert_eq!(status_of(&sg, "/api/search"), 503);
    assert_eq!(status_of(&sg, "/api/other"), 200, "the fallback rule still decides");
    assert_alive(&sg);

    redis.restart();
    wait_for("/readyz to turn 200", Duration::from_secs(10), || readyz(&sg).status == 200);
    assert_ready(&sg);
    assert_alive(&sg);
    assert_eq!(status_of(&sg, "/api/search"), 200);

    // Stalled: connected, but no answer within the deadline.
    redis.pause();
    wait_for("/readyz to turn 503 on a stalled Redis", Duration::from_secs(10), || readyz(&sg).status == 503);
    assert_not_ready(&readyz(&sg), &["\"search\""]);
    assert_alive(&sg);
    redis.resume();
    wait_for("/readyz to turn 200 after the stall", Duration::from_secs(10), || readyz(&sg).status == 200);
    assert_ready(&sg);
}

/// `on_error = "deny"` for every rule (the store's setting), Redis down
/// before `serve` starts: not ready from the first probe, ready once Redis
/// comes up.
#[test]
fn redis_down_at_start_under_deny_is_unready_until_it_answers() {
    let mut redis = RedisServer::spawn();
    redis.kill();
    let upstream = Upstream::start();
    let sg = gate(&upstream, &store(&redis, "on_error = \"deny\""), "");
    assert_not_ready(&readyz(&sg), &["store", "\"search\", \"other\"", "on_error = \"deny\""]);
    assert_not_ready(&readyz(&sg), &["store"]);
    assert_alive(&sg);
    redis.restart();
    wait_for("/readyz to turn 200", Duration::from_secs(10), || readyz(&sg).status == 200);
    assert_ready(&sg);
    assert_eq!(status_of(&sg, "/api/other"), 200);
}

/// Under a policy that serves without the store the instance stays ready
/// through the outage (it still decides), and says the store is out.
fn ready_through_an_outage(on_error: &str) {
    let mut redis = RedisServer::spawn();
    let upstream = Upstream::start();
    let sg = gate(&upstream, &store(&redis, on_error), "");
    assert_ready(&sg);
    assert_alive(&sg);

    redis.kill();
    open_the_breaker(&sg);
    for _ in 0..3 {
        let ready = readyz(&sg);
        assert_eq!(ready.status, 200, "{ready:?}");
        assert!(ready.body.starts_with("ready:") && ready.body.contains("circuit breaker open"), "{ready:?}");
        assert_alive(&sg);
    }
    assert_eq!(status_of(&sg, "/api/search"), 200, "decided without the store");

    redis.restart();
    wait_for("the breaker to close", Duration::from_secs(10), || sg.metric("slidegate_breaker_open") == 0.0);
    assert_ready(&sg);
    assert_alive(&sg);
}

#[test]
fn the_default_fallback_policy_stays_ready_through_a_redis_outage() {
    ready_through_an_outage("");
}

#[test]
fn on_error_allow_stays_ready_through_a_redis_outage() {
    ready_through_an_outage("on_error = \"allow\"");
}

/// The embedded store cannot be out: ready whatever the rules say.
#[test]
fn the_embedded_store_under_deny_is_ready() {
    let upstream = Upstream::start();
    let sg = gate(&upstream, "[store]\non_error = \"deny\"\n", "");
    assert_ready(&sg);
    assert_alive(&sg);
}

/// `/readyz` is an admin endpoint like the others: its method checked, its
/// query ignored, exact path only, under the prefix, nowhere unless placed.
#[test]
fn readyz_takes_get_and_head_only_and_ignores_a_query() {
    let upstream = Upstream::start();
    let sg = gate(&upstream, "", "");
    for method in ["POST", "PUT", "DELETE"] {
        let reply = request(sg.addr, method, "/readyz", &[], b"");
        assert_eq!(reply.status, 405, "{method}: {reply:?}");
        assert_eq!(reply.header("allow"), Some("GET, HEAD"));
        assert_eq!(reply.header("content-type"), Some("application/problem+json"));
    }
    for target in ["/readyz?", "/readyz?verbose=1", "/readyz?full&x=%00%ff", "/readyz?readyz=no#frag"] {
        let reply = sg.get(target, &[]);
        assert_eq!((reply.status, reply.body.as_str()), (200, "ready\n"), "{target}");
    }
    // HEAD: the status and headers of GET, no body.
    let mut stream = TcpStream::connect(sg.addr).unwrap();
    stream
        .write_all(
            format!("HEAD /readyz HTTP/1.1\r\nhost: {}\r\nconnection: close\r\n\r\n", sg.addr).as_bytes(),
        )
        .unwrap();
    let mut reader = BufReader::new(stream);
    let (status, _) = read_head(&mut reader).unwrap();
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let mut rest = Vec::new();
    reader.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    // Other spellings are ordinary paths, forwarded.
    assert_eq!(upstream.hits(), 0);
    for path in ["/readyz/", "/READYZ", "/readyz%20", "//readyz"] {
        assert_eq!(sg.get(path, &[]).body, format!("GET {path} xff=127.0.0.1"), "{path}");
    }
}

#[test]
fn readyz_is_served_only_where_the_admin_endpoints_are() {
    let upstream = Upstream::start();
    // Admin off: forwarded like any path.
    let off = Slidegate::start(&config_head(upstream.addr, "", ""));
    assert_eq!(off.get("/readyz", &[]).body, "GET /readyz xff=127.0.0.1");
    // Under the prefix.
    let prefixed =
        Slidegate::start(&config_head(upstream.addr, "admin_on_public = true\nadmin_prefix = \"/_sg\"", ""));
    assert_eq!(prefixed.get("/_sg/readyz", &[]).body, "ready\n");
    assert_eq!(prefixed.get("/readyz", &[]).body, "GET /readyz xff=127.0.0.1");
    // On the admin listener; its 404 lists it.
    let own = Slidegate::start(&config_head(upstream.addr, "admin_listen = \"127.0.0.1:0\"", ""));
    let admin = own.admin_addr();
    assert_eq!(get(admin, "/readyz", &[]).body, "ready\n");
    let missing = get(admin, "/ready", &[]);
    assert_eq!(missing.status, 404);
    assert!(missing.body.contains("/readyz"), "{}", missing.body);
    assert_eq!(own.get("/readyz", &[]).body, "GET /readyz xff=127.0.0.1");
}

// ---------------------------------------------------------------- drain

/// An upstream for the drain: `/api/fast/*` answers at once; `/api/slow/*`
/// and `/api/search/held/*` (priced 5 by `x-ratelimit-cost`) wait for their
/// own release; `/api/search/free/*` is priced 0.
struct DrainUpstream {
    addr: SocketAddr,
    fast: Arc<AtomicUsize>,
    slow: Arc<AtomicUsize>,
    held: Arc<AtomicUsize>,
    slow_gate: Arc<(Mutex<bool>, Condvar)>,
    held_gate: Arc<(Mutex<bool>, Condvar)>,
}

impl DrainUpstream {
    fn start() -> DrainUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let upstream = DrainUpstream {
            addr: listener.local_addr().unwrap(),
            fast: Arc::default(),
            slow: Arc::default(),
            held: Arc::default(),
            slow_gate: Arc::default(),
            held_gate: Arc::default(),
        };
        let counters = [&upstream.fast, &upstream.slow, &upstream.held].map(Arc::clone);
        let gates = [&upstream.slow_gate, &upstream.held_gate].map(Arc::clone);
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let (counters, gates) = (counters.clone(), gates.clone());
                thread::spawn(move || serve_drain(stream, &counters, &gates));
            }
        });
        upstream
    }

    fn count(counter: &AtomicUsize) -> usize {
        counter.load(Ordering::SeqCst)
    }

    fn release(gate: &(Mutex<bool>, Condvar)) {
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
    }
}

fn serve_drain(
    stream: TcpStream,
    counters: &[Arc<AtomicUsize>; 3],
    gates: &[Arc<(Mutex<bool>, Condvar)>; 2],
) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    while let Some((request_line, headers)) = read_head(&mut reader) {
        let target = request_line.split(' ').nth(1).unwrap_or("").to_owned();
        read_body(&mut reader, &headers);
        let (counter, gate, cost) = if target.starts_with("/api/slow/") {
            (Some(&counters[1]), Some(&gates[0]), "")
        } else if target.starts_with("/api/search/held/") {
            (Some(&counters[2]), Some(&gates[1]), "x-ratelimit-cost: 5\r\n")
        } else if target.starts_with("/api/search/free/") {
            (None, None, "x-ratelimit-cost: 0\r\n")
        } else {
            (Some(&counters[0]), None, "")
        };
        if let Some(counter) = counter {
            counter.fetch_add(1, Ordering::SeqCst);
        }
        if let Some(gate) = gate {
            let mut open = gate.0.lock().unwrap();
            while !*open {
                open = gate.1.wait(open).unwrap();
            }
        }
        let head = format!("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n{cost}\r\n");
        if writer.write_all(head.as_bytes()).and_then(|()| writer.write_all(b"ok")).is_err() {
            return;
        }
    }
}

/// What became of one request sent on a new connection.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// A whole response: its status and body.
    Answered(u16, String),
    /// The connection was refused: nothing was sent.
    Refused,
    /// Connected, but the connection ended before a whole response.
    Cut,
}

fn send(addr: SocketAddr, target: &str) -> Outcome {
    let mut stream = match TcpStream::connect(addr) {
        Ok(stream) => stream,
        Err(err) if err.kind() == ErrorKind::ConnectionRefused => return Outcome::Refused,
        Err(err) => panic!("connect: {err}"),
    };
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!("GET {target} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    if stream.write_all(head.as_bytes()).is_err() {
        return Outcome::Cut;
    }
    let mut raw = Vec::new();
    if stream.read_to_end(&mut raw).is_err() {
        return Outcome::Cut;
    }
    let text = String::from_utf8_lossy(&raw);
    let Some((head, body)) = text.split_once("\r\n\r\n") else { return Outcome::Cut };
    let Some(status) = head.split(' ').nth(1).and_then(|s| s.parse().ok()) else { return Outcome::Cut };
    let length =
        head.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length: ").map(str::to_owned));
    if length.is_some_and(|l| l.parse::<usize>().ok() != Some(body.len())) {
        return Outcome::Cut;
    }
    Outcome::Answered(status, body.to_owned())
}

/// Sends a GET of `target`, then hangs up without reading.
fn hang_up(addr: SocketAddr, target: &str, key: &str) {
    let mut stream = TcpStream::connect(addr).unwrap();
    let head = format!("GET {target} HTTP/1.1\r\nhost: {addr}\r\nx-api-key: {key}\r\n\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    thread::sleep(Duration::from_millis(100));
}

fn drain_config(upstream: &DrainUpstream, redis: &RedisServer, server: &str) -> String {
    format!(
        r#"{head}
[[rules]]
name = "search"
path = "/api/search/*"
limits = [{{ limit = 10, window = "60s", algorithm = "sliding_log" }}]
cost_header = "x-ratelimit-cost"
max_cost = 10

[[rules]]
name = "rest"
path = "/api/*"
limits = [{{ limit = 100000, window = "60s" }}]
"#,
        head = keyed_head(upstream.addr, server, &redis_decides(redis)),
    )
}

/// The phases the test has seen, for the clients to mark their outcomes.
const RUNNING: usize = 0;
const DRAINING: usize = 1;

/// Requests in flight through the whole sequence. Clients send on new
/// connections all along; slow requests are held at the upstream from
/// before the signal and from during the drain, and answered only once the
/// listener refuses; a request whose client hung up is priced by an
/// upstream that answers last. On `SIGTERM`: `/readyz` answers 503
/// "draining" (on the admin listener, which also keeps accepting), new
/// connections are served, keep-alive ones are told to close; after
/// `drain_delay` connections are refused; every request started got its
/// whole response; the hung-up request's charge reached Redis; the process
/// exits 0, having logged each step in order.
///
/// It fails if `/readyz` is not served or the listener closes at once (no
/// request served after the signal), or if the hung-up request's charge is
/// lost with the worker's runtime once its last connection closes.
#[test]
fn sigterm_drains_then_stops_and_loses_no_request() {
    let redis = RedisServer::spawn();
    let upstream = DrainUpstream::start();
    let config = drain_config(
        &upstream,
        &redis,
        "admin_listen = \"127.0.0.1:0\"\ndrain_delay = \"5s\"\nshutdown_grace = \"30s\"",
    );
    let mut sg = Slidegate::start(&config);
    let (addr, admin) = (sg.addr, sg.admin_addr());
    assert_eq!(get(admin, "/readyz", &[]).body, "ready\n");

    // A request charged after its response, whose client leaves before it.
    hang_up(addr, "/api/search/held/1", "k");
    wait_for("the hung-up request at the upstream", Duration::from_secs(5), || {
        DrainUpstream::count(&upstream.held) == 1
    });
    // Slow requests in flight before the signal.
    let slow = |i: usize| thread::spawn(move || send(addr, &format!("/api/slow/{i}")));
    let mut slow_requests: Vec<_> = (0..3).map(slow).collect();
    wait_for("3 slow requests at the upstream", Duration::from_secs(5), || {
        DrainUpstream::count(&upstream.slow) == 3
    });
    // Clients sending all along, each request on a new connection, until refused.
    let phase = Arc::new(AtomicUsize::new(RUNNING));
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let phase = Arc::clone(&phase);
            thread::spawn(move || {
                let mut seen = Vec::new();
                for i in 0..3000 {
                    let outcome = send(addr, &format!("/api/fast/{c}-{i}"));
                    let refused = outcome == Outcome::Refused;
                    seen.push((phase.load(Ordering::SeqCst), outcome));
                    if refused {
                        break;
                    }
                    thread::sleep(Duration::from_millis(5));
                }
                seen
            })
        })
        .collect();
    wait_for("the clients to be answered", Duration::from_secs(5), || {
        DrainUpstream::count(&upstream.fast) >= 8
    });
    // A keep-alive connection, used before and during the drain.
    let mut keep_alive = TcpStream::connect(addr).unwrap();
    let mut keep_alive_reader = BufReader::new(keep_alive.try_clone().unwrap());
    let mut ask = |target: &str| {
        keep_alive.write_all(format!("GET {target} HTTP/1.1\r\nhost: {addr}\r\n\r\n").as_bytes()).unwrap();
        let (status, headers) = read_head(&mut keep_alive_reader).unwrap();
        let body = read_body(&mut keep_alive_reader, &headers);
        (status, headers.get("connection").cloned(), body)
    };
    assert_eq!(ask("/api/fast/keep-1"), ("HTTP/1.1 200 OK".to_owned(), None, b"ok".to_vec()));

    let pid = sg.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    wait_for("/readyz to turn 503", Duration::from_secs(5), || get(admin, "/readyz", &[]).status == 503);
    phase.store(DRAINING, Ordering::SeqCst);
    assert_not_ready(&get(admin, "/readyz", &[]), &["draining"]);
    assert_eq!(get(admin, "/healthz", &[]).status, 200, "alive while draining");
    // Still served: a new connection, and the keep-alive one, told to close.
    assert_eq!(send(addr, "/api/fast/during"), Outcome::Answered(200, "ok".to_owned()));
    assert_eq!(
        ask("/api/fast/keep-2"),
        ("HTTP/1.1 200 OK".to_owned(), Some("close".to_owned()), b"ok".to_vec())
    );
    // Slow requests started during the drain.
    slow_requests.extend((3..5).map(slow));
    wait_for("5 slow requests at the upstream", Duration::from_secs(5), || {
        DrainUpstream::count(&upstream.slow) == 5
    });

    // Then refused, on both listeners. A connection the kernel completes
    // between slidegate's last accept and its close is reset by the close:
    // only the last before the refusals may be cut.
    let mut answered_fast = 3; // "during" and the keep-alive pair
    let mut cut = false;
    wait_for("the listener to refuse", Duration::from_secs(30), || {
        let outcome = send(addr, "/api/fast/after");
        assert!(!cut || outcome == Outcome::Refused, "a request after a cut: {outcome:?}");
        match outcome {
            Outcome::Refused => return true,
            Outcome::Cut => cut = true,
            Outcome::Answered(200, _) => answered_fast += 1,
            other => panic!("{other:?}"),
        }
        false
    });
    wait_for("the admin listener to refuse", Duration::from_secs(5), || {
        send(admin, "/readyz") == Outcome::Refused
    });
    for client in clients {
        let seen = client.join().unwrap();
        let (last_phase, last) = seen.last().unwrap().clone();
        assert_eq!((last_phase, last), (DRAINING, Outcome::Refused), "each client was finally refused");
        let served_in_drain =
            seen.iter().filter(|(p, o)| *p == DRAINING && matches!(o, Outcome::Answered(200, _))).count();
        assert!(served_in_drain > 0, "new connections were served while draining: {seen:?}");
        // Every connection slidegate took got a whole 200 (a cut: see above).
        let before_refusal = &seen[..seen.len() - 1];
        for (i, (_, outcome)) in before_refusal.iter().enumerate() {
            let cut_at_close = *outcome == Outcome::Cut && i == before_refusal.len() - 1;
            assert!(
                outcome == &Outcome::Answered(200, "ok".to_owned()) || cut_at_close,
                "{i}: {outcome:?} in {seen:?}"
            );
        }
        answered_fast += before_refusal.iter().filter(|(_, o)| matches!(o, Outcome::Answered(..))).count();
    }
    // Every request that reached the upstream was answered in full.
    assert_eq!(DrainUpstream::count(&upstream.fast), answered_fast);

    // Open connections are finished within the grace.
    assert!(sg.child.try_wait().unwrap().is_none(), "waiting for the slow requests");
    DrainUpstream::release(&upstream.slow_gate);
    for request in slow_requests {
        assert_eq!(request.join().unwrap(), Outcome::Answered(200, "ok".to_owned()));
    }
    // The hung-up request is priced last: its charge is settled before exit.
    DrainUpstream::release(&upstream.held_gate);
    let status = loop {
        if let Some(status) = sg.child.try_wait().unwrap() {
            break status;
        }
        thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    let log = sg.log.lock().unwrap().clone();
    let steps = [
        "shutdown signal received",
        "draining: /readyz answers 503",
        "drain delay over",
        "open connections finished",
        "pending store work settled",
        "shutdown complete",
    ];
    let at: Vec<usize> =
        steps.iter().map(|s| log.find(s).unwrap_or_else(|| panic!("no {s:?} in the log:\n{log}"))).collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "steps out of order: {at:?}\n{log}");
    let settled = log.lines().find(|l| l.contains("pending store work settled")).unwrap();
    assert!(settled.ends_with("charges=1"), "the hung-up request's charge: {settled}");

    // The charge reached Redis: another instance sees it.
    let next = Slidegate::start(&drain_config(&upstream, &redis, ""));
    let left = next.get("/api/search/free/1", &[("x-api-key", "k")]);
    assert_eq!(remaining(&left), Some(5), "charged 5 of 10: {left:?}");
}

/// `drain_delay` left out: the listener closes as the signal arrives, and
/// the process still exits 0 with every step logged.
#[test]
fn without_a_drain_delay_sigterm_stops_at_once() {
    let upstream = Upstream::start();
    let mut sg = Slidegate::start(&config_head(upstream.addr, "admin_on_public = true", ""));
    assert_eq!(sg.get("/readyz", &[]).status, 200);
    let status = sg.terminate();
    assert!(status.success(), "{status:?}");
    let log = sg.log.lock().unwrap().clone();
    assert!(log.contains("drain delay over") && log.contains("shutdown complete"), "{log}");
}

/// The grace bounds the shutdown: a request still at the upstream when it
/// ends is cut, a charge still pending is not made, each counted in a
/// warning, and the process still exits 0.
#[test]
fn what_outlasts_the_grace_is_cut_and_counted() {
    let redis = RedisServer::spawn();
    let upstream = DrainUpstream::start();
    let mut sg =
        Slidegate::start(&drain_config(&upstream, &redis, "threads = 1\nshutdown_grace = \"500ms\""));
    let addr = sg.addr;
    hang_up(addr, "/api/search/held/1", "k");
    let slow = thread::spawn(move || send(addr, "/api/slow/1"));
    wait_for("both at the upstream", Duration::from_secs(5), || {
        DrainUpstream::count(&upstream.held) == 1 && DrainUpstream::count(&upstream.slow) == 1
    });
    let status = sg.terminate();
    assert!(status.success(), "{status:?}");
    assert_eq!(slow.join().unwrap(), Outcome::Cut);
    let log = sg.log.lock().unwrap().clone();
    let line =
        |says: &str| log.lines().find(|l| l.contains(says)).unwrap_or_else(|| panic!("no {says:?}:\n{log}"));
    assert!(line("open connections closed unfinished").ends_with("connections=1"), "{log}");
    assert!(line("were not made").contains("charges=1 settled=0"), "{log}");
    assert!(log.contains("shutdown complete"), "{log}");
    DrainUpstream::release(&upstream.slow_gate);
    DrainUpstream::release(&upstream.held_gate);
}

// ---------------------------------------------------------------- leases

/// `serve` on `redis` with one rule of 1,000 an hour, fixed window (a leased
/// algorithm), and `lease` in `[store]` (`""`: none).
fn leasing(upstream: &Upstream, redis: &RedisServer, lease: &str) -> Slidegate {
    Slidegate::start(&format!(
        r#"{head}
[[rules]]
name = "search"
path = "/search"
limits = [{{ limit = 1000, window = "1h", algorithm = "fixed_window" }}]
"#,
        head = keyed_head(
            upstream.addr,
            "",
            &format!("[store]\nurl = \"{}\"\ntimeout_ms = 5000\ndeny_cache = 0\n{lease}\n", redis.url())
        ),
    ))
}

/// The `r=` of a reply's `RateLimit` header.
fn left(reply: &Reply) -> u64 {
    remaining(reply).unwrap_or_else(|| panic!("no RateLimit header: {reply:?}"))
}

/// Before: the permits an instance had leased and not used stayed charged
/// after it stopped, so every other instance saw fewer until the window's end.
#[test]
fn at_shutdown_unused_leased_permits_go_back_to_the_store() {
    let upstream = Upstream::start();
    let redis = RedisServer::spawn();
    // A long horizon: a few hundred requests a second make leases of `max`.
    let mut leased = leasing(&upstream, &redis, "lease = { max = 64, horizon = \"10s\" }");
    let plain = leasing(&upstream, &redis, "");
    let hot = [("x-api-key", "hot")];
    let mut admitted = 0;
    for _ in 0..300 {
        assert_eq!(leased.get("/search", &hot).status, 200);
        admitted += 1;
    }
    let stats = redis.command_stats();
    let scripts = stats.calls("evalsha") + stats.calls("eval");
    assert!(scripts < 200, "300 requests took {scripts} script calls: no lease was granted");
    // What the store has charged beyond the admitted requests (the other
    // instance's own checks included) is the leased permits not used yet;
    // one more request uses one up when none is left over.
    let (mut checks, mut unused) = (0, 0);
    for _ in 0..70 {
        let left_now = left(&plain.get("/search", &hot));
        checks += 1;
        unused = 1000 - admitted - checks - left_now;
        if unused > 0 {
            break;
        }
        assert_eq!(leased.get("/search", &hot).status, 200);
        admitted += 1;
    }
    assert!(unused > 0, "no leased permit was left unused");
    assert!(leased.terminate().success());
    let log = leased.log.lock().unwrap().clone();
    assert!(log.contains("unused leased permits given back to the store permits="), "{log}");
    assert!(log.contains(&format!("permits={unused}")), "{unused} were unused: {log}");
    // The other instance now sees exactly what was admitted and checked.
    assert_eq!(left(&plain.get("/search", &hot)), 1000 - admitted - checks - 1);
}
