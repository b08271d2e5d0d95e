//! Envoy-like load on `slidegate serve`, in one run: `ShouldRateLimit` over
//! gRPC (HTTP/2, many concurrent streams, 1–3 descriptors a request) side
//! by side with `POST /v1/check` (HTTP/1.1 keep-alive connections, one
//! decision a call), on the embedded store and on Redis. Prints one JSON
//! line per (store, api): decisions/s and latency percentiles.
//!
//! ```text
//! cargo run --release -p slidegate-server --example envoy_bench -- [SECONDS] [REDIS_URL]
//! ```
//!
//! The server runs in a child process: besides the rates (which on a shared
//! machine follow its load), each line gives the server's CPU time per
//! decision, which does not (and the load generator's own, which the
//! rates include, and on Redis redis-server's, found by its `INFO`).
//!
//! For instruction counts, `ENVOY_BENCH_WRAP` prefixes the child's command
//! (e.g. `valgrind --tool=callgrind --instr-atstart=no`) and
//! `ENVOY_BENCH_APIS` picks the runs (`v1_check`, `grpc_1_descriptor`,
//! `grpc_1_to_3_descriptors`, comma-separated; all by default); the bench
//! then turns callgrind's collection on for each run only (with
//! `callgrind_control -i`) and dumps each run's counts (`-d`: one file a
//! run, `OUT.1`, `OUT.2`, ...), so the counts are the runs' alone.
//!
//! The two load generators are equally lean, so that neither bounds its
//! API's rate more than the other on a machine the server shares: gRPC is
//! the `h2` crate's client over 2 connections, sending request messages
//! encoded once (each call writes its fresh identities into a copy), and
//! checking each answer's `grpc-status` and decoded `overall_code`;
//! `/v1/check` is hyper's HTTP/1.1 client, one connection per caller.
//!
//! Both APIs decide through the same limiter and rule
//! (`envoy/bench/user`); each call charges fresh identities drawn from a
//! large key space, so nothing is denied and every decision reaches the store.

#![allow(clippy::unwrap_used, missing_docs)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use prost::Message;
use slidegate_server::envoy::proto::{
    Entry, RateLimitDescriptor, RateLimitRequest, RateLimitResponse, SHOULD_RATE_LIMIT,
};
use slidegate_server::{Config, Server};

const YAML: &str = "domain: bench\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: second\n      requests_per_unit: 1000000\n";
/// Concurrent callers (Envoy keeps many streams open on few connections).
const CALLERS: usize = 64;
/// HTTP/2 connections for gRPC, shared by the callers.
const CHANNELS: usize = 2;

struct Tally {
    decisions: AtomicU64,
    latencies: Mutex<hdrhistogram::Histogram<u64>>,
}

impl Tally {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            decisions: AtomicU64::new(0),
            latencies: Mutex::new(hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 3).unwrap()),
        })
    }

    fn record(&self, decisions: u64, started: Instant) {
        self.decisions.fetch_add(decisions, Relaxed);
        let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX).max(1);
        self.latencies.lock().unwrap().saturating_record(us);
    }

    /// One JSON line; `cpu` is the server's, the load generator's and
    /// (on Redis) redis-server's CPU time over the run.
    fn report(&self, store: &str, api: &str, seconds: f64, cpu: [Duration; 3]) {
        let h = self.latencies.lock().unwrap();
        let decisions = self.decisions.load(Relaxed);
        let per_decision = |cpu: Duration| cpu.as_secs_f64() * 1e6 / decisions.max(1) as f64;
        println!(
            "{{\"store\":\"{store}\",\"api\":\"{api}\",\"callers\":{CALLERS},\"decisions\":{decisions},\
             \"decisions_per_s\":{:.0},\"calls_per_s\":{:.0},\"server_cpu_us_per_decision\":{:.1},\
             \"client_cpu_us_per_decision\":{:.1},\"redis_cpu_us_per_decision\":{:.1},\
             \"p50_us\":{},\"p99_us\":{},\"p999_us\":{}}}",
            decisions as f64 / seconds,
            h.len() as f64 / seconds,
            per_decision(cpu[0]),
            per_decision(cpu[1]),
            per_decision(cpu[2]),
            h.value_at_quantile(0.5),
            h.value_at_quantile(0.99),
            h.value_at_quantile(0.999),
        );
    }
}

/// The server, in a child process (this program with `serve STORE`), so
/// its CPU time is its own: the child, its gRPC and admin addresses.
fn start(store: &str) -> (std::process::Child, SocketAddr, SocketAddr) {
    use std::io::BufRead;
    let exe = std::env::current_exe().unwrap();
    let wrap = std::env::var("ENVOY_BENCH_WRAP").unwrap_or_default();
    let mut words = wrap.split_whitespace();
    let mut command = match words.next() {
        Some(program) => {
            let mut command = std::process::Command::new(program);
            command.args(words).arg(exe);
            command
        }
        None => std::process::Command::new(exe),
    };
    let mut child = command.args(["serve", store]).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let (grpc, admin) = line.trim().split_once(' ').unwrap();
    (child, grpc.parse().unwrap(), admin.parse().unwrap())
}

