//! `[[plans]]`, `plans_file` and `default_plan`: what they compile to, and
//! every way they can be wrong, located.

use std::path::Path;

use slidegate::{IdentityHasher, Source};

use super::*;

const RULES: &str = r#"
[identity]
api_key_header = "x-api-key"
plans_file = "keys.txt"
default_plan = "free"

[[rules]]
name = "search"
path = "/search"
limits = [{ limit = 10, window = "1m" }]

[[rules]]
name = "by-ip"
path = "/ip"
identity = "ip"
limits = [{ limit = 10, window = "1m" }]

[[plans]]
name = "free"
limits.search = [{ limit = 5, window = "1m" }]

[[plans]]
name = "pro"
[plans.limits]
search = [{ name = "pro-search", limit = 1000, window = "1m" }, { limit = 20000, window = "1h" }]
"#;

/// `config` with `keys` as `keys.txt` beside it, in a fresh directory.
fn load(config: &str, keys: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("keys.txt"), keys).unwrap();
    Config::parse_with_env(config, dir.path().join("slidegate.toml"), env)
}

fn no_env(_: &str) -> Option<String> {
    None
}

fn with_secret(name: &str) -> Option<String> {
    (name == "SECRET").then(|| "s3cret".to_owned())
}

/// The error's file name, line, column and message.
fn located(err: ConfigError) -> (String, usize, usize, String) {
    let ConfigError::Invalid { path, line, column, message, .. } = err else { panic!("{err}") };
    let file = Path::new(&path).file_name().unwrap().to_string_lossy().into_owned();
    (file, line, column, message)
}

#[test]
fn plans_compile_with_their_names_and_keys() {
    let c = load(RULES, "# key plan\nalice pro\n\n  bob   free  \n", &no_env).unwrap();
    let plans = &c.limiter.plans;
    assert_eq!(plans.plans.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["free", "pro"]);
    assert_eq!(plans.default_plan, Some(0));
    let free = plans.plans[0].limits_of("search").unwrap();
    assert_eq!((free[0].name.as_str(), free[0].limit.quota.permits()), ("free-search", 5));
    let pro: Vec<&str> =
        plans.plans[1].limits_of("search").unwrap().iter().map(|l| l.name.as_str()).collect();
    assert_eq!(pro, ["pro-search", "pro-search-1h"]);
    // No secret: the keys wait, as they are, for the limiter's own.
    assert_eq!(
        plans.keys.raw_keys().map(|(k, p)| (k.to_vec(), p)).collect::<Vec<_>>(),
        [(b"alice".to_vec(), 1), (b"bob".to_vec(), 0)]
    );
    assert!(!format!("{c:?}").contains("alice"), "a key is never in a debug dump");
}

#[test]
fn with_a_secret_keys_are_kept_as_digests_only() {
    let config = RULES.replace("[identity]\n", "[identity]\nip_hash_secret_env = \"SECRET\"\n");
    let digest = IdentityHasher::new(b"s3cret").digest(Source::ApiKey, b"carol");
    let keys = format!("alice pro\nhash:{digest} free\n");
    let c = load(&config, &keys, &with_secret).unwrap();
    let alice = IdentityHasher::new(b"s3cret").digest(Source::ApiKey, b"alice");
    assert_eq!(c.limiter.plans.keys.digests(), [(alice, 1), (digest, 0)]);
    assert_eq!(c.limiter.plans.keys.raw_keys().count(), 0);
    // The same key as itself and as its hash is one key twice.
    let twice = format!("carol pro\nhash:{digest} free\n");
    let (file, line, column, message) = located(load(&config, &twice, &with_secret).unwrap_err());
    assert_eq!((file.as_str(), line, column), ("keys.txt", 2, 1));
    assert_eq!(message, "this key is already mapped, at line 1: one line per key");
}

#[test]
fn keys_file_errors_name_the_keys_files_line_and_column() {
    let cases: &[(&str, usize, usize, &str)] = &[
        ("alice pro\nbob gold\n", 2, 5, "unknown plan \"gold\": [[plans]] defines \"free\", \"pro\""),
        ("alice\n", 1, 1, "1 fields: expected `KEY PLAN` or `k:<32 hex digits> PLAN`"),
        ("a b c\n", 1, 1, "3 fields: expected `KEY PLAN` or `k:<32 hex digits> PLAN`"),
        ("# c\nalice pro\n\nalice free\n", 4, 1, "this key is already mapped, at line 2: one line per key"),
        ("a,b pro\n", 1, 1, "a key with a comma: serve refuses such a request with 400, and never counts it"),
        ("hash:xyz pro\n", 1, 1, "invalid key hash"),
        (
            "hash:0123456789abcdef0123456789abcdef pro\n",
            1,
            1,
            "a key given as its hash needs [identity] ip_hash_secret_env",
        ),
        ("k\u{7}x pro\n", 1, 1, "a key with a control character"),
    ];
    for (keys, line, column, message) in cases {
        let (file, l, c, m) = located(load(RULES, keys, &no_env).unwrap_err());
        assert_eq!((file.as_str(), l, c), ("keys.txt", *line, *column), "{keys:?}: {m}");
        assert!(m.starts_with(message), "{keys:?}: {m}");
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("keys.txt"), b"alice pro\nsk-\xff pro\n").unwrap();
    let err = Config::parse_with_env(RULES, dir.path().join("slidegate.toml"), &no_env).unwrap_err();
    assert!(!err.to_string().contains("sk-"), "no excerpt of a key: {err}");
    let (file, line, column, m) = located(err);
    assert_eq!((file.as_str(), line, column), ("keys.txt", 2, 4));
    assert!(m.starts_with("invalid UTF-8 (byte 0xff)"), "{m}");
    let long = format!("{} pro\n", "k".repeat(1025));
    let (_, _, _, m) = located(load(RULES, &long, &no_env).unwrap_err());
    assert_eq!(m, "a key of 1025 bytes: expected at most 1024");
}

