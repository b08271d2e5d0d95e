//! `slidegate replay`: recorded access logs through a config's rules on a
//! simulated clock, run as the real binary. Every count is exact: the
//! traffic is generated here, so what the algorithm decides is known.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn slidegate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_slidegate")).args(args).output().expect("run slidegate")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Writes `contents` to `name` in `dir`, returning its path.
fn write(dir: &Path, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

/// Runs `replay --json` and parses its report; the run must succeed.
fn replay_json(config: &Path, logs: &[&Path], extra: &[&str]) -> Value {
    let mut args = vec!["replay", "--config", config.to_str().unwrap(), "--json"];
    args.extend_from_slice(extra);
    args.extend(logs.iter().map(|p| p.to_str().unwrap()));
    let out = slidegate(&args);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(&out)))
}

/// Writes `config` (TOML) and `log` to a new directory and replays the log
/// through the config (`replay_json`).
fn replay_text(config: &str, log: impl AsRef<[u8]>, extra: &[&str]) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), "slidegate.toml", config);
    let log = write(dir.path(), "access.log", log);
    replay_json(&config, &[&log], extra)
}

/// The report of the rule named `name`.
fn rule<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["rules"].as_array().unwrap().iter().find(|r| r["name"] == name).unwrap()
}

/// `(requests, allowed, denied, blocked)` of a rule or an identity.
fn counts(v: &Value) -> (u64, u64, u64, u64) {
    let n = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"));
    (n("requests"), n("allowed"), n("denied"), n("blocked"))
}

/// A combined-format line (nginx `combined`, Apache `%h %l %u %t "%r" %>s %b "%{Referer}i" "%{User-agent}i"`)
/// `second` seconds after 2026-12-01 10:00:00 UTC.
fn combined(ip: &str, second: u32, target: &str, status: u16) -> String {
    let (h, m, s) = (10 + second / 3600, second / 60 % 60, second % 60);
    format!(
        "{ip} - - [01/Dec/2026:{h:02}:{m:02}:{s:02} +0000] \"GET {target} HTTP/1.1\" {status} 612 \"-\" \"curl/8.5.0\"\n"
    )
}

/// 2026-12-01 10:00:00 UTC in unix seconds.
const START: u64 = 1_796_119_200;

const CONFIG: &str = r#"
[identity]
api_key_header = "x-api-key"

[[rules]]
name = "api"
path = "/api/*"
limits = [{ limit = 10, window = "60s" }]
"#;

#[test]
fn one_client_making_100_requests_in_10_s_against_10_a_minute_gets_exactly_10() {
    let log: String = (0..100).map(|i| combined("203.0.113.7", i / 10, "/api/items?page=2", 200)).collect();
    let report = replay_text(CONFIG, &log, &[]);
    assert_eq!(counts(rule(&report, "api")), (100, 10, 90, 0), "{report}");
    assert_eq!(report["lines"], 100);
    assert_eq!(report["requests"], 100);
    assert_eq!(report["unmatched"], 0);
    assert_eq!(report["malformed"]["count"], 0);
    assert_eq!(report["replayed_ms"], 9_000, "from the first line's second to the last's");
    assert_eq!(report["start"], "2026-12-01T10:00:00Z");
    let top = rule(&report, "api")["top"].as_array().unwrap();
    assert_eq!(top.len(), 1);
    assert_eq!(counts(&top[0]), (100, 10, 90, 0));
    assert_eq!(top[0]["kind"], "ip");
    assert_eq!(top[0]["identity"].as_str().unwrap().len(), 16, "the offenders page's short hash");
    assert!(log.contains("203.0.113.7"));
    assert!(!report.to_string().contains("203.0.113"), "no raw address in the report: {report}");
}

