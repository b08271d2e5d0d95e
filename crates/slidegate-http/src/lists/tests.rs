//! The lists alone, and through a limiter.

use http::{HeaderMap, HeaderValue, Method};
use slidegate::{Algorithm, Limit, MemoryStore, Quota};

use super::*;
use crate::config::{IdentityKind, LimitConfig, RuleConfig, RuleLimits};
use crate::{DecisionSource, LimiterConfig, RateLimiter};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn nets(list: &[&str]) -> Vec<IpNet> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

#[test]
fn networks_match_by_prefix_ipv4_mapped_ones_as_ipv4() {
    let set = NetSet::new(&nets(&["10.0.0.0/8", "192.0.2.7/32", "2001:db8::/32", "::ffff:198.51.100.0/120"]));
    for yes in
        ["10.1.2.3", "192.0.2.7", "2001:db8:1::1", "::ffff:10.9.9.9", "198.51.100.77", "::ffff:198.51.100.1"]
    {
        assert!(set.contains(ip(yes)), "{yes}");
    }
    for no in ["11.0.0.1", "192.0.2.8", "2001:db9::1", "::1", "198.51.101.1"] {
        assert!(!set.contains(ip(no)), "{no}");
    }
    let everyone = NetSet::new(&nets(&["0.0.0.0/0", "::/0"]));
    assert!(everyone.contains(ip("203.0.113.1")) && everyone.contains(ip("2001:db8::1")));
    assert_eq!(canonical_net("::ffff:10.0.0.0/104".parse().unwrap()), "10.0.0.0/8".parse::<IpNet>().unwrap());
    assert_eq!(canonical_net("10.1.2.3/8".parse().unwrap()), "10.0.0.0/8".parse::<IpNet>().unwrap());
    // Below /96 a mapped network also covers plain IPv6: kept as written.
    assert_eq!(canonical_net("::ffff:0:0/95".parse().unwrap()), "::fffe:0:0/95".parse::<IpNet>().unwrap());
}

#[test]
fn keys_are_kept_as_hashes_and_a_listed_hash_matches_its_key() {
    let hasher = KeyHasher::keyed(b"instance secret");
    let mut keys = KeyList::new(hasher.clone());
    assert!(keys.insert_key(b"partner-1"));
    assert!(!keys.insert_key(b"partner-1"));
    assert!(keys.insert_hash(hasher.hash(b"partner-2")));
    assert!(keys.contains_key(b"partner-1") && keys.contains_key(b"partner-2"));
    assert!(!keys.contains_key(b"partner-3"));
    assert_eq!(keys.len(), 2);
    let shown = format!("{keys:?}");
    assert!(!shown.contains("partner") && shown.starts_with("KeyList(2 keys, "), "{shown}");
    // The identity hash of the key, as the offenders page shows it.
    let identity =
        slidegate::IdentityHasher::new(b"instance secret").identity("r", Source::ApiKey, b"partner-2");
    assert_eq!(hasher.hash(b"partner-2"), identity.digest().high_u64());
}

fn lists(global_allow: &[&str], global_deny: &[&str], rule_allow: &[&str], rule_deny: &[&str]) -> Lists {
    let pair = |allow: &[&str], deny: &[&str]| {
        let mut lists = AccessLists::default();
        lists.allow.cidrs = nets(allow);
        lists.deny.cidrs = nets(deny);
        lists
    };
    Lists::new(&pair(global_allow, global_deny), [pair(rule_allow, rule_deny)].iter())
}

#[test]
fn deny_beats_allow_and_a_rule_list_applies_to_its_rule_only() {
    let lists =
        lists(&["10.0.0.0/8"], &["10.6.6.6/32"], &["192.0.2.0/24"], &["10.0.0.7/32", "192.0.2.66/32"]);
    let judge = |rule, addr: &str| lists.judge(rule, Some(ip(addr)), None).map(|l| (l.denied, l.scope));
    assert_eq!(judge(Some(0), "10.6.6.6"), Some((true, ListScope::Global)));
    assert_eq!(judge(Some(0), "10.0.0.7"), Some((true, ListScope::Rule)));
    assert_eq!(judge(Some(0), "10.0.0.8"), Some((false, ListScope::Global)));
    assert_eq!(judge(Some(0), "192.0.2.1"), Some((false, ListScope::Rule)));
    assert_eq!(judge(Some(0), "192.0.2.66"), Some((true, ListScope::Rule)));
    assert_eq!(judge(Some(0), "203.0.113.1"), None);
    // No rule matched: only the global deny list.
    assert_eq!(judge(None, "10.6.6.6"), Some((true, ListScope::Global)));
    assert_eq!(judge(None, "10.0.0.7"), None);
    assert_eq!(judge(None, "10.0.0.8"), None);
    assert!(Lists::default().is_empty());
}

fn limiter(lists: AccessLists, trusted: &str) -> RateLimiter<MemoryStore> {
    let limit = Limit::new(Algorithm::SlidingWindowCounter, Quota::per_minute(2).unwrap());
    let limits = vec![LimitConfig::new("api", limit, 1).unwrap()];
    let mut config = LimiterConfig::default();
    config.rules.push(RuleConfig::new(
        "api",
        "/api/*".parse().unwrap(),
        RuleLimits::Shared { identity: IdentityKind::ApiKey, limits },
    ));
    config.identity.api_key_header = Some(http::HeaderName::from_static("x-api-key"));
    config.identity.trusted_proxies = nets(&[trusted]);
    config.lists = lists;
    RateLimiter::from_config(&config, MemoryStore::new()).unwrap()
}

fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.insert(*k, HeaderValue::from_static(v));
    }
    h
}

#[tokio::test]
async fn an_allowed_network_is_never_charged_and_a_spoofed_forwarding_header_lists_nobody() {
    let mut lists = AccessLists::default();
    lists.allow.cidrs = nets(&["10.0.0.0/8"]);
    let limiter = limiter(lists, "192.0.2.1/32");
    let get = Method::GET;
    for _ in 0..6 {
        let verdict =
            limiter.check_request(&get, "/api/x", &HeaderMap::new(), Some(ip("10.1.1.1"))).await.unwrap();
        assert_eq!(verdict.source, DecisionSource::AllowList(ListScope::Global));
        assert!(verdict.allowed() && verdict.policies.is_empty());
        assert!(crate::headers::RateHeaders::of(&verdict, true).is_empty());
    }
    // Through the trusted proxy, the forwarded client is judged.
    let forwarded = headers(&[("x-forwarded-for", "10.2.2.2")]);
    let verdict = limiter.check_request(&get, "/api/x", &forwarded, Some(ip("192.0.2.1"))).await.unwrap();
    assert_eq!(verdict.source, DecisionSource::AllowList(ListScope::Global));
    // From anyone else, the header is the client's own words: limited.
    let spoofed: Vec<bool> = {
        let mut out = Vec::new();
        for _ in 0..3 {
            let v = limiter.check_request(&get, "/api/x", &forwarded, Some(ip("203.0.113.9"))).await.unwrap();
            assert_eq!(v.source, DecisionSource::Store);
            out.push(v.allowed());
        }
        out
    };
    assert_eq!(spoofed, [true, true, false]);
    let text = limiter.render_metrics();
    assert!(text.contains("slidegate_requests_exempt_total{list=\"global\"} 7\n"), "{text}");
    assert!(text.contains("slidegate_requests_exempt_total{rule=\"api\"} 0\n"), "{text}");
    let calls: u64 = limiter
        .render_metrics()
        .lines()
        .find_map(|l| l.strip_prefix("slidegate_store_calls_total "))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(calls, 3, "only the spoofed requests asked the store");
}

#[tokio::test]
async fn a_denied_key_is_refused_with_403_even_on_a_path_no_rule_matches() {
    let mut lists = AccessLists::default();
    let mut keys = KeyList::default();
    keys.insert_key(b"abuser");
    lists.deny.keys = keys;
    lists.allow.cidrs = nets(&["10.0.0.0/8"]);
    let limiter = limiter(lists, "192.0.2.1/32");
    let abuser = headers(&[("x-api-key", "abuser")]);
    for target in ["/api/x", "/elsewhere"] {
        // Deny beats allow: the address is on the allow list.
        let verdict =
            limiter.check_request(&Method::GET, target, &abuser, Some(ip("10.1.1.1"))).await.unwrap();
        assert_eq!(verdict.source, DecisionSource::DenyList(ListScope::Global));
        assert!(verdict.blocks());
        let response = crate::headers::blocked_response(&verdict, true, target);
        assert_eq!(response.status(), http::StatusCode::FORBIDDEN);
        assert_eq!(response.headers()["content-type"], "application/problem+json");
        assert!(!response.headers().contains_key("retry-after"));
    }
    let other = headers(&[("x-api-key", "someone")]);
    assert!(limiter.check_request(&Method::GET, "/elsewhere", &other, Some(ip("10.1.1.1"))).await.is_none());
    let text = limiter.render_metrics();
    assert!(text.contains("slidegate_requests_listed_denied_total{list=\"global\"} 2\n"), "{text}");
}

#[tokio::test]
async fn a_reconfigured_limiter_takes_the_new_lists_and_keeps_the_counts() {
    let limiter = limiter(AccessLists::default(), "192.0.2.1/32");
    let peer = Some(ip("198.51.100.4"));
    let get = Method::GET;
    assert_eq!(
        limiter.check_request(&get, "/api/x", &HeaderMap::new(), peer).await.unwrap().source,
        DecisionSource::Store
    );
    let mut config = LimiterConfig::default();
    let limit = Limit::new(Algorithm::SlidingWindowCounter, Quota::per_minute(2).unwrap());
    let limits = vec![LimitConfig::new("api", limit, 1).unwrap()];
    let mut rule = RuleConfig::new(
        "api",
        "/api/*".parse().unwrap(),
        RuleLimits::Shared { identity: IdentityKind::Ip, limits },
    );
    rule.lists.deny.cidrs = nets(&["198.51.100.0/24"]);
    config.rules.push(rule);
    let reloaded = limiter.reconfigure(&config).unwrap();
    let verdict = reloaded.check_request(&get, "/api/x", &HeaderMap::new(), peer).await.unwrap();
    assert_eq!((verdict.source, verdict.rule), (DecisionSource::DenyList(ListScope::Rule), "api"));
    let text = reloaded.render_metrics();
    assert!(text.contains("slidegate_requests_listed_denied_total{rule=\"api\"} 1\n"), "{text}");
    assert!(text.contains("slidegate_requests_allowed_total{rule=\"api\"} 1\n"), "{text}");
}
