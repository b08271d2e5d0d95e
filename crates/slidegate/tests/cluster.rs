//! The Redis store on a Redis Cluster: the conformance cases and the
//! stores-agree property on the binary's shared cluster (one start for all),
//! then decisions under load while slots move between masters (own cluster).
#![cfg(feature = "redis")]

mod agree_cases;
mod support;
#[macro_use]
mod conformance_cases;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agree_cases::Clock;
use proptest::test_runner::{Config, TestRunner};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use slidegate::{Algorithm, Layout, ManualClock, RedisOptions, RedisStore, RedisTarget, TimeSource};
use slidegate_test_redis::{slot_of, RedisCluster};
use support::{id, limit, unique_prefix, Decide};

/// A store on the shared cluster, deciding on `clock`, under a fresh prefix.
async fn cluster_store(clock: &ManualClock, name: &str) -> RedisStore {
    RedisStore::connect_to(&RedisTarget::Cluster(RedisCluster::shared().urls()), options())
        .await
        .unwrap_or_else(|e| panic!("connect to the shared cluster: {e}"))
        .with_prefix(unique_prefix(name))
        .with_time_source(TimeSource::Client(Arc::new(clock.clone())))
}

/// Deadlines for two busy cores and a cluster that moves slots.
fn options() -> RedisOptions {
    RedisOptions::new().with_timeout(Duration::from_secs(5)).with_connect_timeout(Duration::from_secs(5))
}

async fn admin(urls: Vec<String>) -> ClusterConnection {
    let client = ClusterClient::new(urls).unwrap_or_else(|e| panic!("cluster client: {e}"));
    client.get_async_connection().await.unwrap_or_else(|e| panic!("admin connection to the cluster: {e}"))
}

conformance_suite!(conformance, |clock, case| ((), cluster_store(&clock, case).await));

conformance_suite!(conformance_packed, [packed_windows_follow_the_clock_they_are_given], |clock, case| {
    ((), cluster_store(&clock, case).await.with_layout(Layout::packed_for(100_000)))
});

/// A Cluster's identities live in different slots, which no script call
/// can write together: it makes no joint decisions, and says so.
#[tokio::test]
async fn a_cluster_makes_no_joint_decisions() {
    let store = cluster_store(&ManualClock::new(support::T0), "joint").await;
    assert!(slidegate::Store::joint(&store).is_none());
}

/// One layout per prefix on a Cluster too: the record is one key, on the
/// node owning its slot, which every store reaches through its redirects.
#[tokio::test]
async fn a_cluster_keeps_one_layout_per_prefix() {
    let clock = ManualClock::new(support::T0);
    let first = cluster_store(&clock, "layout").await.with_layout(Layout::packed_for(1_000));
    first.record_layout(Duration::from_secs(60)).await.expect("the first record");
    let same = first.clone().with_layout(Layout::packed_for(1_000));
    same.record_layout(Duration::from_secs(60)).await.expect("the same settings");
    let other = first.clone().with_layout(Layout::PerKey);
    match other.record_layout(Duration::from_secs(60)).await {
        Err(slidegate::StoreError::Unavailable(slidegate::Unavailable::LayoutConflict(conflict))) => {
            assert_eq!(conflict.recorded, "packed 32");
            assert_eq!(conflict.key, format!("{}layout", first.prefix()));
        }
        other => panic!("expected a layout conflict, got {other:?}"),
    }
}

/// Fewer cases than on one server: each step is a round trip through the
/// cluster client, and the single-server run covers the arithmetic broadly.
const AGREE_CASES: u32 = 32;

#[test]
fn memory_and_cluster_decide_identically() {
    agree(Layout::PerKey, Clock::StepsBack);
}

#[test]
fn memory_and_packed_cluster_decide_identically() {
    agree(Layout::packed_for(1_000_000), Clock::Forward);
}

fn agree(layout: Layout, clock: Clock) {
    let cluster = RedisCluster::shared();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    let redis = runtime
        .block_on(RedisStore::connect_to(&RedisTarget::Cluster(cluster.urls()), options()))
        .unwrap_or_else(|e| panic!("connect: {e}"))
        .with_layout(layout);
    let admin = runtime.block_on(admin(cluster.urls()));
    let prefix = unique_prefix("agree");
    let mut config = Config::with_cases(AGREE_CASES);
    config.source_file = Some(file!());
    let mut runner = TestRunner::new(config);
    let case = AtomicUsize::new(0);
    let result = runner.run(&agree_cases::trace(clock), |trace| {
        let case = case.fetch_add(1, Ordering::Relaxed);
        runtime.block_on(agree_cases::replay(&redis, &admin, &prefix, case, &trace))
    });
    if let Err(e) = result {
        panic!("{e}\n{runner}");
    }
}

