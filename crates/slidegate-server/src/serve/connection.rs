//! One client connection, from its first byte: TLS when the listener has
//! it, then HTTP/1.1 or HTTP/2, whichever the client speaks (ALPN `h2`, or
//! the HTTP/2 preface in clear: prior knowledge, h2c); on the gRPC listener
//! (`[server] grpc_listen`, no TLS) HTTP/2 in clear only, with the same
//! bounds: a client speaking anything else gets no answer but a close.
//!
//! What bounds a connection before its requests reach the worker's routing
//! (each listener's own, `[server] connections.<listener>`: [`ConnectionLimits`];
//! the cap on open connections is the acceptor's, `listener_caps`):
//! - the TLS handshake must end within [`TLS_HANDSHAKE_TIMEOUT`];
//! - the first request must come within `header_timeout` of the connection
//!   (hyper's header timer guards each HTTP/1.1 request after, from the
//!   moment the connection waits for it, but nothing in hyper times the
//!   wait for HTTP/2's preface or a first request);
//! - a connection with no request in flight for `idle_timeout` is closed
//!   gracefully (HTTP/2: GOAWAY; hyper has no idle timeout of its own);
//! - HTTP/2: `[server] http2` — streams open at once, the header list's
//!   size, streams the client resets before they are taken (rapid reset,
//!   CVE-2023-44487) and streams reset for its protocol errors; past either
//!   reset bound the connection gets GOAWAY. Every stream is a request like
//!   any other: the per-client upstream share and body timeouts count it.

use std::future::Future;
use std::pin::{pin, Pin};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::Service;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::sync::watch;

use super::activity::{Activity, OnWake, Tracked};
use crate::config::{ConnectionLimits, ServerConfig};

/// How long a client has to complete the TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How often an idle HTTP/2 connection is pinged, and how long its answer may take.
const H2_KEEP_ALIVE: Duration = Duration::from_secs(30);

/// How the connections of one listener are spoken to.
pub(super) struct Protocols {
    tls: Option<tokio_rustls::TlsAcceptor>,
    http: auto::Builder<TokioExecutor>,
    /// HTTP/1.1 and its upgrades too; without, HTTP/2 only.
    http1: bool,
    /// The first request's deadline, and the idle timeout.
    header_timeout: Duration,
    idle_timeout: Duration,
}

impl Protocols {
    /// The protocols of `[server]`, with `tls` on the public listener when
    /// it has TLS, for a listener bounded by `bounds`.
    pub(super) fn new(
        server: &ServerConfig,
        tls: Option<tokio_rustls::TlsAcceptor>,
        bounds: ConnectionLimits,
    ) -> Self {
        let limits = server.http2;
        let mut http = auto::Builder::new(TokioExecutor::new());
        // hyper arms a header-read timer per HTTP/1.1 request (slowloris
        // protection), from when the connection waits for one.
        http.http1().timer(TokioTimer::new()).header_read_timeout(bounds.header_timeout.get());
        http.http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(limits.max_concurrent_streams)
            .max_header_list_size(limits.max_header_list_size)
            .max_pending_accept_reset_streams(limits.max_pending_reset_streams)
            .max_local_error_reset_streams(limits.max_local_error_resets)
            .keep_alive_interval(H2_KEEP_ALIVE)
            .keep_alive_timeout(H2_KEEP_ALIVE);
        Self {
            tls,
            http,
            http1: true,
            header_timeout: bounds.header_timeout.get(),
            idle_timeout: bounds.idle_timeout.get(),
        }
    }

    /// The gRPC listener's protocol: HTTP/2 in clear (prior knowledge, as
    /// gRPC clients and Envoy speak it), bounded by `[server] http2`.
    pub(super) fn grpc(server: &ServerConfig) -> Self {
        let plain = Self::new(server, None, server.connections.grpc);
        // hyper's HTTP/2 server at once, with the bounds above: no sniffing
        // of the first bytes, so HTTP/1.1 is a broken preface.
        Self { http: plain.http.http2_only(), http1: false, ..plain }
    }

    /// Serves `stream` with `service` until it closes, or a drain
    /// (`draining` turning true) or the idle timeout has it finish its
    /// requests and close.
    pub(super) async fn serve<S, B>(
        &self,
        stream: tokio::net::TcpStream,
        service: S,
        draining: watch::Receiver<bool>,
        peer: std::net::SocketAddr,
    ) where
        S: Service<Request<Incoming>, Response = Response<B>, Error = std::convert::Infallible>
            + Send
            + 'static,
        S::Future: Send + 'static,
        B: hyper::body::Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let activity = Activity::new();
        let service = Tracked::new(service, &activity);
        let served = async {
            match &self.tls {
                None => self.http_on(TokioIo::new(stream), service, draining, &activity).await,
                Some(acceptor) => {
                    let tls = match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await
                    {
                        Ok(Ok(tls)) => tls,
                        Ok(Err(err)) => return Err(format!("TLS handshake failed: {err}").into()),
                        Err(_) => return Err("TLS handshake timed out".into()),
                    };
                    self.http_on(TokioIo::new(tls), service, draining, &activity).await
                }
            }
        };
        let result = tokio::select! {
            biased;
            result = served => result,
            () = OnWake::new(activity.first_request_overdue(self.header_timeout)) => {
                Err("no request within the header timeout".into())
            }
        };
        if let Err(err) = result {
            tracing::debug!(%err, %peer, "connection ended with an error");
        }
    }

    async fn http_on<I, S, B>(
        &self,
        io: I,
        service: S,
        draining: watch::Receiver<bool>,
        activity: &Activity,
    ) -> Result<(), BoxError>
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
            let connection = pin!(self.http.serve_connection(io, service));
            return self.until_closed(connection, |c| c.graceful_shutdown(), draining, activity).await;
        }
        // With upgrades: an HTTP/1.1 `Upgrade` is the proxy's to take.
        let connection = pin!(self.http.serve_connection_with_upgrades(io, service));
        self.until_closed(connection, |c| c.graceful_shutdown(), draining, activity).await
    }

    /// Runs `connection` to its end; once the worker drains or the
    /// connection has been idle for the idle timeout, `close` has it finish
    /// its requests in flight and close.
    async fn until_closed<C: Future<Output = Result<(), BoxError>>>(
        &self,
        mut connection: Pin<&mut C>,
        close: impl Fn(Pin<&mut C>),
        mut draining: watch::Receiver<bool>,
        activity: &Activity,
    ) -> Result<(), BoxError> {
        let mut closing = false;
        // Polled only until `closing`, which either of them ending sets.
        let mut drain = OnWake::new(draining.wait_for(|draining| *draining));
        let mut idle = OnWake::new(activity.idle_for(self.idle_timeout));
        loop {
            tokio::select! {
                biased;
                result = connection.as_mut() => return result,
                // A worker gone (`Err`) drains too.
                _ = &mut drain, if !closing => {
                    close(connection.as_mut());
                    closing = true;
                }
                () = &mut idle, if !closing => {
                    close(connection.as_mut());
                    closing = true;
                }
            }
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;
