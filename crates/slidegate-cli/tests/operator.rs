//! What an operator reaches for, against the real binary: `identity hash`
//! (the hash the offenders page shows, for a key or an address), the
//! `--config` spelling shared by `serve` and `check-config`, the top-level
//! help, shell completions and the man page.

#![allow(clippy::unwrap_used)]

#[path = "common/mod.rs"]
mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::*;

/// `slidegate ARGS` with the test secret set as `serve` has it.
fn slidegate(args: &[&str]) -> Output {
    Command::new(binary()).args(args).env(SECRET_ENV, "end-to-end-secret").output().unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `identity hash --config FILE FLAG VALUE`, which must succeed: its output.
fn identity_hash(config: &Path, flag: &str, value: &str) -> String {
    let out = slidegate(&["identity", "hash", "--config", config.to_str().unwrap(), flag, value]);
    assert_eq!(out.status.code(), Some(0), "{flag} {value}: {}", stderr(&out));
    let hash = stdout(&out).trim_end().to_owned();
    assert!(hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()), "{hash:?}");
    hash
}

/// Denied through a real `serve`, a key and an address show on
/// `/v1/offenders` under the very hashes `identity hash` prints for them.
#[test]
fn identity_hash_prints_what_the_offenders_page_shows() {
    let upstream = Upstream::start();
    let text = config_with(upstream.addr, "admin_listen = \"127.0.0.1:0\"", "", "");
    let sg = Slidegate::start(&text);
    // "search" allows 2 a minute per identity: one denial each.
    for _ in 0..3 {
        sg.get("/api/search?q=k", &[("x-api-key", "scraper-key-alpha")]);
        sg.get("/api/search?q=ip", &[]);
    }
    let reply = get(sg.admin_addr(), "/v1/offenders", &[]);
    assert_eq!(reply.status, 200, "{reply:?}");
    let json: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
    let shown = |kind: &str| -> Vec<String> {
        let rows = json["offenders"].as_array().unwrap().iter();
        rows.filter(|o| o["kind"] == kind).map(|o| o["identity"].as_str().unwrap().to_owned()).collect()
    };
    let config = sg.config_path();
    assert_eq!(shown("api_key"), [identity_hash(&config, "--key", "scraper-key-alpha")]);
    assert_eq!(shown("ip"), [identity_hash(&config, "--ip", "127.0.0.1")]);
    // The IPv4-mapped form is the same client; another key is another hash.
    assert_eq!(identity_hash(&config, "--ip", "::ffff:127.0.0.1"), shown("ip")[0]);
    assert_ne!(identity_hash(&config, "--key", "scraper-key-bravo"), shown("api_key")[0]);
}

/// IPv6 clients are grouped by `ipv6_prefix`, as the limits count them.
#[test]
fn identity_hash_groups_ipv6_by_the_configured_prefix() {
    let head = format!("[identity]\nip_hash_secret_env = \"{SECRET_ENV}\"\n");
    let (_dir, grouped) = write_config(&head);
    let (_dir2, exact) = write_config(&format!("{head}ipv6_prefix = 128\n"));
    let (a, b, other) = ("2001:db8:1:2::1", "2001:db8:1:2:ffff::9", "2001:db8:1:3::1");
    assert_eq!(identity_hash(&grouped, "--ip", a), identity_hash(&grouped, "--ip", b));
    assert_ne!(identity_hash(&grouped, "--ip", a), identity_hash(&grouped, "--ip", other));
    assert_ne!(identity_hash(&exact, "--ip", a), identity_hash(&exact, "--ip", b));
}

