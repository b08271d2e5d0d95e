//! Snapshots: a restored store decides as the store that never stopped, and
//! a file that is not a whole snapshot is refused whole, without a panic or
//! a large allocation.

use std::time::Duration;

use super::format::{self, Header, CHECKSUM_BYTES, HEADER_BYTES};
use super::*;
use crate::store::{Charge, Outcome, Request};
use crate::{Algorithm, Identity, ManualClock, Penalty, Quota};

/// A window start, so that a test's times stay in one 10 s window.
const T0: u64 = 1_700_000_000_000;

fn limit(algorithm: Algorithm, n: u64, ms: u64) -> Limit {
    Limit::new(algorithm, Quota::new(n, Duration::from_millis(ms)).unwrap())
}

fn id(name: &str) -> Identity {
    Identity::named("t", name)
}

fn penalty() -> Penalty {
    Penalty::new(1, Duration::from_secs(60), Duration::from_secs(300), Duration::from_secs(3600)).unwrap()
}

fn decide(
    store: &MemoryStore<ManualClock>,
    who: &Identity,
    limit: Limit,
    penalty: Option<&Penalty>,
) -> Outcome {
    let charges = [Charge::new(limit, 1)];
    let request = Request::new(who, &charges);
    let request = match penalty {
        Some(p) => request.with_penalty(p),
        None => request,
    };
    store.decide_sync(request).unwrap()
}

/// How many of `n` requests one after another are admitted.
fn admitted(store: &MemoryStore<ManualClock>, who: &Identity, limit: Limit, n: usize) -> usize {
    (0..n).filter(|_| decide(store, who, limit, None).decisions[0].allowed).count()
}

fn snapshot(store: &MemoryStore<ManualClock>) -> Vec<u8> {
    let mut bytes = Vec::new();
    store.write_snapshot(&mut bytes).unwrap();
    bytes
}

/// A store on a clock reading `now_ms`, holding the snapshot `bytes`.
fn restored(bytes: &[u8], now_ms: u64) -> MemoryStore<ManualClock> {
    let mut store = MemoryStore::with_clock(ManualClock::new(now_ms));
    store.restore_snapshot(bytes).unwrap();
    store
}

#[test]
fn a_restart_mid_window_keeps_the_count_of_every_algorithm() {
    for algorithm in Algorithm::ALL {
        let l = limit(algorithm, 5, 10_000);
        let before = MemoryStore::with_clock(ManualClock::new(T0 + 1_000));
        assert_eq!(admitted(&before, &id("a"), l, 3), 3);
        // Down for a second: a token bucket or GCRA refills half a permit of it.
        let after = restored(&snapshot(&before), T0 + 2_000);
        assert_eq!(admitted(&after, &id("a"), l, 5), 2, "{algorithm:?}");
        assert_eq!(admitted(&after, &id("b"), l, 6), 5, "{algorithm:?}: another identity");
    }
}

/// The same trace on a store that never stopped and on one restored from a
/// snapshot at every step: the same decisions, every one.
#[test]
fn a_restored_store_decides_as_the_store_that_never_stopped() {
    let limits = [
        limit(Algorithm::SlidingWindowCounter, 4, 1_000),
        limit(Algorithm::FixedWindow, 3, 700),
        limit(Algorithm::SlidingLog, 4, 900),
        limit(Algorithm::TokenBucket, 3, 1_000),
        limit(Algorithm::Gcra, 4, 800),
        // Too large to pack: the plain table.
        limit(Algorithm::SlidingWindowCounter, 1 << 25, 3),
    ];
    let p = penalty();
    let clock = ManualClock::new(T0);
    let running = MemoryStore::with_clock(clock.clone());
    let restarted_clock = ManualClock::new(T0);
    let mut restarted = MemoryStore::with_clock(restarted_clock.clone()).with_shards(3);
    let mut rng = fastrand::Rng::with_seed(7);
    for step in 0..3_000 {
        let who = id(&format!("k{}", rng.u8(0..6)));
        let l = limits[rng.usize(0..limits.len())];
        let penalized = (rng.u8(0..4) == 0).then_some(&p);
        assert_eq!(
            decide(&running, &who, l, penalized),
            decide(&restarted, &who, l, penalized),
            "step {step}"
        );
        let by = rng.u64(0..300);
        clock.set(clock.now_ms() + by);
        restarted_clock.set(restarted_clock.now_ms() + by);
        if step % 50 == 0 {
            let bytes = snapshot(&restarted);
            restarted = MemoryStore::with_clock(restarted_clock.clone()).with_shards(1 + step % 7);
            restarted.restore_snapshot(&bytes).unwrap();
        }
    }
}

