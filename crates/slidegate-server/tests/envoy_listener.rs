//! The gRPC listener (`[server] grpc_listen`) as a protocol endpoint, with
//! the `h2` crate's client and raw sockets: an unknown method answered
//! `UNIMPLEMENTED` trailers-only, requests that are not gRPC, HTTP/1.1 on
//! the port, a stream-reset flood bounded by `[server] http2`, a graceful
//! stop with a call in flight, and a reload reaching every worker's calls.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use prost::Message;
use slidegate_server::envoy::proto::{
    Code, Entry, RateLimitDescriptor, RateLimitRequest, RateLimitResponse, SHOULD_RATE_LIMIT,
};
use slidegate_server::{Config, Server};
use tokio::sync::oneshot;

const YAML: &str = "domain: edge\ndescriptors:\n  - key: ip\n    rate_limit:\n      unit: minute\n      requests_per_unit: 10\n";

struct Running {
    grpc: SocketAddr,
    reloader: slidegate_server::Reloader,
    dir: std::path::PathBuf,
    stop: Option<oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

/// `serve` with Envoy's service on the embedded store; `server` adds to `[server]`.
async fn start(server: &str) -> Running {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rl.yaml"), YAML).unwrap();
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\ngrpc_listen = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:9\"\n\
         {server}\n[envoy]\nconfig = \"rl.yaml\"\n"
    );
    let path = dir.path().join("slidegate.toml");
    std::fs::write(&path, &toml).unwrap();
    let config = Config::parse_with_env(&toml, &path, &|_| None).unwrap();
    let server = Server::bind(&config).await.unwrap().reload_from(&path);
    let grpc = server.grpc_addr().unwrap();
    let reloader = server.reloader();
    let (stop, stopped) = oneshot::channel::<()>();
    let served = tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    Running { grpc, reloader, dir: dir.path().to_owned(), stop: Some(stop), served, _dir: dir }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn h2_client(
    addr: SocketAddr,
) -> (h2::client::SendRequest<Bytes>, tokio::task::JoinHandle<Result<(), h2::Error>>) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    (client, tokio::spawn(connection))
}

fn grpc_request(addr: SocketAddr, path: &str) -> http::Request<()> {
    http::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap()
}

/// `request` as one gRPC message: uncompressed, its length, its bytes.
fn framed(request: &RateLimitRequest) -> Bytes {
    let body = request.encode_to_vec();
    let mut framed = BytesMut::with_capacity(5 + body.len());
    framed.extend_from_slice(&[0]);
    framed.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes());
    framed.extend_from_slice(&body);
    framed.freeze()
}

