//! End to end: `[access_log]` (one JSON line per decision, written to a
//! file), `[server] log_format` and `SLIDEGATE_LOG`, through the real binary.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use common::*;
use serde_json::Value;

const KEY: &str = "sk-live-0123456789abcdef";

/// A config with an access log at `log` sampling `sample_allowed`: rule
/// `search` allows 2 a minute per API key (or address), `bulk` 10,000.
fn config_with_log(upstream: &Upstream, log: &Path, sample_allowed: &str) -> String {
    format!(
        r#"{head}
[access_log]
path = "{log}"
sample_allowed = {sample_allowed}

[[rules]]
name = "search"
path = "/api/search*"
limits = [{{ name = "per_minute", limit = 2, window = "60s", algorithm = "sliding_log" }}]

[[rules]]
name = "bulk"
path = "/bulk"
limits = [{{ limit = 10000, window = "1h", algorithm = "sliding_log" }}]
"#,
        head = keyed_head(upstream.addr, "admin_on_public = true\nthreads = 2", ""),
        log = log.display(),
    )
}

/// The log's lines, each parsed, after the server has stopped (and flushed).
fn lines(bytes: &[u8]) -> Vec<Value> {
    let text = std::str::from_utf8(bytes).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}"))).collect()
}

/// 2 allowed and 3 denied requests with the API key, then 1 allowed without
/// it (counted by address); stops the server and returns the log's bytes.
fn run_search(sample_allowed: &str) -> Vec<u8> {
    let upstream = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.jsonl");
    let mut sg = Slidegate::start(&config_with_log(&upstream, &log, sample_allowed));
    let key = [("x-api-key", KEY)];
    for expected in [200, 200, 429, 429, 429] {
        assert_eq!(sg.get("/api/search?token=query-secret", &key).status, expected);
    }
    assert_eq!(sg.get("/api/search/anon?token=query-secret", &[]).status, 200);
    assert_eq!(sg.metric("slidegate_access_log_dropped_total"), 0.0);
    assert!(sg.terminate().success());
    std::fs::read(&log).unwrap()
}

#[test]
fn every_decision_is_one_line_with_exact_fields_and_no_key_address_or_query() {
    let bytes = run_search("1");
    let lines = lines(&bytes);
    assert_eq!(lines.len(), 6, "{}", String::from_utf8_lossy(&bytes));
    let fields = |v: &Value| {
        (
            v["rule"].as_str().unwrap().to_owned(),
            v["outcome"].as_str().unwrap().to_owned(),
            v["remaining"].as_u64().unwrap(),
            v["status"].as_u64().unwrap(),
            v["kind"].as_str().unwrap().to_owned(),
        )
    };
    let got: Vec<_> = lines.iter().map(fields).collect();
    let row = |outcome: &str, remaining, status, kind: &str| {
        ("search".to_owned(), outcome.to_owned(), remaining, status, kind.to_owned())
    };
    assert_eq!(
        got,
        [
            row("allowed", 1, 200, "api_key"),
            row("allowed", 0, 200, "api_key"),
            row("denied", 0, 429, "api_key"),
            row("denied", 0, 429, "api_key"),
            row("denied", 0, 429, "api_key"),
            row("allowed", 1, 200, "ip"),
        ]
    );
    // The store decided the first denial; its deny cache answered the next two.
    let sources: Vec<_> = lines.iter().map(|v| v["source"].as_str().unwrap()).collect();
    assert_eq!(sources, ["store", "store", "store", "cache", "cache", "store"]);
    for line in &lines {
        let object = line.as_object().unwrap();
        // serde_json's map sorts the keys; the order written is the unit tests'.
        let keys: Vec<_> = object.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "decide_us",
                "identity",
                "kind",
                "method",
                "outcome",
                "path",
                "policy",
                "remaining",
                "rule",
                "source",
                "status",
                "time"
            ]
        );
        assert_eq!(line["policy"], "per_minute");
        assert_eq!(line["method"], "GET");
        assert!(line["decide_us"].is_u64());
        let identity = line["identity"].as_str().unwrap();
        assert_eq!(identity.len(), 16);
        assert!(identity.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()), "{identity}");
        let time = line["time"].as_str().unwrap();
        assert!(time.len() == 24 && time.ends_with('Z') && time.as_bytes()[10] == b'T', "{time}");
    }
    assert_eq!(lines[0]["path"], "/api/search");
    assert_eq!(lines[5]["path"], "/api/search/anon");
    // One identity per API key, another for the address.
    assert!(lines[..5].iter().all(|l| l["identity"] == lines[0]["identity"]));
    assert_ne!(lines[5]["identity"], lines[0]["identity"]);
    // Neither the key, nor the address, nor the query, anywhere in the file.
    let text = String::from_utf8(bytes).unwrap();
    for secret in [KEY, "0123456789abcdef", "127.0.0.1", "query-secret", "token="] {
        assert!(!text.contains(secret), "{secret:?} in the access log:\n{text}");
    }
}

