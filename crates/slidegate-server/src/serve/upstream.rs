//! The connections of one worker thread to the upstream: HTTP/1.1 keep-alive,
//! reused once a response body has been read to its end.
//!
//! Each worker thread has its own pool, so the lock below is never contended;
//! it is there because tasks must be `Send`. A connection goes back to the
//! pool when its response body ends; a body dropped half-read takes its
//! connection with it (HTTP/1.1 cannot reuse it).
//!
//! Open upstream connections, idle or busy, are bounded over all threads by
//! one set of [`Slots`] (`[server] max_upstream_connections`): each
//! connection holds a slot until its socket closes, and a request that needs
//! a new connection when none is left waits briefly (served before others if
//! its client holds fewer), then is answered 503. Each
//! request body is wrapped in a [`RequestBody`], whose idle timeout and
//! minimum rate close the connection (and free its permit) of a client that
//! stops sending or trickles.
//!
//! So that a few clients cannot take the whole pool, each client (its
//! address as the limits group it: after trusted proxies, IPv6 by prefix)
//! may have at most `max_upstream_connections_per_client` requests
//! forwarded at once, and fewer as the pool fills (one more than the first
//! only while more than four times what it holds is free), counted from
//! before the wait for a connection until the response body ends
//! ([`ClientHolds`]); one more is answered 429 at once.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use std::net::IpAddr;

use http::uri::Authority;
use http::{Request, Response};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use slidegate_http::{headers, IdentityExtractor};

use super::body::{BodyPace, ClientFault, FaultCell, RequestBody};
use super::client_holds::{ClientHold, ClientHolds, ClientKey, Refusal, FREE_PER_HELD};
use super::slots::{Slot, Slots};
use super::tls::UpstreamTls;
use super::{boxed, ServeBody};

/// How long a new upstream connection may take.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Idle connections kept per worker thread, at most.
const MAX_IDLE: usize = 256;

