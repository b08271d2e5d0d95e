//! Every listener bounded (`[server] connections.<listener>`): on the
//! public listener, `admin_listen`, `auth_listen` and `grpc_listen`, the
//! connection past the cap is closed at once and counted, while the ones
//! held are served; a half-sent request head is closed after the header
//! timeout; an idle keep-alive connection after the idle timeout.
//!
//! The waits for a close are bounded at ten times the timeout configured
//! here (1 s), and well under the 30 s the timeouts had before they were
//! settings: a close after the bound fails the test, whatever the machine.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use slidegate_server::{Config, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// How long a test waits for a close it expects.
const BOUND: Duration = Duration::from_secs(10);

const YAML: &str = "domain: edge\ndescriptors:\n  - key: ip\n    rate_limit:\n      unit: minute\n      requests_per_unit: 10\n";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Which {
    Public,
    Admin,
    Auth,
    Grpc,
}

const ALL: [Which; 4] = [Which::Public, Which::Admin, Which::Auth, Which::Grpc];

impl Which {
    fn name(self) -> &'static str {
        match self {
            Which::Public => "public",
            Which::Admin => "admin",
            Which::Auth => "auth",
            Which::Grpc => "grpc",
        }
    }
}

struct Running {
    public: SocketAddr,
    admin: SocketAddr,
    auth: SocketAddr,
    grpc: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    _dir: tempfile::TempDir,
}

impl Running {
    fn addr(&self, which: Which) -> SocketAddr {
        match which {
            Which::Public => self.public,
            Which::Admin => self.admin,
            Which::Auth => self.auth,
            Which::Grpc => self.grpc,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// An upstream answering every request `200 ok`, keeping its connections.
async fn upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let Ok(n @ 1..) = stream.read(&mut buf).await else { return };
                    seen.extend_from_slice(&buf[..n]);
                    while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                        seen.drain(..end + 4);
                        let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if stream.write_all(reply).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

/// `serve` with all four listeners on the embedded store, each bounded by `limits`
/// (the inside of a `{ ... }` table), trusting this host's hook requests.
async fn start(limits: &str) -> Running {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rl.yaml"), YAML).unwrap();
    let upstream = upstream().await;
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nauth_listen = \"127.0.0.1:0\"\n\
         grpc_listen = \"127.0.0.1:0\"\nupstream = \"http://{upstream}\"\nthreads = 2\n\
         connections = {{ public = {{ {limits} }}, admin = {{ {limits} }}, auth = {{ {limits} }}, grpc = {{ {limits} }} }}\n\
         [identity]\ntrusted_proxies = [\"127.0.0.1/32\"]\n[envoy]\nconfig = \"rl.yaml\"\n"
    );
    let path = dir.path().join("slidegate.toml");
    std::fs::write(&path, &toml).unwrap();
    let config = Config::parse_with_env(&toml, &path, &|_| None).unwrap();
    let server = Server::bind(&config).await.unwrap();
    let (public, admin) = (server.local_addr(), server.admin_addr().unwrap());
    let (auth, grpc) = (server.auth_addr().unwrap(), server.grpc_addr().unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    Running { public, admin, auth, grpc, stop: Some(stop), _dir: dir }
}

/// A complete keep-alive request for `which` (a hook request on `auth`).
fn request(which: Which) -> &'static [u8] {
    match which {
        Which::Public => b"GET /x HTTP/1.1\r\nhost: a\r\n\r\n",
        Which::Admin => b"GET /healthz HTTP/1.1\r\nhost: a\r\n\r\n",
        Which::Auth => b"GET / HTTP/1.1\r\nhost: a\r\nx-forwarded-method: GET\r\nx-forwarded-uri: /x\r\n\r\n",
        Which::Grpc => unreachable!("gRPC is asked with h2"),
    }
}

/// One response read from `stream`: its status and body (by `content-length`).
async fn response(stream: &mut TcpStream) -> (u16, String) {
    let mut all = Vec::new();
    let mut buf = [0u8; 8192];
    let read = async {
        loop {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before a whole response: {:?}", String::from_utf8_lossy(&all));
            all.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&all).into_owned();
            let Some((head, body)) = text.split_once("\r\n\r\n") else { continue };
            let length = head
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length: ").map(str::to_owned))
                .map_or(0, |v| v.trim().parse::<usize>().unwrap());
            if body.len() >= length {
                let status = head.split(' ').nth(1).unwrap().parse().unwrap();
                return (status, body.to_owned());
            }
        }
    };
    tokio::time::timeout(BOUND, read).await.expect("an answer in time")
}

/// Whether `stream` was closed by the server within [`BOUND`], with nothing but
/// (at most) an error answer before the close.
async fn closed(stream: &mut TcpStream) -> bool {
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    let read = tokio::time::timeout(BOUND, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => all.extend_from_slice(&buf[..n]),
            }
        }
    });
    read.await.is_ok() && !String::from_utf8_lossy(&all).contains(" 200 ")
}

