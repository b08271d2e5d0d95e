//! `slidegate bench redis`: decisions per second, latency, Redis server CPU
//! and memory per identity, for every algorithm of [`RedisStore`] and for the
//! source article's reference script, side by side in one run.
//!
//! Each phase is bounded in time (`--seconds`) or in count, and only a
//! loopback Redis is accepted: this is load, and it stays on this machine.
//! Keys are written under a prefix unique to the run and deleted afterwards;
//! `CONFIG RESETSTAT` is issued before each phase, so run it against a Redis
//! of its own.
//!
//! On a Redis Cluster (`--redis-cluster`) the store's algorithms are measured
//! through the cluster client, server figures are read from every master, and
//! the reference script and `redis-benchmark` are left out: the article's
//! script is called on one server by its callers, not routed by key.

mod report;

use std::net::IpAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::ConnectionAddr;
use serde_json::{json, Value};
use slidegate::{
    Algorithm, Buckets, Charge, Clock, Engine, Identity, Layout, Limit, ManualClock, Quota, RedisOptions,
    RedisStore, RedisTarget, Request, Store, SystemClock, TimeSource,
};

use crate::redis_errors::{cluster_unreachable, require_module, unreachable};
use crate::redis_info::evalsha_usec_per_call;
use crate::redis_keys::run_prefix;
use crate::redis_nodes::Nodes;
use crate::reference_script::ReferenceScript;

use self::report::{json_report, print_table};

/// Arguments of `slidegate bench redis`.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("redis").required(true).args(["redis_url", "redis_cluster"])))]
pub struct RedisArgs {
    /// The Redis to measure, e.g. redis://127.0.0.1:7400/ (loopback only; it gets CONFIG RESETSTAT).
    #[arg(long, value_name = "URL")]
    redis_url: Option<String>,
    /// A Redis Cluster to measure instead: seed node URLs, comma-separated
    /// (loopback only; every master gets CONFIG RESETSTAT).
    #[arg(long, value_name = "URL,URL,...", value_delimiter = ',', num_args = 1.., conflicts_with = "redis_url")]
    redis_cluster: Vec<String>,
    /// Seconds of load per algorithm.
    #[arg(long, default_value_t = 5.0, value_parser = crate::args::seconds(3600.0))]
    seconds: f64,
    /// Redis connections (each multiplexed: requests in flight share it); on
    /// a cluster, cluster clients (each with a connection per node).
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
    /// The packed layout's bucket count (a power of two); by default sized
    /// for each phase's identities, 32 to a bucket on average.
    #[arg(long, value_name = "N", value_parser = crate::args::buckets)]
    packed_buckets: Option<Buckets>,
    /// Measure only these candidates (comma-separated names as the report
    /// prints them, e.g. `sliding_window_counter,sliding_window_counter_packed`);
    /// all by default.
    #[arg(long, value_name = "NAME,...", value_delimiter = ',', value_parser = candidate_name)]
    only: Vec<String>,
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
    /// What decides inside Redis: `auto` (the native module where every
    /// node has it, else the Lua scripts), `lua` or `module`.
    #[arg(long, value_name = "auto|lua|module", default_value = "auto")]
    engine: Engine,
    /// The deadline of each store call, in seconds: a stall of a loaded
    /// machine belongs in the latency figures, not in an error, up to this.
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0, value_parser = crate::args::seconds(3600.0))]
    timeout: f64,
    /// Skip the `redis-benchmark -P 16` measurement even if it is on PATH.
    #[arg(long)]
    no_redis_benchmark: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Runs `slidegate bench redis`.
pub fn run(args: RedisArgs) -> crate::exit::CommandResult {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    runtime.block_on(bench_redis(args))
}

/// What `bench redis` measures, one after the other on the same Redis.
#[derive(Debug, Clone, Copy)]
enum Candidate {
    /// One of slidegate's algorithms through [`RedisStore`], a key per identity.
    Algorithm(Algorithm),
    /// One of the algorithms the packed layout packs, in that layout, its
    /// buckets sized for the identities of the phase ([`Layout::packed_for`]).
    Packed(Algorithm),
    /// The source article's script, the baseline.
    ReferenceScript,
}

/// The algorithms the packed layout packs.
const PACKED: [Algorithm; 2] = [Algorithm::SlidingWindowCounter, Algorithm::FixedWindow];

/// Every candidate, in the order measured.
fn candidates() -> impl Iterator<Item = Candidate> {
    Algorithm::ALL
        .into_iter()
        .map(Candidate::Algorithm)
        .chain(PACKED.map(Candidate::Packed))
        .chain([Candidate::ReferenceScript])
}

