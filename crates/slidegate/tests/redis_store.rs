//! What only the Redis store can get wrong: TTLs, atomicity under concurrent
//! connections, the script cache going away, server time, the key layout.
//! Each test spawns its own `redis-server` on an ephemeral loopback port.
#![cfg(feature = "redis")]

mod support;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use slidegate::{Algorithm, Identity, Limit, ManualClock, RedisStore, Store, TimeSource, Unavailable};
use slidegate_test_redis::RedisServer;
use support::{admin, client_time_store, id, keys_with_pttl, limit, unique_prefix, Decide, T0};

/// Slack `TimeSource::Client` adds to every TTL (see `prelude.lua`).
const CLIENT_TTL_SLACK_MS: i64 = 10_000;
/// Real time a test may take between a decision and reading the key's PTTL.
const TOLERANCE_MS: i64 = 2_000;

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

async fn pttl(server: &RedisServer, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(&mut admin(server).await).await.expect("PTTL")
}

#[tokio::test]
async fn no_key_without_ttl_after_a_random_trace_over_every_algorithm() {
    let server = RedisServer::spawn();
    let clock = ManualClock::new(T0 + 17);
    let client = client_time_store(&server, &clock, "ttl").await;
    let server_time =
        RedisStore::connect(&server.url()).await.expect("connect").with_prefix(unique_prefix("ttl"));
    let limits: Vec<Limit> = Algorithm::ALL
        .into_iter()
        .flat_map(|a| [limit(a, 3, 5), limit(a, 4, 100), limit(a, 10, 1000), limit(a, 2, 60_000)])
        .collect();
    // The last one's scope starts with `}`: its keys need the escape.
    let identities = [id("a"), id("b"), id("c"), Identity::named("}d{", "d")];
    let mut rng = XorShift(0x5eed_cafe);
    for _ in 0..3000 {
        clock.advance(Duration::from_millis(rng.below(40)));
        let identity = &identities[rng.below(4) as usize];
        // Mostly client time (TTLs with slack, so the keys are still there to
        // check), and server time (exact TTLs: small windows expire for real).
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

    let keys = keys_with_pttl(&server).await;
    let expected: HashSet<String> = [&client, &server_time]
        .into_iter()
        .flat_map(|s| identities.iter().flat_map(|i| limits.iter().flat_map(|l| s.keys_for(i, l))))
        .collect();
    assert!(keys.len() >= 10, "the trace left {} keys; expected state for every algorithm", keys.len());
    for (key, pttl) in &keys {
        // A server-time key may reach its expiry (0) or pass it (-2) between
        // SCAN and PTTL. Never -1, no expiry.
        let expiring = key.starts_with(server_time.prefix()) && (*pttl == 0 || *pttl == -2);
        assert!(*pttl > 0 || expiring, "{key} has PTTL {pttl}");
        assert!(expected.contains(key), "{key} is not a key of these stores' identities and limits");
    }
    assert!(keys.iter().any(|(k, _)| k.starts_with(server_time.prefix())), "no server-time key left");
    for tag in [":swc:", ":fw:", ":log:", ":tb:", ":gcra:"] {
        assert!(keys.iter().any(|(k, _)| k.contains(tag)), "no {tag} key left by the trace");
    }
}

/// After an allowed request the key lives exactly until its state stops
/// mattering, which is the decision's `reset_after`, in server time. In
/// client time it lives at least that long plus the slack (the counter and
/// the fixed window keep the expiry set by their window's first write, so it
/// may be longer when the client clock ran ahead of Redis's).
#[tokio::test]
async fn ttl_is_the_time_until_the_state_stops_mattering() {
    let server = RedisServer::spawn();
    let clock = ManualClock::new(T0 + 4321);
    let client = client_time_store(&server, &clock, "life").await;
    let server_time =
        RedisStore::connect(&server.url()).await.expect("connect").with_prefix(unique_prefix("life"));
    for (store, slack) in [(&client, CLIENT_TTL_SLACK_MS), (&server_time, 0)] {
        for algorithm in Algorithm::ALL {
            let l = limit(algorithm, 7, 30_000);
            for cost in [1, 2, 3] {
                let d = store.decide_one(&id("life"), &l, cost).await.expect("decide");
                assert!(d.allowed);
                let [key] = &store.keys_for(&id("life"), &l)[..] else { panic!("one key per limit") };
                let reset = d.reset_after.as_millis() as i64 + slack;
                let ttl = pttl(&server, key).await;
                let exact = slack == 0
                    || matches!(algorithm, Algorithm::SlidingLog | Algorithm::TokenBucket | Algorithm::Gcra);
                assert!(
                    ttl > reset - TOLERANCE_MS && (ttl <= reset || !exact),
                    "{algorithm} {key}: PTTL {ttl}, reset_after + slack {reset}"
                );
                clock.advance(Duration::from_millis(1234));
            }
        }
    }
}

/// Exact to the millisecond, in server time: the keys one `decide_all` writes
/// (one script, one `TIME`) expire at `now + reset_after` (`SET … PXAT`), so
/// `PEXPIRETIME − reset_after` is the same instant for every algorithm, and
/// the window-aligned states expire on a window boundary. (In client time
/// the TTL is relative, counted from each command's own clock reading, and
/// the test above bounds it.)
#[tokio::test]
async fn expiry_is_exactly_when_the_state_stops_mattering() {
    let server = RedisServer::spawn();
    let store =
        RedisStore::connect(&server.url()).await.expect("connect").with_prefix(unique_prefix("expiry"));
    let w = 30_000;
    // 97 does not divide the window: the bucket and GCRA round their times.
    let limits: Vec<Limit> = Algorithm::ALL.into_iter().map(|a| limit(a, 97, w)).collect();
    let mut conn = admin(&server).await;
    for round in 1..=4u64 {
        let charges: Vec<(Limit, u64)> = limits.iter().map(|l| (*l, round)).collect();
        let before = redis_time_ms(&mut conn).await;
        let decisions = store.decide_all(&id("exp"), &charges).await.expect("decide_all");
        let after = redis_time_ms(&mut conn).await;
        let mut instants = Vec::new();
        for ((l, _), d) in charges.iter().zip(&decisions) {
            assert!(d.allowed);
            let key = &store.keys_for(&id("exp"), l)[0];
            let at: i64 =
                redis::cmd("PEXPIRETIME").arg(key).query_async(&mut conn).await.expect("PEXPIRETIME");
            if matches!(l.algorithm, Algorithm::FixedWindow | Algorithm::SlidingWindowCounter) {
                assert_eq!(at % w as i64, 0, "{}: expires off a window boundary", l.algorithm);
            }
            instants.push((l.algorithm, at - d.reset_after.as_millis() as i64));
        }
        assert!(instants.iter().all(|(_, t)| *t == instants[0].1), "round {round}: {instants:?}");
        // ... and that instant is the script's reading of Redis TIME, in ms.
        let now = instants[0].1;
        assert!(before <= now && now <= after, "TIME read as {now}, between {before} and {after}");
    }
}

/// The single-limit scripts rewrite a state within its window in place
/// (`SETRANGE`, which leaves the key's expiry alone): the expiry set by the
/// window's first write stays exact, on the window boundary, however many
/// decisions follow, and the key never loses it.
#[tokio::test]
async fn writes_within_a_window_keep_its_exact_expiry() {
    let server = RedisServer::spawn();
    let store =
        RedisStore::connect(&server.url()).await.expect("connect").with_prefix(unique_prefix("inplace"));
    let w = 3_600_000;
    let mut conn = admin(&server).await;
    for (algorithm, windows) in [(Algorithm::FixedWindow, 1), (Algorithm::SlidingWindowCounter, 2)] {
        let l = limit(algorithm, 50, w);
        let key = &store.keys_for(&id("inplace"), &l)[0];
        let mut first = None;
        for n in 1..=5u64 {
            let before = redis_time_ms(&mut conn).await;
            let d = store.decide_one(&id("inplace"), &l, n).await.expect("decide");
            let after = redis_time_ms(&mut conn).await;
            let charged: u64 = (1..=n).sum();
            assert!(d.allowed, "{algorithm}: decision {n}");
            assert_eq!(d.remaining, 50 - charged, "{algorithm}: decision {n}");
            let at: i64 =
                redis::cmd("PEXPIRETIME").arg(key).query_async(&mut conn).await.expect("PEXPIRETIME");
            assert_eq!(at % w as i64, 0, "{algorithm}: expires off a window boundary");
            let now = at - d.reset_after.as_millis() as i64;
            assert!(before <= now && now <= after, "{algorithm}: expiry {at} is not TIME + reset_after");
            assert_eq!(now - now % w as i64 + windows * w as i64, at, "{algorithm}");
            assert_eq!(*first.get_or_insert(at), at, "{algorithm}: decision {n} moved the expiry");
        }
    }
}

/// An allowed decision replies in one integer while remaining < 2^21 and
/// reset_after < 2^32 ms; beyond either, in doubles. Both decode to the
/// same exact figures as the embedded store's.
#[tokio::test]
async fn large_limits_and_long_windows_decide_exactly() {
    use slidegate::MemoryStore;
    let server = RedisServer::spawn();
    let clock = ManualClock::new(T0 + 987);
    let redis = client_time_store(&server, &clock, "large").await;
    let memory = MemoryStore::with_clock(clock.clone());
    let fifty_days = 50 * 86_400_000;
    for algorithm in Algorithm::ALL {
        for (n, ms) in [(3_000_000, 60_000), ((1 << 21) + 1, 1000), (10, fifty_days), (5, 1000)] {
            let l = limit(algorithm, n, ms);
            for cost in [1, n - 2, 2, 0, n] {
                let (r, m) = (
                    redis.decide_one(&id("big"), &l, cost).await,
                    memory.decide_one(&id("big"), &l, cost).await,
                );
                match (r, m) {
                    (Ok(r), Ok(m)) => assert_eq!(r, m, "{algorithm} {n}/{ms} ms, cost {cost}"),
                    // A sliding log of millions of entries is refused by both.
                    (Err(_), Err(_)) if algorithm == Algorithm::SlidingLog => {}
                    other => panic!("{algorithm} {n}/{ms} ms, cost {cost}: {other:?}"),
                }
                clock.advance(Duration::from_millis(7));
            }
        }
    }
}

async fn redis_time_ms(conn: &mut redis::aio::MultiplexedConnection) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query_async(conn).await.expect("TIME");
    s * 1000 + us / 1000
}