/// Turns callgrind's collection in the child on or off, when it runs
/// under callgrind (`ENVOY_BENCH_WRAP`); callgrind then counts only the
/// runs' instructions.
fn collect(pid: u32, on: bool) {
    if std::env::var("ENVOY_BENCH_WRAP").is_ok_and(|w| w.contains("callgrind")) {
        // Off: the run's counts dumped first (the child is killed at the end).
        let commands: &[&[&str]] = if on { &[&["-i", "on"]] } else { &[&["-d"], &["-i", "off"]] };
        for args in commands {
            let done = std::process::Command::new("callgrind_control")
                .args(*args)
                .arg(pid.to_string())
                .stdout(std::process::Stdio::null())
                .status()
                .unwrap();
            assert!(done.success(), "callgrind_control {args:?} {pid} failed");
        }
    }
}

/// The child's user + system CPU time (Linux `/proc/PID/stat`).
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // USER_HZ is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

/// The process id of the redis-server at `url` (asked with `redis-cli`),
/// whose CPU time the Redis runs report too.
fn redis_pid(url: &str) -> u32 {
    let info = std::process::Command::new("redis-cli").args(["-u", url, "INFO", "server"]).output().unwrap();
    let info = String::from_utf8_lossy(&info.stdout);
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|pid| pid.trim().parse().ok())
        .unwrap_or_else(|| panic!("no redis-server answers at {url}"))
}

/// `serve STORE`: runs `serve` as the binary does (the acceptor on a
/// work-stealing runtime, `threads = 2` workers serving HTTP and gRPC),
/// and prints its addresses.
fn serve(store: &str, dir: &std::path::Path) {
    std::fs::write(dir.join("rl.yaml"), YAML).unwrap();
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ngrpc_listen = \"127.0.0.1:0\"\n\
         upstream = \"http://127.0.0.1:9\"\nthreads = 2\n[identity]\nip_hash_secret_env = \"BENCH_SECRET\"\n\
         {store}\n[envoy]\nconfig = \"rl.yaml\"\n"
    );
    let env = |name: &str| (name == "BENCH_SECRET").then(|| "bench".to_owned());
    let config = Config::parse_with_env(&toml, dir.join("s.toml"), &env).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async move {
        let server = Server::bind(&config).await.unwrap();
        println!("{} {}", server.grpc_addr().unwrap(), server.admin_addr().unwrap());
        server.run(std::future::pending()).await;
    });
}

/// The digits of an identity (`u` and a counter, zero-padded): fixed, so
/// that each call writes its identities into a copy of one encoded message.
const DIGITS: usize = 16;

/// A `ShouldRateLimit` request of `n` descriptors, framed as gRPC sends it
/// (uncompressed flag, length, message), encoded once; and where each
/// descriptor's value digits sit in it.
struct Template {
    framed: Vec<u8>,
    digits: Vec<usize>,
}

impl Template {
    fn new(n: usize) -> Self {
        let placeholder = format!("u{}", "#".repeat(DIGITS));
        let request = RateLimitRequest {
            domain: "bench".into(),
            descriptors: (0..n)
                .map(|_| RateLimitDescriptor {
                    entries: vec![Entry { key: "user".into(), value: placeholder.clone() }],
                    ..Default::default()
                })
                .collect(),
            hits_addend: 0,
        };
        let message = request.encode_to_vec();
        let mut framed = vec![0];
        framed.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
        framed.extend_from_slice(&message);
        let hashes = "#".repeat(DIGITS);
        let digits: Vec<usize> = framed
            .windows(DIGITS)
            .enumerate()
            .filter(|(_, w)| *w == hashes.as_bytes())
            .map(|(i, _)| i)
            .collect();
        assert_eq!(digits.len(), n);
        Self { framed, digits }
    }

    /// A copy with fresh identities from `next`.
    fn fill(&self, next: &AtomicU64) -> Bytes {
        let mut framed = BytesMut::from(&self.framed[..]);
        for &at in &self.digits {
            let mut id = next.fetch_add(1, Relaxed);
            for digit in framed[at..at + DIGITS].iter_mut().rev() {
                *digit = b'0' + (id % 10) as u8;
                id /= 10;
            }
        }
        framed.freeze()
    }
}

/// One `ShouldRateLimit` call on `client`: the request sent whole, the
/// answer read and checked (`grpc-status` 0, every descriptor `OK`).
async fn should_rate_limit(client: &mut h2::client::SendRequest<Bytes>, uri: &http::Uri, body: Bytes) {
    let request = http::Request::post(uri.clone())
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let mut ready = client.clone().ready().await.unwrap();
    let (response, mut send) = ready.send_request(request, false).unwrap();
    send.send_data(body, true).unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut data = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await.unwrap().expect("gRPC trailers");
    assert_eq!(trailers.get("grpc-status").map(|v| v.as_bytes()), Some(&b"0"[..]), "{trailers:?}");
    let mut data = data.freeze();
    assert_eq!(data.get_u8(), 0, "an uncompressed message");
    let len = data.get_u32() as usize;
    assert_eq!(data.len(), len);
    assert_eq!(RateLimitResponse::decode(data).unwrap().overall_code, 1);
}

