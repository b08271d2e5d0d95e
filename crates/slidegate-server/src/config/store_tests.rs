//! `[store]`: a server, a Cluster or Sentinel, credentials, TLS, the engine
//! and the key layout, with located errors.

use slidegate::{Buckets, Engine, Layout, RedisTarget};

use super::*;

/// `[store]` with `body`, parsed with `REDIS_PW` set to "s3cret" (and the
/// hash secret a shared store needs, after the store so lines stay put).
fn parse_store(body: &str) -> Result<Config, ConfigError> {
    let env = |name: &str| match name {
        "REDIS_PW" => Some("s3cret".to_owned()),
        "HASH_SECRET" => Some("h".to_owned()),
        _ => None,
    };
    let source = format!("[store]\n{body}\n[identity]\nip_hash_secret_env = \"HASH_SECRET\"\n");
    Config::parse_with_env(&source, "t.toml", &env)
}

fn store_err(body: &str) -> (usize, usize, String) {
    let e = parse_store(body).unwrap_err();
    let (line, column) = e.location().unwrap();
    let ConfigError::Invalid { message, .. } = e else { unreachable!() };
    (line, column, message)
}

#[test]
fn a_cluster_is_named_by_its_seed_nodes() {
    let c = parse_store("cluster = [\"redis://127.0.0.1:7000\", \"redis://127.0.0.1:7001\"]\n").unwrap();
    let seeds = vec!["redis://127.0.0.1:7000".to_owned(), "redis://127.0.0.1:7001".to_owned()];
    assert_eq!(c.store.redis, Some(RedisTarget::Cluster(seeds)));
    assert_eq!(c.store.describe(), "Redis Cluster redis://127.0.0.1:7000, redis://127.0.0.1:7001");
    let (line, column, message) = store_err("cluster = []\n");
    assert_eq!((line, column), (2, 11));
    assert!(message.starts_with("cluster is empty: expected at least one URL"), "{message}");
    let (line, column, message) = store_err("cluster = [\"redis://127.0.0.1:7000\", \"127.0.0.1:7001\"]\n");
    assert_eq!((line, column), (2, 38));
    assert!(message.starts_with("invalid cluster URL \"127.0.0.1:7001\""), "{message}");
}

#[test]
fn sentinel_needs_master_name_and_master_name_needs_sentinel() {
    let c = parse_store("sentinel = [\"redis://127.0.0.1:26379\"]\nmaster_name = \"mymaster\"\n").unwrap();
    assert_eq!(
        c.store.redis,
        Some(RedisTarget::Sentinel {
            sentinels: vec!["redis://127.0.0.1:26379".to_owned()],
            master_name: "mymaster".to_owned()
        })
    );
    assert_eq!(c.store.describe(), "Redis master \"mymaster\" through Sentinel redis://127.0.0.1:26379");
    let (line, column, message) = store_err("sentinel = [\"redis://127.0.0.1:26379\"]\n");
    assert_eq!((line, column), (2, 12));
    assert!(message.starts_with("sentinel needs `master_name`"), "{message}");
    let (line, column, message) = store_err("master_name = \"mymaster\"\n");
    assert_eq!((line, column), (2, 15));
    assert!(message.starts_with("master_name is the master Sentinel is asked for"), "{message}");
    let (line, column, message) = store_err("sentinel = [\"redis://127.0.0.1:26379\"]\nmaster_name = \"\"\n");
    assert_eq!((line, column), (3, 15));
    assert_eq!(message, "master_name must not be empty");
    let (line, column, message) = store_err("sentinel = [\"tcp://x:1\"]\nmaster_name = \"m\"\n");
    assert_eq!((line, column), (2, 13));
    assert!(message.starts_with("invalid sentinel URL \"tcp://x:1\""), "{message}");
}

#[test]
fn url_cluster_and_sentinel_exclude_each_other_at_the_second_key() {
    let (line, column, message) =
        store_err("url = \"redis://127.0.0.1:7000\"\ncluster = [\"redis://127.0.0.1:7001\"]\n");
    assert_eq!((line, column), (3, 11));
    assert!(message.starts_with("`cluster` and `url` both name the Redis store"), "{message}");
    let (line, column, message) = store_err(
        "sentinel = [\"redis://127.0.0.1:26379\"]\nmaster_name = \"m\"\nurl = \"redis://127.0.0.1:7000\"\n",
    );
    assert_eq!((line, column), (4, 7));
    assert!(message.starts_with("`url` and `sentinel` both name the Redis store"), "{message}");
    let (line, _, message) =
        store_err("cluster = [\"redis://a:1\"]\nsentinel = [\"redis://b:2\"]\nmaster_name = \"m\"\n");
    assert_eq!(line, 3);
    assert!(message.starts_with("`sentinel` and `cluster`"), "{message}");
}