#[test]
fn a_penalized_identity_stays_blocked_until_its_block_ends() {
    let l = limit(Algorithm::SlidingWindowCounter, 1, 1_000);
    let p = penalty();
    let store = MemoryStore::with_clock(ManualClock::new(T0));
    assert!(decide(&store, &id("scraper"), l, Some(&p)).decisions[0].allowed);
    assert_eq!(decide(&store, &id("scraper"), l, Some(&p)).blocked_for, None, "one denial tolerated");
    assert_eq!(decide(&store, &id("scraper"), l, Some(&p)).blocked_for, Some(Duration::from_secs(300)));
    let bytes = snapshot(&store);
    // Ten seconds down: 290 s of the block left, whatever the limit says.
    let after = restored(&bytes, T0 + 10_000);
    assert_eq!(decide(&after, &id("scraper"), l, Some(&p)).blocked_for, Some(Duration::from_secs(290)));
    assert!(decide(&after, &id("other"), l, Some(&p)).decisions[0].allowed);
    // The block ends when it would have: not sooner, not later.
    let after = restored(&bytes, T0 + 300_000 - 1);
    assert_eq!(decide(&after, &id("scraper"), l, Some(&p)).blocked_for, Some(Duration::from_millis(1)));
    let after = restored(&bytes, T0 + 300_000);
    assert!(decide(&after, &id("scraper"), l, Some(&p)).decisions[0].allowed);
}

#[test]
fn a_clock_behind_the_snapshot_admits_no_more() {
    for algorithm in Algorithm::ALL {
        let l = limit(algorithm, 5, 10_000);
        // Back within the window, across its start, and by a minute.
        for back in [1, 5_000, 9_000, 60_000] {
            let clock = ManualClock::new(T0 + 8_000);
            let running = MemoryStore::with_clock(clock.clone());
            assert_eq!(admitted(&running, &id("a"), l, 3), 3);
            let now = T0 + 8_000 - back;
            let after = restored(&snapshot(&running), now);
            // The reference: the running store, its clock stepped back as much.
            clock.set(now);
            let (a, r) = (admitted(&after, &id("a"), l, 6), admitted(&running, &id("a"), l, 6));
            assert_eq!(a, r, "{algorithm:?}, {back} ms back");
            assert!(a <= 2, "{algorithm:?}, {back} ms back: {a} admitted past 3 of 5");
        }
    }
}

#[test]
fn states_idle_by_the_restore_are_dropped() {
    let l = limit(Algorithm::FixedWindow, 5, 10_000);
    let before = MemoryStore::with_clock(ManualClock::new(T0));
    assert_eq!(admitted(&before, &id("a"), l, 5), 5);
    let bytes = snapshot(&before);
    let mut after = MemoryStore::with_clock(ManualClock::new(T0 + 10_000));
    let report = after.restore_snapshot(&bytes).unwrap();
    assert_eq!((report.states, report.penalties, after.len()), (0, 0, 0));
    assert_eq!(admitted(&after, &id("a"), l, 6), 5);
}

#[test]
fn the_report_counts_what_was_written_and_restored() {
    let store = MemoryStore::with_clock(ManualClock::new(T0));
    for i in 0..100 {
        admitted(&store, &id(&format!("k{i}")), limit(Algorithm::SlidingWindowCounter, 5, 1_000), 1);
        admitted(&store, &id(&format!("k{i}")), limit(Algorithm::SlidingLog, 5, 1_000), 2);
    }
    let mut bytes = Vec::new();
    let written = store.write_snapshot(&mut bytes).unwrap();
    assert_eq!((written.states, written.penalties, written.written_at_ms), (200, 0, T0));
    assert_eq!(written.bytes, bytes.len() as u64);
    // Header, end mark, checksum; per table a kind, limit and count; per
    // state its id and fields: 3 words, or a length and 2 times.
    let tables = bytes.len() - HEADER_BYTES - 1 - CHECKSUM_BYTES - 100 * (8 + 24) - 100 * (8 + 8 + 16);
    assert_eq!(tables % (1 + 1 + 8 + 8 + 8), 0);
    let mut after = MemoryStore::with_clock(ManualClock::new(T0 + 10));
    assert_eq!(after.restore_snapshot(&bytes).unwrap().states, 200);
    assert_eq!(after.len(), 200);
}

