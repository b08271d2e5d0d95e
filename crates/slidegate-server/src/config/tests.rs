//! Parsing and validation of the TOML configuration.

use http::Method;
use ipnet::IpNet;
use slidegate::Algorithm;

use super::validate::Use;
use super::*;
use slidegate::{Buckets, Engine, Layout, RedisTarget};
use slidegate_http::config::{Delay, IdentityConfig, IdentityKind, OnError, RuleLimits};
use slidegate_http::{BreadthOf, ForwardedHeader, StoreGuard};

/// The example configuration shipped in `examples/` (also the README's), word for word.
const EXAMPLE_CONFIG: &str = include_str!("../../../../examples/slidegate.toml");

/// The Redis URL the example names; tests only parse it, never connect.
fn example_redis_url() -> &'static str {
    EXAMPLE_CONFIG.lines().find_map(|l| l.strip_prefix("url = \"")?.split('"').next()).unwrap()
}

/// An environment in which no variable is set.
fn no_env(_: &str) -> Option<String> {
    None
}

/// Parses `source` with no environment variable set.
fn parse(source: &str) -> Result<Config, ConfigError> {
    Config::parse_with_env(source, "t.toml", &no_env)
}

fn err(source: &str) -> (usize, usize, String) {
    let e = parse(source).unwrap_err();
    let (line, column) = e.location().unwrap();
    let ConfigError::Invalid { message, .. } = e else { unreachable!() };
    (line, column, message)
}

#[test]
fn the_example_config_parses_as_written() {
    let env = |name: &str| (name == "SLIDEGATE_IP_SECRET").then(|| "test-secret".to_owned());
    let c = Config::parse_with_env(EXAMPLE_CONFIG, "slidegate.toml", &env).unwrap();
    assert_eq!(c.server.listen, "127.0.0.1:8080".parse().unwrap());
    assert_eq!(c.store.redis, Some(RedisTarget::Single(example_redis_url().to_owned())));
    assert_eq!(c.limiter.guard.timeout, Delay::from_millis(50));
    assert_eq!(c.store.on_error, OnError::Fallback);
    assert_eq!(c.limiter.identity.api_key_header.as_ref().unwrap().as_str(), "x-api-key");
    assert_eq!(c.limiter.identity.secret.as_deref(), Some(&b"test-secret"[..]));
    assert_eq!(c.limiter.identity.trusted_proxies, vec!["127.0.0.1/32".parse::<IpNet>().unwrap()]);
    assert_eq!(c.limiter.rules.len(), 2);
    let RuleLimits::Split { authenticated, anonymous } = &c.limiter.rules[0].limits else { panic!() };
    assert_eq!((anonymous[0].name.as_str(), anonymous[0].limit.quota.permits()), ("trending", 100));
    assert_eq!(authenticated[0].limit.algorithm, Algorithm::SlidingLog);
    assert_eq!(c.limiter.rules[0].methods, vec![Method::GET]);
    let RuleLimits::Shared { identity, limits } = &c.limiter.rules[1].limits else { panic!() };
    assert_eq!(*identity, IdentityKind::ApiKey);
    let names: Vec<_> = limits.iter().map(|l| (l.name.as_str(), l.limit.quota.window_ms(), l.cost)).collect();
    assert_eq!(names, [("search-1s", 1000, 1), ("search-1h", 3_600_000, 1)]);
    assert_eq!(limits[0].limit.algorithm, Algorithm::SlidingWindowCounter);
}

#[test]
fn unknown_keys_are_located() {
    // The list of expected keys grows at its end as `[store]` gains keys.
    let (line, column, message) = err("[store]\ntimeout_ms = 5\nretries = 3\n");
    assert_eq!((line, column), (3, 1));
    assert!(message.starts_with("unknown field `retries`, expected one of `url`, `prefix`, `timeout_ms`, `on_error`, `breaker_failures`, `probe_interval_ms`, `fallback`, `insurance`"), "{message}");
    let (line, column, message) =
        err("[[rules]]\nname = \"a\"\npath = \"/\"\nlimits = [{ limit = 1, window = \"1s\", burst = 2 }]\n");
    assert_eq!((line, column), (4, 39));
    assert!(message.starts_with("unknown field `burst`"), "{message}");
}