async fn grpc(addr: SocketAddr, seconds: u64, per_call: Option<u64>) -> Arc<Tally> {
    let tally = Tally::new();
    let next = Arc::new(AtomicU64::new(0));
    let templates: Arc<Vec<Template>> = Arc::new((1..=3).map(Template::new).collect());
    let uri: http::Uri = format!("http://{addr}{SHOULD_RATE_LIMIT}").parse().unwrap();
    let mut clients = Vec::new();
    for _ in 0..CHANNELS {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tcp.set_nodelay(true).unwrap();
        let (client, connection) = h2::client::handshake(tcp).await.unwrap();
        tokio::spawn(connection);
        clients.push(client);
    }
    let end = Instant::now() + Duration::from_secs(seconds);
    let tasks: Vec<_> = (0..CALLERS)
        .map(|i| {
            let mut client = clients[i % CHANNELS].clone();
            let (tally, next, templates, uri) =
                (Arc::clone(&tally), Arc::clone(&next), Arc::clone(&templates), uri.clone());
            tokio::spawn(async move {
                let mut call = i as u64;
                while Instant::now() < end {
                    // 1, 2, 3 descriptors in turn, unless fixed.
                    let n = per_call.unwrap_or(call % 3 + 1);
                    call += 1;
                    let body = templates[n as usize - 1].fill(&next);
                    let started = Instant::now();
                    should_rate_limit(&mut client, &uri, body).await;
                    tally.record(n, started);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    tally
}

async fn check(addr: SocketAddr, seconds: u64) -> Arc<Tally> {
    let tally = Tally::new();
    let next = Arc::new(AtomicU64::new(1 << 40));
    let end = Instant::now() + Duration::from_secs(seconds);
    let tasks: Vec<_> = (0..CALLERS)
        .map(|_| {
            let (tally, next) = (Arc::clone(&tally), Arc::clone(&next));
            tokio::spawn(async move {
                let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
                stream.set_nodelay(true).unwrap();
                let (mut sender, conn) =
                    hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                        .await
                        .unwrap();
                tokio::spawn(conn);
                while Instant::now() < end {
                    let body = format!(
                        "{{\"rule\":\"envoy/bench/user\",\"key\":\"u{}\"}}",
                        next.fetch_add(1, Relaxed)
                    );
                    let request = http::Request::post("/v1/check")
                        .header("host", "bench")
                        .header("content-type", "application/json")
                        .body(Full::new(Bytes::from(body)))
                        .unwrap();
                    let started = Instant::now();
                    let response = sender.send_request(request).await.unwrap();
                    assert_eq!(response.status(), 200);
                    response.into_body().collect().await.unwrap();
                    tally.record(1, started);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    tally
}

fn main() {
    let mut args = std::env::args().skip(1);
    let first = args.next();
    if first.as_deref() == Some("serve") {
        let dir = tempfile::tempdir().unwrap();
        return serve(&args.next().unwrap_or_default(), dir.path());
    }
    let seconds: u64 = first.map_or(5, |s| s.parse().unwrap());
    let mut stores = vec![("embedded", String::new(), None)];
    if let Some(url) = args.next() {
        let pid = redis_pid(&url);
        stores.push(("redis", format!("[store]\nurl = \"{url}\"\n"), Some(pid)));
    }
    let apis = std::env::var("ENVOY_BENCH_APIS")
        .unwrap_or_else(|_| "v1_check,grpc_1_descriptor,grpc_1_to_3_descriptors".to_owned());
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    for (name, store, redis_pid) in stores {
        let (mut child, grpc_addr, admin_addr) = start(&store);
        let pid = child.id();
        runtime.block_on(async {
            // Alternated, each twice, so drift in the machine's load hits both.
            for _ in 0..2 {
                for api in ["v1_check", "grpc_1_descriptor", "grpc_1_to_3_descriptors"] {
                    if !apis.split(',').any(|a| a == api) {
                        continue;
                    }
                    let (cpu, own, redis) = (
                        cpu_time(pid),
                        cpu_time(std::process::id()),
                        redis_pid.map_or(Duration::ZERO, cpu_time),
                    );
                    collect(pid, true);
                    let tally = match api {
                        "v1_check" => check(admin_addr, seconds).await,
                        "grpc_1_descriptor" => grpc(grpc_addr, seconds, Some(1)).await,
                        _ => grpc(grpc_addr, seconds, None).await,
                    };
                    collect(pid, false);
                    let own = cpu_time(std::process::id()) - own;
                    let redis = redis_pid.map_or(Duration::ZERO, cpu_time) - redis;
                    tally.report(name, api, seconds as f64, [cpu_time(pid) - cpu, own, redis]);
                }
            }
        });
        let _ = child.kill();
        let _ = child.wait();
    }
}
