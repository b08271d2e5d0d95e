//! `slidegate demo`: the source article's two experiments, on the embedded
//! store by default, on a Redis given with `--redis-url` or on a Redis
//! Cluster given with `--redis-cluster`.
//!
//! A. Boundary burst: limit 100 per 60 s; 100 requests in the last 100 ms of
//!    window 0, then 100 in the first 100 ms of window 1, on a manual clock.
//! B. Memory per identity: what one identity costs after 10,000 requests, and
//!    what 100,000 identities cost each (allocation accounting in process,
//!    `INFO memory` on Redis).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use slidegate::{
    Algorithm, Charge, Engine, Identity, Layout, Limit, Location, ManualClock, MemoryStore, Quota,
    RedisOptions, RedisStore, RedisTarget, Request, Store, TimeSource,
};
use tokio::task::JoinSet;

use crate::heap::HeapCount;
use crate::redis_errors::{cluster_unreachable, require_module, shown, shown_all, unreachable};
use crate::redis_keys::run_prefix;
use crate::redis_nodes::Nodes;
use crate::reference_script::ReferenceScript;

/// Arguments of `slidegate demo`.
#[derive(clap::Args)]
pub struct DemoArgs {
    /// Run both experiments against this Redis instead of the embedded store
    /// (keys use a prefix of their own and are deleted afterwards).
    #[arg(long, value_name = "URL")]
    redis_url: Option<String>,
    /// Run both experiments against this Redis Cluster (seed node URLs,
    /// comma-separated); keys are deleted from every master afterwards.
    #[arg(long, value_name = "URL,URL,...", value_delimiter = ',', num_args = 1.., conflicts_with = "redis_url")]
    redis_cluster: Vec<String>,
    /// With --redis-url or --redis-cluster: what decides inside Redis: `auto` (the native module where every
    /// node has it, else the Lua scripts), `lua` or `module`.
    #[arg(long, value_name = "auto|lua|module", default_value = "auto")]
    engine: Engine,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
    /// Write an SVG chart of the boundary burst into DIR.
    #[arg(long, value_name = "DIR")]
    plot: Option<PathBuf>,
    /// Identities in the memory experiment (each sends one request).
    #[arg(long, default_value_t = 100_000, value_parser = crate::args::count(1..=10_000_000))]
    identities: usize,
    /// With --redis-url or --redis-cluster: the deadline of each store call,
    /// in seconds (a loaded machine may need more than the default). A call
    /// past it stops the demo, which prints what it measured before.
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0, value_parser = crate::args::seconds(3600.0))]
    timeout: f64,
}

/// Window 0 of the boundary burst starts here: a multiple of 60 s.
const WINDOW_0_MS: u64 = 1_700_000_040_000;
const BURST_LIMIT: u64 = 100;
const BURST_WINDOW_MS: u64 = 60_000;
/// Requests in each half of the burst, one per millisecond.
const BURST_HALF: u64 = 100;
/// Experiment B: one identity sends this many requests (all admitted) …
const ONE_IDENTITY_REQUESTS: u64 = 10_000;
/// Requests in flight at once against Redis.
const IN_FLIGHT: u64 = 512;
/// The scope of the demo's identities (named `burst`, `one`, `user-<i>`):
/// the empty one, so a key holds the bare name, as the article's keys do.
const SCOPE: &str = "";