/// Why the upstream could not answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpstreamError {
    #[error("cannot connect to the upstream: {0}")]
    Connect(#[from] std::io::Error),
    #[error("upstream HTTP error: {0}")]
    Http(#[from] hyper::Error),
    /// The TLS handshake with an `https://` upstream failed: its
    /// certificate did not verify, or it does not speak TLS.
    #[error("TLS with the upstream failed: {0}")]
    Tls(std::io::Error),
    /// Every upstream slot stayed taken for the whole queue wait.
    #[error("all {0} upstream connections are busy")]
    Busy(usize),
    /// The client's body failed: malformed, or silent too long.
    #[error("the client's request body failed: {0:?}")]
    Client(ClientFault),
    /// The client's body arrived slower than the minimum rate (bytes/s).
    #[error("the client's request body arrived slower than {0} bytes/s")]
    TooSlow(u32),
    /// The client already has its share forwarded, or as much as a pool
    /// this full lets one client hold.
    #[error("the client already has requests forwarded: {0:?}")]
    ClientBusy(Refusal),
}

impl UpstreamError {
    /// The response the client gets: 400 or 408 when its own body was at
    /// fault, 503 when the upstream is saturated, 502 otherwise. All close
    /// the connection: the request body may be left half read.
    pub(crate) fn response(&self, path: &str) -> Response<ServeBody> {
        let (status, detail) = match self {
            UpstreamError::Client(ClientFault::Malformed) => {
                tracing::debug!(err = %self, "client request body failed");
                (http::StatusCode::BAD_REQUEST, "the request body is malformed".into())
            }
            // `send` reports a body too slow as `TooSlow`, with the rate.
            UpstreamError::Client(ClientFault::Timeout | ClientFault::TooSlow) => {
                tracing::debug!(err = %self, "client request body timed out");
                (http::StatusCode::REQUEST_TIMEOUT, "the request body stopped arriving".into())
            }
            UpstreamError::TooSlow(rate) => {
                tracing::debug!(err = %self, "client request body too slow");
                (
                    http::StatusCode::REQUEST_TIMEOUT,
                    format!("the request body arrived slower than min_body_rate ({rate} bytes/s)"),
                )
            }
            UpstreamError::ClientBusy(refusal) => {
                // Per request of a client over its share: debug, or an
                // attacker writes the log.
                tracing::debug!(err = %self, "client over its share of the upstream: request refused");
                (http::StatusCode::TOO_MANY_REQUESTS, refusal_detail(*refusal))
            }
            UpstreamError::Busy(_) => {
                tracing::warn!(err = %self, "upstream saturated: request refused");
                (http::StatusCode::SERVICE_UNAVAILABLE, "the upstream is saturated; retry later".into())
            }
            UpstreamError::Connect(_) | UpstreamError::Http(_) => {
                tracing::warn!(err = %self, "upstream request failed");
                (http::StatusCode::BAD_GATEWAY, "the upstream could not be reached".into())
            }
            UpstreamError::Tls(_) => {
                tracing::warn!(err = %self, "upstream TLS failed: request refused, nothing sent in clear");
                (http::StatusCode::BAD_GATEWAY, "the upstream's TLS could not be verified".into())
            }
        };
        let title = status.canonical_reason().unwrap_or("Error");
        let mut response = boxed(headers::problem(status, "about:blank", title, &detail, Some(path)));
        let headers = response.headers_mut();
        headers.insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
        if matches!(self, UpstreamError::ClientBusy(_)) {
            headers.insert(http::header::RETRY_AFTER, http::HeaderValue::from_static("1"));
        }
        response
    }
}

/// The problem detail of a client's request refused before the upstream.
fn refusal_detail(refusal: Refusal) -> String {
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    match refusal {
        Refusal::Share { held } => format!(
            "this client already has {held} request{} in flight to the upstream \
             (max_upstream_connections_per_client); retry when one has finished",
            plural(held)
        ),
        Refusal::Crowded { held, free, max } => format!(
            "this client already has {held} request{} in flight to the upstream, and only {free} of its \
             {max} connections are free: a client may add one while more than {FREE_PER_HELD} times \
             what it holds are free; retry when one has finished",
            plural(held)
        ),
    }
}

/// What bounds one upstream's use: shared by every worker thread's pool.
#[derive(Clone)]
pub(crate) struct UpstreamLimits {
    /// How slowly a request body may arrive.
    pub(crate) pace: BodyPace,
    /// The requests each client has forwarded, against its share.
    pub(crate) clients: Arc<ClientHolds>,
    /// One slot per open upstream connection.
    pub(crate) slots: Arc<Slots>,
    /// The number of slots.
    pub(crate) max: usize,
    /// Idle connections one worker thread keeps: few enough that the idle
    /// connections of all threads hold at most half the permits, so one
    /// thread's idle pool cannot starve another thread of connections.
    pub(crate) max_idle: usize,
    /// How long a request waits for a permit.
    pub(crate) queue_wait: std::time::Duration,
    /// How long a WebSocket tunnel may stay silent (`websocket_idle_timeout`).
    pub(crate) tunnel_idle: std::time::Duration,
    /// What a denied gRPC call is told (`grpc_denial_status`).
    pub(crate) grpc_denial: crate::config::GrpcDenialStatus,
    /// How connections to the upstream are made: TLS or not, HTTP/1.1 or 2.
    pub(crate) transport: Arc<Transport>,
}

/// How connections to the upstream are made.
pub(crate) struct Transport {
    /// `Some` for an `https://` upstream.
    pub(crate) tls: Option<UpstreamTls>,
    /// `upstream_http2`: one multiplexed HTTP/2 connection per worker
    /// thread (while it stays open) instead of a pool of HTTP/1.1 ones.
    pub(crate) http2: bool,
    /// TLS handshakes with the upstream that failed, over all threads.
    pub(crate) tls_failures: std::sync::atomic::AtomicU64,
}

impl UpstreamLimits {
    /// The limits of `[server]`.
    pub(crate) fn new(
        server: &crate::config::ServerConfig,
        threads: usize,
        tls: Option<UpstreamTls>,
    ) -> Self {
        let max = server.max_upstream_connections.max(1);
        Self {
            pace: BodyPace {
                idle: server.body_timeout.get(),
                bytes_per_second: server.min_body_rate,
                grace: server.body_rate_grace.get(),
            },
            clients: Arc::new(ClientHolds::new(server.upstream_connections_per_client(), max)),
            slots: Slots::new(max),
            max,
            max_idle: (max / (2 * threads.max(1))).clamp(1, MAX_IDLE),
            queue_wait: crate::config::ServerConfig::UPSTREAM_QUEUE_WAIT.get(),
            tunnel_idle: server.websocket_idle_timeout.get(),
            grpc_denial: server.grpc_denial_status,
            transport: Arc::new(Transport {
                tls,
                http2: server.upstream_http2,
                tls_failures: std::sync::atomic::AtomicU64::new(0),
            }),
        }
    }
}

/// One connection's sending half: a pooled HTTP/1.1 connection takes one
/// request at a time; an HTTP/2 one is shared by every request of the thread.
pub(crate) enum Sender {
    Http1(http1::SendRequest<RequestBody>),
    Http2(http2::SendRequest<Pin<Box<RequestBody>>>),
}

impl Sender {
    async fn send_request(
        &mut self,
        request: Request<RequestBody>,
    ) -> Result<Response<Incoming>, hyper::Error> {
        match self {
            Sender::Http1(s) => s.send_request(request).await,
            Sender::Http2(s) => s.send_request(request.map(Box::pin)).await,
        }
    }
}

/// The connections of one worker thread to the upstream: a pool of
/// HTTP/1.1 ones, or one shared HTTP/2 connection.
pub(crate) struct Upstream {
    authority: Authority,
    host: String,
    port: u16,
    idle: Mutex<Vec<http1::SendRequest<RequestBody>>>,
    /// HTTP/2's connection sends a body it can move: boxed, pinned.
    shared: Mutex<Option<http2::SendRequest<Pin<Box<RequestBody>>>>>,
    limits: UpstreamLimits,
}

impl Upstream {
    pub(crate) fn new(authority: Authority, limits: UpstreamLimits) -> Arc<Self> {
        let host = authority.host().trim_start_matches('[').trim_end_matches(']').to_owned();
        let port = authority.port_u16().unwrap_or(if limits.transport.tls.is_some() { 443 } else { 80 });
        let (idle, shared) = (Mutex::new(Vec::new()), Mutex::new(None));
        Arc::new(Self { authority, host, port, idle, shared, limits })
    }

    /// The `slidegate_upstream_tls_failures` counter family, as OpenMetrics
    /// text: the family is named without `_total`, its sample with it.
    pub(crate) fn render_metrics(&self, out: &mut String) {
        use std::fmt::Write as _;
        let failures = self.limits.transport.tls_failures.load(std::sync::atomic::Ordering::Relaxed);
        let _ = write!(
            out,
            "# HELP slidegate_upstream_tls_failures TLS handshakes with the upstream that failed \
             (certificate not verified, wrong name, no TLS): each answered 502.\n\
             # TYPE slidegate_upstream_tls_failures counter\n\
             slidegate_upstream_tls_failures_total {failures}\n"
        );
    }

    /// The upstream's `host:port`, for requests that came without `Host`.
    pub(crate) fn authority(&self) -> &Authority {
        &self.authority
    }

    /// What bounds this upstream's use: WebSocket tunnels take their slot
    /// and client share from the same limits (`websocket.rs`).
    pub(crate) fn limits(&self) -> &UpstreamLimits {
        &self.limits
    }

    /// The host and port connections are opened to.
    pub(crate) fn address(&self) -> (&str, u16) {
        (&self.host, self.port)
    }

    /// The upstream share's key of the client at `ip` (the client's
    /// address, after the trusted proxies: [`slidegate_http::Admission::client`]),
    /// grouped as the limits' `identity` groups it (IPv6 prefix).
    pub(crate) fn client(&self, identity: &IdentityExtractor, ip: IpAddr) -> ClientKey {
        self.limits.clients.key(identity, ip)
    }

    /// Sends `request` (origin-form URI) for `client` on a pooled or new
    /// connection, unless the client already has its share forwarded.
    pub(crate) async fn send(
        self: &Arc<Self>,
        request: Request<Incoming>,
        client: ClientKey,
    ) -> Result<Response<PooledBody>, UpstreamError> {
        let hold = self.limits.clients.hold(client).map_err(UpstreamError::ClientBusy)?;
        let fault = Arc::new(FaultCell::default());
        let mut request = request.map(|body| RequestBody::new(body, self.limits.pace, Arc::clone(&fault)));
        let mut sender = self.checkout(hold.held()).await?;
        if matches!(sender, Sender::Http2(_)) {
            self.to_http2(&mut request);
        }
        let response = match sender.send_request(request).await {
            Ok(response) => response,
            // hyper reports the client's body failing as its own error: say whose it was.
            Err(err) => {
                return Err(match fault.get() {
                    None => UpstreamError::Http(err),
                    Some(ClientFault::TooSlow) => UpstreamError::TooSlow(self.limits.pace.bytes_per_second),
                    Some(fault) => UpstreamError::Client(fault),
                })
            }
        };
        let pool = Arc::clone(self);
        Ok(response.map(|body| PooledBody { body, sender: Some(sender), pool, hold: Some(hold) }))
    }

    /// An HTTP/2 request's target: the absolute form HTTP/2 sends as
    /// `:scheme` and `:authority`, the authority the client's `Host` (which
    /// it then replaces) or the upstream's.
    fn to_http2(&self, request: &mut Request<RequestBody>) {
        let scheme = if self.limits.transport.tls.is_some() { "https" } else { "http" };
        let host =
            request.headers().get(http::header::HOST).and_then(|h| Authority::try_from(h.as_bytes()).ok());
        let authority = host.unwrap_or_else(|| self.authority.clone());
        let path = request.uri().path_and_query().map_or("/", |pq| pq.as_str());
        if let Ok(uri) = http::Uri::try_from(format!("{scheme}://{authority}{path}")) {
            *request.uri_mut() = uri;
            request.headers_mut().remove(http::header::HOST);
        }
        *request.version_mut() = http::Version::HTTP_2;
    }

    /// A pooled connection (the shared one for HTTP/2), or a new one once a
    /// slot is free: each open connection holds one of
    /// `max_upstream_connections` slots until it closes. `held`: the
    /// requests the client has forwarded, this one included.
    async fn checkout(&self, held: usize) -> Result<Sender, UpstreamError> {
        if self.limits.transport.http2 {
            let shared = self.shared.lock().unwrap_or_else(PoisonError::into_inner).clone();
            if let Some(sender) = shared.filter(|s| !s.is_closed()) {
                return Ok(Sender::Http2(sender));
            }
        } else {
            loop {
                let pooled = self.idle.lock().unwrap_or_else(PoisonError::into_inner).pop();
                let Some(mut sender) = pooled else { break };
                // A connection the upstream closed while idle fails here, and is dropped.
                if !sender.is_closed() && sender.ready().await.is_ok() {
                    return Ok(Sender::Http1(sender));
                }
            }
        }
        // Boxed: a new connection's future (connect, TLS, handshake) is
        // kilobytes, and every request's future would otherwise carry it
        // and be copied whole each time it moves.
        Box::pin(self.open(held)).await
    }

    /// A new connection once a slot is free (the shared one for HTTP/2).
    async fn open(&self, held: usize) -> Result<Sender, UpstreamError> {
        let Some(slot) = self.limits.slots.acquire(held, self.limits.queue_wait).await else {
            return Err(UpstreamError::Busy(self.limits.max));
        };
        let connect = tokio::net::TcpStream::connect((self.host.as_str(), self.port));
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, connect).await.map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out connecting to the upstream")
        })??;
        stream.set_nodelay(true)?;
        let sender = match &self.limits.transport.tls {
            None => self.handshake(TokioIo::new(stream), slot).await?,
            Some(tls) => {
                let tls = match tokio::time::timeout(CONNECT_TIMEOUT, tls.connect(stream)).await {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(err)) => return Err(self.tls_failed(err)),
                    Err(_) => return Err(self.tls_failed(std::io::ErrorKind::TimedOut.into())),
                };
                self.handshake(TokioIo::new(tls), slot).await?
            }
        };
        if let Sender::Http2(shared) = &sender {
            *self.shared.lock().unwrap_or_else(PoisonError::into_inner) = Some(shared.clone());
        }
        Ok(sender)
    }

    fn tls_failed(&self, err: std::io::Error) -> UpstreamError {
        self.limits.transport.tls_failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        UpstreamError::Tls(err)
    }

    /// HTTP over a new connection `io`, which holds `slot` until it closes.
    async fn handshake<I>(&self, io: I, slot: Slot) -> Result<Sender, hyper::Error>
    where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let release = |result: Result<(), hyper::Error>| {
            if let Err(err) = result {
                tracing::debug!(%err, "upstream connection ended with an error");
            }
            // The socket is closed by now: its slot is free.
            drop(slot);
        };
        if self.limits.transport.http2 {
            let (sender, connection) =
                http2::Builder::new(TokioExecutor::new()).timer(TokioTimer::new()).handshake(io).await?;
            tokio::spawn(async move { release(connection.await) });
            Ok(Sender::Http2(sender))
        } else {
            let (sender, connection) = http1::handshake(io).await?;
            tokio::spawn(async move { release(connection.await) });
            Ok(Sender::Http1(sender))
        }
    }

    fn release(&self, sender: Sender) {
        // The shared HTTP/2 connection stays open for the next request.
        let Sender::Http1(sender) = sender else { return };
        // With a request waiting for a slot, closing the connection (dropping
        // its sender) serves that request; kept idle, it would serve only a
        // later one on this thread.
        if sender.is_closed() || self.limits.slots.awaited() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < self.limits.max_idle {
            idle.push(sender);
        }
    }
}

/// A response body from the upstream that returns its connection to the pool at its end.
///
/// The client's hold on its share ends with the body too: at its end, or
/// when it is dropped.
pub(crate) struct PooledBody {
    body: Incoming,
    sender: Option<Sender>,
    pool: Arc<Upstream>,
    hold: Option<ClientHold>,
}

impl PooledBody {
    fn finish(&mut self) {
        self.hold = None;
        if let Some(sender) = self.sender.take() {
            self.pool.release(sender);
        }
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let frame = Pin::new(&mut this.body).poll_frame(cx);
        match &frame {
            Poll::Ready(None) => this.finish(),
            Poll::Ready(Some(Ok(_))) if this.body.is_end_stream() => this.finish(),
            Poll::Ready(Some(Err(_))) => {
                this.hold = None;
                drop(this.sender.take());
            }
            _ => {}
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for PooledBody {
    fn drop(&mut self) {
        // Bodies known to be empty (204, 304, HEAD) are never polled.
        if self.body.is_end_stream() {
            self.finish();
        }
    }
}