/// An h2 connection to the gRPC listener.
async fn h2_client(
    addr: SocketAddr,
) -> (h2::client::SendRequest<Bytes>, tokio::task::JoinHandle<Result<(), h2::Error>>) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (client, connection) =
        tokio::time::timeout(BOUND, h2::client::handshake(tcp)).await.unwrap().unwrap();
    (client, tokio::spawn(connection))
}

/// A gRPC call to an unknown method on `client`: its `grpc-status`.
async fn grpc_call(client: &mut h2::client::SendRequest<Bytes>) -> String {
    let request = http::Request::post("http://a/nope.Service/Nothing")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, _) = client.send_request(request, true).unwrap();
    let response = tokio::time::timeout(BOUND, response).await.unwrap().unwrap();
    let status = response.headers().get("grpc-status").map(|v| v.to_str().unwrap().to_owned());
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        chunk.unwrap();
    }
    status.unwrap_or_default()
}

/// The value of `name` in a Prometheus exposition.
fn value(text: &str, name: &str) -> f64 {
    let line = text.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')));
    line.unwrap_or_else(|| panic!("no metric {name} in {text}")).parse().unwrap()
}

/// The admin listener's `/metrics`, on a connection of its own.
async fn metrics(admin: SocketAddr) -> String {
    let mut stream = TcpStream::connect(admin).await.unwrap();
    stream.write_all(b"GET /metrics HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n").await.unwrap();
    let (status, body) = response(&mut stream).await;
    assert_eq!(status, 200, "{body}");
    body
}

fn open_metric(which: Which) -> String {
    format!("slidegate_listener_connections{{listener=\"{}\"}}", which.name())
}

fn refused_metric(which: Which) -> String {
    format!("slidegate_listener_connections_refused_total{{listener=\"{}\"}}", which.name())
}

