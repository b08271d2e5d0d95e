//! `slidegate demo --json` on both stores: the article's experiments give the
//! figures the README promises, and the Redis run leaves nothing behind.

#![allow(clippy::unwrap_used)]

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
    // Piped, stderr gets no progress bar: nothing at all.
    assert_eq!(String::from_utf8_lossy(&out.stderr), "", "piped stderr carries no progress");
    serde_json::from_slice(&out.stdout).expect("demo --json prints one JSON object")
}

fn redis_cli(server: &RedisServer, args: &[&str]) -> String {
    let out = Command::new("redis-cli").args(["-p", &server.port().to_string()]).args(args).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
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
    // A plain Redis has no module: `auto` chose the Lua scripts, and says so.
    assert_eq!((&report["engine"], &report["engine_setting"]), (&Value::from("lua"), &Value::from("auto")));
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

/// Piped text output is the report alone: no progress bar, no carriage
/// return or escape sequence, on stdout or stderr; the engine `auto` chose
/// is named.
#[test]
fn piped_text_output_has_no_progress_and_names_the_engine() {
    let server = RedisServer::spawn();
    let out = Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .args(["demo", "--identities", "200", "--redis-url", &server.url()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("slidegate demo on the Redis, engine lua (chosen by auto)\n"), "{text}");
    assert!(!text.contains(['\r', '\u{1b}', '█']), "{text:?}");
}

/// A failure mid-run (here Redis refusing `MEMORY USAGE`, which the memory
/// experiment asks after the boundary burst) prints what was measured
/// before it, then the error, and exits 1; the keys are gone.
#[test]
fn a_failure_mid_run_prints_what_was_measured_before() {
    let server = RedisServer::spawn();
    assert_eq!(redis_cli(&server, &["ACL", "SETUSER", "default", "-memory"]), "OK");
    for json in [true, false] {
        let mut args = vec!["demo", "--identities", "200", "--timeout", "10"];
        if json {
            args.push("--json");
        }
        let out = Command::new(env!("CARGO_BIN_EXE_slidegate"))
            .args(&args)
            .args(["--redis-url", &server.url()])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("no permissions to run the 'memory|usage' command"), "{stderr}");
        if json {
            let report: Value = serde_json::from_slice(&out.stdout).expect("the partial report");
            assert_eq!(report["boundary_burst"]["allowed"]["sliding_window_counter"], 100);
            assert_eq!(report["boundary_burst"]["reference_script"], 101);
            assert_eq!(report["memory"], serde_json::json!({}));
            let error = report["error"].as_str().unwrap();
            assert!(stderr.contains(error), "{stderr}");
        } else {
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.contains("100 of 200  = the limit"), "{text}");
            assert!(text.contains("\nStopped before the end: "), "{text}");
            assert!(!text.contains("B. Memory"), "{text}");
        }
        assert_eq!(redis_cli(&server, &["DBSIZE"]), "0", "the demo left keys behind");
    }
}
