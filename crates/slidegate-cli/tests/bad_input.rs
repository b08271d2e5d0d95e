//! Bad input gets a clear error naming what was wrong — never a panic.

use std::process::{Command, Output, Stdio};

fn slidegate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_slidegate")).args(args).output().expect("run slidegate")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn out_of_range_values_are_rejected_with_the_flag_named() {
    let bench = ["bench", "redis", "--redis-url", "redis://127.0.0.1:1"];
    for (args, flag, value) in [
        (vec!["accuracy", "--requests", "0"], "--requests", "0"),
        (vec!["accuracy", "--requests", "18446744073709551615"], "--requests", "18446744073709551615"),
        (vec!["accuracy", "--sources", "0"], "--sources", "0"),
        (vec!["accuracy", "--lease-instances", "65"], "--lease-instances", "65"),
        (vec!["demo", "--identities", "0"], "--identities", "0"),
        ([&bench[..], &["--seconds", "0"]].concat(), "--seconds", "0"),
        ([&bench[..], &["--seconds", "1e300"]].concat(), "--seconds", "1e300"),
        ([&bench[..], &["--seconds", "NaN"]].concat(), "--seconds", "NaN"),
        ([&bench[..], &["--connections", "0"]].concat(), "--connections", "0"),
    ] {
        let out = slidegate(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = stderr(&out);
        assert!(err.contains(&format!("invalid value '{value}' for '{flag}")), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn an_unknown_engine_is_rejected_with_the_expected_names() {
    for args in [
        &["bench", "redis", "--redis-url", "redis://127.0.0.1:1", "--engine", "native"][..],
        &["bench", "attack", "--redis-url", "redis://127.0.0.1:1", "--engine", "native"][..],
        &["demo", "--redis-url", "redis://127.0.0.1:1", "--engine", "native"][..],
    ] {
        let out = slidegate(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = stderr(&out);
        assert!(
            err.contains(
                "invalid value 'native' for '--engine <auto|lua|module>': unknown engine \"native\": \
                 expected \"auto\", \"lua\" or \"module\""
            ),
            "{args:?}: {err}"
        );
    }
    // A known engine parses: the run then fails on the unreachable Redis.
    let out = slidegate(&["demo", "--redis-url", "redis://127.0.0.1:1", "--engine", "module"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).starts_with("slidegate: cannot reach Redis"), "{}", stderr(&out));
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