#[test]
fn identity_hash_refuses_what_it_cannot_hash_truly() {
    let keyed =
        format!("[identity]\napi_key_header = \"x-api-key\"\nip_hash_secret_env = \"{SECRET_ENV}\"\n");
    let (_d1, config) = write_config(&keyed);
    let (_d2, unkeyed) = write_config("[identity]\napi_key_header = \"x-api-key\"\n");
    let (_d3, no_header) = write_config(&format!("[identity]\nip_hash_secret_env = \"{SECRET_ENV}\"\n"));
    let path = |p: &Path| p.to_str().unwrap().to_owned();
    for (args, said) in [
        (vec!["--config", &path(&config), "--ip", "1.2.3"], "--ip \"1.2.3\" is not an IP address"),
        (vec!["--config", &path(&config), "--ip", ""], "--ip \"\" is not an IP address"),
        (vec!["--config", &path(&config), "--ip", "10.0.0.1/8"], "--ip \"10.0.0.1/8\" is not an IP address"),
        (vec!["--config", &path(&config), "--key", ""], "--key is empty"),
        (vec!["--config", &path(&config), "--key", "a,b"], "comma"),
        (vec!["--config", &path(&config), "--key", "line\nbreak"], "cannot be an HTTP header value"),
        (vec!["--config", &path(&unkeyed), "--key", "k"], "no [identity] ip_hash_secret_env"),
        (vec!["--config", &path(&unkeyed), "--ip", "192.0.2.1"], "random secret"),
        (vec!["--config", &path(&no_header), "--key", "k"], "no [identity] api_key_header"),
        (vec!["--config", "/nonexistent/slidegate.toml", "--ip", "192.0.2.1"], "/nonexistent/slidegate.toml"),
    ] {
        let out = slidegate(&[&["identity", "hash"], &args[..]].concat());
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
        assert!(err.contains(said), "{args:?}: {err}");
        assert!(stdout(&out).is_empty() && !err.contains("panicked"), "{args:?}: {err}");
    }
    // The secret's variable unset: the config error, located.
    let out = Command::new(binary())
        .args(["identity", "hash", "--config", &path(&config), "--ip", "192.0.2.1"])
        .env_remove(SECRET_ENV)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(
        stderr(&out).contains(&format!("slidegate.toml:3:22: environment variable {SECRET_ENV} is not set"))
    );
    // Exactly one of --key and --ip.
    for args in [&["--ip", "192.0.2.1", "--key", "k"][..], &[]] {
        let out = slidegate(&[&["identity", "hash", "--config", &path(&config)], args].concat());
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    }
}

/// `--config FILE` is spelled the same on `serve`, `check-config` and
/// `identity hash`; the positional form of `check-config` still works.
#[test]
fn check_config_takes_config_as_serve_does() {
    let upstream = Upstream::start();
    let (_dir, file) = write_config(&config(&upstream, "", ""));
    let file = file.to_str().unwrap();
    let flagged = slidegate(&["check-config", "--config", file]);
    assert_eq!(flagged.status.code(), Some(0), "{}", stderr(&flagged));
    assert!(stdout(&flagged).starts_with(&format!("{file}: ok\n")), "{}", stdout(&flagged));
    let short = slidegate(&["check-config", "-c", file]);
    let positional = slidegate(&["check-config", file]);
    assert_eq!(positional.status.code(), Some(0), "{}", stderr(&positional));
    assert_eq!((stdout(&short), stdout(&positional)), (stdout(&flagged), stdout(&flagged)));
    // A broken file is refused alike whichever way it is named.
    let (_dir, broken) = write_config("[server]\nlisten_on = 1\n");
    let broken = broken.to_str().unwrap();
    for args in [&["check-config", "--config", broken][..], &["check-config", broken]] {
        let out = slidegate(args);
        assert_eq!(out.status.code(), Some(64), "{args:?}");
        assert!(stderr(&out).contains("slidegate.toml:2:1: unknown field `listen_on`"), "{}", stderr(&out));
    }
    // Both, neither, or a flag without its value: a usage error naming the way.
    for args in
        [&["check-config", "--config", file, file][..], &["check-config"], &["check-config", "--config"]]
    {
        let out = slidegate(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("--config"), "{args:?}: {}", stderr(&out));
        assert!(!stderr(&out).contains("panicked"), "{args:?}: {}", stderr(&out));
    }
}