async fn admitted<S: Store + Clone + 'static>(stores: &[S], identity: &str, l: Limit, tasks: usize) -> u64 {
    let mut handles = Vec::with_capacity(tasks);
    for i in 0..tasks {
        let store = stores[i % stores.len()].clone();
        let identity = identity.to_owned();
        handles.push(tokio::spawn(async move {
            store.decide_one(&id(&identity), &l, 1).await.expect("decide").allowed
        }));
    }
    let mut allowed = 0;
    for h in handles {
        allowed += u64::from(h.await.expect("task"));
    }
    allowed
}

/// 96 tasks over 4 connections at one identity within one window: exactly
/// `limit` permits from a fresh state, for every algorithm, in client and in
/// server time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_over_four_connections_admit_exactly_the_limit() {
    let server = RedisServer::spawn();
    let clock = ManualClock::new(T0 + 777);
    let mut client_stores = Vec::new();
    let mut server_stores = Vec::new();
    let (client_prefix, server_prefix) = (unique_prefix("race"), unique_prefix("race"));
    for _ in 0..4 {
        let store = RedisStore::connect(&server.url()).await.expect("connect");
        client_stores.push(
            store
                .clone()
                .with_prefix(&client_prefix)
                .with_time_source(TimeSource::Client(Arc::new(clock.clone()))),
        );
        server_stores.push(store.with_prefix(&server_prefix));
    }
    for algorithm in Algorithm::ALL {
        // A day-long window: the test cannot straddle a boundary in any practical run.
        let l = limit(algorithm, 40, 86_400_000);
        assert_eq!(admitted(&client_stores, "hot", l, 96).await, 40, "{algorithm}, client time");
        assert_eq!(admitted(&server_stores, "hot", l, 96).await, 40, "{algorithm}, server time");
    }
}