/// A snapshot of a few identities, penalties and algorithms: small enough to
/// cut at every byte.
fn small_snapshot() -> Vec<u8> {
    let store = MemoryStore::with_clock(ManualClock::new(T0)).with_shards(2);
    for algorithm in Algorithm::ALL {
        admitted(&store, &id("a"), limit(algorithm, 3, 10_000), 2);
    }
    let p = penalty();
    for _ in 0..3 {
        decide(&store, &id("b"), limit(Algorithm::FixedWindow, 1, 10_000), Some(&p));
    }
    snapshot(&store)
}

/// A store holding one state, to check that a refused file changes nothing.
fn busy_store() -> MemoryStore<ManualClock> {
    let store = MemoryStore::with_clock(ManualClock::new(T0));
    admitted(&store, &id("kept"), limit(Algorithm::FixedWindow, 2, 10_000), 2);
    store
}

fn refused(bytes: &[u8]) -> Corruption {
    let mut store = busy_store();
    let err = store.restore_snapshot(bytes).unwrap_err();
    assert_eq!(store.len(), 1, "a refused snapshot changed the store: {err}");
    assert_eq!(admitted(&store, &id("kept"), limit(Algorithm::FixedWindow, 2, 10_000), 1), 0);
    err
}

#[test]
fn a_file_cut_at_any_byte_is_refused() {
    let bytes = small_snapshot();
    assert!(restored(&bytes, T0).len() > 5);
    for len in 0..bytes.len() {
        let err = refused(&bytes[..len]);
        let expected = if len < format::MIN_BYTES { "too short" } else { "checksum does not match" };
        assert!(err.to_string().contains(expected), "cut at {len}: {err}");
    }
}

#[test]
fn a_file_with_any_bit_flipped_is_refused() {
    let bytes = small_snapshot();
    for at in 0..bytes.len() {
        for bit in [0, 3, 7] {
            let mut flipped = bytes.clone();
            flipped[at] ^= 1 << bit;
            let err = refused(&flipped);
            let expected = match at {
                0..8 => Corruption::Magic,
                8..12 => Corruption::Version { found: 1 ^ (1 << (bit + 8 * (at - 8))), expected: 1 },
                _ => Corruption::Checksum,
            };
            assert_eq!(err, expected, "byte {at}, bit {bit}");
        }
    }
}

#[test]
fn a_foreign_file_or_another_version_is_named() {
    assert_eq!(
        refused(b"{\"not\": \"a snapshot\"}").to_string(),
        "it does not begin with the snapshot magic \"SLGSNAP\\0\": not a slidegate snapshot"
    );
    let mut v2 = small_snapshot();
    v2[8] = 2;
    assert_eq!(refused(&v2).to_string(), "format version 2; this slidegate reads version 1");
}

/// `records` framed as a snapshot, with a checksum that matches: what only a
/// forger (or a bug) writes.
fn sealed(records: &[u8]) -> Vec<u8> {
    let mut bytes = Header { written_at_ms: T0, seed: 1 }.bytes().to_vec();
    bytes.extend_from_slice(records);
    let checksum = *blake3::hash(&bytes).as_bytes();
    bytes.extend_from_slice(&checksum);
    bytes
}

