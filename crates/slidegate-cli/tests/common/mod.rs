//! The harness of the end-to-end tests: a real upstream HTTP server, a real
//! `slidegate serve` process and a std-only HTTP/1.1 client, all on loopback
//! sockets, so what is tested is slidegate's behaviour on the wire, headers
//! byte for byte. Shared by `serve.rs` and `attacks.rs`; each test binary
//! uses a part of it.

#![allow(dead_code, clippy::unwrap_used)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

pub use slidegate_test_redis::RedisServer;

pub const SECRET_ENV: &str = "SLIDEGATE_TEST_IP_SECRET";

// ---------------------------------------------------------------- upstream

/// An HTTP/1.1 upstream: answers `{method} {target} xff={x-forwarded-for}`,
/// or echoes the request body for `POST /echo`; counts requests.
pub struct Upstream {
    pub addr: SocketAddr,
    pub hits: Arc<AtomicUsize>,
    pub stop: Arc<AtomicBool>,
}

impl Upstream {
    pub fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (h, s) = (Arc::clone(&hits), Arc::clone(&stop));
        thread::spawn(move || {
            for stream in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let h = Arc::clone(&h);
                thread::spawn(move || serve_upstream(stream, &h));
            }
        });
        Upstream { addr, hits, stop }
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

pub fn serve_upstream(stream: TcpStream, hits: &AtomicUsize) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    // Keep-alive: the proxy pools connections.
    while let Some((request_line, headers)) = read_head(&mut reader) {
        let mut parts = request_line.split(' ');
        let (method, target) = (parts.next().unwrap_or("").to_owned(), parts.next().unwrap_or("").to_owned());
        let body = read_body(&mut reader, &headers);
        hits.fetch_add(1, Ordering::SeqCst);
        let reply = if method == "POST" && target == "/echo" {
            body
        } else {
            let xff = headers.get("x-forwarded-for").cloned().unwrap_or_default();
            format!("{method} {target} xff={xff}").into_bytes()
        };
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nx-upstream: yes\r\n\r\n",
            reply.len()
        );
        if writer.write_all(head.as_bytes()).and_then(|()| writer.write_all(&reply)).is_err() {
            return;
        }
    }
}

/// Reads a request or response head: first line and lower-cased headers.
pub fn read_head(reader: &mut impl BufRead) -> Option<(String, HashMap<String, String>)> {
    let mut first = String::new();
    if reader.read_line(&mut first).ok()? == 0 {
        return None;
    }
    let mut headers: HashMap<String, String> = HashMap::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':')?;
        let name = name.trim().to_ascii_lowercase();
        let value = value.trim().to_owned();
        headers.entry(name).and_modify(|v| *v = format!("{v}, {value}")).or_insert(value);
    }
    Some((first.trim_end().to_owned(), headers))
}

pub fn read_body(reader: &mut impl BufRead, headers: &HashMap<String, String>) -> Vec<u8> {
    if headers.get("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        let mut body = Vec::new();
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).unwrap();
            let size = usize::from_str_radix(size.trim().split(';').next().unwrap(), 16).unwrap();
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).unwrap();
            if size == 0 {
                return body;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    }
    let len: usize = headers.get("content-length").map_or(0, |v| v.parse().unwrap());
    let mut body = vec![0; len];
    reader.read_exact(&mut body).unwrap();
    body
}

// ---------------------------------------------------------------- client

#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: HashMap<String, String>,
    pub body: String,
    pub elapsed: Duration,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// The `r=` of the first item of `reply`'s `RateLimit` header: what is
/// left; `None` without the header.
pub fn remaining(reply: &Reply) -> Option<u64> {
    let header = reply.header("ratelimit")?;
    header.split(';').find_map(|p| p.strip_prefix("r=")).and_then(|r| r.parse().ok())
}

