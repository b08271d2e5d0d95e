//! `all_or_nothing: true`, slidegate's extension of envoyproxy/ratelimit's
//! format: a request's descriptors are charged only if every enforced one
//! has room, in one store call — on the embedded store and on Redis, with
//! Redis down, and refused at load on a Redis Cluster.

#![allow(clippy::unwrap_used)]

use slidegate_server::envoy::proto::{
    Code, Entry, RateLimitDescriptor, RateLimitRequest, RateLimitResponse, RateLimitServiceClient,
};
use slidegate_server::{Config, Server};
use slidegate_test_redis::RedisServer;
use tokio::sync::oneshot;

/// The same descriptors twice: all or nothing, and as the reference decides.
const SHOP: &str = r#"
domain: DOMAIN
all_or_nothing: true
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 3
  - key: route
    rate_limit:
      unit: minute
      requests_per_unit: 5
  - key: closed
    rate_limit:
      unit: minute
      requests_per_unit: 0
  - key: watched
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
"#;

const SECRET: &str = "SLIDEGATE_ENVOY_AON_TEST_SECRET";
const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

struct Running {
    stop: Option<oneshot::Sender<()>>,
    _dir: tempfile::TempDir,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// `serve` with the domains `shop` (all or nothing) and `plain` (the same
/// descriptors, each decided on its own), on `store`.
async fn start(store: &str) -> (Running, RateLimitServiceClient) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("rl")).unwrap();
    std::fs::write(dir.path().join("rl/shop.yaml"), SHOP.replace("DOMAIN", "shop")).unwrap();
    let plain = SHOP.replace("DOMAIN", "plain").replace("all_or_nothing: true\n", "");
    std::fs::write(dir.path().join("rl/plain.yaml"), plain).unwrap();
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\ngrpc_listen = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:9\"\n\
         shutdown_grace = \"1s\"\n[identity]\nip_hash_secret_env = \"{SECRET}\"\n{store}\n[envoy]\nconfig = \"rl\"\n"
    );
    let path = dir.path().join("slidegate.toml");
    let env = |name: &str| (name == SECRET).then(|| "test-secret".to_owned());
    let config = Config::parse_with_env(&toml, &path, &env).unwrap();
    let server = Server::bind(&config).await.unwrap();
    let grpc = server.grpc_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{grpc}")).unwrap().connect().await.unwrap();
    (Running { stop: Some(stop), _dir: dir }, RateLimitServiceClient::new(channel))
}

fn descriptor(key: &str, value: &str, hits: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![Entry { key: key.into(), value: value.into() }],
        hits_addend: hits,
        ..Default::default()
    }
}

async fn ask(c: &mut RateLimitServiceClient, domain: &str, d: &[(&str, &str)]) -> RateLimitResponse {
    let descriptors = d.iter().map(|(k, v)| descriptor(k, v, None)).collect();
    c.should_rate_limit(RateLimitRequest { domain: domain.into(), descriptors, hits_addend: 0 })
        .await
        .unwrap()
}

/// Each status's (code, limit_remaining).
fn statuses(r: &RateLimitResponse) -> Vec<(i32, u32)> {
    r.statuses.iter().map(|s| (s.code, s.limit_remaining)).collect()
}