/// Concurrent all-or-nothing calls: the tighter limit decides, and the
/// looser one is charged only for the admitted calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_decide_all_charges_only_admitted_calls() {
    let server = RedisServer::spawn();
    let clock = ManualClock::new(T0 + 5);
    let prefix = unique_prefix("race-all");
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(
            RedisStore::connect(&server.url())
                .await
                .expect("connect")
                .with_prefix(&prefix)
                .with_time_source(TimeSource::Client(Arc::new(clock.clone()))),
        );
    }
    let loose = limit(Algorithm::SlidingWindowCounter, 30, 60_000);
    let tight = limit(Algorithm::Gcra, 20, 60_000);
    let mut handles = Vec::new();
    for i in 0..80 {
        let store = stores[i % 4].clone();
        handles.push(tokio::spawn(async move {
            let d = store.decide_all(&id("hot"), &[(loose, 1), (tight, 1)]).await.expect("decide_all");
            assert_eq!(d[0].allowed && d[1].allowed, d[1].allowed, "the loose limit never denies here");
            d[1].allowed
        }));
    }
    let mut allowed = 0;
    for h in handles {
        allowed += u64::from(h.await.expect("task"));
    }
    assert_eq!(allowed, 20);
    assert_eq!(stores[0].decide_one(&id("hot"), &loose, 0).await.expect("peek").remaining, 10);
}