/// `check-config` warns (and still says ok) when the admin endpoints,
/// which reload the configuration, set overrides and lift penalties, are
/// reachable beyond this host without a token; not on loopback, nor with
/// a token.
#[test]
fn check_config_warns_of_admin_endpoints_open_without_a_token() {
    let upstream = Upstream::start();
    let warned = "no token is set; anyone who reaches it can reload the configuration, set overrides \
                  and lift penalties: set check_token_env to require a bearer token";
    for (server, warning) in [
        ("admin_listen = \"0.0.0.0:9091\"", Some("admin_listen 0.0.0.0:9091 is not a loopback address")),
        ("admin_listen = \"[::]:9091\"", Some("admin_listen [::]:9091 is not a loopback address")),
        ("admin_on_public = true", Some("the admin endpoints are on the public listener (admin_on_public)")),
        ("admin_listen = \"127.0.0.1:9091\"", None),
        ("admin_listen = \"[::1]:9091\"", None),
        ("admin_listen = \"0.0.0.0:9091\"\ncheck_token_env = \"SLIDEGATE_TEST_TOKEN\"", None),
    ] {
        let (_dir, file) = write_config(&config_with(upstream.addr, server, "", ""));
        let out = Command::new(binary())
            .args(["check-config", file.to_str().unwrap()])
            .env(SECRET_ENV, "end-to-end-secret")
            .env("SLIDEGATE_TEST_TOKEN", "a-token-long-enough-to-be-accepted-here")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{server}: {}", stderr(&out));
        match warning {
            Some(warning) => {
                assert_eq!(stderr(&out), format!("slidegate: warning: {warning} and {warned}\n"), "{server}")
            }
            None => assert_eq!(stderr(&out), "", "{server}"),
        }
    }
}

