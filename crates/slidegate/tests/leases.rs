//! Quota leases never over-admit: three lease layers (three instances) on
//! one store, random traces, and every admitted request checked against an
//! exact log — the admitted requests replayed, in time order, through the
//! algorithm itself, each of which must be allowed. On the embedded store,
//! on a real Redis (client time, one `ManualClock` for the store and the
//! layers), on a Redis Cluster, and on a Redis that decides and leases by
//! the native module (`SLIDEGATE.LEASE`, `SLIDEGATE.GIVE_BACK`), which also
//! leaves exactly the bytes the Lua scripts leave. The checker is itself
//! tested: a lease used past its window end, as a wrong design would, is
//! caught.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use slidegate::algorithm::{fixed_window, sliding_window_counter};
use slidegate::protect::{LeasePolicy, Leased, NoEvents, Protect};
use slidegate::TimeSpan;
use slidegate::{
    Algorithm, Buckets, Charge, Clock, Engine, GiveBack, Identity, Layout, LeaseStore, Limit, ManualClock,
    MemoryStore, Quota, RedisOptions, RedisStore, RedisTarget, Request, Store, TimeSource,
};
use slidegate_test_redis::{module_args, CommandStats, RedisCluster, RedisServer};

/// 2026-01-01T00:00:00.000Z: a time well inside the stores' range.
const T0: u64 = 1_767_225_600_000;
const INSTANCES: usize = 3;

/// The requests among `admitted` (time in ms, identity index) that the
/// store's algorithm, asked for each at its own time, would have refused:
/// the over-admission. 0 for an admitted set the store could have admitted.
fn over_admitted(limit: &Limit, admitted: &[(u64, usize)]) -> usize {
    let mut sorted = admitted.to_vec();
    sorted.sort_by_key(|&(t, _)| t);
    let identities = sorted.iter().map(|&(_, i)| i + 1).max().unwrap_or(0);
    let q = &limit.quota;
    let mut refused = 0;
    match limit.algorithm {
        Algorithm::SlidingWindowCounter => {
            let mut states = vec![sliding_window_counter::State::default(); identities];
            for (t, i) in sorted {
                let (next, d) = sliding_window_counter::decide(states[i], t, 1, q);
                states[i] = next;
                refused += usize::from(!d.allowed);
            }
        }
        Algorithm::FixedWindow => {
            let mut states = vec![fixed_window::State::default(); identities];
            for (t, i) in sorted {
                let (next, d) = fixed_window::decide(states[i], t, 1, q);
                states[i] = next;
                refused += usize::from(!d.allowed);
            }
        }
        other => panic!("{other:?} is not leased"),
    }
    refused
}

/// One step of a trace: after `gap` ms, instance `instance` asks for
/// identity `identity`.
#[derive(Debug, Clone)]
struct Step {
    gap: u64,
    instance: usize,
    identity: usize,
}

fn trace() -> impl Strategy<Value = (bool, Vec<Step>)> {
    let step = (prop_oneof![4 => 0u64..8, 1 => 0u64..400], 0..INSTANCES, 0usize..2)
        .prop_map(|(gap, instance, identity)| Step { gap, instance, identity });
    (any::<bool>(), prop::collection::vec(step, 1..400))
}

fn limit(counter: bool) -> Limit {
    let algorithm = if counter { Algorithm::SlidingWindowCounter } else { Algorithm::FixedWindow };
    Limit::new(algorithm, Quota::new(40, Duration::from_millis(1_000)).unwrap())
}

fn policy() -> Option<LeasePolicy> {
    Some(LeasePolicy { max: 16, horizon: TimeSpan::from_millis(50) })
}

/// Runs `steps` through one lease layer per instance over `store`, on
/// `clock`; answers the admitted requests and how many were answered locally.
async fn run<S: Store>(
    layers: &[Leased<Arc<S>>],
    clock: &ManualClock,
    limit: &Limit,
    steps: &[Step],
) -> (Vec<(u64, usize)>, usize) {
    let identities = [Identity::named("lease", "a"), Identity::named("lease", "b")];
    let charges = [Charge::new(*limit, 1)];
    let (mut admitted, mut local) = (Vec::new(), 0);
    for step in steps {
        clock.advance(Duration::from_millis(step.gap));
        let request = Request::new(&identities[step.identity], &charges);
        let outcome = layers[step.instance].decide(request).await.unwrap();
        if outcome.allowed() {
            admitted.push((clock.now_ms(), step.identity));
            local += usize::from(outcome.origin == slidegate::Origin::Lease);
        }
    }
    (admitted, local)
}