async fn noscript_errors(server: &RedisServer) -> u64 {
    let info: String =
        redis::cmd("INFO").arg("errorstats").query_async(&mut admin(server).await).await.expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("errorstat_NOSCRIPT:count="))
        .map_or(0, |n| n.trim().parse().expect("a count"))
}

/// SCRIPT FLUSH in the middle of a run: the next call meets NOSCRIPT, the
/// store loads the script again and the counts go on where they were.
#[tokio::test]
async fn script_flush_mid_run_reloads_and_keeps_counting() {
    let server = RedisServer::spawn();
    let clock = ManualClock::new(T0 + 100);
    let store = client_time_store(&server, &clock, "flush").await;
    let l = limit(Algorithm::SlidingWindowCounter, 25, 60_000);
    let other = limit(Algorithm::SlidingLog, 25, 60_000);
    let mut expected_remaining = 25;
    for round in 0..3 {
        for _ in 0..5 {
            expected_remaining -= 1;
            let d = store.decide_one(&id("flush"), &l, 1).await.expect("decide after SCRIPT FLUSH");
            assert_eq!((d.allowed, d.remaining), (true, expected_remaining), "round {round}");
        }
        // Two charges: decide_all.lua (a peek at the first limit charges nothing).
        let all = store
            .decide_all(&id("flush"), &[(other, 1), (l, 0)])
            .await
            .expect("decide_all after SCRIPT FLUSH");
        assert_eq!(all[0].remaining, 24 - round);
        let _: () =
            redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut admin(&server).await).await.expect("FLUSH");
    }
    // Each flush cost one NOSCRIPT per script used afterwards, then no more.
    assert_eq!(noscript_errors(&server).await, 4);
    assert_eq!(store.decide_one(&id("flush"), &l, 1).await.expect("decide").remaining, 9);
    assert_eq!(noscript_errors(&server).await, 5);
    assert_eq!(store.decide_one(&id("flush"), &l, 1).await.expect("decide").remaining, 8);
    assert_eq!(noscript_errors(&server).await, 5);
}

