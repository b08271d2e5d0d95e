//! `[server]` and `[access_log]`: listeners, drain, reload, WebSockets,
//! gRPC and the access log, with their defaults and located errors.

use slidegate_http::config::TimeSpan;

use super::tests::{err, parse};
use super::*;

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

/// No two listeners on one socket: `check-config` refuses what `serve`
/// would fail to bind, at the later one's line, naming both settings.
#[test]
fn two_listeners_on_one_socket_are_refused_naming_both() {
    let cases = [
        (
            "admin_listen = \"127.0.0.1:9091\"\nauth_listen = \"127.0.0.1:9091\"",
            (4, 15),
            "auth_listen 127.0.0.1:9091 is the admin_listen address",
        ),
        (
            "grpc_listen = \"127.0.0.1:8081\"\nauth_listen = \"127.0.0.1:8081\"",
            (4, 15),
            "auth_listen 127.0.0.1:8081 is the grpc_listen address",
        ),
        (
            "admin_listen = \"127.0.0.1:9091\"\ngrpc_listen = \"127.0.0.1:9091\"",
            (4, 15),
            "grpc_listen 127.0.0.1:9091 is the admin_listen address",
        ),
        ("auth_listen = \"127.0.0.1:8080\"", (3, 15), "auth_listen 127.0.0.1:8080 is the listen address"),
        (
            "admin_listen = \"0.0.0.0:8080\"",
            (3, 16),
            "admin_listen 0.0.0.0:8080 and listen 127.0.0.1:8080 share port 8080",
        ),
        (
            "admin_listen = \"[::]:9091\"\nauth_listen = \"127.0.0.1:9091\"",
            (4, 15),
            "auth_listen 127.0.0.1:9091 and admin_listen [::]:9091 share port 9091",
        ),
    ];
    for (listeners, at, said) in cases {
        let (l, c, m) = err(&format!("[server]\nlisten = \"127.0.0.1:8080\"\n{listeners}\n"));
        assert_eq!((l, c), at, "{listeners}: {m}");
        assert!(m.starts_with(said), "{listeners}: {m}");
        assert!(m.contains("expected another address"), "{m}");
    }
    // Apart: other ports, other families, and ports the system picks.
    for listeners in [
        "admin_listen = \"127.0.0.1:9091\"\ngrpc_listen = \"127.0.0.1:8081\"\nauth_listen = \"127.0.0.1:9092\"",
        "admin_listen = \"0.0.0.0:9091\"\nauth_listen = \"[::1]:9091\"",
        "admin_listen = \"127.0.0.1:9091\"\nauth_listen = \"127.0.0.2:9091\"",
        "admin_listen = \"127.0.0.1:0\"\ngrpc_listen = \"127.0.0.1:0\"\nauth_listen = \"127.0.0.1:0\"",
    ] {
        let text = format!("[server]\nlisten = \"127.0.0.1:8080\"\n{listeners}\n");
        assert!(parse(&text).is_ok(), "{listeners}: {:?}", parse(&text).err().map(|e| e.to_string()));
    }
}

/// A forward-auth listener that no proxy may ask is valid, but can only
/// refuse: warned of, and only then.
#[test]
fn auth_listen_without_trusted_proxies_is_warned_of() {
    let auth = "[server]\nauth_listen = \"127.0.0.1:9092\"\n";
    let warnings = parse(auth).unwrap().warnings();
    assert_eq!(
        warnings,
        ["auth_listen 127.0.0.1:9092 is set and [identity] trusted_proxies is empty: every forward-auth request \
          will be refused (403); list the proxies that ask it"]
    );
    let trusted = format!("{auth}[identity]\ntrusted_proxies = [\"127.0.0.1/32\"]\n");
    assert_eq!(parse(&trusted).unwrap().warnings(), Vec::<String>::new());
    assert_eq!(parse("[identity]\n").unwrap().warnings(), Vec::<String>::new());
}

#[test]
fn drain_delay_defaults_to_none_and_bad_values_are_located() {
    assert_eq!(parse("").unwrap().server.drain_delay, TimeSpan::from_secs(0));
    let c = parse("[server]\ndrain_delay = \"5s\"\n").unwrap();
    assert_eq!(c.server.drain_delay, TimeSpan::from_secs(5));
    assert_eq!(parse("[server]\ndrain_delay = \"0s\"\n").unwrap().server.drain_delay, TimeSpan::from_secs(0));
    assert_eq!(
        parse("[server]\ndrain_delay = \"5m\"\n").unwrap().server.drain_delay,
        TimeSpan::from_secs(300)
    );
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

#[test]
fn watch_config_is_off_unless_set_and_must_be_a_boolean() {
    assert!(!parse("[server]\n").unwrap().server.watch_config);
    assert!(parse("[server]\nwatch_config = true\n").unwrap().server.watch_config);
    let (line, column, message) = err("[server]\nwatch_config = \"yes\"\n");
    assert_eq!((line, column), (2, 16));
    assert_eq!(message, "invalid type: string \"yes\", expected a boolean");
}

#[test]
fn websocket_idle_timeout_and_grpc_denial_status_have_defaults_and_located_errors() {
    use crate::config::GrpcDenialStatus;
    let c = parse("[server]\n").unwrap();
    assert_eq!(c.server.websocket_idle_timeout, TimeSpan::from_secs(300));
    assert_eq!(c.server.grpc_denial_status, GrpcDenialStatus::ResourceExhausted);
    let c =
        parse("[server]\nwebsocket_idle_timeout = \"45s\"\ngrpc_denial_status = \"unavailable\"\n").unwrap();
    assert_eq!(c.server.websocket_idle_timeout, TimeSpan::from_secs(45));
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
