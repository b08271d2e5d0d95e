//! `slidegate bench lease`: what quota leases save Redis, side by side with
//! leases off, in one run.
//!
//! Three limiters (three instances, as three `serve` processes would be,
//! each with its own connection; in this process, on one thread) share one
//! Redis and one rule, decided by the scripts or, with `--engine module`,
//! by the native module. Two loads, each paced in real time for `--seconds`:
//! **hot**, one identity at `--hot-rate` requests a second spread over the
//! instances, under a limit of `--limit` per minute; **ordinary**, the same
//! rule for `--ordinary` identities sending one request a second each. For
//! each load, with leases off and on: Redis calls per allowed request
//! (`INFO commandstats`, `CONFIG RESETSTAT` before each), the server's µs of
//! those calls per request, the p99 of a decision, and the most requests
//! admitted in one minute window against the limit. Loopback Redis only;
//! keys under a prefix unique to the run, deleted afterwards.

use std::net::IpAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use redis::aio::MultiplexedConnection;
use redis::ConnectionAddr;
use serde_json::{json, Value};
use slidegate::{Engine, RedisOptions, RedisStore};
use slidegate_http::RateLimiter;
use slidegate_server::Config;

use crate::redis_errors::{require_module, unreachable};
use crate::redis_keys::{delete_prefix, run_prefix};

/// Arguments of `slidegate bench lease`.
#[derive(clap::Args)]
pub struct LeaseArgs {
    /// The Redis to measure, e.g. redis://127.0.0.1:7400/ (loopback only; it gets CONFIG RESETSTAT).
    #[arg(long)]
    redis_url: String,
    /// Seconds of each load.
    #[arg(long, default_value_t = 5.0, value_parser = crate::args::seconds(600.0))]
    seconds: f64,
    /// The hot identity's requests per second, over all instances.
    #[arg(long, default_value_t = 5_000, value_parser = crate::args::count(1..=100_000))]
    hot_rate: usize,
    /// Ordinary identities, one request a second each.
    #[arg(long, default_value_t = 1_000, value_parser = crate::args::count(1..=100_000))]
    ordinary: usize,
    /// The limit per minute of every identity.
    #[arg(long, default_value_t = 1_000_000, value_parser = crate::args::count(2..=100_000_000))]
    limit: usize,
    /// The most permits one lease takes.
    #[arg(long, default_value_t = 64, value_parser = crate::args::count(2..=10_000))]
    max: usize,
    /// What decides and leases inside Redis: `lua` (the scripts, the
    /// default, as the figures in BENCHMARKS.md were taken), `module` (the
    /// native module's commands) or `auto` (the module where the server has it).
    #[arg(long, value_name = "auto|lua|module", default_value = "lua")]
    engine: Engine,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// The commands a store's calls run as, in `INFO commandstats`: the scripts
/// (`EVALSHA`, `EVAL` after a `NOSCRIPT`) and the native module's.
const STORE_COMMANDS: [&str; 6] =
    ["evalsha", "eval", "slidegate.decide", "slidegate.decide_all", "slidegate.lease", "slidegate.give_back"];

const INSTANCES: usize = 3;

/// What one load cost in one mode.
#[derive(Debug, Default)]
struct Run {
    requests: u64,
    allowed: u64,
    redis_calls: u64,
    redis_usec: u64,
    /// The most requests admitted in one minute window.
    max_per_window: u64,
    p99_us: u64,
    /// Requests per second actually sent (the pacing may fall behind).
    rate: f64,
}

/// Runs `slidegate bench lease`.
pub fn run(args: LeaseArgs) -> crate::CommandResult {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(bench(args))
}

async fn bench(args: LeaseArgs) -> crate::CommandResult {
    let client = redis::Client::open(args.redis_url.as_str())?;
    let host = match client.get_connection_info().addr() {
        ConnectionAddr::Tcp(host, _) => host.clone(),
        other => return Err(format!("bench lease needs a TCP loopback address, got {other}").into()),
    };
    if !(host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())) {
        eprintln!("slidegate bench lease: {host} is not a loopback address; this load only goes to a Redis on this machine");
        return Ok(ExitCode::from(crate::EX_USAGE));
    }
    let mut admin =
        client.get_multiplexed_async_connection().await.map_err(|e| unreachable(&args.redis_url, e))?;
    if args.engine == Engine::Module {
        require_module(&mut admin).await?;
    }
    let prefix = run_prefix("lease");
    let mut results = Vec::new();
    for (load, hot) in [("hot", true), ("ordinary", false)] {
        for leases in [false, true] {
            let mode = if leases { "leases" } else { "no_leases" };
            let run_prefix = format!("{prefix}{load}:{mode}:");
            let result = run_load(&args, hot, leases, &run_prefix, &mut admin).await;
            results.push((load, mode, result));
        }
    }
    // Leave the Redis as we found it, whatever happened.
    delete_prefix(&mut admin, &prefix).await?;
    let mut runs = Vec::new();
    for (load, mode, result) in results {
        runs.push((load, mode, result?));
    }
    report(&args, &runs)
}

