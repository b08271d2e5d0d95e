//! gRPC through `slidegate serve`, end to end: a tonic upstream (HTTP/2 in
//! clear, `upstream_http2 = true`), a tonic client and Python's grpcio (a
//! client not written here), unary and server-streaming calls, trailers, and
//! denials read by the clients as gRPC statuses.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use common::{config_head, redis_store, RedisServer, Slidegate, SECRET_ENV};
use futures_util::{Stream, StreamExt};
use tonic::{Code, Status};

// ------------------------------------------------------------ the messages

/// `message Item { string name = 1; uint32 count = 2; }`
#[derive(Clone, PartialEq, prost::Message)]
struct Item {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(uint32, tag = "2")]
    count: u32,
}

/// `message Total { string name = 1; uint32 count = 2; }`
#[derive(Clone, PartialEq, prost::Message)]
struct Total {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(uint32, tag = "2")]
    count: u32,
}

const ADD: &str = "/shop.Cart/Add";
const WATCH: &str = "/shop.Cart/Watch";
const FAIL: &str = "/shop.Cart/Fail";

// ------------------------------------------------------------ the upstream

/// `service shop.Cart { rpc Add(Item) returns (Total); rpc Watch(Item)
/// returns (stream Total); rpc Fail(Item) returns (Total); }`: `Add` doubles
/// the count; `Watch` streams `count` totals, then ends with `ABORTED` and
/// trailer metadata; `Fail` answers `INVALID_ARGUMENT` with trailer metadata.
/// Counts the calls that reached it.
#[derive(Clone)]
struct Cart {
    calls: Arc<AtomicUsize>,
}

impl tonic::server::NamedService for Cart {
    const NAME: &'static str = "shop.Cart";
}

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;
type Totals = Pin<Box<dyn Stream<Item = Result<Total, Status>> + Send>>;

fn with_detail(mut status: Status) -> Status {
    status.metadata_mut().insert("x-detail", "from the upstream".parse().unwrap());
    status
}

struct Unary(&'static str);

impl tonic::server::UnaryService<Item> for Unary {
    type Response = Total;
    type Future = BoxFuture<Result<tonic::Response<Total>, Status>>;

    fn call(&mut self, request: tonic::Request<Item>) -> Self::Future {
        let path = self.0;
        Box::pin(async move {
            let item = request.into_inner();
            if path == FAIL {
                return Err(with_detail(Status::invalid_argument("bad item")));
            }
            let mut response = tonic::Response::new(Total { name: item.name, count: item.count * 2 });
            response.metadata_mut().insert("x-upstream", "cart".parse().unwrap());
            Ok(response)
        })
    }
}

struct Watch;

impl tonic::server::ServerStreamingService<Item> for Watch {
    type Response = Total;
    type ResponseStream = Totals;
    type Future = BoxFuture<Result<tonic::Response<Totals>, Status>>;

    fn call(&mut self, request: tonic::Request<Item>) -> Self::Future {
        Box::pin(async move {
            let item = request.into_inner();
            let totals = (1..=item.count).map(move |i| Ok(Total { name: item.name.clone(), count: i }));
            let end =
                std::iter::once(Err(with_detail(Status::aborted(format!("done after {}", item.count)))));
            let stream: Totals = Box::pin(futures_util::stream::iter(totals.chain(end)));
            Ok(tonic::Response::new(stream))
        })
    }
}

impl<B> tonic::codegen::Service<http::Request<B>> for Cart
where
    B: tonic::codegen::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            let codec = tonic_prost::ProstCodec::<Total, Item>::default();
            let mut grpc = tonic::server::Grpc::new(codec);
            Ok(match request.uri().path() {
                ADD => grpc.unary(Unary(ADD), request).await,
                FAIL => grpc.unary(Unary(FAIL), request).await,
                WATCH => grpc.server_streaming(Watch, request).await,
                _ => Status::unimplemented("no such method").into_http(),
            })
        })
    }
}

