//! A master dies while decisions run, on a Redis Cluster and behind
//! Sentinel: decisions resume once a replica is promoted, no task panics,
//! every key still has a TTL. Each test measures the gap (the longest time
//! without a successful decision) and how many permits the identities
//! regained because the promoted replica had missed the last writes.
#![cfg(feature = "redis")]

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use slidegate::{Algorithm, Limit, RedisOptions, RedisStore, RedisTarget};
use slidegate_test_redis::{slot_of, RedisCluster, RedisSentinel};
use support::{id, limit, Decide};

/// Each identity's limit: a long sliding log, so every count is exact.
const PERMITS: u64 = 50;
const IDENTITIES: usize = 20;

fn options() -> RedisOptions {
    RedisOptions::new()
        .with_timeout(Duration::from_millis(500))
        .with_connect_timeout(Duration::from_millis(500))
}

fn log_limit() -> Limit {
    limit(Algorithm::SlidingLog, PERMITS, 600_000)
}

/// Decisions at full speed from two tasks over `identities`, recording when
/// each succeeded and how many permits each identity was admitted.
struct Load {
    stop: Arc<AtomicBool>,
    successes: Arc<Mutex<Vec<Instant>>>,
    errors: Arc<AtomicU64>,
    admitted: Arc<Vec<AtomicU64>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(runtime: &tokio::runtime::Runtime, store: &RedisStore, identities: &[String]) -> Load {
        let load = Load {
            stop: Arc::default(),
            successes: Arc::default(),
            errors: Arc::default(),
            admitted: Arc::new(identities.iter().map(|_| AtomicU64::new(0)).collect()),
            tasks: Vec::new(),
        };
        let identities: Arc<Vec<String>> = Arc::new(identities.to_vec());
        let tasks = (0..2)
            .map(|t| {
                let (store, identities) = (store.clone(), identities.clone());
                let (stop, successes, errors, admitted) =
                    (load.stop.clone(), load.successes.clone(), load.errors.clone(), load.admitted.clone());
                runtime.spawn(async move {
                    let mut i = t;
                    while !stop.load(Ordering::Relaxed) {
                        let k = i % identities.len();
                        i += 1;
                        match store.decide_one(&id(&identities[k]), &log_limit(), 1).await {
                            Ok(d) => {
                                if d.allowed {
                                    admitted[k].fetch_add(1, Ordering::Relaxed);
                                }
                                successes.lock().expect("lock").push(Instant::now());
                            }
                            Err(_) => {
                                errors.fetch_add(1, Ordering::Relaxed);
                                // Not a spin while the store fails fast.
                                tokio::time::sleep(Duration::from_millis(1)).await;
                            }
                        }
                    }
                })
            })
            .collect();
        Load { tasks, ..load }
    }

    fn admitted(&self) -> u64 {
        self.admitted.iter().map(|a| a.load(Ordering::Relaxed)).sum()
    }

    fn successes_since(&self, t: Instant) -> usize {
        self.successes.lock().expect("lock").iter().filter(|s| **s >= t).count()
    }