#[test]
fn two_clients_are_counted_apart_and_unmatched_requests_are_not_limited() {
    let mut log = String::new();
    for second in 0..30 {
        log += &combined("198.51.100.1", second, "/api/a", 200);
        if second < 5 {
            log += &combined("198.51.100.2", second, "/api/b", 200);
        }
        log += &combined("198.51.100.3", second, "/static/app.js", 200);
    }
    // A minute after the first request the window has slid past it: the
    // sliding window counter weighs the previous minute's 10 by 0 at 60 s.
    log += &combined("198.51.100.1", 120, "/api/a", 200);
    let report = replay_text(CONFIG, log, &[]);
    assert_eq!(counts(rule(&report, "api")), (36, 16, 20, 0), "{report}");
    assert_eq!(report["unmatched"], 30);
    assert_eq!(report["requests"], 66);
    let top = rule(&report, "api")["top"].as_array().unwrap();
    assert_eq!(top.len(), 1, "only identities refused at least once: {report}");
    assert_eq!(counts(&top[0]), (31, 11, 20, 0));
}

#[test]
fn json_lines_carry_api_keys_hashes_and_three_time_forms() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), "slidegate.toml", CONFIG);
    let mut log = String::new();
    // One key from 20 addresses: counted as one identity, the key.
    for i in 0..20u64 {
        let time = match i % 3 {
            0 => Value::from(format!("2026-12-01T11:00:{:02}+01:00", i)),
            1 => Value::from(START + i),
            _ => Value::from((START + i) * 1000),
        };
        let line = serde_json::json!({ "time": time, "method": "GET", "path": "/api/x", "ip": format!("192.0.2.{i}"), "api_key": "sk_live_alpha" });
        log += &format!("{line}\n");
    }
    // A key logged as its hash: one opaque key, counted apart from the raw one.
    for i in 0..12u64 {
        let line = serde_json::json!({ "time": START + 20 + i, "method": "POST", "path": "/api/y", "ip": "192.0.2.200", "api_key_hash": "9f86d081884c7d65" });
        log += &format!("{line}\n");
    }
    let log = write(dir.path(), "access.jsonl", log);
    let report = replay_json(&config, &[&log], &[]);
    assert_eq!(counts(rule(&report, "api")), (32, 20, 12, 0), "{report}");
    let top = rule(&report, "api")["top"].as_array().unwrap();
    assert_eq!(top.len(), 2);
    assert_eq!((counts(&top[0]), &top[0]["kind"]), ((20, 10, 10, 0), &Value::from("api_key")));
    assert_eq!((counts(&top[1]), &top[1]["kind"]), ((12, 10, 2, 0), &Value::from("api_key")));
    let text = report.to_string();
    assert!(!text.contains("sk_live") && !text.contains("9f86d0"), "no raw keys in the report: {text}");
    assert_eq!(report["out_of_order"]["lines"], 0, "the three time forms agree: {report}");
}

#[test]
fn the_penalty_box_blocks_on_the_simulated_clock() {
    let config = r#"
[[rules]]
name = "login"
path = "/login"
limits = [{ limit = 1, window = "60s" }]
penalty = { after = 2, within = "1m", block = "10m" }
"#;
    // 1 allowed, 2 denials tolerated, the third starts a 10-minute block;
    // 700 s later (simulated) the block is over.
    let mut log: String = (0..10).map(|s| combined("203.0.113.9", s, "/login", 401)).collect();
    log += &combined("203.0.113.9", 700, "/login", 200);
    let report = replay_text(config, log, &[]);
    assert_eq!(counts(rule(&report, "login")), (11, 2, 2, 7), "{report}");
    assert_eq!(report["replayed_ms"], 700_000);
}

#[test]
fn rules_charged_after_the_response_use_the_logged_status() {
    let config = r#"
[[rules]]
name = "probe"
path = "/*"
limits = [{ limit = 3, window = "1h" }]
count_status = [404]
"#;
    // 20 hits, one in four a 404: the 404s are charged, the 200s are not.
    let log: String =
        (0..20).map(|s| combined("203.0.113.5", s, "/p", if s % 4 == 0 { 404 } else { 200 })).collect();
    let report = replay_text(config, log, &[]);
    // The 404s at 0, 4 and 8 s spend the limit; from 9 s on the peek finds
    // nothing left and denies, whatever the status would have been.
    assert_eq!(counts(rule(&report, "probe")), (20, 9, 11, 0), "{report}");
}

