//! The headers and the problem bodies, rendered from verdicts.

use http_body_util::BodyExt;
use slidegate::{Decision, Quota};

use super::*;
use crate::verdict::DecisionSource;

fn policy(
    name: &'static str,
    limit: u64,
    window_ms: u64,
    remaining: u64,
    reset_ms: u64,
    retry_ms: Option<u64>,
) -> PolicyResult<'static> {
    PolicyResult {
        name,
        quota: Quota::new(limit, Duration::from_millis(window_ms)).unwrap(),
        decision: Decision {
            allowed: retry_ms.is_none(),
            limit,
            remaining,
            reset_after: Duration::from_millis(reset_ms),
            retry_after: retry_ms.map(Duration::from_millis),
        },
    }
}

fn verdict(policies: Vec<PolicyResult<'static>>, shadow: bool) -> Verdict<'static> {
    Verdict {
        rule: "search",
        policies: policies.into(),
        source: DecisionSource::Store,
        shadow,
        pending: None,
        blocked: false,
        set_values: None,
        cost_header: None,
        over_in_flight: None,
        identity: (&slidegate::Identity::named("search", "client")).into(),
        cached: false,
        delayed: None,
    }
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).map(|v| v.to_str().unwrap())
}

#[test]
fn numbers_are_written_in_decimal() {
    for n in [0, 1, 9, 10, 42, 99, 100, 101, 999, 1000, 12_345, 999_999_999, u64::MAX - 1, u64::MAX] {
        let mut out = Vec::new();
        push_u64(&mut out, n);
        assert_eq!(out, n.to_string().into_bytes(), "{n}");
    }
}

#[test]
fn values_too_long_for_the_buffer_are_rendered_whole() {
    // Long names: the values overflow the inline buffer and spill into a Vec.
    let names: Vec<&'static str> = (0..8).map(|i| &*format!("{}-{i}", "p".repeat(40)).leak()).collect();
    let policies: Vec<_> = names.iter().map(|n| policy(n, 10, 60_000, 7, 30_000, None)).collect();
    let expected_policy: Vec<String> = names.iter().map(|n| format!("\"{n}\";q=10;w=60")).collect();
    let expected_rate: Vec<String> = names.iter().map(|n| format!("\"{n}\";r=7;t=30")).collect();
    let mut h = HeaderMap::new();
    apply(&mut h, &verdict(policies, false), true);
    assert!(expected_rate.join(", ").len() > INLINE);
    assert_eq!(header(&h, "ratelimit-policy"), Some(expected_policy.join(", ").as_str()));
    assert_eq!(header(&h, "ratelimit"), Some(expected_rate.join(", ").as_str()));
    assert_eq!(header(&h, "x-ratelimit-limit"), Some("10"));
    assert_eq!(header(&h, "x-ratelimit-remaining"), Some("7"));
    assert_eq!(header(&h, "x-ratelimit-reset"), Some("30"));
}

#[test]
fn seconds_round_up() {
    assert_eq!(ceil_secs(Duration::ZERO), 0);
    assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
    assert_eq!(ceil_secs(Duration::from_millis(1000)), 1);
    assert_eq!(ceil_secs(Duration::from_millis(1001)), 2);
    assert_eq!(ceil_secs(Duration::from_millis(59_999)), 60);
}

#[test]
fn allowed_requests_carry_every_policy_and_the_tightest_legacy_trio() {
    let v = verdict(
        vec![
            policy("search-1s", 10, 1000, 9, 100, None),
            policy("search-1h", 500, 3_600_000, 498, 3_599_001, None),
        ],
        false,
    );
    let mut h = HeaderMap::new();
    apply(&mut h, &v, true);
    assert_eq!(header(&h, "ratelimit-policy"), Some("\"search-1s\";q=10;w=1, \"search-1h\";q=500;w=3600"));
    assert_eq!(header(&h, "ratelimit"), Some("\"search-1s\";r=9;t=1, \"search-1h\";r=498;t=3600"));
    assert_eq!(header(&h, "x-ratelimit-limit"), Some("10"));
    assert_eq!(header(&h, "x-ratelimit-remaining"), Some("9"));
    assert_eq!(header(&h, "x-ratelimit-reset"), Some("1"));
    assert_eq!(header(&h, "retry-after"), None);
    let mut quiet = HeaderMap::new();
    apply(&mut quiet, &v, false);
    assert_eq!(quiet.len(), 2);
}

