//! A call that failed charges nothing: decisions sent to a Redis that is
//! stopped (SIGSTOP) time out at the caller, and when Redis runs again
//! (SIGCONT) and reaches them, each finds its deadline passed and writes
//! nothing. On one server and on a Redis Cluster, through the Lua scripts
//! (one limit, several, under a penalty, a crawl-breadth sketch; and the
//! scripts that decide nothing: shared tables, a lift, a give back) and
//! the native module.
//!
//! Its own test binary: stopping a server (or a cluster's node) would stall
//! every other test sharing it.
#![cfg(feature = "redis")]

mod support;

use std::time::{Duration, Instant};

use slidegate::{
    Algorithm, Charge, DistinctStore, Engine, Identity, Layout, Penalty, Quota, RedisOptions, RedisStore,
    RedisTarget, Request, Store,
};
use slidegate_test_redis::{module_args, slot_of, CommandStats, RedisCluster, RedisServer};
use support::{id, limit};

/// Calls sent while the server is stopped.
const STALLED: usize = 3;

/// The store's deadline: short, since every stalled call waits it out.
fn options(engine: Engine) -> RedisOptions {
    RedisOptions::new()
        .with_timeout(Duration::from_millis(100))
        .with_connect_timeout(Duration::from_secs(5))
        .with_engine(engine)
}

/// How a test stops and resumes the server holding the identity's keys, and
/// counts the decisions it ran (for the engine under test).
struct Server<'a> {
    pause: &'a dyn Fn(),
    resume: &'a dyn Fn(),
    /// Decisions the server ran so far: `INFO commandstats` of the commands
    /// the engine sends.
    ran: &'a dyn Fn() -> u64,
}

/// The charges of a rule: a per-minute limit of 10, and with `two` a second,
/// per-hour limit of 100 (decided all or nothing).
fn rule(algorithm: Algorithm, two: bool) -> Vec<Charge> {
    let mut charges = vec![Charge::new(limit(algorithm, 10, 60_000), 1)];
    if two {
        charges.push(Charge::new(limit(Algorithm::SlidingWindowCounter, 100, 3_600_000), 1));
    }
    charges
}

/// Sends [`STALLED`] calls of `charges` for `who` while the server is
/// stopped, sees each time out, resumes the server, waits until it has run
/// them, and asserts that nothing was charged: a peek finds every limit full.
async fn stalled_calls_charge_nothing(
    store: &RedisStore,
    server: &Server<'_>,
    who: &Identity,
    charges: &[Charge],
    penalty: Option<&Penalty>,
) {
    // One decision first: the connection is up and the scripts loaded.
    let warm = id(&format!("{who}-warm"));
    store.decide(Request::new(&warm, charges)).await.expect("the server answers before the stop");
    let before = (server.ran)();
    (server.pause)();
    let calls = (0..STALLED).map(|_| {
        let (store, who, charges, penalty) = (store.clone(), who.clone(), charges.to_vec(), penalty.copied());
        tokio::spawn(async move {
            let request = Request::new(&who, &charges);
            let request = match &penalty {
                Some(p) => request.with_penalty(p),
                None => request,
            };
            store.decide(request).await
        })
    });
    let answers: Vec<_> = calls.collect();
    let mut failed = Vec::new();
    for answer in answers {
        failed.push(answer.await.expect("the call's task"));
    }
    (server.resume)();
    for answer in &failed {
        assert!(matches!(answer, Err(e) if e.is_timeout()), "a call to a stopped server: {answer:?}");
    }
    wait_until_ran(server, before + STALLED as u64);
    let peek: Vec<Charge> = charges.iter().map(|c| Charge::new(c.limit, 0)).collect();
    let outcome = store.decide(Request::new(who, &peek)).await.expect("the server answers after the stop");
    for (decision, charge) in outcome.decisions.iter().zip(charges) {
        assert_eq!(
            decision.remaining,
            charge.limit.quota.permits(),
            "{STALLED} calls that timed out charged {} permits of {}",
            charge.limit.quota.permits() - decision.remaining,
            charge.limit
        );
    }
}

