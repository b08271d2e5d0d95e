use super::*;
use crate::{Algorithm, Limit, Quota};

/// One fixed window of `permits`, charged `cost`.
fn charges(permits: u64, cost: u64) -> Vec<Charge> {
    vec![Charge::new(
        Limit::new(Algorithm::FixedWindow, Quota::new(permits, Duration::from_secs(60)).unwrap()),
        cost,
    )]
}

fn id(name: &str) -> Identity {
    Identity::named("rule", name)
}

fn denial(retry_ms: u64) -> Decision {
    Decision {
        allowed: false,
        limit: 10,
        remaining: 0,
        reset_after: Duration::from_millis(retry_ms),
        retry_after: Some(Duration::from_millis(retry_ms)),
    }
}

/// An idle cache holds no slot; a bucket's slots come with its first
/// denial, all at once, and never more than the capacity.
#[test]
fn slots_are_allocated_as_denials_come() {
    let cache = DenyCache::new(DEFAULT_CAPACITY).unwrap();
    assert_eq!(cache.allocated(), 0);
    cache.remember(&id("k"), &charges(10, 1), &[denial(1_000)], 0, false);
    assert_eq!(cache.allocated(), WAYS);
    for i in 0..200_000 {
        cache.remember(&id(&format!("k{i}")), &charges(10, 1), &[denial(1_000)], 0, false);
    }
    assert_eq!(cache.allocated(), cache.capacity());
    assert_eq!(cache.capacity(), DEFAULT_CAPACITY);
}

#[test]
fn answers_until_the_deadline_and_counts_down() {
    let cache = DenyCache::new(16).unwrap();
    cache.remember(&id("k"), &charges(10, 1), &[denial(1_000)], 5_000, false);
    let d = cache.lookup(&id("k"), &charges(10, 1), 5_400).unwrap().decisions;
    assert_eq!(d[0].retry_after, Some(Duration::from_millis(600)));
    assert_eq!(d[0].reset_after, Duration::from_millis(600));
    assert!(!d[0].allowed);
    assert_eq!(
        cache.lookup(&id("k"), &charges(10, 1), 5_999).unwrap().decisions[0].retry_after,
        Some(Duration::from_millis(1))
    );
    assert!(cache.lookup(&id("k"), &charges(10, 1), 6_000).is_none());
}

#[test]
fn a_smaller_cost_another_set_or_another_key_misses() {
    let cache = DenyCache::new(16).unwrap();
    cache.remember(&id("k"), &charges(10, 3), &[denial(1_000)], 0, false);
    assert!(cache.lookup(&id("k"), &charges(10, 2), 1).is_none());
    assert!(cache.lookup(&id("k"), &charges(10, 3), 1).is_some());
    assert!(cache.lookup(&id("k"), &charges(10, 4), 1).is_some());
    assert!(cache.lookup(&id("k"), &charges(11, 3), 1).is_none());
    assert!(cache.lookup(&id("other"), &charges(10, 3), 1).is_none());
}

/// With several limits, every cost must be at least the denied one: a
/// smaller cost under any limit may fit sooner.
#[test]
fn every_limit_s_cost_must_be_covered() {
    let cache = DenyCache::new(16).unwrap();
    let two = |a, b| [charges(10, a), charges(20, b)].concat();
    cache.remember(&id("k"), &two(2, 2), &[denial(1_000), denial(1_000)], 0, false);
    assert!(cache.lookup(&id("k"), &two(3, 1), 1).is_none());
    assert!(cache.lookup(&id("k"), &two(1, 3), 1).is_none());
    assert!(cache.lookup(&id("k"), &two(2, 5), 1).is_some());
}

#[test]
fn admissions_are_not_cached_and_drop_the_entry() {
    let cache = DenyCache::new(16).unwrap();
    let allowed = Decision { allowed: true, retry_after: None, ..denial(0) };
    cache.remember(&id("k"), &charges(10, 1), &[allowed], 0, false);
    assert!(cache.lookup(&id("k"), &charges(10, 1), 0).is_none());
    cache.remember(&id("k"), &charges(10, 5), &[denial(1_000)], 0, false);
    cache.remember(&id("k"), &charges(10, 1), &[allowed], 10, false);
    assert!(cache.lookup(&id("k"), &charges(10, 5), 20).is_none());
}

