//! Same trace ⇒ same decisions: random traces replayed through `MemoryStore`
//! and `RedisStore` (client time, one shared `ManualClock`) must give
//! identical results, call for call, for every algorithm.
#![cfg(feature = "redis")]

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use slidegate::{Algorithm, Clock, Limit, ManualClock, MemoryStore, Quota, RedisStore, Store, TimeSource};
use slidegate_test_redis::RedisServer;

/// Enough to hit every boundary kind many times; the whole test takes a few seconds.
const CASES: u32 = 384;

#[derive(Debug, Clone)]
enum Call {
    /// `decide(identity, limits[limit], cost)`
    One { limit: usize, cost: u64 },
    /// `decide_all(identity, [(limits[i], costs[i]) for i in mask])`
    All { mask: u8, costs: [u64; 4] },
}

#[derive(Debug, Clone)]
struct Step {
    /// Milliseconds the clock moves before the call; now and then backwards
    /// (a failover to a server whose clock is behind, an NTP step).
    advance: i64,
    identity: usize,
    call: Call,
}

#[derive(Debug, Clone)]
struct Trace {
    start: u64,
    limits: Vec<Limit>,
    steps: Vec<Step>,
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop::sample::select(Algorithm::ALL.to_vec())
}

/// Small limits and windows, so that limits are reached and windows turn often.
fn limit() -> impl Strategy<Value = Limit> {
    let window = prop::sample::select(vec![1u64, 2, 3, 7, 10, 50, 100, 250, 1000, 1500, 60_000]);
    (algorithm(), 1u64..=6, window)
        .prop_map(|(a, n, w)| Limit::new(a, Quota::new(n, Duration::from_millis(w)).expect("valid quota")))
}

fn step(limits: usize) -> impl Strategy<Value = Step> {
    let advance =
        prop_oneof![3 => Just(0i64), 3 => 0i64..20, 2 => 0i64..400, 1 => 0i64..3000, 1 => -3000i64..0];
    // Costs up to 7 exceed small limits now and then: both stores must refuse alike.
    let call = prop_oneof![
        4 => (0..limits, 0u64..=7).prop_map(|(limit, cost)| Call::One { limit, cost }),
        1 => (1u8..16, [0u64..=3, 0u64..=3, 0u64..=3, 0u64..=3]).prop_map(|(mask, costs)| Call::All { mask, costs }),
    ];
    (advance, 0usize..3, call).prop_map(|(advance, identity, call)| Step { advance, identity, call })
}

fn trace() -> impl Strategy<Value = Trace> {
    prop::collection::vec(limit(), 1..=4).prop_flat_map(|mut limits| {
        limits.dedup();
        let n = limits.len();
        // A realistic epoch in ms, at any phase of every window.
        (1_700_000_000_000u64..1_700_000_100_000, Just(limits), prop::collection::vec(step(n), 1..80))
            .prop_map(|(start, limits, steps)| Trace { start, limits, steps })
    })
}

const IDENTITIES: [&str; 3] = ["alice", "bob", "}carol{"];

async fn replay(redis: &RedisStore, case: usize, trace: &Trace) -> Result<(), TestCaseError> {
    let clock = ManualClock::new(trace.start);
    let memory = MemoryStore::with_clock(clock.clone());
    let redis = redis
        .clone()
        .with_prefix(format!("case{case}:"))
        .with_time_source(TimeSource::Client(Arc::new(clock.clone())));
    for (i, step) in trace.steps.iter().enumerate() {
        clock.set(clock.now_ms().saturating_add_signed(step.advance));
        let identity = IDENTITIES[step.identity];
        let at = format!("step {i} at t = start + {} ms: {step:?}", clock_offset(&clock, trace));
        match &step.call {
            Call::One { limit, cost } => {
                let limit = &trace.limits[*limit % trace.limits.len()];
                let m = memory.decide(identity, limit, *cost).await;
                let r = redis.decide(identity, limit, *cost).await;
                let (m, r) = (format!("{m:?}"), format!("{r:?}"));
                prop_assert_eq!(&m, &r, "{} on {}", at, limit);
            }
            Call::All { mask, costs } => {
                let charges: Vec<(Limit, u64)> = (0..trace.limits.len())
                    .filter(|i| mask & (1 << i) != 0)
                    .map(|i| (trace.limits[i], costs[i]))
                    .collect();
                let m = memory.decide_all(identity, &charges).await;
                let r = redis.decide_all(identity, &charges).await;
                let (m, r) = (format!("{m:?}"), format!("{r:?}"));
                prop_assert_eq!(&m, &r, "{} on {:?}", at, charges);
            }
        }
    }
    Ok(())
}

fn clock_offset(clock: &ManualClock, trace: &Trace) -> i128 {
    i128::from(clock.now_ms()) - i128::from(trace.start)
}

#[test]
fn memory_and_redis_decide_identically() {
    let server = RedisServer::spawn();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    let redis = runtime.block_on(RedisStore::connect(&server.url())).expect("connect");
    let mut config = Config::with_cases(CASES);
    config.source_file = Some(file!());
    let mut runner = TestRunner::new(config);
    let case = AtomicUsize::new(0);
    let result = runner.run(&trace(), |trace| {
        let case = case.fetch_add(1, Ordering::Relaxed);
        runtime.block_on(replay(&redis, case, &trace))
    });
    if let Err(e) = result {
        panic!("{e}\n{runner}");
    }
}