/// `decide_all` over all five algorithms for identities spread over every
/// master: one script, several keys, never `CROSSSLOT`.
#[tokio::test]
async fn decide_all_over_every_algorithm_never_crosses_slots() {
    let clock = ManualClock::new(support::T0);
    let store = cluster_store(&clock, "all").await;
    let charges: Vec<_> = Algorithm::ALL.into_iter().map(|a| (limit(a, 3, 1000), 1)).collect();
    let cluster = RedisCluster::shared();
    let mut masters = HashSet::new();
    for i in 0..60 {
        let identity = format!("user-{i}");
        masters.insert(cluster.master_of_slot(slot_of(&store.keys_for(&id(&identity), &charges[0].0)[0])));
        for round in 0..4 {
            let decisions = store
                .decide_all(&id(&identity), &charges)
                .await
                .unwrap_or_else(|e| panic!("{identity}: {e}"));
            assert!(
                decisions.iter().all(|d| d.allowed == (round < 3)),
                "{identity} round {round}: {decisions:?}"
            );
        }
    }
    assert_eq!(masters.len(), 3, "the identities cover every master");
}

/// Decisions run from four tasks for 24 identities while each identity's
/// slot migrates to another master (`MIGRATING`/`IMPORTING`, `ASK`, keys
/// moved, `MOVED`): no decision fails, no identity is admitted beyond its
/// limit, and the permits the log holds are exactly those the clients were
/// told were admitted (nothing charged twice by a redirect or a retry).
#[test]
fn decisions_survive_resharding_without_errors_or_double_charges() {
    let mut cluster = RedisCluster::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let store = runtime
        .block_on(RedisStore::connect_to(&RedisTarget::Cluster(cluster.urls()), options()))
        .unwrap_or_else(|e| panic!("connect: {e}"));
    // A long window keeps every count exact for the whole test.
    let log = limit(Algorithm::SlidingLog, 400, 600_000);
    let window = limit(Algorithm::FixedWindow, 1_000_000, 600_000);
    let masters = cluster.masters();
    let (from, to) = (masters[0], masters[1]);
    let mut identities = Vec::new();
    let mut slots = HashSet::new();
    for i in 0.. {
        let identity = format!("id-{i}");
        let slot = slot_of(&store.keys_for(&id(&identity), &log)[0]);
        if cluster.master_of_slot(slot) == from && slots.insert(slot) {
            identities.push((identity, slot));
        }
        if identities.len() == 24 {
            break;
        }
    }

    let stop = Arc::new(AtomicBool::new(false));
    let decided = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let admitted: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let names: Arc<Vec<String>> = Arc::new(identities.iter().map(|(id, _)| id.clone()).collect());
    let tasks: Vec<_> = (0..4)
        .map(|t| {
            let (store, stop, decided, errors, admitted, names) = (
                store.clone(),
                stop.clone(),
                decided.clone(),
                errors.clone(),
                admitted.clone(),
                names.clone(),
            );
            runtime.spawn(async move {
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    let identity = &names[i % names.len()];
                    i += 1;
                    // Both limits in one script: two keys of one slot.
                    match store.decide_all(&id(identity), &[(log, 1), (window, 1)]).await {
                        Ok(d) => {
                            if d[0].allowed {
                                *admitted.lock().expect("lock").entry(identity.clone()).or_default() += 1;
                            }
                            decided.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => errors.lock().expect("lock").push(format!("{identity}: {e}")),
                    }
                }
            })
        })
        .collect();

    let started = Instant::now();
    let wait_for_progress = |decided: &AtomicU64, n: u64| {
        let target = decided.load(Ordering::Relaxed) + n;
        let deadline = Instant::now() + Duration::from_secs(20);
        while decided.load(Ordering::Relaxed) < target && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    for (_, slot) in &identities {
        cluster.begin_slot_migration(*slot, from, to);
        // Decisions while the slot is half moved: ASK for new keys, the
        // source for existing ones.
        wait_for_progress(&decided, 20);
        cluster.finish_slot_migration(*slot, from, to);
        wait_for_progress(&decided, 20);
    }
    // And a plain reshard of many slots between two other masters.
    cluster.move_slots(masters[2], masters[1], 64);
    wait_for_progress(&decided, 200);
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        runtime.block_on(task).expect("decision task");
    }

    let errors = errors.lock().expect("lock").clone();
    let admitted = admitted.lock().expect("lock").clone();
    let total = decided.load(Ordering::Relaxed);
    eprintln!(
        "reshard: {} slots migrated + 64 resharded in {elapsed:?}; {total} decisions, {} errors, {} admitted",
        identities.len(),
        errors.len(),
        admitted.values().sum::<u64>()
    );
    assert!(
        errors.is_empty(),
        "{} decisions failed, e.g. {:?}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );
    for (identity, slot) in &identities {
        assert_eq!(cluster.master_of_slot(*slot), to, "{identity}'s slot moved");
        let n = admitted.get(identity).copied().unwrap_or(0);
        assert!(n <= 400, "{identity} admitted {n} > 400");
        let key = &store.keys_for(&id(identity), &log)[0];
        let held: u64 =
            cluster.cli(to, &["ZCARD", key]).parse().unwrap_or_else(|e| panic!("ZCARD {key}: {e}"));
        assert_eq!(held, n, "{identity}: the log holds {held} permits, clients were told {n}");
    }
    assert!(admitted.values().sum::<u64>() > 0);
}
