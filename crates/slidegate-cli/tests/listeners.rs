//! `serve`'s listeners as an operator meets them: `check-config` takes
//! and refuses `[server] connections` as `serve` does, and memory comes
//! back after connections close: 10,000 keep-alive
//! connections to the forward-auth hook, each asked once and held, then
//! all closed, twice, leave `serve`'s RSS (read from /proc/PID/status)
//! within 20 MB of where it started. Before `heap_trim`, glibc kept what
//! the connections freed: 22 MB at the start, 219 MB after the first round
//! closed, 283 MB after the second.
//!
//! Bounded: each round has 120 s to open its connections, and the RSS
//! 30 s (six trims) to come back.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{binary, config_head, config_with, get, write_config, Slidegate, Upstream};

const CONNECTIONS: usize = 10_000;
const ROUNDS: usize = 2;
/// How far above its start RSS may end.
const SLACK_KB: u64 = 20 * 1024;

/// The process's resident set, in KB.
fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap();
    line.trim().trim_end_matches("kB").trim().parse().unwrap()
}

/// This process's soft limit on open files, raised to its hard limit
/// (`prlimit`, util-linux) when below what the test holds; `serve`,
/// started after, inherits it.
fn enough_files(needed: u64) {
    let soft = |which: usize| -> u64 {
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
        let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
        let value = line.split_whitespace().nth(3 + which).unwrap();
        value.parse().unwrap_or(u64::MAX)
    };
    if soft(0) < needed {
        let pid = std::process::id().to_string();
        let hard = soft(1);
        let set = format!("--nofile={hard}:{hard}");
        let status = std::process::Command::new("prlimit").args(["--pid", &pid, &set]).status().unwrap();
        assert!(status.success(), "prlimit {set} failed");
    }
    assert!(soft(0) >= needed, "the open-file limit ({}) is below the {needed} this test needs", soft(0));
}

/// One hook request on `stream`, its answer read whole (`content-length: 0`).
fn ask(stream: &mut TcpStream, auth: SocketAddr) {
    let request = format!(
        "GET / HTTP/1.1\r\nhost: {auth}\r\nx-forwarded-method: GET\r\nx-forwarded-uri: /api/free\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(stream.read(&mut byte).unwrap(), 1, "the hook closed the connection");
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
}

/// Waits up to 30 s for RSS to come within [`SLACK_KB`] of `start`; the last reading.
fn settled(pid: u32, start: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let rss = rss_kb(pid);
        if rss <= start + SLACK_KB || Instant::now() > deadline {
            return rss;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn ten_thousand_connections_closed_twice_give_their_memory_back() {
    enough_files(CONNECTIONS as u64 + 1_000);
    let upstream = Upstream::start();
    let server = "auth_listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
                  connections.auth = { max = 10000 }";
    let sg = Slidegate::start(&config_with(upstream.addr, server, "", "\"127.0.0.1/32\""));
    let auth: SocketAddr = {
        let log = sg.log.lock().unwrap();
        let line = log.lines().find_map(|l| l.strip_prefix("slidegate: forward auth on "));
        line.unwrap_or_else(|| panic!("no forward-auth address:\n{log}")).parse().unwrap()
    };
    let admin = sg.admin_addr();
    let pid = sg.child.id();
    // Warm: the first request's one-time allocations are not the connections'.
    ask(&mut TcpStream::connect(auth).unwrap(), auth);
    let start = rss_kb(pid);
    let mut readings = Vec::new();
    for round in 0..ROUNDS {
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut held = Vec::with_capacity(CONNECTIONS);
        for _ in 0..CONNECTIONS {
            let mut stream = TcpStream::connect(auth).unwrap();
            stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            ask(&mut stream, auth);
            held.push(stream);
            assert!(Instant::now() < deadline, "round {round}: 10,000 connections took over 120 s");
        }
        let open = metric(admin, "slidegate_listener_connections{listener=\"auth\"}");
        assert_eq!(open, CONNECTIONS as f64, "round {round}: every connection held open");
        let high = rss_kb(pid);
        drop(held);
        let after = settled(pid, start);
        readings.push((high, after));
        eprintln!("round {round}: start {start} kB, held {high} kB, closed {after} kB");
    }
    for (round, (high, after)) in readings.into_iter().enumerate() {
        assert!(
            after <= start + SLACK_KB,
            "round {round}: RSS {after} kB after the close (held: {high} kB), more than 20 MB above the start, {start} kB"
        );
    }
}

/// One value of the admin listener's `/metrics`.
fn metric(admin: SocketAddr, name: &str) -> f64 {
    let reply = get(admin, "/metrics", &[]);
    let line = reply.body.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')));
    line.unwrap_or_else(|| panic!("no metric {name}:\n{}", reply.body)).parse().unwrap()
}

#[test]
fn check_config_takes_and_refuses_the_connection_bounds_as_serve_does() {
    let upstream: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let run = |server: &str| {
        let (_dir, path) = write_config(&config_head(upstream, server, ""));
        let check = std::process::Command::new(binary()).arg("check-config").arg(&path).output().unwrap();
        let serve =
            std::process::Command::new(binary()).args(["serve", "--config"]).arg(&path).output().unwrap();
        (check, serve, _dir)
    };
    let (_dir, path) = write_config(&config_head(
        upstream,
        "connections.grpc = { max = 8, header_timeout = \"5s\", idle_timeout = \"2m\" }",
        "",
    ));
    let ok = std::process::Command::new(binary()).arg("check-config").arg(&path).output().unwrap();
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    for (server, says) in [
        ("connections.auth = { max = 0 }", "connections.auth.max must be 1 to 1000000, got 0"),
        ("connections.auth = { max = -3 }", "connections.auth.max must be 1 to 1000000, got -3"),
        (
            "connections.public = { max = 5000000 }",
            "connections.public.max must be 1 to 1000000, got 5000000",
        ),
        ("connections.admin = { max = \"many\" }", "invalid type"),
        (
            "connections.grpc = { idle_timeout = \"0s\" }",
            "connections.grpc.idle_timeout must be longer than 0",
        ),
        ("connections.public = { header_timeout = \"1d\" }", "at most 600s"),
        ("connections.hook = { max = 5 }", "unknown field `hook`"),
    ] {
        let (check, serve, _dir) = run(server);
        for (what, out) in [("check-config", &check), ("serve", &serve)] {
            assert_eq!(out.status.code(), Some(64), "{what} {server}: {out:?}");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains(says) && stderr.contains("slidegate.toml:4:"),
                "{what} {server}: {stderr}"
            );
        }
    }
}