fn report(args: &LeaseArgs, runs: &[(&str, &str, Run)]) -> crate::CommandResult {
    if args.json {
        let loads: serde_json::Map<String, Value> = runs
            .iter()
            .map(|(load, mode, r)| (format!("{load}/{mode}"), run_json(r, args.limit as u64)))
            .collect();
        let report = json!({
            "instances": INSTANCES,
            "hot_rate": args.hot_rate,
            "ordinary": args.ordinary,
            "limit_per_minute": args.limit,
            "lease_max": args.max,
            "engine": args.engine.name(),
            "seconds": args.seconds,
            "runs": loads,
        });
        outln!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "{:<9} {:<10} {:>9} {:>9} {:>9} {:>14} {:>13} {:>9} {:>16}",
        "load",
        "mode",
        "req/s",
        "requests",
        "allowed",
        "calls/allowed",
        "Redis µs/req",
        "p99 µs",
        "max/window"
    );
    for (load, mode, r) in runs {
        outln!(
            "{:<9} {:<10} {:>9.0} {:>9} {:>9} {:>14.4} {:>13.3} {:>9} {:>16}",
            load,
            mode,
            r.rate,
            r.requests,
            r.allowed,
            r.redis_calls as f64 / r.allowed.max(1) as f64,
            r.redis_usec as f64 / r.requests.max(1) as f64,
            r.p99_us,
            if *load == "hot" { format!("{}/{}", r.max_per_window, args.limit) } else { "-".to_owned() }
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn run_json(r: &Run, limit: u64) -> Value {
    json!({
        "requests": r.requests,
        "rate": r.rate,
        "allowed": r.allowed,
        "redis_calls": r.redis_calls,
        "redis_calls_per_allowed": r.redis_calls as f64 / r.allowed.max(1) as f64,
        "redis_usec": r.redis_usec,
        "redis_usec_per_request": r.redis_usec as f64 / r.requests.max(1) as f64,
        "redis_usec_per_call": r.redis_usec as f64 / r.redis_calls.max(1) as f64,
        "p99_us": r.p99_us,
        "max_admitted_per_window_hot": r.max_per_window,
        "within_limit": r.max_per_window <= limit,
    })
}

async fn run_load(
    args: &LeaseArgs,
    hot: bool,
    leases: bool,
    prefix: &str,
    admin: &mut MultiplexedConnection,
) -> Result<Run, Box<dyn std::error::Error>> {
    let lease = if leases {
        format!("lease = {{ max = {}, horizon = \"50ms\" }}\n", args.max)
    } else {
        String::new()
    };
    let source = format!(
        "[store]\n{lease}[[rules]]\nname = \"api\"\npath = \"/api/*\"\n\
         limits = [{{ limit = {}, window = \"1m\" }}]\n",
        args.limit
    );
    let config = Config::parse(&source, "bench-lease.toml")?;
    let mut limiters = Vec::new();
    for _ in 0..INSTANCES {
        let store = RedisStore::connect_with(&args.redis_url, RedisOptions::new().with_engine(args.engine))
            .await
            .map_err(|e| unreachable(&args.redis_url, e))?
            .with_prefix(prefix);
        limiters.push(RateLimiter::from_config(&config.limiter, store)?);
    }
    let keys: Vec<String> =
        if hot { vec!["hot".to_owned()] } else { (0..args.ordinary).map(|i| format!("user-{i}")).collect() };
    let rate = if hot { args.hot_rate } else { args.ordinary } as f64;
    redis::cmd("CONFIG").arg("RESETSTAT").query_async::<()>(admin).await?;
    let mut latency = Histogram::<u64>::new(3)?;
    let mut run = Run::default();
    let mut windows = std::collections::HashMap::<u64, u64>::new();
    let start = Instant::now();
    let total = (rate * args.seconds) as u64;
    for n in 0..total {
        // Paced: request n is due at n / rate seconds.
        let due = start + Duration::from_secs_f64(n as f64 / rate);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            tokio::time::sleep(wait).await;
        }
        let limiter = &limiters[n as usize % INSTANCES];
        let key = &keys[n as usize % keys.len()];
        let asked = Instant::now();
        let verdict = limiter.check_key("api", key, 1, false).await?;
        latency.record(asked.elapsed().as_micros() as u64)?;
        run.requests += 1;
        if verdict.allowed() {
            run.allowed += 1;
            if hot {
                let minute =
                    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs() / 60;
                *windows.entry(minute).or_default() += 1;
            }
        }
    }
    run.rate = run.requests as f64 / start.elapsed().as_secs_f64();
    run.p99_us = latency.value_at_quantile(0.99);
    run.max_per_window = windows.values().copied().max().unwrap_or(0);
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(admin).await?;
    (run.redis_calls, run.redis_usec) =
        crate::redis_info::command_totals(&info, &STORE_COMMANDS).unwrap_or((0, 0));
    Ok(run)
}
