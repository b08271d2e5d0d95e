//! What only the packed layout can get wrong: window hashes without a TTL,
//! a hash that stops being a listpack, leases given back in the wrong
//! window, what eviction forgets, and the module stepping on packed state.
//! (Its decisions are held equal to the embedded store's by the conformance
//! cases and the stores-agree traces, in `conformance.rs`, `stores_agree.rs`
//! and `cluster.rs`.)
#![cfg(feature = "redis")]

mod support;

use std::sync::Arc;
use std::time::Duration;

use slidegate::{
    Algorithm, Buckets, Charge, DistinctStore, Engine, GiveBack, Identity, Layout, LeaseStore, Limit,
    Location, ManualClock, RedisOptions, RedisStore, Store, TimeSource,
};
use slidegate_test_redis::{module_args, CommandStats, RedisServer};
use support::{admin, id, keys_with_pttl, limit, unique_prefix, Decide, T0};

fn packed(buckets: u32) -> Layout {
    Layout::Packed(Buckets::new(buckets).expect("a power of two"))
}

/// `cmd` on the server, as a string reply.
async fn query(server: &RedisServer, cmd: &mut redis::Cmd) -> String {
    cmd.query_async(&mut admin(server).await).await.expect("admin command")
}

/// A small deterministic generator, so a failing trace can be replayed.
struct XorShift(u64);

