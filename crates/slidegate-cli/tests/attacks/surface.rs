//! The admin endpoints, the protocol edges and the resources one client can pin.

use std::io::{BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::*;

/// The test configuration without the opt-in that puts the admin endpoints
/// on the public listener: what an operator gets by default.
fn default_admin_config(upstream: &Upstream) -> String {
    config_with(upstream.addr, "", "", "")
}

fn check(addr: SocketAddr, body: &str, headers: &[(&str, &str)]) -> Reply {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    request(addr, "POST", "/v1/check", &all, body.as_bytes())
}

fn detail(reply: &Reply) -> String {
    let json: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
    json["detail"].as_str().unwrap_or_default().to_owned()
}

/// Writes `raw` as is and reads the reply; `None` when the connection closed
/// without one.
fn raw(addr: SocketAddr, raw: &[u8]) -> Option<Reply> {
    let start = Instant::now();
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.write_all(raw).unwrap();
    let mut reader = BufReader::new(stream);
    let (status_line, headers) = read_head(&mut reader)?;
    let status = status_line.split(' ').nth(1)?.parse().ok()?;
    let len: usize = headers.get("content-length").map_or(0, |v| v.parse().unwrap());
    let mut body = vec![0; len];
    reader.read_exact(&mut body).ok()?;
    Some(Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
        elapsed: start.elapsed(),
    })
}

// ---------------------------------------------------------------- the decision API

#[test]
fn by_default_the_admin_endpoints_are_not_on_the_public_listener() {
    // Before: /v1/check (any cost up to a limit) and /metrics (breaker state)
    // answered every client of the proxy.
    let upstream = Upstream::start();
    let sg = Slidegate::start(&default_admin_config(&upstream));
    let decided = check(sg.addr, r#"{"rule":"search","key":"k","cost":1}"#, &[]);
    assert_eq!((decided.status, decided.body.as_str()), (200, "POST /v1/check xff=127.0.0.1"));
    assert_eq!(sg.get("/metrics", &[]).body, "GET /metrics xff=127.0.0.1");
    assert_eq!(sg.get("/healthz", &[]).body, "GET /healthz xff=127.0.0.1");
    assert_eq!(upstream.hits(), 3);
    assert!(sg.log.lock().unwrap().contains("admin endpoints off"));
}

#[test]
fn the_check_api_requires_its_bearer_token_when_one_is_configured() {
    let upstream = Upstream::start();
    // The harness sets SECRET_ENV in serve's environment; it serves as the token here.
    let text = config_with(
        upstream.addr,
        &format!("admin_on_public = true\ncheck_token_env = \"{SECRET_ENV}\""),
        "",
        "",
    );
    let sg = Slidegate::start(&text);
    let body = r#"{"rule":"search","key":"k"}"#;
    for headers in
        [&[][..], &[("authorization", "Bearer wrong")][..], &[("authorization", "end-to-end-secret")][..]]
    {
        let reply = check(sg.addr, body, headers);
        assert_eq!(reply.status, 401, "{headers:?}: {reply:?}");
        assert_eq!(reply.header("content-type"), Some("application/problem+json"));
        assert_eq!(reply.header("www-authenticate"), Some("Bearer"));
        assert!(detail(&reply).contains("requires the bearer token"), "{reply:?}");
    }
    let allowed = check(sg.addr, body, &[("authorization", "Bearer end-to-end-secret")]);
    assert_eq!(allowed.status, 200, "{allowed:?}");
    // Refused calls charged nothing.
    assert_eq!(allowed.header("x-ratelimit-remaining"), Some("1"));
    assert_eq!(upstream.hits(), 0);

    // A token variable that is not set stops the start.
    let (_dir, path) = write_config(&text);
    let out = Command::new(binary()).arg("check-config").arg(&path).env_remove(SECRET_ENV).output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("check_token_env names the variable"));
}