#[test]
fn bad_values_are_located_and_say_what_was_expected() {
    let rule = |limits: &str| format!("[[rules]]\nname = \"a\"\npath = \"/x\"\nlimits = [{limits}]\n");
    assert_eq!(
        err(&rule("{ limit = 1, window = \"60x\" }")),
        (
            4,
            33,
            "invalid duration \"60x\": expected a whole number followed by ms, s, m, h or d, such as \"60s\""
                .into()
        )
    );
    let (l, c, m) = err(&rule("{ limit = 1, window = \"1s\", algorithm = \"leaky\" }"));
    assert_eq!((l, c), (4, 51));
    assert!(m.starts_with("unknown algorithm \"leaky\": expected one of sliding_window_counter"), "{m}");
    assert_eq!(
        err(&rule("{ limit = 0, window = \"1s\" }")),
        (4, 21, "invalid limit: limit must be at least 1, got 0".into())
    );
    assert_eq!(
        err(&rule("{ limit = 5, window = \"1s\", cost = 6 }")),
        (4, 46, "invalid limit: cost 6 exceeds the limit 5: such a request could never be allowed".into())
    );
    assert_eq!(
        err(&rule("{ limit = 5, window = \"1s\", cost = 0 }")),
        (4, 46, "cost must be at least 1, got 0".into())
    );
    assert_eq!(
        err(&rule("{ limit = 10001, window = \"1h\", algorithm = \"sliding_log\" }")),
        (
            4,
            21,
            "invalid limit: sliding_log limits must be at most 10000 (one entry per permit), got 10001; \
             use sliding_window_counter for larger limits"
                .into()
        )
    );
    assert!(parse(&rule("{ limit = 10000, window = \"1h\", algorithm = \"sliding_log\" }")).is_ok());
    assert!(parse(&rule("{ limit = 1000001, window = \"1h\" }")).is_ok());
    assert_eq!(
        err(&rule("{ name = \"a\\u0007b\", limit = 1, window = \"1s\" }")),
        (4, 20, "invalid policy name \"a\\u{7}b\": expected printable ASCII without quotes".into())
    );
    assert_eq!(
        err(&rule("{ name = \"a\\tb\", limit = 1, window = \"1s\" }")),
        (4, 20, "invalid policy name \"a\\tb\": expected printable ASCII without quotes".into())
    );
    let (l, c, m) = err("[server]\nlisten = \"localhost\"\n");
    assert_eq!((l, c), (2, 10));
    assert!(m.contains("invalid socket address"), "{m}");
    let (l, c, m) = err("[identity]\ntrusted_proxies = [\"10.0.0.0/8\", \"10.0.0.300\"]\n");
    assert_eq!((l, c), (2, 34));
    assert!(m.starts_with("invalid trusted proxy \"10.0.0.300\""), "{m}");
    let (l, c, m) = err("[[rules]]\nname = \"a\"\npath = \"/\"\nmethods = [\"GET\", \"G-T\"]\nlimits = [{ limit = 1, window = \"1s\" }]\n");
    assert_eq!((l, c), (4, 19));
    assert!(m.starts_with("invalid method \"G-T\": expected an HTTP method"), "{m}");
    let (l, c, m) = err("[server]\nupstream = \"ftp://example.test\"\n");
    assert_eq!((l, c), (2, 12));
    assert!(m.contains("expected http://host:port or https://host:port"), "{m}");
    let (l, c, _) = err("[identity]\nip_hash_secret_env = \"SLIDEGATE_IP_SECRET\"\n");
    assert_eq!((l, c), (2, 22));
    let set = |_: &str| Some(String::new());
    let e =
        Config::parse_with_env("[identity]\nip_hash_secret_env = \"SECRET\"\n", "t.toml", &set).unwrap_err();
    assert_eq!(e.location(), Some((2, 22)), "an empty secret is as good as none");
}

#[test]
fn the_store_keys_default_and_insurance_reads_as_fallback() {
    let c = parse("").unwrap();
    assert_eq!(c.limiter.guard, StoreGuard::default());
    assert_eq!(c.server.shutdown_grace, Delay::from_secs(10));
    assert_eq!(c.store.on_error, OnError::Fallback, "a failing store never means unlimited by default");
    let c = parse("[store]\nfallback = true\n").unwrap();
    assert_eq!(c.store.on_error, OnError::Fallback);
    let c = parse("[store]\ninsurance = true\n").unwrap();
    assert_eq!(c.store.on_error, OnError::Fallback);
    let c = parse("[server]\nshutdown_grace = \"250ms\"\n").unwrap();
    assert_eq!(c.server.shutdown_grace, Delay::from_millis(250));
    let (l, c, m) = err("[server]\nshutdown_grace = \"soon\"\n");
    assert_eq!((l, c), (2, 18));
    assert!(m.starts_with("invalid duration \"soon\""), "{m}");
}

#[test]
fn forwarded_header_defaults_to_x_forwarded_for_and_bad_values_are_located() {
    let c = parse("[identity]\ntrusted_proxies = [\"10.0.0.0/8\"]\n").unwrap();
    assert_eq!(c.limiter.identity.forwarded_header, ForwardedHeader::XForwardedFor);
    let c = parse("[identity]\nforwarded_header = \"forwarded\"\n").unwrap();
    assert_eq!(c.limiter.identity.forwarded_header, ForwardedHeader::Forwarded);
    let (l, c, m) = err("[identity]\nforwarded_header = \"x-real-ip\"\n");
    assert_eq!((l, c), (2, 20));
    assert!(
        m.starts_with(
            "invalid forwarded_header \"x-real-ip\": expected \"x-forwarded-for\" or \"forwarded\""
        ),
        "{m}"
    );
    let (l, c, m) = err("[identity]\nforwarded_headers = \"forwarded\"\n");
    assert_eq!((l, c), (2, 1));
    assert!(m.starts_with("unknown field `forwarded_headers`"), "{m}");
}

#[test]
fn admin_listen_is_optional_and_located_when_bad() {
    let c = parse("[server]\nlisten = \"127.0.0.1:8080\"\n").unwrap();
    assert_eq!(c.server.admin_listen, None);
    let c = parse("[server]\nadmin_listen = \"127.0.0.1:9091\"\n").unwrap();
    assert_eq!(c.server.admin_listen, Some("127.0.0.1:9091".parse().unwrap()));
    let (l, c, m) = err("[server]\nadmin_listen = \"localhost\"\n");
    assert_eq!((l, c), (2, 16));
    assert!(m.contains("invalid socket address"), "{m}");
    let (l, c, m) = err("[server]\nlisten = \"127.0.0.1:8080\"\nadmin_listen = \"127.0.0.1:8080\"\n");
    assert_eq!((l, c), (3, 16));
    assert_eq!(m, "admin_listen 127.0.0.1:8080 is the listen address: expected another address, such as \"127.0.0.1:9091\"");
}