impl XorShift {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Every key a random trace leaves has a TTL; the packed algorithms' keys
/// are listpack hashes named `<stem><window number>`, one field per
/// identity counted in that window; the others keep their own keys.
#[tokio::test]
async fn every_window_hash_expires_and_stays_a_listpack() {
    let server = RedisServer::spawn();
    let clock = ManualClock::new(T0 + 17);
    let client = support::client_time_store(&server, &clock, "ttl").await.with_layout(packed(2));
    let server_time = RedisStore::connect(&server.url())
        .await
        .expect("connect")
        .with_prefix(unique_prefix("ttl"))
        .with_layout(packed(2));
    let limits: Vec<Limit> = Algorithm::ALL
        .into_iter()
        .flat_map(|a| [limit(a, 3, 5), limit(a, 4, 100), limit(a, 10, 1000), limit(a, 2, 60_000)])
        .collect();
    let identities = [id("a"), id("b"), id("c"), Identity::named("}d{", "d"), id("e"), id("f")];
    let mut rng = XorShift(0x5eed_cafe);
    for _ in 0..3000 {
        clock.advance(Duration::from_millis(rng.below(40)));
        let identity = &identities[rng.below(identities.len() as u64) as usize];
        let store = if rng.below(4) == 0 { &server_time } else { &client };
        if rng.below(5) == 0 {
            let first = rng.below(limits.len() as u64 - 3) as usize;
            let charges: Vec<(Limit, u64)> =
                limits[first..first + 3].iter().map(|l| (*l, rng.below(3))).collect();
            store.decide_all(identity, &charges).await.expect("decide_all");
        } else {
            let l = &limits[rng.below(limits.len() as u64) as usize];
            store.decide_one(identity, l, rng.below(l.quota.permits() + 1)).await.expect("decide");
        }
    }
    let mut stems = Vec::new();
    for store in [&client, &server_time] {
        for identity in &identities {
            for l in &limits {
                if let Location::Packed { stem, .. } = store.location(identity, l) {
                    stems.push(stem);
                }
            }
        }
    }
    let keys = keys_with_pttl(&server).await;
    let mut hashes = 0;
    for (key, pttl) in &keys {
        let expiring = key.starts_with(server_time.prefix()) && (*pttl == 0 || *pttl == -2);
        assert!(*pttl > 0 || expiring, "{key} has PTTL {pttl}");
        let packs = key.contains(":swc:") || key.contains(":fw:");
        let kind = query(&server, redis::cmd("TYPE").arg(key)).await;
        if kind == "none" {
            continue; // expired between SCAN and TYPE
        }
        if packs {
            hashes += 1;
            assert_eq!(kind, "hash", "{key}");
            assert_eq!(
                query(&server, redis::cmd("OBJECT").arg("ENCODING").arg(key)).await,
                "listpack",
                "{key}"
            );
            // `<stem><window number>`: the stem is what `location` gives.
            let (stem, window) = key.rsplit_once(':').expect("a window number");
            assert!(window.parse::<u64>().is_ok(), "{key}");
            assert!(stems.contains(&format!("{stem}:")), "{key} is no window hash of these identities");
        } else {
            assert_ne!(kind, "hash", "{key}");
        }
    }
    assert!(hashes >= 10, "the trace left {hashes} window hashes");
}

/// The same leases and give-backs on both layouts: identical leases,
/// identical permits given back (in the lease's window, and as the
/// counter's previous window once the identity counts in the next one),
/// identical decisions after.
#[tokio::test]
async fn leases_are_given_back_as_with_a_key_per_identity() {
    let server = RedisServer::spawn();
    let clock = ManualClock::new(T0);
    let per_key = support::client_time_store(&server, &clock, "lease-k").await;
    let packed = support::client_time_store(&server, &clock, "lease-p").await.with_layout(packed(1));
    for algorithm in [Algorithm::SlidingWindowCounter, Algorithm::FixedWindow] {
        let l = limit(algorithm, 10, 1000);
        for (step, (at, lease, back, then_decide)) in [
            // lease 4, give 3 back in the same window
            (T0 + 100, 4, 3, 0),
            // lease 5 at the end of a window, count 1 in the next, give 5 back
            (T0 + 2_990, 5, 5, 1),
            // lease 6, give back 10: only 6 were charged
            (T0 + 5_500, 6, 10, 0),
        ]
        .into_iter()
        .enumerate()
        {
            let who = id(&format!("{algorithm}-{step}"));
            clock.set(at);
            let mut outcomes = Vec::new();
            for store in [&per_key, &packed] {
                let leases = store.leases().expect("Redis leases");
                let leased = leases.lease(&who, Charge::new(l, lease), None).await.expect("lease");
                assert!(leased.decision.allowed, "{algorithm} step {step}");
                let mut after = Vec::new();
                if then_decide > 0 {
                    clock.set(at + 20);
                    after.push(store.decide_one(&who, &l, then_decide).await.expect("decide"));
                }
                let back = GiveBack { limit: l, window: leased.window, unused: back };
                let given = leases.give_back(&who, back, None).await.expect("give back");
                after.push(store.decide_one(&who, &l, 0).await.expect("peek"));
                clock.set(at);
                outcomes.push((leased.decision, given, after));
            }
            assert_eq!(outcomes[0], outcomes[1], "{algorithm} step {step}");
            let expected_back = match (algorithm, step) {
                (_, 0) => 3,
                (Algorithm::FixedWindow, 1) => 0, // its window ended: nothing counts
                (_, 1) => 5,
                _ => 6,
            };
            assert_eq!(outcomes[1].1, expected_back, "{algorithm} step {step}");
        }
    }
}

/// Eviction takes a whole window hash: every identity of that bucket
/// forgets that window's count (its requests are admitted afresh, never
/// denied more), and the other buckets keep theirs. Deleting the hash is
/// exactly what an eviction does to it.
#[tokio::test]
async fn a_lost_window_hash_forgets_its_bucket_and_only_its_bucket() {
    let server = RedisServer::spawn();
    let clock = ManualClock::new(T0);
    let store = support::client_time_store(&server, &clock, "evict").await.with_layout(packed(4));
    let l = limit(Algorithm::SlidingWindowCounter, 3, 60_000);
    let names: Vec<String> = (0..40).map(|i| format!("user-{i}")).collect();
    for name in &names {
        assert!(store.decide_one(&id(name), &l, 3).await.expect("decide").allowed);
        assert!(!store.decide_one(&id(name), &l, 1).await.expect("decide").allowed);
    }
    let Location::Packed { stem, .. } = store.location(&id(&names[0]), &l) else { panic!("packed") };
    let lost = format!("{stem}{}", T0 / 60_000);
    let in_lost: Vec<bool> = names
        .iter()
        .map(|n| matches!(store.location(&id(n), &l), Location::Packed { stem: s, .. } if s == stem))
        .collect();
    assert!(in_lost.iter().any(|b| *b) && in_lost.iter().any(|b| !*b), "both kinds of identity");
    let deleted: u64 =
        redis::cmd("DEL").arg(&lost).query_async(&mut admin(&server).await).await.expect("DEL");
    assert_eq!(deleted, 1);
    for (name, lost) in names.iter().zip(in_lost) {
        let d = store.decide_one(&id(name), &l, 1).await.expect("decide");
        assert_eq!(d.allowed, lost, "{name}: in the lost bucket {lost}");
    }
}

/// Under real memory pressure with `allkeys-lru`, Redis evicts whole
/// window hashes: decisions go on without an error, and an identity whose
/// hash went is admitted again at most its limit in that window.
#[tokio::test]
async fn decisions_go_on_under_eviction() {
    let server = RedisServer::spawn_with_args(&["--maxmemory", "3mb", "--maxmemory-policy", "allkeys-lru"]);
    let clock = ManualClock::new(T0);
    let store = support::client_time_store(&server, &clock, "lru").await.with_layout(packed(64));
    let l = limit(Algorithm::FixedWindow, 2, 60_000);
    let filler = limit(Algorithm::SlidingLog, 10_000, 60_000);
    for i in 0..2_000 {
        assert!(store.decide_one(&id(&format!("user-{i}")), &l, 2).await.expect("decide").allowed);
    }
    // A sliding log's sorted sets grow until Redis must evict.
    let mut evicted = 0;
    for round in 0..400 {
        store.decide_one(&id(&format!("log-{round}")), &filler, 2_000).await.expect("decide under pressure");
        let info = query(&server, redis::cmd("INFO").arg("stats")).await;
        evicted = info
            .lines()
            .find_map(|l| l.strip_prefix("evicted_keys:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
        if evicted > 20 {
            break;
        }
    }
    assert!(evicted > 20, "Redis evicted {evicted} keys");
    // Each identity: denied (its count kept) or admitted at most 2 again
    // (its hash evicted), never more.
    let mut forgotten = 0;
    for i in 0..2_000 {
        let who = id(&format!("user-{i}"));
        let mut admitted = 0;
        for _ in 0..3 {
            admitted += u64::from(store.decide_one(&who, &l, 1).await.expect("decide").allowed);
        }
        assert!(admitted == 0 || admitted == 2, "user-{i} admitted {admitted}");
        forgotten += u64::from(admitted > 0);
    }
    assert!(forgotten < 2_000, "every hash was evicted");
}

/// With the module loaded (engine auto or forced), the packed algorithms
/// are decided by the scripts (the module knows no packed state), the
/// others by the module.
#[tokio::test]
async fn the_module_leaves_packed_state_to_the_scripts() {
    let args = module_args();
    let server = RedisServer::spawn_with_args(&args.iter().map(String::as_str).collect::<Vec<_>>());
    for engine in [Engine::Auto, Engine::Module] {
        let options = RedisOptions::new().with_engine(engine).with_layout(packed(8));
        let store = RedisStore::connect_with(&server.url(), options)
            .await
            .expect("connect")
            .with_prefix(unique_prefix("module"))
            .with_time_source(TimeSource::Client(Arc::new(ManualClock::new(T0))));
        let before = CommandStats::of_port(server.port());
        let swc = limit(Algorithm::SlidingWindowCounter, 3, 1000);
        let gcra = limit(Algorithm::Gcra, 3, 1000);
        for _ in 0..3 {
            assert!(store.decide_one(&id("m"), &swc, 1).await.expect("swc").allowed);
            assert!(store.decide_one(&id("m"), &gcra, 1).await.expect("gcra").allowed);
        }
        assert!(!store.decide_one(&id("m"), &swc, 1).await.expect("swc").allowed);
        let after = CommandStats::of_port(server.port());
        let delta = |cmd: &str| after.calls(cmd) - before.calls(cmd);
        assert_eq!(delta("evalsha") + delta("eval"), 4, "{engine}: the counter by Lua");
        assert_eq!(delta("slidegate.decide"), 3, "{engine}: GCRA by the module");
    }
}

/// Crawl breadth on a packed store: its sketch lives in the slot of the
/// identity's window hashes, and counts as on a key per identity.
#[tokio::test]
async fn crawl_breadth_lives_in_the_bucket_s_slot() {
    let server = RedisServer::spawn();
    let store = RedisStore::connect(&server.url()).await.expect("connect").with_layout(packed(8));
    let quota = slidegate::Quota::new(2, Duration::from_secs(60)).expect("a quota");
    let who = id("crawler");
    let distinct = store.distinct().expect("Redis counts distinct values");
    let mut allowed = Vec::new();
    for value in [b"a".as_slice(), b"b", b"a", b"c"] {
        allowed.push(distinct.decide_distinct(&who, &quota, value).await.expect("breadth").allowed);
    }
    assert_eq!(allowed, [true, true, true, false], "two distinct values a minute");
    let Location::Packed { stem, .. } =
        store.location(&who, &limit(Algorithm::SlidingWindowCounter, 3, 1000))
    else {
        panic!("packed")
    };
    let tag = &stem[stem.find('{').expect("a tag")..=stem.find('}').expect("a tag")];
    assert!(store.distinct_key(&who, &quota).contains(tag), "{} {stem}", store.distinct_key(&who, &quota));
}

/// Switching layouts: a store in one never reads the other's state, so an
/// identity starts afresh once (docs/packed-layout.md, "Switching").
#[tokio::test]
async fn a_switch_of_layout_starts_each_identity_afresh() {
    let server = RedisServer::spawn();
    let clock = ManualClock::new(T0);
    let per_key = support::client_time_store(&server, &clock, "switch").await;
    let packed = per_key.clone().with_layout(packed(16));
    for algorithm in [Algorithm::SlidingWindowCounter, Algorithm::FixedWindow] {
        let l = limit(algorithm, 3, 60_000);
        assert!(per_key.decide_one(&id("s"), &l, 3).await.expect("decide").allowed);
        assert!(!per_key.decide_one(&id("s"), &l, 1).await.expect("decide").allowed);
        let d = packed.decide_one(&id("s"), &l, 0).await.expect("peek");
        assert_eq!(d.remaining, 3, "{algorithm}: the packed store starts afresh");
        assert!(packed.decide_one(&id("s"), &l, 3).await.expect("decide").allowed);
        assert!(
            !per_key.decide_one(&id("s"), &l, 1).await.expect("decide").allowed,
            "{algorithm}: still full"
        );
    }
}

/// In client time, a decision after the clock stepped back more than the
/// slack within a window lengthens the window hashes it reads: the current
/// one to outlive the next window, the previous one to outlive this one,
/// each by the slack (a refusal too). Their TTLs, set by each window's first
/// permit, ran out while their counts still mattered.
#[tokio::test]
async fn a_step_back_within_a_window_keeps_its_hashes() {
    let server = RedisServer::spawn();
    let w = 60_000;
    // The start of a window, so that T0-relative times are window-relative.
    let start = (T0 / w + 1) * w;
    let clock = ManualClock::new(start + w - 1_000);
    let store = support::client_time_store(&server, &clock, "step").await.with_layout(packed(1));
    for algorithm in [Algorithm::SlidingWindowCounter, Algorithm::FixedWindow] {
        let l = limit(algorithm, 3, w);
        let who = id(algorithm.name());
        // Window 0's first permit, 1 s before it ends; then 59 s back.
        clock.set(start + w - 1_000);
        assert!(store.decide_one(&who, &l, 3).await.expect("decide").allowed);
        clock.set(start);
        assert!(!store.decide_one(&who, &l, 1).await.expect("decide").allowed, "{algorithm}");
        let stem = &store.keys_for(&who, &l)[0];
        let n = start / w;
        let ttl: i64 = query_int(&server, redis::cmd("PTTL").arg(format!("{stem}{n}"))).await;
        // Counted until the next window ends (the counter) or this one (fixed).
        let matters = if algorithm == Algorithm::SlidingWindowCounter { 2 * w } else { w } as i64;
        let want = matters + 10_000;
        assert!(ttl > want - 2_000 && ttl <= want, "{algorithm}: PTTL {ttl} ms, want about {want}");
    }
    // The counter's previous window, read while the identity has no count
    // in this one: its hash lengthened to outlive this window by the slack.
    // (Redis's clock running ahead of the client's is what shortens it; the
    // test shortens it by hand.)
    let l = limit(Algorithm::SlidingWindowCounter, 3, w);
    let who = id("previous");
    clock.set(start + w - 1_000);
    assert!(store.decide_one(&who, &l, 3).await.expect("decide").allowed);
    let stem = &store.keys_for(&who, &l)[0];
    let previous = format!("{stem}{}", start / w);
    query_int(&server, redis::cmd("PEXPIRE").arg(&previous).arg(5_000)).await;
    clock.set(start + w + 1_000);
    assert!(!store.decide_one(&who, &l, 1).await.expect("decide").allowed, "the previous count weighs");
    let ttl: i64 = query_int(&server, redis::cmd("PTTL").arg(&previous)).await;
    let want = w as i64 - 1_000 + 10_000;
    assert!(ttl > want - 2_000 && ttl <= want, "previous window: PTTL {ttl} ms, want about {want}");
}

/// `cmd` on the server, as an integer reply.
async fn query_int(server: &RedisServer, cmd: &mut redis::Cmd) -> i64 {
    cmd.query_async(&mut admin(server).await).await.expect("admin command")
}