#[test]
fn credentials_come_from_the_environment_and_never_show() {
    let c = parse_store(
        "cluster = [\"redis://127.0.0.1:7000\"]\nusername = \"limiter\"\npassword_env = \"REDIS_PW\"\n",
    )
    .unwrap();
    assert_eq!(c.store.username.as_deref(), Some("limiter"));
    let password = c.store.password.as_ref().unwrap();
    assert_eq!((password.variable(), password.expose()), ("REDIS_PW", "s3cret"));
    assert!(!format!("{:?}", c.store).contains("s3cret"));
    assert_eq!(
        c.store.describe(),
        "Redis Cluster redis://127.0.0.1:7000, user limiter, password from $REDIS_PW"
    );
    // A password written in a URL is allowed, and hidden when printed.
    let c = parse_store("url = \"redis://limiter:hunter2@127.0.0.1:7000/0\"\n").unwrap();
    assert_eq!(c.store.describe(), "Redis redis://limiter:***@127.0.0.1:7000/0");
    let (line, column, message) = store_err("url = \"redis://127.0.0.1:7000\"\npassword_env = \"NOT_SET\"\n");
    assert_eq!((line, column), (3, 16));
    assert!(message.starts_with("environment variable NOT_SET is not set: password_env"), "{message}");
    let (line, column, message) = store_err("password_env = \"REDIS_PW\"\n");
    assert_eq!((line, column), (2, 16));
    assert!(message.starts_with("password_env applies to a Redis store"), "{message}");
    let (line, column, message) = store_err("url = \"redis://127.0.0.1:7000\"\nusername = \"\"\n");
    assert_eq!((line, column), (3, 12));
    assert_eq!(message, "username must not be empty");
    let (line, _, message) = store_err("username = \"limiter\"\n");
    assert_eq!(line, 2);
    assert!(message.starts_with("username applies to a Redis store"), "{message}");
}

#[test]
fn the_engine_is_auto_unless_forced_and_only_for_redis() {
    let c = parse_store("url = \"redis://127.0.0.1:7000\"\n").unwrap();
    assert_eq!(c.store.engine, Engine::Auto);
    for (name, engine) in [("auto", Engine::Auto), ("lua", Engine::Lua), ("module", Engine::Module)] {
        let c =
            parse_store(&format!("cluster = [\"redis://127.0.0.1:7000\"]\nengine = \"{name}\"\n")).unwrap();
        assert_eq!(c.store.engine, engine, "{name}");
    }
    let c = parse_store("url = \"redis://127.0.0.1:7000\"\nengine = \"module\"\n").unwrap();
    assert_eq!(c.store.describe(), "Redis redis://127.0.0.1:7000, engine module");
    let (line, column, message) = store_err("url = \"redis://127.0.0.1:7000\"\nengine = \"Module\"\n");
    assert_eq!((line, column), (3, 10));
    assert_eq!(
        message,
        "unknown engine \"Module\": expected \"auto\" (the native module where Redis has it, else Lua), \"lua\" or \"module\""
    );
    let (line, column, message) = store_err("engine = \"lua\"\n");
    assert_eq!((line, column), (2, 10));
    assert!(message.starts_with("engine applies to a Redis store"), "{message}");
    let (_, _, message) = store_err("url = \"redis://127.0.0.1:7000\"\nengine = 1\n");
    assert!(message.contains("expected a string"), "{message}");
}

#[test]
fn tls_ca_needs_rediss_urls_and_a_readable_file() {
    let ca = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let c = parse_store(&format!("cluster = [\"rediss://127.0.0.1:7000\"]\ntls_ca = \"{ca}\"\n")).unwrap();
    assert_eq!(c.store.tls_ca.as_deref(), Some(std::path::Path::new(ca)));
    let (line, column, message) =
        store_err(&format!("url = \"redis://127.0.0.1:7000\"\ntls_ca = \"{ca}\"\n"));
    assert_eq!((line, column), (3, 10));
    assert!(
        message.starts_with("tls_ca is the CA trusted for TLS, but the store URLs are not rediss://"),
        "{message}"
    );
    let (line, column, message) =
        store_err("url = \"rediss://127.0.0.1:7000\"\ntls_ca = \"/no/such/ca.pem\"\n");
    assert_eq!((line, column), (3, 10));
    assert!(message.starts_with("cannot read tls_ca /no/such/ca.pem"), "{message}");
    let (_, _, message) = store_err(&format!("tls_ca = \"{ca}\"\n"));
    assert!(message.starts_with("tls_ca applies to a Redis store"), "{message}");
}

/// The cluster example shipped in `examples/`, word for word.
const CLUSTER_EXAMPLE: &str = include_str!("../../../../examples/slidegate-cluster.toml");

#[test]
fn the_cluster_example_parses_as_written() {
    let env = |name: &str| {
        ["SLIDEGATE_IP_SECRET", "SLIDEGATE_REDIS_PASSWORD"].contains(&name).then(|| "test".to_owned())
    };
    let c = Config::parse_with_env(CLUSTER_EXAMPLE, "slidegate-cluster.toml", &env).unwrap();
    assert!(matches!(&c.store.redis, Some(RedisTarget::Cluster(seeds)) if seeds.len() == 3));
    assert_eq!(c.store.username.as_deref(), Some("slidegate"));
    assert_eq!(c.store.password.as_ref().map(Password::variable), Some("SLIDEGATE_REDIS_PASSWORD"));
    assert!(!c.limiter.rules.is_empty());
}