/// What the demo measured; on a failure, what it measured before.
#[derive(Serialize)]
struct Report {
    store: &'static str,
    /// What decided inside Redis (`lua` or `module`; Redis only).
    #[serde(skip_serializing_if = "Option::is_none")]
    engine: Option<&'static str>,
    /// The `--engine` setting (Redis only): `auto` chose `engine`.
    #[serde(skip_serializing_if = "Option::is_none")]
    engine_setting: Option<&'static str>,
    identities: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    boundary_burst: Option<BoundaryBurst>,
    memory: BTreeMap<&'static str, Memory>,
    /// Why the demo stopped before the end.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

impl Report {
    fn new(store: &'static str, identities: u64) -> Self {
        Report {
            store,
            engine: None,
            engine_setting: None,
            identities,
            boundary_burst: None,
            memory: BTreeMap::new(),
            error: None,
        }
    }
}

#[derive(Serialize)]
struct BoundaryBurst {
    limit: u64,
    window_ms: u64,
    sent: u64,
    allowed: BTreeMap<&'static str, u64>,
    /// The article's own Lua script on the same Redis (Redis only).
    #[serde(skip_serializing_if = "Option::is_none")]
    reference_script: Option<u64>,
}

#[derive(Serialize)]
struct Memory {
    /// Real cost per identity over `--identities` identities.
    bytes_per_identity: u64,
    /// `MEMORY USAGE` summed over one identity's keys after [`ONE_IDENTITY_REQUESTS`] requests (Redis only).
    memory_usage_one_identity: Option<u64>,
    /// What one identity costs after [`ONE_IDENTITY_REQUESTS`] requests, on either store.
    bytes_one_identity_after_10000_requests: u64,
}

/// Runs `slidegate demo`.
pub fn run(args: DemoArgs) -> crate::exit::CommandResult {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let identities = args.identities as u64;
    let progress = Progress::new(identities);
    let run =
        Run { engine: args.engine, timeout: Duration::from_secs_f64(args.timeout), identities, progress };
    let (report, curves) = runtime.block_on(async {
        match (&args.redis_url, args.redis_cluster.as_slice()) {
            (Some(url), _) => on_redis(&RedisTarget::Single(url.clone()), &run).await,
            (None, []) => embedded(&run).await,
            (None, seeds) => on_redis(&RedisTarget::Cluster(seeds.to_vec()), &run).await,
        }
    })?;
    run.progress.bar.finish_and_clear();
    if let Some(err) = &report.error {
        // What was measured before the failure, then the failure.
        if args.json {
            outln!("{}", serde_json::to_string(&report)?);
        } else {
            out!("{}", render(&report));
        }
        return Err(err.clone().into());
    }
    if let Some(dir) = &args.plot {
        std::fs::create_dir_all(dir)?;
        let path = dir.join("boundary_burst.svg");
        crate::plot::boundary_burst_svg(&path, BURST_WINDOW_MS, &curves)?;
        if !args.json {
            outln!("chart written to {}", path.display());
        }
    }
    if args.json {
        outln!("{}", serde_json::to_string(&report)?);
    } else {
        out!("{}", render(&report));
    }
    Ok(ExitCode::SUCCESS)
}

/// Cumulative admissions over time, per algorithm, for the chart.
type Curves = Vec<(&'static str, Vec<(u64, u64)>)>;

/// How the demo runs: its settings and its progress bar.
struct Run {
    engine: Engine,
    timeout: Duration,
    identities: u64,
    progress: Progress,
}

/// A bar over the demo's decisions on a terminal; nothing when stderr is
/// piped (the Redis run takes half a minute: it should show it is busy).
struct Progress {
    bar: indicatif::ProgressBar,
}

impl Progress {
    fn new(identities: u64) -> Self {
        use std::io::IsTerminal as _;
        if !std::io::stderr().is_terminal() {
            return Progress { bar: indicatif::ProgressBar::hidden() };
        }
        let algorithms = Algorithm::ALL.len() as u64;
        let total = (algorithms + 1) * 2 * BURST_HALF + algorithms * (ONE_IDENTITY_REQUESTS + identities);
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{msg:>34} {wide_bar} {pos}/{len} decisions ({eta})")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        Progress { bar }
    }

    /// `what` is being measured now.
    fn step(&self, what: String) {
        self.bar.set_message(what);
    }

    fn done(&self, decisions: u64) {
        self.bar.inc(decisions);
    }
}

async fn embedded(run: &Run) -> Result<(Report, Curves), Box<dyn std::error::Error>> {
    let identities = run.identities;
    let clock = ManualClock::new(0);
    let store = MemoryStore::with_clock(clock.clone());
    let mut report = Report::new("memory", identities);
    let (allowed, curves) = boundary_burst(&store, &clock, "burst", &run.progress).await?;
    report.boundary_burst = Some(burst_report(allowed, None));
    for algorithm in Algorithm::ALL {
        let limit = memory_limit(algorithm)?;
        run.progress.step(format!("B. memory, {}", algorithm.name()));
        let one = {
            let store = MemoryStore::with_clock(clock.clone());
            let count = HeapCount::start();
            one_identity(&store, &clock, &limit).await?;
            count.bytes()
        };
        let per_identity = {
            clock.set(WINDOW_0_MS);
            let count = HeapCount::start();
            let store = MemoryStore::with_clock(clock.clone());
            let (mut key, scope, charge) = (String::new(), Arc::<str>::from(SCOPE), [Charge::new(limit, 1)]);
            for i in 0..identities {
                key.clear();
                write!(key, "user-{i}")?;
                store.decide_sync(Request::new(&Identity::named(Arc::clone(&scope), &key), &charge))?;
            }
            let used = count.bytes();
            drop(store);
            used as u64 / identities
        };
        run.progress.done(ONE_IDENTITY_REQUESTS + identities);
        report.memory.insert(
            algorithm.name(),
            Memory {
                bytes_per_identity: per_identity,
                memory_usage_one_identity: None,
                bytes_one_identity_after_10000_requests: one as u64,
            },
        );
    }
    Ok((report, curves))
}

/// Both experiments on Redis. A failure once they started (a call past
/// `--timeout`, a Redis gone) is kept in the report's `error`, with what was
/// measured before it.
async fn on_redis(target: &RedisTarget, run: &Run) -> Result<(Report, Curves), Box<dyn std::error::Error>> {
    let (mut nodes, name) = match target {
        RedisTarget::Cluster(seeds) => {
            (Nodes::cluster(seeds).await.map_err(|e| cluster_unreachable(seeds, e))?, shown_all(seeds))
        }
        RedisTarget::Single(url) => (Nodes::single(url).await.map_err(|e| unreachable(url, e))?, shown(url)),
        _ => return Err("demo runs on one Redis or a Redis Cluster".into()),
    };
    if run.engine == Engine::Module {
        for conn in nodes.connections() {
            require_module(conn).await?;
        }
    }
    let prefix = run_prefix("sgdemo");
    let clock = ManualClock::new(0);
    let options = RedisOptions::new()
        .with_engine(run.engine)
        .with_timeout(run.timeout)
        .with_connect_timeout(run.timeout);
    let store = RedisStore::connect_to(target, options)
        .await
        .map_err(|e| format!("cannot reach Redis at {name}: {e}"))?
        .with_prefix(prefix.clone())
        .with_time_source(TimeSource::Client(Arc::new(clock.clone())));
    let mut report = Report::new(if nodes.is_cluster() { "redis_cluster" } else { "redis" }, run.identities);
    report.engine_setting = Some(run.engine.name());
    let mut curves = Vec::new();
    let result = redis_experiments(&store, &clock, &mut nodes, &prefix, run, &mut report, &mut curves).await;
    report.engine = store.engine_in_use().map(Engine::name);
    // Leave the user's Redis as we found it, whatever happened: every master.
    let cleanup = nodes.delete_prefix(&prefix).await;
    match (result, cleanup) {
        (Ok(()), Ok(())) => {}
        (Ok(()), Err(e)) => return Err(e),
        (Err(e), Ok(())) => report.error = Some(e.to_string()),
        (Err(e), Err(cleanup)) => {
            report.error =
                Some(format!("{e} (and the demo's keys under {prefix} could not be deleted: {cleanup})"));
        }
    }
    Ok((report, curves))
}

async fn redis_experiments(
    store: &RedisStore,
    clock: &ManualClock,
    nodes: &mut Nodes,
    prefix: &str,
    run: &Run,
    report: &mut Report,
    curves: &mut Curves,
) -> Result<(), Box<dyn std::error::Error>> {
    let (allowed, burst_curves) = boundary_burst(store, clock, "burst", &run.progress).await?;
    *curves = burst_curves;
    // The script derives its second key from the first: on a cluster a hash
    // tag keeps both in one slot, as a caller of the script would have to.
    let reference_key =
        if nodes.is_cluster() { format!("{prefix}{{reference}}") } else { format!("{prefix}reference") };
    run.progress.step("A. boundary burst, reference".to_owned());
    let reference = reference_burst(nodes.owner_of(&reference_key).await?, &reference_key).await;
    report.boundary_burst = Some(burst_report(allowed, reference.as_ref().ok().copied()));
    reference?;
    run.progress.done(2 * BURST_HALF);
    nodes.delete_prefix(prefix).await?;

    let identities = run.identities;
    // Every algorithm a key per identity, then the two the packed layout
    // packs, its buckets sized for the experiment's identities.
    let packed = store.clone().with_layout(Layout::packed_for(identities));
    let candidates = Algorithm::ALL.into_iter().map(|a| (a.name(), a, store)).chain([
        (SWC_PACKED, Algorithm::SlidingWindowCounter, &packed),
        (FW_PACKED, Algorithm::FixedWindow, &packed),
    ]);
    for (name, algorithm, store) in candidates {
        let limit = memory_limit(algorithm)?;
        run.progress.step(format!("B. memory, {name}"));
        one_identity(store, clock, &limit).await?;
        run.progress.done(ONE_IDENTITY_REQUESTS);
        let mut usage = 0;
        let keys = match store.location(&Identity::named(SCOPE, "one"), &limit) {
            Location::Key(key) => vec![key],
            // The window hash that holds it, alone in it (window 0).
            Location::Packed { stem, .. } => vec![format!("{stem}{}", WINDOW_0_MS / BURST_WINDOW_MS)],
            other => return Err(format!("unknown location {other:?}").into()),
        };
        for key in keys {
            // On a cluster, asked of the master that holds the key.
            usage += nodes.memory_usage(&key).await?;
        }
        nodes.delete_prefix(prefix).await?;
        settle(nodes).await?;

        // On a cluster, summed over the masters the identities spread across.
        let before = nodes.used_memory().await?;
        // The sliding window counter's identities in two consecutive
        // windows (in the packed layout both windows' hashes are alive); a
        // fixed window's state expires with its window.
        let windows = if algorithm == Algorithm::SlidingWindowCounter { 2 } else { 1 };
        for window in 0..windows {
            clock.set(WINDOW_0_MS + window * BURST_WINDOW_MS);
            decide_each(store, identities, limit, run).await?;
        }
        let after = nodes.used_memory().await?;
        nodes.delete_prefix(prefix).await?;
        settle(nodes).await?;
        report.memory.insert(
            name,
            Memory {
                bytes_per_identity: after.saturating_sub(before) / identities,
                memory_usage_one_identity: Some(usage),
                bytes_one_identity_after_10000_requests: usage,
            },
        );
    }
    if !nodes.is_cluster() {
        // The article's own layout, two keys per identity, each identity
        // in two consecutive windows, as the counter above.
        run.progress.step(format!("B. memory, {REFERENCE}"));
        let before = nodes.used_memory().await?;
        let conn = nodes.owner_of(&format!("{prefix}reference")).await?.clone();
        for window in 0..2 {
            reference_each(&conn, prefix, identities, WINDOW_0_MS + window * BURST_WINDOW_MS, run).await?;
        }
        let after = nodes.used_memory().await?;
        // One identity's two keys, `<key>:<window number>`, each a counter.
        let window = WINDOW_0_MS / BURST_WINDOW_MS;
        let mut usage = 0;
        for w in [window, window + 1] {
            usage += nodes.memory_usage(&format!("{prefix}user-0:{w}")).await?;
        }
        nodes.delete_prefix(prefix).await?;
        settle(nodes).await?;
        report.memory.insert(
            REFERENCE,
            Memory {
                bytes_per_identity: after.saturating_sub(before) / identities,
                memory_usage_one_identity: Some(usage),
                bytes_one_identity_after_10000_requests: usage,
            },
        );
    }
    Ok(())
}

/// The article's script in the memory experiment's report.
const REFERENCE: &str = "reference_script";

/// One request of the article's script for each of `identities` identities
/// at `now_ms`, [`IN_FLIGHT`] at a time, keys under `prefix`.
async fn reference_each(
    conn: &redis::aio::ConnectionManager,
    prefix: &str,
    identities: u64,
    now_ms: u64,
    run: &Run,
) -> Result<(), Box<dyn std::error::Error>> {
    let script = Arc::new(ReferenceScript::new());
    script.load(&mut conn.clone()).await?;
    let quota = memory_limit(Algorithm::SlidingWindowCounter)?.quota;
    let mut tasks = JoinSet::new();
    for chunk in 0..identities.div_ceil(IN_FLIGHT) {
        for i in chunk * IN_FLIGHT..((chunk + 1) * IN_FLIGHT).min(identities) {
            let (script, mut conn, key) = (Arc::clone(&script), conn.clone(), format!("{prefix}user-{i}"));
            tasks.spawn(async move { script.decide(&mut conn, &key, now_ms, &quota).await });
        }
        while let Some(done) = tasks.join_next().await {
            done??;
            run.progress.done(1);
        }
    }
    Ok(())
}

/// The sliding window counter in the packed layout, in the report.
const SWC_PACKED: &str = "sliding_window_counter_packed";
/// The fixed window in the packed layout, in the report.
const FW_PACKED: &str = "fixed_window_packed";

/// One decision for each of `identities` identities, [`IN_FLIGHT`] at a time.
async fn decide_each(
    store: &RedisStore,
    identities: u64,
    limit: Limit,
    run: &Run,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut tasks = JoinSet::new();
    for chunk in 0..identities.div_ceil(IN_FLIGHT) {
        for i in chunk * IN_FLIGHT..((chunk + 1) * IN_FLIGHT).min(identities) {
            let (store, identity) = (store.clone(), Identity::named(SCOPE, &format!("user-{i}")));
            tasks.spawn(async move { store.decide(Request::new(&identity, &[Charge::new(limit, 1)])).await });
        }
        while let Some(done) = tasks.join_next().await {
            done??;
            run.progress.done(1);
        }
    }
    Ok(())
}

/// Experiment A through `store`: returns admissions per algorithm and their curves.
async fn boundary_burst<S: Store>(
    store: &S,
    clock: &ManualClock,
    key: &str,
    progress: &Progress,
) -> Result<(BTreeMap<&'static str, u64>, Curves), Box<dyn std::error::Error>> {
    let quota = burst_quota()?;
    let identity = Identity::named(SCOPE, key);
    let mut allowed = BTreeMap::new();
    let mut curves = Vec::new();
    for algorithm in Algorithm::ALL {
        progress.step(format!("A. boundary burst, {}", algorithm.name()));
        let charge = [Charge::new(Limit::new(algorithm, quota), 1)];
        let mut admitted = 0;
        let mut curve = Vec::new();
        for t in burst_times() {
            clock.set(t);
            admitted += u64::from(store.decide(Request::new(&identity, &charge)).await?.allowed());
            curve.push((t - WINDOW_0_MS, admitted));
            progress.done(1);
        }
        allowed.insert(algorithm.name(), admitted);
        curves.push((algorithm.name(), curve));
    }
    Ok((allowed, curves))
}

/// The article's script on the same timestamps, called with EVALSHA.
async fn reference_burst(
    conn: &mut redis::aio::ConnectionManager,
    key: &str,
) -> Result<u64, Box<dyn std::error::Error>> {
    let script = ReferenceScript::new();
    let quota = burst_quota()?;
    let mut admitted = 0;
    for t in burst_times() {
        admitted += u64::from(script.decide(conn, key, t, &quota).await?);
    }
    Ok(admitted)
}

/// Experiment A's limit: [`BURST_LIMIT`] per [`BURST_WINDOW_MS`].
fn burst_quota() -> Result<Quota, slidegate::QuotaError> {
    Quota::new(BURST_LIMIT, Duration::from_millis(BURST_WINDOW_MS))
}

/// The last [`BURST_HALF`] ms of window 0 and the first of window 1, one request per ms.
fn burst_times() -> std::ops::Range<u64> {
    let boundary = WINDOW_0_MS + BURST_WINDOW_MS;
    boundary - BURST_HALF..boundary + BURST_HALF
}

fn burst_report(allowed: BTreeMap<&'static str, u64>, reference_script: Option<u64>) -> BoundaryBurst {
    BoundaryBurst {
        limit: BURST_LIMIT,
        window_ms: BURST_WINDOW_MS,
        sent: 2 * BURST_HALF,
        allowed,
        reference_script,
    }
}

/// Experiment B's limit: large enough that all 10,000 requests of one identity are admitted.
fn memory_limit(algorithm: Algorithm) -> Result<Limit, slidegate::QuotaError> {
    Ok(Limit::new(algorithm, Quota::new(ONE_IDENTITY_REQUESTS, Duration::from_millis(BURST_WINDOW_MS))?))
}

/// 10,000 requests from identity `one`, 5 ms apart, all inside window 0.
async fn one_identity<S: Store>(
    store: &S,
    clock: &ManualClock,
    limit: &Limit,
) -> Result<(), Box<dyn std::error::Error>> {
    let (identity, charge) = (Identity::named(SCOPE, "one"), [Charge::new(*limit, 1)]);
    for i in 0..ONE_IDENTITY_REQUESTS {
        clock.set(WINDOW_0_MS + i * 5);
        if !store.decide(Request::new(&identity, &charge)).await?.allowed() {
            return Err(format!("request {i} of identity `one` was denied under {limit}").into());
        }
    }
    Ok(())
}

/// Lets Redis shrink its key tables after a delete, so the next measurement
/// pays for its own table growth (`serverCron` resizes them, 10 times a second).
async fn settle(nodes: &mut Nodes) -> Result<(), redis::RedisError> {
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for conn in nodes.connections() {
        redis::cmd("PING").query_async::<()>(conn).await?;
    }
    Ok(())
}

fn render(report: &Report) -> String {
    let mut out = String::new();
    let store = match report.store {
        "redis" => "Redis",
        "redis_cluster" => "Redis Cluster",
        _ => "embedded store",
    };
    let engine = match (report.engine, report.engine_setting) {
        (Some(engine), Some("auto")) => format!(", engine {engine} (chosen by auto)"),
        (Some(engine), _) => format!(", engine {engine}"),
        (None, Some(setting)) => format!(", engine {setting}"),
        (None, None) => String::new(),
    };
    let _ = writeln!(out, "slidegate demo on the {store}{engine}\n");
    if let Some(b) = &report.boundary_burst {
        render_burst(&mut out, b);
    }
    if !report.memory.is_empty() {
        render_memory(&mut out, report);
    }
    if let Some(err) = &report.error {
        let _ = writeln!(out, "\nStopped before the end: {err}");
    }
    out
}

fn render_burst(out: &mut String, b: &BoundaryBurst) {
    let _ = writeln!(out, "A. Boundary burst: limit {} per {} s", b.limit, b.window_ms / 1000);
    let _ = writeln!(
        out,
        "   {} requests in the last {} ms of window 0, then {} in the first {} ms of window 1\n",
        BURST_HALF, BURST_HALF, BURST_HALF, BURST_HALF
    );
    let _ = writeln!(out, "   {:<26} {:>7}", "algorithm", "allowed");
    for (name, &n) in Algorithm::ALL.iter().filter_map(|a| Some((a.name(), b.allowed.get(a.name())?))) {
        let note = match n {
            n if n > b.limit => format!("  {:.1}× the limit within {} ms", n as f64 / b.limit as f64, b.sent),
            n if n == b.limit => "  = the limit".to_owned(),
            _ => String::new(),
        };
        let _ = writeln!(out, "   {:<26} {:>7} of {}{note}", name, n, b.sent);
    }
    if let Some(n) = b.reference_script {
        let _ = writeln!(
            out,
            "   {:<26} {:>7} of {}  (the article's Lua script, est < limit)",
            "reference script", n, b.sent
        );
    }
}

fn render_memory(out: &mut String, report: &Report) {
    let _ = writeln!(out, "\nB. Memory per identity (limit {ONE_IDENTITY_REQUESTS} per 60 s)\n");
    let (one_header, many_header) = if report.store == "redis_cluster" {
        ("MEMORY USAGE, 1 identity", "Σ masters used_memory Δ / id")
    } else if report.store == "redis" {
        ("MEMORY USAGE, 1 identity", "used_memory Δ / identity")
    } else {
        ("heap, 1 identity + table", "heap / identity")
    };
    let _ = writeln!(out, "   {:<30} {:>26} {:>28}", "algorithm", one_header, many_header);
    let _ = writeln!(
        out,
        "   {:<30} {:>26} {:>28}",
        "",
        format!("after {ONE_IDENTITY_REQUESTS} requests"),
        format!("over {} identities", report.identities)
    );
    let names = Algorithm::ALL.iter().map(|a| a.name()).chain([SWC_PACKED, FW_PACKED, REFERENCE]);
    for (name, m) in names.filter_map(|name| Some((name, report.memory.get(name)?))) {
        let _ = writeln!(
            out,
            "   {:<30} {:>24} B {:>26} B",
            name, m.bytes_one_identity_after_10000_requests, m.bytes_per_identity
        );
    }
    let one = |name: &str| report.memory.get(name).map(|m| m.bytes_one_identity_after_10000_requests);
    if let (Some(log), Some(counter)) = (one("sliding_log"), one("sliding_window_counter")) {
        let counter = counter.max(1);
        let _ = writeln!(
            out,
            "\n   After {ONE_IDENTITY_REQUESTS} requests the exact log holds {log} B, the sliding window counter {counter} B: {:.0}× less.",
            log as f64 / counter as f64
        );
    }
}
