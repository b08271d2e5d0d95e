//! Scrapers that stay under every request rate: a catalogue walk at a
//! polite pace (crawl breadth), enumeration probes that only show as 404s
//! (status-based counting), and cheap-looking requests that are expensive
//! upstream (a cost the upstream sets).

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

#[allow(unused_imports)]
use crate::common::*;

/// The `r=` value of the first item of a `RateLimit` header.
fn remaining(reply: &Reply) -> Option<u64> {
    let header = reply.header("ratelimit")?;
    header.split(';').find_map(|p| p.strip_prefix("r=")).and_then(|r| r.parse().ok())
}

#[test]
fn a_catalogue_walk_is_denied_past_its_breadth_on_redis() {
    let redis = RedisServer::spawn();
    let upstream = Upstream::start();
    let config = format!(
        r#"{head}
[identity]
ip_hash_secret_env = "{SECRET_ENV}"

[[rules]]
name = "videos"
path = "/api/videos/{{id}}"
limits = [{{ limit = 100000, window = "60s" }}]
breadth = {{ distinct = 200, window = "10m", of = "param:id" }}
"#,
        head = config_head(upstream.addr, "", &redis_store(&redis)),
    );
    let gate = Slidegate::start(&config);
    let mut first_denied = None;
    let mut admitted = Vec::new();
    for id in 1..=300u32 {
        let reply = gate.get(&format!("/api/videos/{id}"), &[]);
        match reply.status {
            200 => admitted.push(id),
            429 => {
                if first_denied.is_none() {
                    first_denied = Some(id);
                    assert_eq!(reply.header("ratelimit-policy"), Some("\"videos-breadth\";q=200;w=600"));
                    assert!(reply
                        .header("ratelimit")
                        .is_some_and(|h| h.starts_with("\"videos-breadth\";r=0;t=")));
                    let wait: u64 = reply.header("retry-after").unwrap().parse().unwrap();
                    assert!((1..=600).contains(&wait), "retry-after {wait}");
                }
            }
            other => panic!("status {other} for id {id}"),
        }
    }
    // HyperLogLog at 200 values: the estimate is within ±1.5 %, and a new id
    // whose register already holds its rank is taken for one seen (about 1
    // in 100 at this size). Denied requests never reach the upstream.
    let first = first_denied.expect("the walk was denied");
    assert!((195..=206).contains(&first), "first denial at id {first}");
    assert!((195..=210).contains(&admitted.len()), "{} admitted", admitted.len());
    assert_eq!(upstream.hits(), admitted.len());
    // Re-visits stay allowed: the limit is on breadth, not on requests.
    for id in admitted.iter().take(20) {
        assert_eq!(gate.get(&format!("/api/videos/{id}"), &[]).status, 200, "seen id {id}");
    }
    // Same ids spelled differently are the same values.
    assert_eq!(gate.get(&format!("/api/videos//{}", admitted[0]), &[]).status, 200);
}

/// An upstream answering 404 for `/api/users/missing*`, and a cost header
/// for `/api/search*` (`x-ratelimit-cost: 5`, or 0 under `/api/search/cached`).
fn pricing_upstream() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&hits);
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let counter = Arc::clone(&counter);
            thread::spawn(move || answer(stream, &counter));
        }
    });
    (addr, hits)
}

fn answer(stream: TcpStream, hits: &AtomicUsize) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    while let Some((line, headers)) = read_head(&mut reader) {
        let _ = read_body(&mut reader, &headers);
        hits.fetch_add(1, Ordering::SeqCst);
        let target = line.split(' ').nth(1).unwrap_or("").to_owned();
        let (status, extra) = if target.starts_with("/api/users/missing") {
            ("404 Not Found", "")
        } else if target.starts_with("/api/search/cached") {
            ("200 OK", "x-ratelimit-cost: 0\r\n")
        } else if target.starts_with("/api/search") {
            ("200 OK", "x-ratelimit-cost: 5\r\n")
        } else {
            ("200 OK", "")
        };
        let head = format!("HTTP/1.1 {status}\r\ncontent-length: 2\r\n{extra}\r\n");
        if writer.write_all(head.as_bytes()).and_then(|()| writer.write_all(b"ok")).is_err() {
            return;
        }
    }
}

fn pricing_config(upstream: SocketAddr, store: &str) -> String {
    format!(
        r#"{head}
[identity]
ip_hash_secret_env = "{SECRET_ENV}"

[[rules]]
name = "users"
path = "/api/users/*"
limits = [{{ limit = 3, window = "60s", algorithm = "sliding_log" }}]
count_status = [404]

[[rules]]
name = "search"
path = "/api/search*"
limits = [{{ limit = 10, window = "60s", algorithm = "sliding_log" }}]
cost_header = "x-ratelimit-cost"
max_cost = 10
"#,
        head = config_head(upstream, "", store),
    )
}

fn enumeration_probes_count_and_successes_do_not(store: &str, upstream: SocketAddr, hits: &AtomicUsize) {
    let gate = Slidegate::start(&pricing_config(upstream, store));
    for i in 0..10 {
        let ok = gate.get(&format!("/api/users/{i}"), &[]);
        assert_eq!((ok.status, remaining(&ok)), (200, Some(3)), "a 200 never counts");
    }
    for (i, left) in [(1, 2), (2, 1), (3, 0)] {
        let probe = gate.get(&format!("/api/users/missing{i}"), &[]);
        assert_eq!((probe.status, remaining(&probe)), (404, Some(left)), "probe {i}");
    }
    let before = hits.load(Ordering::SeqCst);
    let denied = gate.get("/api/users/7", &[]);
    assert_eq!(denied.status, 429, "the request after the 3rd 404 is refused");
    assert!(denied.header("retry-after").is_some());
    assert_eq!(hits.load(Ordering::SeqCst), before, "a denial never reaches the upstream");

    // The upstream prices searches: 5 of 10, then a free cached one, then 5
    // more, then nothing left.
    let first = gate.get("/api/search?q=a", &[]);
    assert_eq!((first.status, remaining(&first)), (200, Some(5)));
    let cached = gate.get("/api/search/cached?q=a", &[]);
    assert_eq!((cached.status, remaining(&cached)), (200, Some(5)), "the next request sees remaining 5");
    let second = gate.get("/api/search?q=b", &[]);
    assert_eq!((second.status, remaining(&second)), (200, Some(0)));
    assert_eq!(gate.get("/api/search?q=c", &[]).status, 429);
}

#[test]
fn responses_are_counted_by_status_and_priced_by_the_upstream_embedded() {
    let (upstream, hits) = pricing_upstream();
    enumeration_probes_count_and_successes_do_not("", upstream, &hits);
}

#[test]
fn responses_are_counted_by_status_and_priced_by_the_upstream_on_redis() {
    let redis = RedisServer::spawn();
    let (upstream, hits) = pricing_upstream();
    enumeration_probes_count_and_successes_do_not(&redis_store(&redis), upstream, &hits);
}
