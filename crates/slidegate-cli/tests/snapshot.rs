//! `[store] snapshot`: the embedded store's counters and penalty box across
//! a restart of the real `slidegate serve` — a graceful stop keeps every
//! count, a SIGKILL loses at most the interval, and a truncated file is
//! refused or started empty as configured.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use common::*;

/// Five per hour on `/api`, one per hour on `/login` with a penalty that
/// blocks for an hour at the second denial; the snapshot at `snapshot`.
fn config(upstream: &Upstream, snapshot: &Path, store: &str) -> String {
    format!(
        r#"{head}
[[rules]]
name = "api"
path = "/api*"
limits = [{{ limit = 5, window = "1h" }}]

[[rules]]
name = "log"
path = "/slog*"
limits = [{{ limit = 5, window = "1h", algorithm = "sliding_log" }}]

[[rules]]
name = "login"
path = "/login"
limits = [{{ limit = 1, window = "1h" }}]
penalty = {{ after = 1, within = "1h", block = "1h" }}
"#,
        head = keyed_head(
            upstream.addr,
            "",
            &format!("[store]\nsnapshot = \"{}\"\n{store}", snapshot.display())
        ),
    )
}

fn key(sg: &Slidegate, path: &str, key: &str) -> Reply {
    sg.get(path, &[("x-api-key", key)])
}

/// How many of `n` requests in a row are forwarded.
fn admitted(sg: &Slidegate, path: &str, who: &str, n: usize) -> usize {
    (0..n).filter(|_| key(sg, path, who).status == 200).count()
}

fn blocked(reply: &Reply) -> bool {
    reply.status == 429 && reply.body.contains("abnormal-usage-detected")
}

fn snapshot_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.snap");
    (dir, path)
}

#[test]
fn a_restart_keeps_the_counts_and_the_penalty_box() {
    let upstream = Upstream::start();
    let (_dir, path) = snapshot_dir();
    let text = config(&upstream, &path, "");
    let mut before = Slidegate::start(&text);
    assert_eq!(admitted(&before, "/api/a", "spender", 3), 3);
    assert_eq!(admitted(&before, "/slog/a", "spender", 4), 4);
    assert_eq!(key(&before, "/login", "scraper").status, 200);
    assert_eq!(key(&before, "/login", "scraper").status, 429, "one denial tolerated");
    assert!(blocked(&key(&before, "/login", "scraper")), "the second denial blocks");
    assert!(before.terminate().success());
    assert!(before.log.lock().unwrap().contains("snapshot written at the end of the drain"));
    drop(before);

    let after = Slidegate::start(&text);
    assert!(after.log.lock().unwrap().contains("counters and penalty box restored from the snapshot"));
    assert_eq!(admitted(&after, "/api/b", "spender", 5), 2, "3 of 5 spent before the restart");
    assert_eq!(admitted(&after, "/slog/b", "spender", 5), 1, "4 of 5 spent before the restart");
    assert!(blocked(&key(&after, "/login", "scraper")), "still in the penalty box");
    assert_eq!(admitted(&after, "/api/b", "newcomer", 6), 5);
    assert_eq!(key(&after, "/login", "newcomer").status, 200);
}

/// The snapshot's modification time.
fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

#[test]
fn a_sigkill_loses_at_most_the_interval() {
    let upstream = Upstream::start();
    let (_dir, path) = snapshot_dir();
    let text = config(&upstream, &path, "snapshot_interval = \"1s\"\n");
    let mut before = Slidegate::start(&text);
    assert_eq!(admitted(&before, "/api/a", "spender", 3), 3);
    // The next interval's snapshot holds the three.
    let spent = SystemTime::now();
    wait_for("a snapshot after the requests", Duration::from_secs(10), || {
        modified(&path).is_some_and(|m| m > spent)
    });
    // One more, then no time for a graceful anything.
    assert_eq!(admitted(&before, "/api/a", "spender", 1), 1);
    before.child.kill().unwrap();
    before.child.wait().unwrap();
    assert!(!before.log.lock().unwrap().contains("end of the drain"));
    drop(before);

    let after = Slidegate::start(&text);
    // The three are kept; the fourth, made after the last snapshot, may be lost.
    let left = admitted(&after, "/api/b", "spender", 5);
    assert!((1..=2).contains(&left), "{left} admitted after 4 of 5 were spent");
}

