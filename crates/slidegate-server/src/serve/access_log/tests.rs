//! The access log: its lines, escaping, dates, sampling, a full channel, reopening.

use super::*;
use slidegate::{Identity, IdentityHasher};

fn identity() -> IdentityHash {
    let identity: Identity = IdentityHasher::new(b"s").identity("search", slidegate::Source::ApiKey, b"k-1");
    (&identity).into()
}

fn record() -> Record {
    Record {
        time: UNIX_EPOCH + Duration::from_millis(1_764_618_371_123),
        rule: "search".into(),
        policy: Some("per_second".into()),
        identity: identity(),
        outcome: Outcome::Denied,
        remaining: Some(0),
        decide: Duration::from_micros(42),
        held: None,
        source: Source::Cache,
        method: Method::POST,
        status: 429,
        path: "/api/search".into(),
    }
}

#[test]
fn a_record_is_one_json_line_with_every_field_in_order() {
    let mut out = Vec::new();
    record().write_json(&mut out);
    let hex = identity().short_hex();
    let expected = format!(
        "{{\"time\":\"2025-12-01T19:46:11.123Z\",\"rule\":\"search\",\"policy\":\"per_second\",\
         \"identity\":\"{hex}\",\"kind\":\"api_key\",\"outcome\":\"denied\",\"remaining\":0,\
         \"decide_us\":42,\"source\":\"cache\",\"method\":\"POST\",\"status\":429,\
         \"path\":\"/api/search\"}}\n"
    );
    assert_eq!(String::from_utf8(out).unwrap(), expected);
    assert_eq!(hex.len(), 16);
}

#[test]
fn a_delayed_request_says_so_and_how_long_it_was_held() {
    let mut out = Vec::new();
    let record = Record {
        outcome: Outcome::Delayed,
        held: Some(Duration::from_millis(480)),
        status: 200,
        source: Source::Store,
        ..record()
    };
    record.write_json(&mut out);
    let hex = identity().short_hex();
    let expected = format!(
        "{{\"time\":\"2025-12-01T19:46:11.123Z\",\"rule\":\"search\",\"policy\":\"per_second\",\
         \"identity\":\"{hex}\",\"kind\":\"api_key\",\"outcome\":\"delayed\",\"remaining\":0,\
         \"decide_us\":42,\"held_ms\":480,\"source\":\"store\",\"method\":\"POST\",\"status\":200,\
         \"path\":\"/api/search\"}}\n"
    );
    assert_eq!(String::from_utf8(out).unwrap(), expected);
}

#[test]
fn hostile_text_is_escaped_and_a_missing_decision_is_null() {
    let mut out = Vec::new();
    let record = Record {
        path: "/a\"b\\c\n\u{1}é".into(),
        method: Method::from_bytes(b"X-\"Q").unwrap_or(Method::GET),
        policy: None,
        remaining: None,
        outcome: Outcome::FailOpen,
        source: Source::None,
        ..record()
    };
    record.write_json(&mut out);
    let text = String::from_utf8(out).unwrap();
    assert_eq!(text.matches('\n').count(), 1, "{text}");
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(value["path"], "/a\"b\\c\n\u{1}é");
    assert_eq!(value["policy"], serde_json::Value::Null);
    assert_eq!(value["remaining"], serde_json::Value::Null);
    assert_eq!(value["outcome"], "fail_open");
    assert_eq!(value["source"], "none");
}

#[test]
fn dates_are_utc_civil_dates() {
    assert_eq!(rfc3339_millis(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
    // A leap day, and the last millisecond of a leap year.
    assert_eq!(rfc3339_millis(UNIX_EPOCH + Duration::from_secs(951_782_400)), "2000-02-29T00:00:00.000Z");
    assert_eq!(
        rfc3339_millis(UNIX_EPOCH + Duration::from_millis(1_735_689_599_999)),
        "2024-12-31T23:59:59.999Z"
    );
}

fn config(path: AccessLogPath, sample_allowed: f64) -> AccessLogConfig {
    AccessLogConfig { path, sample_allowed }
}

#[test]
fn sampling_logs_exactly_the_share_of_allowed_requests() {
    let dir = tempfile::tempdir().unwrap();
    for (rate, of_1000) in [(0.0, 0), (0.01, 10), (0.5, 500), (0.3, 300), (0.001, 1), (1.0, 1000)] {
        let (log, writer) =
            AccessLog::start(&config(AccessLogPath::File(dir.path().join("a.jsonl")), rate)).unwrap();
        let logged = (0..1000).filter(|_| log.samples_allowed()).count();
        assert_eq!(logged, of_1000, "sample_allowed = {rate}");
        drop(log);
        writer.finish();
    }
}

#[test]
fn a_full_channel_drops_and_counts_and_what_it_held_is_written_at_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.jsonl");
    let config = config(AccessLogPath::File(path.clone()), 1.0);
    // No writer yet: the channel holds 2, the other 998 are dropped.
    let (log, receiver) = AccessLog::channel(&config, 2);
    for _ in 0..1000 {
        log.write(Entry { record: record() }, http::StatusCode::TOO_MANY_REQUESTS);
    }
    assert_eq!(log.dropped(), 998);
    let shared = Arc::clone(&log.shared);
    drop(log);
    write_lines(&receiver, Output::open(&config.path).unwrap(), &shared);
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), 2);
    let mut expected = Vec::new();
    Record { status: 429, ..record() }.write_json(&mut expected);
    assert_eq!(text.lines().next().map(|l| format!("{l}\n")).unwrap().as_bytes(), &expected[..]);
}

#[test]
fn reopen_writes_on_in_a_new_file_after_the_old_one_moved() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.jsonl");
    let config = config(AccessLogPath::File(path.clone()), 1.0);
    let (log, writer) = AccessLog::start(&config).unwrap();
    log.write(Entry { record: record() }, http::StatusCode::OK);
    // Wait for the line: the writer flushes when the channel is empty.
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read(&path).map_or(0, |b| b.len()) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::fs::rename(&path, dir.path().join("access.jsonl.1")).unwrap();
    log.reopener().reopen();
    log.write(Entry { record: record() }, http::StatusCode::OK);
    drop(log);
    writer.finish();
    assert_eq!(std::fs::read_to_string(dir.path().join("access.jsonl.1")).unwrap().lines().count(), 1);
    assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 1);
}
