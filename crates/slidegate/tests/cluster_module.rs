//! The native module on a Redis Cluster whose nodes all load it: the
//! conformance cases and a short stores-agree run through
//! `SLIDEGATE.DECIDE`/`DECIDE_ALL` (decisions identical to the memory
//! store), routing by the keys the commands declare (`MOVED` from a node
//! that does not own the slot, `CROSSSLOT` for keys of two identities), and
//! `Engine::Auto` asking every master: the module where all have it, Lua
//! where one lacks it; and quota leases by the module on every master.
#![cfg(feature = "redis")]

mod agree_cases;
mod support;
#[macro_use]
mod conformance_cases;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proptest::test_runner::{Config, TestRunner};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use slidegate::{Algorithm, Engine, ManualClock, RedisOptions, RedisStore, RedisTarget, TimeSource};
use slidegate_test_redis::{module_args, slot_of, CommandStats, RedisCluster};
use support::{id, limit, unique_prefix, Decide};

/// Deadlines for two busy cores.
fn options() -> RedisOptions {
    RedisOptions::new().with_timeout(Duration::from_secs(5)).with_connect_timeout(Duration::from_secs(5))
}

async fn connect(cluster: &RedisCluster, engine: Engine) -> RedisStore {
    RedisStore::connect_to(&RedisTarget::Cluster(cluster.urls()), options().with_engine(engine))
        .await
        .unwrap_or_else(|e| panic!("connect to the cluster: {e}"))
}

/// A store forced onto the module on the shared module cluster, deciding on
/// `clock`, under a fresh prefix.
async fn module_store(clock: &ManualClock, name: &str) -> RedisStore {
    connect(RedisCluster::shared_with_module(), Engine::Module)
        .await
        .with_prefix(unique_prefix(name))
        .with_time_source(TimeSource::Client(Arc::new(clock.clone())))
}

async fn admin(urls: Vec<String>) -> ClusterConnection {
    let client = ClusterClient::new(urls).unwrap_or_else(|e| panic!("cluster client: {e}"));
    client.get_async_connection().await.unwrap_or_else(|e| panic!("admin connection to the cluster: {e}"))
}

/// `cmdstat_<cmd>` calls on the node on `port`.
fn calls(cluster: &RedisCluster, port: u16, cmd: &str) -> u64 {
    CommandStats::parse(&cluster.cli(port, &["INFO", "commandstats"])).calls(cmd)
}

conformance_suite!(conformance, |clock, case| ((), module_store(&clock, case).await));

/// A short stores-agree run: each step a round trip through the cluster
/// client; the single-server module run covers the arithmetic broadly.
#[test]
fn memory_and_module_cluster_decide_identically() {
    let cluster = RedisCluster::shared_with_module();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    let redis = runtime.block_on(connect(cluster, Engine::Module));
    let admin = runtime.block_on(admin(cluster.urls()));
    let prefix = unique_prefix("agree");
    let mut config = Config::with_cases(16);
    config.source_file = Some(file!());
    let mut runner = TestRunner::new(config);
    let case = AtomicUsize::new(0);
    let result = runner.run(&agree_cases::trace(agree_cases::Clock::StepsBack), |trace| {
        let case = case.fetch_add(1, Ordering::Relaxed);
        runtime.block_on(agree_cases::replay(&redis, &admin, &prefix, case, &trace))
    });
    if let Err(e) = result {
        panic!("{e}\n{runner}");
    }
}