#[test]
fn lines_out_of_order_are_decided_at_the_latest_time_seen() {
    let mut log: String = (0..10).map(|_| combined("203.0.113.7", 100, "/api/a", 200)).collect();
    // Written late: 40 s behind, decided at 100 s, so still in the window.
    log += &combined("203.0.113.7", 60, "/api/a", 200);
    let report = replay_text(CONFIG, log, &[]);
    assert_eq!(counts(rule(&report, "api")), (11, 10, 1, 0));
    assert_eq!(report["out_of_order"]["lines"], 1);
    assert_eq!(report["out_of_order"]["max_behind_ms"], 40_000);
}

#[test]
fn malformed_lines_of_every_kind_are_counted_with_their_line_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), "slidegate.toml", CONFIG);
    let good = combined("203.0.113.7", 0, "/api/a", 200);
    let mut log: Vec<u8> = Vec::new();
    let mut bad = |line: &[u8]| {
        log.extend_from_slice(line);
        log.push(b'\n');
    };
    bad(good.trim_end().as_bytes()); // 1: fine
    bad(b"203.0.113.7 - - [01/Dec/2026:10:00:00 +0000] \"GET /api/a HTTP/1.1"); // 2: truncated quote
    bad(b"203.0.113.7 - - [32/Dec/2026:10:00:00 +0000] \"GET /api/a HTTP/1.1\" 200 1"); // 3: bad day
    bad(b"203.0.113.7 - - [01/Foo/2026:10:00:00 +0000] \"GET /api/a HTTP/1.1\" 200 1"); // 4: bad month
    bad(b"999.0.113.7 - - [01/Dec/2026:10:00:00 +0000] \"GET /api/a HTTP/1.1\" 200 1"); // 5: bad IP
    bad(b"\xff\xfe\x00\x01garbage\x80\x81"); // 6: binary
    bad(&vec![b'a'; 1 << 20]); // 7: a 1 MB line
    bad(br#"{"time": true, "method": "GET", "path": "/api/a", "ip": "203.0.113.7"}"#); // 8: wrong type
    bad(br#"{"time": 1796119200, "method": "GET", "path": "/api/a"}"#); // 9: no ip
    bad(br#"[1, 2, 3]"#); // 10: not an object
    bad(br#"{"time": "yesterday", "method": "GET", "path": "/api/a", "ip": "203.0.113.7"}"#); // 11
    bad(br#"{"time": -5, "method": "GET", "path": "/api/a", "ip": "203.0.113.7"}"#); // 12
    bad(br#"{"time": 1e300, "method": "GET", "path": "/api/a", "ip": "203.0.113.7"}"#); // 13
    bad(br#"{"time": 1796119200, "method": "G T", "path": "/api/a", "ip": "203.0.113.7"}"#); // 14
    bad(br#"{"time": 1796119200, "method": "GET", "path": "api/a", "ip": "203.0.113.7"}"#); // 15
    bad(
        br#"{"time": 1796119200, "method": "GET", "path": "/api/a", "ip": "203.0.113.7", "api_key": "a\nb"}"#,
    ); // 16
    bad(br#"{"time": 1796119200, "method": "GET", "path": "/api/a", "ip": "203.0.113.7", "status": "ok"}"#); // 17
    bad(b"203.0.113.7 - - [01/Dec/2026:10:00:00 +0000] \"-\" 400 0 \"-\" \"-\""); // 18: no request line
    bad(b"203.0.113.7 - - [01/Dec/2026:10:00:00 +0000] \"GET /api/a HTTP/1.1\" abc 0"); // 19: bad status
    bad(br#"{"time": 1796119200, "method": "GET", "path": "/api/a", "ip": "203.0.113.7""#); // 20: truncated JSON
    bad(b""); // 21: blank, skipped
    bad(good.trim_end().as_bytes()); // 22: fine
    let log = write(dir.path(), "access.log", log);
    let report = replay_json(&config, &[&log], &["--show-malformed", "5"]);
    assert_eq!(report["lines"], 22);
    assert_eq!(report["requests"], 2);
    assert_eq!(report["malformed"]["count"], 19, "{report}");
    let first = report["malformed"]["first"].as_array().unwrap();
    let numbers: Vec<u64> = first.iter().map(|m| m["line"].as_u64().unwrap()).collect();
    assert_eq!(numbers, [2, 3, 4, 5, 6]);
    assert!(first.iter().all(|m| m["file"].as_str().unwrap().ends_with("access.log")));
    for m in first {
        assert!(!m["reason"].as_str().unwrap().is_empty(), "{m}");
    }
    assert_eq!(counts(rule(&report, "api")), (2, 2, 0, 0));

    // Without --json, the same counts, each line named file:line.
    let out = slidegate(&["replay", "--config", config.to_str().unwrap(), log.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("19 malformed"), "{text}");
    assert!(text.contains("access.log:2: "), "{text}");
    assert!(text.contains("access.log:11: "), "the first 10 by default: {text}");
    assert!(!text.contains("access.log:12: "), "{text}");
    assert!(!stderr(&out).contains("panicked"));
}

#[test]
fn reasons_say_what_was_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), "slidegate.toml", CONFIG);
    let log = write(
        dir.path(),
        "a.log",
        "203.0.113.7 - - [01/Dec/2026:10:00:00 +0000] \"GET /api/a HTTP/1.1\n\
         999.0.113.7 - - [01/Dec/2026:10:00:00 +0000] \"GET /api/a HTTP/1.1\" 200 1\n\
         {\"time\": true, \"method\": \"GET\", \"path\": \"/api/a\", \"ip\": \"203.0.113.7\"}\n",
    );
    let report = replay_json(&config, &[&log], &[]);
    let reasons: Vec<&str> = report["malformed"]["first"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["reason"].as_str().unwrap())
        .collect();
    assert!(reasons[0].contains("quote"), "{reasons:?}");
    assert!(reasons[1].contains("999.0.113.7"), "{reasons:?}");
    assert!(reasons[2].contains("time"), "{reasons:?}");
}

#[test]
fn several_logs_are_replayed_in_turn_and_numbered_apart() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), "slidegate.toml", CONFIG);
    let a: String = (0..6).map(|s| combined("203.0.113.7", s, "/api/a", 200)).collect();
    let b = format!(
        "{}not a log line\n",
        (6..12).map(|s| combined("203.0.113.7", s, "/api/a", 200)).collect::<String>()
    );
    let (a, b) = (write(dir.path(), "a.log", a), write(dir.path(), "b.log", b));
    let report = replay_json(&config, &[&a, &b], &[]);
    assert_eq!(counts(rule(&report, "api")), (12, 10, 2, 0));
    assert_eq!(report["lines"], 13);
    let m = &report["malformed"]["first"][0];
    assert!(m["file"].as_str().unwrap().ends_with("b.log") && m["line"] == 7, "{m}");
}

#[test]
fn an_empty_log_gives_an_empty_report() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), "slidegate.toml", CONFIG);
    let log = write(dir.path(), "empty.log", "");
    let report = replay_json(&config, &[&log], &[]);
    assert_eq!(report["lines"], 0);
    assert_eq!(counts(rule(&report, "api")), (0, 0, 0, 0));
    let out = slidegate(&["replay", "--config", config.to_str().unwrap(), log.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn a_missing_log_is_an_error_before_anything_is_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), "slidegate.toml", CONFIG);
    let good = write(dir.path(), "a.log", combined("203.0.113.7", 0, "/api/a", 200));
    let missing = dir.path().join("nope.log");
    let out = slidegate(&[
        "replay",
        "--config",
        config.to_str().unwrap(),
        good.to_str().unwrap(),
        missing.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(66), "EX_NOINPUT");
    let err = stderr(&out);
    assert!(err.contains("nope.log") && err.contains("cannot open"), "{err}");
    assert!(stdout(&out).is_empty(), "nothing replayed: {}", stdout(&out));
    // A directory is not a log either.
    let out = slidegate(&["replay", "--config", config.to_str().unwrap(), dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(66), "{}", stderr(&out));
    // And a log is required.
    let out = slidegate(&["replay", "--config", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_config_error_is_located_and_exits_64_like_serve() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        "bad.toml",
        "[[rules]]\nname = \"api\"\npath = \"/api/*\"\nlimits = [{ limit = 0, window = \"60s\" }]\n",
    );
    let log = write(dir.path(), "a.log", combined("203.0.113.7", 0, "/api/a", 200));
    let out = slidegate(&["replay", "--config", config.to_str().unwrap(), log.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("bad.toml:4:"), "located: {err}");
    // No upstream is needed to replay: what serve alone needs is not asked for.
    let out = slidegate(&["replay", "--config", "/nonexistent/slidegate.toml", log.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
}

#[test]
fn the_svg_charts_denials_over_time_per_rule() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        "slidegate.toml",
        r#"
[[rules]]
name = "api"
path = "/api/*"
limits = [{ limit = 10, window = "60s", algorithm = "fixed_window" }]

[[rules]]
name = "login"
path = "/login"
limits = [{ limit = 1, window = "60s", algorithm = "fixed_window" }]
"#,
    );
    let mut log = String::new();
    for s in 0..600 {
        log += &combined("203.0.113.7", s, "/api/a", 200);
        log += &combined("203.0.113.8", s, "/login", 200);
    }
    let log = write(dir.path(), "access.log", log);
    let svg = dir.path().join("charts/denials.svg");
    let report = replay_json(&config, &[&log], &["--svg", svg.to_str().unwrap()]);
    assert_eq!(counts(rule(&report, "api")), (600, 100, 500, 0), "{report}");
    assert_eq!(counts(rule(&report, "login")), (600, 10, 590, 0), "{report}");
    // The chart's series, exactly as --json gives them: every bucket's
    // denials add up to the rule's.
    let over_time = &report["denials_over_time"];
    let bucket_ms = over_time["bucket_ms"].as_u64().unwrap();
    assert!(bucket_ms > 0);
    for (name, total) in [("api", 500), ("login", 590)] {
        let series: Vec<u64> =
            over_time["rules"][name].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        assert_eq!(series.iter().sum::<u64>(), total, "{name}: {series:?}");
        assert_eq!(series.len() as u64, 599_000 / bucket_ms + 1, "{name}");
    }
    let text = std::fs::read_to_string(&svg).unwrap();
    assert_well_formed(&text);
    assert!(text.contains("api: 500") && text.contains("login: 590"), "legend with totals");
    assert_eq!(text.matches("<path ").count(), 2, "one line per rule");
}

/// A small XML check: every tag closes in order, attributes are quoted, and
/// the document is one `<svg>` element.
fn assert_well_formed(xml: &str) {
    let mut stack: Vec<String> = Vec::new();
    let mut rest = xml.trim();
    assert!(rest.starts_with("<svg"), "starts with <svg");
    while let Some(open) = rest.find('<') {
        let text = &rest[..open];
        assert!(!text.contains('>'), "{text}");
        let close = rest[open..].find('>').expect("tag closes") + open;
        let tag = &rest[open + 1..close];
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(stack.pop().as_deref(), Some(name.trim()), "closing tag in order");
        } else if !tag.ends_with('/') {
            stack.push(tag.split_whitespace().next().unwrap().to_owned());
        }
        assert_eq!(tag.matches('"').count() % 2, 0, "quoted attributes: {tag}");
        rest = &rest[close + 1..];
        if stack.is_empty() {
            assert!(rest.trim().is_empty(), "one root element");
            return;
        }
    }
    panic!("unclosed: {stack:?}");
}

#[test]
fn the_text_report_names_rules_and_heaviest_identities() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), "slidegate.toml", CONFIG);
    let log: String = (0..100).map(|i| combined("203.0.113.7", i / 10, "/api/items", 200)).collect();
    let log = write(dir.path(), "access.log", log);
    let out = slidegate(&["replay", "--config", config.to_str().unwrap(), log.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("100 lines"), "{text}");
    let api = text.lines().find(|l| l.starts_with("api ")).unwrap_or_else(|| panic!("{text}"));
    let fields: Vec<&str> = api.split_whitespace().collect();
    assert_eq!(fields[1..6], ["100", "10", "0", "90", "0"], "{api}");
    assert!(text.contains("heaviest identities"), "{text}");
    assert!(!text.contains("203.0.113"), "{text}");
    assert!(stderr(&out).is_empty(), "no progress bar when stderr is not a terminal: {}", stderr(&out));
}

#[test]
fn a_log_on_stdin_is_read_with_a_dash() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), "slidegate.toml", CONFIG);
    let log: String = (0..20).map(|i| combined("203.0.113.7", i, "/api/items", 200)).collect();
    let mut child = Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .args(["replay", "--config", config.to_str().unwrap(), "--json", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write as _;
        child.stdin.take().unwrap().write_all(log.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(counts(rule(&report, "api")), (20, 10, 10, 0));
}

#[test]
fn a_shadow_rule_reports_what_it_would_refuse() {
    let config = r#"
[[rules]]
name = "api"
path = "/api/*"
shadow = true
limits = [{ limit = 10, window = "60s" }]
"#;
    let log: String = (0..30).map(|s| combined("203.0.113.7", s, "/api/a", 200)).collect();
    let report = replay_text(config, log, &[]);
    assert_eq!(counts(rule(&report, "api")), (30, 10, 20, 0), "{report}");
    assert_eq!(rule(&report, "api")["shadow"], true);
}

#[test]
fn bad_arguments_are_refused_with_the_flag_named() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), "slidegate.toml", CONFIG);
    let log = write(dir.path(), "a.log", combined("203.0.113.7", 0, "/api/a", 200));
    let (config, log) = (config.to_str().unwrap(), log.to_str().unwrap());
    for (flag, value) in
        [("--top", "-1"), ("--top", "10001"), ("--show-malformed", "x"), ("--show-malformed", "100001")]
    {
        let out = slidegate(&["replay", "--config", config, &format!("{flag}={value}"), log]);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}");
        assert!(stderr(&out).contains(&format!("invalid value '{value}' for '{flag}")), "{}", stderr(&out));
    }
}

