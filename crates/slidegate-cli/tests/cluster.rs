//! slidegate on a real local Redis Cluster and Sentinel deployment: `serve`
//! with a `cluster` or `sentinel` store, several instances holding one limit
//! together, a master killed under load, and `demo`/`bench` with
//! `--redis-cluster`.
//!
//! Clusters are expensive (six processes, ~3 s to form, ~3 s to fail over):
//! tests that only read and write share one; each test that breaks one starts
//! its own.

#![allow(clippy::unwrap_used)]

#[path = "common/mod.rs"]
mod common;

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;
use slidegate_test_redis::{RedisCluster, RedisSentinel, SecuredRedis};

/// A `serve` configuration on the store `store` (the `[store]` keys naming
/// Redis), keys under `prefix`, store calls bounded by `timeout_ms`.
fn cluster_config(upstream: &Upstream, store: &str, prefix: &str, timeout_ms: u64, on_error: &str) -> String {
    let store = format!(
        "[store]\n{store}\nprefix = \"{prefix}\"\ntimeout_ms = {timeout_ms}\non_error = \"{on_error}\"\n\
         fallback = false\nprobe_interval_ms = 100\nbreaker_trial_interval_ms = 100"
    );
    format!(
        r#"{head}
[[rules]]
name = "search"
path = "/api/search*"
limits = [{{ limit = 2, window = "60s", algorithm = "sliding_log" }}, {{ limit = 100, window = "1h", algorithm = "sliding_log" }}]

[[rules]]
name = "shared"
path = "/api/shared"
limits = [{{ limit = 100, window = "1h", algorithm = "sliding_log" }}]

[[rules]]
name = "busy"
path = "/api/busy"
limits = [{{ limit = 1000000, window = "1h" }}]
"#,
        head = keyed_head(upstream.addr, "threads = 2", &store),
    )
}

/// `cluster = [...]` naming `cluster`'s masters.
fn cluster_store(cluster: &RedisCluster) -> String {
    let seeds: Vec<String> = cluster.urls().iter().map(|u| format!("{u:?}")).collect();
    format!("cluster = [{}]", seeds.join(", "))
}

/// Every key on the node `port` (`redis-cli --scan`).
fn keys_on(cli: impl Fn(&[&str]) -> String) -> Vec<String> {
    cli(&["--scan"]).lines().filter(|l| !l.is_empty()).map(str::to_owned).collect()
}

/// Asserts that every key `cli` reaches expires (`PTTL` > 0); returns how many there were.
fn assert_every_key_expires(cli: impl Fn(&[&str]) -> String) -> usize {
    let keys = keys_on(&cli);
    for key in &keys {
        let ttl: i64 = cli(&["PTTL", key]).trim().parse().unwrap();
        assert!(ttl > 0, "key {key:?} has PTTL {ttl}: it would never expire");
    }
    keys.len()
}

// ---------------------------------------------------------------- configuration

#[test]
fn check_config_prints_a_cluster_store_without_secrets() {
    let (_dir, path) = write_config(
        "[store]\ncluster = [\"redis://admin:hunter2@127.0.0.1:7000\", \"redis://127.0.0.1:7001\"]\n\
         username = \"limiter\"\npassword_env = \"SG_TEST_REDIS_PW\"\n\n\
         [identity]\nip_hash_secret_env = \"SG_TEST_HASH_SECRET\"\n\n\
         [server]\nupstream = \"http://127.0.0.1:9000\"\n",
    );
    let out = Command::new(binary())
        .arg("check-config")
        .arg(&path)
        .env("SG_TEST_REDIS_PW", "s3cret-pw")
        .env("SG_TEST_HASH_SECRET", "shared")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.contains(
            "store Redis Cluster redis://admin:***@127.0.0.1:7000, redis://127.0.0.1:7001, user limiter, \
             password from $SG_TEST_REDIS_PW"
        ),
        "{stdout}"
    );
    assert!(!stdout.contains("hunter2") && !stdout.contains("s3cret-pw"), "{stdout}");
    // The variable unset: a located error, exit code 2.
    let out = Command::new(binary())
        .arg("check-config")
        .arg(&path)
        .env_remove("SG_TEST_REDIS_PW")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("slidegate.toml:4:16: environment variable SG_TEST_REDIS_PW is not set"),
        "{stderr}"
    );
}

