//! The lease table's memory: identities seen once do not stay.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::{Algorithm, ManualClock, MemoryStore, Quota};

const HORIZON_MS: u64 = 50;

fn layer(clock: &ManualClock) -> Leased<MemoryStore<ManualClock>> {
    let policy = LeasePolicy { max: 16, horizon: TimeSpan::from_millis(HORIZON_MS) };
    Leased::with_clock(MemoryStore::with_clock(clock.clone()), Some(policy), Arc::new(clock.clone()))
}

/// Entries held and room allocated, over every shard.
fn table(layer: &Leased<MemoryStore<ManualClock>>) -> (usize, usize) {
    layer.shards.iter().fold((0, 0), |(len, room), s| {
        let shard = s.lock().unwrap_or_else(PoisonError::into_inner);
        (len + shard.held.len(), room + shard.held.capacity())
    })
}

async fn ask(layer: &Leased<MemoryStore<ManualClock>>, identity: &Identity, limit: &Limit) -> Decision {
    let charges = [Charge::new(*limit, 1)];
    let outcome = layer.decide(Request::new(identity, &charges)).await;
    outcome.map(|o| o.decisions[0]).unwrap_or_else(|e| panic!("decide failed: {e}"))
}

#[tokio::test]
async fn identities_seen_once_are_forgotten_and_their_room_given_back() {
    let clock = ManualClock::new(1_767_225_600_000);
    let layer = layer(&clock);
    let limit = Limit::new(
        Algorithm::FixedWindow,
        Quota::new(5, Duration::from_secs(10)).unwrap_or_else(|e| panic!("{e}")),
    );
    // A crawl: 20,000 identities, one request each, 1 ms apart.
    for i in 0..20_000 {
        assert!(ask(&layer, &Identity::named("crawl", &i.to_string()), &limit).await.allowed);
        clock.advance(Duration::from_millis(1));
    }
    let (held, _) = table(&layer);
    // At most what four horizons (a sweep's period plus the two kept) saw.
    assert!(held <= (4 * HORIZON_MS + 16) as usize, "{held} identities held after the crawl");
    // Quiet, then one identity per shard: each shard sweeps, and the table
    // holds those identities in little room.
    clock.advance(Duration::from_millis(10 * HORIZON_MS));
    for i in 0..1_000 {
        ask(&layer, &Identity::named("later", &i.to_string()), &limit).await;
    }
    let (held, room) = table(&layer);
    assert_eq!(held, 1_000);
    assert!(room <= 4 * 1_000 + SHARDS * MIN_ROOM, "room for {room} entries kept for {held}");
}

#[tokio::test]
async fn a_hot_identity_keeps_its_lease_across_sweeps() {
    let clock = ManualClock::new(1_767_225_600_000);
    let layer = layer(&clock);
    let limit = Limit::new(
        Algorithm::FixedWindow,
        Quota::new(1_000, Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}")),
    );
    let hot = Identity::named("hot", "a");
    // Two horizons of 1 request a ms: the next leases are sized by them.
    for _ in 0..2 * HORIZON_MS {
        ask(&layer, &hot, &limit).await;
        clock.advance(Duration::from_millis(1));
    }
    let leased = layer.outstanding();
    assert!(leased > 0, "no lease taken for a hot identity");
    // New identities sweep every shard; the hot identity's permits stay.
    for i in 0..1_000 {
        ask(&layer, &Identity::named("cold", &i.to_string()), &limit).await;
    }
    assert_eq!(layer.outstanding(), leased);
}