/// A rule's `delay` on the simulated clock: a client sending twice what a
/// 1-a-second rule admits, two requests each second, has one of each pair
/// held to the next second and allowed (delayed), the other refused for
/// its full queue of one; the last held is decided when the log ends.
#[test]
fn delay_is_replayed_on_the_simulated_clock() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        "slidegate.toml",
        r#"
[[rules]]
name = "api"
path = "/api/*"
limits = [{ limit = 1, window = "1s", algorithm = "gcra" }]
delay = { max_wait = "1s", per_identity = 1 }
"#,
    );
    let log: String = (0..10).map(|i| combined("203.0.113.9", i / 2, "/api/items", 200)).collect();
    let log = write(dir.path(), "access.log", log);
    let report = replay_json(&config, &[&log], &[]);
    let api = rule(&report, "api");
    assert_eq!(counts(api), (10, 1, 4, 0));
    assert_eq!(api["delayed"], 5, "{api}");
    let out = slidegate(&["replay", "--config", config.to_str().unwrap(), log.to_str().unwrap()]);
    let text = stdout(&out);
    let header = text.lines().find(|l| l.starts_with("rule ")).unwrap();
    let columns: Vec<&str> = header.split_whitespace().collect();
    assert_eq!(columns, ["rule", "requests", "allowed", "delayed", "denied", "blocked"]);
    assert!(
        text.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["api", "10", "1", "5", "4", "0"]),
        "{text}"
    );
}

