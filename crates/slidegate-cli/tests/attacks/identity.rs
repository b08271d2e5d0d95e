//! Who a request is counted as, and which rule it is counted under: identity headers, path spellings, addresses.

use crate::common::*;

/// One rule with a small anonymous quota and a large per-key one, so a
/// request wrongly counted under a fresh key stands out.
fn keyed_config(upstream: &Upstream) -> String {
    format!(
        r#"{head}
[identity]
api_key_header = "x-api-key"
ip_hash_secret_env = "{SECRET_ENV}"

[[rules]]
name = "trending"
path = "/api/videos/trending"
anonymous = [{{ limit = 5, window = "60s", algorithm = "sliding_log" }}]
authenticated = [{{ limit = 1000, window = "60s", algorithm = "sliding_log" }}]
"#,
        head = config_head(upstream.addr, "", ""),
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
