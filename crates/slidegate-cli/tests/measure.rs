//! `slidegate accuracy --json` and `slidegate bench redis --json` print the
//! JSON that BENCHMARKS.md reads. Tiny runs: these check shapes and invariants,
//! never timings.

use std::process::Command;

use serde_json::Value;
use slidegate_test_redis::RedisServer;

/// EX_USAGE (sysexits.h): what `bench redis` exits with when it refuses a target.
const EX_USAGE: i32 = 64;

const ALGORITHMS: [&str; 5] =
    ["sliding_window_counter", "fixed_window", "sliding_log", "token_bucket", "gcra"];

fn slidegate(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_slidegate")).args(args).output().expect("run slidegate");
    assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("one JSON object on stdout")
}

#[test]
fn accuracy_json_scores_every_algorithm_and_the_exact_log_is_exact() {
    let args = ["accuracy", "--json", "--requests", "30000", "--sources", "300", "--seed", "9"];
    let report = slidegate(&args);
    assert_eq!(report["requests"], 30_000);
    assert_eq!(report["sources"], 300);
    for name in ALGORITHMS {
        let a = &report["algorithms"][name];
        for field in ["wrongly_allowed_pct", "wrongly_denied_pct"] {
            assert!(a[field].as_f64().is_some_and(|v| (0.0..=100.0).contains(&v)), "{name}.{field}: {a}");
        }
        assert!(a["avg_rate_diff_pct"].as_f64().is_some_and(|v| v >= 0.0), "{name}: {a}");
    }
    let exact = &report["algorithms"]["sliding_log"];
    assert_eq!(
        (exact["wrongly_allowed_pct"].as_f64(), exact["wrongly_denied_pct"].as_f64()),
        (Some(0.0), Some(0.0))
    );
    assert_eq!(exact["avg_rate_diff_pct"].as_f64(), Some(0.0));
    // Boundary attackers get twice the limit through the fixed window.
    assert!(
        report["algorithms"]["fixed_window"]["classes"]["boundary_attacker"]["wrongly_allowed_pct"].as_f64()
            > Some(40.0)
    );
    // With leases on (3 instances by default): the two algorithms that
    // lease, never over-admitting, and the leaseless total beside them.
    let leases = &report["leases"];
    assert_eq!(leases["instances"], 3);
    let leased: Vec<&String> = leases["algorithms"].as_object().unwrap().keys().collect();
    assert_eq!(leased, ["fixed_window", "sliding_window_counter"]);
    for name in leased {
        let l = &leases["algorithms"][name];
        assert_eq!(l["over_admitted"], 0, "{name}: {l}");
        assert_eq!(l["allowed_without_leases"], report["algorithms"][name]["allowed"], "{name}");
        assert!(l["from_leases"].as_u64() > Some(0), "{name}: {l}");
    }
    assert_eq!(slidegate(&args), report, "the same seed gives the same figures");
}

#[test]
fn bench_redis_json_reports_every_algorithm_and_the_reference_script() {
    let server = RedisServer::spawn();
    let url = server.url();
    let mut conn = redis::Client::open(url.as_str()).and_then(|c| c.get_connection()).expect("connect");
    // Someone else's key, under the prefix the bench used before its keys
    // were its own: the run must leave it alone.
    let theirs = "sgb:0:{id1}:swc:100:60000";
    let _: () = redis::cmd("SET").arg(theirs).arg("kept").query(&mut conn).expect("SET");
    let report = slidegate(&[
        "bench",
        "redis",
        "--redis-url",
        &url,
        "--json",
        "--seconds",
        "0.1",
        "--identities",
        "200",
        "--memory-identities",
        "200",
        "--connections",
        "1",
        "--in-flight",
        "4",
        "--no-redis-benchmark",
    ]);
    let fields = ["decisions_per_sec", "p50_us", "p99_us", "server_us_per_decision", "bytes_per_identity"];
    for name in ALGORITHMS {
        for field in fields {
            assert!(report["algorithms"][name][field].is_number(), "{name}.{field}: {report}");
        }
        assert!(report["algorithms"][name]["decisions_per_sec"].as_f64() > Some(0.0));
        assert!(report["algorithms"][name]["server_us_per_decision"].as_f64() > Some(0.0));
    }
    for field in fields {
        assert!(report["reference_script"][field].is_number(), "reference_script.{field}: {report}");
    }
    assert!(report["redis_benchmark_p16_per_sec"].is_null());
    // The run deletes what it wrote, and only that.
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).expect("KEYS");
    assert_eq!(keys, [theirs], "left behind or deleted");
    let value: String = redis::cmd("GET").arg(theirs).query(&mut conn).expect("GET");
    assert_eq!(value, "kept");
    let _: () = redis::cmd("DEL").arg(theirs).query(&mut conn).expect("DEL");
    let dbsize: u64 = redis::cmd("DBSIZE").query(&mut conn).expect("DBSIZE");
    assert_eq!(dbsize, 0, "the run left keys behind");
}

#[test]
fn bench_redis_refuses_a_remote_redis() {
    let out = Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .args(["bench", "redis", "--redis-url", "redis://192.0.2.1:7000/", "--seconds", "0.1"])
        .output()
        .expect("run slidegate");
    assert_eq!(out.status.code(), Some(EX_USAGE));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a loopback address"));
}

