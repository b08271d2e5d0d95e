//! Envoy's rate limit service over gRPC, with a tonic client: the
//! reference service's documented matching examples, hits_addend, shadow
//! mode, unlimited, replaces, wildcard values, share_threshold, quota mode,
//! the week unit, over-limit statuses and headers, Redis down with
//! fail-open and fail-closed, a bad config located, hostile requests.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::path::Path;

use slidegate_server::envoy::proto::{
    Code, Entry, RateLimitDescriptor, RateLimitRequest, RateLimitResponse, RateLimitServiceClient, Unit,
};
use slidegate_server::{Config, Server};
use slidegate_test_redis::RedisServer;
use tokio::sync::oneshot;

/// The documented examples of envoyproxy/ratelimit's README, and slidegate's additions.
const YAML: &str = r#"
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 10
  # This one is more specific: the exact value wins.
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: shadowed
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: free
    rate_limit:
      unlimited: true
  - key: blocked
    rate_limit:
      unit: second
      requests_per_unit: 0
  - key: api
    rate_limit:
      name: api_default
      unit: minute
      requests_per_unit: 2
  - key: api_premium
    rate_limit:
      unit: minute
      requests_per_unit: 5
      replaces:
        - name: api_default
  - key: fixed
    rate_limit:
      unit: hour
      requests_per_unit: 3
      algorithm: fixed_window
      window: 90s
"#;

const MESSAGING: &str = r#"
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
"#;