#[test]
fn contradictory_rules_are_located() {
    let (l, c, m) = err("[[rules]]\nname = \"a\"\npath = \"/\"\n\n[[rules]]\nname = \"a\"\npath = \"/b\"\nlimits = [{ limit = 1, window = \"1s\" }]\n");
    // The first rule has no limits; it is reported at its own table.
    assert_eq!((l, c), (1, 1), "{m}");
    assert!(m.starts_with("rule \"a\" has no limits"), "{m}");
    let (l, c2, m) =
        err("[[rules]]\nname = \"a\"\npath = \"/\"\nanonymous = [{ limit = 1, window = \"1s\" }]\n");
    assert_eq!((l, c2), (4, 13));
    assert!(m.contains("needs both `authenticated` and `anonymous`"), "{m}");
    let dup = "[[rules]]\nname = \"a\"\npath = \"/\"\nlimits = [{ limit = 1, window = \"1s\" }]\n";
    let (l, c3, m) = err(&format!("{dup}\n{dup}"));
    assert_eq!((l, c3), (7, 8));
    assert_eq!(m, "duplicate rule name \"a\": rule names must be unique");
    let (l, _, m) = err("[[rules]]\nname = \"a\"\npath = \"/\"\nlimits = [{ limit = 1, window = \"1s\" }, { limit = 2, window = \"1s\" }]\n");
    assert_eq!(l, 4);
    assert!(m.contains("two limits named alike (\"a-1s\")"), "{m}");
}

#[test]
fn the_error_display_names_file_line_column_and_shows_the_line() {
    let e = Config::parse_with_env("[server]\nlisten = 8080\n", "conf/slidegate.toml", &no_env).unwrap_err();
    let text = e.to_string();
    assert!(
        text.starts_with("conf/slidegate.toml:2:10: invalid type: integer `8080`, expected a string"),
        "{text}"
    );
    assert!(text.ends_with("2 | listen = 8080\n  |          ^^^^"), "{text}");
}

// Identity slice: IPv6 clients are grouped per /64 unless the config says otherwise.
#[test]
fn ipv6_clients_are_counted_per_64_by_default() {
    let rule = "[[rules]]\nname = \"a\"\npath = \"/\"\nlimits = [{ limit = 1, window = \"1s\" }]\n";
    assert_eq!(parse(rule).unwrap().limiter.identity.ipv6_prefix, 64);
    assert_eq!(IdentityConfig::default().ipv6_prefix, 64);
    let exact = parse(&format!("[identity]\nipv6_prefix = 128\n{rule}")).unwrap();
    assert_eq!(exact.limiter.identity.ipv6_prefix, 128);
}

// Identity slice: rules fold case unless `case_sensitive = true`.
#[test]
fn rules_fold_case_unless_told_otherwise() {
    let rule = |extra: &str| {
        format!(
            "[[rules]]\nname = \"a\"\npath = \"/api\"\n{extra}limits = [{{ limit = 1, window = \"1s\" }}]\n"
        )
    };
    let folded = parse(&rule("")).unwrap();
    assert!(!folded.limiter.rules[0].path.is_case_sensitive());
    assert!(folded.limiter.rules[0].path.matches("/API"));
    let exact = parse(&rule("case_sensitive = true\n")).unwrap();
    assert!(exact.limiter.rules[0].path.is_case_sensitive());
    assert!(!exact.limiter.rules[0].path.matches("/API"));
}

// Values a parser could accept and `serve` then misread.

#[test]
fn a_store_prefix_with_braces_is_located() {
    // Braces pick Redis Cluster hash slots: every key would land in one slot.
    let (l, c, m) = err("[store]\nprefix = \"{x}\"\n");
    assert_eq!((l, c), (2, 10));
    assert!(m.starts_with("invalid store prefix \"{x}\": braces choose Redis Cluster hash slots"), "{m}");
    assert_eq!(err("[store]\nprefix = \"app}\"\n").0, 2);
    assert_eq!(parse("[store]\nprefix = \"app:\"\n").unwrap().store.prefix.as_deref(), Some("app:"));
}

#[test]
fn an_upstream_port_out_of_range_is_located() {
    // `http` reads a port over 65535 as no port: serve would connect to port 80.
    let (l, c, m) = err("[server]\nupstream = \"http://127.0.0.1:99999\"\n");
    assert_eq!((l, c), (2, 12));
    assert_eq!(m, "invalid upstream \"http://127.0.0.1:99999\": the port must be 1 to 65535");
    assert_eq!(err("[server]\nupstream = \"http://[::1]:0\"\n").0, 2);
    let c = parse("[server]\nupstream = \"http://127.0.0.1:65535\"\n").unwrap();
    assert_eq!(c.server.upstream.unwrap().port_u16(), Some(65535));
}

#[test]
fn credentials_in_the_upstream_url_are_located() {
    // hyper drops them silently: the upstream would never see them.
    let (l, c, m) = err("[server]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://user:pw@127.0.0.1:9000\"\n");
    assert_eq!((l, c), (3, 12));
    assert!(m.contains("credentials in the URL are not sent"), "{m}");
}

#[test]
fn invalid_utf8_is_located_at_its_first_bad_byte() {
    let bytes = b"[server]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://h\xff:1\"\n";
    let e = validate::decode(std::path::Path::new("t.toml"), bytes).unwrap_err();
    assert_eq!(e.location(), Some((3, 21)));
    assert!(e.to_string().starts_with("t.toml:3:21: invalid UTF-8 (byte 0xff)"), "{e}");
    assert_eq!(validate::decode(std::path::Path::new("t.toml"), b"[server]\n").unwrap(), "[server]\n");
}