fn layers<S: Store>(store: &Arc<S>, clock: &Arc<ManualClock>) -> Vec<Leased<Arc<S>>> {
    (0..INSTANCES)
        .map(|_| {
            Protect::new(Arc::clone(store), Arc::new(NoEvents))
                .lease_clock(Arc::clone(clock) as Arc<dyn Clock>)
                .leases(policy())
                .build()
        })
        .collect()
}

#[test]
fn leases_on_the_embedded_store_never_over_admit() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut runner = TestRunner::new(Config { cases: 128, source_file: Some(file!()), ..Config::default() });
    let leased_any = std::cell::Cell::new(0);
    runner
        .run(&trace(), |(counter, steps)| {
            let clock = Arc::new(ManualClock::new(T0));
            let store = Arc::new(MemoryStore::with_clock(Arc::clone(&clock)));
            let layers = layers(&store, &clock);
            let limit = limit(counter);
            let (admitted, local) = runtime.block_on(run(&layers, &clock, &limit, &steps));
            leased_any.set(leased_any.get() + local);
            prop_assert_eq!(over_admitted(&limit, &admitted), 0, "admitted {:?}", admitted);
            Ok(())
        })
        .unwrap();
    // The traces exercise leases, not only single store calls.
    let leased_any = leased_any.get();
    assert!(leased_any > 1_000, "only {leased_any} requests were answered from leases");
}

#[test]
fn leases_on_redis_never_over_admit() {
    leases_on_redis(Layout::PerKey);
}

/// The packed layout, one bucket: both identities in the same window hashes.
#[test]
fn leases_on_the_packed_layout_never_over_admit() {
    leases_on_redis(Layout::Packed(Buckets::new(1).unwrap()));
}

fn leases_on_redis(layout: Layout) {
    let server = RedisServer::spawn();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut runner = TestRunner::new(Config { cases: 32, source_file: Some(file!()), ..Config::default() });
    let case = std::cell::Cell::new(0);
    runner
        .run(&trace(), |(counter, steps)| {
            case.set(case.get() + 1);
            let clock = Arc::new(ManualClock::new(T0));
            let store = runtime.block_on(async {
                RedisStore::connect(&server.url())
                    .await
                    .unwrap()
                    // A loaded machine's stall is no failure of the property.
                    .with_timeout(Duration::from_secs(5))
                    .with_prefix(format!("lease{}:", case.get()))
                    .with_time_source(TimeSource::Client(Arc::clone(&clock) as Arc<dyn Clock>))
                    .with_layout(layout)
            });
            let store = Arc::new(store);
            let layers = layers(&store, &clock);
            let limit = limit(counter);
            let (admitted, _) = runtime.block_on(run(&layers, &clock, &limit, &steps));
            prop_assert_eq!(over_admitted(&limit, &admitted), 0, "admitted {:?}", admitted);
            Ok(())
        })
        .unwrap();
}

#[test]
fn leases_on_a_cluster_never_over_admit() {
    let cluster = RedisCluster::shared();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut runner = TestRunner::new(Config { cases: 12, source_file: Some(file!()), ..Config::default() });
    let case = std::cell::Cell::new(0);
    let options =
        RedisOptions::new().with_timeout(Duration::from_secs(5)).with_connect_timeout(Duration::from_secs(5));
    runner
        .run(&trace(), |(counter, steps)| {
            case.set(case.get() + 1);
            let clock = Arc::new(ManualClock::new(T0));
            let store = runtime.block_on(async {
                RedisStore::connect_to(&RedisTarget::Cluster(cluster.urls()), options.clone())
                    .await
                    .unwrap()
                    .with_prefix(format!("lease{}-{}:", std::process::id(), case.get()))
                    .with_time_source(TimeSource::Client(Arc::clone(&clock) as Arc<dyn Clock>))
            });
            let store = Arc::new(store);
            let layers = layers(&store, &clock);
            let limit = limit(counter);
            let (admitted, _) = runtime.block_on(run(&layers, &clock, &limit, &steps));
            prop_assert_eq!(over_admitted(&limit, &admitted), 0, "admitted {:?}", admitted);
            Ok(())
        })
        .unwrap();
}