/// The upstream, serving HTTP/2 in clear (prior knowledge) on a free port.
async fn start_cart() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let cart = Cart { calls: Arc::clone(&calls) };
    tokio::spawn(async move {
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        tonic::transport::Server::builder().add_service(cart).serve_with_incoming(incoming).await.unwrap();
    });
    (addr, calls)
}

// ------------------------------------------------------------ the client

/// A tonic client of `shop.Cart` at `addr` (HTTP/2 prior knowledge).
struct CartClient {
    grpc: tonic::client::Grpc<tonic::transport::Channel>,
}

impl CartClient {
    async fn connect(addr: SocketAddr) -> CartClient {
        let channel =
            tonic::transport::Endpoint::try_from(format!("http://{addr}")).unwrap().connect().await.unwrap();
        CartClient { grpc: tonic::client::Grpc::new(channel) }
    }

    async fn unary(&mut self, path: &'static str, item: Item) -> Result<tonic::Response<Total>, Status> {
        self.grpc.ready().await.unwrap();
        let codec = tonic_prost::ProstCodec::<Item, Total>::default();
        self.grpc.unary(tonic::Request::new(item), http::uri::PathAndQuery::from_static(path), codec).await
    }

    async fn watch(&mut self, item: Item) -> Result<tonic::Response<tonic::Streaming<Total>>, Status> {
        self.grpc.ready().await.unwrap();
        let codec = tonic_prost::ProstCodec::<Item, Total>::default();
        let path = http::uri::PathAndQuery::from_static(WATCH);
        self.grpc.server_streaming(tonic::Request::new(item), path, codec).await
    }
}

fn item(name: &str, count: u32) -> Item {
    Item { name: name.to_owned(), count }
}

fn config(upstream: SocketAddr, server: &str, store: &str, rules: &str) -> String {
    let server = format!("upstream_http2 = true\n{server}");
    format!(
        "{head}\n[identity]\nip_hash_secret_env = \"{SECRET_ENV}\"\n\n{rules}",
        head = config_head(upstream, &server, store)
    )
}

/// `Add` limited to 2 a minute; the rest of the service to 100.
const RULES: &str = r#"
[[rules]]
name = "add"
path = "/shop.Cart/Add"
limits = [{ limit = 2, window = "60s", algorithm = "sliding_log" }]

[[rules]]
name = "cart"
path = "/shop.Cart/*"
limits = [{ limit = 100, window = "60s", algorithm = "sliding_log" }]
"#;

fn metadata<'a>(status: &'a Status, name: &str) -> &'a str {
    status.metadata().get(name).unwrap_or_else(|| panic!("no {name} in {status:?}")).to_str().unwrap()
}

