//! WebSocket tunnels: an `Upgrade: websocket` handshake (HTTP/1.1) decided
//! once, as any request, by the rule it matches, then, once the upstream
//! answers `101 Switching Protocols`, the two connections spliced together
//! until either side closes.
//!
//! A tunnel is an upstream connection of its own, never pooled: it holds one
//! of `max_upstream_connections` slots and one of its client's
//! `max_upstream_connections_per_client` for its whole life, taken before the
//! handshake is forwarded, so tunnels are bounded as requests are (429 when
//! the client has its share, 503 when the pool stays full past the queue
//! wait). Frames are not counted: the handshake is the request.
//!
//! A tunnel through which no byte passes, either way, for
//! `[server] websocket_idle_timeout` (5 minutes by default) is closed, both
//! sockets with it: a client that opens a tunnel and goes silent (or half
//! closes and never finishes) would otherwise keep its slots forever. Keep
//! the timeout above the application's ping interval. A draining instance
//! answers a handshake 503 (the proxy checks); a shutdown does not wait for
//! open tunnels: they end with their worker's runtime.
//!
//! What is refused or ignored, and why:
//! - A WebSocket handshake that is not a `GET` or carries a body (a
//!   `Content-Length` above 0, a `Transfer-Encoding`) gets 400: RFC 6455
//!   §4.1 handshakes are body-less GETs, and bytes after the head would
//!   reach the upstream as frames nobody decided.
//! - An `Upgrade` to anything but `websocket` (`h2c`, `TLS/1.0`, …), or one
//!   the `Connection` header does not name, is ignored as RFC 9110 §7.8
//!   lets a server do: the request is forwarded as a plain one, without the
//!   header, and answered by the upstream.
//! - Tunnels speak HTTP/1.1 to the upstream, over TLS for an `https://`
//!   one; WebSockets over HTTP/2 (RFC 8441) are not spoken on either side,
//!   so with `upstream_http2` and an `https://` upstream (its TLS offers
//!   only `h2`) a handshake gets 502. An h2c upstream gets HTTP/1.1 on the
//!   tunnel's own connection.
//! - An upstream that refuses the upgrade (any status but 101) gives its
//!   answer to the client as it is; the connection is then closed.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::client_holds::{ClientHold, ClientKey};
use super::slots::Slot;
use super::upstream::{Upstream, UpstreamError};

/// How long a tunnel's upstream connection may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What a request asks of the connection, as far as upgrades go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Upgrade {
    /// Nothing, or an upgrade `serve` ignores (forwarded as a plain request).
    None,
    /// A WebSocket handshake: tunnelled if admitted.
    WebSocket,
    /// A WebSocket handshake that cannot be one: 400, saying why.
    Refused(&'static str),
}

impl Upgrade {
    /// Reads `request` before its hop-by-hop headers are stripped.
    pub(crate) fn of<B>(request: &Request<B>) -> Self {
        let headers = request.headers();
        if !headers.contains_key(header::UPGRADE) || !tokens(headers, &header::CONNECTION, "upgrade") {
            return Upgrade::None;
        }
        // One protocol, `websocket`: a list offering others as well is a
        // client choosing for us; RFC 6455 clients send it alone.
        let mut values = headers.get_all(header::UPGRADE).iter();
        let websocket =
            values.next().is_some_and(|v| v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"websocket"))
                && values.next().is_none();
        if !websocket {
            return Upgrade::None;
        }
        if request.version() != http::Version::HTTP_11 {
            return Upgrade::Refused("a WebSocket handshake is an HTTP/1.1 request (RFC 6455 §4.1)");
        }
        if request.method() != Method::GET {
            return Upgrade::Refused("a WebSocket handshake is a GET (RFC 6455 §4.1)");
        }
        let has_body = headers.contains_key(header::TRANSFER_ENCODING)
            || headers.get_all(header::CONTENT_LENGTH).iter().any(|v| v.as_bytes().trim_ascii() != b"0");
        if has_body {
            return Upgrade::Refused(
                "a WebSocket handshake carries no body: bytes after its head would reach the upstream as frames",
            );
        }
        Upgrade::WebSocket
    }
}

