//! Scrapers hammering far above their limit: once the store has denied an
//! identity, its further requests are refused by the process itself, so
//! Redis does not pay for the attack.

use std::time::Duration;

use crate::common::*;

/// Calls of `EVALSHA` and `EVAL` that `INFO commandstats` counts so far.
fn script_calls(redis: &RedisServer) -> u64 {
    let stats = redis.command_stats();
    stats.calls("evalsha") + stats.calls("eval")
}

/// Decisions this instance asked of the store. Redis's own script count
/// also holds the background polls of the shared tables (overrides, penalty
/// lifts: one a second each), which no request causes.
fn store_calls(sg: &Slidegate) -> u64 {
    sg.metric("slidegate_store_calls_total") as u64
}

fn scraper_config(upstream: &Upstream, redis: &RedisServer, deny_cache: usize) -> String {
    let store = format!("{}deny_cache = {deny_cache}\n", redis_decides(redis));
    format!(
        r#"{head}
[[rules]]
name = "trending"
path = "/api/videos/trending"
limits = [{{ limit = 10, window = "1m", algorithm = "sliding_window_counter" }}]
"#,
        head = keyed_head(upstream.addr, "admin_on_public = true", &store),
    )
}

/// A denial's `Retry-After` and its `RateLimit` reset (`t=`), in seconds.
type Waits = (u64, u64);

/// Sends `n` requests of one API key; returns the statuses and the waits
/// each denial announced.
fn scrape(sg: &Slidegate, n: usize) -> (Vec<u16>, Vec<Waits>) {
    let mut statuses = Vec::with_capacity(n);
    let mut waits = Vec::new();
    for _ in 0..n {
        let reply = sg.get("/api/videos/trending", &[("x-api-key", "scraper")]);
        if reply.status == 429 {
            let retry = reply.header("retry-after").unwrap().parse().unwrap();
            let ratelimit = reply.header("ratelimit").unwrap();
            let reset =
                ratelimit.strip_prefix("\"trending\";r=0;t=").unwrap_or_else(|| panic!("{ratelimit}"));
            waits.push((retry, reset.parse().unwrap()));
            assert_eq!(reply.header("ratelimit-policy").unwrap(), "\"trending\";q=10;w=60");
        }
        statuses.push(reply.status);
    }
    (statuses, waits)
}

/// One identity at 50× its limit (500 requests against 10 a minute): after
/// its first denial, at most 1% of its requests reach Redis (here none of
/// them), and each local refusal carries the store's headers.
#[test]
fn a_scraper_at_50x_its_limit_costs_redis_at_most_one_percent_after_its_first_denial() {
    let redis = RedisServer::spawn();
    let upstream = Upstream::start();
    let sg = Slidegate::start(&scraper_config(&upstream, &redis, 4096));
    let before = script_calls(&redis);
    let (statuses, waits) = scrape(&sg, 500);
    let calls = store_calls(&sg);
    println!("500 requests at 50x the limit: {calls} store calls");
    assert!(script_calls(&redis) - before >= calls, "each store call is a script call in Redis");

    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 10);
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 490);
    assert_eq!(upstream.hits(), 10, "no denial reached the upstream");
    // 10 admissions and the first denial are the store's; of the 489 after, at most 1%.
    let after_first_denial = 489;
    assert!(calls <= 11 + after_first_denial / 100, "{calls} script calls for 500 requests");
    assert_eq!(sg.metric("slidegate_deny_cache_hits_total") as u64, 500 - calls);
    // Retry-After counts down from the store's (never up) and stays within the window.
    assert!(waits.windows(2).all(|w| w[1].0 <= w[0].0 && w[1].1 <= w[0].1), "{waits:?}");
    let (first, last) = (waits[0], *waits.last().unwrap());
    // A sliding window counter's wait is up to a window and a permit's
    // share of it (66 s), its full reset up to two windows.
    assert!(first.0 <= 66 && first.1 <= 120 && last.0 >= 1, "{waits:?}");
}

/// The same attack with the cache off: every request is a script call (the
/// count above is the cache's doing, not an artefact of the measurement).
#[test]
fn without_the_deny_cache_every_denial_is_a_script_call() {
    let redis = RedisServer::spawn();
    let upstream = Upstream::start();
    let sg = Slidegate::start(&scraper_config(&upstream, &redis, 0));
    let before = script_calls(&redis);
    let (statuses, _) = scrape(&sg, 100);
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 90);
    assert_eq!(store_calls(&sg), 100);
    assert!(script_calls(&redis) - before >= 100);
    assert_eq!(sg.metric("slidegate_deny_cache_hits_total"), 0.0);
}

