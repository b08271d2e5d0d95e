//! The top offenders on the admin listener: who is refused most, as keyed
//! hashes, in JSON and on a page an operator opens in a browser.

use std::time::Duration;

use crate::common::*;

/// The test configuration with the admin endpoints on their own listener:
/// the top offenders are served there.
fn admin_config(upstream: &Upstream) -> String {
    config_with(upstream.addr, "admin_listen = \"127.0.0.1:0\"", "", "")
}

#[test]
fn the_identities_refused_most_are_listed_hashed_with_exact_counts() {
    let upstream = Upstream::start();
    let sg = Slidegate::start(&admin_config(&upstream));
    let admin = sg.admin_addr();
    // "search" allows 2 a minute per identity: three scrapers at different
    // rates get 6, 3 and 1 denials; one anonymous client (127.0.0.1) 2.
    let scrapers = [("scraper-key-alpha", 8), ("scraper-key-bravo", 5), ("scraper-key-charlie", 3)];
    for (key, requests) in scrapers {
        let statuses: Vec<u16> = (0..requests)
            .map(|i| sg.get(&format!("/api/search?q={i}"), &[("x-api-key", key)]).status)
            .collect();
        assert_eq!(statuses.iter().filter(|&&s| s == 429).count(), requests - 2, "{key}: {statuses:?}");
    }
    for _ in 0..4 {
        sg.get("/api/search?q=anon", &[]);
    }
    assert_eq!(upstream.hits(), 2 * 4);

    let reply = get(admin, "/v1/offenders?minutes=5&limit=20", &[]);
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.header("content-type"), Some("application/json"));
    let json: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
    let offenders = json["offenders"].as_array().unwrap();
    let rows: Vec<(&str, &str, u64, u64)> = offenders
        .iter()
        .map(|o| {
            (
                o["rule"].as_str().unwrap(),
                o["kind"].as_str().unwrap(),
                o["denials"].as_u64().unwrap(),
                o["error"].as_u64().unwrap(),
            )
        })
        .collect();
    // Fewer identities than the capacity: exact counts, most refused first.
    assert_eq!(
        rows,
        [
            ("search", "api_key", 6, 0),
            ("search", "api_key", 3, 0),
            ("search", "ip", 2, 0),
            ("search", "api_key", 1, 0)
        ]
    );
    assert_eq!((json["minutes"].as_u64(), json["capacity_per_minute"].as_u64()), (Some(5), Some(64)));
    let hashes: Vec<&str> = offenders.iter().map(|o| o["identity"].as_str().unwrap()).collect();
    for hash in &hashes {
        assert!(hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()), "{hash}");
    }
    assert!(offenders.iter().all(|o| o["blocked_until_unix_ms"].is_null() && o["blocked_for_ms"].is_null()));
    // Hashed, never raw.
    for raw in ["scraper-key", "127.0.0.1"] {
        assert!(!reply.body.contains(raw), "{raw} in {}", reply.body);
    }
    // The limit and the minutes are honoured; bad values are refused.
    let top1: serde_json::Value =
        serde_json::from_str(&get(admin, "/v1/offenders?limit=1&minutes=1", &[]).body).unwrap();
    assert_eq!(top1["offenders"].as_array().unwrap().len(), 1);
    assert_eq!(top1["offenders"][0]["identity"].as_str(), Some(hashes[0]));
    assert_eq!(get(admin, "/v1/offenders?limit=0", &[]).status, 400);
    assert_eq!(get(admin, "/v1/offenders?minutes=6", &[]).status, 400);

    let page = get(admin, "/offenders", &[]);
    assert_eq!(page.status, 200);
    assert_eq!(page.header("content-type"), Some("text/html; charset=utf-8"));
    assert!(page.header("content-security-policy").unwrap().starts_with("default-src 'none'"));
    assert!(page.body.contains("<td>search</td>"), "{}", page.body);
    assert!(page.body.contains(&format!("<td class=\"mono\">{}</td>", hashes[0])));
    assert!(page.body.contains("<td class=\"num\">6</td>"));
    assert!(page.body.contains("not blocked"));
    for raw in ["scraper-key", "127.0.0.1"] {
        assert!(!page.body.contains(raw), "{raw}");
    }
    // No external assets: nothing loaded from another origin.
    let lower = page.body.to_ascii_lowercase();
    for external in ["http://", "https://", "src=\"//", "href=\"//"] {
        assert!(!lower.contains(external), "{external} in the page");
    }
    // The proxy does not serve them: the public listener forwards the path.
    assert_eq!(sg.get("/offenders", &[]).body, "GET /offenders xff=127.0.0.1");
}