fn ask(ip: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry { key: "ip".into(), value: ip.into() }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

/// The answer to a sent call: its `grpc-status` (from the trailers, or
/// the headers of a trailers-only answer) and its message, if any.
async fn answer(
    response: h2::client::ResponseFuture,
) -> (http::StatusCode, String, Option<RateLimitResponse>) {
    let response = response.await.unwrap();
    let status = response.status();
    if let Some(code) = response.headers().get("grpc-status") {
        let code = code.to_str().unwrap().to_owned();
        assert!(response.body().is_end_stream(), "a trailers-only answer has no body");
        return (status, code, None);
    }
    let mut body = response.into_body();
    let mut data = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        body.flow_control().release_capacity(chunk.len()).unwrap();
        data.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await.unwrap().unwrap();
    let code = trailers["grpc-status"].to_str().unwrap().to_owned();
    let message = (!data.is_empty()).then(|| {
        let mut data = data.freeze();
        assert_eq!(data.get_u8(), 0, "uncompressed");
        let len = data.get_u32() as usize;
        assert_eq!(data.len(), len);
        RateLimitResponse::decode(data).unwrap()
    });
    (status, code, message)
}

/// Sends `request` whole on `client` and reads the answer.
async fn call(
    client: &mut h2::client::SendRequest<Bytes>,
    addr: SocketAddr,
    request: &RateLimitRequest,
) -> (http::StatusCode, String, Option<RateLimitResponse>) {
    let mut ready = client.clone().ready().await.unwrap();
    let (response, mut body) = ready.send_request(grpc_request(addr, SHOULD_RATE_LIMIT), false).unwrap();
    body.send_data(framed(request), true).unwrap();
    *client = ready;
    answer(response).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_method_is_unimplemented_trailers_only_and_the_connection_serves_on() {
    let server = start("threads = 1").await;
    let (mut client, _connection) = h2_client(server.grpc).await;
    for path in
        ["/envoy.service.ratelimit.v3.RateLimitService/Nope", "/grpc.reflection.v1.ServerReflection/X", "/"]
    {
        let (response, _) = client.send_request(grpc_request(server.grpc, path), true).unwrap();
        let response = response.await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
        assert_eq!(response.headers()["grpc-status"], "12", "{path}: UNIMPLEMENTED");
        assert!(response.headers()["grpc-message"].to_str().unwrap().contains("no%20method"), "{path}");
        assert!(response.body().is_end_stream(), "{path}: trailers-only");
    }
    // The same connection then decides a real call.
    let (status, code, message) = call(&mut client, server.grpc, &ask("1.1.1.1")).await;
    let message = message.unwrap();
    assert_eq!((status.as_u16(), code.as_str(), message.overall_code), (200, "0", Code::Ok as i32));
    assert_eq!(message.statuses[0].limit_remaining, 9);
}

/// Sends `body` as the whole body of a `ShouldRateLimit` call with the
/// extra `headers`, and reads the answer.
async fn send_raw(
    client: &mut h2::client::SendRequest<Bytes>,
    addr: SocketAddr,
    headers: &[(&str, &str)],
    body: Bytes,
) -> (http::StatusCode, String, Option<RateLimitResponse>) {
    let mut request = grpc_request(addr, SHOULD_RATE_LIMIT);
    for (name, value) in headers {
        request
            .headers_mut()
            .insert(http::HeaderName::from_bytes(name.as_bytes()).unwrap(), value.parse().unwrap());
    }
    let mut ready = client.clone().ready().await.unwrap();
    let (response, mut stream) = ready.send_request(request, body.is_empty()).unwrap();
    if !body.is_empty() {
        // The answer may come (and the stream close) before the body is sent.
        let _ = stream.send_data(body, true);
    }
    *client = ready;
    answer(response).await
}

/// A malformed call: what it is, its extra headers, its body, the
/// `grpc-status` it gets.
type Malformed<'a> = (&'a str, &'a [(&'a str, &'a str)], Bytes, &'a str);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_calls_get_a_grpc_error_and_charge_nothing() {
    let server = start("threads = 1").await;
    let (mut client, _connection) = h2_client(server.grpc).await;
    let good = framed(&ask("3.3.3.3"));
    let mut compressed = BytesMut::from(&good[..]);
    compressed[0] = 1;
    let mut twice = BytesMut::from(&good[..]);
    twice.extend_from_slice(&good);
    let mut garbage = BytesMut::from(&[0u8, 0, 0, 0, 3][..]);
    garbage.extend_from_slice(&[0xff, 0xff, 0xff]);
    let cases: [Malformed<'_>; 7] = [
        ("no message", &[], Bytes::new(), "13"),
        ("a prefix cut short", &[], good.slice(..3), "13"),
        ("a message cut short", &[], good.slice(..good.len() - 1), "13"),
        ("two messages", &[], twice.freeze(), "13"),
        ("not protobuf", &[], garbage.freeze(), "13"),
        ("the compressed flag", &[], compressed.freeze(), "12"),
        ("gzip", &[("grpc-encoding", "gzip")], good.clone(), "12"),
    ];
    for (what, headers, body, code) in cases {
        let (status, got, message) = send_raw(&mut client, server.grpc, headers, body).await;
        assert_eq!((status.as_u16(), got.as_str(), message), (200, code, None), "{what}");
    }
    // None of them was decided: the real call sees the whole limit, on the
    // same connection.
    let (status, code, message) =
        send_raw(&mut client, server.grpc, &[("grpc-encoding", "identity")], good).await;
    assert_eq!((status.as_u16(), code.as_str()), (200, "0"));
    assert_eq!(message.unwrap().statuses[0].limit_remaining, 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_is_not_grpc_gets_415_and_reaches_no_method() {
    let server = start("threads = 1").await;
    let (mut client, _connection) = h2_client(server.grpc).await;
    // A GET, and a POST of JSON to the method's own path.
    let get = http::Request::get(format!("http://{}/v1/check", server.grpc)).body(()).unwrap();
    let json = http::Request::post(format!("http://{}{SHOULD_RATE_LIMIT}", server.grpc))
        .header("content-type", "application/json")
        .body(())
        .unwrap();
    for request in [get, json] {
        let (response, mut body) = client.send_request(request, false).unwrap();
        // The answer may come (and the stream close) before the body is sent.
        let _ = body.send_data(framed(&ask("2.2.2.2")), true);
        let response = response.await.unwrap();
        assert_eq!(response.status(), 415);
        assert!(response.headers().get("grpc-status").is_none());
    }
    // Nothing was charged: the first real call sees the whole limit.
    let (_, code, message) = call(&mut client, server.grpc, &ask("2.2.2.2")).await;
    assert_eq!((code.as_str(), message.unwrap().statuses[0].limit_remaining), ("0", 9));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_on_the_grpc_port_gets_a_close_and_no_answer() {
    let server = start("threads = 1").await;
    let addr = server.grpc;
    let got = tokio::task::spawn_blocking(move || {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        stream
            .write_all(
                format!(
                    "POST {SHOULD_RATE_LIMIT} HTTP/1.1\r\nHost: x\r\ncontent-type: application/grpc\r\n\
                     content-length: 0\r\n\r\n"
                )
                .as_bytes(),
            )
            .unwrap();
        let mut got = Vec::new();
        match stream.read_to_end(&mut got) {
            Ok(_) => got,
            Err(err) if err.kind() == std::io::ErrorKind::ConnectionReset => got,
            Err(err) => panic!("the server kept the connection open: {err}; got {got:?}"),
        }
    })
    .await
    .unwrap();
    // At most HTTP/2's SETTINGS and GOAWAY: never an HTTP/1.1 answer.
    assert!(!String::from_utf8_lossy(&got).contains("HTTP/1.1"), "{got:?}");
    if !got.is_empty() {
        assert_eq!(got[3], 4, "the server's first frame is SETTINGS: {got:?}");
    }
    // The port still serves gRPC.
    let (mut client, _connection) = h2_client(server.grpc).await;
    let (_, code, _) = call(&mut client, server.grpc, &ask("3.3.3.3")).await;
    assert_eq!(code, "0");
}

/// Opens and at once resets up to `streams` calls on one connection: how
/// many were sent, and how the connection ended (or `Ok` when it did not
/// end within a second of the last).
async fn reset_flood(addr: SocketAddr, streams: usize) -> (usize, Result<(), h2::Error>) {
    let (mut client, connection) = h2_client(addr).await;
    let mut sent = 0;
    for _ in 0..streams {
        client = match client.clone().ready().await {
            Ok(client) => client,
            Err(_) => break,
        };
        match client.send_request(grpc_request(addr, SHOULD_RATE_LIMIT), false) {
            Ok((_, mut stream)) => stream.send_reset(h2::Reason::CANCEL),
            Err(_) => break,
        }
        sent += 1;
    }
    drop(client);
    match tokio::time::timeout(Duration::from_secs(1), connection).await {
        Ok(ended) => (sent, ended.unwrap()),
        Err(_) => (sent, Ok(())),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_reset_flood_gets_goaway_within_the_http2_bounds() {
    // The control: with the bounds raised the same loop is not cut.
    let raised = start(
        "threads = 1\nhttp2 = { max_pending_reset_streams = 1000000, max_local_error_resets = 1000000 }",
    )
    .await;
    let (sent, ended) = reset_flood(raised.grpc, 2_000).await;
    assert_eq!(sent, 2_000);
    assert!(ended.is_ok(), "{ended:?}");

    let server = start("threads = 1").await;
    let (sent, ended) = reset_flood(server.grpc, 10_000).await;
    let err = ended.expect_err("the server kept a resetting connection open");
    // GOAWAY(ENHANCE_YOUR_CALM), or the close seen first by a client still writing.
    if err.is_go_away() {
        assert_eq!(err.reason(), Some(h2::Reason::ENHANCE_YOUR_CALM), "{err:?}");
    } else {
        assert!(err.is_io(), "neither GOAWAY nor a close: {err:?}");
    }
    assert!(sent < 10_000, "all {sent} streams were reset without a GOAWAY");
    // Other clients are served.
    let (mut client, _connection) = h2_client(server.grpc).await;
    let (_, code, message) = call(&mut client, server.grpc, &ask("4.4.4.4")).await;
    assert_eq!((code.as_str(), message.unwrap().statuses[0].limit_remaining), ("0", 9));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_finishes_the_call_in_flight_then_refuses_connections() {
    let mut server = start("threads = 1\nshutdown_grace = \"10s\"").await;
    let addr = server.grpc;
    let (client, connection) = h2_client(addr).await;
    let mut ready = client.ready().await.unwrap();
    // Half the message sent: the call is open when the stop comes.
    let message = framed(&ask("5.5.5.5"));
    let (response, mut body) = ready.send_request(grpc_request(addr, SHOULD_RATE_LIMIT), false).unwrap();
    body.send_data(message.slice(..4), false).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let stopped = Instant::now();
    server.stop.take().unwrap().send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!server.served.is_finished(), "the server ended with a call open");
    body.send_data(message.slice(4..), true).unwrap();
    let (status, code, message) = answer(response).await;
    let message = message.unwrap();
    assert_eq!((status.as_u16(), code.as_str()), (200, "0"));
    assert_eq!((message.overall_code, message.statuses[0].limit_remaining), (Code::Ok as i32, 9));
    // The server told the client to go (GOAWAY), closed once the call was
    // answered, and ended long before its grace.
    let ended = tokio::time::timeout(Duration::from_secs(5), connection).await.unwrap().unwrap();
    assert!(ended.is_ok() || ended.as_ref().unwrap_err().is_go_away(), "{ended:?}");
    tokio::time::timeout(Duration::from_secs(5), &mut server.served).await.unwrap().unwrap();
    assert!(stopped.elapsed() < Duration::from_secs(5), "{:?}", stopped.elapsed());
    let refused = tokio::net::TcpStream::connect(addr).await;
    assert!(refused.is_err(), "the listener accepts after the stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_reaches_the_calls_of_every_worker() {
    let server = start("threads = 2").await;
    // Two connections: the acceptor deals them to the two workers in turn.
    let (mut first, _c1) = h2_client(server.grpc).await;
    let (mut second, _c2) = h2_client(server.grpc).await;
    for (client, ip) in [(&mut first, "6.6.6.1"), (&mut second, "6.6.6.2")] {
        let (_, _, message) = call(client, server.grpc, &ask(ip)).await;
        assert_eq!(message.unwrap().statuses[0].limit_remaining, 9);
    }
    std::fs::write(server.dir.join("rl.yaml"), YAML.replace("requests_per_unit: 10", "requests_per_unit: 4"))
        .unwrap();
    server.reloader.reload().unwrap();
    for (client, ip) in [(&mut first, "6.6.6.1"), (&mut second, "6.6.6.2")] {
        let (_, _, message) = call(client, server.grpc, &ask(ip)).await;
        let status = &message.unwrap().statuses[0];
        assert_eq!(
            (status.current_limit.as_ref().unwrap().requests_per_unit, status.limit_remaining),
            (4, 3),
            "{ip}"
        );
    }
}