#[test]
fn with_sample_allowed_0_only_the_denials_are_logged() {
    let lines = lines(&run_search("0"));
    let outcomes: Vec<_> = lines.iter().map(|v| v["outcome"].as_str().unwrap()).collect();
    assert_eq!(outcomes, ["denied", "denied", "denied"]);
}

#[test]
fn sampling_is_an_exact_share_of_the_allowed_requests() {
    let upstream = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.jsonl");
    let mut sg = Slidegate::start(&config_with_log(&upstream, &log, "0.25"));
    // Over two worker threads: the count is shared.
    for _ in 0..400 {
        assert_eq!(sg.get("/bulk", &[]).status, 200);
    }
    for expected in [200, 200, 429] {
        assert_eq!(sg.get("/api/search", &[("x-api-key", KEY)]).status, expected);
    }
    assert!(sg.terminate().success());
    let lines = lines(&std::fs::read(&log).unwrap());
    let count = |rule: &str, outcome: &str| {
        lines.iter().filter(|l| l["rule"] == rule && l["outcome"] == outcome).count()
    };
    // 402 allowed requests: the 4th, 8th, ... 400th are logged (the two
    // search requests are the 401st and 402nd); every denial is.
    assert_eq!(
        (count("bulk", "allowed"), count("search", "allowed"), count("search", "denied")),
        (100, 0, 1)
    );
    assert_eq!(lines.len(), 101);
}

/// Runs `serve` with `SLIDEGATE_LOG=level`: its exit code and stderr if it
/// exits, `None` (and the process killed) once it announces it is listening.
fn serve_with_log_level(config: &Path, level: &str) -> Option<(Option<i32>, String)> {
    let mut child = Command::new(binary())
        .args(["serve", "--config"])
        .arg(config)
        .env("SLIDEGATE_LOG", level)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = String::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        if line.starts_with("slidegate: listening on ") {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        stderr.push_str(&line);
        stderr.push('\n');
    }
    Some((child.wait().unwrap().code(), stderr))
}

#[test]
fn an_unknown_slidegate_log_exits_64_and_known_levels_still_serve() {
    let upstream = Upstream::start();
    let (_dir, path) = write_config(&config_head(upstream.addr, "", ""));
    for bogus in ["bogus", "slidegate=debug", "inf o", "6", "info,warn"] {
        let (code, stderr) = serve_with_log_level(&path, bogus)
            .unwrap_or_else(|| panic!("SLIDEGATE_LOG={bogus:?}: serve started"));
        assert_eq!(code, Some(64), "{bogus:?}");
        assert_eq!(
            stderr,
            format!(
                "slidegate: SLIDEGATE_LOG={bogus:?} is not a log level: expected error, warn, info, debug, trace or off\n"
            )
        );
    }
    // What was a level stays one: these serve.
    for level in ["DEBUG", "off", "3", ""] {
        assert_eq!(serve_with_log_level(&path, level), None, "SLIDEGATE_LOG={level:?}");
    }
}

#[test]
fn log_format_json_writes_the_process_log_as_json_lines() {
    let upstream = Upstream::start();
    let mut sg = Slidegate::start(&config_head(upstream.addr, "log_format = \"json\"", ""));
    assert_eq!(sg.get("/", &[]).status, 200);
    assert!(sg.terminate().success());
    let log = sg.log.lock().unwrap().clone();
    // The start-up announcements are plain lines; every event is an object.
    let events: Vec<Value> = log
        .lines()
        .filter(|l| !l.starts_with("slidegate: "))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}\n{log}")))
        .collect();
    let messages: Vec<_> = events.iter().map(|e| e["fields"]["message"].as_str().unwrap()).collect();
    assert!(messages.iter().any(|m| m.starts_with("shutdown signal received (SIGTERM)")), "{log}");
    assert!(events.iter().all(|e| e["level"].is_string() && e["timestamp"].is_string()), "{log}");
}

#[test]
fn a_bad_log_format_or_access_log_is_a_located_error() {
    let upstream = Upstream::start();
    let head = config_head(upstream.addr, "log_format = \"yaml\"", "");
    let (_dir, path) = write_config(&head);
    for args in [vec!["serve", "--config"], vec!["check-config"]] {
        let out = Command::new(binary()).args(&args).arg(&path).output().unwrap();
        assert_eq!(out.status.code(), Some(64), "{args:?}");
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(
            stderr.lines().next().unwrap(),
            format!(
                "slidegate: {}:4:14: unknown log_format \"yaml\": expected \"text\" or \"json\"",
                path.display()
            )
        );
    }
    // A directory is no file to append to: serve says so and exits.
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "{}\n[access_log]\npath = \"{}\"\n",
        config_head(upstream.addr, "", ""),
        dir.path().display()
    );
    let (_dir, path) = write_config(&text);
    let out = Command::new(binary()).args(["serve", "--config"]).arg(&path).output().unwrap();
    assert_ne!(out.status.code(), Some(0));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains(&format!("cannot open the access log {}", dir.path().display())), "{stderr}");
}