// ------------------------------------------------------------ the tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_and_server_streaming_calls_pass_through_with_their_trailers() {
    let (upstream, calls) = start_cart().await;
    let sg = Slidegate::start(&config(upstream, "", "", RULES));
    let mut client = CartClient::connect(sg.addr).await;
    let response = client.unary(ADD, item("apple", 21)).await.unwrap();
    assert_eq!(response.get_ref(), &Total { name: "apple".into(), count: 42 });
    let headers = response.metadata();
    assert_eq!(headers.get("x-upstream").unwrap(), "cart");
    assert_eq!(headers.get("ratelimit").unwrap(), "\"add\";r=1;t=60");
    // A stream of five, then the upstream's own status and trailer metadata.
    let mut stream = client.watch(item("pear", 5)).await.unwrap().into_inner();
    let mut counts = Vec::new();
    let end = loop {
        match stream.next().await {
            Some(Ok(total)) => counts.push(total.count),
            Some(Err(status)) => break status,
            None => panic!("the stream ended without the upstream's status"),
        }
    };
    assert_eq!(counts, [1, 2, 3, 4, 5]);
    assert_eq!((end.code(), end.message()), (Code::Aborted, "done after 5"));
    assert_eq!(metadata(&end, "x-detail"), "from the upstream");
    // A unary error: trailers-only from the upstream, passed as it is.
    let failed = client.unary(FAIL, item("x", 1)).await.unwrap_err();
    assert_eq!((failed.code(), failed.message()), (Code::InvalidArgument, "bad item"));
    assert_eq!(metadata(&failed, "x-detail"), "from the upstream");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_call_is_resource_exhausted_with_the_wait_and_the_rate_limit_metadata() {
    let (upstream, calls) = start_cart().await;
    let sg = Slidegate::start(&config(upstream, "", "", RULES));
    let mut client = CartClient::connect(sg.addr).await;
    for _ in 0..2 {
        client.unary(ADD, item("apple", 1)).await.unwrap();
    }
    let denied = client.unary(ADD, item("apple", 1)).await.unwrap_err();
    assert_eq!(denied.code(), Code::ResourceExhausted);
    assert_eq!(denied.message(), "policy \"add\" allows 2 requests per 60 s; retry in 60 s");
    assert_eq!(metadata(&denied, "ratelimit"), "\"add\";r=0;t=60");
    assert_eq!(metadata(&denied, "retry-after"), "60");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    // The connection goes on: other methods, under their own rule, still pass.
    let mut stream = client.watch(item("pear", 2)).await.unwrap().into_inner();
    assert_eq!(stream.next().await.unwrap().unwrap().count, 1);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_denial_status_unavailable_and_a_store_failing_closed_are_unavailable() {
    let (upstream, calls) = start_cart().await;
    let mut redis = RedisServer::spawn();
    let rules = format!(
        "{RULES}\n[[rules]]\nname = \"strict\"\npath = \"/shop.Strict/*\"\non_error = \"deny\"\nlimits = [{{ limit = 9, window = \"60s\" }}]\n"
    );
    // The strict rule comes after `/shop.Cart/*`: it is reached through its own service.
    let sg = Slidegate::start(&config(
        upstream,
        "grpc_denial_status = \"unavailable\"",
        &redis_store(&redis),
        &rules,
    ));
    let mut client = CartClient::connect(sg.addr).await;
    for _ in 0..2 {
        client.unary(ADD, item("apple", 1)).await.unwrap();
    }
    let denied = client.unary(ADD, item("apple", 1)).await.unwrap_err();
    assert_eq!(denied.code(), Code::Unavailable);
    assert!(denied.message().ends_with("retry in 60 s"), "{denied:?}");
    redis.kill();
    let channel =
        tonic::transport::Endpoint::try_from(format!("http://{}", sg.addr)).unwrap().connect().await.unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let codec = tonic_prost::ProstCodec::<Item, Total>::default();
    let path = http::uri::PathAndQuery::from_static("/shop.Strict/Add");
    let closed = grpc.unary(tonic::Request::new(item("x", 1)), path, codec).await.unwrap_err();
    assert_eq!(closed.code(), Code::Unavailable);
    assert!(closed.message().contains("the rate limit store is unavailable"), "{closed:?}");
    assert_eq!(metadata(&closed, "retry-after"), "1");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

// ------------------------------------------------------------ Python grpcio

/// Python with grpcio, in a virtual environment kept outside the source
/// tree (`~/.cache/slidegate-grpcio`), made when missing. `.ci/run` makes it
/// too; without PyPI this fails, loudly, rather than skipping.
fn grpcio_python() -> PathBuf {
    let home = std::env::var_os("HOME").expect("HOME is set");
    let venv = PathBuf::from(home).join(".cache/slidegate-grpcio/venv");
    let python = venv.join("bin/python");
    let has_grpcio = |python: &PathBuf| {
        Command::new(python).args(["-c", "import grpc"]).status().is_ok_and(|s| s.success())
    };
    if has_grpcio(&python) {
        return python;
    }
    let made = Command::new("python3").arg("-m").arg("venv").arg(&venv).status();
    assert!(
        made.is_ok_and(|s| s.success()),
        "cannot make a Python venv at {}: install python3-venv (`.ci/run` does)",
        venv.display()
    );
    let pip = Command::new(venv.join("bin/pip")).args(["install", "--quiet", "grpcio"]).output().unwrap();
    assert!(
        pip.status.success() && has_grpcio(&python),
        "PIP COULD NOT INSTALL grpcio (is PyPI reachable?): the grpcio test cannot run:\n{}",
        String::from_utf8_lossy(&pip.stderr)
    );
    python
}

/// The client: raw bytes in and out (protobuf written by hand: field 1 a
/// string, field 2 a varint), one line printed per outcome.
const GRPCIO_CLIENT: &str = r#"
import sys, grpc
channel = grpc.insecure_channel(sys.argv[1])
add = channel.unary_unary("/shop.Cart/Add")
watch = channel.unary_stream("/shop.Cart/Watch")
def item(name, count):
    return b"\x0a" + bytes([len(name)]) + name.encode() + b"\x10" + bytes([count])
for _ in range(3):
    try:
        reply, call = add.with_call(item("fig", 4), timeout=10)
        print("ok", reply.hex(), dict(call.initial_metadata()).get("ratelimit"))
    except grpc.RpcError as e:
        meta = dict(e.trailing_metadata() or ())
        print("err", e.code().name, repr(e.details()), meta.get("ratelimit"), meta.get("retry-after"))
stream = watch(item("fig", 3), timeout=10)
try:
    for total in stream:
        print("total", total.hex())
except grpc.RpcError as e:
    print("end", e.code().name, repr(e.details()), dict(e.trailing_metadata() or ()).get("x-detail"))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_grpcio_reads_answers_streams_and_the_denial() {
    let python = grpcio_python();
    let (upstream, calls) = start_cart().await;
    let sg = Slidegate::start(&config(upstream, "", "", RULES));
    let addr = sg.addr.to_string();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python).args(["-c", GRPCIO_CLIENT, &addr]).output().unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    // Total { name: "fig", count: 8 }, with the rate limit headers as metadata.
    assert_eq!(
        lines,
        [
            "ok 0a036669671008 \"add\";r=1;t=60",
            "ok 0a036669671008 \"add\";r=0;t=60",
            "err RESOURCE_EXHAUSTED 'policy \"add\" allows 2 requests per 60 s; retry in 60 s' \"add\";r=0;t=60 60",
            "total 0a036669671001",
            "total 0a036669671002",
            "total 0a036669671003",
            "end ABORTED 'done after 3' from the upstream",
        ]
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_post_saying_grpc_gets_a_grpc_denial() {
    let (upstream, calls) = start_cart().await;
    let sg = Slidegate::start(&config(upstream, "", "", RULES));
    let addr = sg.addr;
    tokio::task::spawn_blocking(move || {
        let grpc = [("content-type", "application/grpc")];
        // Over HTTP/1.1 the upstream (HTTP/2 only to slidegate) answers what it can; spend the quota.
        for _ in 0..2 {
            common::request(addr, "POST", ADD, &grpc, b"");
        }
        let denied = common::request(addr, "POST", ADD, &grpc, b"");
        assert_eq!(denied.status, 200, "{denied:?}");
        assert_eq!(denied.header("grpc-status"), Some("8"));
        assert_eq!(denied.header("content-type"), Some("application/grpc"));
        assert_eq!(denied.header("ratelimit"), Some("\"add\";r=0;t=60"));
        assert_eq!(denied.body, "");
        // A GET claiming to be gRPC gets HTTP's answer: a cache could keep a 200.
        let get = common::request(addr, "GET", ADD, &grpc, b"");
        assert_eq!(get.status, 429, "{get:?}");
        assert_eq!(get.header("grpc-status"), None);
        assert_eq!(get.header("content-type"), Some("application/problem+json"));
    })
    .await
    .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}
