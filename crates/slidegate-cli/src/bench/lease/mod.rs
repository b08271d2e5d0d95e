//! `slidegate bench lease`: what quota leases save Redis, side by side with
//! leases off, in one run.
//!
//! Three limiters (three instances, as three `serve` processes would be,
//! each with its own connection; in this process, on one thread) share one
//! Redis, or one Redis Cluster (`--redis-cluster`: the hot identity's keys
//! all in one slot, the shard no number of masters relieves), and one rule,
//! decided by the scripts or, with `--engine module`, by the native module.
//! Two loads, each paced in real time for `--seconds`:
//! **hot**, one identity at `--hot-rate` requests a second spread over the
//! instances, under a limit of `--limit` per minute; **ordinary**, the same
//! rule for `--ordinary` identities sending one request a second each. For
//! each load, with leases off and on (`--serve`: the instances are three
//! `slidegate serve` processes asked `POST /v1/check`, see `served.rs`):
//! Redis calls per allowed request (`INFO commandstats` summed over every
//! master, `CONFIG RESETSTAT` before each), the server's µs of
//! those calls per request, the p99 of a decision, and the most requests
//! admitted in one minute window against the limit. Loopback Redis only;
//! keys under a prefix unique to the run, deleted afterwards.

use std::net::IpAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use redis::ConnectionAddr;
use serde_json::{json, Value};
use slidegate::{Engine, RedisOptions, RedisStore, RedisTarget};
use slidegate_http::RateLimiter;
use slidegate_server::Config;

mod served;

use crate::redis_errors::{cluster_unreachable, require_module, unreachable};
use crate::redis_keys::run_prefix;
use crate::redis_nodes::Nodes;

/// Arguments of `slidegate bench lease`.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("redis").required(true).args(["redis_url", "redis_cluster"])))]
pub struct LeaseArgs {
    /// The Redis to measure, e.g. redis://127.0.0.1:7400/ (loopback only; it gets CONFIG RESETSTAT).
    #[arg(long, value_name = "URL")]
    redis_url: Option<String>,
    /// A Redis Cluster to measure instead: seed node URLs, comma-separated
    /// (loopback only; every master gets CONFIG RESETSTAT).
    #[arg(long, value_name = "URL,URL,...", value_delimiter = ',', num_args = 1.., conflicts_with = "redis_url")]
    redis_cluster: Vec<String>,
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
    /// Run the instances as three `slidegate serve` processes, asked
    /// `POST /v1/check` over HTTP/1.1 (the p99 is then through `serve`).
    #[arg(long)]
    serve: bool,
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
    /// Script calls the load made (with `--serve`, less the instances'
    /// background calls at their idle rate, measured before the load).
    redis_calls: u64,
    redis_usec: u64,
    /// With `--serve`: the background script calls taken out of
    /// `redis_calls` (polls of the shared tables, about one a second per
    /// instance, whatever the load).
    background_calls: u64,
    /// The most requests admitted in one minute window.
    max_per_window: u64,
    p99_us: u64,
    /// Requests per second actually sent (the pacing may fall behind).
    rate: f64,
}

/// Runs `slidegate bench lease`.
pub fn run(args: LeaseArgs) -> crate::exit::CommandResult {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(bench(args))
}

async fn bench(args: LeaseArgs) -> crate::exit::CommandResult {
    let urls: Vec<String> =
        args.redis_url.iter().cloned().chain(args.redis_cluster.iter().cloned()).collect();
    for url in &urls {
        let client = redis::Client::open(url.as_str())?;
        let host = match client.get_connection_info().addr() {
            ConnectionAddr::Tcp(host, _) => host.clone(),
            other => return Err(format!("bench lease needs a TCP loopback address, got {other}").into()),
        };
        if !(host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())) {
            eprintln!("slidegate bench lease: {host} is not a loopback address; this load only goes to a Redis on this machine");
            return Ok(ExitCode::from(crate::exit::EX_USAGE));
        }
    }
    let mut admin = match &args.redis_url {
        Some(url) => Nodes::single(url).await.map_err(|e| unreachable(url, e))?,
        None => Nodes::cluster(&args.redis_cluster).await?,
    };
    if args.engine == Engine::Module {
        for conn in admin.connections() {
            require_module(conn).await?;
        }
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
    // Leave the Redis as we found it, whatever happened: every master.
    admin.delete_prefix(&prefix).await?;
    let mut runs = Vec::new();
    for (load, mode, result) in results {
        runs.push((load, mode, result?));
    }
    report(&args, &runs, admin.len())
}

