//! Who a request is counted as, and which rule it is counted under: identity headers, path spellings, addresses.

use crate::common::*;

/// One rule with a small anonymous quota and a large per-key one, so a
/// request wrongly counted under a fresh key stands out.
fn keyed_config(upstream: &Upstream) -> String {
    format!(
        r#"{head}
[[rules]]
name = "trending"
path = "/api/videos/trending"
anonymous = [{{ limit = 5, window = "60s", algorithm = "sliding_log" }}]
authenticated = [{{ limit = 1000, window = "60s", algorithm = "sliding_log" }}]
"#,
        head = keyed_head(upstream.addr, "", ""),
    )
}

/// A client that names its API key header in `Connection` has it removed
/// before the upstream sees the request (RFC 9110 §7.6.1): the upstream
/// serves it as anonymous, so slidegate must count it as anonymous too, not
/// under the random key it carried.
#[test]
fn an_api_key_named_hop_by_hop_is_counted_as_the_anonymous_request_the_upstream_sees() {
    let upstream = Upstream::start();
    let gate = Slidegate::start(&keyed_config(&upstream));
    let mut passed = 0;
    for i in 0..20 {
        let key = format!("random-key-{i}-{}", std::process::id());
        let reply = gate.get("/api/videos/trending", &[("x-api-key", &key), ("connection", "x-api-key")]);
        assert!(matches!(reply.status, 200 | 429), "{reply:?}");
        if reply.status == 200 {
            passed += 1;
        }
    }
    assert_eq!(passed, 5, "the anonymous limit is 5");
    assert_eq!(upstream.hits(), 5);
    // A key sent normally still gets its own quota.
    assert_eq!(gate.get("/api/videos/trending", &[("x-api-key", "real")]).status, 200);
}

/// Two API keys are refused, whether on two lines or joined by a comma:
/// upstreams disagree on which one counts.
#[test]
fn a_duplicated_api_key_is_refused() {
    let upstream = Upstream::start();
    let gate = Slidegate::start(&keyed_config(&upstream));
    for headers in
        [&[("x-api-key", "fresh-1"), ("x-api-key", "victim")][..], &[("x-api-key", "fresh-2, victim")][..]]
    {
        let reply = gate.get("/api/videos/trending", headers);
        assert_eq!(reply.status, 400, "{headers:?}: {reply:?}");
        assert!(reply.body.contains("API key header must appear once"), "{reply:?}");
    }
    assert_eq!(upstream.hits(), 0);
    assert_eq!(gate.get("/api/videos/trending", &[("x-api-key", "victim")]).status, 200);
}

/// Spellings of a limited path that common routers serve from the limited
/// handler — another case (Express), `%2F` (WSGI), `;param` and `..;/`
/// (Tomcat), `%5C` and trailing dots or spaces (IIS), encoded dot segments —
/// all count against the rule, and reach the upstream exactly as sent. A
/// NUL is refused.
#[test]
fn router_spellings_of_a_limited_path_share_its_quota() {
    let upstream = Upstream::start();
    let gate = Slidegate::start(&format!(
        r#"{head}
[identity]
ip_hash_secret_env = "{SECRET_ENV}"

[[rules]]
name = "trending"
path = "/api/videos/trending"
limits = [{{ limit = 2, window = "60s", algorithm = "sliding_log" }}]

[[rules]]
name = "comments"
path = "/api/videos/{{id}}/comments"
limits = [{{ limit = 2, window = "60s", algorithm = "sliding_log" }}]
"#,
        head = config_head(upstream.addr, "", ""),
    ));
    let spellings = [
        "/API/Videos/Trending",
        "/api%2Fvideos%2ftrending",
        "/api/videos/trending;jsessionid=1",
        "/api/videos/x/..;/trending",
        "/api%5Cvideos%5Ctrending",
        "/api/videos/trending.",
        "/api/videos/trending%20",
        "/api/x/%2e%2e/videos/trending",
    ];
    // Two pass (forwarded as received), every other spelling is denied.
    for (i, spelling) in spellings.iter().enumerate() {
        let reply = gate.get(spelling, &[]);
        if i < 2 {
            assert_eq!(reply.status, 200, "{spelling}: {reply:?}");
            assert!(reply.body.starts_with(&format!("GET {spelling} ")), "{reply:?}");
        } else {
            assert_eq!(reply.status, 429, "{spelling} went unlimited: {reply:?}");
        }
    }
    // A {param} rule: Express keeps %2F inside the id, Tomcat strips ;params.
    for (i, spelling) in ["/api/videos/a%2Fb/comments", "/API/videos/7;x/comments.", "/api/videos/7/Comments"]
        .iter()
        .enumerate()
    {
        let expected = if i < 2 { 200 } else { 429 };
        assert_eq!(gate.get(spelling, &[]).status, expected, "{spelling}");
    }
    let reply = gate.get("/api/videos/trending%00.json", &[]);
    assert_eq!(reply.status, 400, "{reply:?}");
    assert_eq!(upstream.hits(), 4);
}