/// Whether a comma-separated header `name` lists `token` (case-insensitive).
fn tokens(headers: &HeaderMap, name: &header::HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// What a tunnel holds for its life: a slot of the pool, a share of its client's.
struct Lease {
    _slot: Slot,
    _hold: ClientHold,
}

/// Forwards the handshake `request` (its hop-by-hop headers already
/// stripped, origin-form) on a connection of its own, and, if the upstream
/// switches protocols, tunnels the client's connection to it in a task of
/// its own. Returns the upstream's answer: the `101` for the client, or
/// whatever else it said.
pub(crate) async fn open(
    upstream: &Upstream,
    request: Request<Incoming>,
    client: ClientKey,
    idle: Duration,
) -> Result<Response<Incoming>, UpstreamError> {
    let limits = upstream.limits();
    let hold = limits.clients.hold(client).map_err(UpstreamError::ClientBusy)?;
    let Some(slot) = limits.slots.acquire(hold.held(), limits.queue_wait).await else {
        return Err(UpstreamError::Busy(limits.max));
    };
    let lease = Arc::new(Lease { _slot: slot, _hold: hold });
    let (host, port) = upstream.address();
    let timed_out =
        || std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out connecting to the upstream");
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect((host, port)))
        .await
        .map_err(|_| timed_out())??;
    stream.set_nodelay(true)?;
    let Some(tls) = &limits.transport.tls else {
        return handshake(TokioIo::new(stream), request, lease, idle).await;
    };
    if limits.transport.http2 {
        // Its TLS offers `h2` alone (ALPN), and HTTP/2 has no `Upgrade`.
        tracing::warn!("a WebSocket handshake cannot reach an https upstream spoken to in HTTP/2: refused");
        return Err(UpstreamError::Connect(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "WebSocket tunnels need HTTP/1.1 to the upstream: upstream_http2 with https cannot carry them",
        )));
    }
    let tls = match tokio::time::timeout(CONNECT_TIMEOUT, tls.connect(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(err)) => return Err(UpstreamError::Tls(err)),
        Err(_) => return Err(UpstreamError::Tls(timed_out())),
    };
    handshake(TokioIo::new(tls), request, lease, idle).await
}

/// The handshake over a new connection `io` to the upstream, holding `lease`.
async fn handshake<I>(
    io: I,
    mut request: Request<Incoming>,
    lease: Arc<Lease>,
    idle: Duration,
) -> Result<Response<Incoming>, UpstreamError>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = http1::handshake::<_, Empty<Bytes>>(io).await?;
    // Until the upgrade (or the end of a refusal's answer) the connection
    // task holds the lease; after it, the tunnel does.
    let driving = Arc::clone(&lease);
    tokio::spawn(async move {
        if let Err(err) = connection.with_upgrades().await {
            tracing::debug!(%err, "upstream WebSocket handshake connection ended with an error");
        }
        drop(driving);
    });
    let from_client = hyper::upgrade::on(&mut request);
    let (mut parts, _empty) = request.into_parts();
    parts.headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    parts.headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    let mut response = sender.send_request(Request::from_parts(parts, Empty::new())).await?;
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        let from_upstream = hyper::upgrade::on(&mut response);
        tokio::spawn(splice(from_client, from_upstream, lease, idle));
    }
    Ok(response)
}

/// Marks a `101` for the client after its hop-by-hop headers were stripped.
pub(crate) fn switching(headers: &mut HeaderMap) {
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
}

/// Copies both ways until both sides have closed, or nothing has passed for `idle`.
async fn splice(client: OnUpgrade, upstream: OnUpgrade, lease: Arc<Lease>, idle: Duration) {
    let (client, upstream) = match tokio::join!(client, upstream) {
        (Ok(client), Ok(upstream)) => (client, upstream),
        (Err(err), _) | (_, Err(err)) => {
            tracing::debug!(%err, "a WebSocket upgrade failed: tunnel not opened");
            return;
        }
    };
    let activity = Arc::new(Activity::new());
    let mut client =
        Watched { io: TokioIo::new(client), activity: Arc::clone(&activity), upstream_ended: false };
    let mut upstream = TokioIo::new(upstream);
    tokio::select! {
        copied = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {
            if let Err(err) = copied {
                tracing::debug!(%err, "a WebSocket tunnel ended with an error");
            }
        }
        () = activity.silent_for(idle) => {
            tracing::debug!(?idle, "a WebSocket tunnel idle too long: closed");
        }
    }
    drop(lease);
}