#[test]
fn near_limit_requests_are_counted_per_rule() {
    let upstream = Upstream::start();
    let sg = Slidegate::start(&config(&upstream, "", ""));
    // "trending" allows 5 a minute to an API key: the 5th leaves 0 of 5
    // (≤ 10%), the 4th leaves 1 (20%).
    for _ in 0..5 {
        assert_eq!(sg.get("/api/videos/trending", &[("x-api-key", "k")]).status, 200);
    }
    wait_for("the near-limit counter", Duration::from_secs(10), || {
        sg.metric("slidegate_requests_near_limit_total{rule=\"trending\"}") == 1.0
    });
    assert_eq!(sg.metric("slidegate_requests_near_limit_total{rule=\"search\"}"), 0.0);
    assert_eq!(sg.metric("slidegate_requests_blocked_total{rule=\"trending\"}"), 0.0);
}

/// An identity rotation (320 addresses, each refused once) fills the list by
/// identity with entries whose error is their count: the answer says it
/// ranks nothing, and the same refusals by network count each network
/// exactly. The gauge shows the states the rotation left in the store.
#[test]
fn under_identity_rotation_the_page_ranks_networks_instead() {
    let upstream = Upstream::start();
    let text =
        admin_config(&upstream).replace("trusted_proxies = []", "trusted_proxies = [\"127.0.0.1/32\"]");
    let sg = Slidegate::start(&text);
    let admin = sg.admin_addr();
    let networks = [("198.51.100", 200), ("203.0.113", 100), ("192.0.2", 20)];
    for (net, hosts) in networks {
        for host in 1..=hosts {
            let ip = format!("{net}.{host}");
            // "search" admits 2 a minute: the third is refused.
            let statuses: Vec<u16> =
                (0..3).map(|_| sg.get("/api/search?q=r", &[("x-forwarded-for", &ip)]).status).collect();
            assert_eq!(statuses, [200, 200, 429], "{ip}");
        }
    }
    let json: serde_json::Value =
        serde_json::from_str(&get(admin, "/v1/offenders?limit=20", &[]).body).unwrap();
    assert_eq!(json["ranked"], false, "{json}");
    let top = json["offenders"].as_array().unwrap();
    assert_eq!(top.len(), 20);
    assert!(top.iter().all(|o| o["denials"].as_u64().unwrap() - o["error"].as_u64().unwrap() <= 1), "{json}");
    let rows: Vec<(&str, &str, u64, u64)> = json["networks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["network"].as_str().unwrap(),
                n["rule"].as_str().unwrap(),
                n["denials"].as_u64().unwrap(),
                n["error"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("198.51.100.0/24", "search", 200, 0),
            ("203.0.113.0/24", "search", 100, 0),
            ("192.0.2.0/24", "search", 20, 0)
        ]
    );
    let page = get(admin, "/offenders", &[]).body;
    assert!(page.contains("<p id=\"unranked\" class=\"warn\">These counts cannot rank anyone"), "{page}");
    assert!(page.contains("<td class=\"mono\">198.51.100.0/24</td><td class=\"num\">200</td><td>exact</td>"));
    // 320 identities × the rule's two limits.
    let metrics = get(admin, "/metrics", &[]).body;
    assert!(metrics.contains("\nslidegate_store_states{store=\"embedded\"} 640\n"), "{metrics}");
}