#[test]
fn a_keys_file_over_the_bound_is_refused_without_being_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let keys = std::fs::File::create(dir.path().join("keys.txt")).unwrap();
    // Sparse: a file of 1 GiB that takes no space.
    keys.set_len(1 << 30).unwrap();
    let err = Config::parse_with_env(RULES, dir.path().join("slidegate.toml"), &no_env).unwrap_err();
    let (file, line, column, message) = located(err);
    assert_eq!((file.as_str(), line, column), ("slidegate.toml", 4, 14));
    assert!(message.contains("larger than 64 MiB"), "{message}");
    let err = Config::parse_with_env(RULES, dir.path().join("sub/slidegate.toml"), &no_env).unwrap_err();
    assert!(located(err).3.contains("cannot read it"));
}

#[test]
fn plan_errors_are_located_in_the_configuration() {
    let cases: &[(&str, &str, &str)] = &[
        ("limits.search = [{ limit = 5, window = \"1m\" }]", "limits.nope = [{ limit = 5, window = \"1m\" }]",
         "plan \"free\" sets limits for rule \"nope\", which no [[rules]] entry names; rules: \"search\", \"by-ip\""),
        ("limits.search = [{ limit = 5, window = \"1m\" }]", "limits.by-ip = [{ limit = 5, window = \"1m\" }]",
         "rule \"by-ip\" counts by client IP (identity = \"ip\"): plans apply to API keys"),
        ("name = \"pro\"", "name = \"free\"", "duplicate plan name \"free\": plan names must be unique"),
        ("name = \"pro\"", "name = \"p r o\"", "invalid plan name \"p r o\""),
        ("default_plan = \"free\"", "default_plan = \"gold\"", "unknown plan \"gold\": [[plans]] defines \"free\", \"pro\""),
        ("api_key_header = \"x-api-key\"\n", "", "plans apply to API keys: set [identity] api_key_header"),
    ];
    for (from, to, message) in cases {
        let config = RULES.replacen(from, to, 1);
        assert_ne!(config, RULES);
        let (file, line, _, m) = located(load(&config, "", &no_env).unwrap_err());
        assert_eq!(file, "slidegate.toml");
        let at = config.lines().nth(line - 1).unwrap();
        assert!(m.starts_with(message), "{to}: {m}");
        if to.is_empty() {
            assert_eq!(at, "[[plans]]", "the first plan needs the header");
        } else {
            assert_eq!(at.trim(), *to, "located at the value");
        }
    }
}

#[test]
fn a_plan_without_limits_for_a_rule_leaves_the_rules_own() {
    let config = RULES.replace("limits.search = [{ limit = 5, window = \"1m\" }]", "");
    let c = load(&config, "", &no_env).unwrap();
    assert!(c.limiter.plans.plans[0].limits_of("search").is_none());
    let empty = RULES.replace("limits.search = [{ limit = 5, window = \"1m\" }]", "limits.search = []");
    let (_, line, _, m) = located(load(&empty, "", &no_env).unwrap_err());
    assert_eq!(line, 20);
    assert!(m.contains("empty limit list"), "{m}");
}

/// A rule or plan that failed is reported once: the plans naming it, and
/// the keys file naming a plan that did not read, add no error of their own.
#[test]
fn a_failed_part_is_not_reported_again_by_the_plans() {
    let broken_rule = RULES.replacen(
        "limits = [{ limit = 10, window = \"1m\" }]",
        "limits = [{ limit = 0, window = \"1m\" }]",
        1,
    );
    let err = load(&broken_rule, "alice pro\n", &no_env).unwrap_err();
    let found: Vec<String> = err.errors().iter().map(located_message).collect();
    assert_eq!(found, ["invalid limit: limit must be at least 1, got 0"]);
    let broken_plan = RULES.replacen("name = \"pro\"", "name = \"pro\"\nlimitz = 1", 1);
    let err = load(&broken_plan, "alice pro\nbob free\n", &no_env).unwrap_err();
    assert_eq!(err.errors().len(), 1, "{err}");
    assert!(err.to_string().contains("unknown field `limitz`"), "{err}");
}

fn located_message(err: &ConfigError) -> String {
    match err {
        ConfigError::Invalid { message, .. } => message.clone(),
        other => other.to_string(),
    }
}