/// A server that loads the native module.
fn module_server() -> RedisServer {
    let args = module_args();
    RedisServer::spawn_with_args(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// `INFO commandstats` calls of `cmd` (lower case) on `server`.
async fn calls(server: &RedisServer, cmd: &str) -> u64 {
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut conn).await.unwrap();
    CommandStats::parse(&info).calls(cmd)
}

/// A store on `url` deciding by `engine` on `clock`'s time under `prefix`.
async fn engine_store(url: &str, engine: Engine, clock: &Arc<ManualClock>, prefix: String) -> RedisStore {
    let options = RedisOptions::new()
        .with_timeout(Duration::from_secs(5))
        .with_connect_timeout(Duration::from_secs(5))
        .with_engine(engine);
    RedisStore::connect_with(url, options)
        .await
        .unwrap()
        .with_prefix(prefix)
        .with_time_source(TimeSource::Client(Arc::clone(clock) as Arc<dyn Clock>))
}

#[test]
fn leases_on_the_module_never_over_admit() {
    let server = module_server();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut runner = TestRunner::new(Config { cases: 32, source_file: Some(file!()), ..Config::default() });
    let case = std::cell::Cell::new(0);
    runner
        .run(&trace(), |(counter, steps)| {
            case.set(case.get() + 1);
            let clock = Arc::new(ManualClock::new(T0));
            let prefix = format!("lease{}:", case.get());
            let store =
                Arc::new(runtime.block_on(engine_store(&server.url(), Engine::Module, &clock, prefix)));
            let layers = layers(&store, &clock);
            let limit = limit(counter);
            let (admitted, _) = runtime.block_on(run(&layers, &clock, &limit, &steps));
            prop_assert_eq!(over_admitted(&limit, &admitted), 0, "admitted {:?}", admitted);
            Ok(())
        })
        .unwrap();
    runtime.block_on(async {
        assert!(calls(&server, "slidegate.lease").await > 0, "the module leased");
        assert!(calls(&server, "slidegate.give_back").await > 0, "the module gave back");
        assert_eq!(calls(&server, "evalsha").await, 0, "no script ran");
    });
}

/// The same traces through lease layers on two servers, one leasing by the
/// module and one by the Lua scripts: the same outcome for every request,
/// and the same bytes in both identities' keys after every one.
#[test]
fn leases_by_the_module_leave_the_state_the_scripts_leave() {
    let (with, without) = (module_server(), RedisServer::spawn());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut runner = TestRunner::new(Config { cases: 16, source_file: Some(file!()), ..Config::default() });
    let case = std::cell::Cell::new(0);
    let identities = [Identity::named("lease", "a"), Identity::named("lease", "b")];
    runner
        .run(&trace(), |(counter, steps)| {
            case.set(case.get() + 1);
            let prefix = format!("same{}:", case.get());
            let clock = Arc::new(ManualClock::new(T0));
            let (module, lua) = runtime.block_on(async {
                (
                    Arc::new(engine_store(&with.url(), Engine::Module, &clock, prefix.clone()).await),
                    Arc::new(engine_store(&without.url(), Engine::Lua, &clock, prefix.clone()).await),
                )
            });
            let (on_module, on_lua) = (layers(&module, &clock), layers(&lua, &clock));
            let limit = limit(counter);
            let charges = [Charge::new(limit, 1)];
            let result: Result<(), TestCaseError> = runtime.block_on(async {
                let mut with_conn = redis::Client::open(with.url())
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap();
                let mut without_conn = redis::Client::open(without.url())
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap();
                for (n, step) in steps.iter().enumerate() {
                    clock.advance(Duration::from_millis(step.gap));
                    let identity = &identities[step.identity];
                    let got =
                        on_module[step.instance].decide(Request::new(identity, &charges)).await.unwrap();
                    let want = on_lua[step.instance].decide(Request::new(identity, &charges)).await.unwrap();
                    prop_assert_eq!(&got, &want, "step {}", n);
                    let key = &module.keys_for(identity, &limit)[0];
                    let a: Option<Vec<u8>> =
                        redis::cmd("GET").arg(key).query_async(&mut with_conn).await.unwrap();
                    let b: Option<Vec<u8>> =
                        redis::cmd("GET").arg(key).query_async(&mut without_conn).await.unwrap();
                    prop_assert_eq!(a, b, "step {}: the bytes of {}", n, key);
                }
                for (m, l) in on_module.iter().zip(&on_lua) {
                    prop_assert_eq!(m.give_back_all().await, l.give_back_all().await);
                }
                for identity in &identities {
                    let key = &module.keys_for(identity, &limit)[0];
                    let a: Option<Vec<u8>> =
                        redis::cmd("GET").arg(key).query_async(&mut with_conn).await.unwrap();
                    let b: Option<Vec<u8>> =
                        redis::cmd("GET").arg(key).query_async(&mut without_conn).await.unwrap();
                    prop_assert_eq!(a, b, "after giving back: the bytes of {}", key);
                }
                Ok(())
            });
            result
        })
        .unwrap();
    runtime.block_on(async {
        assert!(calls(&with, "slidegate.give_back").await > 0, "the module gave back");
        assert_eq!(calls(&with, "evalsha").await, 0, "no script ran on the module's server");
    });
}

/// Redis dying with leases out: the permits already charged are still
/// handed out, every other request fails as unavailable (for the guard and
/// the fallback above to answer), a give-back that cannot reach Redis is
/// an error, not a hang or a panic; and after a restart leasing resumes.
#[tokio::test]
async fn leases_survive_redis_dying() {
    let mut server = RedisServer::spawn();
    let clock = Arc::new(ManualClock::new(T0));
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .with_timeout(Duration::from_millis(300))
        .with_time_source(TimeSource::Client(Arc::clone(&clock) as Arc<dyn Clock>));
    let store = Arc::new(store);
    let layer = Protect::new(Arc::clone(&store), Arc::new(NoEvents))
        .lease_clock(Arc::clone(&clock) as Arc<dyn Clock>)
        .leases(policy())
        .build();
    let limit = limit(true);
    let identity = Identity::named("lease", "a");
    let charges = [Charge::new(limit, 1)];
    for _ in 0..6 {
        assert!(layer.decide(Request::new(&identity, &charges)).await.unwrap().allowed());
    }
    let held = layer.outstanding();
    assert!(held > 0);
    server.kill();
    for _ in 0..held {
        let outcome = layer.decide(Request::new(&identity, &charges)).await.unwrap();
        assert_eq!((outcome.allowed(), outcome.origin), (true, slidegate::Origin::Lease));
    }
    let err = layer.decide(Request::new(&identity, &charges)).await.unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    assert_eq!(layer.give_back_all().await, 0);
    server.restart();
    clock.advance(Duration::from_secs(3));
    let mut answered = false;
    for _ in 0..50 {
        if let Ok(outcome) = layer.decide(Request::new(&identity, &charges)).await {
            answered = outcome.allowed();
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(answered, "the store answers again after its restart");
}

/// Leasing and giving back on every layout a state takes: packed and
/// plain in the embedded store, 32-bit and wide counts in Redis (limits
/// from 2^32), by the scripts and by the module, for both leased
/// algorithms: the store's remaining count is back where the unused
/// permits were never charged, and a give-back to a window that no longer
/// counts gives nothing.
#[tokio::test]
async fn give_back_is_exact_on_every_layout() {
    let server = RedisServer::spawn();
    let clock = Arc::new(ManualClock::new(T0));
    let redis = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .with_timeout(Duration::from_secs(5))
        .with_time_source(TimeSource::Client(Arc::clone(&clock) as Arc<dyn Clock>));
    let module_server = module_server();
    let module = engine_store(&module_server.url(), Engine::Module, &clock, "layout:".to_owned()).await;
    let memory = MemoryStore::with_clock(Arc::clone(&clock));
    for permits in [40, 1 << 25, 1 << 33] {
        for algorithm in [Algorithm::SlidingWindowCounter, Algorithm::FixedWindow] {
            let limit = Limit::new(algorithm, Quota::new(permits, Duration::from_secs(1)).unwrap());
            let identity = Identity::named("layout", &format!("{permits}-{}", algorithm.name()));
            for (name, remaining) in [
                ("memory", lease_and_give_back(&memory, &identity, limit).await),
                ("redis", lease_and_give_back(&redis, &identity, limit).await),
                ("module", lease_and_give_back(&module, &identity, limit).await),
            ] {
                assert_eq!(remaining, permits - 3, "{name}, {permits} {}", algorithm.name());
            }
        }
    }
}

/// Leases 10, gives 7 back (and 1 to a later window, which takes none);
/// answers the remaining permits then.
async fn lease_and_give_back<S: Store + LeaseStore>(store: &S, identity: &Identity, limit: Limit) -> u64 {
    let lease = LeaseStore::lease(store, identity, Charge::new(limit, 10), None).await.unwrap();
    assert!(lease.decision.allowed);
    let back = GiveBack { limit, window: lease.window, unused: 7 };
    assert_eq!(store.give_back(identity, back, None).await.unwrap(), 7);
    let later = GiveBack { window: lease.window + 5, unused: 1, ..back };
    assert_eq!(store.give_back(identity, later, None).await.unwrap(), 0);
    let peek = [Charge::new(limit, 0)];
    store.decide(Request::new(identity, &peek)).await.unwrap().decisions[0].remaining
}

/// Unused permits go back to the window they were charged in: after a
/// give-back, the store admits them again.
#[tokio::test]
async fn unused_permits_are_given_back_to_their_window() {
    let clock = Arc::new(ManualClock::new(T0));
    let store = Arc::new(MemoryStore::with_clock(Arc::clone(&clock)));
    let limit = limit(false);
    let identity = Identity::named("lease", "a");
    let layer = Protect::new(Arc::clone(&store), Arc::new(NoEvents))
        .lease_clock(Arc::clone(&clock) as Arc<dyn Clock>)
        .leases(policy())
        .build();
    let charges = [Charge::new(limit, 1)];
    for _ in 0..8 {
        assert!(layer.decide(Request::new(&identity, &charges)).await.unwrap().allowed());
    }
    let held = layer.outstanding();
    assert!(held > 0, "a hot identity holds a lease");
    let before = store.decide_sync(Request::new(&identity, &[Charge::new(limit, 0)])).unwrap();
    assert_eq!(layer.give_back_all().await, held);
    let after = store.decide_sync(Request::new(&identity, &[Charge::new(limit, 0)])).unwrap();
    assert_eq!(after.decisions[0].remaining, before.decisions[0].remaining + held);
    assert_eq!(after.decisions[0].remaining, 40 - 8);
}

/// The checker catches a wrong design: a lease of the sliding window
/// counter charged near a window's end and used in the next window, while
/// another instance takes what the store still allows there.
#[test]
fn the_checker_fails_a_lease_used_past_its_window_end() {
    let clock = Arc::new(ManualClock::new(T0 - T0 % 1_000 + 999));
    let store = MemoryStore::with_clock(Arc::clone(&clock));
    let limit = limit(true);
    let identity = Identity::named("lease", "a");
    let lease = store.lease_sync(&identity, Charge::new(limit, 40)).unwrap();
    assert!(lease.decision.allowed);
    assert_eq!(lease.usable_for, Duration::from_millis(1));
    // Far into the next window the leased window weighs little: the store
    // admits most of the limit again to another instance.
    clock.advance(Duration::from_millis(990));
    let mut admitted = Vec::new();
    while store.decide_sync(Request::new(&identity, &[Charge::new(limit, 1)])).unwrap().allowed() {
        admitted.push((clock.now_ms(), 0));
    }
    assert!(admitted.len() >= 30, "the store admitted {}", admitted.len());
    // The wrong design spends its 40 leased permits now, past their window.
    admitted.extend((0..40).map(|_| (clock.now_ms(), 0)));
    assert_eq!(over_admitted(&limit, &admitted), admitted.len() - 40);
    // The right one does not: they ended with their window.
    assert_eq!(over_admitted(&limit, &admitted[..admitted.len() - 40]), 0);
}