#[test]
fn a_shared_store_without_a_hash_secret_is_an_error() {
    // Each instance would draw its own secret: N instances admit N times the limit.
    let source = format!("[store]\nurl = \"{}\"\n", example_redis_url());
    let (l, c, m) = err(&source);
    assert_eq!((l, c), (2, 7));
    assert!(m.starts_with("a shared store needs [identity] ip_hash_secret_env"), "{m}");
    // The embedded store keeps the random per-process secret.
    assert!(parse("[server]\nlisten = \"127.0.0.1:0\"\n").unwrap().limiter.identity.secret.is_none());
    let env = |name: &str| (name == "S").then(|| "x".to_owned());
    let with = format!("{source}[identity]\nip_hash_secret_env = \"S\"\n");
    assert!(Config::parse_with_env(&with, "t.toml", &env).is_ok());
}

#[test]
fn the_admin_surface_defaults_closed_and_its_keys_are_checked() {
    let c = parse("[server]\n").unwrap();
    assert!(!c.server.admin_on_public);
    assert_eq!((c.server.admin_listen, c.server.check_token.as_deref()), (None, None));
    assert_eq!(c.server.body_timeout, Delay::from_secs(30));
    assert_eq!(c.server.max_upstream_connections, 1024);
    assert!(parse("[server]\nadmin_on_public = true\n").unwrap().server.admin_on_public);
    let (l, _, m) = err("[server]\nadmin_listen = \"127.0.0.1:0\"\nadmin_on_public = true\n");
    assert_eq!(l, 3);
    assert!(m.starts_with("admin_on_public and admin_listen both set"), "{m}");
    // A token variable that is unset stops the start, it does not open the API.
    let (l, c, m) = err("[server]\ncheck_token_env = \"CHECK_TOKEN\"\n");
    assert_eq!((l, c), (2, 19));
    assert!(m.starts_with("environment variable CHECK_TOKEN is not set"), "{m}");
    let env = |name: &str| (name == "CHECK_TOKEN").then(|| "t0ken".to_owned());
    let c = Config::parse_with_env("[server]\ncheck_token_env = \"CHECK_TOKEN\"\n", "t.toml", &env).unwrap();
    assert_eq!(c.server.check_token.as_deref(), Some("t0ken"));
    let c = parse("[server]\nbody_timeout = \"300ms\"\nmax_upstream_connections = 4\n").unwrap();
    assert_eq!((c.server.body_timeout, c.server.max_upstream_connections), (Delay::from_millis(300), 4));
    assert_eq!(err("[server]\nbody_timeout = \"0s\"\n").0, 2);
    assert_eq!(err("[server]\nmax_upstream_connections = 0\n").0, 2);
}

#[test]
fn max_cost_defaults_to_one_and_is_read_per_rule() {
    let rule = |extra: &str| {
        format!(
            "[[rules]]\nname = \"a\"\npath = \"/x\"\n{extra}limits = [{{ limit = 10, window = \"1s\" }}]\n"
        )
    };
    assert_eq!(parse(&rule("")).unwrap().limiter.rules[0].max_cost, 1);
    assert_eq!(parse(&rule("max_cost = 5\n")).unwrap().limiter.rules[0].max_cost, 5);
    assert_eq!(err(&rule("max_cost = 0\n")), (4, 12, "max_cost must be at least 1".into()));
}

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
fn a_cluster_or_sentinel_store_without_a_hash_secret_is_an_error() {
    // Instances on one cluster share it as much as instances on one server.
    for store in [
        "cluster = [\"redis://127.0.0.1:7000\"]",
        "sentinel = [\"redis://127.0.0.1:26400\"]\nmaster_name = \"m\"",
    ] {
        let (l, c, m) = err(&format!("[store]\n{store}\n"));
        assert_eq!((l, c), (2, store.find('=').unwrap() + 3), "{store}");
        assert!(m.starts_with("a shared store needs [identity] ip_hash_secret_env"), "{m}");
    }
}

#[test]
fn breadth_and_response_costs_parse_and_bad_ones_are_located() {
    let c = parse(
        "[[rules]]\nname = \"v\"\npath = \"/api/videos/{id}\"\nlimits = [{ limit = 5, window = \"1s\" }]\n\
         breadth = { distinct = 200, window = \"10m\", of = \"param:id\" }\ncount_status = [404, 410]\n\
         cost_header = \"x-ratelimit-cost\"\n",
    )
    .unwrap();
    let breadth = c.limiter.rules[0].breadth.as_ref().unwrap();
    assert_eq!((breadth.quota.permits(), breadth.quota.window_ms()), (200, 600_000));
    assert_eq!(breadth.of, BreadthOf::Param { name: "id".into(), segment: 3 });
    assert_eq!(c.limiter.rules[0].response_cost.count_status, [404, 410]);
    assert_eq!(c.limiter.rules[0].response_cost.cost_header.as_ref().unwrap().as_str(), "x-ratelimit-cost");

    let rule =
        "[[rules]]\nname = \"v\"\npath = \"/api/videos/{id}\"\nlimits = [{ limit = 5, window = \"1s\" }]\n";
    let (l, c, m) =
        err(&format!("{rule}breadth = {{ distinct = 200, window = \"10m\", of = \"param:slug\" }}\n"));
    assert_eq!((l, c), (5, 50));
    assert!(m.contains("has no {slug}"), "{m}");
    let (l, _, m) = err(&format!("{rule}breadth = {{ distinct = 0, window = \"10m\" }}\n"));
    assert_eq!(l, 5);
    assert!(m.starts_with("invalid breadth"), "{m}");
    let (l, _, m) = err(&format!("{rule}count_status = [200, 999]\n"));
    assert_eq!(l, 5);
    assert!(m.contains("100 to 599"), "{m}");
    let (_, _, m) = err(&format!("{rule}cost_header = \"bad header\"\n"));
    assert!(m.contains("invalid cost_header"), "{m}");
}

