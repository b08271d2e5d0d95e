//! Joint decisions (`JointStore`): several identities' charges all or
//! nothing in one call, on the embedded store and one Redis server, and
//! the same answers from both; threads racing joint and single decisions on
//! the embedded store never charge one part without the others.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;

mod support;

use slidegate::{
    Algorithm, Charge, Decision, Identity, InvalidRequest, JointStore, Limit, ManualClock, MemoryStore, Part,
    RedisStore, Store, StoreError,
};
use slidegate_test_redis::RedisServer;
use support::{client_time_store, id, limit, Decide, DecideSync, T0};

/// One charge of `cost` under `limit` for each named identity, jointly.
async fn joint<J: JointStore>(
    store: &J,
    parts: &[(&Identity, Limit, u64)],
) -> Result<Vec<Vec<Decision>>, StoreError> {
    let charges: Vec<[Charge; 1]> = parts.iter().map(|&(_, l, cost)| [Charge::new(l, cost)]).collect();
    let parts: Vec<Part<'_>> =
        parts.iter().zip(&charges).map(|(&(identity, _, _), charges)| Part { identity, charges }).collect();
    let outcomes = store.decide_joint(&parts, None).await?;
    Ok(outcomes.into_iter().map(|o| o.decisions.to_vec()).collect())
}

/// What every store must answer: a denied part charges no other part, an
/// admitted call charges every part, and invalid calls change nothing.
async fn joint_contract<S: Store>(store: &S, tag: &str) {
    let joint_store = store.joint().expect("this store decides jointly");
    for algorithm in Algorithm::ALL {
        let l = limit(algorithm, 3, 60_000);
        let name = |n: &str| id(&format!("{tag}-{algorithm}-{n}"));
        let (full, other) = (name("full"), name("other"));
        for _ in 0..3 {
            assert!(store.decide_one(&full, &l, 1).await.expect("valid").allowed, "{algorithm}");
        }
        let answer = joint(&joint_store, &[(&full, l, 1), (&other, l, 1)]).await.expect("valid");
        assert!(!answer[0][0].allowed, "{algorithm}: the full identity denies");
        assert!(answer[1][0].allowed, "{algorithm}: the other had room");
        assert_eq!(answer[1][0].remaining, 3, "{algorithm}: told its state without this request");
        // Nothing was charged to the other: its three permits are all there.
        for n in 0..3 {
            assert!(store.decide_one(&other, &l, 1).await.expect("valid").allowed, "{algorithm} #{n}");
        }
        assert!(!store.decide_one(&other, &l, 1).await.expect("valid").allowed, "{algorithm}");

        let (a, b) = (name("a"), name("b"));
        let big = limit(algorithm, 10, 60_000);
        let answer = joint(&joint_store, &[(&a, l, 2), (&b, big, 3)]).await.expect("valid");
        assert!(answer.iter().flatten().all(|d| d.allowed), "{algorithm}");
        assert_eq!((answer[0][0].remaining, answer[1][0].remaining), (1, 7), "{algorithm}: both charged");
        assert!(store.decide_one(&a, &l, 1).await.expect("valid").allowed, "{algorithm}");
        assert!(!store.decide_one(&a, &l, 1).await.expect("valid").allowed, "{algorithm}: a was charged 2");

        // Invalid calls are refused before anything is charged.
        let (c, d) = (name("c"), name("d"));
        assert!(matches!(joint(&joint_store, &[]).await, Err(StoreError::Invalid(InvalidRequest::NoLimits))));
        assert!(matches!(
            joint(&joint_store, &[(&c, l, 1), (&c, big, 1)]).await,
            Err(StoreError::Invalid(InvalidRequest::DuplicateIdentity(_)))
        ));
        assert!(matches!(
            joint(&joint_store, &[(&c, l, 1), (&d, l, 4)]).await,
            Err(StoreError::Invalid(InvalidRequest::CostExceedsLimit { cost: 4, limit: 3 }))
        ));
        assert_eq!(
            store.decide_one(&c, &l, 3).await.expect("valid").remaining,
            0,
            "{algorithm}: c untouched"
        );
    }
}

#[tokio::test]
async fn the_embedded_store_decides_jointly() {
    joint_contract(&MemoryStore::with_clock(ManualClock::new(T0)), "memory").await;
}