#[test]
fn redis_url_and_redis_cluster_exclude_each_other() {
    for command in [&["demo"][..], &["bench", "redis"][..]] {
        let out = Command::new(binary())
            .args(command)
            .args(["--redis-url", "redis://127.0.0.1:1", "--redis-cluster", "redis://127.0.0.1:2"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("cannot be used with"), "{stderr}");
    }
    let out = Command::new(binary()).args(["bench", "redis", "--seconds", "1"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--redis-url <URL>|--redis-cluster"), "{stderr}");
}

// ---------------------------------------------------------------- serve on a cluster

#[test]
fn serve_on_a_cluster_denies_after_the_limit_with_exact_headers() {
    let cluster = RedisCluster::shared();
    let upstream = Upstream::start();
    let sg = Slidegate::start(&cluster_config(&upstream, &cluster_store(cluster), "hdr:", 2000, "deny"));
    let key = [("x-api-key", "headers-key")];

    let first = sg.get("/api/search?q=cats", &key);
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.header("ratelimit-policy"), Some("\"search-60s\";q=2;w=60, \"search-1h\";q=100;w=3600"));
    assert_eq!(first.header("ratelimit"), Some("\"search-60s\";r=1;t=60, \"search-1h\";r=99;t=3600"));
    assert_eq!(first.header("x-ratelimit-remaining"), Some("1"));
    let second = sg.get("/api/search?q=dogs", &key);
    assert_eq!(second.status, 200, "{second:?}");
    assert_eq!(second.header("ratelimit"), Some("\"search-60s\";r=0;t=60, \"search-1h\";r=98;t=3600"));
    let denied = sg.get("/api/search/users", &key);
    assert_eq!(denied.status, 429, "{denied:?}");
    assert_eq!(denied.header("retry-after"), Some("60"));
    assert_eq!(denied.header("ratelimit-policy"), Some("\"search-60s\";q=2;w=60"));
    assert_eq!(denied.header("ratelimit"), Some("\"search-60s\";r=0;t=60"));
    assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(upstream.hits(), 2);
    let log = sg.log.lock().unwrap().clone();
    assert!(log.contains("store Redis Cluster redis://127.0.0.1:"), "{log}");
}

#[test]
fn three_instances_on_one_cluster_admit_exactly_the_limit() {
    let cluster = RedisCluster::shared();
    let upstream = Upstream::start();
    // A deadline far above any stall, and failing closed: a store failure
    // could only lower the count, never raise it.
    let config = cluster_config(&upstream, &cluster_store(cluster), "many:", 5000, "deny");
    let instances: Vec<Slidegate> = (0..3).map(|_| Slidegate::start(&config)).collect();
    let addrs: Vec<_> = instances.iter().map(|sg| sg.addr).collect();
    let next = AtomicUsize::new(0);
    let (allowed, denied, other) = (AtomicUsize::new(0), AtomicUsize::new(0), Mutex::new(Vec::new()));
    const REQUESTS: usize = 1000;
    thread::scope(|scope| {
        for _ in 0..50 {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= REQUESTS {
                    return;
                }
                let reply = get(addrs[i % addrs.len()], "/api/shared", &[("x-api-key", "one-identity")]);
                match reply.status {
                    200 => allowed.fetch_add(1, Ordering::Relaxed),
                    429 => denied.fetch_add(1, Ordering::Relaxed),
                    _ => {
                        other.lock().unwrap().push(reply.status);
                        0
                    }
                };
            });
        }
    });
    let (allowed, denied) = (allowed.into_inner(), denied.into_inner());
    eprintln!("three instances, one cluster: {allowed} of {REQUESTS} admitted (limit 100)");
    assert_eq!(other.into_inner().unwrap(), Vec::<u16>::new());
    assert_eq!((allowed, denied), (100, 900));
    assert_eq!(upstream.hits(), 100);
}

#[test]
fn serve_logs_in_with_a_user_and_a_password_from_the_environment_over_tls() {
    let redis = SecuredRedis::builder()
        .password("default-pw")
        .user("limiter", "limiter-pw", "~* +@all")
        .tls()
        .start();
    // The child inherits it; no other test reads this variable.
    std::env::set_var("SG_TEST_LIMITER_PW", "limiter-pw");
    let upstream = Upstream::start();
    let store = format!(
        "url = \"rediss://127.0.0.1:{}/\"\nusername = \"limiter\"\npassword_env = \"SG_TEST_LIMITER_PW\"\ntls_ca = {:?}",
        redis.port(),
        redis.ca_cert().unwrap().display().to_string()
    );
    let sg = Slidegate::start(&cluster_config(&upstream, &store, "acl:", 2000, "deny"));
    let first = sg.get("/api/search", &[("x-api-key", "tls-key")]);
    assert_eq!((first.status, first.header("x-ratelimit-remaining")), (200, Some("1")), "{first:?}");
    // Written as the ACL user: the key is there, under the prefix.
    let keys = redis.cli(&["--scan"]);
    assert!(keys.lines().any(|k| k.starts_with("acl:")), "{keys}");
    let log = sg.log.lock().unwrap().clone();
    assert!(!log.contains("limiter-pw"), "the password was logged:\n{log}");
}