/// A start with `text`, expected to fail: its exit status and stderr.
fn refused_start(text: &str) -> (Option<i32>, String) {
    let (_dir, config) = write_config(text);
    let out = Command::new(binary())
        .args(["serve", "--config"])
        .arg(&config)
        .env(SECRET_ENV, "end-to-end-secret")
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_truncated_snapshot_is_refused_or_started_empty_as_configured() {
    let upstream = Upstream::start();
    let (_dir, path) = snapshot_dir();
    let mut before = Slidegate::start(&config(&upstream, &path, ""));
    assert_eq!(admitted(&before, "/api/a", "spender", 5), 5);
    assert!(before.terminate().success());
    drop(before);
    let whole = std::fs::read(&path).unwrap();
    let cut = whole.len() - 10;
    std::fs::write(&path, &whole[..cut]).unwrap();

    let (code, stderr) = refused_start(&config(&upstream, &path, "snapshot_corrupt = \"refuse\"\n"));
    assert_eq!(code, Some(1), "{stderr}");
    let expected = format!(
        "snapshot {} is unusable: its checksum does not match its contents: the file is truncated or was altered",
        path.display()
    );
    assert!(stderr.contains(&expected), "{stderr}");
    assert_eq!(std::fs::read(&path).unwrap().len(), cut, "refused: the file is left as it was");

    let after = Slidegate::start(&config(&upstream, &path, ""));
    assert!(after.log.lock().unwrap().contains("snapshot unusable: starting with empty counters"));
    assert_eq!(admitted(&after, "/api/b", "spender", 6), 5, "an empty start");
    let mut aside = path.clone().into_os_string();
    aside.push(".corrupt");
    assert_eq!(std::fs::read(&aside).unwrap().len(), cut, "kept aside for a look");
}

#[test]
fn check_config_validates_the_snapshot_keys() {
    let upstream = Upstream::start();
    let (dir, path) = snapshot_dir();
    let check = |text: &str| {
        let (_config_dir, config) = write_config(text);
        let out =
            Command::new(binary()).arg("check-config").arg(&config).env(SECRET_ENV, "s").output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stdout, stderr) = check(&config(&upstream, &path, "snapshot_interval = \"10s\"\n"));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains(&format!("embedded, snapshot {} every 10s", path.display())), "{stdout}");
    let missing = dir.path().join("nowhere").join("state.snap");
    let cases = [
        (
            config(&upstream, &missing, ""),
            format!(
                "snapshot {}: its directory {} does not exist",
                missing.display(),
                missing.parent().unwrap().display()
            ),
        ),
        (config(&upstream, dir.path(), ""), format!("snapshot {}: is a directory", dir.path().display())),
        (config(&upstream, &path, "snapshot_interval = \"soon\"\n"), "invalid duration".to_owned()),
        (
            config(&upstream, &path, "snapshot_interval = \"100ms\"\n"),
            "snapshot_interval \"100ms\" is out of range: expected 1s to 24h".to_owned(),
        ),
        (
            config(&upstream, &path, "snapshot_corrupt = \"ignore\"\n"),
            "unknown snapshot_corrupt \"ignore\": expected \"start-empty\"".to_owned(),
        ),
        (
            config(&upstream, &path, "url = \"redis://127.0.0.1:1\"\n"),
            "snapshot keeps the embedded store's counters across restarts; Redis keeps its own".to_owned(),
        ),
        (
            config(&upstream, &path, "").replace("ip_hash_secret_env", "# ip_hash_secret_env"),
            "a snapshot needs [identity] ip_hash_secret_env".to_owned(),
        ),
        (
            keyed_head(upstream.addr, "", "[store]\nsnapshot_interval = \"5s\"\n"),
            "snapshot_interval needs `snapshot = \"<file>\"` in [store]".to_owned(),
        ),
    ];
    for (text, expected) in cases {
        let (code, _, stderr) = check(&text);
        assert_eq!(code, Some(64), "{expected}: {stderr}");
        assert!(stderr.contains(&expected), "expected {expected:?} in:\n{stderr}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let locked = dir.path().join("locked");
        std::fs::create_dir(&locked).unwrap();
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o500)).unwrap();
        let file = locked.join("state.snap");
        // Root writes anywhere: the check only means something for others.
        if std::fs::write(locked.join("probe"), b"").is_err() {
            let (code, _, stderr) = check(&config(&upstream, &file, ""));
            assert_eq!(code, Some(64), "{stderr}");
            assert!(
                stderr.contains(&format!("cannot write in its directory {}", locked.display())),
                "{stderr}"
            );
        }
    }
}
