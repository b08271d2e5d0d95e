//! One worker thread: serves the connections the acceptor deals it, and
//! routes each request to the admin endpoints, the proxy, or (on `[server]
//! grpc_listen`) Envoy's rate limit service.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use slidegate_http::config::TimeSpan;

use super::body::ServeBody;
use super::connection::Protocols;
use super::listener_caps::ConnectionSlot;
use super::{admin, proxy, State};
use crate::envoy::GrpcRoutes;

/// A connection handed to a worker thread, the listener it came in on, and
/// its place under that listener's cap, held until it closes.
pub(super) type Accepted = (std::net::TcpStream, SocketAddr, Listener, ConnectionSlot);

/// Which listener accepted a connection: what its requests may reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Listener {
    /// `[server] listen`: the proxy (and the admin endpoints with `admin_on_public`).
    Public,
    /// `[server] admin_listen`: the admin endpoints only.
    Admin,
    /// `[server] grpc_listen`: Envoy's rate limit service and gRPC health, HTTP/2 only.
    Grpc,
    /// `[server] auth_listen`: a proxy's forward-auth hook (`auth.rs`).
    Auth,
}

/// How each listener's connections are spoken to (TLS, HTTP/1.1, HTTP/2).
#[derive(Clone)]
pub(super) struct ListenerProtocols {
    pub(super) public: Arc<Protocols>,
    pub(super) admin: Arc<Protocols>,
    pub(super) auth: Arc<Protocols>,
    pub(super) grpc: Arc<Protocols>,
}

/// How a worker's shutdown ended.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct WorkerEnd {
    /// Connections still open when the grace period ended, closed unfinished.
    pub(super) connections_cut: usize,
    /// Charges of requests whose clients left, made during the shutdown.
    pub(super) charges_settled: usize,
    /// Such charges still pending when the grace period ended: not made.
    pub(super) charges_unsettled: usize,
}

/// Serves the connections it is dealt until the acceptor closes the channel,
/// then waits up to `grace` for them to finish, and for the charges of
/// requests whose clients left (`State::settling`): the runtime's tasks
/// end with the thread.
pub(super) async fn worker(
    mut connections: tokio::sync::mpsc::UnboundedReceiver<Accepted>,
    state: Arc<State>,
    grace: TimeSpan,
    protocols: ListenerProtocols,
    grpc: Option<GrpcRoutes>,
) -> WorkerEnd {
    // Turned true when the acceptor stops: every connection finishes its
    // requests and closes.
    let (drain, draining) = tokio::sync::watch::channel(false);
    let open = tokio_util::task::TaskTracker::new();
    // hyper arms a 30 s header-read timer per request (slowloris protection).
    // tokio wakes its driver through an eventfd whenever a new timer is due
    // before every other one — with no other timer, that is every request.
    // A timer that always fires within a second keeps the driver's next wake
    // early, so arming the 30 s timers costs no system call.
    let heartbeat = tokio::spawn(async {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tick.tick().await;
        }
    });
    while let Some((stream, peer, listener, slot)) = connections.recv().await {
        let stream = match tokio::net::TcpStream::from_std(stream) {
            Ok(stream) => stream,
            Err(err) => {
                tracing::warn!(%err, "cannot register a connection");
                continue;
            }
        };
        let watcher = draining.clone();
        match listener {
            Listener::Grpc => {
                // Dealt only when the listener exists, which gives every worker routes.
                let Some(routes) = grpc.clone() else { continue };
                let protocols = Arc::clone(&protocols.grpc);
                open.spawn(async move {
                    protocols.serve(stream, grpc_service(routes), watcher, peer).await;
                    drop(slot);
                });
            }
            Listener::Auth => {
                let state = Arc::clone(&state);
                let service = service_fn(move |request: Request<Incoming>| {
                    let state = Arc::clone(&state);
                    async move { Ok::<_, Infallible>(super::auth::handle(&state, request, peer).await) }
                });
                let protocols = Arc::clone(&protocols.auth);
                open.spawn(async move {
                    protocols.serve(stream, service, watcher, peer).await;
                    drop(slot);
                });
            }
            Listener::Public | Listener::Admin => {
                let service = http_service(Arc::clone(&state), listener == Listener::Admin, peer);
                let protocols = Arc::clone(if listener == Listener::Admin {
                    &protocols.admin
                } else {
                    &protocols.public
                });
                open.spawn(async move {
                    protocols.serve(stream, service, watcher, peer).await;
                    drop(slot);
                });
            }
        }
    }
    heartbeat.abort();
    // A grace too long to add (a `TimeSpan` built in code) is as good as none.
    let now = tokio::time::Instant::now();
    let deadline = now.checked_add(grace.get()).unwrap_or(now + Duration::from_secs(100 * 365 * 86_400));
    let _ = drain.send(true);
    open.close();
    let finished = tokio::time::timeout_at(deadline, open.wait()).await.is_ok();
    let connections_cut = if finished { 0 } else { open.len() };
    state.settling.close();
    let pending = state.settling.len();
    let settled = tokio::time::timeout_at(deadline, state.settling.wait()).await.is_ok();
    let charges_unsettled = if settled { 0 } else { state.settling.len() };
    WorkerEnd {
        connections_cut,
        charges_settled: pending.saturating_sub(charges_unsettled),
        charges_unsettled,
    }
}