/// A restarted Redis has neither the state nor the scripts: once the
/// connection is back, the store decides again, from scratch.
#[tokio::test]
async fn decisions_resume_after_a_restart() {
    let mut server = RedisServer::spawn();
    let clock = ManualClock::new(T0);
    let store = client_time_store(&server, &clock, "restart").await;
    let l = limit(Algorithm::FixedWindow, 5, 60_000);
    for remaining in [4, 3, 2] {
        assert_eq!(store.decide_one(&id("r"), &l, 1).await.expect("decide").remaining, remaining);
    }
    server.restart();
    let mut result = store.decide_one(&id("r"), &l, 1).await;
    // Up to 10 s for the connection manager to reconnect on a loaded machine.
    for _ in 0..500 {
        match &result {
            Err(e) if e.is_unavailable() => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                result = store.decide_one(&id("r"), &l, 1).await;
            }
            _ => break,
        }
    }
    let d = result.expect("the store reconnects and reloads its scripts");
    assert_eq!((d.allowed, d.remaining), (true, 4), "a restarted server starts empty");
}

/// In server time two stores (two app servers) share one clock: the
/// decisions continue each other's and the reset values are sane.
#[tokio::test]
async fn server_time_is_shared_by_every_store() {
    let server = RedisServer::spawn();
    let prefix = unique_prefix("server-time");
    let a = RedisStore::connect(&server.url()).await.expect("connect").with_prefix(&prefix);
    let b = RedisStore::connect(&server.url()).await.expect("connect").with_prefix(&prefix);
    assert!(matches!(a.time_source(), TimeSource::Server));
    let minute = 60_000;
    for algorithm in Algorithm::ALL {
        let l = limit(algorithm, 6, minute);
        for (i, store) in [&a, &b, &a, &b, &b, &a].into_iter().enumerate() {
            let d = store.decide_one(&id("shared"), &l, 1).await.expect("decide");
            assert_eq!((d.allowed, d.remaining), (true, 5 - i as u64), "{algorithm}");
            let reset = d.reset_after.as_millis() as u64;
            let max = if algorithm == Algorithm::SlidingWindowCounter { 2 * minute } else { minute };
            assert!(reset > 0 && reset <= max, "{algorithm}: reset_after {reset} ms");
        }
        let d = b.decide_one(&id("shared"), &l, 1).await.expect("decide");
        assert!(!d.allowed, "{algorithm}");
        let retry = d.retry_after.expect("retry_after").as_millis() as u64;
        assert!(retry > 0 && retry <= 2 * minute, "{algorithm}: retry_after {retry} ms");
    }
}

/// `keys_for` names the keys the scripts write, and each algorithm keeps
/// the compact layout: one short string, or one sorted set.
#[tokio::test]
async fn keys_for_names_the_one_key_each_algorithm_writes() {
    let server = RedisServer::spawn();
    let clock = ManualClock::new(T0);
    let store = RedisStore::connect(&server.url())
        .await
        .expect("connect")
        .with_time_source(TimeSource::Client(Arc::new(clock.clone())));
    assert_eq!(store.prefix(), "slidegate:");
    let mut conn = admin(&server).await;
    for (algorithm, tag, kind, encoding) in [
        (Algorithm::SlidingWindowCounter, "swc", "string", "embstr"),
        (Algorithm::FixedWindow, "fw", "string", "embstr"),
        (Algorithm::SlidingLog, "log", "zset", "listpack"),
        (Algorithm::TokenBucket, "tb", "string", "embstr"),
        (Algorithm::Gcra, "gcra", "string", "embstr"),
    ] {
        let l = limit(algorithm, 100, 60_000);
        assert!(store.decide_one(&id("user-42"), &l, 0).await.expect("peek").allowed);
        let keys = store.keys_for(&id("user-42"), &l);
        assert_eq!(keys, [format!("slidegate:{{t:n:user-42}}:{tag}:100:60000")]);
        let exists: i64 = redis::cmd("EXISTS").arg(&keys[0]).query_async(&mut conn).await.expect("EXISTS");
        assert_eq!(exists, 0, "{algorithm}: a cost-0 peek writes nothing");
        store.decide_one(&id("user-42"), &l, 3).await.expect("decide");
        let t: String = redis::cmd("TYPE").arg(&keys[0]).query_async(&mut conn).await.expect("TYPE");
        let e: String =
            redis::cmd("OBJECT").arg("ENCODING").arg(&keys[0]).query_async(&mut conn).await.expect("OBJECT");
        assert_eq!((t.as_str(), e.as_str()), (kind, encoding), "{algorithm}");
    }
    let dbsize: i64 = redis::cmd("DBSIZE").query_async(&mut conn).await.expect("DBSIZE");
    assert_eq!(dbsize, 5);
}