fn penalty_config(upstream: &Upstream, store: &str, shadow: bool) -> String {
    format!(
        r#"{head}
[[rules]]
name = "trending"
path = "/api/videos/trending"
shadow = {shadow}
limits = [{{ limit = 2, window = "1s", algorithm = "sliding_window_counter" }}]
penalty = {{ after = 3, within = "1m", block = "4s", max_block = "1m" }}
"#,
        head = keyed_head(upstream.addr, "admin_on_public = true", store),
    )
}

const ABNORMAL: &str = "https://iana.org/assignments/http-problem-types#abnormal-usage-detected";

fn is_block(reply: &Reply) -> bool {
    reply.status == 429 && reply.body.contains(ABNORMAL)
}

/// Sends the scraper's requests until one is refused as a block; returns the
/// quota denials before it and the block's reply.
fn until_blocked(sg: &Slidegate) -> (usize, Reply) {
    let mut quota_denials = 0;
    for _ in 0..200 {
        let reply = sg.get("/api/videos/trending", &[("x-api-key", "scraper")]);
        if is_block(&reply) {
            return (quota_denials, reply);
        }
        if reply.status == 429 {
            assert!(reply.body.contains("quota-exceeded"), "{reply:?}");
            quota_denials += 1;
        }
    }
    panic!("never blocked");
}

/// An identity denied more than 3 times is blocked for 4 s through
/// instance A; instance B, sharing the Redis, refuses it too: one store call
/// to learn of the block, then none while it lasts; both let it in again
/// once the block has ended.
#[test]
fn a_block_earned_on_one_instance_is_honoured_by_another_without_store_calls() {
    let redis = RedisServer::spawn();
    let upstream = Upstream::start();
    let store = redis_decides(&redis);
    let a = Slidegate::start(&penalty_config(&upstream, &store, false));
    let b = Slidegate::start(&penalty_config(&upstream, &store, false));

    let (quota_denials, block) = until_blocked(&a);
    assert_eq!(quota_denials, 3, "after = 3: the 4th denial blocks");
    let wait: u64 = block.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=4).contains(&wait), "Retry-After is the block's end: {wait}");
    assert_eq!(block.header("ratelimit").unwrap(), format!("\"trending\";r=0;t={wait}"));

    // B learns of the block with one store call…
    let (a_before, b_before) = (store_calls(&a), store_calls(&b));
    assert!(is_block(&b.get("/api/videos/trending", &[("x-api-key", "scraper")])));
    assert_eq!(store_calls(&b) - b_before, 1, "B's first lookup");
    // …then neither instance asks Redis while it lasts.
    let b_before = store_calls(&b);
    for sg in [&b, &a, &b] {
        for _ in 0..10 {
            let reply = sg.get("/api/videos/trending", &[("x-api-key", "scraper")]);
            assert!(is_block(&reply), "{reply:?}");
        }
    }
    let asked = (store_calls(&a) - a_before) + (store_calls(&b) - b_before);
    assert_eq!(asked, 0, "30 refusals of a blocked identity, no store call");
    assert_eq!(b.metric("slidegate_requests_blocked_total{rule=\"trending\"}"), 21.0);
    // Another identity is not blocked.
    assert_eq!(b.get("/api/videos/trending", &[("x-api-key", "polite")]).status, 200);

    // Released after the block: the store is asked again and admits.
    wait_for("the block to end on B", Duration::from_secs(20), || {
        b.get("/api/videos/trending", &[("x-api-key", "scraper")]).status == 200
    });
    assert!(a.log.lock().unwrap().contains("identity blocked by the penalty box"));
}

/// In shadow mode the penalty box counts and logs a block and refuses nothing.
#[test]
fn a_shadow_penalty_counts_blocks_without_enforcing_them() {
    let upstream = Upstream::start();
    let sg = Slidegate::start(&penalty_config(&upstream, "", true));
    for _ in 0..10 {
        assert_eq!(sg.get("/api/videos/trending", &[("x-api-key", "scraper")]).status, 200);
    }
    assert_eq!(upstream.hits(), 10);
    assert!(sg.metric("slidegate_requests_shadow_blocked_total{rule=\"trending\"}") >= 1.0);
    assert_eq!(sg.metric("slidegate_requests_blocked_total{rule=\"trending\"}"), 0.0);
    assert!(sg.log.lock().unwrap().contains("identity blocked by the penalty box"));
}
