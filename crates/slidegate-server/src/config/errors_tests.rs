//! A file with several errors: each part's first error reported, located,
//! in file order, and nothing reported twice.

use super::tests::{no_env, parse};
use super::validate::Use;
use super::*;

/// Every error of `source`, as (line, column, message) in file order.
fn errors(source: &str) -> Vec<(usize, usize, String)> {
    let e = parse(source).unwrap_err();
    e.errors()
        .iter()
        .map(|e| match e {
            ConfigError::Invalid { line, column, message, .. } => (*line, *column, message.clone()),
            other => panic!("not located: {other}"),
        })
        .collect()
}

/// Three parts, three errors of different kinds (a key the table does not
/// have, a value out of range, a limit that admits nothing): one pass
/// reports each, located, in file order, and the valid parts add none.
#[test]
fn every_part_with_an_error_is_reported_in_file_order() {
    let source = "[server]\nlisten = \"127.0.0.1:8080\"\nlisten_on = 1\n\n\
                  [store]\ntimeout_ms = 0\n\n\
                  [[rules]]\nname = \"ok\"\npath = \"/ok\"\nlimits = [{ limit = 5, window = \"1s\" }]\n\n\
                  [[rules]]\nname = \"zero\"\npath = \"/zero\"\nlimits = [{ limit = 0, window = \"1s\" }]\n";
    let found = errors(source);
    let at: Vec<(usize, usize)> = found.iter().map(|(l, c, _)| (*l, *c)).collect();
    assert_eq!(at, [(3, 1), (6, 14), (16, 21)], "{found:?}");
    assert!(found[0].2.starts_with("unknown field `listen_on`"), "{found:?}");
    assert_eq!(found[1].2, "timeout_ms must be at least 1");
    assert_eq!(found[2].2, "invalid limit: limit must be at least 1, got 0");
    let shown = parse(source).unwrap_err().to_string();
    let lines: Vec<&str> = shown.lines().filter(|l| l.starts_with("t.toml:")).collect();
    assert_eq!(lines.len(), 3, "{shown}");
    assert!(lines[1].starts_with("t.toml:6:14: timeout_ms must be at least 1"), "{shown}");
    assert!(shown.ends_with("\n3 errors"), "{shown}");
    assert_eq!(parse(source).unwrap_err().location(), Some((3, 1)));
}

/// A part stops at its first error; the same rule is one part.
#[test]
fn a_part_reports_its_first_error_only() {
    let source = "[store]\ntimeout_ms = 0\nbreaker_failures = 0\n\
                  [[rules]]\nname = \"bad name\"\npath = \"/\"\nlimits = [{ limit = 0, window = \"1s\" }]\n";
    let at: Vec<(usize, usize)> = errors(source).iter().map(|(l, c, _)| (*l, *c)).collect();
    assert_eq!(at, [(2, 14), (5, 8)]);
    // One error stays a plain `Invalid`.
    assert!(matches!(parse("[store]\ntimeout_ms = 0\n"), Err(ConfigError::Invalid { .. })));
}

/// Every syntax error is reported (the first of each line: what follows
/// on the line is the parser recovering), and nothing else: a file that is
/// not TOML has no parts to check.
#[test]
fn every_syntax_error_is_reported_and_nothing_else() {
    let source = "[server]\nlisten = \n[store]\ntimeout_ms = = 3\nbogus = 1\n[[rules]]\nname = \"a\nb = 1\n";
    let found = errors(source);
    let at: Vec<(usize, usize)> = found.iter().map(|(l, c, _)| (*l, *c)).collect();
    assert_eq!(at, [(2, 10), (4, 14), (7, 10)], "{found:?}");
}

/// A part that could not be read is not also reported missing by a check
/// that spans parts: an unreadable `[server]` is no missing upstream, an
/// unreadable `[identity]` no missing hash secret. Duplicate rule names are
/// still found among the rules that read.
#[test]
fn an_unreadable_part_is_not_also_reported_missing() {
    let text = "[server]\nupstrem = \"http://127.0.0.1:1\"\n";
    let err = Config::parse_for(text, "t.toml".as_ref(), &no_env, Use::Serve).unwrap_err();
    assert_eq!(err.errors().len(), 1, "{err}");
    assert!(err.to_string().starts_with("t.toml:2:1: unknown field `upstrem`"), "{err}");

    let text = "[store]\nurl = \"redis://127.0.0.1:1\"\n[identity]\nip_hash_secret = \"x\"\n";
    let found = errors(text);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].2.starts_with("unknown field `ip_hash_secret`"), "{found:?}");

    let rule = |name: &str, limit: u64| {
        format!(
            "[[rules]]\nname = \"{name}\"\npath = \"/\"\nlimits = [{{ limit = {limit}, window = \"1s\" }}]\n"
        )
    };
    let text = format!("{}{}{}{}", rule("a", 1), rule("b", 0), rule("a", 2), "[identity]\nipv6_prefix = 0\n");
    let found = errors(&text);
    let messages: Vec<&str> = found.iter().map(|(_, _, m)| m.as_str()).collect();
    assert_eq!(
        messages,
        [
            "invalid limit: limit must be at least 1, got 0",
            "duplicate rule name \"a\": rule names must be unique",
            "ipv6_prefix must be 1 to 128, got 0",
        ]
    );
}
