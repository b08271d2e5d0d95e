//! What a snapshot of the embedded store costs at 1,000,000 identities
//! (sliding window counter, 100/min, one decision each, plus 1,000
//! identities in the penalty box): the time to write it to a file
//! (`save_snapshot`: encoded shard by shard under each shard's lock, then
//! fsync and rename), the longest any one shard's lock was held for it, the
//! file's size, and the time to read it back (`load_snapshot`). Several
//! runs; JSON with min, median and max of each.
//!
//! Run: `cargo bench -p slidegate --bench snapshot`
//! (`-- --identities N --runs R` for other counts).

// A bench whose setup fails has nothing to measure: it stops there, as a test does.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use slidegate::{Algorithm, Charge, Identity, Limit, ManualClock, MemoryStore, Penalty, Quota, Request};

fn arg(name: &str, default: usize) -> usize {
    let mut args = std::env::args().skip_while(|a| a != name).skip(1);
    args.next().and_then(|n| n.parse().ok()).unwrap_or(default)
}

/// `[min, median, max]` of `values`, in ms.
fn spread(mut values: Vec<Duration>) -> [f64; 3] {
    values.sort();
    let ms = |d: Duration| (d.as_secs_f64() * 1e6).round() / 1e3;
    [ms(values[0]), ms(values[values.len() / 2]), ms(values[values.len() - 1])]
}

fn main() {
    let identities = arg("--identities", 1_000_000);
    let runs = arg("--runs", 7).max(1);
    let now = 1_700_000_000_000;
    let store = MemoryStore::with_clock(ManualClock::new(now));
    let limit =
        Limit::new(Algorithm::SlidingWindowCounter, Quota::new(100, Duration::from_secs(60)).unwrap());
    let charge = [Charge::new(limit, 1)];
    let login =
        [Charge::new(Limit::new(Algorithm::FixedWindow, Quota::new(1, Duration::from_secs(60)).unwrap()), 1)];
    let penalty =
        Penalty::new(1, Duration::from_secs(60), Duration::from_secs(600), Duration::from_secs(3600))
            .unwrap();
    let mut name = String::new();
    for i in 0..identities {
        name.clear();
        std::fmt::Write::write_fmt(&mut name, format_args!("user:{i}")).unwrap();
        store.decide_sync(Request::new(&Identity::named("bench", &name), &charge)).unwrap();
    }
    for i in 0..1_000.min(identities) {
        let who = Identity::named("login", &format!("scraper:{i}"));
        for _ in 0..3 {
            store.decide_sync(Request::new(&who, &login).with_penalty(&penalty)).unwrap();
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.snap");
    let (mut writes, mut reads, mut bytes) = (Vec::new(), Vec::new(), 0);
    for _ in 0..runs {
        let started = Instant::now();
        let report = store.save_snapshot(&path).unwrap();
        writes.push(started.elapsed());
        bytes = report.bytes;
        let mut restored = MemoryStore::with_clock(ManualClock::new(now + 1_000));
        let started = Instant::now();
        let back = restored.load_snapshot(&path).unwrap().unwrap();
        reads.push(started.elapsed());
        assert_eq!((back.states, back.penalties), (report.states, report.penalties));
    }
    // The lock a decision may wait on: a shard's share of encoding the store
    // (64 shards), on average.
    let mut shard_encode = Vec::new();
    for _ in 0..runs {
        let started = Instant::now();
        let mut sink = std::io::sink();
        store.write_snapshot(&mut sink).unwrap();
        shard_encode.push(started.elapsed() / 64);
    }
    println!(
        "{{\"identities\": {identities}, \"runs\": {runs}, \"bytes\": {bytes}, \"bytes_per_identity\": {:.1}, \
         \"save_ms\": {:?}, \"encode_per_shard_ms\": {:?}, \"load_ms\": {:?}}}",
        bytes as f64 / identities as f64,
        spread(writes),
        spread(shard_encode),
        spread(reads),
    );
}
