use super::*;
use crate::{Algorithm, SharedTables};

/// The embedded store, as a store that says it can have outages.
struct Remote(MemoryStore);

impl Store for Remote {
    async fn decide(&self, request: Request<'_>) -> Result<Outcome, StoreError> {
        self.0.decide_sync(request)
    }

    /// As a remote store: never at once.
    fn decide_now(&self, _request: Request<'_>) -> Option<Result<Outcome, StoreError>> {
        None
    }

    fn distinct(&self) -> Option<impl DistinctStore + '_> {
        None::<crate::NoDistinct>
    }

    fn tables(&self) -> Option<impl SharedTables + '_> {
        None::<crate::NoTables>
    }

    fn leases(&self) -> Option<impl crate::LeaseStore + '_> {
        None::<crate::NoLeases>
    }

    fn joint(&self) -> Option<impl JointStore + '_> {
        Some(&self.0)
    }

    async fn lift_penalty(
        &self,
        identity: &Identity,
        _deadline: Option<Instant>,
    ) -> Result<Option<Duration>, StoreError> {
        self.0.lift_penalty_sync(identity)
    }

    fn has_outages(&self) -> bool {
        true
    }
}

fn seeds<S>(fallback: &Fallback<S>) -> usize {
    let seeded = fallback.seeded.as_ref().expect("the fallback is on");
    seeded.seeds.iter().map(|shard| shard.lock().map(|s| s.map.len()).unwrap_or(0)).sum()
}

async fn decide_once<S: Store>(fallback: &Fallback<S>) {
    let limit = Limit::new(Algorithm::SlidingWindowCounter, Quota::per_minute(10).unwrap());
    let charges = [Charge::new(limit, 1)];
    let identity = Identity::named("rule", "client");
    let outcome = fallback.decide(Request::new(&identity, &charges)).await.unwrap();
    assert_eq!((outcome.decisions[0].remaining, outcome.origin), (9, Origin::Store));
}

#[tokio::test]
async fn answers_of_a_store_without_outages_are_not_remembered() {
    let fallback = Fallback::new(MemoryStore::new(), Some(FallbackPolicy::default()), Ticks::start());
    assert!(!fallback.has_outages());
    decide_once(&fallback).await;
    assert_eq!(seeds(&fallback), 0);
}

#[tokio::test]
async fn answers_of_a_store_with_outages_are_remembered() {
    let fallback = Fallback::new(Remote(MemoryStore::new()), Some(FallbackPolicy::default()), Ticks::start());
    assert!(!fallback.has_outages(), "the fallback decides every outage of the store");
    decide_once(&fallback).await;
    assert_eq!(seeds(&fallback), 1);
    let off = Fallback::new(Remote(MemoryStore::new()), None, Ticks::start());
    assert!(off.has_outages());
}

/// A store that waits is never decided at once, and asking leaves no
/// trace: nothing remembered; the embedded store is, remembered or not
/// as through `decide`.
#[tokio::test]
async fn only_a_store_that_answers_at_once_is_decided_at_once() {
    let limit = Limit::new(Algorithm::SlidingWindowCounter, Quota::per_minute(10).unwrap());
    let charges = [Charge::new(limit, 1)];
    let identity = Identity::named("rule", "client");
    let remote = Fallback::new(Remote(MemoryStore::new()), Some(FallbackPolicy::default()), Ticks::start());
    assert!(remote.decide_now(Request::new(&identity, &charges)).is_none());
    assert_eq!(seeds(&remote), 0);
    let local = Fallback::new(MemoryStore::new(), Some(FallbackPolicy::default()), Ticks::start());
    let outcome = local.decide_now(Request::new(&identity, &charges)).unwrap().unwrap();
    assert_eq!((outcome.decisions[0].allowed, outcome.decisions[0].remaining), (true, 9));
    assert_eq!(seeds(&local), 0, "a store without outages is not bridged");
}

/// Seeds past their reset are forgotten when new identities come, and the
/// room they took is given back: churn does not fill the map to its bound.
#[tokio::test(start_paused = true)]
async fn seeds_past_their_reset_are_forgotten() {
    let fallback = Fallback::new(Remote(MemoryStore::new()), Some(FallbackPolicy::default()), Ticks::start());
    let limit = Limit::new(Algorithm::FixedWindow, Quota::new(10, Duration::from_secs(1)).unwrap());
    let charges = [Charge::new(limit, 1)];
    for i in 0..5_000 {
        let identity = Identity::named("churn", &i.to_string());
        assert!(fallback.decide(Request::new(&identity, &charges)).await.unwrap().decisions[0].allowed);
    }
    assert_eq!(seeds(&fallback), 5_000, "every store answer is remembered while it is live");
    // Every seed's window ends; new identities, then: only theirs are kept.
    tokio::time::advance(Duration::from_millis(2 * SEED_SWEEP_MS)).await;
    for i in 0..200 {
        let identity = Identity::named("later", &i.to_string());
        fallback.decide(Request::new(&identity, &charges)).await.unwrap();
    }
    assert_eq!(seeds(&fallback), 200);
    let seeded = fallback.seeded.as_ref().unwrap();
    let room: usize = seeded.seeds.iter().map(|s| s.lock().unwrap().map.capacity()).sum();
    assert!(room <= 4 * 200 + SEED_SHARDS * 64, "room for {room} seeds kept for 200");
}