#[test]
fn while_the_store_is_down_each_failure_policy_logs_what_answered() {
    let mut redis = RedisServer::spawn();
    redis.kill();
    let upstream = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.jsonl");
    let store = format!("[store]\nurl = \"{}\"\ntimeout_ms = 50\n", redis.url());
    let text = format!(
        r#"{head}
[identity]
ip_hash_secret_env = "{SECRET_ENV}"

[access_log]
path = "{log}"

[[rules]]
name = "open"
path = "/open"
on_error = "allow"
limits = [{{ limit = 5, window = "60s" }}]

[[rules]]
name = "closed"
path = "/closed"
on_error = "deny"
limits = [{{ limit = 5, window = "60s" }}]

[[rules]]
name = "fb"
path = "/fb"
limits = [{{ name = "fb-60s", limit = 5, window = "60s", algorithm = "sliding_log" }}]
"#,
        head = config_head(upstream.addr, "", &store),
        log = log.display(),
    );
    let mut sg = Slidegate::start(&text);
    assert_eq!(sg.get("/open", &[]).status, 200);
    assert_eq!(sg.get("/closed", &[]).status, 503);
    assert_eq!(sg.get("/fb", &[]).status, 200);
    assert!(sg.terminate().success());
    let lines = lines(&std::fs::read(&log).unwrap());
    let got: Vec<_> = lines
        .iter()
        .map(|l| {
            (
                l["rule"].as_str().unwrap(),
                l["outcome"].as_str().unwrap(),
                l["source"].as_str().unwrap(),
                l["policy"].as_str(),
                l["remaining"].as_u64(),
                l["status"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("open", "fail_open", "none", None, None, 200),
            ("closed", "fail_closed", "none", None, None, 503),
            ("fb", "allowed", "fallback", Some("fb-60s"), Some(4), 200),
        ]
    );
}

#[test]
fn path_dash_writes_the_lines_to_standard_output() {
    let upstream = Upstream::start();
    let text = format!(
        "{}\n[access_log]\npath = \"-\"\n\n[[rules]]\nname = \"all\"\npath = \"/*\"\nlimits = [{{ limit = 1, window = \"60s\", algorithm = \"sliding_log\" }}]\n",
        config_head(upstream.addr, "", "")
    );
    let (_dir, path) = write_config(&text);
    let mut child = Command::new(binary())
        .args(["serve", "--config"])
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let addr = loop {
        let mut line = String::new();
        assert_ne!(stderr.read_line(&mut line).unwrap(), 0, "slidegate exited before listening");
        if let Some(rest) = line.strip_prefix("slidegate: listening on ") {
            break rest.split(',').next().unwrap().parse().unwrap();
        }
    };
    assert_eq!(get(addr, "/a?x=1", &[]).status, 200);
    assert_eq!(get(addr, "/b", &[]).status, 429);
    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let lines = lines(&out.stdout);
    let got: Vec<_> =
        lines.iter().map(|l| (l["path"].as_str().unwrap(), l["outcome"].as_str().unwrap())).collect();
    assert_eq!(got, [("/a", "allowed"), ("/b", "denied")]);
}

/// Log rotation: after the file is moved away, `SIGHUP` (which also reloads
/// the configuration) has the writer open a new one at the configured path;
/// the lines before the signal stay in the moved file.
#[test]
fn sighup_reopens_the_access_log_after_a_rotation() {
    let upstream = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.jsonl");
    let mut sg = Slidegate::start(&config_with_log(&upstream, &log, "1"));
    for _ in 0..3 {
        assert_eq!(sg.get("/bulk", &[]).status, 200);
    }
    let rotated = dir.path().join("access.jsonl.1");
    // The writer flushes every 10 ms: wait for the three lines first.
    wait_for("the first three lines", std::time::Duration::from_secs(10), || {
        std::fs::read(&log).is_ok_and(|b| lines(&b).len() == 3)
    });
    std::fs::rename(&log, &rotated).unwrap();
    let pid = sg.child.id().to_string();
    assert!(Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    wait_for("the reload", std::time::Duration::from_secs(10), || {
        sg.log.lock().unwrap().contains("configuration reloaded")
    });
    for _ in 0..2 {
        assert_eq!(sg.get("/bulk", &[]).status, 200);
    }
    assert!(sg.terminate().success());
    assert_eq!(lines(&std::fs::read(&rotated).unwrap()).len(), 3);
    assert_eq!(lines(&std::fs::read(&log).unwrap()).len(), 2, "a new file at the configured path");
}