#[tokio::test]
async fn one_redis_server_decides_jointly_in_one_call() {
    let server = RedisServer::spawn();
    let clock = ManualClock::new(T0);
    let store = client_time_store(&server, &clock, "joint").await;
    joint_contract(&store, "redis").await;
    // One script call per joint decision, whatever the number of parts.
    let mut admin = support::admin(&server).await;
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut admin).await.expect("resetstat");
    let l = limit(Algorithm::SlidingWindowCounter, 100, 60_000);
    let ids: Vec<Identity> = (0..5).map(|n| id(&format!("one-call-{n}"))).collect();
    let parts: Vec<(&Identity, Limit, u64)> = ids.iter().map(|i| (i, l, 1)).collect();
    let answer = joint(&store, &parts).await.expect("valid");
    assert!(answer.iter().flatten().all(|d| d.allowed && d.remaining == 99));
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut admin).await.expect("info");
    let calls = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{name}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse::<u64>().expect("a count"))
    };
    assert_eq!(calls("evalsha") + calls("eval"), 1, "{info}");
}

/// The same trace of joint and single decisions on both stores, at the
/// same times: the same answers.
#[tokio::test]
async fn memory_and_redis_decide_joint_calls_identically() {
    let server = RedisServer::spawn();
    let clock = ManualClock::new(T0 + 7);
    let redis: RedisStore = client_time_store(&server, &clock, "agree").await;
    let memory = MemoryStore::with_clock(clock.clone());
    let mut rng = fastrand::Rng::with_seed(0x5eed);
    let ids: Vec<Identity> = (0..4).map(|n| id(&format!("agree-{n}"))).collect();
    for step in 0..600 {
        clock.advance(std::time::Duration::from_millis(rng.u64(0..400)));
        let algorithm = Algorithm::ALL[rng.usize(0..Algorithm::ALL.len())];
        let l = limit(algorithm, 5, 2_000);
        let first = rng.usize(0..ids.len());
        let n = rng.usize(1..=ids.len());
        let parts: Vec<(&Identity, Limit, u64)> =
            (0..n).map(|k| (&ids[(first + k) % ids.len()], l, rng.u64(0..3))).collect();
        let want = joint(&memory, &parts).await;
        let got = joint(&redis, &parts).await;
        match (want, got) {
            (Ok(want), Ok(got)) => assert_eq!(want, got, "step {step}: {parts:?}"),
            (want, got) => panic!("step {step}: {want:?} against {got:?}"),
        }
    }
}

/// Threads deciding jointly on overlapping pairs while others decide single
/// permits on the same identities (taking the hot path): every permit
/// charged is one an admitted request took, all of a joint call's or none,
/// and no identity past its limit.
#[test]
fn racing_joint_and_single_decisions_charge_whole_calls_only() {
    const PERMITS: u64 = 2_000;
    const ROUNDS: u64 = 1_000;
    let store = MemoryStore::with_clock(ManualClock::new(T0));
    let l = limit(Algorithm::SlidingWindowCounter, PERMITS, 60_000);
    let ids: Vec<Identity> = (0..4).map(|n| id(&format!("race-{n}"))).collect();
    // Seeded, so the race is on stored states.
    for i in &ids {
        assert!(store.decide_one_sync(i, &l, 1).expect("valid").allowed);
    }
    let taken: Vec<AtomicU64> = (0..4).map(|_| AtomicU64::new(1)).collect();
    let start = Barrier::new(8);
    std::thread::scope(|s| {
        for pair in 0..4 {
            let (store, ids, taken, start) = (&store, &ids, &taken, &start);
            s.spawn(move || {
                let (a, b) = (pair, (pair + 1) % 4);
                let charges = [Charge::new(l, 1)];
                start.wait();
                for _ in 0..ROUNDS {
                    let parts = [
                        Part { identity: &ids[a], charges: &charges },
                        Part { identity: &ids[b], charges: &charges },
                    ];
                    let outcomes = store.decide_joint_sync(&parts).expect("valid");
                    let allowed: Vec<bool> = outcomes.iter().map(|o| o.decisions[0].allowed).collect();
                    if allowed == [true, true] {
                        taken[a].fetch_add(1, Ordering::Relaxed);
                        taken[b].fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        for single in 0..4 {
            let (store, ids, taken, start) = (&store, &ids, &taken, &start);
            s.spawn(move || {
                start.wait();
                for _ in 0..ROUNDS {
                    if store.decide_one_sync(&ids[single], &l, 1).expect("valid").allowed {
                        taken[single].fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    for (n, i) in ids.iter().enumerate() {
        let taken = taken[n].load(Ordering::Relaxed);
        assert!(taken <= PERMITS, "identity {n}: {taken} admitted past {PERMITS}");
        // Each identity is in two pairs and has one single thread: 3,000
        // requests for 1,999 permits after the seed, so the limit binds.
        let left = store.decide_one_sync(i, &l, 0).expect("valid").remaining;
        assert_eq!(left, PERMITS - taken, "identity {n}: the store's count is exactly the admitted permits");
    }
}
