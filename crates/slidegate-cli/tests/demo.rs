//! `slidegate demo --json` on both stores: the article's experiments give the
//! figures the README promises, and the Redis run leaves nothing behind.

use std::process::Command;

use serde_json::Value;
use slidegate_test_redis::RedisServer;

fn demo(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .arg("demo")
        .args(["--json", "--identities", "2000"])
        .args(args)
        .output()
        .expect("run slidegate demo");
    assert!(out.status.success(), "demo failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("demo --json prints one JSON object")
}

fn assert_experiments(report: &Value, store: &str) {
    assert_eq!(report["store"], store);
    let burst = &report["boundary_burst"];
    assert_eq!(
        (burst["limit"].as_u64(), burst["window_ms"].as_u64(), burst["sent"].as_u64()),
        (Some(100), Some(60_000), Some(200))
    );
    let allowed = &burst["allowed"];
    assert_eq!(allowed["fixed_window"], 200);
    assert_eq!(allowed["sliding_window_counter"], 100);
    assert_eq!(allowed["sliding_log"], 100);
    assert_eq!(allowed["token_bucket"], 100);
    assert_eq!(allowed["gcra"], 100);
    let memory = &report["memory"];
    for algorithm in ["sliding_window_counter", "fixed_window", "sliding_log", "token_bucket", "gcra"] {
        let bytes = memory[algorithm]["bytes_per_identity"].as_u64().expect("bytes_per_identity is a number");
        assert!(bytes > 0 && bytes < 1000, "{algorithm}: {bytes} B per identity");
    }
    let one = |a: &str| memory[a]["bytes_one_identity_after_10000_requests"].as_u64().expect("a number");
    // 10,000 timestamps against two counters: the log is orders of magnitude larger.
    assert!(one("sliding_log") > 80_000, "log: {} B", one("sliding_log"));
    assert!(one("sliding_log") > 100 * one("sliding_window_counter"));
}

#[test]
fn embedded_demo_reproduces_the_article() {
    let report = demo(&[]);
    assert_experiments(&report, "memory");
    assert_eq!(report["memory"]["sliding_log"]["memory_usage_one_identity"], Value::Null);
    assert!(report["boundary_burst"].get("reference_script").is_none());
}

#[test]
fn redis_demo_reproduces_the_article_and_cleans_up() {
    let server = RedisServer::spawn();
    let report = demo(&["--redis-url", &server.url()]);
    assert_experiments(&report, "redis");
    // The article's script admits one more at the boundary (estimate < limit).
    assert_eq!(report["boundary_burst"]["reference_script"], 101);
    let usage =
        report["memory"]["sliding_log"]["memory_usage_one_identity"].as_u64().expect("MEMORY USAGE on Redis");
    assert!(usage > 500_000, "a sorted set of 10,000 entries: {usage} B");
    let out = Command::new("redis-cli")
        .args(["-p", &server.port().to_string(), "DBSIZE"])
        .output()
        .expect("redis-cli");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0", "the demo left keys behind");
}