#[test]
fn the_layout_is_per_key_unless_packed_and_only_for_redis() {
    let c = parse_store("url = \"redis://127.0.0.1:7000\"\n").unwrap();
    assert_eq!(c.store.layout, Layout::PerKey);
    let c = parse_store("url = \"redis://127.0.0.1:7000\"\nlayout = \"per_key\"\n").unwrap();
    assert_eq!(c.store.layout, Layout::PerKey);
    let c = parse_store("url = \"redis://127.0.0.1:7000\"\nlayout = \"packed\"\n").unwrap();
    assert_eq!(c.store.layout, Layout::Packed(Buckets::new(32_768).unwrap()));
    assert_eq!(c.store.describe(), "Redis redis://127.0.0.1:7000, layout packed (32768 buckets)");
    let c =
        parse_store("url = \"redis://127.0.0.1:7000\"\nlayout = \"packed\"\nexpected_identities = 1000\n")
            .unwrap();
    assert_eq!(c.store.layout, Layout::Packed(Buckets::new(32).unwrap()));
    let c = parse_store("cluster = [\"redis://127.0.0.1:7000\"]\nlayout = \"packed\"\nexpected_identities = 18446744073709551615\n")
        .unwrap();
    assert_eq!(c.store.layout, Layout::Packed(Buckets::new(slidegate::store::redis::MAX_BUCKETS).unwrap()));
    // Hostile or mistaken input: each a located error saying what to write.
    let cases = [
        ("layout = \"packed\"\n", 2, 10, "layout applies to a Redis store"),
        (
            "url = \"redis://127.0.0.1:7000\"\nlayout = \"Packed\"\n",
            3,
            10,
            "unknown layout \"Packed\": expected \"per_key\"",
        ),
        ("url = \"redis://127.0.0.1:7000\"\nlayout = \"\"\n", 3, 10, "unknown layout \"\""),
        (
            "url = \"redis://127.0.0.1:7000\"\nexpected_identities = 5\n",
            3,
            23,
            "expected_identities sizes the packed layout's buckets",
        ),
        (
            "url = \"redis://127.0.0.1:7000\"\nlayout = \"per_key\"\nexpected_identities = 5\n",
            4,
            23,
            "expected_identities applies to `layout = \"packed\"` only",
        ),
        (
            "url = \"redis://127.0.0.1:7000\"\nlayout = \"packed\"\nexpected_identities = 0\n",
            4,
            23,
            "expected_identities must be at least 1",
        ),
    ];
    for (body, line, column, start) in cases {
        let (l, c, message) = store_err(body);
        assert!(message.starts_with(start), "{body:?}: {message}");
        assert_eq!((l, c), (line, column), "{body:?}: {message}");
    }
    for body in [
        "url = \"redis://127.0.0.1:7000\"\nlayout = 1\n",
        "url = \"redis://127.0.0.1:7000\"\nlayout = \"packed\"\nexpected_identities = -1\n",
        "url = \"redis://127.0.0.1:7000\"\nlayout = \"packed\"\nexpected_identities = \"many\"\n",
    ] {
        assert!(parse_store(body).is_err(), "{body:?}");
    }
}

#[test]
fn the_snapshot_keys_default_and_bad_values_are_located() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("state.snap");
    let c = parse_store(&format!("snapshot = \"{}\"\n", file.display())).unwrap();
    let snapshot = c.store.snapshot.unwrap();
    assert_eq!(snapshot.path, file);
    assert_eq!(snapshot.interval, std::time::Duration::from_secs(30));
    assert_eq!(snapshot.on_corrupt, crate::config::OnCorruptSnapshot::StartEmpty);
    let c =
        parse_store(&format!("snapshot = \"{}\"\nsnapshot_corrupt = \"refuse\"\n", file.display())).unwrap();
    assert_eq!(c.store.snapshot.unwrap().on_corrupt, crate::config::OnCorruptSnapshot::Refuse);
    // A relative file is found next to the configuration.
    let c = parse_store("snapshot = \"state.snap\"\n").unwrap();
    assert_eq!(c.store.snapshot.unwrap().path, std::path::Path::new("state.snap"));
    let (line, column, message) =
        store_err(&format!("snapshot = \"{}\"\nsnapshot_interval = \"0s\"\n", file.display()));
    assert_eq!((line, column), (3, 21));
    assert!(message.starts_with("snapshot_interval \"0s\" is out of range"), "{message}");
    let (line, column, message) = store_err("snapshot = \"\"\n");
    assert_eq!((line, column), (2, 12));
    assert!(message.starts_with("snapshot \"\" is not a file name"), "{message}");
    let (line, _, message) = store_err("snapshot_corrupt = \"refuse\"\n");
    assert_eq!(line, 2);
    assert_eq!(message, "snapshot_corrupt needs `snapshot = \"<file>\"` in [store]");
}