/// Waits until `which` has `open` connections, as `/metrics` counts them.
async fn until_open(admin: SocketAddr, which: Which, open: f64) {
    for _ in 0..500 {
        if value(&metrics(admin).await, &open_metric(which)) == open {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{which:?} never had {open} connections open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_each_listener_the_connection_past_the_cap_is_closed_and_counted() {
    let sg = start("max = 2").await;
    for which in [Which::Public, Which::Auth] {
        let addr = sg.addr(which);
        // Accepted in order: the first two take the slots.
        let mut held = vec![TcpStream::connect(addr).await.unwrap(), TcpStream::connect(addr).await.unwrap()];
        let mut third = TcpStream::connect(addr).await.unwrap();
        let _ = third.write_all(request(which)).await;
        assert!(closed(&mut third).await, "{which:?}: the third connection is closed at once");
        for stream in &mut held {
            stream.write_all(request(which)).await.unwrap();
            assert_eq!(response(stream).await.0, 200, "{which:?}: a held connection is served");
        }
        // One closed: its slot is given back, and a new connection is served.
        drop(held.pop());
        until_open(sg.admin, which, 1.0).await;
        let mut next = TcpStream::connect(addr).await.unwrap();
        next.write_all(request(which)).await.unwrap();
        assert_eq!(response(&mut next).await.0, 200, "{which:?}: a slot given back serves a new connection");
    }
    let grpc = sg.addr(Which::Grpc);
    let mut held = vec![h2_client(grpc).await, h2_client(grpc).await];
    let mut third = TcpStream::connect(grpc).await.unwrap();
    let _ = third.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
    assert!(closed(&mut third).await, "gRPC: the third connection is closed at once");
    for (client, _) in &mut held {
        assert_eq!(grpc_call(client).await, "12", "gRPC: a held connection is served (UNIMPLEMENTED)");
    }
    // The admin listener last: its own held connection reads the counts,
    // once the probes above have given their slots back.
    let admin = sg.addr(Which::Admin);
    let mut first = TcpStream::connect(admin).await.unwrap();
    let mut alone = false;
    for _ in 0..500 {
        first.write_all(b"GET /metrics HTTP/1.1\r\nhost: a\r\n\r\n").await.unwrap();
        if value(&response(&mut first).await.1, &open_metric(Which::Admin)) == 1.0 {
            alone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(alone, "the admin probes gave their slots back");
    let mut held = [first, TcpStream::connect(admin).await.unwrap()];
    let mut third = TcpStream::connect(admin).await.unwrap();
    let _ = third.write_all(request(Which::Admin)).await;
    assert!(closed(&mut third).await, "admin: the third connection is closed at once");
    held[1].write_all(request(Which::Admin)).await.unwrap();
    assert_eq!(response(&mut held[1]).await.0, 200);
    held[0].write_all(b"GET /metrics HTTP/1.1\r\nhost: a\r\n\r\n").await.unwrap();
    let (status, text) = response(&mut held[0]).await;
    assert_eq!(status, 200, "{text}");
    for which in ALL {
        assert_eq!(
            value(&text, &refused_metric(which)),
            1.0,
            "{which:?} refused exactly its third connection"
        );
    }
    assert_eq!(value(&text, &open_metric(Which::Admin)), 2.0);
    assert_eq!(value(&text, &open_metric(Which::Grpc)), 2.0);
    assert_eq!(value(&text, "slidegate_listener_connections_max{listener=\"auth\"}"), 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_each_listener_a_half_sent_head_is_closed_after_the_header_timeout() {
    let sg = start("header_timeout = \"1s\", idle_timeout = \"1h\"").await;
    for which in ALL {
        let mut stream = TcpStream::connect(sg.addr(which)).await.unwrap();
        let half: &[u8] = match which {
            // Half of HTTP/2's preface: no request can come.
            Which::Grpc => b"PRI * HTTP/2.0\r\n",
            _ => b"GET /x HTTP/1.1\r\nhost: a\r\nx-half: ",
        };
        stream.write_all(half).await.unwrap();
        assert!(closed(&mut stream).await, "{which:?}: a half-sent head is closed after the header timeout");
    }
    // A keep-alive connection's second head, half sent, too (HTTP/1.1).
    for which in [Which::Public, Which::Admin, Which::Auth] {
        let mut stream = TcpStream::connect(sg.addr(which)).await.unwrap();
        stream.write_all(request(which)).await.unwrap();
        assert_eq!(response(&mut stream).await.0, 200);
        stream.write_all(b"GET /x HTTP/1.1\r\nhost: a\r\n").await.unwrap();
        assert!(closed(&mut stream).await, "{which:?}: a second half-sent head is closed too");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_each_listener_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let sg = start("header_timeout = \"10m\", idle_timeout = \"1s\"").await;
    for which in [Which::Public, Which::Admin, Which::Auth] {
        let mut stream = TcpStream::connect(sg.addr(which)).await.unwrap();
        stream.write_all(request(which)).await.unwrap();
        assert_eq!(response(&mut stream).await.0, 200, "{which:?}");
        assert!(closed(&mut stream).await, "{which:?}: an idle keep-alive connection is closed");
    }
    // HTTP/2: a call answered, then no stream: GOAWAY and a close, which
    // ends the client's connection task without an error.
    let (mut client, connection) = h2_client(sg.addr(Which::Grpc)).await;
    assert_eq!(grpc_call(&mut client).await, "12");
    let ended = tokio::time::timeout(BOUND, connection).await;
    assert!(matches!(ended, Ok(Ok(Ok(())))), "gRPC: an idle connection is closed with GOAWAY: {ended:?}");
}
