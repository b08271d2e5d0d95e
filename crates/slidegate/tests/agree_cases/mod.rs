//! Random traces for the stores-agree property: replayed through
//! `MemoryStore` and `RedisStore` (client time, one shared `ManualClock`)
//! they must give identical results, call for call, for every algorithm.
//! `stores_agree.rs` replays them on a single `redis-server`, `cluster.rs`
//! on a Redis Cluster.
#![allow(dead_code)] // each test binary uses its own part

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use redis::aio::ConnectionLike;
use slidegate::{
    Algorithm, Clock as _, Layout, Limit, ManualClock, MemoryStore, Quota, RedisStore, TimeSource,
};

use crate::support::{id, Decide};

#[derive(Debug, Clone)]
pub enum Call {
    /// `decide(identity, limits[limit], cost)`
    One { limit: usize, cost: u64 },
    /// `decide_all(identity, [(limits[i], costs[i]) for i in mask])`
    All { mask: u8, costs: [u64; 4] },
}

#[derive(Debug, Clone)]
pub struct Step {
    /// Milliseconds the clock moves before the call; now and then backwards
    /// (a failover to a server whose clock is behind, an NTP step).
    advance: i64,
    identity: usize,
    call: Call,
}

#[derive(Debug, Clone)]
pub struct Trace {
    start: u64,
    limits: Vec<Limit>,
    steps: Vec<Step>,
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop::sample::select(Algorithm::ALL.to_vec())
}

/// Small limits and windows, so that limits are reached and windows turn
/// often; now and then a huge limit on a tiny window (rates finer than a
/// permit per µs, products up to 2^53), where the costs scale with the limit.
fn limit() -> impl Strategy<Value = Limit> {
    let window = prop::sample::select(vec![1u64, 2, 3, 7, 10, 50, 100, 250, 1000, 1500, 60_000]);
    let small = (algorithm(), 1u64..=6, window)
        .prop_map(|(a, n, w)| Limit::new(a, Quota::new(n, Duration::from_millis(w)).expect("valid quota")));
    // The log keeps one entry per permit: huge limits are for the others.
    let counting = prop::sample::select(
        Algorithm::ALL.into_iter().filter(|a| *a != Algorithm::SlidingLog).collect::<Vec<_>>(),
    );
    let huge = (counting, prop::sample::select(vec![10_000u64, 10_000_000, 1 << 40, 1 << 50]), 1u64..=8)
        .prop_filter_map("limit × window ≤ 2^53", |(a, n, w)| {
            Quota::new(n, Duration::from_millis(w)).ok().map(|q| Limit::new(a, q))
        });
    prop_oneof![6 => small, 1 => huge]
}

/// How a trace's clock moves: now and then backwards, or never (the packed
/// layout follows the clock it is given, see the conformance cases).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    StepsBack,
    Forward,
}

fn step(limits: usize, clock: Clock) -> impl Strategy<Value = Step> {
    // Steps back of 15 s and 60 s pass the 10 s TTL slack of client time on Redis.
    let advance = prop_oneof![
        30 => Just(0i64),
        30 => 0i64..20,
        20 => 0i64..400,
        10 => 0i64..3000,
        10 => -3000i64..0,
        1 => Just(-15_000i64),
        1 => Just(-60_000i64),
        1 => Just(70_000i64),
    ]
    .prop_map(move |advance| if clock == Clock::Forward { advance.abs() } else { advance });
    // Costs up to 7 exceed small limits now and then: both stores must refuse
    // alike. A cost of u64::MAX − k stands for the limit − k.
    let call = prop_oneof![
        4 => (0..limits, 0u64..=7).prop_map(|(limit, cost)| Call::One { limit, cost }),
        1 => (0..limits, 0u64..=2).prop_map(|(limit, k)| Call::One { limit, cost: u64::MAX - k }),
        1 => (1u8..16, [0u64..=3, 0u64..=3, 0u64..=3, 0u64..=3]).prop_map(|(mask, costs)| Call::All { mask, costs }),
    ];
    (advance, 0usize..3, call).prop_map(|(advance, identity, call)| Step { advance, identity, call })
}

pub fn trace(clock: Clock) -> impl Strategy<Value = Trace> {
    prop::collection::vec(limit(), 1..=4).prop_flat_map(move |mut limits| {
        limits.dedup();
        let n = limits.len();
        // A realistic epoch in ms, at any phase of every window.
        (1_700_000_000_000u64..1_700_000_100_000, Just(limits), prop::collection::vec(step(n, clock), 1..80))
            .prop_map(|(start, limits, steps)| Trace { start, limits, steps })
    })
}

const IDENTITIES: [&str; 3] = ["alice", "bob", "}carol{"];