/// `--only`'s names: a candidate's, or an error listing them.
fn candidate_name(s: &str) -> Result<String, String> {
    if candidates().any(|c| c.name() == s) {
        return Ok(s.to_owned());
    }
    let names: Vec<&str> = candidates().map(Candidate::name).collect();
    Err(format!("unknown candidate {s:?}: expected one of {}", names.join(", ")))
}

impl Candidate {
    fn name(self) -> &'static str {
        match self {
            Candidate::Algorithm(algorithm) => algorithm.name(),
            Candidate::Packed(Algorithm::SlidingWindowCounter) => "sliding_window_counter_packed",
            Candidate::Packed(_) => "fixed_window_packed",
            Candidate::ReferenceScript => "reference_script",
        }
    }
}

/// What was measured for one candidate.
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

/// What one `bench redis` run measured.
struct Measured {
    /// Every algorithm, in [`Algorithm::ALL`] order.
    algorithms: Vec<(Algorithm, Figures)>,
    /// The algorithms in the packed layout, in [`PACKED`] order.
    packed: Vec<(Algorithm, Figures)>,
    /// The article's script; `None` on a cluster.
    reference_script: Option<Figures>,
    /// `redis-benchmark -P 16` calls per second of the reference script, if it ran.
    redis_benchmark_p16: Option<f64>,
}

impl Measured {
    /// Every candidate's figures, in table order.
    fn rows(&self) -> impl Iterator<Item = (&'static str, &Figures)> {
        let algorithms = self.algorithms.iter().map(|(a, f)| (a.name(), f));
        let packed = self.packed.iter().map(|(a, f)| (Candidate::Packed(*a).name(), f));
        algorithms
            .chain(packed)
            .chain(self.reference_script.iter().map(|f| (Candidate::ReferenceScript.name(), f)))
    }
}

/// A candidate bound to one connection: what a load task decides with.
#[derive(Clone)]
enum Subject {
    Store(RedisStore, Limit),
    Reference {
        conn: ConnectionManager,
        script: Arc<ReferenceScript>,
        prefix: Arc<str>,
        quota: Quota,
        clock: Arc<dyn Clock>,
    },
}

impl Subject {
    /// One decision for identity `i`; returns whether it was allowed.
    async fn decide(&self, i: usize) -> Result<bool, Box<dyn std::error::Error + Send + Sync>> {
        let key = format!("id{i}");
        match self {
            Subject::Store(store, limit) => {
                // The empty scope: the key holds the bare name, as the
                // reference script's keys do, so neither pays more key bytes.
                let identity = Identity::named("", &key);
                Ok(store.decide(Request::new(&identity, &[Charge::new(*limit, 1)])).await?.allowed())
            }
            Subject::Reference { conn, script, prefix, quota, clock } => {
                let mut conn = conn.clone();
                Ok(script.decide(&mut conn, &format!("{prefix}{key}"), clock.now_ms(), quota).await?)
            }
        }
    }
}

/// The TCP address of `url`; an error for other kinds of address.
fn tcp_address(url: &str) -> Result<(String, u16), Box<dyn std::error::Error>> {
    let client = redis::Client::open(url)?;
    match client.get_connection_info().addr() {
        ConnectionAddr::Tcp(host, port) => Ok((host.clone(), *port)),
        other => Err(format!("bench redis needs a TCP loopback address, got {other}").into()),
    }
}

async fn bench_redis(args: RedisArgs) -> crate::exit::CommandResult {
    let urls: Vec<String> =
        args.redis_url.iter().cloned().chain(args.redis_cluster.iter().cloned()).collect();
    let mut addresses = Vec::new();
    for url in &urls {
        let (host, port) = tcp_address(url)?;
        let loopback = host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
        if !loopback {
            eprintln!("slidegate bench redis: {host} is not a loopback address; this load only goes to a Redis on this machine");
            return Ok(ExitCode::from(crate::exit::EX_USAGE));
        }
        addresses.push((host, port));
    }
    let quota = Quota::new(args.limit, Duration::from_secs(args.window_secs))?;
    let mut bench = Bench::setup(&args, quota).await?;
    let single = if args.redis_cluster.is_empty() { addresses.first() } else { None };
    let measured = bench.measure_all(single).await;
    // Leave the Redis as we found it, whatever happened: every master.
    bench.admin.delete_prefix(&bench.prefix).await?;
    let measured = measured?;
    let engine_used = bench.engine_used.map(Engine::name);
    if args.json {
        let mut report = json_report(&args, &quota, &measured, bench.admin.len());
        report["setup"]["engine_used"] = json!(engine_used);
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        match (engine_used, args.engine) {
            (Some(used), Engine::Auto) => {
                eprintln!("engine: {used} (chosen by auto; the sliding log always runs in Lua)")
            }
            (Some(used), _) => eprintln!("engine: {used}"),
            (None, setting) => eprintln!("engine: {setting}"),
        }
        print_table(&measured);
    }
    Ok(ExitCode::SUCCESS)
}