#[test]
fn store_lease_is_read_and_checked() {
    assert_eq!(parse("").unwrap().limiter.guard.lease, None);
    let lease = parse("[store]\nlease = { max = 32, horizon = \"20ms\" }\n").unwrap().limiter.guard.lease;
    assert_eq!(lease, Some(slidegate_http::lease::LeasePolicy { max: 32, horizon: Delay::from_millis(20) }));
    let lease = parse("[store]\nlease = { max = 64 }\n").unwrap().limiter.guard.lease;
    assert_eq!(lease.map(|l| l.horizon), Some(Delay::from_millis(50)));
    let err = parse("[store]\nlease = { max = 1 }\n").unwrap_err().to_string();
    assert!(err.contains("lease max is 2 to 10000 permits, got 1") && err.contains(":2:"), "{err}");
    let err = parse("[store]\nlease = { max = 8, horizon = \"1h\" }\n").unwrap_err().to_string();
    assert!(err.contains("lease horizon is 1ms to 10s"), "{err}");
    let err = parse("[store]\nlease = { max = 8, size = 3 }\n").unwrap_err().to_string();
    assert!(err.contains("size"), "{err}");
    assert!(parse("[store]\nlease = { max = -3 }\n").is_err());
}

#[test]
fn penalty_and_deny_cache_are_read_and_checked() {
    let rule = |extra: &str| {
        format!(
            "[[rules]]\nname = \"a\"\npath = \"/x\"\nlimits = [{{ limit = 10, window = \"1s\" }}]\n{extra}"
        )
    };
    assert_eq!(parse(&rule("")).unwrap().limiter.rules[0].penalty, None);
    let c = parse(&rule("penalty = { after = 20, within = \"1m\", block = \"10m\", max_block = \"24h\" }\n"))
        .unwrap();
    let p = c.limiter.rules[0].penalty.unwrap();
    assert_eq!((p.after(), p.within_ms(), p.block_ms(), p.max_block_ms()), (20, 60_000, 600_000, 86_400_000));
    // Without a cap, a day.
    let c = parse(&rule("penalty = { after = 1, within = \"1s\", block = \"1m\" }\n")).unwrap();
    assert_eq!(c.limiter.rules[0].penalty.unwrap().max_block_ms(), 86_400_000);
    let (line, _, message) =
        err(&rule("penalty = { after = 1, within = \"1s\", block = \"1h\", max_block = \"1m\" }\n"));
    assert_eq!(line, 5);
    assert_eq!(message, "invalid penalty: penalty max_block (60000 ms) is shorter than block (3600000 ms)");
    assert!(parse(&rule("penalty = { after = 1, within = \"1s\" }\n")).is_err(), "block is required");

    assert_eq!(parse("").unwrap().limiter.guard.deny_cache, 65_536);
    assert_eq!(parse("[store]\ndeny_cache = 0\n").unwrap().limiter.guard.deny_cache, 0);
}

/// Three values that loaded and then did nothing or always refused; each is
/// now an error at the value.
#[test]
fn values_that_would_do_nothing_are_located() {
    let rule = |extra: &str| {
        format!(
            "[[rules]]\nname = \"a\"\npath = \"/x\"\n\
             limits = [{{ limit = 10, window = \"1s\" }}, {{ limit = 40, window = \"1m\", cost = 2 }}]\n{extra}"
        )
    };
    // `after = 0`: every denial would be a block.
    let (line, column, message) = err(&rule("penalty = { after = 0, within = \"1m\", block = \"10m\" }\n"));
    assert_eq!((line, column), (5, 21));
    assert_eq!(
        message,
        "invalid penalty: penalty after must be from 1 to 4294967296 (the denials tolerated before a block), got 0"
    );
    // `count_status = []`: nothing would ever be charged.
    let (line, column, message) = err(&rule("count_status = []\n"));
    assert_eq!((line, column), (5, 16));
    assert!(message.starts_with("count_status = [] counts no response"), "{message}");
    // `max_cost` above the smallest headroom: 20 per check of the 1-minute
    // limit (40 permits at cost 2) is the most; 21 would always be refused.
    assert_eq!(parse(&rule("max_cost = 10\n")).unwrap().limiter.rules[0].max_cost, 10);
    let (line, column, message) = err(&rule("max_cost = 11\n"));
    assert_eq!((line, column), (5, 12));
    assert_eq!(
        message,
        "max_cost = 11 is above what limit \"a-1s\" of rule \"a\" can ever admit (10): \
         a check of that cost is always refused; expected at most 10"
    );
    // Split limits: the anonymous list counts too.
    let split = "[[rules]]\nname = \"s\"\npath = \"/x\"\nmax_cost = 3\n\
                 authenticated = [{ limit = 100, window = \"1s\" }]\nanonymous = [{ limit = 2, window = \"1s\" }]\n";
    let (line, _, message) = err(split);
    assert_eq!(line, 4);
    assert!(message.contains("limit \"s\" of rule \"s\" can ever admit (2)"), "{message}");
}