    /// Waits (bounded) until `what` holds.
    fn wait(&self, what: &str, mut done: impl FnMut(&Load) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(40);
        while !done(self) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Stops the tasks (none may have panicked) and reports the longest gap
    /// between successes after `from`, the errors and the permits admitted
    /// beyond the limit.
    fn finish(self, runtime: &tokio::runtime::Runtime, from: Instant, name: &str) -> (Duration, u64) {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            runtime.block_on(task).unwrap_or_else(|e| panic!("{name}: a decision task failed: {e}"));
        }
        let successes = self.successes.lock().expect("lock");
        let mut gap = Duration::ZERO;
        let mut last = from;
        for s in successes.iter().filter(|s| **s >= from) {
            gap = gap.max(s.duration_since(last));
            last = *s;
        }
        let excess: u64 =
            self.admitted.iter().map(|a| a.load(Ordering::Relaxed).saturating_sub(PERMITS)).sum();
        eprintln!(
            "{name}: gap {gap:?} without a successful decision, {} failed decisions, {} successes; \
             {excess} permits admitted beyond the limit of {PERMITS} × {} identities (lost writes)",
            self.errors.load(Ordering::Relaxed),
            successes.len(),
            self.admitted.len(),
        );
        for a in self.admitted.iter() {
            // Lost writes can give back at most what was written.
            assert!(a.load(Ordering::Relaxed) <= 2 * PERMITS, "{name}: an identity admitted twice its limit");
        }
        (gap, excess)
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime")
}

/// Every key on the node on `port` whose PTTL is not positive.
fn keys_without_ttl(cli: impl Fn(&[&str]) -> String) -> Vec<String> {
    let mut missing = Vec::new();
    let mut cursor = "0".to_owned();
    loop {
        let out = cli(&["SCAN", &cursor, "COUNT", "1000"]);
        let mut lines = out.lines();
        cursor = lines.next().unwrap_or("0").to_owned();
        for key in lines.filter(|k| !k.is_empty()) {
            let pttl: i64 = cli(&["PTTL", key]).parse().unwrap_or(-3);
            if pttl <= 0 {
                missing.push(format!("{key} (PTTL {pttl})"));
            }
        }
        if cursor == "0" {
            return missing;
        }
    }
}

#[test]
fn cluster_decisions_resume_after_a_master_fails_over() {
    let mut cluster = RedisCluster::start();
    let runtime = runtime();
    let store = runtime
        .block_on(RedisStore::connect_to(&RedisTarget::Cluster(cluster.urls()), options()))
        .unwrap_or_else(|e| panic!("connect: {e}"));
    let victim = cluster.masters()[0];
    // Identities on the master that dies: the ones a failover interrupts.
    let identities: Vec<String> = (0..)
        .map(|i| format!("user-{i}"))
        .filter(|name| cluster.master_of_slot(slot_of(&store.keys_for(&id(name), &log_limit())[0])) == victim)
        .take(IDENTITIES)
        .collect();
    let load = Load::start(&runtime, &store, &identities);
    // Kill halfway through the identities' permits: writes are in flight.
    load.wait("half the permits admitted", |l| l.admitted() >= PERMITS * IDENTITIES as u64 / 2);
    let killed_at = Instant::now();
    cluster.kill_master(0);
    let promoted = cluster.wait_for_failover();
    let promoted_at = Instant::now();
    load.wait("200 decisions after the failover", |l| l.successes_since(promoted_at) >= 200);
    let (gap, _) = load.finish(&runtime, killed_at, "cluster failover");
    eprintln!("cluster failover: replica promoted {:?} after the kill", promoted_at - killed_at);
    assert!(gap < Duration::from_secs(30), "decisions resumed");
    for master in cluster.masters() {
        assert!(master != victim || master == promoted);
        let missing = keys_without_ttl(|args| cluster.cli(master, args));
        assert!(missing.is_empty(), "keys without a TTL on {master}: {missing:?}");
    }
}

#[test]
fn sentinel_decisions_follow_the_master_through_a_failover() {
    let mut deployment = RedisSentinel::start();
    let runtime = runtime();
    let target = RedisTarget::Sentinel {
        sentinels: deployment.sentinel_urls(),
        master_name: deployment.master_name().to_owned(),
    };
    let store = runtime
        .block_on(RedisStore::connect_to(&target, options()))
        .unwrap_or_else(|e| panic!("connect: {e}"));
    let identities: Vec<String> = (0..IDENTITIES).map(|i| format!("user-{i}")).collect();
    let load = Load::start(&runtime, &store, &identities);
    load.wait("half the permits admitted", |l| l.admitted() >= PERMITS * IDENTITIES as u64 / 2);
    let killed_at = Instant::now();
    let old = deployment.kill_master();
    let new = deployment.wait_for_failover();
    let promoted_at = Instant::now();
    load.wait("200 decisions after the failover", |l| l.successes_since(promoted_at) >= 200);
    let (gap, _) = load.finish(&runtime, killed_at, "sentinel failover");
    eprintln!("sentinel failover: {old} → {new} promoted {:?} after the kill", promoted_at - killed_at);
    assert!(gap < Duration::from_secs(30), "decisions resumed");
    let missing = keys_without_ttl(|args| deployment.cli(new, args));
    assert!(missing.is_empty(), "keys without a TTL on {new}: {missing:?}");
}

/// A manual failover (`SENTINEL FAILOVER`) demotes a live master: its
/// connections may stay open and answer writes with `READONLY`. The store
/// then asks the sentinels again and writes reach the new master.
#[test]
fn sentinel_store_follows_a_manual_failover_to_the_new_master() {
    manual_failover(None);
}

/// The same, deciding from a thread that drives its own connection (as
/// `serve`'s workers do): its lane follows the shared connection to the
/// new master.
#[test]
fn sentinel_lanes_follow_a_manual_failover_to_the_new_master() {
    let lanes = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    lanes.block_on(async { slidegate::store::redis::drive_connections_here() });
    manual_failover(Some(lanes));
}

/// Decides on `lanes` when given, else on the runtime the store connected on.
fn manual_failover(lanes: Option<tokio::runtime::Runtime>) {
    let deployment = RedisSentinel::start();
    let connected_on = runtime();
    let runtime = lanes.as_ref().unwrap_or(&connected_on);
    let target = RedisTarget::Sentinel {
        sentinels: deployment.sentinel_urls(),
        master_name: deployment.master_name().to_owned(),
    };
    let store = connected_on
        .block_on(RedisStore::connect_to(&target, options()))
        .unwrap_or_else(|e| panic!("connect: {e}"));
    runtime
        .block_on(store.decide_one(&id("before"), &log_limit(), 1))
        .unwrap_or_else(|e| panic!("before: {e}"));
    let old = deployment.master_port();
    if lanes.is_some() {
        until_lane_on(&deployment, old, runtime, &store);
    }
    let sentinel = deployment.sentinel_ports()[0];
    let reply = deployment.cli(sentinel, &["SENTINEL", "FAILOVER", deployment.master_name()]);
    assert_eq!(reply, "OK", "SENTINEL FAILOVER");
    let deadline = Instant::now() + Duration::from_secs(40);
    let new = loop {
        let port = deployment.master_port();
        if port != old && deployment.cli(port, &["ROLE"]).starts_with("master") {
            break port;
        }
        assert!(Instant::now() < deadline, "the sentinels never promoted the replica");
        std::thread::sleep(Duration::from_millis(20));
    };
    let switched_at = Instant::now();
    let mut failed = 0;
    for n in 0.. {
        let identity = format!("after-{n}");
        let decided = runtime.block_on(store.decide_one(&id(&identity), &log_limit(), 1));
        if decided.is_ok()
            && deployment.cli(new, &["EXISTS", &store.keys_for(&id(&identity), &log_limit())[0]]) == "1"
        {
            break;
        }
        failed += u32::from(decided.is_err());
        assert!(Instant::now() < deadline, "writes never reached the new master {new}");
        std::thread::sleep(Duration::from_millis(5));
    }
    let switched = switched_at.elapsed();
    eprintln!(
        "manual sentinel failover {old} → {new}: writes on the new master {switched:?} after it was named, {failed} failed decisions"
    );
    // Waiting for the old master to answer READONLY would take ~10 s; the
    // store asks the sentinels every 250 ms.
    assert!(switched < Duration::from_secs(5), "the store stayed on the old master for {switched:?}");
    if lanes.is_some() {
        // The lane followed: the new master has both connections.
        until_lane_on(&deployment, new, runtime, &store);
    }
}

/// Decides (cost-0 peeks, on `runtime`) until the server on `port` has two
/// clients of the store's, the shared connection and the lane, which opens
/// in the background: unnamed clients, as the sentinels' are not, the
/// replica and `CLIENT LIST` itself aside.
fn until_lane_on(
    deployment: &RedisSentinel,
    port: u16,
    runtime: &tokio::runtime::Runtime,
    store: &RedisStore,
) {
    let store_clients = || {
        deployment
            .cli(port, &["CLIENT", "LIST"])
            .lines()
            .filter(|c| c.contains(" name= ") && c.contains(" flags=N ") && !c.contains("cmd=client|list"))
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while store_clients() < 2 {
        assert!(
            Instant::now() < deadline,
            "no lane on {port}: {}",
            deployment.cli(port, &["CLIENT", "LIST"])
        );
        runtime.block_on(async {
            let _ = store.decide_one(&id("peek"), &log_limit(), 0).await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        });
    }
}

/// A killed master comes back (empty, as a replica of the node that took
/// its slots), three times, while six connections of serve's deadline
/// (50 ms) decide at full speed: once the cluster has settled, every
/// connection decides again within a few seconds, each time. None may stay
/// stuck timing out on a topology it no longer matches.
#[test]
fn every_connection_decides_again_after_a_killed_master_comes_back() {
    let mut cluster = RedisCluster::start();
    let runtime = runtime();
    let quick = RedisOptions::new()
        .with_timeout(Duration::from_millis(50))
        .with_connect_timeout(Duration::from_millis(500));
    let stores: Vec<RedisStore> = (0..6)
        .map(|_| {
            runtime
                .block_on(RedisStore::connect_to(&RedisTarget::Cluster(cluster.urls()), quick.clone()))
                .unwrap_or_else(|e| panic!("connect: {e}"))
        })
        .collect();
    let wide = limit(Algorithm::FixedWindow, 1_000_000_000, 600_000);
    let identity = "comeback".to_owned();
    let slot = slot_of(&stores[0].keys_for(&id(&identity), &wide)[0]);
    // When each connection last decided: set by its task.
    let last_ok: Arc<Vec<Mutex<Instant>>> =
        Arc::new(stores.iter().map(|_| Mutex::new(Instant::now())).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = stores
        .iter()
        .enumerate()
        .map(|(i, store)| {
            let (store, identity, last_ok, stop) =
                (store.clone(), identity.clone(), last_ok.clone(), stop.clone());
            runtime.spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    if store.decide_one(&id(&identity), &wide, 1).await.is_ok() {
                        *last_ok[i].lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
        })
        .collect();
    for round in 0..3 {
        let master = cluster.master_of_slot(slot);
        let index = cluster.masters().iter().position(|&m| m == master).unwrap_or_else(|| panic!("{master}"));
        cluster.kill_master(index);
        // Started again as soon as a node sees the slot's new master, as a
        // supervisor would, before the cluster agrees.
        let promoted = Instant::now() + Duration::from_secs(30);
        while cluster.master_of_slot(slot) == master {
            assert!(Instant::now() < promoted, "round {round}: no replica took slot {slot} from {master}");
            std::thread::sleep(Duration::from_millis(20));
        }
        cluster.restart_node(master);
        let settled = Instant::now();
        let deadline = settled + Duration::from_secs(10);
        loop {
            let stuck: Vec<usize> = (0..stores.len())
                .filter(|&i| *last_ok[i].lock().unwrap_or_else(|e| e.into_inner()) < settled)
                .collect();
            if stuck.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: connections {stuck:?} did not decide in the 10 s after the killed master {master} came back"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        runtime.block_on(task).unwrap_or_else(|e| panic!("a decision task panicked: {e}"));
    }
}