/// The commands declare their keys, so a node that does not own the slot
/// answers `MOVED` to its owner, and keys of two slots are `CROSSSLOT`,
/// before anything runs.
#[test]
fn the_commands_are_routed_by_their_keys() {
    let cluster = RedisCluster::shared_with_module();
    let masters = cluster.masters();
    // An identity whose slot the first master does not own.
    let key = (0..)
        .map(|i| format!("route:{{{}}}:swc:10:1000", id(&format!("id-{i}"))))
        .find(|k| cluster.master_of_slot(slot_of(k)) != masters[0])
        .expect("an identity on another master");
    let owner = cluster.master_of_slot(slot_of(&key));
    let args: Vec<u8> = [-1.0f64, 1.0, 10.0, 1000.0, 1.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let conn = |port: u16| {
        redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .and_then(|c| c.get_connection())
            .unwrap_or_else(|e| panic!("connect to {port}: {e}"))
    };
    let err = redis::cmd("SLIDEGATE.DECIDE")
        .arg(&key)
        .arg(&args)
        .query::<redis::Value>(&mut conn(masters[0]))
        .expect_err("MOVED");
    assert_eq!(err.code(), Some("MOVED"), "{err}");
    assert!(err.to_string().contains(&format!(":{owner}")), "MOVED to the owner {owner}: {err}");
    let mut all_args = args.clone();
    all_args.extend_from_slice(&args[8..]);
    let err = redis::cmd("SLIDEGATE.DECIDE_ALL")
        .arg(&key)
        .arg(&key)
        .arg(&all_args)
        .query::<redis::Value>(&mut conn(masters[0]))
        .expect_err("MOVED");
    assert_eq!(err.code(), Some("MOVED"), "{err}");
    // Two identities in two slots, sent to the owner of the first.
    let other = (0..)
        .map(|i| format!("route:{{{}}}:swc:10:1000", id(&format!("other-{i}"))))
        .find(|k| slot_of(k) != slot_of(&key))
        .expect("another slot");
    let err = redis::cmd("SLIDEGATE.DECIDE_ALL")
        .arg(&key)
        .arg(&other)
        .arg(&all_args)
        .query::<redis::Value>(&mut conn(owner))
        .expect_err("CROSSSLOT");
    assert_eq!(err.code(), Some("CROSSSLOT"), "{err}");
    // At the owner it decides.
    let reply = redis::cmd("SLIDEGATE.DECIDE").arg(&key).arg(&args).query::<Vec<u8>>(&mut conn(owner));
    assert_eq!(reply.expect("decides").len(), 32);
}

/// `Auto` asks every master and, all having the module, sends every
/// decision on every master to it: `decide` to `SLIDEGATE.DECIDE`,
/// `decide_all` to `SLIDEGATE.DECIDE_ALL`, never a script. With the module
/// unloaded from one master, a new store keeps to the scripts everywhere,
/// and the old one falls back to them on that master: the same decisions.
/// (A cluster of its own: commandstats of the shared one count the other
/// tests' calls, and the unload would break them.)
#[test]
fn auto_uses_the_module_only_where_every_master_has_it() {
    let args = module_args();
    let cluster = RedisCluster::start_with_args(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let masters = cluster.masters();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    let counter = limit(Algorithm::SlidingWindowCounter, 3, 60_000);
    let charges = [(counter, 1), (limit(Algorithm::Gcra, 3, 60_000), 1)];
    let decide_each = |store: &RedisStore, round: &str| {
        let mut covered = HashSet::new();
        for i in 0..30 {
            let identity = format!("{round}-{i}");
            covered.insert(cluster.master_of_slot(slot_of(&store.keys_for(&id(&identity), &counter)[0])));
            let d = runtime.block_on(store.decide_one(&id(&identity), &counter, 1)).expect("decides");
            assert_eq!(d.remaining, 2, "{identity}");
            let all = runtime.block_on(store.decide_all(&id(&identity), &charges)).expect("decides");
            assert_eq!(all.iter().map(|d| d.remaining).collect::<Vec<_>>(), [1, 2], "{identity}");
        }
        assert_eq!(covered.len(), 3, "the identities cover every master");
    };
    let count = |cmd: &str| masters.iter().map(|&p| calls(&cluster, p, cmd)).collect::<Vec<_>>();

    let store = runtime.block_on(connect(&cluster, Engine::Auto));
    decide_each(&store, "all");
    assert!(count("slidegate.decide").iter().all(|&n| n > 0), "{:?}", count("slidegate.decide"));
    assert!(count("slidegate.decide_all").iter().all(|&n| n > 0), "{:?}", count("slidegate.decide_all"));
    assert_eq!(count("evalsha"), [0, 0, 0]);
    assert_eq!(count("eval"), [0, 0, 0]);

    assert_eq!(cluster.cli(masters[1], &["MODULE", "UNLOAD", "slidegate"]), "OK");
    let module_calls = |c: &[u64], d: &[u64]| c.iter().chain(d).sum::<u64>();
    let before = module_calls(&count("slidegate.decide"), &count("slidegate.decide_all"));
    let fresh = runtime.block_on(connect(&cluster, Engine::Auto));
    decide_each(&fresh, "fresh");
    assert_eq!(
        module_calls(&count("slidegate.decide"), &count("slidegate.decide_all")),
        before,
        "no module call"
    );
    // The first store learns on the master without the module, by an
    // "unknown command" that ran nothing, and decides the same.
    decide_each(&store, "old");
}

/// Quota leases on the module cluster: `SLIDEGATE.LEASE` and
/// `SLIDEGATE.GIVE_BACK` declare their key, so the cluster client sends
/// each to the master of its slot, on every master, and give back exactly
/// the unused permits.
#[tokio::test]
async fn leases_run_on_every_master_by_the_module() {
    use slidegate::{Charge, GiveBack, LeaseStore};
    let cluster = RedisCluster::shared_with_module();
    let clock = ManualClock::new(support::T0);
    let store = module_store(&clock, "leases").await;
    let fixed = limit(Algorithm::FixedWindow, 40, 60_000);
    let mut covered = HashSet::new();
    for i in 0..30 {
        let identity = id(&format!("lease-{i}"));
        covered.insert(cluster.master_of_slot(slot_of(&store.keys_for(&identity, &fixed)[0])));
        let lease = LeaseStore::lease(&store, &identity, Charge::new(fixed, 10), None).await.expect("leases");
        assert_eq!(lease.decision.remaining, 30);
        let back = GiveBack { limit: fixed, window: lease.window, unused: 4 };
        assert_eq!(store.give_back(&identity, back, None).await.expect("gives back"), 4);
        assert_eq!(store.decide_one(&identity, &fixed, 0).await.expect("peeks").remaining, 34);
    }
    assert_eq!(covered.len(), 3, "the identities cover every master");
    for port in cluster.masters() {
        assert!(calls(cluster, port, "slidegate.lease") > 0, "leases on {port}");
        assert!(calls(cluster, port, "slidegate.give_back") > 0, "give-backs on {port}");
    }
}
