//! Parsing and validation of the TOML configuration.

use http::Method;
use ipnet::IpNet;
use slidegate::Algorithm;

use super::validate::Use;
use super::*;
use slidegate::RedisTarget;
use slidegate_http::config::{IdentityConfig, IdentityKind, OnError, RuleLimits, TimeSpan};
use slidegate_http::{BreadthOf, ForwardedHeader, StoreGuard};

/// The example configuration shipped in `examples/` (also the README's), word for word.
const EXAMPLE_CONFIG: &str = include_str!("../../../../examples/slidegate.toml");

/// The Redis URL the example names; tests only parse it, never connect.
fn example_redis_url() -> &'static str {
    EXAMPLE_CONFIG.lines().find_map(|l| l.strip_prefix("url = \"")?.split('"').next()).unwrap()
}

/// An environment in which no variable is set.
pub(super) fn no_env(_: &str) -> Option<String> {
    None
}

/// Parses `source` with no environment variable set.
pub(super) fn parse(source: &str) -> Result<Config, ConfigError> {
    Config::parse_with_env(source, "t.toml", &no_env)
}

pub(super) fn err(source: &str) -> (usize, usize, String) {
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
    assert_eq!(c.limiter.guard.calls.timeout, TimeSpan::from_millis(50));
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
    assert_eq!(c.server.shutdown_grace, TimeSpan::from_secs(10));
    assert_eq!(c.store.on_error, OnError::Fallback, "a failing store never means unlimited by default");
    let c = parse("[store]\nfallback = true\n").unwrap();
    assert_eq!(c.store.on_error, OnError::Fallback);
    let c = parse("[store]\ninsurance = true\n").unwrap();
    assert_eq!(c.store.on_error, OnError::Fallback);
    let c = parse("[server]\nshutdown_grace = \"250ms\"\n").unwrap();
    assert_eq!(c.server.shutdown_grace, TimeSpan::from_millis(250));
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
    assert_eq!(c.server.body_timeout, TimeSpan::from_secs(30));
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
    assert_eq!((c.server.body_timeout, c.server.max_upstream_connections), (TimeSpan::from_millis(300), 4));
    assert_eq!(err("[server]\nbody_timeout = \"0s\"\n").0, 2);
    assert_eq!(err("[server]\nmax_upstream_connections = 0\n").0, 2);
}

/// Loaded for the limiter alone (`slidegate replay`), `[server]` gives its
/// `max_delayed` and nothing is looked for that only the proxy uses: an
/// unset token variable, missing TLS files, a clash of listeners. Its keys
/// are still read, so a typo is still an error.
#[test]
fn the_limiter_alone_asks_nothing_of_server_but_max_delayed() {
    let limiter = |text: &str| Config::parse_for(text, "t.toml".as_ref(), &no_env, Use::Limiter);
    let server = "[server]
check_token_env = \"CHECK_TOKEN\"\ntls = { cert = \"no.pem\", key = \"no.key\" }\n\
                  admin_listen = \"127.0.0.1:8080\"\nlisten = \"127.0.0.1:8080\"\nmax_delayed = 7\n";
    let text = format!(
        "{server}[[rules]]\nname = \"api\"\npath = \"/*\"\nlimits = [{{ limit = 1, window = \"1s\" }}]\n"
    );
    let c = limiter(&text).unwrap();
    assert_eq!((c.limiter.max_delayed, c.limiter.rules.len()), (7, 1));
    assert_eq!(c.server.check_token, None);
    assert!(parse(&text).is_err(), "the library validates [server] whole");
    let only_token = text.replace("tls = ", "# tls = ").replace("admin_listen", "# admin_listen");
    let e = parse(&only_token).unwrap_err().to_string();
    assert!(e.contains("CHECK_TOKEN is not set"), "{e}");
    assert_eq!(limiter(&only_token).unwrap().limiter.max_delayed, 7);
    let (l, c) = limiter("[server]\nmax_delayed = 0\n").unwrap_err().location().unwrap();
    assert_eq!((l, c), (2, 15));
    let e = limiter("[server]\ncheck_token = \"t\"\n").unwrap_err();
    assert!(e.to_string().starts_with("t.toml:2:1: unknown field `check_token`"), "{e}");
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
    assert_eq!(lease, Some(slidegate::protect::LeasePolicy { max: 32, horizon: TimeSpan::from_millis(20) }));
    let lease = parse("[store]\nlease = { max = 64 }\n").unwrap().limiter.guard.lease;
    assert_eq!(lease.map(|l| l.horizon), Some(TimeSpan::from_millis(50)));
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
    assert_eq!((c.server.min_body_rate, c.server.body_rate_grace), (500, TimeSpan::from_secs(10)));
    assert_eq!(c.server.upstream_connections_per_client(), 64);
    let c = parse("[server]\nmax_upstream_connections = 50\n").unwrap();
    assert_eq!(c.server.upstream_connections_per_client(), 3);
    let c = parse("[server]\nmax_upstream_connections = 4\n").unwrap();
    assert_eq!(c.server.upstream_connections_per_client(), 1);
    let c = parse(
        "[server]\nmin_body_rate = 0\nbody_rate_grace = \"2s\"\nmax_upstream_connections_per_client = 1024\n",
    )
    .unwrap();
    assert_eq!((c.server.min_body_rate, c.server.body_rate_grace), (0, TimeSpan::from_secs(2)));
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
    assert_eq!((d.max_wait, d.per_identity, c.limiter.max_delayed), (TimeSpan::from_millis(500), 2, 50));
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

/// `[[rules]]` × `n`, each its own name, path and quota.
fn rules(n: usize) -> String {
    let mut text = String::from("[server]\nupstream = \"http://127.0.0.1:9\"\n");
    for i in 0..n {
        text.push_str(&format!(
            "\n[[rules]]\nname = \"rule-{i}\"\npath = \"/api/v1/thing{i}/*\"\nlimits = [{{ limit = {}, window = \"1m\" }}]\n",
            100 + i % 50
        ));
    }
    text
}

/// Validation is linear in the number of rules: eight times the rules take
/// about eight times as long, not 64 (a reload of 30,000 rules took 2.7 s,
/// duplicate names looked for by a scan of the rules before each: 23.5×
/// here, 8.6× after). The least CPU time of three runs of each, and a
/// bound of 14×, leave room for a busy machine; BENCHMARKS.md has the
/// figures.
#[test]
fn validation_is_linear_in_the_number_of_rules() {
    let fastest = |text: &str| crate::test_timing::fastest(|| parse(text).unwrap());
    let (small, large) = (rules(3_000), rules(24_000));
    let (t_small, t_large) = (fastest(&small), fastest(&large));
    assert!(t_large < t_small * 14, "3,000 rules in {t_small:?}, 24,000 in {t_large:?}");
    // Two rules of one name are still found, the second located.
    let twice = format!(
        "{}{}",
        rules(2),
        "\n[[rules]]\nname = \"rule-0\"\npath = \"/x\"\nlimits = [{ limit = 1, window = \"1s\" }]\n"
    );
    let (line, column, message) = err(&twice);
    assert_eq!(
        (line, column, message.as_str()),
        (15, 8, "duplicate rule name \"rule-0\": rule names must be unique")
    );
}