/// A sliding log's key lives until its newest entry expires, even when a
/// write comes from a clock that stepped back (a failover to a server 60 s
/// behind, an NTP step): timed from now, the key expired while permits
/// stamped later still counted, and Redis then allowed what the embedded
/// store denied.
#[tokio::test]
async fn a_sliding_log_key_outlives_its_newest_entry_after_a_clock_step_back() {
    let server = RedisServer::spawn();
    let clock = ManualClock::new(T0 + 60_000);
    let store = client_time_store(&server, &clock, "log-step").await;
    let l = limit(Algorithm::SlidingLog, 3, 1000);
    assert!(store.decide_one(&id("a"), &l, 2).await.expect("decide").allowed);
    clock.set(T0);
    let d = store.decide_one(&id("a"), &l, 1).await.expect("decide");
    assert!(d.allowed);
    // The entries at T0 + 60 s count until T0 + 61 s: 61 s on this clock.
    let key = &store.keys_for(&id("a"), &l)[0];
    let ttl = pttl(&server, key).await;
    let want = 61_000 + CLIENT_TTL_SLACK_MS;
    assert!(ttl > want - TOLERANCE_MS && ttl <= want, "PTTL {ttl} ms, want about {want}");
}

/// After the client's clock steps back 30 s (three windows), every
/// algorithm's key still outlives its state by the slack — the refusal
/// there lengthens it, though it writes no state. Before, the counter and
/// the fixed window kept their first write's expiry (PTTL 12 s while the
/// state mattered 32 s more) and the GCRA's refusal wrote nothing: the key
/// expired early and Redis then admitted what the embedded store refused.
#[tokio::test]
async fn every_key_outlives_its_state_after_a_client_clock_steps_back() {
    let server = RedisServer::spawn();
    let clock = ManualClock::new(T0 + 60_000);
    let store = client_time_store(&server, &clock, "step-back").await;
    for algorithm in Algorithm::ALL {
        clock.set(T0 + 60_000);
        let l = limit(algorithm, 3, 10_000);
        let who = id(algorithm.name());
        assert!(store.decide_one(&who, &l, 3).await.expect("decide").allowed, "{algorithm}");
        clock.set(T0 + 30_000);
        let d = store.decide_one(&who, &l, 1).await.expect("decide");
        assert!(!d.allowed, "{algorithm}: the permits charged 30 s later still count");
        let key = &store.keys_for(&who, &l)[0];
        let ttl = pttl(&server, key).await;
        let want = d.reset_after.as_millis() as i64 + CLIENT_TTL_SLACK_MS;
        assert!(d.reset_after >= Duration::from_secs(30), "{algorithm}: {d:?}");
        assert!(
            ttl > want - TOLERANCE_MS && ttl <= want,
            "{algorithm} {key}: PTTL {ttl} ms, want about {want}"
        );
    }
}

// ------------------------------------------------ deadlines and outages

/// Generous room over a deadline for a machine whose cores are busy: the
/// point is "well under a second or two", not ~9.5 s of reconnect back-off.
const SLACK: Duration = Duration::from_millis(1_500);