/// The service of one connection to the public listener, or with
/// `admin_only` to the admin listener.
fn http_service(
    state: Arc<State>,
    admin_only: bool,
    peer: SocketAddr,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<ServeBody>,
    Error = Infallible,
    Future = impl std::future::Future<Output = Result<Response<ServeBody>, Infallible>> + Send,
> + Send
       + 'static {
    let peer_value = proxy::forwarded_for_value(peer);
    service_fn(move |request: Request<Incoming>| {
        let state = Arc::clone(&state);
        let peer_value = peer_value.clone();
        // Boxed: a request's future is kilobytes (the admission, the
        // exchange, the charge), and hyper and the activity tracking move
        // the future they hold: a box moves as a pointer (BENCHMARKS.md,
        // "Where a proxied request's CPU goes").
        Box::pin(async move {
            let mut response = if admin_only {
                admin::handle_only_admin(&state, request).await
            } else {
                handle(&state, request, peer, &peer_value).await
            };
            // A tunnel's 101, decided before the drain began, keeps its
            // `Connection: upgrade`: the tunnel runs until the shutdown.
            if state.readiness.is_draining() && response.status() != StatusCode::SWITCHING_PROTOCOLS {
                // Keep-alive clients reconnect: elsewhere, once the
                // load balancer has taken this instance out.
                response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            Ok::<_, Infallible>(response)
        })
    })
}

/// The service of one connection to the gRPC listener. A request that is
/// not a gRPC call (no `application/grpc` content type, or not a `POST`)
/// gets 415, as the gRPC over HTTP/2 spec asks, and reaches no method.
fn grpc_service(
    routes: GrpcRoutes,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<tonic::body::Body>,
    Error = Infallible,
    Future = impl std::future::Future<Output = Result<Response<tonic::body::Body>, Infallible>> + Send,
> + Send
       + 'static {
    let routes = Arc::new(routes);
    service_fn(move |request: Request<Incoming>| {
        let routes = Arc::clone(&routes);
        async move {
            if !super::grpc::is_grpc(request.method(), request.headers()) {
                return Ok(not_grpc());
            }
            Ok(routes.call(request).await)
        }
    })
}

/// 415 to a request on the gRPC listener that is not a gRPC call.
fn not_grpc() -> Response<tonic::body::Body> {
    let mut response =
        Response::new(tonic::body::Body::new(http_body_util::Full::new(bytes::Bytes::from_static(
            b"this listener serves gRPC only: POST with content-type application/grpc\n",
        ))));
    *response.status_mut() = StatusCode::UNSUPPORTED_MEDIA_TYPE;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

/// One request on the public listener: refused when its framing is
/// ambiguous, an admin endpoint when they are served here, otherwise decided
/// and forwarded.
async fn handle(
    state: &State,
    mut request: Request<Incoming>,
    peer: SocketAddr,
    peer_value: &http::HeaderValue,
) -> Response<ServeBody> {
    if let Some(refusal) = refuse(&mut request) {
        return refusal;
    }
    if state.admin_here {
        if let Some(endpoint) = admin::endpoint(state, request.uri().path()) {
            // Boxed: the admin endpoints' futures (a reload, a check) are
            // kilobytes, which every proxied request's future would carry.
            return Box::pin(admin::handle(state, endpoint, request)).await;
        }
    }
    proxy::forward(state, request, peer, peer_value).await
}

/// The protocol checks of a request before anything else reads it; may
/// rewrite `Host` (absolute form).
fn refuse(request: &mut Request<Incoming>) -> Option<Response<ServeBody>> {
    if request.method() == Method::CONNECT {
        // A reverse proxy to one upstream opens no tunnels.
        let mut response =
            problem(StatusCode::METHOD_NOT_ALLOWED, "CONNECT is not supported", request.uri().path());
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"));
        return Some(response);
    }
    if request.headers().get_all(header::HOST).iter().nth(1).is_some() {
        // RFC 9112 §3.2: two Host headers are a bad request; which one a
        // server behind believes is anybody's guess.
        return Some(problem(StatusCode::BAD_REQUEST, "more than one Host header", request.uri().path()));
    }
    if request.version() == http::Version::HTTP_11 && !request.headers().contains_key(header::HOST) {
        // RFC 9112 §3.2: a server must answer 400 to an HTTP/1.1 request
        // without Host, absolute-form included (its client must send both).
        // HTTP/1.0 has no such rule: the proxy gives it the upstream's.
        return Some(problem(
            StatusCode::BAD_REQUEST,
            "an HTTP/1.1 request needs a Host header (RFC 9112 §3.2)",
            request.uri().path(),
        ));
    }
    if let Some(authority) = request.uri().authority() {
        if authority.as_str().contains('@') {
            // `http://user:pass@host/`: RFC 9110 §4.2.4 deprecates user
            // information in http URIs; forwarded as Host, the upstream
            // would read a host named `user:pass@host`.
            return Some(problem(
                StatusCode::BAD_REQUEST,
                "the request target carries user information (user@host): refused",
                request.uri().path(),
            ));
        }
        // RFC 9112 §3.2.2: with an absolute-form target the target's
        // authority is the host; a `Host` saying otherwise is ignored and
        // replaced, so the upstream sees the host the request was decided for.
        match HeaderValue::from_str(authority.as_str()) {
            Ok(host) => {
                request.headers_mut().remove(header::HOST);
                request.headers_mut().insert(header::HOST, host);
            }
            Err(_) => {
                return Some(problem(StatusCode::BAD_REQUEST, "invalid request target", request.uri().path()))
            }
        }
    }
    None
}

fn problem(status: StatusCode, detail: &str, path: &str) -> Response<ServeBody> {
    let title = status.canonical_reason().unwrap_or("Bad Request");
    let mut response =
        super::boxed(slidegate_http::headers::problem(status, "about:blank", title, detail, Some(path)));
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}