/// `bench lease`'s four loads, tiny: the call counts are exact where they
/// can be (one per allowed request without leases, and for identities too
/// slow to lease), far fewer for the hot identity with leases, nothing
/// admitted past the limit, and no key left.
fn check_lease_report(report: &Value) {
    let run = |name: &str| &report["runs"][name];
    let per_allowed = |name: &str| run(name)["redis_calls_per_allowed"].as_f64().unwrap_or(f64::NAN);
    for name in ["hot/no_leases", "hot/leases", "ordinary/no_leases", "ordinary/leases"] {
        assert_eq!(run(name)["allowed"], run(name)["requests"], "{name}: far under the limit: {report}");
        assert_eq!(run(name)["within_limit"], true, "{name}: {report}");
    }
    assert_eq!(run("hot/no_leases")["requests"], 1000, "{report}");
    assert_eq!(per_allowed("hot/no_leases"), 1.0, "{report}");
    assert_eq!(per_allowed("ordinary/no_leases"), 1.0, "{report}");
    // One request a second each is one in any horizon: never leased.
    assert_eq!(per_allowed("ordinary/leases"), 1.0, "{report}");
    assert!(per_allowed("hot/leases") < 0.2, "hot identity with leases: {report}");
}

#[test]
fn bench_lease_json_counts_calls_per_allowed_request_and_cleans_up() {
    let server = RedisServer::spawn();
    let url = server.url();
    let report = slidegate(&[
        "bench",
        "lease",
        "--redis-url",
        &url,
        "--json",
        "--seconds",
        "0.5",
        "--hot-rate",
        "2000",
        "--ordinary",
        "100",
    ]);
    assert_eq!((report["store"].as_str(), report["masters"].as_u64()), (Some("redis"), Some(1)), "{report}");
    check_lease_report(&report);
    let mut conn = redis::Client::open(url.as_str()).and_then(|c| c.get_connection()).expect("connect");
    let dbsize: u64 = redis::cmd("DBSIZE").query(&mut conn).expect("DBSIZE");
    assert_eq!(dbsize, 0, "the run left keys behind");
}

#[test]
fn bench_lease_on_a_cluster_reads_every_master() {
    let cluster = slidegate_test_redis::RedisCluster::shared();
    let report = slidegate(&[
        "bench",
        "lease",
        "--redis-cluster",
        &cluster.urls().join(","),
        "--json",
        "--seconds",
        "0.5",
        "--hot-rate",
        "2000",
        "--ordinary",
        "100",
    ]);
    assert_eq!(
        (report["store"].as_str(), report["masters"].as_u64()),
        (Some("cluster"), Some(3)),
        "{report}"
    );
    check_lease_report(&report);
    for port in cluster.masters() {
        let left = cluster.cli(port, &["--scan"]);
        assert!(left.lines().all(|k| !k.contains("lease")), "bench left keys on {port}: {left}");
    }
}

#[test]
fn bench_lease_refuses_a_remote_redis_and_two_targets() {
    for args in [
        &["--redis-url", "redis://192.0.2.1:7000/"][..],
        &["--redis-cluster", "redis://127.0.0.1:7001,redis://192.0.2.1:7002"][..],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_slidegate"))
            .args(["bench", "lease", "--seconds", "0.1"])
            .args(args)
            .output()
            .expect("run slidegate");
        assert_eq!(out.status.code(), Some(EX_USAGE), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("not a loopback address"), "{args:?}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .args([
            "bench",
            "lease",
            "--redis-url",
            "redis://127.0.0.1:1/",
            "--redis-cluster",
            "redis://127.0.0.1:2",
        ])
        .output()
        .expect("run slidegate");
    assert_eq!(out.status.code(), Some(2), "a usage error");
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"), "{out:?}");
}

#[test]
fn bench_lease_serve_drives_three_serve_processes() {
    let server = RedisServer::spawn();
    let url = server.url();
    let report = slidegate(&[
        "bench",
        "lease",
        "--redis-url",
        &url,
        "--serve",
        "--json",
        "--seconds",
        "0.5",
        "--hot-rate",
        "1000",
        "--ordinary",
        "50",
    ]);
    assert_eq!(report["instances_are"], "serve processes", "{report}");
    let run = |name: &str| &report["runs"][name];
    for name in ["hot/no_leases", "hot/leases", "ordinary/no_leases", "ordinary/leases"] {
        assert_eq!(run(name)["allowed"], run(name)["requests"], "{name}: {report}");
        assert_eq!(run(name)["within_limit"], true, "{name}: {report}");
    }
    assert_eq!(
        (run("hot/leases")["requests"].as_u64(), run("ordinary/leases")["requests"].as_u64()),
        (Some(500), Some(25))
    );
    // Each instance sees a third of 1,000 a second: 16 in a 50 ms horizon.
    let hot = run("hot/leases")["redis_calls_per_allowed"].as_f64().unwrap_or(f64::NAN);
    assert!(hot < 0.5, "{report}");
    let mut conn = redis::Client::open(url.as_str()).and_then(|c| c.get_connection()).expect("connect");
    let left: Vec<String> = redis::cmd("KEYS").arg("lease*").query(&mut conn).expect("KEYS");
    assert!(left.is_empty(), "the run left keys behind: {left:?}");
}