/// Waits (bounded) until the server has run `count` decisions in all: the
/// stalled calls, queued in its socket, run when it resumes.
fn wait_until_ran(server: &Server<'_>, count: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while (server.ran)() < count {
        assert!(Instant::now() < deadline, "the stalled calls never ran: {} of {count}", (server.ran)());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Decisions run by a Lua script or the module on the server at `port`.
fn decisions_run(port: u16) -> u64 {
    let stats = CommandStats::of_port(port);
    ["evalsha", "eval", "slidegate.decide", "slidegate.decide_all"].iter().map(|c| stats.calls(c)).sum()
}

fn penalty() -> Penalty {
    Penalty::new(3, Duration::from_secs(60), Duration::from_secs(60), Duration::from_secs(600))
        .expect("a valid penalty")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_that_timed_out_on_a_stopped_server_charge_nothing_when_it_resumes() {
    let server = std::sync::Mutex::new(RedisServer::spawn_with_args(
        &module_args().iter().map(String::as_str).collect::<Vec<_>>(),
    ));
    let port = server.lock().unwrap().port();
    let url = server.lock().unwrap().url();
    let pause = || server.lock().unwrap().pause();
    let resume = || server.lock().unwrap().resume();
    let ran = || decisions_run(port);
    let stopped = Server { pause: &pause, resume: &resume, ran: &ran };
    for engine in [Engine::Lua, Engine::Module] {
        let store = RedisStore::connect_with(&url, options(engine)).await.expect("connect");
        for (algorithm, two) in [
            (Algorithm::SlidingWindowCounter, false),
            (Algorithm::Gcra, false),
            (Algorithm::FixedWindow, true),
            (Algorithm::TokenBucket, true),
        ] {
            let who = id(&format!("{engine}-{}-{two}", algorithm.name()));
            stalled_calls_charge_nothing(&store, &stopped, &who, &rule(algorithm, two), None).await;
        }
    }
    // The scripts only: the sliding log, and any rule under a penalty.
    let store = RedisStore::connect_with(&url, options(Engine::Auto)).await.expect("connect");
    let log = rule(Algorithm::SlidingLog, false);
    stalled_calls_charge_nothing(&store, &stopped, &id("log"), &log, None).await;
    let penalized = rule(Algorithm::SlidingWindowCounter, true);
    stalled_calls_charge_nothing(&store, &stopped, &id("penalized"), &penalized, Some(&penalty())).await;
    // The packed layout, whose window hashes only the scripts write.
    let packed = store.with_layout(Layout::packed_for(1_000));
    for (algorithm, two) in [(Algorithm::SlidingWindowCounter, false), (Algorithm::FixedWindow, true)] {
        let who = id(&format!("packed-{}-{two}", algorithm.name()));
        stalled_calls_charge_nothing(&packed, &stopped, &who, &rule(algorithm, two), None).await;
    }
    let penalized = rule(Algorithm::FixedWindow, true);
    stalled_calls_charge_nothing(&packed, &stopped, &id("packed-penalized"), &penalized, Some(&penalty()))
        .await;
}

/// Crawl breadth: a value sent while the server is stopped is not added to
/// the sketch when the server reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_distinct_value_that_timed_out_is_not_counted_when_the_server_resumes() {
    let mut server = RedisServer::spawn();
    let store = RedisStore::connect_with(&server.url(), options(Engine::Lua)).await.expect("connect");
    let quota = Quota::per_minute(5).expect("a valid quota");
    let who = id("crawler");
    let distinct = store.distinct().expect("Redis keeps sketches");
    distinct.decide_distinct(&who, &quota, b"/a").await.expect("the server answers before the stop");
    let before = decisions_run(server.port());
    server.pause();
    let late = distinct.decide_distinct(&who, &quota, b"/b").await;
    server.resume();
    assert!(matches!(late, Err(ref e) if e.is_timeout()), "{late:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while decisions_run(server.port()) < before + 1 {
        assert!(Instant::now() < deadline, "the stalled call never ran");
        std::thread::sleep(Duration::from_millis(10));
    }
    let seen = distinct.decide_distinct(&who, &quota, b"/a").await.expect("the server answers");
    assert_eq!(seen.remaining, 4, "only /a is counted");
}

/// The scripts that decide nothing — a shared table's put and delete, a
/// penalty lift, a lease's give back, per key and packed — each reached
/// after its deadline changes nothing (each includes `deadline.lua`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_that_decide_nothing_change_nothing_when_they_time_out() {
    use slidegate::{GiveBack, LeaseStore, SharedTables, TableName};

    let mut server = RedisServer::spawn();
    let port = server.port();
    let store = RedisStore::connect_with(&server.url(), options(Engine::Lua)).await.expect("connect");
    // Runs `call` while the server is stopped, sees it time out, resumes
    // the server and waits until the script has run.
    macro_rules! late {
        ($call:expr) => {{
            let before = decisions_run(port);
            server.pause();
            let answer = $call.await;
            server.resume();
            assert!(matches!(answer, Err(ref e) if e.is_timeout()), "{answer:?}");
            let deadline = Instant::now() + Duration::from_secs(10);
            while decisions_run(port) < before + 1 {
                assert!(Instant::now() < deadline, "the stalled call never ran");
                std::thread::sleep(Duration::from_millis(10));
            }
        }};
    }

    let tables = store.tables().expect("Redis keeps tables");
    let table = TableName::new("late").expect("a table name");
    let ttl = Duration::from_secs(60);
    tables.put_entry(&table, b"kept", b"1", ttl, None).await.expect("the server answers");
    late!(tables.put_entry(&table, b"late", b"1", ttl, None));
    late!(tables.delete_entry(&table, b"kept", None));
    let entries = tables.read_table(&table, None).await.expect("the server answers");
    assert_eq!(entries.iter().map(|e| e.field.as_slice()).collect::<Vec<_>>(), [b"kept".as_slice()]);

    // A block: 10 allowed, then 3 denials open the penalty box.
    let who = id("blocked");
    let charges = rule(Algorithm::SlidingWindowCounter, false);
    let penalty = penalty();
    for _ in 0..13 {
        store.decide(Request::new(&who, &charges).with_penalty(&penalty)).await.expect("decided");
    }
    late!(store.lift_penalty(&who, None));
    let still = store.decide(Request::new(&who, &charges).with_penalty(&penalty)).await.expect("decided");
    assert!(still.blocked_for.is_some(), "the late lift lifted nothing: {still:?}");

    for store in [store.clone(), store.clone().with_layout(Layout::packed_for(1_000))] {
        let leases = store.leases().expect("Redis leases");
        let lessee = id(&format!("lessee-{:?}", store.layout()));
        let limit = limit(Algorithm::SlidingWindowCounter, 10, 60_000);
        let lease = leases.lease(&lessee, Charge::new(limit, 4), None).await.expect("leased");
        let back = GiveBack { limit, window: lease.window, unused: 3 };
        late!(leases.give_back(&lessee, back, None));
        assert_eq!(
            leases.give_back(&lessee, back, None).await.expect("given back"),
            3,
            "all 3 were still there"
        );
    }
}

