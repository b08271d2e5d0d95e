//! One client connection, from its first byte: TLS when the listener has
//! it, then HTTP/1.1 or HTTP/2, whichever the client speaks (ALPN `h2`, or
//! the HTTP/2 preface in clear: prior knowledge, h2c); on the gRPC listener
//! (`[server] grpc_listen`, no TLS) HTTP/2 in clear only, with the same
//! bounds: a client speaking anything else gets no answer but a close.
//!
//! What bounds a connection before its requests reach the worker's routing:
//! - the TLS handshake must end within [`TLS_HANDSHAKE_TIMEOUT`];
//! - the first request must come within [`FIRST_REQUEST_TIMEOUT`] of the
//!   connection (hyper's header timeout guards each HTTP/1.1 request after,
//!   but nothing in hyper times the wait for HTTP/2's preface or a first
//!   request);
//! - HTTP/2: `[server] http2` — streams open at once, the header list's
//!   size, streams the client resets before they are taken (rapid reset,
//!   CVE-2023-44487) and streams reset for its protocol errors; past either
//!   reset bound the connection gets GOAWAY. Every stream is a request like
//!   any other: the per-client upstream share and body timeouts count it.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::Service;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::Watcher;

use crate::config::ServerConfig;

/// How long a client has to complete the TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a connection may stay open without a complete first request head.
const FIRST_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How often an idle HTTP/2 connection is pinged, and how long its answer may take.
const H2_KEEP_ALIVE: Duration = Duration::from_secs(30);

/// How the connections of one listener are spoken to.
pub(super) struct Protocols {
    tls: Option<tokio_rustls::TlsAcceptor>,
    http: auto::Builder<TokioExecutor>,
    /// HTTP/1.1 and its upgrades too; without, HTTP/2 only.
    http1: bool,
}

impl Protocols {
    /// The protocols of `[server]`, with `tls` on the public listener when it has TLS.
    pub(super) fn new(server: &ServerConfig, tls: Option<tokio_rustls::TlsAcceptor>) -> Self {
        let limits = server.http2;
        let mut http = auto::Builder::new(TokioExecutor::new());
        // hyper arms a 30 s header-read timer per HTTP/1.1 request (slowloris protection).
        http.http1().timer(TokioTimer::new());
        http.http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(limits.max_concurrent_streams)
            .max_header_list_size(limits.max_header_list_size)
            .max_pending_accept_reset_streams(limits.max_pending_reset_streams)
            .max_local_error_reset_streams(limits.max_local_error_resets)
            .keep_alive_interval(H2_KEEP_ALIVE)
            .keep_alive_timeout(H2_KEEP_ALIVE);
        Self { tls, http, http1: true }
    }

    /// The gRPC listener's protocol: HTTP/2 in clear (prior knowledge, as
    /// gRPC clients and Envoy speak it), bounded by `[server] http2`.
    pub(super) fn grpc(server: &ServerConfig) -> Self {
        let Self { http, .. } = Self::new(server, None);
        // hyper's HTTP/2 server at once, with the bounds above: no sniffing
        // of the first bytes, so HTTP/1.1 is a broken preface.
        Self { tls: None, http: http.http2_only(), http1: false }
    }

    /// Serves `stream` with `service` until it closes, or `watcher`'s
    /// shutdown has it finish its requests and close.
    pub(super) async fn serve<S, B>(
        &self,
        stream: tokio::net::TcpStream,
        service: S,
        watcher: Watcher,
        peer: std::net::SocketAddr,
    ) where
        S: Service<Request<Incoming>, Response = Response<B>, Error = std::convert::Infallible>
            + Send
            + 'static,
        S::Future: Send + 'static,
        B: hyper::body::Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let seen = Arc::new(AtomicBool::new(false));
        let service = FirstRequest { inner: service, seen: Arc::clone(&seen) };
        let served = async {
            match &self.tls {
                None => self.http_on(TokioIo::new(stream), service, watcher).await,
                Some(acceptor) => {
                    let tls = match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await
                    {
                        Ok(Ok(tls)) => tls,
                        Ok(Err(err)) => return Err(format!("TLS handshake failed: {err}").into()),
                        Err(_) => return Err("TLS handshake timed out".into()),
                    };
                    self.http_on(TokioIo::new(tls), service, watcher).await
                }
            }
        };
        let result = tokio::select! {
            result = served => result,
            () = first_request_overdue(&seen) => Err("no request within the first request timeout".into()),
        };
        if let Err(err) = result {
            tracing::debug!(%err, %peer, "connection ended with an error");
        }
    }

    async fn http_on<I, S, B>(&self, io: I, service: S, watcher: Watcher) -> Result<(), BoxError>
    where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
        S: Service<Request<Incoming>, Response = Response<B>, Error = std::convert::Infallible>
            + Send
            + 'static,
        S::Future: Send + 'static,
        B: hyper::body::Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        if !self.http1 {
            // (`serve_connection_with_upgrades` would ignore `http2_only`.)
            return watcher.watch(self.http.serve_connection(io, service)).await;
        }
        // With upgrades: an HTTP/1.1 `Upgrade` is the proxy's to take.
        watcher.watch(self.http.serve_connection_with_upgrades(io, service)).await
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Completes once [`FIRST_REQUEST_TIMEOUT`] has passed with no request seen; never after one.
async fn first_request_overdue(seen: &AtomicBool) {
    tokio::time::sleep(FIRST_REQUEST_TIMEOUT).await;
    if seen.load(Relaxed) {
        std::future::pending::<()>().await;
    }
}

/// A service that notes that a request came.
struct FirstRequest<S> {
    inner: S,
    seen: Arc<AtomicBool>,
}

impl<S: Service<Request<Incoming>>> Service<Request<Incoming>> for FirstRequest<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        self.seen.store(true, Relaxed);
        self.inner.call(request)
    }
}