#[test]
fn a_limit_whose_own_wait_is_over_is_no_longer_violated() {
    let cache = DenyCache::new(16).unwrap();
    let two = [charges(10, 1), charges(20, 1)].concat();
    cache.remember(&id("k"), &two, &[denial(100), denial(1_000)], 0, false);
    let d = cache.lookup(&id("k"), &two, 100).unwrap().decisions;
    assert!(d[0].allowed);
    assert_eq!(d[0].retry_after, None);
    assert_eq!(d[1].retry_after, Some(Duration::from_millis(900)));
}

#[test]
fn memory_is_bounded_and_the_earliest_deadline_goes_first() {
    // One bucket: WAYS slots, all identities compete.
    let cache = DenyCache::new(1).unwrap();
    assert_eq!(cache.capacity(), WAYS);
    for i in 0..WAYS as u64 {
        cache.remember(&id(&format!("k{i}")), &charges(10, 1), &[denial(1_000 + i)], 0, false);
    }
    cache.remember(&id("new"), &charges(10, 1), &[denial(5_000)], 0, false);
    assert!(cache.lookup(&id("k0"), &charges(10, 1), 1).is_none(), "the earliest deadline was evicted");
    assert!(cache.lookup(&id("new"), &charges(10, 1), 1).is_some());
    for i in 1..WAYS as u64 {
        assert!(cache.lookup(&id(&format!("k{i}")), &charges(10, 1), 1).is_some());
    }
    assert_eq!(cache.buckets.iter().map(|b| b.lock().unwrap().len()).sum::<usize>(), WAYS);
}

#[test]
fn the_count_of_entries_follows_inserts_replacements_and_drops() {
    let cache = DenyCache::new(16).unwrap();
    let allowed = Decision { allowed: true, retry_after: None, ..denial(0) };
    assert!(cache.is_empty());
    cache.remember(&id("k"), &charges(10, 1), &[allowed], 0, false);
    assert!(cache.is_empty(), "an admission stores nothing");
    cache.remember(&id("k"), &charges(10, 1), &[denial(1_000)], 0, false);
    cache.remember(&id("k"), &charges(10, 2), &[denial(2_000)], 0, false);
    cache.remember(&id("j"), &charges(10, 1), &[denial(1_000)], 0, false);
    assert_eq!(cache.occupied.load(Ordering::Relaxed), 2, "a replacement takes no second slot");
    assert!(cache.lookup(&id("k"), &charges(10, 2), 1).is_some());
    cache.remember(&id("k"), &charges(10, 1), &[allowed], 10, false);
    assert_eq!(cache.occupied.load(Ordering::Relaxed), 1);
    assert!(cache.lookup(&id("j"), &charges(10, 1), 11).is_some(), "the other identity stays");
    cache.remember(&id("j"), &charges(10, 1), &[allowed], 12, false);
    assert!(cache.is_empty());
    assert!(cache.lookup(&id("j"), &charges(10, 1), 13).is_none());
    // A full bucket's eviction replaces a slot: the count stays at capacity.
    let one = DenyCache::new(1).unwrap();
    for i in 0..2 * WAYS as u64 {
        one.remember(&id(&format!("k{i}")), &charges(10, 1), &[denial(1_000 + i)], 0, false);
    }
    assert_eq!(one.occupied.load(Ordering::Relaxed), WAYS);
}

#[test]
fn a_block_covers_every_cost() {
    let cache = DenyCache::new(16).unwrap();
    cache.remember(&id("k"), &charges(10, 5), &[denial(1_000)], 0, true);
    let hit = cache.lookup(&id("k"), &charges(10, 1), 999).unwrap();
    assert!(hit.blocked);
    assert!(cache.lookup(&id("k"), &charges(10, 1), 1_000).is_none());
}

#[test]
fn off_at_zero() {
    assert!(DenyCache::new(0).is_none());
}