/// Few offenders: the list ranks them, and the page hides the warning.
#[test]
fn a_ranked_list_shows_no_rotation_warning() {
    let upstream = Upstream::start();
    let sg = Slidegate::start(&admin_config(&upstream));
    for _ in 0..5 {
        sg.get("/api/search?q=x", &[("x-api-key", "one-scraper")]);
    }
    let json: serde_json::Value =
        serde_json::from_str(&get(sg.admin_addr(), "/v1/offenders", &[]).body).unwrap();
    assert_eq!((json["ranked"].as_bool(), json["offenders"][0]["denials"].as_u64()), (Some(true), Some(3)));
    // The key's client network is counted too.
    assert_eq!(json["networks"][0]["network"], "127.0.0.0/24");
    let page = get(sg.admin_addr(), "/offenders", &[]).body;
    assert!(page.contains("<p id=\"unranked\" class=\"warn\" hidden>"), "{page}");
}

/// A crawler refused for breadth (the polite crawler the README shows
/// `breadth` for) is on the list like one refused for rate: the refusal used
/// to return before it was recorded.
#[test]
fn a_crawler_refused_for_breadth_is_listed() {
    let upstream = Upstream::start();
    let text = format!(
        r#"{head}
[identity]
ip_hash_secret_env = "{SECRET_ENV}"

[[rules]]
name = "videos"
path = "/api/videos/{{id}}"
limits = [{{ limit = 100000, window = "60s" }}]
breadth = {{ distinct = 3, window = "10m", of = "param:id" }}
"#,
        head = config_head(upstream.addr, "admin_listen = \"127.0.0.1:0\"", ""),
    );
    let sg = Slidegate::start(&text);
    let statuses: Vec<u16> = (0..8).map(|id| sg.get(&format!("/api/videos/{id}"), &[]).status).collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429, 429, 429]);
    let json: serde_json::Value =
        serde_json::from_str(&get(sg.admin_addr(), "/v1/offenders", &[]).body).unwrap();
    let top = &json["offenders"];
    assert_eq!(top.as_array().map(Vec::len), Some(1), "{json}");
    assert_eq!((top[0]["rule"].as_str(), top[0]["kind"].as_str()), (Some("videos"), Some("ip")));
    assert_eq!((top[0]["denials"].as_u64(), top[0]["error"].as_u64()), (Some(5), Some(0)));
    assert_eq!(json["networks"][0]["denials"].as_u64(), Some(5));
}

/// `slidegate_store_states` says what it counts: states in this process's
/// memory. On Redis that is the fallback's, 0 while Redis decides (Redis's
/// keys are not counted), and the identities decided without Redis once it
/// is gone.
#[test]
fn the_store_states_gauge_counts_this_processs_memory_on_a_redis_store() {
    let mut redis = RedisServer::spawn();
    let upstream = Upstream::start();
    let store = redis_store(&redis).replace("on_error = \"allow\"\n", "");
    let sg = Slidegate::start(&config(&upstream, &store, ""));
    for key in ["one", "two", "three"] {
        assert!(sg.get("/api/search", &[("x-api-key", key)]).header("ratelimit").is_some());
    }
    let metrics = get(sg.addr, "/metrics", &[]).body;
    assert!(
        metrics.contains(
            "# HELP slidegate_store_states (identity, limit) states held in this process's memory, by store: \
             embedded (the embedded store) or fallback (the fallback deciding while Redis fails); \
             Redis's own keys are not counted (see its INFO keyspace).\n\
             # TYPE slidegate_store_states gauge\n\
             slidegate_store_states{store=\"fallback\"} 0\n"
        ),
        "{metrics}"
    );
    assert!(!metrics.contains("slidegate_store_states{store=\"embedded\"}"), "{metrics}");
    // Redis gone: the fallback decides, and holds each identity's two limits.
    redis.kill();
    for key in ["one", "two", "three"] {
        sg.get("/api/search", &[("x-api-key", key)]);
    }
    assert_eq!(sg.metric("slidegate_store_states{store=\"fallback\"}"), 6.0);
}
