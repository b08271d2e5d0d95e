//! Envoy's rate limit service over gRPC, with a tonic client: the
//! reference service's documented matching examples, hits_addend, shadow
//! mode, unlimited, replaces, over-limit statuses and headers, Redis down
//! with fail-open and fail-closed, a bad config located, hostile requests.

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
}

async fn start(store: &str) -> Running {
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
         shutdown_grace = \"1s\"\n{identity}{store}\n[envoy]\nconfig = \"ratelimit\"\n"
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