fn words(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// A table record: kind, algorithm, limit, window, then `rest`.
fn table(algorithm: u8, permits: u64, window_ms: u64, rest: &[u64]) -> Vec<u8> {
    let mut out = vec![format::TABLE, algorithm];
    out.extend(words(&[permits, window_ms]));
    out.extend(words(rest));
    out
}

fn invalid(records: &[u8]) -> String {
    match refused(&sealed(records)) {
        Corruption::Invalid { at, what } => format!("{at}: {what}"),
        other => panic!("expected an invalid value, got {other}"),
    }
}

#[test]
fn forged_lengths_and_values_are_refused_without_allocating_them() {
    let with_end = |mut r: Vec<u8>| {
        r.push(format::END);
        r
    };
    assert_eq!(refused(&sealed(&[])), Corruption::TooShort { len: 64, min: 65 });
    assert_eq!(invalid(&[format::TABLE]), "33: the algorithm needs 1 bytes, 0 are left before the checksum");
    // A count of 2^64 − 1 states, or of log entries, is checked before any allocation.
    let e = invalid(&with_end(table(0, 5, 1_000, &[u64::MAX])));
    assert!(
        e.starts_with("50: the state count is 18446744073709551615, which would need at least 32"),
        "{e}"
    );
    let e = invalid(&with_end(table(2, 5, 1_000, &[1, 3, u64::MAX])));
    assert!(e.starts_with("66: the log's length is 18446744073709551615"), "{e}");
    let mut penalties = vec![format::PENALTIES];
    penalties.extend(words(&[1 << 60]));
    assert!(invalid(&with_end(penalties)).starts_with("33: the penalty count is 1152921504606846976"));
    // Values no store writes.
    assert_eq!(invalid(&table(9, 5, 1_000, &[])), "33: algorithm 9: this build knows 5");
    assert!(invalid(&table(0, 0, 1_000, &[])).starts_with("33: quota 0 per 1000 ms: "));
    assert!(
        invalid(&table(2, 20_000, 1_000, &[])).starts_with("33: sliding_log limits must be at most 10000")
    );
    let e = invalid(&with_end(table(0, 5, 1_000, &[1, 2, 1 << 40, 6, 0])));
    assert_eq!(e, "58: identity 0x2: stored ids are odd");
    let e = invalid(&with_end(table(0, 5, 1_000, &[1, 3, 1 << 40, 6, 0])));
    assert_eq!(e, "58: counts 6 and 0 above the limit 5");
    let e = invalid(&with_end(table(0, 5, 1_000, &[1, 3, u64::MAX, 0, 0])));
    assert_eq!(e, "58: window 18446744073709551615 past the year 9999");
    let e = invalid(&with_end(table(2, 5, 1_000, &[1, 3, 2, T0, T0 - 1])));
    assert_eq!(e, "58: a log out of order");
    let e = invalid(&with_end(table(3, 5, 1_000, &[1, 3, 5_001, T0])));
    assert_eq!(e, "58: 5001 units used, above the bucket's 5000");
    let e = invalid(&with_end(table(4, 5, 1_000, &[1, 3, T0, 5])));
    assert_eq!(e, "58: fraction 5 not below the limit 5");
    assert_eq!(invalid(&[7]), "32: record kind 7: this build knows 0 to 2");
    assert_eq!(invalid(&[format::END, 0]), "33: 1 bytes follow the end mark");
    // A duplicated identity keeps its first state; nothing panics.
    let twice = with_end(table(0, 5, 10_000, &[2, 3, T0 / 10_000, 5, 0, 3, T0 / 10_000, 1, 0]));
    let store = restored(&sealed(&twice), T0);
    assert_eq!(store.len(), 1);
}

#[test]
fn a_saved_snapshot_replaces_the_last_one_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.snap");
    let mut empty = MemoryStore::with_clock(ManualClock::new(T0));
    assert_eq!(empty.load_snapshot(&path).unwrap(), None, "no file: an empty start");
    let store = busy_store();
    let first = store.save_snapshot(&path).unwrap();
    admitted(&store, &id("more"), limit(Algorithm::FixedWindow, 2, 10_000), 1);
    let second = store.save_snapshot(&path).unwrap();
    assert_eq!((first.states, second.states), (1, 2));
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["state.snap"], "no temporary file left behind");
    let mut after = MemoryStore::with_clock(ManualClock::new(T0 + 1));
    assert_eq!(after.load_snapshot(&path).unwrap().map(|r| r.states), Some(2));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    }
    // A directory that is not there: an error naming the file, nothing written.
    let nowhere = dir.path().join("missing").join("state.snap");
    let err = store.save_snapshot(&nowhere).unwrap_err();
    assert!(err.to_string().starts_with(&format!("cannot write snapshot {}: ", nowhere.display())), "{err}");
    // A cut file: an error naming the file and what is wrong.
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
    let err = after.load_snapshot(&path).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "snapshot {} is unusable: its checksum does not match its contents: the file is truncated or was altered",
            path.display()
        )
    );
}