pub fn request(addr: SocketAddr, method: &str, target: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
    let start = Instant::now();
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut head = format!("{method} {target} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        head.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut reader = BufReader::new(stream);
    let (status_line, headers) = read_head(&mut reader).expect("a response");
    let status = status_line.split(' ').nth(1).unwrap().parse().unwrap();
    let body = read_body(&mut reader, &headers);
    Reply { status, headers, body: String::from_utf8_lossy(&body).into_owned(), elapsed: start.elapsed() }
}

pub fn get(addr: SocketAddr, target: &str, headers: &[(&str, &str)]) -> Reply {
    request(addr, "GET", target, headers, b"")
}

// ---------------------------------------------------------------- slidegate

/// A `slidegate serve` process, killed on drop; its stderr is kept and
/// printed when a test fails.
pub struct Slidegate {
    pub child: Child,
    pub addr: SocketAddr,
    pub log: Arc<Mutex<String>>,
    _dir: tempfile::TempDir,
}

pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_slidegate")
}

pub fn write_config(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("slidegate.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

/// The full id (`k:` and 32 hex digits) `slidegate identity hash --full`
/// prints for the API key `key` under the config at `config`, hashed with
/// the secret every [`Slidegate`] runs with.
pub fn full_key_id(config: &std::path::Path, key: &str) -> String {
    let out = Command::new(binary())
        .args(["identity", "hash", "--full", "--key", key, "--config"])
        .arg(config)
        .env(SECRET_ENV, "end-to-end-secret")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let id = String::from_utf8(out.stdout).unwrap().trim_end().to_owned();
    assert!(id.starts_with("k:") && id.len() == 34, "{id:?}");
    id
}

impl Slidegate {
    pub fn start(config: &str) -> Slidegate {
        let (dir, path) = write_config(config);
        let mut child = Command::new(binary())
            .args(["serve", "--config"])
            .arg(&path)
            .env(SECRET_ENV, "end-to-end-secret")
            .env("SLIDEGATE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let sink = Arc::clone(&log);
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                if let Some(rest) = line.strip_prefix("slidegate: listening on ") {
                    let addr: SocketAddr = rest.split(',').next().unwrap().parse().unwrap();
                    let _ = tx.send(addr);
                }
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let addr = rx.recv_timeout(Duration::from_secs(20)).unwrap_or_else(|_| {
            let _ = child.kill();
            panic!("slidegate did not start:\n{}", log.lock().unwrap())
        });
        Slidegate { child, addr, log, _dir: dir }
    }

    pub fn get(&self, target: &str, headers: &[(&str, &str)]) -> Reply {
        get(self.addr, target, headers)
    }

    /// The admin listener's address, announced before the public one.
    pub fn admin_addr(&self) -> SocketAddr {
        let log = self.log.lock().unwrap();
        let line = log.lines().find_map(|l| l.strip_prefix("slidegate: admin endpoints on "));
        line.unwrap_or_else(|| panic!("no admin address announced:\n{log}")).parse().unwrap()
    }

    pub fn metrics(&self) -> HashMap<String, f64> {
        let reply = self.get("/metrics", &[]);
        assert_eq!(reply.status, 200, "{reply:?}");
        reply
            .body
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .filter_map(|l| l.rsplit_once(' '))
            .map(|(name, value)| (name.to_owned(), value.parse().unwrap()))
            .collect()
    }

    pub fn metric(&self, name: &str) -> f64 {
        *self.metrics().get(name).unwrap_or_else(|| panic!("no metric {name}"))
    }

    pub fn terminate(&mut self) -> ExitStatus {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "slidegate did not stop on SIGTERM");
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Slidegate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if thread::panicking() {
            eprintln!("--- slidegate log ---\n{}", self.log.lock().unwrap());
        }
    }
}

/// The head every test configuration starts with: `[server]` on a free
/// loopback port forwarding to `upstream`, with the lines `server` adds to
/// that table (`""` for none), then `store` (a `[store]` table, or `""` for
/// the embedded store's defaults).
pub fn config_head(upstream: SocketAddr, server: &str, store: &str) -> String {
    format!("[server]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{upstream}\"\n{server}\n\n{store}\n")
}

/// [`config_head`] and the `[identity]` most tests share: API keys in
/// `x-api-key`, addresses hashed under the test's [`SECRET_ENV`].
pub fn keyed_head(upstream: SocketAddr, server: &str, store: &str) -> String {
    let head = config_head(upstream, server, store);
    format!("{head}\n[identity]\napi_key_header = \"x-api-key\"\nip_hash_secret_env = \"{SECRET_ENV}\"\n")
}

/// The test configuration: quotas small enough to exhaust, exact by algorithm,
/// with the admin endpoints on the public listener.
pub fn config(upstream: &Upstream, store: &str, trusted: &str) -> String {
    config_with(upstream.addr, "admin_on_public = true", store, trusted)
}

/// [`config`]'s rules and identity forwarding to `upstream`, with `server`
/// as the `[server]` table's own lines (`""` for none: the admin endpoints
/// then stay off the public listener, as an operator gets by default).
pub fn config_with(upstream: SocketAddr, server: &str, store: &str, trusted: &str) -> String {
    format!(
        r#"{head}
[identity]
api_key_header = "x-api-key"
ip_hash_secret_env = "{SECRET_ENV}"
trusted_proxies = [{trusted}]

[[rules]]
name = "trending"
path = "/api/videos/trending"
methods = ["GET"]
anonymous = [{{ limit = 3, window = "60s", algorithm = "sliding_log" }}]
authenticated = [{{ limit = 5, window = "60s", algorithm = "sliding_log" }}]

[[rules]]
name = "search"
path = "/api/search*"
limits = [{{ limit = 2, window = "60s", algorithm = "sliding_log" }}, {{ limit = 100, window = "1h", algorithm = "sliding_log" }}]
"#,
        head = config_head(upstream, server, store),
    )
}

pub fn embedded(upstream: &Upstream) -> Slidegate {
    Slidegate::start(&config(upstream, "", r#""10.0.0.0/8""#))
}

// ---------------------------------------------------------------- Redis

/// The failure-handling tests count store calls and fail-open answers per
/// request, so the deny cache (which answers known denials locally, Redis up
/// or down) is off here; `attacks/scrapers.rs` tests it.
pub fn redis_store(redis: &RedisServer) -> String {
    format!(
        "[store]\nurl = \"{}\"\ntimeout_ms = 50\non_error = \"allow\"\nbreaker_failures = 3\nprobe_interval_ms = 100\ndeny_cache = 0\n",
        redis.url()
    )
}

/// A Redis store for tests of what Redis decides, not of its failures: a
/// call may wait 10 s, so a loaded machine's slow reply is still Redis's
/// decision (a 50 ms timeout would make it the failure policy's, now and
/// then, and an extra probe call in Redis's counts).
pub fn redis_decides(redis: &RedisServer) -> String {
    format!("[store]\nurl = \"{}\"\ntimeout_ms = 10000\n", redis.url())
}

pub fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(25));
    }
}

// ---------------------------------------------------------------- many clients

/// A connection to `addr` from the loopback address `from`: Linux routes all
/// of 127/8 to `lo`, so each address is a client of its own to slidegate.
pub fn connect_from(from: std::net::Ipv4Addr, addr: SocketAddr) -> TcpStream {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap();
    runtime.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::from((from, 0))).unwrap();
        let stream = socket.connect(addr).await.unwrap().into_std().unwrap();
        stream.set_nonblocking(false).unwrap();
        stream
    })
}

// ---------------------------------------------------------------- reload

impl Slidegate {
    /// The configuration file the process was started with: a test rewrites
    /// it and reloads.
    pub fn config_path(&self) -> PathBuf {
        self._dir.path().join("slidegate.toml")
    }

    /// One metric, read from the admin endpoints at `addr`.
    pub fn metric_at(&self, addr: SocketAddr, name: &str) -> f64 {
        let reply = get(addr, "/metrics", &[]);
        assert_eq!(reply.status, 200, "{reply:?}");
        let line = reply.body.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')));
        line.unwrap_or_else(|| panic!("no metric {name}")).parse().unwrap()
    }
}