/// When bytes last passed through a tunnel, in milliseconds since it opened.
struct Activity {
    opened: tokio::time::Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self { opened: tokio::time::Instant::now(), last_ms: AtomicU64::new(0) }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Completes once nothing has passed for `idle`.
    async fn silent_for(&self, idle: Duration) {
        loop {
            let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            let due = self.opened + last.saturating_add(idle);
            if tokio::time::Instant::now() >= due {
                return;
            }
            tokio::time::sleep_until(due).await;
        }
    }
}

/// The client's side of a tunnel: both directions pass through it, so it
/// alone marks the tunnel's activity.
///
/// Once the upstream's side has ended (`copy_bidirectional` then shuts the
/// client's side down for writing), reads from the client end too, so the
/// tunnel closes whole: a WebSocket has no half-closed state (RFC 6455
/// §7.1.1: the server closes the TCP connection, the client waits for it),
/// and a client waiting for the close would otherwise hold the tunnel, its
/// slot and its share until `websocket_idle_timeout`.
struct Watched<T> {
    io: T,
    activity: Arc<Activity>,
    upstream_ended: bool,
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.upstream_ended {
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_shutdown(cx);
        if polled.is_ready() {
            self.upstream_ended = true;
            // The read from the client may be parked on its socket: poll again.
            cx.waker().wake_by_ref();
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handshake(method: Method, headers: &[(&str, &str)]) -> Request<()> {
        let mut request = Request::builder().method(method).uri("/chat");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(()).unwrap()
    }

    const WS: [(&str, &str); 2] = [("connection", "keep-alive, Upgrade"), ("upgrade", "WebSocket")];

    #[test]
    fn a_websocket_handshake_is_a_bodiless_http11_get() {
        assert_eq!(Upgrade::of(&handshake(Method::GET, &WS)), Upgrade::WebSocket);
        assert_eq!(
            Upgrade::of(&handshake(Method::GET, &[WS[0], WS[1], ("content-length", "0")])),
            Upgrade::WebSocket
        );
        for refused in [
            handshake(Method::POST, &WS),
            handshake(Method::GET, &[WS[0], WS[1], ("content-length", "5")]),
            handshake(Method::GET, &[WS[0], WS[1], ("transfer-encoding", "chunked")]),
        ] {
            assert!(matches!(Upgrade::of(&refused), Upgrade::Refused(_)), "{refused:?}");
        }
        let mut http10 = handshake(Method::GET, &WS);
        *http10.version_mut() = http::Version::HTTP_10;
        assert!(matches!(Upgrade::of(&http10), Upgrade::Refused(_)));
    }

    #[test]
    fn other_upgrades_and_upgrades_connection_does_not_name_are_ignored() {
        assert_eq!(Upgrade::of(&handshake(Method::GET, &[])), Upgrade::None);
        assert_eq!(Upgrade::of(&handshake(Method::GET, &[("upgrade", "websocket")])), Upgrade::None);
        assert_eq!(Upgrade::of(&handshake(Method::GET, &[WS[0], ("upgrade", "h2c")])), Upgrade::None);
        assert_eq!(
            Upgrade::of(&handshake(Method::GET, &[WS[0], ("upgrade", "websocket, h2c")])),
            Upgrade::None
        );
        let twice = [WS[0], ("upgrade", "websocket"), ("upgrade", "websocket")];
        assert_eq!(Upgrade::of(&handshake(Method::GET, &twice)), Upgrade::None);
        // A POST with a body asking for h2c is a plain POST.
        assert_eq!(
            Upgrade::of(&handshake(Method::POST, &[WS[0], ("upgrade", "h2c"), ("content-length", "5")])),
            Upgrade::None
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_tunnel_is_idle_once_nothing_has_passed_for_the_timeout() {
        let activity = Activity::new();
        let idle = Duration::from_secs(300);
        tokio::time::advance(Duration::from_secs(200)).await;
        activity.touch();
        let start = tokio::time::Instant::now();
        activity.silent_for(idle).await;
        assert_eq!(start.elapsed(), idle);
    }
}