// ---------------------------------------------------------------- failover

/// What traffic saw while a master was killed: per request, when it was
/// answered, its status, and whether a store decision was made (RateLimit headers).
struct Traffic {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<(Instant, u16, bool)>>>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Traffic {
    /// Four threads sending requests for 30 identities in turn to `addr`.
    fn start(addr: std::net::SocketAddr) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let threads = (0..4)
            .map(|t| {
                let (stop, seen) = (Arc::clone(&stop), Arc::clone(&seen));
                thread::spawn(move || {
                    let mut i = t;
                    while !stop.load(Ordering::Relaxed) {
                        let key = format!("identity-{}", i % 30);
                        let reply = get(addr, "/api/busy", &[("x-api-key", &key)]);
                        seen.lock().unwrap().push((
                            Instant::now(),
                            reply.status,
                            reply.header("ratelimit").is_some(),
                        ));
                        i += 4;
                    }
                })
            })
            .collect();
        Traffic { stop, seen, threads }
    }

    /// Waits until the last `n` answers all carry a store decision.
    fn wait_for_decisions(&self, n: usize) {
        wait_for("store decisions to resume", Duration::from_secs(30), || {
            let seen = self.seen.lock().unwrap();
            seen.len() >= n && seen[seen.len() - n..].iter().all(|(_, _, decided)| *decided)
        });
    }

    /// Stops the threads; returns every answer.
    fn stop(self) -> Vec<(Instant, u16, bool)> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        Arc::try_unwrap(self.seen).unwrap().into_inner().unwrap()
    }
}

/// Checks what traffic saw around a kill at `killed`: every answer a 200,
/// fail-open answers without headers during the gap only; returns the gap
/// (kill to the last answer without a decision) and the undecided count.
fn assert_fail_open_gap(seen: &[(Instant, u16, bool)], killed: Instant) -> (Duration, usize) {
    let statuses: Vec<u16> = seen.iter().map(|(_, s, _)| *s).filter(|s| *s != 200).collect();
    assert_eq!(statuses, Vec::<u16>::new(), "fail-open traffic got non-200 answers");
    assert!(seen.iter().any(|(at, _, decided)| *at < killed && *decided), "no decision before the kill");
    let undecided: Vec<Instant> =
        seen.iter().filter(|(_, _, decided)| !decided).map(|(at, ..)| *at).collect();
    assert!(!undecided.is_empty(), "the kill went unnoticed: no request failed open");
    assert!(undecided.iter().all(|at| *at >= killed), "a request failed open before the kill");
    let last = undecided.iter().max().copied().unwrap_or(killed);
    (last.duration_since(killed), undecided.len())
}

fn assert_still_serving(sg: &mut Slidegate) {
    assert!(sg.child.try_wait().unwrap().is_none(), "serve exited");
    let log = sg.log.lock().unwrap().clone();
    assert!(!log.contains("panicked"), "serve panicked:\n{log}");
    assert_eq!(sg.get("/api/busy", &[("x-api-key", "after")]).status, 200);
}

#[test]
fn a_killed_cluster_master_fails_open_then_decisions_resume_and_keys_keep_ttls() {
    let mut cluster = RedisCluster::start();
    let upstream = Upstream::start();
    let mut sg = Slidegate::start(&cluster_config(&upstream, &cluster_store(&cluster), "fo:", 500, "allow"));
    let traffic = Traffic::start(sg.addr);
    traffic.wait_for_decisions(60);
    let killed = Instant::now();
    cluster.kill_master(0);
    let promoted = cluster.wait_for_failover();
    traffic.wait_for_decisions(120);
    let seen = traffic.stop();
    let (gap, undecided) = assert_fail_open_gap(&seen, killed);
    eprintln!(
        "cluster failover: {} ms without store decisions after the kill ({undecided} of {} requests failed open; \
         replica {promoted} promoted)",
        gap.as_millis(),
        seen.len()
    );
    assert_still_serving(&mut sg);
    let mut keys = 0;
    for port in cluster.masters() {
        keys += assert_every_key_expires(|args| cluster.cli(port, args));
    }
    assert!(keys >= 30, "only {keys} keys on the masters");
}

