//! `slidegate bench attack`: what abusive clients cost Redis, with and
//! without the deny cache and the penalty box, side by side in one run.
//!
//! Polite identities stay under their limit; a few abusive ones send
//! `--factor` times theirs. The same interleaved trace goes through a
//! [`RateLimiter`] on the Redis store three times — no deny cache, the deny
//! cache, the deny cache and a penalty box — and each run reports the store
//! calls (`EVALSHA` + `EVAL` in `INFO commandstats`) and the server CPU of
//! those calls per request. Loopback Redis only; `CONFIG RESETSTAT` before
//! each run; keys under a prefix unique to the run, deleted afterwards.

use std::net::IpAddr;
use std::process::ExitCode;

use redis::aio::MultiplexedConnection;
use redis::ConnectionAddr;
use serde_json::{json, Value};
use slidegate::{Engine, RedisOptions, RedisStore};
use slidegate_http::RateLimiter;
use slidegate_server::Config;

use crate::redis_errors::{require_module, unreachable};
use crate::redis_keys::{delete_prefix, run_prefix};

/// Arguments of `slidegate bench attack`.
#[derive(clap::Args)]
pub struct AttackArgs {
    /// The Redis to measure, e.g. redis://127.0.0.1:7400/ (loopback only; it gets CONFIG RESETSTAT).
    #[arg(long)]
    redis_url: String,
    /// What decides inside Redis: `auto` (the native module where every
    /// node has it, else the Lua scripts), `lua` or `module`.
    #[arg(long, value_name = "auto|lua|module", default_value = "auto")]
    engine: Engine,
    /// Polite identities: each sends half its limit.
    #[arg(long, default_value_t = 1_000, value_parser = crate::args::count(1..=1_000_000))]
    polite: usize,
    /// Abusive identities: each sends `factor` times its limit.
    #[arg(long, default_value_t = 5, value_parser = crate::args::count(1..=10_000))]
    abusive: usize,
    /// How many times its limit an abusive identity sends.
    #[arg(long, default_value_t = 50, value_parser = crate::args::count(1..=10_000))]
    factor: usize,
    /// The limit per minute of every identity.
    #[arg(long, default_value_t = 10, value_parser = crate::args::count(2..=100_000))]
    limit: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// One configuration of the limiter the trace runs through.
struct Mode {
    name: &'static str,
    deny_cache: usize,
    penalty: bool,
}

const MODES: [Mode; 3] = [
    Mode { name: "no_deny_cache", deny_cache: 0, penalty: false },
    Mode { name: "deny_cache", deny_cache: 65_536, penalty: false },
    Mode { name: "deny_cache_and_penalty", deny_cache: 65_536, penalty: true },
];

/// What one mode cost.
struct Run {
    requests: u64,
    abusive_requests: u64,
    allowed: u64,
    blocked: u64,
    store_calls: u64,
    /// Store calls made for the abusive identities' requests.
    abusive_store_calls: u64,
    redis_usec: u64,
}

/// Runs `slidegate bench attack`.
pub fn run(args: AttackArgs) -> crate::exit::CommandResult {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(attack(args))
}

async fn attack(args: AttackArgs) -> crate::exit::CommandResult {
    let client = redis::Client::open(args.redis_url.as_str())?;
    let host = match client.get_connection_info().addr() {
        ConnectionAddr::Tcp(host, _) => host.clone(),
        other => return Err(format!("bench attack needs a TCP loopback address, got {other}").into()),
    };
    if !(host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())) {
        eprintln!("slidegate bench attack: {host} is not a loopback address; this load only goes to a Redis on this machine");
        return Ok(ExitCode::from(crate::exit::EX_USAGE));
    }
    let mut admin =
        client.get_multiplexed_async_connection().await.map_err(|e| unreachable(&args.redis_url, e))?;
    if args.engine == Engine::Module {
        require_module(&mut admin).await?;
    }
    let trace = trace(&args);
    let prefix = run_prefix("attack");
    let mut runs = Vec::new();
    for mode in &MODES {
        let result = run_mode(&args, mode, &trace, &format!("{prefix}{}:", mode.name), &mut admin).await;
        runs.push(result);
    }
    // Leave the Redis as we found it, whatever happened.
    delete_prefix(&mut admin, &prefix).await?;
    let runs = runs.into_iter().collect::<Result<Vec<_>, _>>()?;
    let report = json!({
        "polite": args.polite,
        "abusive": args.abusive,
        "factor": args.factor,
        "limit_per_minute": args.limit,
        "requests": trace.len(),
        "modes": MODES.iter().zip(&runs).map(|(m, r)| (m.name.to_owned(), run_json(r))).collect::<serde_json::Map<_, _>>(),
    });
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        outln!(
            "{:<24} {:>10} {:>12} {:>14} {:>16} {:>12} {:>8}",
            "mode",
            "requests",
            "store calls",
            "calls/request",
            "abusive calls",
            "Redis µs/req",
            "blocked"
        );
        for (m, r) in MODES.iter().zip(&runs) {
            let n = r.requests.max(1) as f64;
            outln!(
                "{:<24} {:>10} {:>12} {:>14.4} {:>16} {:>12.3} {:>8}",
                m.name,
                r.requests,
                r.store_calls,
                r.store_calls as f64 / n,
                format!("{}/{}", r.abusive_store_calls, r.abusive_requests),
                r.redis_usec as f64 / n,
                r.blocked
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn run_json(r: &Run) -> Value {
    let n = r.requests.max(1) as f64;
    json!({
        "requests": r.requests,
        "abusive_requests": r.abusive_requests,
        "allowed": r.allowed,
        "blocked": r.blocked,
        "store_calls": r.store_calls,
        "store_calls_per_request": r.store_calls as f64 / n,
        "abusive_store_calls": r.abusive_store_calls,
        "abusive_store_calls_per_request": r.abusive_store_calls as f64 / r.abusive_requests.max(1) as f64,
        "redis_usec": r.redis_usec,
        "redis_usec_per_request": r.redis_usec as f64 / n,
    })
}

/// The identities' requests, interleaved by a fixed pseudo-random order:
/// `(identity, abusive)`.
fn trace(args: &AttackArgs) -> Vec<(String, bool)> {
    let mut trace = Vec::new();
    for i in 0..args.abusive {
        trace.extend(std::iter::repeat_n((format!("abusive-{i}"), true), args.factor * args.limit));
    }
    for i in 0..args.polite {
        trace.extend(std::iter::repeat_n((format!("polite-{i}"), false), args.limit / 2));
    }
    // Fisher–Yates with a fixed LCG: the same trace for every mode and run.
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    for i in (1..trace.len()).rev() {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        trace.swap(i, (seed >> 33) as usize % (i + 1));
    }
    trace
}

async fn run_mode(
    args: &AttackArgs,
    mode: &Mode,
    trace: &[(String, bool)],
    prefix: &str,
    admin: &mut MultiplexedConnection,
) -> Result<Run, Box<dyn std::error::Error>> {
    let penalty =
        if mode.penalty { "penalty = { after = 20, within = \"1m\", block = \"10m\" }\n" } else { "" };
    let source = format!(
        "[store]\ndeny_cache = {}\n[[rules]]\nname = \"trending\"\npath = \"/api/videos/trending\"\n\
         limits = [{{ limit = {}, window = \"1m\" }}]\n{penalty}",
        mode.deny_cache, args.limit
    );
    let config = Config::parse(&source, "bench-attack.toml")?;
    let options = RedisOptions::new().with_engine(args.engine);
    let store = RedisStore::connect_with(&args.redis_url, options)
        .await
        .map_err(|e| unreachable(&args.redis_url, e))?
        .with_prefix(prefix);
    let limiter = RateLimiter::from_config(&config.limiter, store)?;
    redis::cmd("CONFIG").arg("RESETSTAT").query_async::<()>(admin).await?;
    let mut run = Run {
        requests: 0,
        abusive_requests: 0,
        allowed: 0,
        blocked: 0,
        store_calls: 0,
        abusive_store_calls: 0,
        redis_usec: 0,
    };
    // One thread decides (a current-thread runtime), so this thread's shard
    // of the store counters sees every call.
    let calls = || limiter.metrics().store().calls.load(std::sync::atomic::Ordering::Relaxed);
    for (key, abusive) in trace {
        let before = calls();
        let verdict = limiter.check_key("trending", key, 1, false).await?;
        if *abusive {
            run.abusive_store_calls += calls() - before;
        }
        run.requests += 1;
        run.abusive_requests += u64::from(*abusive);
        run.allowed += u64::from(verdict.allowed());
        run.blocked += u64::from(verdict.blocked);
    }
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(admin).await?;
    (run.store_calls, run.redis_usec) = script_stats(&info);
    Ok(run)
}

/// Calls and server µs of `EVALSHA` and `EVAL` in `INFO commandstats`, and
/// of the native module's commands where it decides.
fn script_stats(info: &str) -> (u64, u64) {
    crate::redis_info::command_totals(info, &["evalsha", "eval", "slidegate.decide", "slidegate.decide_all"])
        .unwrap_or((0, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_stats_add_evalsha_and_eval() {
        let info = "# Commandstats\r\ncmdstat_eval:calls=2,usec=30,usec_per_call=15.00\r\n\
                    cmdstat_evalsha:calls=8,usec=70,usec_per_call=8.75\r\ncmdstat_info:calls=1,usec=9\r\n";
        assert_eq!(script_stats(info), (10, 100));
    }
}