/// A method in another case is routed as the method by Django and Flask
/// (they upper-case it), so a rule with `methods = ["GET"]` counts `get`
/// and `Get` too, and forwards them as received. They once passed 8 of 8
/// against a limit of 3, without RateLimit headers.
#[test]
fn a_method_in_another_case_counts_under_rules_with_methods() {
    let upstream = Upstream::start();
    let gate = embedded(&upstream);
    let methods = ["get", "Get", "gEt", "get", "GET", "get", "Get", "get"];
    let mut passed = 0;
    for method in methods {
        let reply = request(gate.addr, method, "/api/videos/trending", &[], b"");
        assert!(reply.header("ratelimit").is_some(), "{method}: no RateLimit header: {reply:?}");
        match reply.status {
            200 => {
                passed += 1;
                assert!(reply.body.starts_with(&format!("{method} /api/videos/trending ")), "{reply:?}");
            }
            429 => {}
            other => panic!("{method}: {other}"),
        }
    }
    assert_eq!(passed, 3, "the anonymous limit is 3");
    assert_eq!(upstream.hits(), 3);
    // Another method is still another method.
    assert_eq!(request(gate.addr, "post", "/api/videos/trending", &[], b"").status, 200);
}

/// An upstream that reads headers as WSGI and CGI do: `HTTP_` and the name
/// upper-cased with `-` as `_`, so `x-api-key` and `x_api_key` are one
/// variable, the last line winning. It answers the key it saw.
fn wsgi_upstream() -> std::net::SocketAddr {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut writer = stream;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let mut key = String::new();
                    loop {
                        let mut header = String::new();
                        reader.read_line(&mut header).unwrap();
                        let header = header.trim_end();
                        if header.is_empty() {
                            break;
                        }
                        let (name, value) = header.split_once(':').unwrap();
                        let environ = format!("HTTP_{}", name.trim().to_ascii_uppercase().replace('-', "_"));
                        if environ == "HTTP_X_API_KEY" {
                            value.trim().clone_into(&mut key);
                        }
                    }
                    let body = format!("key={key}");
                    let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
                    if writer
                        .write_all(head.as_bytes())
                        .and_then(|()| writer.write_all(body.as_bytes()))
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A key holder sending its key as `x_api_key` from many addresses was
/// counted per address (anonymous) while a WSGI upstream served every
/// request under the key (`HTTP_X_API_KEY`): 20 of 20 against the key's
/// limit of 5. Now the upstream never receives another spelling of the key
/// header, so it serves what slidegate counted.
#[test]
fn an_underscore_spelling_of_the_key_header_is_not_a_second_identity() {
    let upstream = wsgi_upstream();
    let gate = Slidegate::start(&format!(
        r#"{head}
[identity]
api_key_header = "x-api-key"
ip_hash_secret_env = "{SECRET_ENV}"
trusted_proxies = ["127.0.0.1/32"]

[[rules]]
name = "trending"
path = "/api/videos/trending"
anonymous = [{{ limit = 100, window = "60s", algorithm = "sliding_log" }}]
authenticated = [{{ limit = 5, window = "60s", algorithm = "sliding_log" }}]
"#,
        head = config_head(upstream, "", ""),
    ));
    let mut served_as_key = 0;
    for (i, name) in ["x_api_key", "x_api-key", "X_API_KEY", "x-api_key"].iter().cycle().take(20).enumerate()
    {
        let ip = format!("10.0.3.{}", i + 1);
        let reply = gate.get("/api/videos/trending", &[(name, "holder"), ("x-forwarded-for", &ip)]);
        assert_eq!(reply.status, 200, "{name}: a fresh address has its anonymous quota: {reply:?}");
        if reply.body == "key=holder" {
            served_as_key += 1;
        }
    }
    // Served anonymously, as counted (20 would mean the key's limit of 5 was escaped).
    assert_eq!(served_as_key, 0, "requests served under the key, whose limit is 5");
    // With both spellings, the upstream sees the key slidegate counted.
    let reply = gate.get(
        "/api/videos/trending",
        &[("x-api-key", "counted"), ("x_api_key", "served"), ("x-forwarded-for", "10.0.3.99")],
    );
    assert_eq!((reply.status, reply.body.as_str()), (200, "key=counted"), "{reply:?}");
}

/// Routers that strip a trailing tab or newline (Spring's trimmed path
/// tokens) or a format suffix (Rails' `(.:format)`, Spring's suffix
/// patterns before 5.3) serve `/api/feed%09` and `/api/feed.json` from the
/// `/api/feed` handler: both once went unlimited.
#[test]
fn trailing_whitespace_and_format_suffixes_share_the_quota() {
    let upstream = Upstream::start();
    let gate = Slidegate::start(&format!(
        r#"{head}
[identity]
ip_hash_secret_env = "{SECRET_ENV}"
trusted_proxies = ["127.0.0.1/32"]

[[rules]]
name = "trending"
path = "/api/videos/trending"
limits = [{{ limit = 2, window = "60s", algorithm = "sliding_log" }}]

[[rules]]
name = "feed"
path = "/api/feed"
format_suffix = true
limits = [{{ limit = 2, window = "60s", algorithm = "sliding_log" }}]
"#,
        head = config_head(upstream.addr, "", ""),
    ));
    let spellings = [
        ("/api/videos/trending%09", "10.0.4.1"),
        ("/api/videos/trending%0A", "10.0.4.2"),
        ("/api/videos/trending%0d%0a", "10.0.4.3"),
        ("/api/videos/trending%20%09", "10.0.4.4"),
        ("/api/videos%09/trending", "10.0.4.5"),
        ("/api/feed.json", "10.0.4.6"),
        ("/api/feed.xml", "10.0.4.7"),
        ("/api/feed.json%09", "10.0.4.8"),
        ("/API/feed.JSON;x=1", "10.0.4.9"),
    ];
    for (spelling, ip) in spellings {
        // One plain request, then the spelling until refused.
        let plain = if spelling.contains("feed") { "/api/feed" } else { "/api/videos/trending" };
        assert_eq!(gate.get(plain, &[("x-forwarded-for", ip)]).status, 200);
        let first = gate.get(spelling, &[("x-forwarded-for", ip)]);
        assert_eq!(first.status, 200, "{spelling}: {first:?}");
        assert!(first.body.starts_with(&format!("GET {spelling} ")), "forwarded as received: {first:?}");
        let third = gate.get(spelling, &[("x-forwarded-for", ip)]);
        assert_eq!(third.status, 429, "{spelling} went unlimited: {third:?}");
    }
    // Without `format_suffix`, a suffix is another resource.
    assert_eq!(gate.get("/api/videos/trending.json", &[("x-forwarded-for", "10.0.4.1")]).status, 200);
}