/// The connections one run measures through, and the prefix of its keys.
struct Bench<'a> {
    args: &'a RedisArgs,
    quota: Quota,
    /// For `CONFIG RESETSTAT`, `INFO` and deleting keys, on every master: never timed.
    admin: Nodes,
    /// `--connections` of them, each multiplexing its requests in flight;
    /// empty on a cluster.
    load: Vec<ConnectionManager>,
    /// `--connections` cluster clients; empty on one server.
    cluster_load: Vec<RedisStore>,
    script: Arc<ReferenceScript>,
    /// Every key of the run starts with it; each candidate adds `<index>:`.
    prefix: String,
    /// What decided inside Redis (what `--engine auto` chose), once a
    /// candidate through the store has run.
    engine_used: Option<Engine>,
}

impl<'a> Bench<'a> {
    /// Opens the connections and loads the reference script.
    async fn setup(args: &'a RedisArgs, quota: Quota) -> Result<Self, Box<dyn std::error::Error>> {
        // A loaded machine may stall Redis past the client's default 500 ms; a
        // stall belongs in the latency figures, not in an error.
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(Duration::from_secs_f64(args.timeout)))
            .set_connection_timeout(Some(Duration::from_secs(5)));
        let script = Arc::new(ReferenceScript::new());
        let (mut load, mut cluster_load) = (Vec::new(), Vec::new());
        let mut admin = match &args.redis_url {
            Some(url) => {
                let client = redis::Client::open(url.as_str())?;
                for _ in 0..args.connections {
                    let conn = ConnectionManager::new_with_config(client.clone(), config.clone()).await;
                    load.push(conn.map_err(|e| unreachable(url, e))?);
                }
                let mut admin = Nodes::single(url).await.map_err(|e| unreachable(url, e))?;
                for conn in admin.connections() {
                    script.load(conn).await?;
                }
                admin
            }
            None => {
                let target = RedisTarget::Cluster(args.redis_cluster.clone());
                let options = RedisOptions::new()
                    .with_timeout(Duration::from_secs_f64(args.timeout))
                    .with_connect_timeout(Duration::from_secs(5))
                    .with_engine(args.engine);
                for _ in 0..args.connections {
                    let store = RedisStore::connect_to(&target, options.clone()).await;
                    cluster_load.push(store.map_err(|e| cluster_unreachable(&args.redis_cluster, e))?);
                }
                Nodes::cluster(&args.redis_cluster).await?
            }
        };
        if args.engine == Engine::Module {
            for conn in admin.connections() {
                require_module(conn).await?;
            }
        }
        // The same prefix for the reference script's keys as for the store's:
        // key length is part of the memory per identity.
        Ok(Bench {
            args,
            quota,
            admin,
            load,
            cluster_load,
            script,
            prefix: run_prefix("sgb"),
            engine_used: None,
        })
    }

    /// Every candidate in turn, then the `redis-benchmark` comparison.
    /// `single`: the one server's address, for the comparisons a cluster leaves out.
    async fn measure_all(
        &mut self,
        single: Option<&(String, u16)>,
    ) -> Result<Measured, Box<dyn std::error::Error>> {
        // Each candidate's keys under `<run prefix><index>:`, the same
        // length for all, so none pays more key bytes than another.
        let wanted = |c: Candidate| self.args.only.is_empty() || self.args.only.iter().any(|n| n == c.name());
        let mut algorithms = Vec::new();
        for (index, algorithm) in Algorithm::ALL.into_iter().enumerate() {
            if wanted(Candidate::Algorithm(algorithm)) {
                let prefix = format!("{}{index}:", self.prefix);
                algorithms.push((algorithm, self.measure(Candidate::Algorithm(algorithm), &prefix).await?));
            }
        }
        let mut packed = Vec::new();
        for (index, algorithm) in PACKED.into_iter().enumerate() {
            if wanted(Candidate::Packed(algorithm)) {
                let prefix = format!("{}p{index}:", self.prefix);
                packed.push((algorithm, self.measure(Candidate::Packed(algorithm), &prefix).await?));
            }
        }
        let single = single.filter(|_| wanted(Candidate::ReferenceScript));
        let Some((host, port)) = single else {
            if !self.args.json && !self.args.redis_cluster.is_empty() {
                eprintln!("reference script and redis-benchmark: not run on a cluster (the article's script runs on one server)");
            }
            return Ok(Measured { algorithms, packed, reference_script: None, redis_benchmark_p16: None });
        };
        let prefix = format!("{}{}:", self.prefix, Algorithm::ALL.len());
        let reference_script = Some(self.measure(Candidate::ReferenceScript, &prefix).await?);
        let redis_benchmark_p16 = if self.args.no_redis_benchmark {
            None
        } else {
            self.redis_benchmark_comparison(host, *port).await?
        };
        Ok(Measured { algorithms, packed, reference_script, redis_benchmark_p16 })
    }

    /// One candidate's load phase and memory phase, its keys under `prefix`.
    async fn measure(
        &mut self,
        candidate: Candidate,
        prefix: &str,
    ) -> Result<Figures, Box<dyn std::error::Error>> {
        if !self.args.json {
            eprintln!(
                "{}: {:.0} s of load over {} identities, {} requests in flight",
                candidate.name(),
                self.args.seconds,
                self.args.identities,
                self.args.connections * self.args.in_flight
            );
        }
        // The load runs on the server's clock unless told otherwise; the
        // reference script always gets the client's, as the article calls it.
        let clock: Option<Arc<dyn Clock>> =
            if self.args.client_time { Some(Arc::new(SystemClock)) } else { None };
        let subjects = self.subjects(candidate, prefix, clock, self.args.identities);
        let engine = subjects.first().and_then(|s| match s {
            Subject::Store(store, _) => Some(store.clone()),
            Subject::Reference { .. } => None,
        });
        // Every identity decided once before the timed load, so each
        // candidate is measured holding all its identities, as in steady
        // state (a packed hash is scanned in full only once it is full).
        fill(&subjects, self.args.in_flight, self.args.identities).await?;
        settle().await;
        for conn in self.admin.connections() {
            let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(conn).await?;
        }
        let load = drive(
            &subjects,
            self.args.in_flight,
            self.args.identities,
            Duration::from_secs_f64(self.args.seconds),
        )
        .await?;
        if let Some(found) = engine.and_then(|store| store.engine_in_use()) {
            self.engine_used = Some(found);
        }
        let server_us_per_decision = self.server_us_per_call().await?;
        self.admin.delete_prefix(prefix).await?;
        settle().await;
        let bytes_per_identity = self.memory_per_identity(candidate, prefix).await?;
        self.admin.delete_prefix(prefix).await?;
        Ok(Figures {
            decisions_per_sec: load.decisions as f64 / load.elapsed.as_secs_f64(),
            p50_us: load.latency_ns.value_at_quantile(0.5) as f64 / 1000.0,
            p99_us: load.latency_ns.value_at_quantile(0.99) as f64 / 1000.0,
            server_us_per_decision,
            bytes_per_identity,
            allowed_pct: 100.0 * load.allowed as f64 / load.decisions.max(1) as f64,
        })
    }

    /// The `used_memory` delta per identity, every identity decided in two
    /// consecutive windows so both layouts hold their steady state (the
    /// reference script keeps two keys, the packed sliding window counter
    /// two windows' hashes); the fixed window's in one window, since its
    /// state expires as its window ends (in the packed layout, a window's
    /// hash with it).
    async fn memory_per_identity(
        &mut self,
        candidate: Candidate,
        prefix: &str,
    ) -> Result<f64, Box<dyn std::error::Error>> {
        let clock = ManualClock::new(SystemClock.now_ms());
        let n = self.args.memory_identities;
        let subjects = self.subjects(candidate, prefix, Some(Arc::new(clock.clone())), n);
        let before = self.admin.used_memory().await?;
        fill(&subjects, self.args.in_flight, n).await?;
        let one_window = matches!(candidate, Candidate::Algorithm(a) | Candidate::Packed(a) if a == Algorithm::FixedWindow);
        if !one_window {
            clock.advance(self.quota.window());
            fill(&subjects, self.args.in_flight, n).await?;
        }
        let after = self.admin.used_memory().await?;
        Ok(after.saturating_sub(before) as f64 / n as f64)
    }

    /// `candidate` on each load connection, keys under `prefix`, on `clock`
    /// (`None`: Redis `TIME` for the store; the system clock for the reference script).
    /// Server CPU per script call: on a cluster, the mean over the masters
    /// that ran any (the keys spread evenly, so each ran about as many).
    async fn server_us_per_call(&mut self) -> Result<f64, Box<dyn std::error::Error>> {
        let mut per_master = Vec::new();
        for conn in self.admin.connections() {
            let us = evalsha_usec_per_call(conn).await?;
            if us > 0.0 {
                per_master.push(us);
            }
        }
        Ok(per_master.iter().sum::<f64>() / per_master.len().max(1) as f64)
    }

    /// `identities`: how many the phase decides for, which the packed
    /// layout sizes its buckets by.
    fn subjects(
        &self,
        candidate: Candidate,
        prefix: &str,
        clock: Option<Arc<dyn Clock>>,
        identities: usize,
    ) -> Vec<Subject> {
        let layout = match candidate {
            Candidate::Packed(_) => match self.args.packed_buckets {
                Some(buckets) => Layout::Packed(buckets),
                None => Layout::packed_for(identities as u64),
            },
            Candidate::Algorithm(_) | Candidate::ReferenceScript => Layout::PerKey,
        };
        if let Candidate::Algorithm(algorithm) | Candidate::Packed(algorithm) = candidate {
            if !self.cluster_load.is_empty() {
                let limit = Limit::new(algorithm, self.quota);
                return self
                    .cluster_load
                    .iter()
                    .map(|store| {
                        let mut store = store.clone().with_prefix(prefix).with_layout(layout);
                        if let Some(clock) = &clock {
                            store = store.with_time_source(TimeSource::Client(clock.clone()));
                        }
                        Subject::Store(store, limit)
                    })
                    .collect();
            }
        }
        let subject = |conn: &ConnectionManager| match candidate {
            Candidate::Algorithm(algorithm) | Candidate::Packed(algorithm) => {
                // As for the connections: a stall of the loaded machine belongs
                // in the latency figures, not in an error.
                let mut store = RedisStore::from_connection(conn.clone())
                    .with_timeout(Duration::from_secs_f64(self.args.timeout))
                    .with_prefix(prefix)
                    .with_layout(layout);
                if let Some(clock) = &clock {
                    store = store.with_time_source(TimeSource::Client(clock.clone()));
                }
                Subject::Store(store.with_engine(self.args.engine), Limit::new(algorithm, self.quota))
            }
            Candidate::ReferenceScript => Subject::Reference {
                conn: conn.clone(),
                script: self.script.clone(),
                prefix: prefix.into(),
                quota: self.quota,
                clock: clock.clone().unwrap_or_else(|| Arc::new(SystemClock)),
            },
        };
        self.load.iter().map(subject).collect()
    }

    /// What `redis-benchmark -P 16` reaches with the reference script on the
    /// same Redis; `None` when the tool is not on PATH or fails.
    async fn redis_benchmark_comparison(
        &mut self,
        host: &str,
        port: u16,
    ) -> Result<Option<f64>, Box<dyn std::error::Error>> {
        let prefix = format!("{}rb:", self.prefix);
        let figure = redis_benchmark_p16(host, port, self.script.sha(), &prefix, &self.quota).await;
        self.admin.delete_prefix(&prefix).await?;
        Ok(figure)
    }
}

/// What a load phase counted.
struct Load {
    decisions: u64,
    allowed: u64,
    elapsed: Duration,
    latency_ns: Histogram<u64>,
}

/// Runs decisions from `in_flight` tasks per subject for `duration`, cycling
/// through `identities`.
async fn drive(
    subjects: &[Subject],
    in_flight: usize,
    identities: usize,
    duration: Duration,
) -> Result<Load, Box<dyn std::error::Error>> {
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
    Ok(Load { decisions, allowed, elapsed: start.elapsed(), latency_ns: total })
}

/// Lets Redis finish resizing its key tables after many keys came or went
/// (`serverCron` rehashes them 1 ms at a time, 10 times a second): a
/// resize still under way charges its steps to every command of the next
/// phase, so whichever candidate came after a large delete paid for it
/// (up to +1.5 µs a decision at 1,000,000 identities).
async fn settle() {
    tokio::time::sleep(Duration::from_secs(3)).await;
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
        .arg(SystemClock.now_ms().to_string())
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