#[test]
fn query_breadth_and_format_suffix_are_read_and_bad_ones_located() {
    let rule = |extra: &str| {
        format!("[[rules]]\nname = \"i\"\npath = \"/items\"\nlimits = [{{ limit = 5, window = \"1s\" }}]\n{extra}")
    };
    let c = parse(&rule(
        "breadth = { distinct = 20, window = \"10m\", of = \"query:id\" }\nformat_suffix = true\n",
    ))
    .unwrap();
    let r = &c.limiter.rules[0];
    assert_eq!(r.breadth.as_ref().unwrap().of, BreadthOf::Query { name: "id".into() });
    assert!(r.path.is_format_suffix() && r.path.matches("/items.json"));
    assert!(!parse(&rule("")).unwrap().limiter.rules[0].path.is_format_suffix());
    for (of, expected) in [
        ("query:", "invalid query parameter name \"\""),
        ("query:a=b", "invalid query parameter name \"a=b\""),
        ("query:id[]", "invalid query parameter name \"id[]\""),
        ("query", "expected \"path\", \"param:<name>\" or \"query:<name>\""),
    ] {
        let (l, c, m) =
            err(&rule(&format!("breadth = {{ distinct = 20, window = \"10m\", of = \"{of}\" }}\n")));
        assert_eq!((l, c), (5, 49), "{of}");
        assert!(m.starts_with("invalid breadth `of`") && m.contains(expected), "{of}: {m}");
    }
    let (l, c, m) = err(&rule("format_suffix = \"yes\"\n"));
    assert_eq!((l, c), (5, 17));
    assert!(m.contains("expected a boolean"), "{m}");
}

#[test]
fn the_body_rate_and_the_per_client_share_of_the_pool_are_read_and_checked() {
    let c = parse("[server]\n").unwrap();
    assert_eq!((c.server.min_body_rate, c.server.body_rate_grace), (500, Delay::from_secs(10)));
    assert_eq!(c.server.upstream_connections_per_client(), 64);
    let c = parse("[server]\nmax_upstream_connections = 50\n").unwrap();
    assert_eq!(c.server.upstream_connections_per_client(), 3);
    let c = parse("[server]\nmax_upstream_connections = 4\n").unwrap();
    assert_eq!(c.server.upstream_connections_per_client(), 1);
    let c = parse(
        "[server]\nmin_body_rate = 0\nbody_rate_grace = \"2s\"\nmax_upstream_connections_per_client = 1024\n",
    )
    .unwrap();
    assert_eq!((c.server.min_body_rate, c.server.body_rate_grace), (0, Delay::from_secs(2)));
    assert_eq!(c.server.upstream_connections_per_client(), 1024);

    let (l, col, m) = err("[server]\nbody_rate_grace = \"0s\"\n");
    assert_eq!((l, col), (2, 19));
    assert!(m.starts_with("body_rate_grace must be longer than 0"), "{m}");
    for bad in ["0", "51"] {
        let (l, col, m) = err(&format!(
            "[server]\nmax_upstream_connections = 50\nmax_upstream_connections_per_client = {bad}\n"
        ));
        assert_eq!((l, col), (3, 39), "{bad}");
        assert_eq!(
            m,
            "max_upstream_connections_per_client must be 1 to max_upstream_connections (50): \
             expected a small share of the pool, such as 3"
        );
    }
    // The key order does not matter: the pool is read first.
    assert!(err("[server]\nmax_upstream_connections_per_client = 5\nmax_upstream_connections = 4\n")
        .2
        .starts_with("max_upstream_connections_per_client must be 1 to max_upstream_connections (4)"));
    // Hostile values: negative, fractional, text, out of range.
    for bad in ["-1", "1.5", "\"fast\"", "4294967296"] {
        assert_eq!(err(&format!("[server]\nmin_body_rate = {bad}\n")).0, 2, "{bad}");
        assert_eq!(err(&format!("[server]\nmax_upstream_connections_per_client = {bad}\n")).0, 2, "{bad}");
    }
    assert_eq!(err("[server]\nbody_rate_grace = \"soon\"\n").0, 2);
    assert_eq!(err("[server]\nbody_rate_grace = 10\n").0, 2);
}

#[test]
fn max_in_flight_is_read_where_a_rule_charges_after_the_response_and_bad_values_are_located() {
    let rule = |extra: &str| {
        format!(
            "[[rules]]\nname = \"s\"\npath = \"/s\"\nlimits = [{{ limit = 10, window = \"1s\" }}]\n\
             cost_header = \"x-cost\"\n{extra}"
        )
    };
    assert_eq!(parse(&rule("")).unwrap().limiter.rules[0].max_in_flight, 8, "the default");
    assert_eq!(parse(&rule("max_in_flight = 3\n")).unwrap().limiter.rules[0].max_in_flight, 3);
    assert_eq!(
        parse(&rule("max_in_flight = 4294967295\n")).unwrap().limiter.rules[0].max_in_flight,
        u32::MAX
    );
    let (l, c, m) = err(&rule("max_in_flight = 0\n"));
    assert_eq!((l, c, m.as_str()), (6, 17, "max_in_flight must be at least 1, got 0"));
    // Values a u32 cannot hold, and other types: serde's errors, located.
    for bad in ["-1", "4294967296", "\"8\"", "1.5", "[8]", "true"] {
        let e = parse(&rule(&format!("max_in_flight = {bad}\n"))).unwrap_err();
        assert_eq!(e.location().map(|(line, _)| line), Some(6), "{bad}: {e}");
    }
    // On a rule charged before forwarding it would mean nothing.
    let plain = "[[rules]]\nname = \"p\"\npath = \"/p\"\nlimits = [{ limit = 10, window = \"1s\" }]\nmax_in_flight = 3\n";
    let (l, c, m) = err(plain);
    assert_eq!((l, c), (5, 17));
    assert!(m.starts_with("max_in_flight bounds requests charged after the response"), "{m}");
    let counted = "[[rules]]\nname = \"p\"\npath = \"/p\"\nlimits = [{ limit = 10, window = \"1s\" }]\n\
                   count_status = [404]\nmax_in_flight = 2\n";
    assert_eq!(parse(counted).unwrap().limiter.rules[0].max_in_flight, 2);
}