/// The values the limiter rendered once (`RateLimit-Policy`,
/// `X-RateLimit-Limit`) and the trio sliced from the decisive item of
/// `RateLimit` read as rendering them per response would: here the
/// second policy binds.
#[test]
fn prebuilt_and_sliced_values_are_the_decisive_policys() {
    let quota = |permits, secs| Quota::new(permits, Duration::from_secs(secs)).unwrap();
    let set = set_values([("search-1s", quota(10, 1)), ("search-1h", quota(500, 3600))].into_iter()).unwrap();
    let allowed = vec![
        policy("search-1s", 10, 1000, 9, 100, None),
        policy("search-1h", 500, 3_600_000, 3, 3_599_001, None),
    ];
    let denied = vec![
        policy("search-1s", 10, 1000, 9, 100, None),
        policy("search-1h", 500, 3_600_000, 0, 3_000_000, Some(3_000_000)),
    ];
    for (policies, status) in [(allowed, "allowed"), (denied, "denied")] {
        let mut bare = verdict(policies, false);
        let plain = RateHeaders::of(&bare, true);
        bare.set_values = Some(&set);
        let mut prebuilt = HeaderMap::new();
        RateHeaders::of(&bare, true).insert_into(&mut prebuilt);
        let mut rendered = HeaderMap::new();
        plain.insert_into(&mut rendered);
        assert_eq!(prebuilt, rendered, "{status}");
        assert_eq!(header(&prebuilt, "x-ratelimit-limit"), Some("500"), "{status}");
    }
    let mut h = HeaderMap::new();
    let mut v = verdict(
        vec![
            policy("search-1s", 10, 1000, 9, 100, None),
            policy("search-1h", 500, 3_600_000, 3, 3_599_001, None),
        ],
        false,
    );
    v.set_values = Some(&set);
    apply(&mut h, &v, true);
    assert_eq!(header(&h, "ratelimit-policy"), Some("\"search-1s\";q=10;w=1, \"search-1h\";q=500;w=3600"));
    assert_eq!(header(&h, "ratelimit"), Some("\"search-1s\";r=9;t=1, \"search-1h\";r=3;t=3600"));
    assert_eq!(header(&h, "x-ratelimit-remaining"), Some("3"));
    assert_eq!(header(&h, "x-ratelimit-reset"), Some("3600"));
}

#[test]
fn sub_second_windows_announce_one_second() {
    let p = policy("burst", 5, 250, 4, 250, None);
    assert_eq!(policy_header(&[&p]), "\"burst\";q=5;w=1");
}

#[tokio::test]
async fn denials_are_429_problems_naming_the_violated_policy() {
    let v = verdict(
        vec![
            policy("search-1s", 10, 1000, 0, 1000, Some(1)),
            policy("search-1h", 500, 3_600_000, 490, 3_500_000, None),
        ],
        false,
    );
    assert!(v.blocks());
    let response = blocked_response(&v, true, "/api/search");
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let h = response.headers();
    assert_eq!(header(h, "retry-after"), Some("1"));
    assert_eq!(header(h, "cache-control"), Some("no-store"));
    assert_eq!(header(h, "content-type"), Some("application/problem+json"));
    assert_eq!(header(h, "ratelimit-policy"), Some("\"search-1s\";q=10;w=1"));
    assert_eq!(header(h, "ratelimit"), Some("\"search-1s\";r=0;t=1"));
    assert_eq!(header(h, "x-ratelimit-limit"), Some("10"));
    assert_eq!(header(h, "x-ratelimit-remaining"), Some("0"));
    assert_eq!(header(h, "x-ratelimit-reset"), Some("1"));
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        json,
        serde_json::json!({
            "type": QUOTA_EXCEEDED_TYPE,
            "title": "Request cannot be satisfied as assigned quota has been exceeded",
            "status": 429,
            "detail": "policy \"search-1s\" allows 10 requests per 1 s; retry in 1 s",
            "instance": "/api/search",
            "violated-policies": ["search-1s"],
        })
    );
}

#[test]
fn the_longest_wait_binds_when_several_limits_deny() {
    let v = verdict(
        vec![policy("a", 10, 1000, 0, 1000, Some(400)), policy("b", 100, 60_000, 0, 60_000, Some(30_500))],
        false,
    );
    let mut h = HeaderMap::new();
    apply(&mut h, &v, true);
    assert_eq!(header(&h, "retry-after"), Some("31"));
    assert_eq!(header(&h, "ratelimit-policy"), Some("\"a\";q=10;w=1, \"b\";q=100;w=60"));
    assert_eq!(header(&h, "x-ratelimit-limit"), Some("100"));
}

#[test]
fn shadow_denials_send_headers_but_no_retry_after() {
    let v = verdict(vec![policy("a", 1, 1000, 0, 900, Some(900))], true);
    assert!(!v.blocks() && !v.allowed());
    let mut h = HeaderMap::new();
    apply(&mut h, &v, true);
    assert_eq!(header(&h, "ratelimit"), Some("\"a\";r=0;t=1"));
    assert_eq!(header(&h, "retry-after"), None);
}

#[test]
fn fail_closed_is_503_not_429() {
    let v = Verdict {
        rule: "search",
        policies: Default::default(),
        source: DecisionSource::FailClosed,
        shadow: false,
        pending: None,
        blocked: false,
        set_values: None,
        cost_header: None,
        over_in_flight: None,
        identity: (&slidegate::Identity::named("search", "client")).into(),
        cached: false,
        delayed: None,
    };
    let response = blocked_response(&v, true, "/x");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(response.headers(), "retry-after"), Some("1"));
}