/// What every store must do, with a tag to keep each run's identities apart.
async fn all_or_nothing_contract(c: &mut RateLimitServiceClient, tag: &str) {
    let user = format!("{tag}-u1");
    let both = [("user", user.as_str()), ("route", "/a")];
    for domain in ["shop", "plain"] {
        for i in 0..3u32 {
            let r = ask(c, domain, &both).await;
            assert_eq!((r.overall_code, statuses(&r)), (OK, vec![(OK, 2 - i), (OK, 4 - i)]), "{domain} {i}");
        }
        let r = ask(c, domain, &both).await;
        assert_eq!(r.overall_code, OVER, "{domain}");
        assert_eq!((r.statuses[0].code, r.statuses[0].limit_remaining), (OVER, 0), "{domain}");
        // All or nothing: the route was not charged for the refused request
        // (it reports 2 left, as before it); decided apart, it was (1 left).
        let want = if domain == "shop" { (OK, 2) } else { (OK, 1) };
        assert_eq!((r.statuses[1].code, r.statuses[1].limit_remaining), want, "{domain}");
        let r = ask(c, domain, &[("route", "/a")]).await;
        let left = if domain == "shop" { 1 } else { 0 };
        assert_eq!(statuses(&r), vec![(OK, left)], "{domain}: the route alone");
    }

    // A blocked descriptor refuses the request; the user is only peeked.
    let user = format!("{tag}-u2");
    let r = ask(c, "shop", &[("user", &user), ("closed", "x")]).await;
    assert_eq!((r.overall_code, statuses(&r)[0]), (OVER, (OK, 3)));
    assert_eq!(r.statuses[1].code, OVER);
    assert_eq!(statuses(&ask(c, "shop", &[("user", &user)]).await), vec![(OK, 2)], "nothing was charged");

    // More hits than a limit holds: refused whole, nothing charged.
    let user = format!("{tag}-u3");
    let descriptors = vec![descriptor("user", &user, Some(4)), descriptor("route", "/b", None)];
    let request = RateLimitRequest { domain: "shop".into(), descriptors, hits_addend: 0 };
    let r = c.should_rate_limit(request).await.unwrap();
    assert_eq!((r.overall_code, statuses(&r)), (OVER, vec![(OVER, 0), (OK, 5)]));
    assert_eq!(statuses(&ask(c, "shop", &[("route", "/b")]).await), vec![(OK, 4)]);

    // One identity named twice is charged once with both hits, and both
    // descriptors are told its state.
    let user = format!("{tag}-u5");
    let r = ask(c, "shop", &[("user", &user), ("user", &user)]).await;
    assert_eq!((r.overall_code, statuses(&r)), (OK, vec![(OK, 1), (OK, 1)]));
    let r = ask(c, "shop", &[("user", &user), ("user", &user)]).await;
    assert_eq!((r.overall_code, statuses(&r)), (OVER, vec![(OVER, 0), (OVER, 0)]));
    assert_eq!(statuses(&ask(c, "shop", &[("user", &user)]).await), vec![(OK, 0)]);

    // A shadow limit never refuses, so it takes no part: its denial does
    // not keep the others from being charged.
    let user = format!("{tag}-u4");
    for i in 0..2u32 {
        let r = ask(c, "shop", &[("user", &user), ("watched", "w")]).await;
        assert_eq!(r.overall_code, OK, "{i}");
        assert_eq!(r.statuses[0].limit_remaining, 2 - i, "{i}: the user charged every time");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_store_charges_all_descriptors_or_none() {
    let (_server, mut c) = start("").await;
    all_or_nothing_contract(&mut c, "memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_charges_all_descriptors_or_none_in_one_call_and_fails_by_policy() {
    let mut redis = RedisServer::spawn();
    let store = format!("[store]\nurl = \"{}\"\non_error = \"deny\"\ntimeout_ms = 10000\n", redis.url());
    let (_server, mut c) = start(&store).await;
    all_or_nothing_contract(&mut c, "redis").await;
    // One script call for a request of three enforced descriptors.
    let cli = |args: &[&str]| {
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &redis.port().to_string()])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let evalsha = |info: &str| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().unwrap())
    };
    let before = evalsha(&cli(&["info", "commandstats"]));
    let r = ask(&mut c, "shop", &[("user", "one-call"), ("route", "/c"), ("user", "one-call-2")]).await;
    assert_eq!((r.overall_code, statuses(&r)), (OK, vec![(OK, 2), (OK, 4), (OK, 2)]));
    let after = evalsha(&cli(&["info", "commandstats"]));
    // Background polls of the shared tables may add calls of their own;
    // the request's own is one, never three.
    assert!((1..=2).contains(&(after - before)), "{before} → {after}");
    // Redis gone: `on_error = "deny"` answers every descriptor, at once.
    redis.kill();
    let started = std::time::Instant::now();
    let r = ask(&mut c, "shop", &[("user", "after"), ("route", "/d")]).await;
    assert_eq!(r.overall_code, OVER);
    assert!(started.elapsed() < std::time::Duration::from_secs(15), "{:?}", started.elapsed());
}

/// Redis down under the default failure policy: the fallback limiter
/// decides the descriptors together, all or nothing as Redis would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fallback_limiter_decides_all_or_nothing_while_redis_is_down() {
    let mut redis = RedisServer::spawn();
    let store = format!("[store]\nurl = \"{}\"\ntimeout_ms = 200\n", redis.url());
    let (_server, mut c) = start(&store).await;
    redis.kill();
    let both = [("user", "down-u1"), ("route", "/a")];
    for i in 0..3u32 {
        let r = ask(&mut c, "shop", &both).await;
        assert_eq!((r.overall_code, statuses(&r)), (OK, vec![(OK, 2 - i), (OK, 4 - i)]), "{i}");
    }
    let r = ask(&mut c, "shop", &both).await;
    assert_eq!((r.overall_code, statuses(&r)), (OVER, vec![(OVER, 0), (OK, 2)]));
    assert_eq!(statuses(&ask(&mut c, "shop", &[("route", "/a")]).await), vec![(OK, 1)]);
}

#[test]
fn a_cluster_store_refuses_all_or_nothing_where_the_yaml_says_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("shop.yaml"), SHOP.replace("DOMAIN", "shop")).unwrap();
    let toml = format!(
        "[identity]\nip_hash_secret_env = \"{SECRET}\"\n[store]\ncluster = [\"redis://127.0.0.1:7001\"]\n\
         [envoy]\nconfig = \"shop.yaml\"\n"
    );
    let env = |name: &str| (name == SECRET).then(|| "test-secret".to_owned());
    let err = Config::parse_with_env(&toml, dir.path().join("s.toml"), &env).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("shop.yaml:"), "{text}");
    assert!(text.contains("all_or_nothing: true needs a store that decides several identities"), "{text}");
    assert_eq!(err.location(), Some((3, 1)), "{text}");
    // The same file without the key loads on the Cluster.
    std::fs::write(
        dir.path().join("shop.yaml"),
        SHOP.replace("DOMAIN", "shop").replace("all_or_nothing: true\n", ""),
    )
    .unwrap();
    Config::parse_with_env(&toml, dir.path().join("s.toml"), &env).unwrap();
}