/// A combined-format line at `time` (the log's own form, such as
/// `01/Jan/1970:00:00:00 +0000`).
fn combined_at(ip: &str, time: &str, target: &str) -> String {
    format!("{ip} - - [{time}] \"GET {target} HTTP/1.1\" 200 612 \"-\" \"curl/8.5.0\"\n")
}

/// A line dated by an unset clock (1970) or forged far ahead (9999) is
/// skipped as malformed and counted apart: it moves neither the simulated
/// clock nor the report's span.
#[test]
fn lines_dated_before_2000_or_after_tomorrow_are_skipped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), "slidegate.toml", CONFIG);
    let mut log = combined("203.0.113.7", 0, "/api/a", 200); // 1: replayed
    log += &combined_at("203.0.113.7", "01/Jan/1970:00:00:00 +0000", "/api/a"); // 2: 1970
    log += &combined_at("203.0.113.7", "31/Dec/9999:23:59:59 +0000", "/api/a"); // 3: 9999
    log += "{\"time\": 0, \"method\": \"GET\", \"path\": \"/api/a\", \"ip\": \"203.0.113.7\"}\n"; // 4: unix 0
    log += "not a log line\n"; // 5: malformed for its form
    log += &combined_at("203.0.113.7", "31/Dec/1999:23:59:59 +0000", "/api/a"); // 6: a second early
    log += &combined("203.0.113.7", 30, "/api/a", 200); // 7: replayed
    let log = write(dir.path(), "access.log", log);
    let report = replay_json(&config, &[&log], &[]);
    assert_eq!(report["lines"], 7);
    assert_eq!(report["requests"], 2, "{report}");
    assert_eq!(counts(rule(&report, "api")), (2, 2, 0, 0));
    let malformed = &report["malformed"];
    assert_eq!(malformed["count"], 5, "{report}");
    assert_eq!(malformed["out_of_range"]["lines"], 4, "{report}");
    assert_eq!(malformed["out_of_range"]["from"], "2000-01-01T00:00:00Z");
    let numbers: Vec<u64> =
        malformed["first"].as_array().unwrap().iter().map(|m| m["line"].as_u64().unwrap()).collect();
    assert_eq!(numbers, [2, 3, 4, 5, 6]);
    let reasons: Vec<&str> =
        malformed["first"].as_array().unwrap().iter().map(|m| m["reason"].as_str().unwrap()).collect();
    assert!(reasons[0].contains("1970-01-01T00:00:00Z") && reasons[0].contains("before 2000"), "{reasons:?}");
    assert!(
        reasons[1].contains("9999-12-31T23:59:59Z") && reasons[1].contains("a day past this machine's clock"),
        "{reasons:?}"
    );
    assert_eq!(
        (report["start"].as_str(), report["end"].as_str()),
        (Some("2026-12-01T10:00:00Z"), Some("2026-12-01T10:00:30Z"))
    );
    assert_eq!(report["replayed_ms"], 30_000, "the skipped lines moved no clock");
    assert_eq!(report["out_of_order"]["lines"], 0, "{report}");
    assert_eq!(report["denials_over_time"]["bucket_ms"], 1_000);

    let out = slidegate(&["replay", "--config", config.to_str().unwrap(), log.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("5 malformed"), "{text}");
    assert!(
        text.contains("4 of the malformed lines are dated before 2000-01-01T00:00:00Z or after "),
        "{text}"
    );
}