#[test]
fn on_error_is_one_option_and_old_fallback_keys_load_or_say_what_to_write() {
    for (value, want) in [("fallback", OnError::Fallback), ("allow", OnError::Allow), ("deny", OnError::Deny)]
    {
        let c = parse(&format!("[store]\non_error = \"{value}\"\n")).unwrap();
        assert_eq!(c.store.on_error, want);
    }
    // Old files whose meaning is unchanged load as they were.
    let c = parse("[store]\non_error = \"allow\"\nfallback = false\n").unwrap();
    assert_eq!(c.store.on_error, OnError::Allow);
    let c = parse("[store]\non_error = \"deny\"\ninsurance = false\n").unwrap();
    assert_eq!(c.store.on_error, OnError::Deny);
    let c = parse("[store]\nfallback = true\non_error = \"fallback\"\n").unwrap();
    assert_eq!(c.store.on_error, OnError::Fallback);
    // `fallback = false` alone meant fail open: no longer implied.
    let (l, c, m) = err("[store]\nfallback = false\n");
    assert_eq!((l, c), (2, 12));
    assert!(m.contains("write `on_error = \"allow\"`") && m.contains("`on_error = \"deny\"`"), "{m}");
    // Two options that disagree: the one that no longer exists is refused.
    let (l, c, m) = err("[store]\non_error = \"deny\"\nfallback = true\n");
    assert_eq!((l, c), (3, 12));
    assert!(m.contains("delete `fallback`"), "{m}");
    // Hostile values: located, with the choices.
    for bad in ["\"open\"", "\"\"", "\"Allow\"", "true", "1"] {
        let (l, _, m) = err(&format!("[store]\non_error = {bad}\n"));
        assert_eq!(l, 2, "{bad}: {m}");
    }
    let (_, _, m) = err("[store]\non_error = \"open\"\n");
    assert!(m.contains("fallback") && m.contains("allow") && m.contains("deny"), "{m}");
    let (l, _, m) = err("[[rules]]\nname = \"r\"\npath = \"/x\"\nlimits = [{ limit = 1, window = \"1s\" }]\non_error = \"opn\"\n");
    assert_eq!(l, 5, "{m}");
    let c = parse("[store]\non_error = \"allow\"\n[[rules]]\nname = \"r\"\npath = \"/x\"\nlimits = [{ limit = 1, window = \"1s\" }]\non_error = \"fallback\"\n").unwrap();
    assert_eq!(c.limiter.rules[0].on_error, OnError::Fallback);
}

#[test]
fn drain_delay_defaults_to_none_and_bad_values_are_located() {
    assert_eq!(parse("").unwrap().server.drain_delay, Delay::from_secs(0));
    let c = parse("[server]\ndrain_delay = \"5s\"\n").unwrap();
    assert_eq!(c.server.drain_delay, Delay::from_secs(5));
    assert_eq!(parse("[server]\ndrain_delay = \"0s\"\n").unwrap().server.drain_delay, Delay::from_secs(0));
    assert_eq!(parse("[server]\ndrain_delay = \"5m\"\n").unwrap().server.drain_delay, Delay::from_secs(300));
    for bad in ["\"soon\"", "\"-5s\"", "\"5\"", "\"\"", "\"5 s\"", "5", "true", "\"99999999999999999999d\""] {
        let (l, c, m) = err(&format!("[server]\ndrain_delay = {bad}\n"));
        assert_eq!((l, c), (2, 15), "{bad}: {m}");
    }
    let (_, _, m) = err("[server]\ndrain_delay = \"soon\"\n");
    assert!(m.starts_with("invalid duration \"soon\""), "{m}");
    let (l, c, m) = err("[server]\ndrain_delay = \"301s\"\n");
    assert_eq!((l, c), (2, 15));
    assert!(m.contains("drain_delay must be at most 300s") && m.contains("\"5s\""), "{m}");
}

#[test]
fn access_log_and_log_format_parse_with_their_defaults() {
    let c = parse("").unwrap();
    assert_eq!((c.access_log, c.server.log_format), (None, LogFormat::Text));
    let c = parse("[server]\nlog_format = \"json\"\n[access_log]\npath = \"/var/log/a.jsonl\"\n").unwrap();
    assert_eq!(c.server.log_format, LogFormat::Json);
    let log = c.access_log.unwrap();
    assert_eq!(log.path, AccessLogPath::File("/var/log/a.jsonl".into()));
    assert_eq!(log.sample_allowed, 1.0);
    let c = parse("[access_log]\npath = \"-\"\nsample_allowed = 0.01\n").unwrap();
    assert_eq!(c.access_log.unwrap(), AccessLogConfig { path: AccessLogPath::Stdout, sample_allowed: 0.01 });
    assert_eq!(
        parse("[access_log]\npath = \"-\"\nsample_allowed = 0\n").unwrap().access_log.unwrap().sample_allowed,
        0.0
    );
}

#[test]
fn bad_access_log_and_log_format_values_are_located() {
    let (line, column, message) = err("[server]\nlisten = \"127.0.0.1:1\"\nlog_format = \"JSON \"\n");
    assert_eq!((line, column), (3, 14));
    assert_eq!(message, "unknown log_format \"JSON \": expected \"text\" or \"json\"");
    let (line, column, message) = err("[server]\nlog_format = 1\n");
    assert_eq!((line, column), (2, 14));
    assert!(message.contains("expected a string"), "{message}");
    for (value, col) in [("1.5", 18), ("-0.1", 18), ("nan", 18), ("inf", 18), ("0.0000001", 18)] {
        let (line, column, message) = err(&format!("[access_log]\npath = \"-\"\nsample_allowed = {value}\n"));
        assert_eq!((line, column), (3, col), "{value}");
        assert!(message.starts_with("sample_allowed ") && message.contains("out of range"), "{message}");
    }
    let (line, column, message) = err("[server]\n\n[access_log]\nsample_allowed = 0.5\n");
    assert_eq!((line, column), (3, 1));
    assert!(message.starts_with("[access_log] has no path"), "{message}");
    for bad in ["\"\"", "\"a\\u0000b\""] {
        let (line, column, message) = err(&format!("[access_log]\npath = {bad}\n"));
        assert_eq!((line, column), (2, 8), "{bad}");
        assert!(message.starts_with("access_log path must be a file name"), "{message}");
    }
    let (line, column, message) = err("[access_log]\npath = \"-\"\nquery = true\n");
    assert_eq!((line, column), (3, 1));
    assert!(message.starts_with("unknown field `query`"), "{message}");
}

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