#[test]
fn a_check_above_the_rules_max_cost_is_refused_and_charges_nothing() {
    let upstream = Upstream::start();
    let sg = embedded(&upstream);
    // The search rule allows 2 a minute; a check may charge 1 unless the rule says more.
    let reply = check(sg.addr, r#"{"rule":"search","key":"k","cost":2}"#, &[]);
    assert_eq!(reply.status, 400, "{reply:?}");
    assert_eq!(reply.header("content-type"), Some("application/problem+json"));
    assert_eq!(detail(&reply), "cost 2 is above the rule's max_cost 1: one check may charge at most 1");
    let reply = check(sg.addr, r#"{"rule":"search","key":"k","cost":1}"#, &[]);
    assert_eq!((reply.status, reply.header("x-ratelimit-remaining")), (200, Some("1")));
}

#[test]
fn an_unknown_rule_is_not_answered_with_the_list_of_rules() {
    let upstream = Upstream::start();
    let sg = embedded(&upstream);
    let reply = check(sg.addr, r#"{"rule":"nope","key":"k"}"#, &[]);
    assert_eq!(reply.status, 400);
    assert_eq!(detail(&reply), "unknown rule \"nope\"");
    assert!(!reply.body.contains("trending"), "{}", reply.body);
}

// ---------------------------------------------------------------- a shared store

#[test]
fn a_shared_store_without_a_hash_secret_is_refused_at_start() {
    // Two instances would each draw a random secret and together admit twice the limit.
    let upstream = Upstream::start();
    let store = "[store]\nurl = \"redis://127.0.0.1:1\"\n";
    let text = config(&upstream, store, "").replace(&format!("ip_hash_secret_env = \"{SECRET_ENV}\"\n"), "");
    let (_dir, path) = write_config(&text);
    for args in [vec!["check-config"], vec!["serve", "--config"]] {
        let out = Command::new(binary()).args(&args).arg(&path).output().unwrap();
        assert_eq!(out.status.code(), Some(64), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(":7:7: a shared store needs [identity] ip_hash_secret_env"), "{stderr}");
        assert!(stderr.contains("admit a multiple of every limit"), "{stderr}");
    }
}

// ---------------------------------------------------------------- the protocol

/// An upstream answering each request with the `Host` it received, and the
/// number of requests it received.
fn host_echo_upstream() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&hits);
    thread::spawn(move || {
        for stream in listener.incoming().take(64) {
            let Ok(stream) = stream else { continue };
            let counted = Arc::clone(&counted);
            thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut writer = stream;
                while let Some((_, headers)) = read_head(&mut reader) {
                    counted.fetch_add(1, Ordering::SeqCst);
                    let host = headers.get("host").cloned().unwrap_or_default();
                    let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{host}", host.len());
                    if writer.write_all(head.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, hits)
}

#[test]
fn an_absolute_form_target_names_the_host_whatever_host_says() {
    let (host_echo, _) = host_echo_upstream();
    let text = config_with(host_echo, "admin_on_public = true", "", "");
    let sg = Slidegate::start(&text);
    let reply = raw(
        sg.addr,
        b"GET http://example.test/api/x HTTP/1.1\r\nHost: evil.test\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    assert_eq!((reply.status, reply.body.as_str()), (200, "example.test"));
    let reply =
        raw(sg.addr, b"GET /api/x HTTP/1.1\r\nHost: plain.test\r\nConnection: close\r\n\r\n").unwrap();
    assert_eq!((reply.status, reply.body.as_str()), (200, "plain.test"));
}

#[test]
fn an_absolute_form_target_with_userinfo_is_refused() {
    // Before: `GET http://u:p@evil.example/x` reached the upstream with
    // `host: u:p@evil.example`.
    let upstream = Upstream::start();
    let sg = embedded(&upstream);
    for target in ["http://u:p@evil.example/x", "http://u@evil.example/x", "http://@evil.example/x"] {
        let head = format!("GET {target} HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n");
        let reply = raw(sg.addr, head.as_bytes()).unwrap();
        assert_eq!(reply.status, 400, "{target}: {reply:?}");
        assert_eq!(reply.header("connection"), Some("close"));
        assert_eq!(detail(&reply), "the request target carries user information (user@host): refused");
    }
    assert_eq!(upstream.hits(), 0);
    // An `@` in the path or query is no user information.
    let head =
        b"GET http://example.test/u@x?to=a@b HTTP/1.1\r\nHost: example.test\r\nConnection: close\r\n\r\n";
    let reply = raw(sg.addr, head).unwrap();
    assert_eq!((reply.status, reply.body.as_str()), (200, "GET /u@x?to=a@b xff=127.0.0.1"));
}

#[test]
fn http_1_1_without_host_is_refused_and_http_1_0_is_given_the_upstreams() {
    // Before: an HTTP/1.1 request without Host was forwarded (RFC 9112 §3.2
    // requires 400), with the upstream's authority as its Host.
    let (host_echo, hits) = host_echo_upstream();
    let text = config_with(host_echo, "admin_on_public = true", "", "");
    let sg = Slidegate::start(&text);
    for head in [
        &b"GET /api/x HTTP/1.1\r\nConnection: close\r\n\r\n"[..],
        b"GET http://example.test/api/x HTTP/1.1\r\nConnection: close\r\n\r\n",
        b"POST /api/x HTTP/1.1\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
    ] {
        let reply = raw(sg.addr, head).unwrap();
        assert_eq!(reply.status, 400, "{}: {reply:?}", String::from_utf8_lossy(head));
        assert_eq!(detail(&reply), "an HTTP/1.1 request needs a Host header (RFC 9112 §3.2)");
    }
    assert_eq!(hits.load(Ordering::SeqCst), 0);
    // An empty Host is what a target without an authority sends: served.
    let reply = raw(sg.addr, b"GET /api/x HTTP/1.1\r\nHost:\r\nConnection: close\r\n\r\n").unwrap();
    assert_eq!((reply.status, reply.body.as_str()), (200, ""));
    // HTTP/1.0 has no Host requirement: the upstream gets its own authority.
    let reply = raw(sg.addr, b"GET /api/x HTTP/1.0\r\n\r\n").unwrap();
    assert_eq!((reply.status, reply.body), (200, host_echo.to_string()));
}

#[test]
fn two_host_headers_connect_and_a_malformed_chunked_body_are_the_clients_errors() {
    let upstream = Upstream::start();
    let sg = embedded(&upstream);
    let two_hosts = raw(sg.addr, b"GET /api/x HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n").unwrap();
    assert_eq!(two_hosts.status, 400, "{two_hosts:?}");
    assert!(detail(&two_hosts).contains("more than one Host header"));
    let connect =
        raw(sg.addr, b"CONNECT example.test:443 HTTP/1.1\r\nHost: example.test:443\r\n\r\n").unwrap();
    assert_eq!(connect.status, 405, "{connect:?}");
    assert!(connect.header("allow").is_some_and(|a| !a.contains("CONNECT")));
    assert_eq!(upstream.hits(), 0);

    // A chunk size that is not hex: the client's fault, not the upstream's.
    let malformed = raw(
        sg.addr,
        b"POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\nabc\r\n0\r\n\r\n",
    );
    let malformed = malformed.expect("a reply to a malformed chunked body");
    assert_eq!(malformed.status, 400, "{malformed:?}");
    assert_eq!(malformed.header("connection"), Some("close"));
    assert!(!sg.log.lock().unwrap().contains("upstream request failed"), "{}", sg.log.lock().unwrap());
}

// ---------------------------------------------------------------- slow bodies

/// An upstream that never answers: it reads each connection to its end and
/// counts the connections open now, at most at once, and in all.
struct SinkUpstream {
    addr: SocketAddr,
    open: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
    total: Arc<AtomicUsize>,
}

impl SinkUpstream {
    fn start() -> SinkUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (open, peak, total) = (Arc::default(), Arc::default(), Arc::default());
        let counters: (Arc<AtomicUsize>, Arc<AtomicUsize>, Arc<AtomicUsize>) =
            (Arc::clone(&open), Arc::clone(&peak), Arc::clone(&total));
        thread::spawn(move || {
            for stream in listener.incoming().take(256) {
                let Ok(mut stream) = stream else { continue };
                let (open, peak, total) =
                    (Arc::clone(&counters.0), Arc::clone(&counters.1), Arc::clone(&counters.2));
                let now = open.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                total.fetch_add(1, Ordering::SeqCst);
                thread::spawn(move || {
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
                    let mut sink = [0u8; 1024];
                    while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
                    open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        SinkUpstream { addr, open, peak, total }
    }
}

/// Sends a request head announcing 100 body bytes and one byte of it, then
/// nothing: returns the status of the reply (`None`: closed without one),
/// whether the connection was then closed, and how long it all took.
fn stall_body(from: Ipv4Addr, addr: SocketAddr) -> (Option<u16>, bool, Duration) {
    let start = Instant::now();
    let mut stream = connect_from(from, addr);
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    stream.write_all(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\na").unwrap();
    let mut reader = BufReader::new(stream);
    let status = read_head(&mut reader).and_then(|(line, _)| line.split(' ').nth(1)?.parse().ok());
    // Read what is left: a closed connection reads as end of file, not a timeout.
    let mut rest = Vec::new();
    let closed = reader.read_to_end(&mut rest).is_ok();
    (status, closed, start.elapsed())
}

#[test]
fn a_stalled_request_body_times_out_and_releases_its_upstream_connection() {
    // Before: a client trickling its body held its upstream connection for ever.
    let sink = SinkUpstream::start();
    let text = config_with(sink.addr, "admin_on_public = true\nbody_timeout = \"300ms\"", "", "");
    let sg = Slidegate::start(&text);
    let addr = sg.addr;
    let clients: Vec<_> =
        (0..10).map(|_| thread::spawn(move || stall_body(Ipv4Addr::LOCALHOST, addr))).collect();
    for client in clients {
        let (status, closed, elapsed) = client.join().unwrap();
        assert_eq!(status, Some(408));
        assert!(closed, "the connection stayed open");
        assert!(elapsed < Duration::from_secs(15), "{elapsed:?}");
    }
    wait_for("the upstream connections to close", Duration::from_secs(10), || {
        sink.open.load(Ordering::SeqCst) == 0
    });
    assert_eq!(sink.total.load(Ordering::SeqCst), 10);
}

#[test]
fn upstream_connections_are_bounded_and_the_excess_is_refused_promptly() {
    let sink = SinkUpstream::start();
    // The body timeout (3 s) outlasts the wait for a free connection (1 s):
    // the first four hold every connection while the other four wait. Eight
    // clients, each within its share of the pool (4 / 16, so 1).
    let text = config_with(
        sink.addr,
        "admin_on_public = true\nbody_timeout = \"3s\"\nmax_upstream_connections = 4",
        "",
        "",
    );
    let sg = Slidegate::start(&text);
    let addr = sg.addr;
    let clients: Vec<_> =
        (0..8).map(|i| thread::spawn(move || stall_body(Ipv4Addr::new(127, 0, 2, i), addr))).collect();
    let mut statuses: Vec<Option<u16>> = clients.into_iter().map(|c| c.join().unwrap().0).collect();
    statuses.sort();
    assert_eq!(statuses, [Some(408); 4].into_iter().chain([Some(503); 4]).collect::<Vec<_>>());
    assert_eq!(sink.peak.load(Ordering::SeqCst), 4);
    assert_eq!(sink.total.load(Ordering::SeqCst), 4);
    wait_for("the upstream connections to close", Duration::from_secs(10), || {
        sink.open.load(Ordering::SeqCst) == 0
    });
}