#[test]
fn a_killed_sentinel_master_fails_open_then_decisions_resume_and_keys_keep_ttls() {
    let mut sentinel = RedisSentinel::start();
    let upstream = Upstream::start();
    let urls: Vec<String> = sentinel.sentinel_urls().iter().map(|u| format!("{u:?}")).collect();
    let store = format!("sentinel = [{}]\nmaster_name = {:?}", urls.join(", "), sentinel.master_name());
    let mut sg = Slidegate::start(&cluster_config(&upstream, &store, "so:", 500, "allow"));
    let traffic = Traffic::start(sg.addr);
    traffic.wait_for_decisions(60);
    let killed = Instant::now();
    sentinel.kill_master();
    let promoted = sentinel.wait_for_failover();
    traffic.wait_for_decisions(120);
    let seen = traffic.stop();
    let (gap, undecided) = assert_fail_open_gap(&seen, killed);
    eprintln!(
        "sentinel failover: {} ms without store decisions after the kill ({undecided} of {} requests failed open; \
         replica {promoted} promoted)",
        gap.as_millis(),
        seen.len()
    );
    assert_still_serving(&mut sg);
    let keys = assert_every_key_expires(|args| sentinel.cli(promoted, args));
    assert!(keys >= 30, "only {keys} keys on the new master");
}

// ---------------------------------------------------------------- demo and bench

#[test]
fn demo_on_a_cluster_reproduces_the_article_and_leaves_no_keys() {
    // A cluster of its own: the other tests' keys would be counted by DBSIZE.
    let cluster = RedisCluster::start();
    let out = Command::new(binary())
        .args(["demo", "--json", "--identities", "2000", "--redis-cluster", &cluster.urls().join(",")])
        .output()
        .unwrap();
    assert!(out.status.success(), "demo failed: {}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["store"], "redis_cluster");
    let burst = &report["boundary_burst"];
    assert_eq!((burst["limit"].as_u64(), burst["sent"].as_u64()), (Some(100), Some(200)));
    let allowed = &burst["allowed"];
    assert_eq!(allowed["fixed_window"], 200);
    for algorithm in ["sliding_window_counter", "sliding_log", "token_bucket", "gcra"] {
        assert_eq!(allowed[algorithm], 100, "{algorithm}");
    }
    // The article's script, on the master owning its key.
    assert_eq!(burst["reference_script"], 101);
    let memory = &report["memory"];
    let usage = memory["sliding_log"]["memory_usage_one_identity"].as_u64().unwrap();
    assert!(usage > 500_000, "MEMORY USAGE of 10,000 log entries on the owning master: {usage} B");
    for algorithm in ["sliding_window_counter", "fixed_window", "sliding_log", "token_bucket", "gcra"] {
        let bytes = memory[algorithm]["bytes_per_identity"].as_u64().unwrap();
        assert!(bytes > 0 && bytes < 1000, "{algorithm}: {bytes} B per identity summed over masters");
    }
    for port in cluster.masters() {
        assert_eq!(cluster.cli(port, &["DBSIZE"]), "0", "the demo left keys on master {port}");
    }
}

#[test]
fn bench_on_a_cluster_measures_every_algorithm_and_cleans_up() {
    let cluster = RedisCluster::shared();
    let out = Command::new(binary())
        .args(["bench", "redis", "--json", "--seconds", "0.3", "--identities", "1000"])
        .args(["--memory-identities", "500", "--connections", "2", "--in-flight", "8"])
        .args(["--redis-cluster", &cluster.urls().join(",")])
        .output()
        .unwrap();
    assert!(out.status.success(), "bench failed: {}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["setup"]["masters"], 3);
    assert_eq!(report["reference_script"], Value::Null);
    for algorithm in ["sliding_window_counter", "fixed_window", "sliding_log", "token_bucket", "gcra"] {
        let per_sec = report["algorithms"][algorithm]["decisions_per_sec"].as_f64().unwrap();
        assert!(per_sec > 0.0, "{algorithm}: {per_sec}");
    }
    for port in cluster.masters() {
        let left = keys_on(|args| cluster.cli(port, args));
        assert!(left.iter().all(|k| !k.starts_with("sgb")), "bench left keys on {port}: {left:?}");
    }
}