/// One instance's store: its own connection to the server, or its own
/// cluster client.
async fn instance_store(args: &LeaseArgs, prefix: &str) -> Result<RedisStore, Box<dyn std::error::Error>> {
    let options = RedisOptions::new().with_engine(args.engine);
    let store = match &args.redis_url {
        Some(url) => RedisStore::connect_with(url, options).await.map_err(|e| unreachable(url, e))?,
        None => RedisStore::connect_to(&RedisTarget::Cluster(args.redis_cluster.clone()), options)
            .await
            .map_err(|e| cluster_unreachable(&args.redis_cluster, e))?,
    };
    Ok(store.with_prefix(prefix))
}

/// `CONFIG RESETSTAT` on every master.
async fn reset_stats(admin: &mut Nodes) -> Result<(), redis::RedisError> {
    for conn in admin.connections() {
        redis::cmd("CONFIG").arg("RESETSTAT").query_async::<()>(conn).await?;
    }
    Ok(())
}

/// Script calls and their server µs since the last `CONFIG RESETSTAT`,
/// summed over every master.
async fn script_totals(admin: &mut Nodes) -> Result<(u64, u64), Box<dyn std::error::Error>> {
    let (mut calls, mut usec) = (0, 0);
    for conn in admin.connections() {
        let info: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await?;
        let (c, u) = crate::redis_info::command_totals(&info, &STORE_COMMANDS).unwrap_or((0, 0));
        calls += c;
        usec += u;
    }
    Ok((calls, usec))
}

fn report(args: &LeaseArgs, runs: &[(&str, &str, Run)], masters: usize) -> crate::exit::CommandResult {
    if args.json {
        let loads: serde_json::Map<String, Value> = runs
            .iter()
            .map(|(load, mode, r)| (format!("{load}/{mode}"), run_json(r, args.limit as u64)))
            .collect();
        let report = json!({
            "instances": INSTANCES,
            "store": if args.redis_cluster.is_empty() { "redis" } else { "cluster" },
            "instances_are": if args.serve { "serve processes" } else { "limiters in this process" },
            "masters": masters,
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
        "background_calls_subtracted": r.background_calls,
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
    admin: &mut Nodes,
) -> Result<Run, Box<dyn std::error::Error>> {
    let lease = if leases {
        format!("lease = {{ max = {}, horizon = \"50ms\" }}\n", args.max)
    } else {
        String::new()
    };
    let keys: Vec<String> =
        if hot { vec!["hot".to_owned()] } else { (0..args.ordinary).map(|i| format!("user-{i}")).collect() };
    let rate = if hot { args.hot_rate } else { args.ordinary } as f64;
    if args.serve {
        let served = served::Served::start(args, &lease, prefix)?;
        // The instances' own calls without any load: their idle rate.
        reset_stats(admin).await?;
        let idle = Instant::now();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (idle_calls, idle_usec) = script_totals(admin).await?;
        let idle_secs = idle.elapsed().as_secs_f64();
        reset_stats(admin).await?;
        let started = Instant::now();
        let mut run = served.load(args, &keys, rate, hot).await?;
        let (calls, usec) = script_totals(admin).await?;
        let share = started.elapsed().as_secs_f64() / idle_secs;
        run.background_calls = ((idle_calls as f64 * share).round() as u64).min(calls);
        run.redis_calls = calls - run.background_calls;
        run.redis_usec = usec.saturating_sub((idle_usec as f64 * share).round() as u64);
        return Ok(run);
    }
    let source = format!(
        "[store]\n{lease}[[rules]]\nname = \"api\"\npath = \"/api/*\"\n\
         limits = [{{ limit = {}, window = \"1m\" }}]\n",
        args.limit
    );
    let config = Config::parse(&source, "bench-lease.toml")?;
    let mut limiters = Vec::new();
    for _ in 0..INSTANCES {
        limiters.push(RateLimiter::from_config(&config.limiter, instance_store(args, prefix).await?)?);
    }
    reset_stats(admin).await?;
    let mut latency = Histogram::<u64>::new(3)?;
    let mut run = Run::default();
    let mut windows = std::collections::HashMap::<u64, u64>::new();
    let start = Instant::now();
    let total = (rate * args.seconds) as u64;
    for n in 0..total {
        paced(start, rate, n).await;
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
    (run.redis_calls, run.redis_usec) = script_totals(admin).await?;
    Ok(run)
}

/// Waits until request `n` of a run started at `start` is due, at `rate`
/// requests a second (request n at n / rate seconds).
async fn paced(start: Instant, rate: f64, n: u64) {
    let due = start + Duration::from_secs_f64(n as f64 / rate);
    if let Some(wait) = due.checked_duration_since(Instant::now()) {
        tokio::time::sleep(wait).await;
    }
}