#[test]
fn watch_config_is_off_unless_set_and_must_be_a_boolean() {
    assert!(!parse("[server]\n").unwrap().server.watch_config);
    assert!(parse("[server]\nwatch_config = true\n").unwrap().server.watch_config);
    let (line, column, message) = err("[server]\nwatch_config = \"yes\"\n");
    assert_eq!((line, column), (2, 16));
    assert_eq!(message, "invalid type: string \"yes\", expected a boolean");
}

#[test]
fn delay_is_read_and_every_bad_value_is_located() {
    let rule = |extra: &str| {
        format!(
            "[[rules]]\nname = \"a\"\npath = \"/x\"\nlimits = [{{ limit = 10, window = \"1s\" }}]\n{extra}"
        )
    };
    assert_eq!(parse(&rule("")).unwrap().limiter.rules[0].delay, None);
    let c = parse(&format!(
        "[server]\nmax_delayed = 50\n{}",
        rule("delay = { max_wait = \"500ms\", per_identity = 2 }\n")
    ))
    .unwrap();
    let d = c.limiter.rules[0].delay.unwrap();
    assert_eq!((d.max_wait, d.per_identity, c.limiter.max_delayed), (Delay::from_millis(500), 2, 50));
    let c = parse(&rule("delay = { max_wait = \"60s\" }\n")).unwrap();
    assert_eq!(c.limiter.rules[0].delay.unwrap().per_identity, 4, "the default");
    assert_eq!(c.limiter.max_delayed, 1_000, "the default");
    let cases: [(&str, (usize, usize), &str); 8] = [
        ("delay = { max_wait = \"61s\" }\n", (5, 22), "invalid delay: max_wait must be more than 0 and at most 60s, got 61000ms"),
        ("delay = { max_wait = \"0s\" }\n", (5, 22), "invalid delay: max_wait must be more than 0 and at most 60s, got 0ms"),
        ("delay = { max_wait = \"1s\", per_identity = 0 }\n", (5, 43), "invalid delay: per_identity must be from 1 to 1000, got 0"),
        ("delay = { max_wait = \"1s\", per_identity = 1001 }\n", (5, 43), "invalid delay: per_identity must be from 1 to 1000, got 1001"),
        ("shadow = true\ndelay = { max_wait = \"1s\" }\n", (6, 9), "delay cannot be set on rule \"a\": a shadow rule never refuses, so it has nothing to hold"),
        ("count_status = [404]\ndelay = { max_wait = \"1s\" }\n", (6, 9), "delay cannot be set on rule \"a\": a rule charged after the response (`count_status`, `cost_header`) decides before the cost is known"),
        ("penalty = { after = 5, within = \"1m\", block = \"1m\" }\ndelay = { max_wait = \"1s\" }\n", (6, 9), "delay cannot be set on rule \"a\": each request held counts a denial toward the penalty box, which would block clients for pacing"),
        ("delay = { max_wait = \"1s\", burst = 3 }\n", (5, 28), "unknown field `burst`, expected `max_wait` or `per_identity`"),
    ];
    for (extra, at, expected) in cases {
        let (line, column, message) = err(&rule(extra));
        assert_eq!(((line, column), message.as_str()), (at, expected), "{extra}");
    }
    for bad in ["0", "1000001"] {
        let (line, column, message) = err(&format!("[server]\nmax_delayed = {bad}\n"));
        assert_eq!((line, column), (2, 15));
        assert!(
            message.starts_with(&format!("max_delayed must be from 1 to 1000000, got {bad}")),
            "{message}"
        );
    }
    assert!(err("[server]\nmax_delayed = -1\n").2.contains("u32"), "a negative cap is a type error");
    assert!(parse(&rule("delay = { per_identity = 2 }\n")).is_err(), "max_wait is required");
}

#[test]
fn websocket_idle_timeout_and_grpc_denial_status_have_defaults_and_located_errors() {
    use crate::config::GrpcDenialStatus;
    let c = parse("[server]\n").unwrap();
    assert_eq!(c.server.websocket_idle_timeout, Delay::from_secs(300));
    assert_eq!(c.server.grpc_denial_status, GrpcDenialStatus::ResourceExhausted);
    let c =
        parse("[server]\nwebsocket_idle_timeout = \"45s\"\ngrpc_denial_status = \"unavailable\"\n").unwrap();
    assert_eq!(c.server.websocket_idle_timeout, Delay::from_secs(45));
    assert_eq!(c.server.grpc_denial_status, GrpcDenialStatus::Unavailable);
    let (l, c, m) = err("[server]\nwebsocket_idle_timeout = \"0s\"\n");
    assert_eq!((l, c), (2, 26));
    assert!(m.starts_with("websocket_idle_timeout must be longer than 0"), "{m}");
    let (l, c, m) = err("[server]\n\ngrpc_denial_status = \"RESOURCE_EXHAUSTED\"\n");
    assert_eq!((l, c), (3, 22));
    assert_eq!(
        m,
        "unknown grpc_denial_status \"RESOURCE_EXHAUSTED\": expected \"resource_exhausted\" or \"unavailable\""
    );
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