/// Replays `trace` through a fresh `MemoryStore` and `redis` under the
/// prefix `<prefix>case<case>:`; `admin` reads the keys' PTTL.
pub async fn replay<C: ConnectionLike + Clone + Send>(
    redis: &RedisStore,
    admin: &C,
    prefix: &str,
    case: usize,
    trace: &Trace,
) -> Result<(), TestCaseError> {
    let clock = ManualClock::new(trace.start);
    let memory = MemoryStore::with_clock(clock.clone());
    let redis = redis
        .clone()
        .with_prefix(format!("{prefix}case{case}:"))
        .with_time_source(TimeSource::Client(Arc::new(clock.clone())));
    // The latest time the clock showed: a key may outlive its state by how
    // far the clock is behind it.
    let mut latest = trace.start;
    for (i, step) in trace.steps.iter().enumerate() {
        clock.set(clock.now_ms().saturating_add_signed(step.advance));
        latest = latest.max(clock.now_ms());
        let behind = latest - clock.now_ms();
        let identity = IDENTITIES[step.identity];
        let at = format!("step {i} at t = start + {} ms: {step:?}", clock_offset(&clock, trace));
        match &step.call {
            Call::One { limit, cost } => {
                let limit = &trace.limits[*limit % trace.limits.len()];
                let permits = limit.quota.permits();
                let cost = if *cost > u64::MAX - 3 { permits.saturating_sub(u64::MAX - cost) } else { *cost };
                let m = memory.decide_one(&id(identity), limit, cost).await;
                let r = redis.decide_one(&id(identity), limit, cost).await;
                let decided = r.is_ok();
                let (m, r) = (format!("{m:?}"), format!("{r:?}"));
                prop_assert_eq!(&m, &r, "{} on {}", at, limit);
                if decided {
                    outlives_its_state(&memory, &redis, admin, identity, limit, behind, &at).await?;
                }
            }
            Call::All { mask, costs } => {
                let charges: Vec<(Limit, u64)> = (0..trace.limits.len())
                    .filter(|i| mask & (1 << i) != 0)
                    .map(|i| (trace.limits[i], costs[i]))
                    .collect();
                let m = memory.decide_all(&id(identity), &charges).await;
                let r = redis.decide_all(&id(identity), &charges).await;
                let decided = r.is_ok();
                let (m, r) = (format!("{m:?}"), format!("{r:?}"));
                prop_assert_eq!(&m, &r, "{} on {:?}", at, charges);
                for (limit, _) in charges.iter().filter(|_| decided) {
                    outlives_its_state(&memory, &redis, admin, identity, limit, behind, &at).await?;
                }
            }
        }
    }
    Ok(())
}

/// Redis's clock runs between the script's write and the check's PTTL.
const TTL_TOLERANCE_MS: u128 = 1_000;

/// The slack a key outlives its state by in client time (`prelude.lua`).
const CLIENT_TTL_SLACK_MS: u128 = 10_000;

/// The longest a state of `limit` matters after a write, on the clock
/// that wrote it: a sliding window counter's until the end of the next
/// window, every other state at most a window.
fn life_ms(limit: &Limit) -> u128 {
    let w = u128::from(limit.quota.window_ms());
    match limit.algorithm {
        Algorithm::SlidingWindowCounter => 2 * w,
        _ => w,
    }
}

/// After any decision Redis made, charged or refused, the key lives as
/// long as its state matters (a peek's `reset_after`) plus the slack, whatever the
/// clock did: a key timed from an earlier write forgot permits that still
/// counted once the clock stepped back past the slack, and Redis then
/// allowed what the embedded store denied. And no longer than the state's
/// life, the slack and how far the clock is `behind` the latest time it
/// showed: a TTL lengthened after a step back must come back down once the
/// clock has, or keys outlive their state by every step back of a trace. Per-key layout only (a packed
/// limit's key is its bucket's stem).
async fn outlives_its_state<C: ConnectionLike + Clone + Send>(
    memory: &MemoryStore<ManualClock>,
    redis: &RedisStore,
    admin: &C,
    identity: &str,
    limit: &Limit,
    behind: u64,
    at: &str,
) -> Result<(), TestCaseError> {
    if redis.layout() != Layout::PerKey {
        return Ok(());
    }
    let key = &redis.keys_for(&id(identity), limit)[0];
    let pttl: i64 = redis::cmd("PTTL")
        .arg(key)
        .query_async(&mut admin.clone())
        .await
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    // Redis's clock only shortens a TTL between the write and this PTTL.
    let bound = life_ms(limit) + CLIENT_TTL_SLACK_MS + u128::from(behind);
    prop_assert!(
        u128::try_from(pttl).unwrap_or(0) <= bound,
        "{} on {}: key {} lives {} ms, more than its state's life, the slack and the {} ms the clock \
         is behind its latest time ({} ms)",
        at,
        limit,
        key,
        pttl,
        behind,
        bound
    );
    let reset = memory.decide_one(&id(identity), limit, 0).await.map(|d| d.reset_after);
    let Some(reset) = reset.ok().filter(|r| !r.is_zero()) else {
        return Ok(());
    };
    prop_assert!(
        u128::try_from(pttl).unwrap_or(0) + TTL_TOLERANCE_MS >= reset.as_millis() + CLIENT_TTL_SLACK_MS,
        "{} on {}: key {} lives {} ms, its state {:?} and the slack",
        at,
        limit,
        key,
        pttl,
        reset
    );
    Ok(())
}

fn clock_offset(clock: &ManualClock, trace: &Trace) -> i128 {
    i128::from(clock.now_ms()) - i128::from(trace.start)
}
