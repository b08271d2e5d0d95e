//! Bad input gets a clear error naming what was wrong — never a panic.

use std::process::{Command, Output, Stdio};

fn slidegate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_slidegate")).args(args).output().expect("run slidegate")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn zero_counts_are_rejected_with_the_flag_named() {
    for (args, flag) in [
        (&["accuracy", "--requests", "0"][..], "--requests"),
        (&["accuracy", "--sources", "0"][..], "--sources"),
        (&["demo", "--identities", "0"][..], "--identities"),
        (&["bench", "redis", "--redis-url", "redis://127.0.0.1:1", "--seconds", "0"][..], "--seconds"),
        (
            &["bench", "redis", "--redis-url", "redis://127.0.0.1:1", "--connections", "0"][..],
            "--connections",
        ),
    ] {
        let out = slidegate(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = stderr(&out);
        assert!(err.contains(&format!("invalid value '0' for '{flag}")), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn an_unreachable_redis_is_named_in_the_error() {
    let out = slidegate(&["demo", "--redis-url", "redis://127.0.0.1:1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).starts_with("slidegate: cannot reach Redis at redis://127.0.0.1:1: "),
        "{}",
        stderr(&out)
    );
    let out = slidegate(&["demo", "--redis-url", "not a url"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).starts_with("slidegate: cannot reach Redis at not a url: "), "{}", stderr(&out));
}

#[test]
fn a_reader_that_goes_away_ends_the_output_quietly() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .args(["accuracy", "--requests", "20000", "--sources", "50"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run slidegate");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait for slidegate");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
}