/// A file with errors in three parts: `check-config` and `serve` report
/// the three, each located, in file order, and exit 64 (EX_USAGE).
#[test]
fn check_config_and_serve_report_every_error_located_in_file_order() {
    let text = "[server]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:1\"\nthreads = 0\n\n\
                [store]\ntimeout_ms = \"fast\"\n\n\
                [[rules]]\nname = \"fine\"\npath = \"/fine\"\nlimits = [{ limit = 5, window = \"1s\" }]\n\n\
                [[rules]]\nname = \"never\"\npath = \"/never\"\nlimits = [{ limit = 0, window = \"1s\" }]\n";
    let (_dir, file) = write_config(text);
    let name = file.to_str().unwrap();
    for args in [&["check-config", "--config", name][..], &["serve", "--config", name]] {
        let out = slidegate(args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        let located: Vec<&str> = err.lines().filter(|l| l.contains("slidegate.toml:")).collect();
        let at: Vec<&str> = located
            .iter()
            .map(|l| l.split("slidegate.toml:").nth(1).unwrap().split(": ").next().unwrap())
            .collect();
        assert_eq!(at, ["4:11", "7:14", "17:21"], "{args:?}: {err}");
        assert!(located[0].ends_with("threads must be at least 1"), "{err}");
        assert!(located[1].contains("expected"), "{err}");
        assert!(located[2].ends_with("invalid limit: limit must be at least 1, got 0"), "{err}");
        assert!(err.trim_end().ends_with("3 errors"), "{err}");
        assert!(stdout(&out).is_empty(), "{args:?}: {}", stdout(&out));
    }
}

/// Every subcommand, as `slidegate --help` must list it: a name and a line.
const SUBCOMMANDS: [&str; 10] = [
    "demo",
    "bench",
    "accuracy",
    "serve",
    "check-config",
    "replay",
    "identity",
    "completions",
    "man",
    "help",
];

#[test]
fn top_level_help_lists_every_subcommand_with_a_line_each() {
    let out = slidegate(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    let help = stdout(&out);
    // The tool's own description, not a stale list of some subcommands.
    assert!(help.starts_with("slidegate: a sliding-window rate limiter"), "{help}");
    let commands: Vec<(&str, &str)> = help
        .split("Commands:\n")
        .nth(1)
        .unwrap()
        .lines()
        .take_while(|l| l.starts_with("  "))
        .map(|l| l.trim().split_once(' ').map(|(n, d)| (n, d.trim())).unwrap_or((l.trim(), "")))
        .collect();
    let names: Vec<&str> = commands.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, SUBCOMMANDS, "{help}");
    for (name, line) in commands {
        assert!(line.len() > 10, "{name} has no line of its own: {help}");
        let sub = slidegate(&["help", name]);
        assert_eq!(sub.status.code(), Some(0), "help {name}: {}", stderr(&sub));
        assert!(stdout(&sub).contains(&format!("Usage: slidegate {name}")), "help {name}: {}", stdout(&sub));
    }
}

/// Shell completions, generated from the argument definitions: each script
/// names every subcommand and the flags of one.
#[test]
fn completions_are_generated_for_each_shell() {
    for (shell, marker) in
        [("bash", "complete -F"), ("zsh", "#compdef slidegate"), ("fish", "complete -c slidegate")]
    {
        let out = slidegate(&["completions", shell]);
        assert_eq!(out.status.code(), Some(0), "{shell}: {}", stderr(&out));
        let script = stdout(&out);
        assert!(script.contains(marker), "{shell}: {script}");
        for name in SUBCOMMANDS {
            assert!(script.contains(name), "{shell} completion lacks {name}");
        }
        assert!(script.contains("config"), "{shell}: no --config");
    }
    for (args, said) in
        [(&["completions", "tcsh"][..], "[possible values: bash, zsh, fish]"), (&["completions"], "<SHELL>")]
    {
        let out = slidegate(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(stderr(&out).contains(said), "{args:?}: {}", stderr(&out));
    }
}

/// A man page (roff), generated from the argument definitions, naming every
/// subcommand with its line; each subcommand has a page of its own, as the
/// main page's references to `slidegate-NAME(1)` promise.
#[test]
fn the_man_page_names_every_subcommand() {
    let out = slidegate(&["man"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let page = stdout(&out);
    assert!(page.contains(".TH slidegate 1"), "{page}");
    assert!(page.contains(".SH SUBCOMMANDS"), "{page}");
    for name in SUBCOMMANDS {
        let roff = name.replace('-', "\\-");
        assert!(page.contains(&format!("slidegate\\-{roff}(1)")), "man lacks {name}: {page}");
    }
    assert!(page.contains("Validate a configuration file"), "{page}");
    let out = slidegate(&["man", "check-config"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let page = stdout(&out);
    assert!(page.contains(".TH slidegate-check-config 1"), "{page}");
    assert!(page.contains("\\-\\-config"), "{page}");
    let out = slidegate(&["man", "identity", "hash"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains(".TH slidegate-identity-hash 1"), "{}", stdout(&out));
    for args in [&["man", "nonsense"][..], &["man", "identity", "nonsense"], &["man", "serve", "x"]] {
        let out = slidegate(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("subcommand"), "{args:?}: {}", stderr(&out));
        assert!(stdout(&out).is_empty(), "{args:?}");
    }
}

/// `man --out-dir` writes every page a package installs: the main one and
/// one per subcommand, nested ones too, each titled as its file is named.
#[test]
fn man_out_dir_writes_every_page() {
    let dir = tempfile::tempdir().unwrap();
    let out = slidegate(&["man", "--out-dir", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mut files: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert_eq!(stdout(&out).lines().count(), files.len(), "{}", stdout(&out));
    let mut expected = vec!["slidegate.1".to_string(), "slidegate-identity-hash.1".to_string()];
    expected
        .extend(SUBCOMMANDS.iter().filter(|name| **name != "help").map(|name| format!("slidegate-{name}.1")));
    for name in &expected {
        assert!(files.contains(name), "{name} missing from {files:?}");
    }
    assert!(!files.iter().any(|name| name.contains("help")), "{files:?}");
    for name in &files {
        let page = std::fs::read_to_string(dir.path().join(name)).unwrap();
        let title = name.trim_end_matches(".1");
        assert!(page.contains(&format!(".TH {title} 1")), "{name}: {page}");
    }
    let missing = dir.path().join("nowhere");
    let out = slidegate(&["man", "--out-dir", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("not an existing directory"), "{}", stderr(&out));
    let out = slidegate(&["man", "serve", "--out-dir", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// A loopback port nothing listens on.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A Redis that refuses the connection is named in the error, its password
/// never: by `bench`, `demo` and `serve` alike.
#[test]
fn a_refused_redis_is_named_without_its_password() {
    let port = closed_port();
    let url = format!("redis://user:hunter2@127.0.0.1:{port}");
    let shown = format!("redis://user:***@127.0.0.1:{port}");
    let cluster = format!("{url},redis://user:hunter2@127.0.0.1:{}", closed_port());
    for args in [
        &["bench", "redis", "--redis-url", &url, "--seconds", "1"][..],
        &["bench", "redis", "--redis-cluster", &cluster, "--seconds", "1"],
        &["bench", "attack", "--redis-url", &url],
        &["demo", "--redis-url", &url],
        &["demo", "--redis-cluster", &cluster],
    ] {
        let out = slidegate(args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(&shown) && err.contains("Connection refused"), "{args:?}: {err}");
        assert!(!err.contains("hunter2") && !err.contains("panicked"), "{args:?}: {err}");
    }
    // serve starts anyway (each rule's on_error), and says where it could not connect.
    let upstream = Upstream::start();
    let store = format!("[store]\nurl = \"{url}\"\n");
    let mut sg = Slidegate::start(&config(&upstream, &store, ""));
    let log = sg.log.lock().unwrap().clone();
    assert!(log.contains("cannot connect to Redis at start") && log.contains(&shown), "{log}");
    assert!(!log.contains("hunter2"), "{log}");
    assert_eq!(sg.terminate().code(), Some(0));
}

/// `--engine module` on a Redis without the module says how to load it,
/// or to use `auto`; before any load is sent.
#[test]
fn engine_module_without_the_module_says_how_to_load_it() {
    let redis = RedisServer::spawn();
    let url = redis.url();
    for args in [
        &["bench", "redis", "--redis-url", &url, "--engine", "module", "--seconds", "1"][..],
        &["bench", "attack", "--redis-url", &url, "--engine", "module"],
        &["demo", "--redis-url", &url, "--engine", "module"],
    ] {
        let out = slidegate(args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        for said in ["--loadmodule", "libslidegate_redis_module.so", "--engine auto"] {
            assert!(err.contains(said), "{args:?}: {said} not in {err}");
        }
        assert!(stdout(&out).is_empty(), "{args:?}: {}", stdout(&out));
    }
    // With the module loaded, the same run goes through it.
    let args = slidegate_test_redis::module_args();
    let loaded = RedisServer::spawn_with_args(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let out = slidegate(&["bench", "attack", "--redis-url", &loaded.url(), "--engine", "module", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    // Every decision reached Redis: none fell back for want of the module.
    let plain = &json["modes"]["no_deny_cache"];
    assert_eq!(
        (plain["requests"].as_u64(), plain["store_calls"].as_u64()),
        (Some(7500), Some(7500)),
        "{json}"
    );
}

/// `bench redis` takes `--timeout` and says which engine `auto` chose (a
/// plain Redis has no module: the Lua scripts; one with it loaded: the
/// module), in JSON and on stderr.
#[test]
fn bench_takes_a_timeout_and_names_the_engine_auto_chose() {
    let server = RedisServer::spawn();
    let url = server.url();
    let args = [
        "bench",
        "redis",
        "--redis-url",
        &url,
        "--seconds",
        "0.1",
        "--identities",
        "50",
        "--memory-identities",
        "50",
        "--connections",
        "1",
        "--in-flight",
        "2",
        "--no-redis-benchmark",
        "--timeout",
        "10",
    ];
    let json = slidegate(&[&args[..], &["--json"]].concat());
    assert_eq!(json.status.code(), Some(0), "{}", stderr(&json));
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(report["setup"]["engine"], "auto");
    assert_eq!(report["setup"]["engine_used"], "lua");
    let text = slidegate(&args);
    assert_eq!(text.status.code(), Some(0), "{}", stderr(&text));
    assert!(stderr(&text).contains("engine: lua (chosen by auto;"), "{}", stderr(&text));
    for bad in ["0", "soon", "99999"] {
        let out = slidegate(&["bench", "redis", "--redis-url", &url, "--timeout", bad]);
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", stderr(&out));
        assert!(stderr(&out).contains("--timeout"), "{bad}: {}", stderr(&out));
    }
    let module = slidegate_test_redis::module_args();
    let loaded = RedisServer::spawn_with_args(&module.iter().map(String::as_str).collect::<Vec<_>>());
    let loaded_url = loaded.url();
    let args: Vec<&str> = args.iter().map(|a| if *a == url { loaded_url.as_str() } else { a }).collect();
    let json = slidegate(&[&args[..], &["--json"]].concat());
    assert_eq!(json.status.code(), Some(0), "{}", stderr(&json));
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(report["setup"]["engine_used"], "module");
}

/// `redis-cli -p PORT ARGS`: its output, trailing newline removed.
fn redis_cli(redis: &RedisServer, args: &[&str]) -> String {
    let out = Command::new("redis-cli").args(["-p", &redis.port().to_string()]).args(args).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim_end().to_owned()
}

/// Through a real `serve` on the packed layout: the counts are fields of
/// window hashes (no key per identity), each with a TTL, and `identity show`
/// finds them and tells what is left without charging.
#[test]
fn identity_show_reads_the_packed_layout_through_serve() {
    let redis = RedisServer::spawn();
    let upstream = Upstream::start();
    let store = format!(
        "[store]\nurl = \"{}\"\ntimeout_ms = 10000\ndeny_cache = 0\nlayout = \"packed\"\nexpected_identities = 1000\n",
        redis.url()
    );
    let text = format!(
        r#"{head}
[[rules]]
name = "api"
path = "/api/*"
limits = [{{ name = "burst", limit = 3, window = "60s", algorithm = "sliding_window_counter" }}, {{ name = "steady", limit = 5, window = "60s", algorithm = "fixed_window" }}]
"#,
        head = keyed_head(upstream.addr, "", &store)
    );
    let sg = Slidegate::start(&text);
    let statuses: Vec<u16> = (0..4).map(|_| sg.get("/api/x", &[("x-api-key", "k1")]).status).collect();
    assert_eq!(statuses, [200, 200, 200, 429]);
    // One window hash per limit, one field in each: the three admitted
    // permits (the denied fourth charged neither limit).
    let keys = redis_cli(&redis, &["--scan", "--pattern", "slidegate:*"]);
    let mut keys: Vec<&str> = keys.lines().collect();
    keys.sort_unstable();
    // Beside them, the record of the layout every instance on the prefix shares.
    let record = keys.iter().position(|k| *k == "slidegate:layout").map(|i| keys.remove(i));
    assert_eq!(record, Some("slidegate:layout"), "{keys:?}");
    assert_eq!(redis_cli(&redis, &["GET", "slidegate:layout"]), "packed 32");
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert!(keys[0].contains("}:fw:5:60000:") && keys[1].contains("}:swc:3:60000:"), "{keys:?}");
    for key in &keys {
        assert_eq!(redis_cli(&redis, &["TYPE", key]), "hash");
        assert_eq!(redis_cli(&redis, &["HLEN", key]), "1");
        let ttl: i64 = redis_cli(&redis, &["PTTL", key]).parse().unwrap();
        assert!(ttl > 0 && ttl <= 120_000, "{key}: {ttl}");
        assert_eq!(redis_cli(&redis, &["OBJECT", "ENCODING", key]), "listpack");
    }
    let config = sg.config_path();
    let show = |flag: &str, value: &str| {
        let out = slidegate(&[
            "identity",
            "show",
            "--config",
            config.to_str().unwrap(),
            "--rule",
            "api",
            flag,
            value,
        ]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        stdout(&out)
    };
    let shown = show("--key", "k1");
    let hash = identity_hash(&config, "--key", "k1");
    assert!(shown.starts_with(&format!("identity k:{hash}")), "{shown}");
    assert!(shown.contains("layout packed (32 buckets)"), "{shown}");
    assert_eq!(shown.matches("    packed: field ").count(), 2, "{shown}");
    assert!(shown.contains("remaining 0 of 3"), "{shown}");
    assert!(shown.contains("remaining 2 of 5"), "{shown}");
    // Showing charged nothing: still exactly the same state.
    let remaining = |text: &str| {
        text.lines()
            .filter(|l| l.contains("remaining"))
            .map(|l| l.split(',').next().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(remaining(&show("--key", "k1")), ["    remaining 0 of 3", "    remaining 2 of 5"]);
    assert_eq!(sg.get("/api/x", &[("x-api-key", "k1")]).status, 429);
    let other = show("--ip", "127.0.0.1");
    assert!(other.contains("remaining 3 of 3") && other.contains("remaining 5 of 5"), "{other}");
    // What it cannot show, it says, exit 64.
    let path = config.to_str().unwrap();
    let (_dir, embedded) = write_config(&format!("[identity]\nip_hash_secret_env = \"{SECRET_ENV}\"\n"));
    for (args, said) in [
        (
            vec!["--config", path, "--rule", "nope", "--key", "k1"],
            "has no rule \"nope\": its rules are [\"api\"]",
        ),
        (vec!["--config", path, "--rule", "api", "--key", ""], "--key is empty"),
        (vec!["--config", path, "--rule", "api", "--ip", "1.2.3"], "is not an IP address"),
        (
            vec!["--config", embedded.to_str().unwrap(), "--rule", "api", "--ip", "192.0.2.1"],
            "names no Redis",
        ),
    ] {
        let out = slidegate(&[&["identity", "show"], &args[..]].concat());
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
        assert!(err.contains(said), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