/// Two lines 24 years apart under 3 rules: the chart keeps at most 120
/// buckets per rule (here 79 of 112 days: 8766 days from 2001 to 2025),
/// in the JSON and the SVG alike, and both stay small.
#[test]
fn the_chart_keeps_at_most_120_buckets_whatever_the_span() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        "slidegate.toml",
        r#"
[[rules]]
name = "a"
path = "/a"
limits = [{ limit = 1, window = "60s" }]

[[rules]]
name = "b"
path = "/b"
limits = [{ limit = 1, window = "60s" }]

[[rules]]
name = "c"
path = "/c"
limits = [{ limit = 1, window = "60s" }]
"#,
    );
    let mut log = String::new();
    for time in ["01/Jan/2001:00:00:00 +0000", "01/Jan/2025:00:00:00 +0000"] {
        for target in ["/a", "/a", "/b", "/b", "/c"] {
            log += &combined_at("203.0.113.7", time, target);
        }
    }
    let log = write(dir.path(), "access.log", log);
    let svg = dir.path().join("refused.svg");
    let out = slidegate(&[
        "replay",
        "--config",
        config.to_str().unwrap(),
        "--json",
        "--svg",
        svg.to_str().unwrap(),
        log.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(out.stdout.len() < 16 * 1024, "JSON of {} bytes", out.stdout.len());
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["replayed_ms"], 8766 * 86_400_000u64);
    let over_time = &report["denials_over_time"];
    assert_eq!(over_time["bucket_ms"], 112 * 86_400_000u64, "{over_time}");
    for (name, refused) in [("a", 2), ("b", 2), ("c", 0)] {
        let series: Vec<u64> =
            over_time["rules"][name].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        assert_eq!(series.len(), 79, "{name}");
        assert_eq!(series.iter().sum::<u64>(), refused, "{name}: {series:?}");
        assert_eq!((series[0], series[78]), (refused / 2, refused / 2), "{name}: first and last buckets");
    }
    let text = std::fs::read_to_string(&svg).unwrap();
    assert_well_formed(&text);
    assert!(text.len() < 32 * 1024, "SVG of {} bytes", text.len());
    let paths: Vec<&str> = text.split("<path d=\"").skip(1).collect();
    assert_eq!(paths.len(), 3, "one line per rule");
    for path in paths {
        let d = &path[..path.find('"').unwrap()];
        assert_eq!(d.matches(" L").count(), 78, "79 points: {d}");
    }
    assert!(text.contains("buckets of 112 d"), "the axis names the width");

    let out = slidegate(&["replay", "--config", config.to_str().unwrap(), log.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("2001-01-01T00:00:00Z to 2025-01-01T00:00:00Z (8766 d)"), "{text}");
}

/// What only `serve` uses is not asked for: the variable `check_token_env`
/// names may be unset, the TLS files missing. `check-config` still refuses
/// the same file, and what the replay does use (`max_delayed`) is checked.
#[test]
fn replay_needs_nothing_only_serve_uses() {
    let dir = tempfile::tempdir().unwrap();
    let var = "SLIDEGATE_TEST_REPLAY_UNSET_CHECK_TOKEN";
    let server = format!(
        "[server]\nupstream = \"http://127.0.0.1:9\"\ncheck_token_env = \"{var}\"\n\
         admin_listen = \"127.0.0.1:9091\"\ntls = {{ cert = \"missing.pem\", key = \"missing.key\" }}\n"
    );
    let config = write(dir.path(), "slidegate.toml", format!("{server}{CONFIG}"));
    let log: String = (0..12).map(|s| combined("203.0.113.7", s, "/api/a", 200)).collect();
    let log = write(dir.path(), "access.log", log);
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_slidegate")).args(args).env_remove(var).output().unwrap()
    };
    let out = run(&["replay", "--config", config.to_str().unwrap(), "--json", log.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(counts(rule(&report, "api")), (12, 10, 2, 0), "{report}");

    let out = run(&["check-config", "--config", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(64), "serve would not start: {}", stderr(&out));
    assert!(stderr(&out).contains(var), "{}", stderr(&out));

    let bad = write(dir.path(), "bad.toml", format!("{server}max_delayed = 0\n{CONFIG}"));
    let out = run(&["replay", "--config", bad.to_str().unwrap(), log.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(stderr(&out).contains("bad.toml:6:") && stderr(&out).contains("max_delayed"), "{}", stderr(&out));
}
