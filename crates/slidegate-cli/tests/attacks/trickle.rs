//! Request bodies trickled to pin the upstream pool: one byte now and then
//! keeps a connection busy for as long as the body lasts. Clients come from
//! distinct loopback addresses (Linux routes all of 127/8 to `lo`), so each
//! is a client of its own to slidegate.

use std::io::{BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::*;

/// The status of the reply waiting on `stream`, if one comes within `wait`.
fn reply_status(stream: &TcpStream, wait: Duration) -> Option<u16> {
    stream.set_read_timeout(Some(wait)).unwrap();
    let mut reader = BufReader::new(stream);
    let (line, _) = read_head(&mut reader)?;
    line.split(' ').nth(1)?.parse().ok()
}

/// The harness's upstream (which reads each body to its end before it
/// answers), counting the connections it accepted.
fn counting_upstream() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    thread::spawn(move || {
        let hits = Arc::new(AtomicUsize::new(0));
        for stream in listener.incoming().take(512) {
            let Ok(stream) = stream else { continue };
            count.fetch_add(1, Ordering::SeqCst);
            let hits = Arc::clone(&hits);
            thread::spawn(move || serve_upstream(stream, &hits));
        }
    });
    (addr, accepted)
}

/// Opens a request whose body of 1,000 bytes has sent one byte.
fn start_trickle(from: Ipv4Addr, addr: SocketAddr) -> TcpStream {
    let mut stream = connect_from(from, addr);
    stream.write_all(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\na").unwrap();
    stream
}

#[test]
fn trickled_bodies_from_a_few_clients_cannot_take_the_whole_upstream_pool() {
    // Before: 50 trickling bodies held all 50 upstream connections, and
    // every other client waited 1 s for one and got 503.
    let (target, accepted) = counting_upstream();
    let text = config_with(
        target,
        "admin_on_public = true\nbody_timeout = \"60s\"\nmax_upstream_connections = 50",
        "",
        "",
    );
    let sg = Slidegate::start(&text);
    // One client opens 60; ten others open 2 each.
    let one = Ipv4Addr::new(127, 0, 0, 2);
    let many: Vec<Ipv4Addr> = (3..13).map(|i| Ipv4Addr::new(127, 0, 0, i)).collect();
    let from_one: Vec<TcpStream> = (0..60).map(|_| start_trickle(one, sg.addr)).collect();
    let from_many: Vec<TcpStream> =
        many.iter().flat_map(|&ip| [start_trickle(ip, sg.addr), start_trickle(ip, sg.addr)]).collect();
    // Each client keeps at most 50 / 16 = 3 connections: 3 + 10 × 2 reach the upstream.
    wait_for("the trickles to reach the upstream", Duration::from_secs(10), || {
        accepted.load(Ordering::SeqCst) >= 23
    });

    // Twenty other clients, one request each, all at once.
    let legitimate: Vec<_> = (0..20)
        .map(|i| {
            let addr = sg.addr;
            thread::spawn(move || {
                let mut stream = connect_from(Ipv4Addr::new(127, 0, 1, i), addr);
                stream.write_all(b"GET /api/items HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
                reply_status(&stream, Duration::from_secs(10))
            })
        })
        .collect();
    let statuses: Vec<Option<u16>> = legitimate.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(statuses, vec![Some(200); 20]);

    // The first client's excess was refused at once, with a reason.
    let started = Instant::now();
    let refused: Vec<Option<u16>> =
        from_one.iter().map(|s| reply_status(s, Duration::from_millis(200))).collect();
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(refused.iter().filter(|s| **s == Some(429)).count(), 57, "{refused:?}");
    // The other three are still being forwarded (or, on a machine slow
    // enough to take the 10 s grace, cut by the minimum rate).
    let held = |s: &Option<u16>| matches!(s, None | Some(408));
    assert_eq!(refused.iter().filter(|s| held(s)).count(), 3, "{refused:?}");
    let others: Vec<Option<u16>> =
        from_many.iter().map(|s| reply_status(s, Duration::from_millis(50))).collect();
    assert!(others.iter().all(held), "{others:?}");
}

#[test]
fn the_per_client_refusal_says_why_and_when_to_retry() {
    let (target, accepted) = counting_upstream();
    let server = "admin_on_public = true\nbody_timeout = \"60s\"\nmax_upstream_connections = 8\n\
                  max_upstream_connections_per_client = 1";
    let text = config_with(target, server, "", "");
    let sg = Slidegate::start(&text);
    let from = Ipv4Addr::new(127, 0, 0, 7);
    let mut held = start_trickle(from, sg.addr);
    // The client's hold is taken before its upstream connection is opened.
    wait_for("the first body to be forwarded", Duration::from_secs(10), || {
        accepted.load(Ordering::SeqCst) == 1
    });
    let mut probe = connect_from(from, sg.addr);
    probe.write_all(b"GET /api/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    probe.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut reply = String::new();
    probe.read_to_string(&mut reply).unwrap();
    let reply = reply.to_ascii_lowercase();
    assert!(reply.starts_with("http/1.1 429 too many requests\r\n"), "{reply}");
    assert!(reply.contains("\r\nretry-after: 1\r\n"), "{reply}");
    assert!(reply.contains("\r\nconnection: close\r\n"), "{reply}");
    assert!(reply.contains("\r\ncontent-type: application/problem+json\r\n"), "{reply}");
    assert!(
        reply.contains(
            "\"detail\":\"this client already has 1 request in flight to the upstream \
             (max_upstream_connections_per_client); retry when one has finished\""
        ),
        "{reply}"
    );
    // Another client is served meanwhile.
    assert_eq!(get(sg.addr, "/api/x", &[]).status, 200);
    // Once its body is done and answered, the client is served again.
    held.write_all(&[b'a'; 999]).unwrap();
    assert_eq!(reply_status(&held, Duration::from_secs(10)), Some(200));
    let mut again = connect_from(from, sg.addr);
    again.write_all(b"GET /api/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    assert_eq!(reply_status(&again, Duration::from_secs(10)), Some(200));
}

/// Sends a request announcing `len` body bytes, then `chunk` bytes every
/// `every` until the reply comes or the body is sent; returns the status
/// and the reply's text.
fn paced_body(addr: SocketAddr, len: usize, chunk: usize, every: Duration) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    let head =
        format!("POST /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {len}\r\n\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    stream.set_nonblocking(true).unwrap();
    let mut sent = 0;
    let mut reply = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(Instant::now() < deadline, "no reply: {}", String::from_utf8_lossy(&reply));
        let mut buf = [0u8; 4096];
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => reply.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            // A reset after the reply: the server closed with body bytes unread.
            Err(_) => break,
        }
        if sent < len {
            let n = chunk.min(len - sent);
            if stream.write_all(&vec![b'x'; n]).is_err() {
                continue;
            }
            sent += n;
        }
        thread::sleep(every);
    }
    let text = String::from_utf8_lossy(&reply).into_owned();
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text)
}

#[test]
fn a_body_slower_than_the_minimum_rate_gets_408_after_the_grace() {
    // Before: only a body silent for `body_timeout` was cut; one byte every
    // 250 ms (4 bytes/s) kept its upstream connection for the body's whole 10 s.
    let upstream = Upstream::start();
    let server =
        "admin_on_public = true\nbody_timeout = \"30s\"\nmin_body_rate = 100\nbody_rate_grace = \"1s\"";
    let text = config_with(upstream.addr, server, "", "");
    let sg = Slidegate::start(&text);
    let started = Instant::now();
    let (status, reply) = paced_body(sg.addr, 40, 1, Duration::from_millis(250));
    assert_eq!(status, 408, "{reply}");
    assert!(reply.contains("the request body arrived slower than min_body_rate (100 bytes/s)"), "{reply}");
    assert!(reply.to_ascii_lowercase().contains("connection: close"), "{reply}");
    assert!(started.elapsed() < Duration::from_secs(8), "{:?}", started.elapsed());
    assert_eq!(upstream.hits(), 0);

    // A body above the rate, lasting well past the grace, is served whole.
    let (status, reply) = paced_body(sg.addr, 40 * 1024, 1024, Duration::from_millis(50));
    assert_eq!(status, 200, "{reply}");
    assert!(reply.ends_with(&"x".repeat(40 * 1024)), "{}", &reply[..200.min(reply.len())]);
}

#[test]
fn a_request_waiting_for_the_pool_is_served_by_a_connection_that_comes_back() {
    // Before: a finished request's connection went back to an idle pool
    // while another client's request waited for a slot, which then waited
    // its whole second and got 503.
    let (target, accepted) = counting_upstream();
    let text = config_with(target, "admin_on_public = true\nmax_upstream_connections = 1", "", "");
    let sg = Slidegate::start(&text);
    let mut first = connect_from(Ipv4Addr::new(127, 0, 0, 31), sg.addr);
    first.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhello").unwrap();
    wait_for("the first body to be forwarded", Duration::from_secs(10), || {
        accepted.load(Ordering::SeqCst) == 1
    });
    let addr = sg.addr;
    let second = thread::spawn(move || {
        let mut stream = connect_from(Ipv4Addr::new(127, 0, 0, 32), addr);
        stream.write_all(b"GET /api/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        reply_status(&stream, Duration::from_secs(10))
    });
    // The second request now waits for the one slot (up to 1 s).
    thread::sleep(Duration::from_millis(200));
    first.write_all(b"world").unwrap();
    assert_eq!(reply_status(&first, Duration::from_secs(10)), Some(200));
    assert_eq!(second.join().unwrap(), Some(200));
    // The first connection was closed for it, and a second one opened.
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

/// Whether a reply (or a close) is waiting on `stream`, without taking it.
fn answered(stream: &TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    let answered = !matches!(stream.peek(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    stream.set_nonblocking(false).unwrap();
    answered
}

#[test]
fn seventeen_clients_at_their_share_cannot_take_the_whole_upstream_pool() {
    // Before: each client's share was a fixed sixteenth of the pool (4 of
    // 64), so 17 clients trickling 4 bodies each (one IPv6 user with a /60
    // has 16 /64s) held all 64 connections, and every other client waited
    // 1 s and got 503. A body above `min_body_rate` is never cut; here the
    // grace outlasts the test, which is the same to the pool.
    let (target, accepted) = counting_upstream();
    let server = "admin_on_public = true\nbody_timeout = \"60s\"\nbody_rate_grace = \"60s\"\nmax_upstream_connections = 64";
    let text = config_with(target, server, "", "");
    let sg = Slidegate::start(&text);
    let clients: Vec<Ipv4Addr> = (40..57).map(|i| Ipv4Addr::new(127, 0, 0, i)).collect();
    // Round by round (each client's first body, then each one's second...),
    // each body forwarded or answered before the next one starts.
    let mut trickles = Vec::new();
    for _ in 0..4 {
        for &from in &clients {
            let before = accepted.load(Ordering::SeqCst);
            let stream = start_trickle(from, sg.addr);
            wait_for("the body to be forwarded or answered", Duration::from_secs(10), || {
                accepted.load(Ordering::SeqCst) > before || answered(&stream)
            });
            trickles.push(stream);
        }
    }
    // A client holding h may forward another only while more than 4 × h
    // connections are free: 17 first bodies (47 free), 17 second ones (30
    // free), 17 third ones (13 free), and one fourth (12 free).
    assert_eq!(accepted.load(Ordering::SeqCst), 52);
    let replies: Vec<Option<String>> = trickles
        .iter()
        .map(|s| {
            answered(s).then(|| {
                let mut text = String::new();
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let _ = (&mut &*s).read_to_string(&mut text);
                text
            })
        })
        .collect();
    assert_eq!(replies.iter().filter(|r| r.is_none()).count(), 52);
    let crowded =
        "\"detail\":\"this client already has 3 requests in flight to the upstream, and only 12 of \
                   its 64 connections are free: a client may add one while more than 4 times what it holds \
                   are free; retry when one has finished\"";
    for reply in replies.iter().flatten() {
        assert!(reply.starts_with("HTTP/1.1 429 Too Many Requests\r\n"), "{reply}");
        assert!(reply.contains(crowded), "{reply}");
    }

    // Twenty other clients, one request each, all at once: all served.
    let legitimate: Vec<_> = (0..20)
        .map(|i| {
            let addr = sg.addr;
            thread::spawn(move || {
                let mut stream = connect_from(Ipv4Addr::new(127, 0, 1, 40 + i), addr);
                stream.write_all(b"GET /api/items HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
                reply_status(&stream, Duration::from_secs(10))
            })
        })
        .collect();
    let statuses: Vec<Option<u16>> = legitimate.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(statuses, vec![Some(200); 20]);
}