/// Waits (up to 10 s) until `store` decides again after an outage.
async fn until_it_decides(store: &RedisStore, l: Limit) -> slidegate::Decision {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match store.decide_one(&id("probe"), &l, 0).await {
            Ok(d) => return d,
            Err(e) if std::time::Instant::now() < deadline => {
                assert!(e.is_unavailable(), "{e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("the store did not decide again within 10 s: {e}"),
        }
    }
}

/// A dead Redis costs each caller at most the deadline, however many wait
/// at once: no caller waits on a reconnect in progress, and once the loss is
/// known calls fail at once. (Before, each call waited ~9.5 s of back-off.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_redis_fails_every_concurrent_call_within_the_deadline() {
    let mut server = RedisServer::spawn();
    let store = RedisStore::connect(&server.url()).await.expect("connect").with_prefix(unique_prefix("dead"));
    assert_eq!(store.timeout(), Duration::from_millis(250));
    let l = limit(Algorithm::SlidingWindowCounter, 100, 60_000);
    store.decide_one(&id("k"), &l, 1).await.expect("decide while up");
    server.kill();
    for round in 0..3 {
        let mut calls = Vec::new();
        for i in 0..32 {
            let store = store.clone();
            calls.push(tokio::spawn(async move {
                let start = std::time::Instant::now();
                let result = store.decide_one(&id(&format!("k{i}")), &l, 1).await;
                (start.elapsed(), result)
            }));
        }
        let mut slowest = Duration::ZERO;
        for call in calls {
            let (took, result) = call.await.expect("task");
            let err = result.expect_err("Redis is dead");
            assert!(err.is_unavailable(), "{err}");
            slowest = slowest.max(took);
        }
        eprintln!("round {round}: slowest of 32 concurrent calls on a dead Redis took {slowest:?}");
        assert!(slowest < store.timeout() + SLACK, "round {round}: a call took {slowest:?}");
    }
    // Known down now: the calls fail before sending anything.
    let err = store.decide_one(&id("k"), &l, 1).await.expect_err("still dead");
    assert!(matches!(err, slidegate::StoreError::Unavailable(Unavailable::NotConnected(_))), "{err}");
    assert!(!err.may_have_charged());
}

/// Connecting to a port nobody listens on, or to one that accepts but never
/// answers, fails within the connect deadline instead of retrying for seconds.
#[tokio::test]
async fn connect_fails_within_its_deadline() {
    // A closed port: bound a moment ago, then released.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr");
    let start = std::time::Instant::now();
    let err = RedisStore::connect(&format!("redis://{closed}/")).await.expect_err("nothing listens");
    assert!(err.is_unavailable(), "{err}");
    assert!(start.elapsed() < Duration::from_millis(500) + SLACK, "refused after {:?}", start.elapsed());

    // A listener that never accepts: the kernel completes the TCP handshake,
    // then nothing answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = silent.local_addr().expect("addr");
    let options = slidegate::RedisOptions::new().with_connect_timeout(Duration::from_millis(300));
    let start = std::time::Instant::now();
    let err = RedisStore::connect_with(&format!("redis://{addr}/"), options).await.expect_err("no answer");
    assert!(err.is_unavailable(), "{err}");
    assert!(start.elapsed() < Duration::from_millis(600) + SLACK, "gave up after {:?}", start.elapsed());
    drop(silent);
}

/// Calls made while the store knows Redis is down never reach Redis: when
/// Redis is back they have charged nothing (none is queued and replayed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_while_redis_is_down_are_never_charged() {
    let mut server = RedisServer::spawn();
    let store = RedisStore::connect(&server.url()).await.expect("connect").with_prefix(unique_prefix("down"));
    let l = limit(Algorithm::FixedWindow, 50, 3_600_000);
    server.kill();
    // The first call may be the one that finds the connection gone; the
    // ones after it fail without being sent.
    let _ = store.decide_one(&id("victim"), &l, 1).await;
    let mut unsent = 0;
    for _ in 0..20 {
        let err = store.decide_one(&id("victim"), &l, 1).await.expect_err("Redis is dead");
        assert!(!err.may_have_charged(), "{err}");
        unsent += 1;
    }
    server.restart();
    until_it_decides(&store, l).await;
    let d = store.decide_one(&id("victim"), &l, 0).await.expect("peek");
    assert_eq!(d.remaining, 50, "{unsent} unsent calls must charge nothing");
}