/// The reference README's Examples 9, 10 and 11, quota mode and the week unit.
const REFERENCE: &str = r#"
domain: reference
descriptors:
  # Example 9: wildcards. The exact value wins over every pattern, the
  # first matching pattern (in this order) over later ones and the key alone.
  - key: path
    value: /api/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: path
    value: /api/admin/action
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: path
    value: /api/*
    rate_limit:
      unit: minute
      requests_per_unit: 3
  - key: path
    rate_limit:
      unit: minute
      requests_per_unit: 4
  - key: route
    value: /api/*/resource/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 5
  - key: stars
    value: "*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b*"
    rate_limit:
      unit: minute
      requests_per_unit: 6
  - key: anything
    value: "*"
    rate_limit:
      unit: minute
      requests_per_unit: 7
  # Example 10.
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit:
              unit: minute
              requests_per_unit: 100
  # Example 11.
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 10
  - key: files_no_share
    value: files_no_share/*
    share_threshold: false
    rate_limit:
      unit: hour
      requests_per_unit: 10
  - key: shared_route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit:
          unit: minute
          requests_per_unit: 2
  # Quota mode: over limit only when every quota-mode descriptor is.
  - key: quota_a
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: quota_b
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 3
  - key: rate
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: weekly
    rate_limit:
      unit: WEEK
      requests_per_unit: 2
"#;

const SECRET: &str = "SLIDEGATE_ENVOY_TEST_SECRET";

/// A running `serve` with `[server] grpc_listen`, stopped on drop.
struct Running {
    grpc: SocketAddr,
    reloader: slidegate_server::Reloader,
    dir_path: std::path::PathBuf,
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

fn write_yaml(dir: &Path) {
    std::fs::create_dir(dir.join("ratelimit")).unwrap();
    std::fs::write(dir.join("ratelimit/edge.yaml"), YAML).unwrap();
    std::fs::write(dir.join("ratelimit/messaging.yml"), MESSAGING).unwrap();
    std::fs::write(dir.join("ratelimit/reference.yaml"), REFERENCE).unwrap();
}

async fn start(store: &str) -> Running {
    start_with(store, "").await
}

/// `start`, with `envoy` lines added to `[envoy]`.
async fn start_with(store: &str, envoy: &str) -> Running {
    let dir = tempfile::tempdir().unwrap();
    write_yaml(dir.path());
    // A shared store needs the instances' secret (read here from `env`; a
    // reload, which reads the process's, is tested on the embedded store).
    let identity = if store.is_empty() {
        String::new()
    } else {
        format!("[identity]\nip_hash_secret_env = \"{SECRET}\"\n")
    };
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\ngrpc_listen = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:9\"\n\
         shutdown_grace = \"1s\"\n{identity}{store}\n[envoy]\nconfig = \"ratelimit\"\n{envoy}"
    );
    let path = dir.path().join("slidegate.toml");
    std::fs::write(&path, &toml).unwrap();
    let env = |name: &str| (name == SECRET).then(|| "test-secret".to_owned());
    let config = Config::parse_with_env(&toml, &path, &env).unwrap();
    let server = Server::bind(&config).await.unwrap().reload_from(&path);
    let grpc = server.grpc_addr().unwrap();
    let reloader = server.reloader();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    Running { grpc, reloader, dir_path: dir.path().to_owned(), stop: Some(stop), _dir: dir }
}

async fn client(addr: SocketAddr) -> RateLimitServiceClient {
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    RateLimitServiceClient::new(channel)
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries.iter().map(|(k, v)| Entry { key: (*k).into(), value: (*v).into() }).collect(),
        ..Default::default()
    }
}

fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest { domain: domain.into(), descriptors, hits_addend: 0 }
}

async fn ask(c: &mut RateLimitServiceClient, domain: &str, entries: &[(&str, &str)]) -> RateLimitResponse {
    c.should_rate_limit(request(domain, vec![descriptor(entries)])).await.unwrap()
}

fn header<'r>(r: &'r RateLimitResponse, name: &str) -> Option<&'r str> {
    r.response_headers_to_add.iter().find(|h| h.key == name).map(|h| h.value.as_str())
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_only_counts_each_value_and_the_exact_value_wins() {
    let server = start("").await;
    let mut c = client(server.grpc).await;
    for i in 0..10u32 {
        let r = ask(&mut c, "edge_proxy_per_ip", &[("remote_address", "10.0.0.1")]).await;
        assert_eq!(r.overall_code, OK, "request {i}");
        let s = &r.statuses[0];
        assert_eq!((s.code, s.limit_remaining), (OK, 9 - i));
        let limit = s.current_limit.as_ref().unwrap();
        assert_eq!((limit.requests_per_unit, limit.unit), (10, Unit::Minute as i32));
    }
    let r = ask(&mut c, "edge_proxy_per_ip", &[("remote_address", "10.0.0.1")]).await;
    assert_eq!((r.overall_code, r.statuses[0].code, r.statuses[0].limit_remaining), (OVER, OVER, 0));
    let wait = r.statuses[0].duration_until_reset.unwrap();
    // A sliding window counter resets fully within two windows: when the ten
    // requests straddle a window's end, the previous window's share decays
    // over the whole next one.
    assert!(wait.seconds > 0 && wait.seconds <= 120, "{wait:?}");
    assert_eq!(header(&r, "RateLimit-Policy"), Some("\"remote_address\";q=10;w=60"));
    assert!(header(&r, "RateLimit").unwrap().starts_with("\"remote_address\";r=0;t="));
    // Another value has its own count.
    let r = ask(&mut c, "edge_proxy_per_ip", &[("remote_address", "10.0.0.2")]).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 9));
    // A sliding window is whole again once the previous window's weight is gone too.
    let t: u64 =
        header(&r, "RateLimit").unwrap().strip_prefix("\"remote_address\";r=9;t=").unwrap().parse().unwrap();
    assert!(t > 0 && t <= 120, "{t}");
    // The exact value has its own, smaller, limit.
    let r = ask(&mut c, "edge_proxy_per_ip", &[("remote_address", "50.0.0.5")]).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 0));
    assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().requests_per_unit, 1);
    let r = ask(&mut c, "edge_proxy_per_ip", &[("remote_address", "50.0.0.5")]).await;
    assert_eq!(r.overall_code, OVER);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_descriptors_and_several_in_one_request() {
    let server = start("").await;
    let mut c = client(server.grpc).await;
    // The README's example: both descriptors apply to a marketing message.
    let both = || {
        request(
            "messaging",
            vec![
                descriptor(&[("message_type", "marketing"), ("to_number", "2061111111")]),
                descriptor(&[("to_number", "2061111111")]),
            ],
        )
    };
    for i in 0..5u32 {
        let r = c.should_rate_limit(both()).await.unwrap();
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses.len(), 2);
        assert_eq!(r.statuses[0].limit_remaining, 4 - i);
        assert_eq!(r.statuses[1].limit_remaining, 99 - i);
    }
    let r = c.should_rate_limit(both()).await.unwrap();
    assert_eq!((r.overall_code, r.statuses[0].code, r.statuses[1].code), (OVER, OVER, OK));
    // Unmatched: a key the config lacks, a value-only path that stops early,
    // a descriptor longer than the tree. Not limited, no limit reported.
    for entries in [
        &[("unknown", "x")][..],
        &[("message_type", "marketing")][..],
        &[("message_type", "transactional"), ("to_number", "1")][..],
        &[("to_number", "1"), ("extra", "2")][..],
    ] {
        let r = ask(&mut c, "messaging", entries).await;
        assert_eq!((r.overall_code, r.statuses[0].code), (OK, OK), "{entries:?}");
        assert_eq!(r.statuses[0].current_limit, None, "{entries:?}");
        assert!(r.response_headers_to_add.is_empty());
    }
    // An unknown domain limits nothing.
    let r = ask(&mut c, "nope", &[("remote_address", "10.0.0.1")]).await;
    assert_eq!((r.overall_code, r.statuses.len()), (OK, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_addend_of_the_request_and_of_a_descriptor() {
    let server = start("").await;
    let mut c = client(server.grpc).await;
    let mut r = request("edge_proxy_per_ip", vec![descriptor(&[("remote_address", "1.1.1.1")])]);
    r.hits_addend = 3;
    let a = c.should_rate_limit(r.clone()).await.unwrap();
    assert_eq!(a.statuses[0].limit_remaining, 7);
    // The descriptor's own hits_addend overrides the request's.
    r.descriptors[0].hits_addend = Some(5);
    let a = c.should_rate_limit(r.clone()).await.unwrap();
    assert_eq!((a.overall_code, a.statuses[0].limit_remaining), (OK, 2));
    // Three more do not fit: denied, and nothing is charged.
    r.descriptors[0].hits_addend = Some(3);
    let a = c.should_rate_limit(r.clone()).await.unwrap();
    assert_eq!(a.overall_code, OVER);
    r.descriptors[0].hits_addend = Some(2);
    let a = c.should_rate_limit(r.clone()).await.unwrap();
    assert_eq!((a.overall_code, a.statuses[0].limit_remaining), (OK, 0));
    // More hits than the limit holds: over the limit, never an error.
    r.descriptors[0].hits_addend = Some(1000);
    r.descriptors[0].entries[0].value = "2.2.2.2".into();
    let a = c.should_rate_limit(r).await.unwrap();
    assert_eq!((a.overall_code, a.statuses[0].limit_remaining), (OVER, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_unlimited_blocked_replaces_and_extensions() {
    let server = start("").await;
    let mut c = client(server.grpc).await;
    // Shadow mode: decided and counted, never over the limit.
    for _ in 0..3 {
        let r = ask(&mut c, "edge_proxy_per_ip", &[("shadowed", "a")]).await;
        assert_eq!((r.overall_code, r.statuses[0].code, r.statuses[0].limit_remaining), (OK, OK, 0));
    }
    // Unlimited: always under, with all the room there is.
    for _ in 0..20 {
        let r = ask(&mut c, "edge_proxy_per_ip", &[("free", "a")]).await;
        assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, u32::MAX));
    }
    // requests_per_unit 0: always over.
    let r = ask(&mut c, "edge_proxy_per_ip", &[("blocked", "a")]).await;
    assert_eq!(r.overall_code, OVER);
    // replaces: with api_premium matched, api_default is not applied.
    let both = || {
        request("edge_proxy_per_ip", vec![descriptor(&[("api", "k")]), descriptor(&[("api_premium", "k")])])
    };
    for i in 0..5u32 {
        let r = c.should_rate_limit(both()).await.unwrap();
        assert_eq!(r.overall_code, OK, "request {i}");
        assert_eq!(r.statuses[0].current_limit, None);
        assert_eq!(r.statuses[1].limit_remaining, 4 - i);
    }
    assert_eq!(c.should_rate_limit(both()).await.unwrap().overall_code, OVER);
    // Alone, api_default applies: 2 a minute.
    for expected in [OK, OK, OVER] {
        assert_eq!(ask(&mut c, "edge_proxy_per_ip", &[("api", "k")]).await.overall_code, expected);
    }
    // algorithm and window: a fixed window of 90 s (aligned to the clock), not one hour.
    for _ in 0..3 {
        assert_eq!(ask(&mut c, "edge_proxy_per_ip", &[("fixed", "a")]).await.overall_code, OK);
    }
    let r = ask(&mut c, "edge_proxy_per_ip", &[("fixed", "a")]).await;
    assert_eq!(r.overall_code, OVER);
    let wait = r.statuses[0].duration_until_reset.unwrap();
    assert!(wait.seconds < 90, "{wait:?}");
    assert_eq!(header(&r, "RateLimit-Policy"), Some("\"fixed\";q=3;w=90"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_are_refused_or_decided_in_bounds() {
    let server = start("").await;
    let mut c = client(server.grpc).await;
    let status = c.should_rate_limit(request("", vec![descriptor(&[("a", "b")])])).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let status = c.should_rate_limit(request("edge_proxy_per_ip", Vec::new())).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    // Thousands of descriptors: refused whole, nothing charged.
    let many: Vec<_> = (0..5000).map(|i| descriptor(&[("remote_address", &format!("9.9.{i}.1"))])).collect();
    let status = c.should_rate_limit(request("edge_proxy_per_ip", many)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let r = ask(&mut c, "edge_proxy_per_ip", &[("remote_address", "9.9.0.1")]).await;
    assert_eq!(r.statuses[0].limit_remaining, 9);
    // The most allowed, all decided.
    let most: Vec<_> = (0..256).map(|i| descriptor(&[("remote_address", &format!("8.8.{i}.1"))])).collect();
    let r = c.should_rate_limit(request("edge_proxy_per_ip", most)).await.unwrap();
    assert_eq!(r.statuses.len(), 256);
    assert!(r.statuses.iter().all(|s| s.code == OK && s.limit_remaining == 9));
    // A huge value is an identity like any other (hashed, never stored as is).
    let huge = "x".repeat(512 * 1024);
    let r = ask(&mut c, "edge_proxy_per_ip", &[("remote_address", &huge)]).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 9));
    // A message over the bound is refused by the decoder.
    let too_big = "x".repeat(2 * 1024 * 1024);
    let status = c
        .should_rate_limit(request("edge_proxy_per_ip", vec![descriptor(&[("remote_address", &too_big)])]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::OutOfRange);
    // Empty keys and values match nothing.
    let r = ask(&mut c, "edge_proxy_per_ip", &[("", "")]).await;
    assert_eq!((r.overall_code, r.statuses[0].current_limit.as_ref()), (OK, None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_service_answers_serving() {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let server = start("").await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        let answer = health.check(HealthCheckRequest { service: service.into() }).await.unwrap().into_inner();
        assert_eq!(answer.status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_counts_then_dies_fail_open_and_fail_closed() {
    let mut redis = RedisServer::spawn();
    for (on_error, expected) in [("allow", OK), ("deny", OVER)] {
        let store =
            format!("[store]\nurl = \"{}\"\non_error = \"{on_error}\"\ntimeout_ms = 100\n", redis.url());
        let server = start(&store).await;
        let mut c = client(server.grpc).await;
        if redis.is_running() {
            for i in 0..10u32 {
                let r = ask(&mut c, "edge_proxy_per_ip", &[("remote_address", "7.7.7.7")]).await;
                assert_eq!(r.statuses[0].limit_remaining, 9 - i);
            }
            assert_eq!(
                ask(&mut c, "edge_proxy_per_ip", &[("remote_address", "7.7.7.7")]).await.overall_code,
                OVER
            );
            // The descriptor value reached Redis hashed, under the rule's scope.
            let keys = std::process::Command::new("redis-cli")
                .args(["-p", &redis.port().to_string(), "--scan"])
                .output()
                .unwrap();
            let keys = String::from_utf8_lossy(&keys.stdout).into_owned();
            assert!(keys.contains("envoy/edge_proxy_per_ip/remote_address:k:"), "{keys}");
            assert!(!keys.contains("7.7.7.7"), "{keys}");
            redis.kill();
        }
        // Redis gone: each rule's on_error, at once, for a fresh identity too.
        for value in ["7.7.7.8", "7.7.7.9"] {
            let started = std::time::Instant::now();
            let r = ask(&mut c, "edge_proxy_per_ip", &[("remote_address", value)]).await;
            assert_eq!(r.overall_code, expected, "on_error = {on_error}");
            assert!(started.elapsed() < std::time::Duration::from_secs(2));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_redis_is_answered_within_the_deadline() {
    let mut redis = RedisServer::spawn();
    let store = format!("[store]\nurl = \"{}\"\non_error = \"deny\"\ntimeout_ms = 100\n", redis.url());
    let server = start(&store).await;
    let mut c = client(server.grpc).await;
    let r = ask(&mut c, "edge_proxy_per_ip", &[("remote_address", "6.6.6.6")]).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 9));
    redis.pause();
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let r = ask(&mut c, "edge_proxy_per_ip", &[("remote_address", "6.6.6.6")]).await;
        assert_eq!(r.overall_code, OVER, "fail closed while Redis answers nothing");
        assert!(started.elapsed() < std::time::Duration::from_secs(1), "{:?}", started.elapsed());
    }
    // Unlimited and unmatched descriptors never ask the store.
    let r = ask(&mut c, "edge_proxy_per_ip", &[("free", "a")]).await;
    assert_eq!(r.overall_code, OK);
    redis.resume();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_reads_the_yaml_again() {
    let server = start("").await;
    let mut c = client(server.grpc).await;
    let r = ask(&mut c, "messaging", &[("to_number", "5")]).await;
    assert_eq!(r.statuses[0].limit_remaining, 99);
    let yaml = MESSAGING.replace("requests_per_unit: 100", "requests_per_unit: 3");
    std::fs::write(server.dir_path.join("ratelimit/messaging.yml"), yaml).unwrap();
    let reloaded = server.reloader.reload().unwrap();
    assert_eq!(reloaded.limits_restarted, ["envoy/messaging/to_number/to_number"]);
    let r = ask(&mut c, "messaging", &[("to_number", "5")]).await;
    assert_eq!(
        (r.statuses[0].limit_remaining, r.statuses[0].current_limit.as_ref().unwrap().requests_per_unit),
        (2, 3)
    );
    // A broken file changes nothing.
    std::fs::write(server.dir_path.join("ratelimit/messaging.yml"), "domain: [").unwrap();
    let err = server.reloader.reload().unwrap_err().to_string();
    assert!(err.contains("messaging.yml:1:"), "{err}");
    let r = ask(&mut c, "messaging", &[("to_number", "5")]).await;
    assert_eq!(r.statuses[0].limit_remaining, 1);
}

#[test]
fn a_bad_yaml_is_located_by_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 5\n";
    std::fs::write(dir.path().join("rl.yaml"), yaml).unwrap();
    let toml = "[envoy]\nconfig = \"rl.yaml\"\n";
    let err = Config::parse(toml, dir.path().join("s.toml")).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("rl.yaml:"), "{text}");
    assert!(text.contains("rate_limit unit \"fortnight\": expected one of second"), "{text}");
    assert_eq!(err.location().map(|(line, _)| line), Some(5), "{text}");
    // An unknown key, as the reference service refuses it.
    std::fs::write(dir.path().join("rl.yaml"), "domain: d\ndescriptors:\n  - key: a\n    rate_limt: {}\n")
        .unwrap();
    let err = Config::parse(toml, dir.path().join("s.toml")).unwrap_err();
    assert_eq!(err.location(), Some((4, 5)), "{err}");
    assert!(err.to_string().contains("unknown field `rate_limt`"), "{err}");
    // A descriptor configured twice: located at the descriptor holding both
    // (the parser gives a list no position of its own); an empty key, at its descriptor.
    std::fs::write(
        dir.path().join("rl.yaml"),
        "domain: d\ndescriptors:\n  - key: b\n  - key: p\n    descriptors:\n      - key: a\n        value: x\n      - key: a\n        value: x\n",
    )
    .unwrap();
    let err = Config::parse(toml, dir.path().join("s.toml")).unwrap_err();
    assert!(err.to_string().contains("descriptor key \"a\" with value \"x\" is configured twice"), "{err}");
    assert_eq!(err.location(), Some((4, 5)), "{err}");
    std::fs::write(dir.path().join("rl.yaml"), "domain: d\ndescriptors:\n  - key: \"\"\n").unwrap();
    let err = Config::parse(toml, dir.path().join("s.toml")).unwrap_err();
    assert_eq!(err.location(), Some((3, 5)), "{err}");
    assert!(err.to_string().contains("descriptor key is empty"), "{err}");
    // A missing file is located in the TOML.
    let err = Config::parse("[envoy]\nconfig = \"none.yaml\"\n", dir.path().join("s.toml")).unwrap_err();
    assert_eq!(err.location(), Some((2, 10)), "{err}");
    // Two files for one domain.
    std::fs::create_dir(dir.path().join("d")).unwrap();
    std::fs::write(dir.path().join("d/a.yaml"), "domain: same\n").unwrap();
    std::fs::write(dir.path().join("d/b.yaml"), "\ndomain: same\n").unwrap();
    let err = Config::parse("[envoy]\nconfig = \"d\"\n", dir.path().join("s.toml")).unwrap_err();
    assert!(err.to_string().contains("b.yaml:2:"), "{err}");
    assert!(err.to_string().contains("configured twice"), "{err}");
}

/// `(code, limit_remaining, requests_per_unit of current_limit)` of a one-descriptor answer.
fn answer(r: &RateLimitResponse) -> (i32, u32, Option<u32>) {
    let s = &r.statuses[0];
    (s.code, s.limit_remaining, s.current_limit.as_ref().map(|l| l.requests_per_unit))
}

/// [`answer`] of the descriptor `(key, value)` in the domain `reference`.
async fn one(c: &mut RateLimitServiceClient, key: &str, value: &str) -> (i32, u32, Option<u32>) {
    answer(&ask(c, "reference", &[(key, value)]).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wildcard_values_after_the_exact_value_in_order_before_the_key_alone() {
    let server = start("").await;
    let mut c = client(server.grpc).await;
    assert_eq!(one(&mut c, "path", "/api/admin/action").await, (OK, 0, Some(1)));
    assert_eq!(one(&mut c, "path", "/api/admin/action").await, (OVER, 0, Some(1)));
    assert_eq!(one(&mut c, "path", "/api/123/action").await, (OK, 1, Some(2)));
    // Each value a pattern matches has its own count.
    assert_eq!(one(&mut c, "path", "/api/123/action").await, (OK, 0, Some(2)));
    assert_eq!(one(&mut c, "path", "/api/123/action").await, (OVER, 0, Some(2)));
    assert_eq!(one(&mut c, "path", "/api/user-id/action").await, (OK, 1, Some(2)));
    assert_eq!(one(&mut c, "path", "/api//action").await, (OK, 1, Some(2)));
    // The first pattern misses: the second matches.
    assert_eq!(one(&mut c, "path", "/api/123/other").await, (OK, 2, Some(3)));
    assert_eq!(one(&mut c, "path", "/api/").await, (OK, 2, Some(3)));
    // No pattern matches: the key alone.
    assert_eq!(one(&mut c, "path", "/other").await, (OK, 3, Some(4)));
    assert_eq!(one(&mut c, "path", "").await, (OK, 3, Some(4)));
    assert_eq!(one(&mut c, "path", "/ap").await, (OK, 3, Some(4)));
    // Several stars, each in its turn.
    for (value, expected) in [
        ("/api/v1/resource/123/action", Some(5)),
        ("/api/v2/resource/456/action", Some(5)),
        ("/api/v1/resource/action", None),
        ("/api/v1/resource/1/other", None),
    ] {
        let r = ask(&mut c, "reference", &[("route", value)]).await;
        assert_eq!(answer(&r).2, expected, "{value}");
        assert_eq!(r.overall_code, OK);
    }
    // Example 10: value_to_metric changes nothing of the decision.
    let resource = [("user", "alice"), ("action", "readfile"), ("resource", "documents")];
    assert_eq!(answer(&ask(&mut c, "reference", &resource).await), (OK, 99, Some(100)));
    assert_eq!(answer(&ask(&mut c, "reference", &resource).await), (OK, 98, Some(100)));
    let write = [("user", "alice"), ("action", "writefile"), ("resource", "documents")];
    assert_eq!(answer(&ask(&mut c, "reference", &write).await), (OK, 0, None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_values_against_wildcards_are_decided_at_once() {
    let server = start("").await;
    let mut c = client(server.grpc).await;
    // Half a mebibyte that almost matches a pattern of 34 stars: a
    // backtracking matcher would never answer.
    let almost = "a".repeat(512 * 1024);
    let started = std::time::Instant::now();
    assert_eq!(answer(&ask(&mut c, "reference", &[("stars", &almost)]).await), (OK, 0, None));
    let matching = format!("{almost}b");
    assert_eq!(answer(&ask(&mut c, "reference", &[("stars", &matching)]).await), (OK, 5, Some(6)));
    assert_eq!(answer(&ask(&mut c, "reference", &[("path", &matching)]).await), (OK, 3, Some(4)));
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
    // `*` matches the empty value, which is its own identity.
    assert_eq!(answer(&ask(&mut c, "reference", &[("anything", "")]).await), (OK, 6, Some(7)));
    assert_eq!(answer(&ask(&mut c, "reference", &[("anything", "")]).await), (OK, 5, Some(7)));
    assert_eq!(answer(&ask(&mut c, "reference", &[("anything", "*")]).await), (OK, 6, Some(7)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_threshold_counts_every_matching_value_as_one() {
    let server = start("").await;
    let mut c = client(server.grpc).await;
    // Example 11: five for a.pdf and five for b.csv exhaust files/* together.
    for i in 0..10u32 {
        let file = if i < 5 { "files/a.pdf" } else { "files/b.csv" };
        assert_eq!(answer(&ask(&mut c, "reference", &[("files", file)]).await), (OK, 9 - i, Some(10)), "{i}");
    }
    let r = ask(&mut c, "reference", &[("files", "files/c.txt")]).await;
    assert_eq!((r.overall_code, answer(&r)), (OVER, (OVER, 0, Some(10))));
    // Without share_threshold, each value has its own ten.
    for i in 0..10u32 {
        let r = ask(&mut c, "reference", &[("files_no_share", "files_no_share/a.pdf")]).await;
        assert_eq!(answer(&r), (OK, 9 - i, Some(10)));
    }
    let r = ask(&mut c, "reference", &[("files_no_share", "files_no_share/a.pdf")]).await;
    assert_eq!(r.overall_code, OVER);
    let r = ask(&mut c, "reference", &[("files_no_share", "files_no_share/b.csv")]).await;
    assert_eq!(answer(&r), (OK, 9, Some(10)));
    // Shared above the limit: api/v1 and api/v2 count as one per method.
    let route = |value: &'static str, method: &'static str| [("shared_route", value), ("method", method)];
    assert_eq!(answer(&ask(&mut c, "reference", &route("api/v1", "GET")).await), (OK, 1, Some(2)));
    assert_eq!(answer(&ask(&mut c, "reference", &route("api/v2", "GET")).await), (OK, 0, Some(2)));
    assert_eq!(answer(&ask(&mut c, "reference", &route("api/v3", "GET")).await), (OVER, 0, Some(2)));
    assert_eq!(answer(&ask(&mut c, "reference", &route("api/v1", "POST")).await), (OK, 1, Some(2)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_mode_is_over_limit_only_when_every_quota_descriptor_is() {
    let server = start("").await;
    let mut c = client(server.grpc).await;
    let both =
        || request("reference", vec![descriptor(&[("quota_a", "x")]), descriptor(&[("quota_b", "x")])]);
    let codes = |r: &RateLimitResponse| {
        (r.overall_code, r.statuses.iter().map(|s| (s.code, s.limit_remaining)).collect::<Vec<_>>())
    };
    let r = c.should_rate_limit(both()).await.unwrap();
    assert_eq!(codes(&r), (OK, vec![(OK, 0), (OK, 2)]));
    // quota_a is over, quota_b is not: the request is not, quota_a's status still says so.
    let r = c.should_rate_limit(both()).await.unwrap();
    assert_eq!(codes(&r), (OK, vec![(OVER, 0), (OK, 1)]));
    let r = c.should_rate_limit(both()).await.unwrap();
    assert_eq!(codes(&r), (OK, vec![(OVER, 0), (OK, 0)]));
    // Both are over: so is the request.
    let r = c.should_rate_limit(both()).await.unwrap();
    assert_eq!(codes(&r), (OVER, vec![(OVER, 0), (OVER, 0)]));
    // Alone, a quota-mode descriptor over its limit is every one of them.
    assert_eq!(ask(&mut c, "reference", &[("quota_a", "y")]).await.overall_code, OK);
    let r = ask(&mut c, "reference", &[("quota_a", "y")]).await;
    assert_eq!((r.overall_code, r.statuses[0].code), (OVER, OVER));
    // A rate-limit descriptor over its limit still makes the request over.
    let mixed = || request("reference", vec![descriptor(&[("quota_b", "z")]), descriptor(&[("rate", "z")])]);
    assert_eq!(codes(&c.should_rate_limit(mixed()).await.unwrap()), (OK, vec![(OK, 2), (OK, 1)]));
    assert_eq!(codes(&c.should_rate_limit(mixed()).await.unwrap()), (OK, vec![(OK, 1), (OK, 0)]));
    assert_eq!(codes(&c.should_rate_limit(mixed()).await.unwrap()), (OVER, vec![(OK, 0), (OVER, 0)]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_week_is_seven_days() {
    let server = start("").await;
    let mut c = client(server.grpc).await;
    let r = ask(&mut c, "reference", &[("weekly", "k")]).await;
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit), (2, Unit::Week as i32));
    assert_eq!(Unit::Week as i32, 7);
    assert_eq!(r.statuses[0].limit_remaining, 1);
    assert_eq!(header(&r, "RateLimit-Policy"), Some("\"weekly\";q=2;w=604800"));
}

#[test]
fn the_reference_load_checks_are_located() {
    let dir = tempfile::tempdir().unwrap();
    let toml = "[envoy]\nconfig = \"rl.yaml\"\n";
    let error = |yaml: &str| {
        std::fs::write(dir.path().join("rl.yaml"), yaml).unwrap();
        let err = Config::parse(toml, dir.path().join("s.toml")).unwrap_err();
        (err.location(), err.to_string())
    };
    let (at, text) =
        error("domain: d\ndescriptors:\n  - key: a\n    value: files\n    share_threshold: true\n");
    assert!(
        text.contains("descriptor key \"a\": share_threshold needs a wildcard value (one holding `*`, such as \"files/*\"), found value \"files\""),
        "{text}"
    );
    // At the descriptor's list item.
    assert_eq!(at, Some((3, 3)), "{text}");
    let (_, text) = error("domain: d\ndescriptors:\n  - key: a\n    share_threshold: true\n");
    assert!(text.contains("found no value"), "{text}");
    let (at, text) = error(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: \"\"\n",
    );
    assert!(text.contains("rate_limit replaces name is empty"), "{text}");
    assert_eq!(at, Some((8, 11)), "{text}");
    let (at, text) = error(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      name: n\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: n\n",
    );
    assert!(text.contains("rate_limit \"n\" replaces itself"), "{text}");
    // Located at the descriptor holding the rate_limit, as a rate_limit's other errors are.
    assert_eq!(at, Some((3, 5)), "{text}");
    let (at, text) = error(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unlimited: true\n      unit: second\n",
    );
    assert!(text.contains("rate_limit with unlimited: true takes no unit"), "{text}");
    assert_eq!(at, Some((3, 5)), "{text}");
    // An empty value is no value, as in the reference: with the key alone, it is the same descriptor.
    let (_, text) = error("domain: d\ndescriptors:\n  - key: a\n  - key: a\n    value: \"\"\n");
    assert!(text.contains("descriptor key \"a\" without a value is configured twice"), "{text}");
}

/// A descriptor's `limit` from Envoy replaces the configured one, as in the
/// reference service: counted apart, on matched and unmatched descriptors,
/// `requests_per_unit: 0` blocking, a unit that is none refused, and no
/// more than `MAX_OVERRIDES` distinct overrides; `limit_overrides =
/// "ignore"` keeps the configured limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_descriptor_limit_override_replaces_the_configured_limit() {
    use slidegate_server::envoy::proto::RateLimitOverride;
    use slidegate_server::envoy::MAX_OVERRIDES;
    let overridden = |entries: &[(&str, &str)], requests_per_unit: u32, unit: Unit| {
        let mut d = descriptor(entries);
        d.limit = Some(RateLimitOverride { requests_per_unit, unit: unit as i32 });
        request("edge_proxy_per_ip", vec![d])
    };
    let server = start("").await;
    let mut c = client(server.grpc).await;
    for (entries, what) in
        [(&[("remote_address", "9.9.9.9")][..], "matched"), (&[("nowhere", "x")][..], "unmatched")]
    {
        for i in 0..2u32 {
            let r = c.should_rate_limit(overridden(entries, 2, Unit::Hour)).await.unwrap();
            assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 1 - i), "{what} {i}");
            let limit = r.statuses[0].current_limit.as_ref().unwrap();
            assert_eq!((limit.requests_per_unit, limit.unit), (2, Unit::Hour as i32), "{what}");
        }
        let r = c.should_rate_limit(overridden(entries, 2, Unit::Hour)).await.unwrap();
        assert_eq!((r.overall_code, r.statuses[0].code), (OVER, OVER), "{what}");
        let wait = r.statuses[0].duration_until_reset.unwrap();
        assert!(wait.seconds > 0 && wait.seconds <= 7200, "{what}: {wait:?}");
    }
    // The configured limit of the same value keeps its own count.
    let r = ask(&mut c, "edge_proxy_per_ip", &[("remote_address", "9.9.9.9")]).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 9));
    // Another override of the same value is another limit, counted apart.
    let r = c.should_rate_limit(overridden(&[("remote_address", "9.9.9.9")], 5, Unit::Week)).await.unwrap();
    assert_eq!(
        (r.statuses[0].limit_remaining, r.statuses[0].current_limit.as_ref().unwrap().unit),
        (4, Unit::Week as i32)
    );
    // Zero permits block, without a store call; a unit that is none is refused.
    let r = c.should_rate_limit(overridden(&[("free", "a")], 0, Unit::Second)).await.unwrap();
    assert_eq!(r.overall_code, OVER, "the override replaces even `unlimited`");
    for unit in [0, 8, -1] {
        let mut d = descriptor(&[("remote_address", "9.9.9.9")]);
        d.limit = Some(RateLimitOverride { requests_per_unit: 5, unit });
        let err = c.should_rate_limit(request("edge_proxy_per_ip", vec![d])).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "unit {unit}");
        assert!(
            err.message().contains(&format!("unit {unit} is not a rate limit unit")),
            "{}",
            err.message()
        );
    }
    // Distinct overrides are bounded: each is a limit of its own in the store.
    let mut refused = None;
    for n in 1..=(MAX_OVERRIDES as u32 + 10) {
        match c.should_rate_limit(overridden(&[("nowhere", "bound")], 1000 + n, Unit::Minute)).await {
            Ok(_) => {}
            Err(err) => {
                assert_eq!(err.code(), tonic::Code::InvalidArgument);
                assert!(err.message().contains("distinct overrides"), "{}", err.message());
                refused = Some(n);
                break;
            }
        }
    }
    // Three were seen before this loop (2/hour, 5/week, 0/second); the
    // worker that took them is the one this connection reaches.
    assert_eq!(refused, Some(MAX_OVERRIDES as u32 - 2), "the first override past the bound is refused");
    // One seen before is still decided.
    let r = c.should_rate_limit(overridden(&[("nowhere", "bound")], 1001, Unit::Minute)).await.unwrap();
    assert_eq!(r.statuses[0].limit_remaining, 999, "1,001 a minute, its second request");

    let ignoring = start_with("", "limit_overrides = \"ignore\"\n").await;
    let mut c = client(ignoring.grpc).await;
    let r = c.should_rate_limit(overridden(&[("remote_address", "9.9.9.9")], 2, Unit::Hour)).await.unwrap();
    assert_eq!(r.statuses[0].limit_remaining, 9, "the configured 10 a minute");
    assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().requests_per_unit, 10);
    let r = c.should_rate_limit(overridden(&[("nowhere", "x")], 2, Unit::Hour)).await.unwrap();
    assert_eq!((r.overall_code, r.statuses[0].current_limit.clone()), (OK, None), "unmatched: not limited");
}

#[test]
fn a_bad_limit_overrides_setting_is_located() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rl.yaml"), "domain: d\ndescriptors:\n  - key: a\n").unwrap();
    let toml = "[envoy]\nconfig = \"rl.yaml\"\nlimit_overrides = \"sometimes\"\n";
    let err = Config::parse(toml, dir.path().join("s.toml")).unwrap_err();
    assert_eq!(err.location().map(|(line, _)| line), Some(3), "{err}");
    assert!(err.to_string().contains("limit_overrides \"sometimes\": expected \"apply\""), "{err}");
}

/// Domains and keys are free text: two whose rules would be one are refused.
#[test]
fn descriptors_whose_rules_would_meet_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("rl")).unwrap();
    let limit = "    rate_limit: {unit: minute, requests_per_unit: 5}\n";
    std::fs::write(dir.path().join("rl/1.yaml"), format!("domain: a/b\ndescriptors:\n  - key: c\n{limit}"))
        .unwrap();
    std::fs::write(dir.path().join("rl/2.yaml"), format!("domain: a\ndescriptors:\n  - key: b/c\n{limit}"))
        .unwrap();
    let toml = "[envoy]\nconfig = \"rl\"\nlimit_overrides = \"ignore\"\n";
    let err = Config::parse(toml, dir.path().join("s.toml")).unwrap_err();
    assert!(err.to_string().contains("would both be rule \"envoy/a/b/c\""), "{err}");
    // A domain's override rule against another domain's descriptor.
    std::fs::write(dir.path().join("rl/2.yaml"), format!("domain: a\ndescriptors:\n  - key: x\n{limit}"))
        .unwrap();
    std::fs::write(dir.path().join("rl/1.yaml"), format!("domain: a/x\ndescriptors:\n  - key: c\n{limit}"))
        .unwrap();
    let err = Config::parse("[envoy]\nconfig = \"rl\"\n", dir.path().join("s.toml")).unwrap_err();
    assert!(err.to_string().contains("would both be rule \"envoy/a/x\""), "{err}");
}