/// The process id of the cluster node on `port`.
fn node_pid(cluster: &RedisCluster, port: u16) -> String {
    let info = cluster.cli(port, &["INFO", "server"]);
    let pid = info.lines().find_map(|l| l.strip_prefix("process_id:")).expect("INFO server names the pid");
    pid.trim().to_owned()
}

fn signal(pid: &str, signal: &str) {
    let status = std::process::Command::new("kill").args([signal, pid]).status().expect("run kill");
    assert!(status.success(), "kill {signal} {pid}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_that_timed_out_on_a_stopped_cluster_master_charge_nothing_when_it_resumes() {
    let cluster =
        RedisCluster::start_with_args(&module_args().iter().map(String::as_str).collect::<Vec<_>>());
    let target = RedisTarget::Cluster(cluster.urls());
    for engine in [Engine::Lua, Engine::Module] {
        let store = RedisStore::connect_to(&target, options(engine)).await.expect("connect");
        for (algorithm, two) in [(Algorithm::SlidingWindowCounter, false), (Algorithm::Gcra, true)] {
            let who = id(&format!("cluster-{engine}-{}-{two}", algorithm.name()));
            let charges = rule(algorithm, two);
            let key = &store.keys_for(&who, &charges[0].limit)[0];
            let port = cluster.master_of_slot(slot_of(key));
            let pid = node_pid(&cluster, port);
            let pause = || signal(&pid, "-STOP");
            let resume = || signal(&pid, "-CONT");
            let ran = || decisions_run(port);
            let stopped = Server { pause: &pause, resume: &resume, ran: &ran };
            stalled_calls_charge_nothing(&store, &stopped, &who, &charges, None).await;
        }
    }
}

/// A deadline is refused only once it has passed: calls that the server
/// runs in time are charged as always, one by one.
#[tokio::test]
async fn calls_within_their_deadline_are_charged() {
    for engine in [Engine::Lua, Engine::Module, Engine::Auto] {
        let server = if engine == Engine::Module {
            RedisServer::spawn_with_args(&module_args().iter().map(String::as_str).collect::<Vec<_>>())
        } else {
            RedisServer::spawn()
        };
        let store = RedisStore::connect_with(&server.url(), options(engine)).await.expect("connect");
        let charges = rule(Algorithm::SlidingWindowCounter, true);
        let who = id("in-time");
        for left in (0..10).rev() {
            let outcome = store.decide(Request::new(&who, &charges)).await.expect("decided");
            assert_eq!(outcome.decisions[0].remaining, left);
        }
        assert!(!store.decide(Request::new(&who, &charges)).await.expect("decided").allowed());
    }
}
