//! `slidegate bench redis`: decisions per second, latency, Redis server CPU
//! and memory per identity, for every algorithm of [`RedisStore`] and for the
//! source article's reference script, side by side in one run.
//!
//! Each phase is bounded in time (`--seconds`) or in count, and only a
//! loopback Redis is accepted: this is load, and it stays on this machine.
//! Keys are written under a prefix unique to the run and deleted afterwards;
//! `CONFIG RESETSTAT` is issued before each phase, so run it against a Redis
//! of its own.

use std::net::IpAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{AsyncCommands, ConnectionAddr, Script};
use serde_json::{json, Map, Value};
use slidegate::{Algorithm, Limit, ManualClock, Quota, RedisStore, Store, SystemClock, TimeSource};

/// The source article's sliding window counter (seeds/000), the published
/// baseline slidegate is measured against. Used only here and in `demo`.
const REFERENCE_SCRIPT: &str = include_str!("reference_script.lua");

/// Arguments of `slidegate bench`.
#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    target: Target,
}

#[derive(clap::Subcommand)]
enum Target {
    /// Drive decisions through the Redis store at full speed (loopback Redis only).
    Redis(RedisArgs),
}

/// Arguments of `slidegate bench redis`.
#[derive(clap::Args)]
struct RedisArgs {
    /// The Redis to measure, e.g. redis://127.0.0.1:7400/ (loopback only; it gets CONFIG RESETSTAT).
    #[arg(long)]
    redis_url: String,
    /// Seconds of load per algorithm.
    #[arg(long, default_value_t = 5.0, value_parser = crate::args::seconds(3600.0))]
    seconds: f64,
    /// Redis connections (each multiplexed: requests in flight share it).
    #[arg(long, default_value_t = 4, value_parser = crate::args::count(1..=64))]
    connections: usize,
    /// Requests in flight per connection.
    #[arg(long, default_value_t = 32, value_parser = crate::args::count(1..=1024))]
    in_flight: usize,
    /// Identities the load cycles through.
    #[arg(long, default_value_t = 100_000, value_parser = crate::args::count(1..=10_000_000))]
    identities: usize,
    /// Identities created to measure memory per identity (used_memory delta).
    #[arg(long, default_value_t = 200_000, value_parser = crate::args::count(1..=10_000_000))]
    memory_identities: usize,
    /// The limit per window (the article's 100 per 60 s by default).
    #[arg(long, default_value_t = 100)]
    limit: u64,
    /// The window in seconds.
    #[arg(long, default_value_t = 60)]
    window_secs: u64,
    /// Send the client's clock with each decision instead of reading Redis
    /// `TIME` in the script (saves one call; app servers must then agree on the time).
    #[arg(long)]
    client_time: bool,
    /// Skip the `redis-benchmark -P 16` measurement even if it is on PATH.
    #[arg(long)]
    no_redis_benchmark: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Runs `slidegate bench`.
pub fn run(args: BenchArgs) -> crate::CommandResult {
    match args.target {
        Target::Redis(args) => {
            let runtime =
                tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
            runtime.block_on(bench_redis(args))
        }
    }
}

/// What was measured for one algorithm (or the reference script).
#[derive(Debug, Clone, Copy)]
struct Figures {
    decisions_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    server_us_per_decision: f64,
    bytes_per_identity: f64,
    allowed_pct: f64,
}

impl Figures {
    fn to_json(self) -> Value {
        json!({
            "decisions_per_sec": round(self.decisions_per_sec, 0),
            "p50_us": round(self.p50_us, 1),
            "p99_us": round(self.p99_us, 1),
            "server_us_per_decision": round(self.server_us_per_decision, 2),
            "bytes_per_identity": round(self.bytes_per_identity, 1),
            "allowed_pct": round(self.allowed_pct, 2),
        })
    }
}

fn round(v: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (v * scale).round() / scale
}

/// What a load phase decides with: a store algorithm or the reference script.
#[derive(Clone)]
enum Subject {
    Store(RedisStore, Limit),
    Reference {
        conn: ConnectionManager,
        script: Arc<Script>,
        prefix: Arc<str>,
        quota: Quota,
        clock: Option<ManualClock>,
    },
}

impl Subject {
    /// One decision for identity `i`; returns whether it was allowed.
    async fn decide(&self, i: usize) -> Result<bool, Box<dyn std::error::Error + Send + Sync>> {
        let key = format!("id{i}");
        match self {
            Subject::Store(store, limit) => Ok(store.decide(&key, limit, 1).await?.allowed),
            Subject::Reference { conn, script, prefix, quota, clock } => {
                let now = clock.as_ref().map_or_else(system_ms, slidegate::Clock::now_ms);
                let mut conn = conn.clone();
                let allowed: i64 = script
                    .key(format!("{prefix}{key}"))
                    .arg(now)
                    .arg(quota.window_ms())
                    .arg(quota.permits())
                    .invoke_async(&mut conn)
                    .await?;
                Ok(allowed == 1)
            }
        }
    }
}

fn system_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

async fn bench_redis(args: RedisArgs) -> crate::CommandResult {
    let client = redis::Client::open(args.redis_url.as_str())?;
    let (host, port) = match client.get_connection_info().addr() {
        ConnectionAddr::Tcp(host, port) => (host.clone(), *port),
        other => return Err(format!("bench redis needs a TCP loopback address, got {other}").into()),
    };
    let loopback = host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if !loopback {
        eprintln!("slidegate bench redis: {host} is not a loopback address; this load only goes to a Redis on this machine");
        return Ok(ExitCode::from(64));
    }
    let quota = Quota::new(args.limit, Duration::from_secs(args.window_secs))?;
    // A loaded machine may stall Redis past the client's default 500 ms; a
    // stall belongs in the latency figures, not in an error.
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_secs(30)))
        .set_connection_timeout(Some(Duration::from_secs(5)));
    let mut admin = ConnectionManager::new_with_config(client.clone(), config.clone()).await?;
    // Short: key length is part of the memory per identity, and the
    // reference script's keys get the same prefix length.
    let run_prefix = "sgb:";
    let tasks = args.connections.max(1) * args.in_flight.max(1);
    let mut conns = Vec::new();
    for _ in 0..args.connections.max(1) {
        conns.push(ConnectionManager::new_with_config(client.clone(), config.clone()).await?);
    }
    let script = Arc::new(Script::new(REFERENCE_SCRIPT));
    script.load_async(&mut admin).await?;

    let mut results: Vec<(String, Figures)> = Vec::new();
    let subjects: Vec<Option<Algorithm>> = Algorithm::ALL.into_iter().map(Some).chain([None]).collect();
    for (index, subject) in subjects.into_iter().enumerate() {
        let name = subject.map_or("reference_script", Algorithm::name).to_owned();
        let prefix = format!("{run_prefix}{index}:");
        // One subject per connection, for load on the server's clock ...
        let make = |conn: &ConnectionManager, clock: Option<ManualClock>| -> Subject {
            match subject {
                Some(algorithm) => {
                    let mut store = RedisStore::from_connection(conn.clone()).with_prefix(prefix.clone());
                    if let Some(clock) = clock {
                        store = store.with_time_source(TimeSource::Client(Arc::new(clock)));
                    }
                    Subject::Store(store, Limit::new(algorithm, quota))
                }
                None => Subject::Reference {
                    conn: conn.clone(),
                    script: script.clone(),
                    prefix: prefix.clone().into(),
                    quota,
                    clock,
                },
            }
        };
        if !args.json {
            eprintln!(
                "{name}: {:.0} s of load over {} identities, {tasks} requests in flight",
                args.seconds, args.identities
            );
        }
        let load: Vec<Subject> = conns
            .iter()
            .map(|c| match (subject, args.client_time) {
                (Some(_), true) => {
                    let mut s = make(c, None);
                    if let Subject::Store(store, _) = &mut s {
                        *store = store.clone().with_time_source(TimeSource::Client(Arc::new(SystemClock)));
                    }
                    s
                }
                _ => make(c, None),
            })
            .collect();
        let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut admin).await?;
        let (decisions, allowed, elapsed, histogram) = drive(
            &load,
            args.in_flight.max(1),
            args.identities.max(1),
            Duration::from_secs_f64(args.seconds),
        )
        .await?;
        let server_us = evalsha_usec_per_call(&mut admin).await?;
        delete_prefix(&mut admin, &prefix).await?;

        // Memory: every identity decided in two consecutive windows, so both
        // layouts hold their steady state (the reference keeps two keys).
        let clock = ManualClock::new(system_ms());
        let memory: Vec<Subject> = conns.iter().map(|c| make(c, Some(clock.clone()))).collect();
        let before = used_memory(&mut admin).await?;
        let n = args.memory_identities.max(1);
        fill(&memory, args.in_flight.max(1), n).await?;
        clock.advance(quota.window());
        fill(&memory, args.in_flight.max(1), n).await?;
        let after = used_memory(&mut admin).await?;
        delete_prefix(&mut admin, &prefix).await?;

        let figures = Figures {
            decisions_per_sec: decisions as f64 / elapsed.as_secs_f64(),
            p50_us: histogram.value_at_quantile(0.5) as f64 / 1000.0,
            p99_us: histogram.value_at_quantile(0.99) as f64 / 1000.0,
            server_us_per_decision: server_us,
            bytes_per_identity: after.saturating_sub(before) as f64 / n as f64,
            allowed_pct: 100.0 * allowed as f64 / decisions.max(1) as f64,
        };
        results.push((name, figures));
    }

    let redis_benchmark = if args.no_redis_benchmark {
        None
    } else {
        let sha = script.get_hash().to_owned();
        let figure = redis_benchmark_p16(&host, port, &sha, &format!("{run_prefix}rb:"), &quota).await;
        delete_prefix(&mut admin, &format!("{run_prefix}rb:")).await?;
        figure
    };

    let reference = results.iter().find(|(n, _)| n == "reference_script").map(|(_, f)| *f);
    if args.json {
        let mut algorithms = Map::new();
        let mut ratios = Map::new();
        for (name, f) in results.iter().filter(|(n, _)| n != "reference_script") {
            algorithms.insert(name.clone(), f.to_json());
            if let Some(r) = reference {
                ratios.insert(name.clone(), ratio_json(f, &r, redis_benchmark));
            }
        }
        let out = json!({
            "algorithms": algorithms,
            "reference_script": reference.map(Figures::to_json),
            "redis_benchmark_p16_per_sec": redis_benchmark.map(|v| round(v, 0)),
            "ratios_vs_reference": ratios,
            "setup": {
                "redis_url": args.redis_url,
                "seconds": args.seconds,
                "connections": args.connections,
                "in_flight_per_connection": args.in_flight,
                "identities": args.identities,
                "memory_identities": args.memory_identities,
                "limit": quota.permits(),
                "window_ms": quota.window_ms(),
                "time_source": if args.client_time { "client for both" } else { "server (Redis TIME) for slidegate; client ms in ARGV for the reference script" },
            },
        });
        outln!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        outln!(
            "{:<24} {:>12} {:>9} {:>9} {:>12} {:>10} {:>9}",
            "",
            "decisions/s",
            "p50 µs",
            "p99 µs",
            "server µs",
            "B/identity",
            "allowed%"
        );
        for (name, f) in &results {
            outln!(
                "{:<24} {:>12.0} {:>9.1} {:>9.1} {:>12.2} {:>10.1} {:>9.1}",
                name,
                f.decisions_per_sec,
                f.p50_us,
                f.p99_us,
                f.server_us_per_decision,
                f.bytes_per_identity,
                f.allowed_pct
            );
        }
        if let Some(r) = reference {
            outln!();
            outln!(
                "{:<24} {:>12} {:>12} {:>12}",
                "vs reference script",
                "throughput",
                "server CPU",
                "memory"
            );
            for (name, f) in results.iter().filter(|(n, _)| n != "reference_script") {
                outln!(
                    "{:<24} {:>11.2}× {:>11.2}× {:>11.2}×",
                    name,
                    f.decisions_per_sec / r.decisions_per_sec,
                    f.server_us_per_decision / r.server_us_per_decision,
                    f.bytes_per_identity / r.bytes_per_identity
                );
            }
        }
        match redis_benchmark {
            Some(v) => outln!("\nredis-benchmark -P 16, reference script: {v:.0} calls/s"),
            None => outln!("\nredis-benchmark: not run (not on PATH, or --no-redis-benchmark)"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn ratio_json(f: &Figures, reference: &Figures, redis_benchmark: Option<f64>) -> Value {
    json!({
        "decisions_per_sec": round(f.decisions_per_sec / reference.decisions_per_sec, 3),
        "server_us_per_decision": round(f.server_us_per_decision / reference.server_us_per_decision, 3),
        "bytes_per_identity": round(f.bytes_per_identity / reference.bytes_per_identity, 3),
        "of_redis_benchmark_p16": redis_benchmark.map(|rb| round(f.decisions_per_sec / rb, 3)),
    })
}

/// Runs decisions from `in_flight` tasks per subject for `duration`, cycling
/// through `identities`; returns decisions, allowed, elapsed, latency (ns).
async fn drive(
    subjects: &[Subject],
    in_flight: usize,
    identities: usize,
    duration: Duration,
) -> Result<(u64, u64, Duration, Histogram<u64>), Box<dyn std::error::Error>> {
    let tasks = subjects.len() * in_flight;
    let start = Instant::now();
    let deadline = start + duration;
    let mut handles = Vec::new();
    for t in 0..tasks {
        let subject = subjects[t % subjects.len()].clone();
        handles.push(tokio::spawn(async move {
            let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
            let (mut decisions, mut allowed) = (0u64, 0u64);
            let mut i = t;
            while Instant::now() < deadline {
                let began = Instant::now();
                allowed += u64::from(subject.decide(i % identities).await?);
                histogram.saturating_record(began.elapsed().as_nanos() as u64);
                decisions += 1;
                i += tasks;
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>((decisions, allowed, histogram))
        }));
    }
    let mut total = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let (mut decisions, mut allowed) = (0, 0);
    for handle in handles {
        let (d, a, h) = handle.await?.map_err(|e| e.to_string())?;
        decisions += d;
        allowed += a;
        total.add(h)?;
    }
    Ok((decisions, allowed, start.elapsed(), total))
}

/// One decision for each of `n` identities, `in_flight` at a time per subject.
async fn fill(subjects: &[Subject], in_flight: usize, n: usize) -> Result<(), Box<dyn std::error::Error>> {
    let tasks = subjects.len() * in_flight;
    let mut handles = Vec::new();
    for t in 0..tasks {
        let subject = subjects[t % subjects.len()].clone();
        handles.push(tokio::spawn(async move {
            let mut i = t;
            while i < n {
                subject.decide(i).await?;
                i += tasks;
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for handle in handles {
        handle.await?.map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// `usec / calls` of `EVALSHA` in `INFO commandstats`: server CPU per script call.
async fn evalsha_usec_per_call(conn: &mut ConnectionManager) -> Result<f64, Box<dyn std::error::Error>> {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await?;
    let line = info
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .ok_or("INFO commandstats has no cmdstat_evalsha line")?;
    let field = |name: &str| -> Option<f64> {
        line.split([':', ',']).find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
    };
    let (calls, usec) = (field("calls").ok_or("no calls")?, field("usec").ok_or("no usec")?);
    Ok(if calls > 0.0 { usec / calls } else { 0.0 })
}

async fn used_memory(conn: &mut ConnectionManager) -> Result<u64, Box<dyn std::error::Error>> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(conn).await?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:")?.trim().parse().ok())
        .ok_or_else(|| "INFO memory has no used_memory".into())
}

/// Deletes every key under `prefix` (SCAN + UNLINK).
async fn delete_prefix(conn: &mut ConnectionManager, prefix: &str) -> Result<(), Box<dyn std::error::Error>> {
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(10_000)
            .query_async(conn)
            .await?;
        if !keys.is_empty() {
            let _: usize = conn.unlink(keys).await?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// What `redis-benchmark -P 16` reaches with the reference script: 50
/// clients, 16 pipelined calls each, random identities. `None` when the tool
/// is not on PATH or fails.
async fn redis_benchmark_p16(host: &str, port: u16, sha: &str, prefix: &str, quota: &Quota) -> Option<f64> {
    let output = tokio::process::Command::new("redis-benchmark")
        .args([
            "-h",
            host,
            "-p",
            &port.to_string(),
            "-c",
            "50",
            "-P",
            "16",
            "-n",
            "1000000",
            "-r",
            "1000000",
            "-q",
        ])
        .args(["EVALSHA", sha, "1", &format!("{prefix}__rand_int__")])
        .arg(system_ms().to_string())
        .arg(quota.window_ms().to_string())
        .arg(quota.permits().to_string())
        .output()
        .await
        .ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    // `-q` prints "EVALSHA ...: 95238.10 requests per second, p50=..." (after \r progress lines).
    let line = text.rsplit('\r').next()?.lines().find(|l| l.contains("requests per second"))?;
    let before = line.split(" requests per second").next()?;
    before.rsplit(' ').next()?.parse().ok()
}