/// A Redis that stalls past the deadline (SIGSTOP): the calls time out, but
/// they were sent, and a stalled Redis runs them when it resumes. The bound
/// the `Store` docs promise: an identity is charged at most the calls that
/// timed out (here, in practice, exactly those: each was written before the
/// stall ended), never more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_timed_out_on_a_stalled_redis_charge_at_most_themselves() {
    let mut server = RedisServer::spawn();
    let store = RedisStore::connect(&server.url())
        .await
        .expect("connect")
        .with_prefix(unique_prefix("stall"))
        .with_timeout(Duration::from_millis(200));
    let l = limit(Algorithm::SlidingLog, 100, 3_600_000);
    assert_eq!(store.decide_one(&id("victim"), &l, 1).await.expect("decide").remaining, 99);
    server.pause();
    let mut timed_out = 0;
    for _ in 0..8 {
        let start = std::time::Instant::now();
        let err = store.decide_one(&id("victim"), &l, 1).await.expect_err("Redis is stalled");
        assert!(matches!(err, slidegate::StoreError::Unavailable(Unavailable::TimedOut(_))), "{err}");
        assert!(err.may_have_charged());
        assert!(start.elapsed() < Duration::from_millis(200) + SLACK, "took {:?}", start.elapsed());
        timed_out += 1;
    }
    server.resume();
    let d = until_it_decides(&store, l).await;
    let charged = 99 - store.decide_one(&id("victim"), &l, 0).await.expect("peek").remaining;
    eprintln!("{timed_out} calls timed out on a stalled Redis; {charged} were charged after it resumed");
    assert!(charged <= timed_out, "charged {charged} for {timed_out} timed-out calls");
    let _ = d;
}

/// `SCRIPT FLUSH` hammered while decisions run: no call fails with
/// `NOSCRIPT`, and exactly the limit is admitted (no call charged twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn script_flush_storm_fails_no_call_and_charges_none_twice() {
    let server = RedisServer::spawn();
    let store = RedisStore::connect(&server.url())
        .await
        .expect("connect")
        .with_prefix(unique_prefix("storm"))
        // Generous: this test is about NOSCRIPT, not about a busy machine.
        .with_timeout(Duration::from_secs(10));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flusher = {
        let stop = Arc::clone(&stop);
        let mut conn = admin(&server).await;
        tokio::spawn(async move {
            let mut flushes = 0u32;
            // Bounded in count as well as by the flag.
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && flushes < 20_000 {
                let _: () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut conn).await.expect("FLUSH");
                flushes += 1;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            flushes
        })
    };
    let single = limit(Algorithm::SlidingWindowCounter, 60, 3_600_000);
    let (loose, tight) =
        (limit(Algorithm::TokenBucket, 1_000, 3_600_000), limit(Algorithm::Gcra, 40, 3_600_000));
    let mut calls = Vec::new();
    for i in 0..300 {
        let store = store.clone();
        calls.push(tokio::spawn(async move {
            // Spread the calls over the flushes rather than all before the first.
            tokio::time::sleep(Duration::from_millis(i % 60)).await;
            if i % 2 == 0 {
                store.decide_one(&id("hot"), &single, 1).await.map(|d| (0, d.allowed))
            } else {
                store.decide_all(&id("hot"), &[(loose, 1), (tight, 1)]).await.map(|d| (1, d[1].allowed))
            }
        }));
    }
    let mut admitted = [0u64; 2];
    for call in calls {
        let (which, allowed) = call.await.expect("task").expect("no call fails under SCRIPT FLUSH");
        admitted[which] += u64::from(allowed);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let flushes = flusher.await.expect("flusher");
    let noscript = noscript_errors(&server).await;
    eprintln!("{flushes} flushes, {noscript} NOSCRIPT replies, all handled");
    assert_eq!(admitted, [60, 40]);
    assert_eq!(
        store.decide_one(&id("hot"), &loose, 0).await.expect("peek").remaining,
        960,
        "charged once per admitted call"
    );
}
