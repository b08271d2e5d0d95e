//! WebSockets through `slidegate serve`, end to end: a real client and echo
//! upstream (tokio-tungstenite, not written here) on loopback sockets. A
//! handshake is counted once by its rule; an admitted one is tunnelled both
//! ways, holding an upstream slot and a share of its client's until either
//! side closes or it falls idle; hostile handshakes are refused or ignored.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{config_head, redis_store, RedisServer, Slidegate, SECRET_ENV};
use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

type Client = WebSocketStream<TcpStream>;
/// The answer to a handshake, as tungstenite reads it.
type Answer = http::Response<Option<Vec<u8>>>;
/// A tunnel with its 101, or the refusal.
type Handshake = Result<(Client, Answer), Answer>;

/// An echo upstream: greets each tunnel with `welcome`, echoes every
/// message, closes on `close-me`; refuses handshakes for `…/refuse` with 403.
/// Counts the handshakes it accepted.
struct EchoUpstream {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
}

impl EchoUpstream {
    async fn start() -> EchoUpstream {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let count = Arc::clone(&count);
                tokio::spawn(async move {
                    #[allow(clippy::result_large_err)] // tungstenite's callback type
                    let refuse = |request: &Request, response: Response| {
                        if request.uri().path().ends_with("/refuse") {
                            let mut answer = ErrorResponse::new(Some("no websockets here".into()));
                            *answer.status_mut() = http::StatusCode::FORBIDDEN;
                            return Err(answer);
                        }
                        Ok(response)
                    };
                    let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(stream, refuse).await else {
                        return;
                    };
                    count.fetch_add(1, Ordering::SeqCst);
                    if ws.send(Message::text("welcome")).await.is_err() {
                        return;
                    }
                    while let Some(Ok(message)) = ws.next().await {
                        if message.to_text().is_ok_and(|text| text == "close-me") {
                            let _ = ws.close(None).await;
                            // Drain to the client's close reply, then drop.
                            while let Some(Ok(_)) = ws.next().await {}
                            return;
                        }
                        if (message.is_text() || message.is_binary()) && ws.send(message).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        EchoUpstream { addr, accepted }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

fn config(upstream: SocketAddr, server: &str, store: &str, rules: &str) -> String {
    format!(
        "{head}\n[identity]\nip_hash_secret_env = \"{SECRET_ENV}\"\n\n{rules}",
        head = config_head(upstream, server, store)
    )
}

const CHAT_RULE: &str = "[[rules]]\nname = \"chat\"\npath = \"/chat*\"\nlimits = [{ limit = 100, window = \"60s\", algorithm = \"sliding_log\" }]\n";

/// A TCP connection to `addr` from the loopback address `from`: each is a client of its own.
async fn connect_from(from: Ipv4Addr, addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from((from, 0))).unwrap();
    socket.connect(addr).await.unwrap()
}

/// A WebSocket handshake for `path` from `from`: the tunnel and the 101, or the refusal.
async fn handshake(sg: &Slidegate, from: Ipv4Addr, path: &str) -> Handshake {
    let stream = connect_from(from, sg.addr).await;
    let url = format!("ws://{}{path}", sg.addr);
    match tokio_tungstenite::client_async(url, stream).await {
        Ok(pair) => Ok(pair),
        Err(WsError::Http(response)) => Err(*response),
        Err(err) => panic!("handshake failed: {err}"),
    }
}

async fn open(sg: &Slidegate, from: Ipv4Addr) -> Client {
    let (mut ws, response) = handshake(sg, from, "/chat").await.unwrap();
    assert_eq!(response.status(), 101);
    assert_eq!(next_text(&mut ws).await, "welcome");
    ws
}

async fn next_text(ws: &mut Client) -> String {
    let message = tokio::time::timeout(Duration::from_secs(10), ws.next()).await.expect("a message in time");
    match message {
        Some(Ok(Message::Text(text))) => text.as_str().to_owned(),
        other => panic!("expected a text message, got {other:?}"),
    }
}

/// Waits for the tunnel to end: the peer's close, or the socket's.
async fn closed(ws: &mut Client) {
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(message)) = ws.next().await {
            assert!(matches!(message, Message::Close(_)), "unexpected {message:?}");
        }
    });
    end.await.expect("the tunnel closed in time");
}

fn status(result: &Handshake) -> u16 {
    match result {
        Ok((_, response)) | Err(response) => response.status().as_u16(),
    }
}

/// The refusal of a handshake that must be refused.
async fn refused(sg: &Slidegate, from: Ipv4Addr, path: &str) -> Answer {
    match handshake(sg, from, path).await {
        Ok((_, response)) => panic!("admitted: {response:?}"),
        Err(response) => response,
    }
}

fn body(response: &Answer) -> String {
    String::from_utf8_lossy(response.body().as_deref().unwrap_or_default()).into_owned()
}

const A: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const B: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);
const C: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 4);
const D: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admitted_handshake_is_tunnelled_both_ways_with_the_rate_limit_headers() {
    let upstream = EchoUpstream::start().await;
    let sg = Slidegate::start(&config(upstream.addr, "", "", CHAT_RULE));
    let (mut ws, response) = handshake(&sg, A, "/chat/room-1?x=1").await.unwrap();
    assert_eq!(response.status(), 101);
    assert_eq!(response.headers()["upgrade"], "websocket");
    assert_eq!(response.headers()["ratelimit"], "\"chat\";r=99;t=60");
    // The upstream speaks first, then echoes text and binary, many times over:
    // frames are not requests.
    assert_eq!(next_text(&mut ws).await, "welcome");
    for i in 0..50 {
        ws.send(Message::text(format!("hello {i}"))).await.unwrap();
        assert_eq!(next_text(&mut ws).await, format!("hello {i}"));
    }
    let payload: Vec<u8> = (0..=255).cycle().take(200_000).collect();
    ws.send(Message::binary(payload.clone())).await.unwrap();
    match tokio::time::timeout(Duration::from_secs(10), ws.next()).await.unwrap() {
        Some(Ok(Message::Binary(echoed))) => assert_eq!(echoed.as_ref(), payload.as_slice()),
        other => panic!("expected the binary echo, got {other:?}"),
    }
    ws.close(None).await.unwrap();
    closed(&mut ws).await;
    // One handshake, one request counted.
    let (_ws, response) = handshake(&sg, A, "/chat").await.unwrap();
    assert_eq!(response.headers()["ratelimit"], "\"chat\";r=98;t=60");
    assert_eq!(upstream.accepted(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handshake_over_the_quota_gets_429_and_never_reaches_the_upstream() {
    let upstream = EchoUpstream::start().await;
    let rule = "[[rules]]\nname = \"chat\"\npath = \"/chat\"\nlimits = [{ limit = 2, window = \"60s\", algorithm = \"sliding_log\" }]\n";
    let sg = Slidegate::start(&config(upstream.addr, "", "", rule));
    let mut first = open(&sg, A).await;
    let _second = open(&sg, A).await;
    let denied = refused(&sg, A, "/chat").await;
    assert_eq!(denied.status(), 429);
    assert_eq!(denied.headers()["ratelimit"], "\"chat\";r=0;t=60");
    assert_eq!(denied.headers()["retry-after"], "60");
    assert_eq!(denied.headers()["content-type"], "application/problem+json");
    assert!(denied.headers().get("upgrade").is_none());
    assert_eq!(upstream.accepted(), 2);
    // The open tunnels go on: their frames are not counted.
    for i in 0..10 {
        first.send(Message::text(format!("m{i}"))).await.unwrap();
        assert_eq!(next_text(&mut first).await, format!("m{i}"));
    }
    // Another client has a quota of its own.
    let _other = open(&sg, B).await;
    assert_eq!(upstream.accepted(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_holds_its_upstream_slot_until_either_side_closes() {
    let upstream = EchoUpstream::start().await;
    let sg = Slidegate::start(&config(upstream.addr, "max_upstream_connections = 2", "", CHAT_RULE));
    let mut a = open(&sg, A).await;
    let mut b = open(&sg, B).await;
    // Both slots are taken by tunnels: a third waits its second, then 503.
    let full = refused(&sg, C, "/chat").await;
    assert_eq!(full.status(), 503);
    assert_eq!(upstream.accepted(), 2);
    // The client closes: its slot comes back, and goes to the next tunnel.
    a.close(None).await.unwrap();
    closed(&mut a).await;
    let _c = reopen(&sg, C).await;
    assert_eq!(status(&handshake(&sg, D, "/chat").await), 503);
    // The upstream closes: the same.
    b.send(Message::text("close-me")).await.unwrap();
    closed(&mut b).await;
    let _d = reopen(&sg, D).await;
    assert_eq!(status(&handshake(&sg, A, "/chat").await), 503);
    assert_eq!(upstream.accepted(), 4);
}

/// A tunnel from `from`, retried (for 2 s at most) while the slot and the
/// share just freed are still being given back: 503 while the pool is full,
/// 429 while the client's share is.
async fn reopen(sg: &Slidegate, from: Ipv4Addr) -> Client {
    for _ in 0..40 {
        match handshake(sg, from, "/chat").await {
            Ok((mut ws, _)) => {
                assert_eq!(next_text(&mut ws).await, "welcome");
                return ws;
            }
            Err(response) => assert!(matches!(response.status().as_u16(), 429 | 503), "{response:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the freed slot never came back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_holds_at_most_its_share_of_tunnels() {
    let upstream = EchoUpstream::start().await;
    let server = "max_upstream_connections = 20\nmax_upstream_connections_per_client = 2";
    let sg = Slidegate::start(&config(upstream.addr, server, "", CHAT_RULE));
    let mut first = open(&sg, A).await;
    let _second = open(&sg, A).await;
    let refused = refused(&sg, A, "/chat").await;
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["retry-after"], "1");
    assert!(
        body(&refused).contains("this client already has 2 requests in flight to the upstream"),
        "{}",
        body(&refused)
    );
    // Another client is not held back.
    let _other = open(&sg, B).await;
    first.close(None).await.unwrap();
    closed(&mut first).await;
    let mut again = None;
    for _ in 0..50 {
        match handshake(&sg, A, "/chat").await {
            Ok((ws, _)) => {
                again = Some(ws);
                break;
            }
            Err(response) => assert_eq!(response.status(), 429),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(again.is_some(), "the closed tunnel's share never came back");
    assert_eq!(upstream.accepted(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_tunnel_is_closed_after_websocket_idle_timeout_and_frees_its_slot() {
    let upstream = EchoUpstream::start().await;
    let server = "max_upstream_connections = 1\nwebsocket_idle_timeout = \"1s\"";
    let sg = Slidegate::start(&config(upstream.addr, server, "", CHAT_RULE));
    let mut ws = open(&sg, A).await;
    // Traffic keeps it open past the timeout.
    for i in 0..4 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        ws.send(Message::text(format!("k{i}"))).await.unwrap();
        assert_eq!(next_text(&mut ws).await, format!("k{i}"));
    }
    // Silence closes it, with no close frame (the socket is cut).
    let started = std::time::Instant::now();
    let end = tokio::time::timeout(Duration::from_secs(10), ws.next()).await.expect("closed in time");
    assert!(!matches!(end, Some(Ok(Message::Text(_)))), "{end:?}");
    assert!(started.elapsed() >= Duration::from_millis(900), "{:?}", started.elapsed());
    let _next = reopen(&sg, B).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_refusing_the_upgrade_gives_the_client_its_answer() {
    let upstream = EchoUpstream::start().await;
    let sg = Slidegate::start(&config(upstream.addr, "max_upstream_connections = 1", "", CHAT_RULE));
    let refused = refused(&sg, A, "/chat/refuse").await;
    assert_eq!(refused.status(), 403);
    // tungstenite hands the body over as it came, chunked by hyper.
    assert!(body(&refused).contains("no websockets here"), "{}", body(&refused));
    assert_eq!(refused.headers()["ratelimit"], "\"chat\";r=99;t=60");
    // Its connection (the only slot) is given back.
    let _ws = reopen(&sg, A).await;
}

/// Raw HTTP/1.1 heads, as a hostile client writes them.
fn raw(addr: SocketAddr, head: &str, body: &[u8]) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply);
    let reply = String::from_utf8_lossy(&reply).into_owned();
    let status = reply.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, reply)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_handshakes_are_refused_or_forwarded_as_plain_requests() {
    let plain = common::Upstream::start();
    let sg = Slidegate::start(&config(plain.addr, "", "", CHAT_RULE));
    let addr = sg.addr;
    let ws = "connection: Upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n";
    tokio::task::spawn_blocking(move || {
        // A body after the head would reach the upstream as frames nobody decided.
        let (status, reply) =
            raw(addr, &format!("GET /chat HTTP/1.1\r\nhost: x\r\n{ws}content-length: 5\r\n\r\n"), b"hello");
        assert_eq!(status, 400, "{reply}");
        assert!(reply.contains("a WebSocket handshake carries no body"), "{reply}");
        let (status, _) = raw(
            addr,
            &format!("GET /chat HTTP/1.1\r\nhost: x\r\n{ws}transfer-encoding: chunked\r\n\r\n"),
            b"5\r\nhello\r\n0\r\n\r\n",
        );
        assert_eq!(status, 400);
        let (status, reply) = raw(addr, &format!("POST /chat HTTP/1.1\r\nhost: x\r\n{ws}content-length: 0\r\n\r\n"), b"");
        assert_eq!(status, 400);
        assert!(reply.contains("a WebSocket handshake is a GET"), "{reply}");
        let (status, reply) = raw(addr, &format!("GET /chat HTTP/1.0\r\nhost: x\r\n{ws}\r\n"), b"");
        assert_eq!(status, 400, "{reply}");
        // An upgrade to anything else is ignored: a plain request, answered by the upstream.
        let h2c = "GET /chat HTTP/1.1\r\nhost: x\r\nconnection: Upgrade, HTTP2-Settings, close\r\nupgrade: h2c\r\nhttp2-settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n";
        let (status, reply) = raw(addr, h2c, b"");
        assert_eq!(status, 200, "{reply}");
        assert!(reply.ends_with("GET /chat xff=127.0.0.1"), "{reply}");
        assert!(!reply.to_ascii_lowercase().contains("upgrade"), "{reply}");
        // Upgrade without Connection naming it: ignored too.
        let (status, _) = raw(addr, "GET /chat HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\nconnection: close\r\n\r\n", b"");
        assert_eq!(status, 200);
    })
    .await
    .unwrap();
    // Only the plain ones reached the upstream: the two ignored upgrades.
    assert_eq!(plain.hits(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_while_redis_is_down_follows_the_rules_failure_policy() {
    let upstream = EchoUpstream::start().await;
    let mut redis = RedisServer::spawn();
    let rules = format!(
        "{CHAT_RULE}\n[[rules]]\nname = \"strict\"\npath = \"/strict\"\non_error = \"deny\"\nlimits = [{{ limit = 100, window = \"60s\", algorithm = \"sliding_log\" }}]\n"
    );
    let sg = Slidegate::start(&config(upstream.addr, "", &redis_store(&redis), &rules));
    let (_up, response) = handshake(&sg, A, "/strict").await.unwrap();
    assert_eq!(response.headers()["ratelimit"], "\"strict\";r=99;t=60");
    redis.kill();
    // Fails open: tunnelled, without rate limit headers.
    let (mut ws, response) = handshake(&sg, A, "/chat").await.unwrap();
    assert_eq!(response.status(), 101);
    assert!(response.headers().get("ratelimit").is_none());
    assert_eq!(next_text(&mut ws).await, "welcome");
    // Fails closed: 503, and the upstream never sees it.
    let refused = refused(&sg, A, "/strict").await;
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");
    assert_eq!(upstream.accepted(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_instance_opens_no_tunnels() {
    let upstream = EchoUpstream::start().await;
    let sg = Slidegate::start(&config(
        upstream.addr,
        "drain_delay = \"5s\"\nshutdown_grace = \"10s\"",
        "",
        CHAT_RULE,
    ));
    let mut open_before = open(&sg, A).await;
    let pid = sg.child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    // Within the drain delay the listener still accepts; a handshake gets 503.
    let mut refused_now = None;
    for _ in 0..40 {
        match handshake(&sg, B, "/chat").await {
            Err(response) => {
                refused_now = Some(response);
                break;
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(25)).await,
        }
    }
    let refused_now = refused_now.expect("a handshake refused while draining");
    assert_eq!(refused_now.status(), 503);
    assert_eq!(refused_now.headers()["retry-after"], "1");
    assert!(body(&refused_now).contains("opens no WebSocket tunnels"), "{}", body(&refused_now));
    // The tunnel opened before goes on until the shutdown.
    open_before.send(Message::text("still here")).await.unwrap();
    assert_eq!(next_text(&mut open_before).await, "still here");
}
