//! Forwarding to the upstream: bodies streamed both ways, hop-by-hop headers
//! dropped, `X-Forwarded-For` appended; a WebSocket handshake to a tunnel
//! of its own (`websocket`), a gRPC call answered in gRPC when refused here
//! (`grpc`).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Request, Response, StatusCode, Uri};
use std::sync::Arc;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use slidegate_http::headers::{self, RateHeaders};
use slidegate_http::{PendingCharge, RateLimiter, Verdict};

use super::access_log;
use super::client_holds::ClientKey;
use super::grpc;
use super::upstream::{PooledBody, Upstream, UpstreamError, UpstreamLimits};
use super::websocket::{self, Upgrade};
use super::{boxed, ServeBody, State};

/// The one upstream, as one worker thread reaches it.
pub(crate) struct Proxy {
    upstream: Arc<Upstream>,
    /// What a denied gRPC call is told (`[server] grpc_denial_status`).
    grpc_denial: crate::config::GrpcDenialStatus,
}

/// Headers meaningful for one connection only (RFC 9110 §7.6.1), never
/// forwarded. Transfer-Encoding is hop-by-hop too: hyper re-frames the body.
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    header::TRANSFER_ENCODING,
];

impl Proxy {
    /// A proxy to `upstream` (`http://host:port`, checked by the config).
    pub(crate) fn new(upstream: &Uri, limits: UpstreamLimits) -> Option<Self> {
        let grpc_denial = limits.grpc_denial;
        Some(Self { upstream: Upstream::new(upstream.authority()?.clone(), limits), grpc_denial })
    }

    /// The upstream's counters (TLS failures), as Prometheus text.
    pub(crate) fn render_metrics(&self, out: &mut String) {
        self.upstream.render_metrics(out);
    }
}

/// Removes hop-by-hop headers, those the `Connection` header names included.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // One pass over the names (standard names compare as integers) notes
    // which of the fixed ones are present: most messages carry none, an
    // upstream's answer one (`Connection: keep-alive`). Each present costs
    // one hashed removal, instead of the nine a removal of every name would,
    // and nothing is allocated unless `Connection` names another header.
    let mut present = 0u16;
    for name in headers.keys() {
        if let Some(i) = HOP_BY_HOP.iter().position(|hop| hop == name) {
            present |= 1 << i;
        }
    }
    if present == 0 {
        return;
    }
    let mut named: Vec<HeaderName> = Vec::new();
    for value in headers.get_all(header::CONNECTION) {
        let Ok(value) = value.to_str() else { continue };
        for token in value.split(',').map(str::trim) {
            // `close` names no header; a fixed name is removed below if present.
            if token.eq_ignore_ascii_case("close") || token.eq_ignore_ascii_case("keep-alive") {
                continue;
            }
            match HeaderName::from_bytes(token.as_bytes()) {
                Ok(name) if !HOP_BY_HOP.contains(&name) => named.push(name),
                _ => {}
            }
        }
    }
    for (i, name) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(name);
        }
    }
    for name in &named {
        headers.remove(name);
    }
}

/// The `X-Forwarded-For` entry of a peer, made once per connection.
pub(crate) fn forwarded_for_value(peer: SocketAddr) -> HeaderValue {
    HeaderValue::try_from(peer.ip().to_canonical().to_string()).unwrap_or(HeaderValue::from_static("unknown"))
}

/// Appends `peer` (its [`forwarded_for_value`]) to `X-Forwarded-For`,
/// folding earlier lines into one.
pub(crate) fn append_forwarded_for(headers: &mut HeaderMap, peer: &HeaderValue) {
    if !headers.contains_key(X_FORWARDED_FOR) {
        headers.insert(X_FORWARDED_FOR, peer.clone());
        return;
    }
    let mut chain: Vec<u8> = Vec::with_capacity(64);
    for value in headers.get_all(X_FORWARDED_FOR).iter() {
        let text = value.as_bytes().trim_ascii();
        if !text.is_empty() {
            chain.extend_from_slice(text);
            chain.extend_from_slice(b", ");
        }
    }
    chain.extend_from_slice(peer.as_bytes());
    if let Ok(value) = HeaderValue::from_maybe_shared(bytes::Bytes::from(chain)) {
        headers.insert(X_FORWARDED_FOR, value);
    }
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Decides `request` and, unless denied, forwards it: a WebSocket
/// handshake to a tunnel of its own (`websocket.rs`), anything else on the
/// pool. A gRPC call refused here gets a gRPC answer (`grpc.rs`).
pub(crate) async fn forward(
    state: &State,
    mut request: Request<Incoming>,
    peer: SocketAddr,
    peer_value: &HeaderValue,
) -> Response<ServeBody> {
    let limiter = state.limiter();
    let limiter = &*limiter;
    let denial = state.proxy.as_ref().map_or_else(Default::default, |p| p.grpc_denial);
    // Read before the stripping below removes `Connection` and `Upgrade`.
    let upgrade = Upgrade::of(&request);
    // Decide on the headers the upstream will receive: a header the client
    // names in `Connection` (its API key, say) is removed before forwarding,
    // so counting the request under it would let a random key per request
    // buy a fresh quota for what the upstream sees as an anonymous request.
    strip_hop_by_hop(request.headers_mut());
    if let Upgrade::Refused(reason) = upgrade {
        return bad_request(request.uri().path(), reason);
    }
    if upgrade == Upgrade::WebSocket && state.readiness.is_draining() {
        // A tunnel opened now would be cut by the shutdown (and a 101 cannot
        // carry the drain's `Connection: close`): the client reconnects elsewhere.
        let mut response = boxed(headers::problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "about:blank",
            "Service Unavailable",
            "this instance is shutting down and opens no WebSocket tunnels; reconnect",
            Some(request.uri().path()),
        ));
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return response;
    }
    let started = state.access_log.as_ref().map(|_| std::time::Instant::now());
    let admission = limiter.admit(&mut request, Some(peer.ip()), denial).await;
    let how = admission.grpc().cloned();
    let grpc = how.is_some();
    let own = |response: Response<ServeBody>| match &how {
        Some(how) => grpc::answer(response, how),
        None => response,
    };
    let log = state.access_log.as_ref();
    let entry = match (log, &admission.verdict, started) {
        (Some(log), Some(v), Some(started)) => log.entry(v, request.method(), request.uri().path(), started),
        _ => None,
    };
    if let Some(refusal) = admission.refusal(request.uri().path()) {
        return access_log::logged(log, entry, boxed(refusal));
    }
    let mut verdict = admission.verdict;
    // Kept for a 502: a Uri clone shares its bytes.
    let uri = request.uri().clone();
    let Some(proxy) = &state.proxy else {
        return access_log::logged(log, entry, own(bad_gateway(uri.path(), "no upstream client")));
    };
    prepare(&mut request, &proxy.upstream, peer_value, grpc);
    // The client the admission worked out (the peer is given, so it did).
    let client = proxy.upstream.client(limiter.identity(), admission.client.unwrap_or(peer.ip()));
    let pending = verdict.as_mut().and_then(Verdict::take_pending);
    let exchange = exchange(state, limiter, &proxy.upstream, request, client, upgrade, pending).await;
    let response = match exchange {
        Ok((response, charged)) => relay(response, limiter, charged, verdict.as_ref()),
        // 400/408 when the client's body failed, 429 over the client's
        // share, 503 when saturated, 502 otherwise.
        Err(err) => own(err.response(uri.path())),
    };
    access_log::logged(log, entry, response)
}

/// Sends a decided request: a WebSocket handshake to a tunnel of its own,
/// anything else on the pool (charged after its response if its rule says so).
async fn exchange(
    state: &State,
    limiter: &RateLimiter<crate::store::AnyStore>,
    upstream: &Arc<Upstream>,
    request: Request<Incoming>,
    client: ClientKey,
    upgrade: Upgrade,
    pending: Option<PendingCharge>,
) -> Result<(Response<ServeBody>, Option<RateHeaders>), UpstreamError> {
    let boxed = |response: Response<PooledBody>| response.map(|body| body.map_err(Into::into).boxed());
    match (upgrade, pending) {
        (Upgrade::WebSocket, pending) => {
            let idle = upstream.limits().tunnel_idle;
            // Boxed, as the tunnel's future is large and rare (`Upstream::checkout`).
            let response = Box::pin(websocket::open(upstream, request, client, idle)).await?;
            Ok(charge_handshake(limiter, pending, response).await)
        }
        (_, None) => upstream.send(request, client).await.map(|response| (boxed(response), None)),
        (_, Some(pending)) => exchange_charged(upstream, limiter, &state.settling, request, client, pending)
            .await
            .map(|(response, charged)| (boxed(response), charged)),
    }
}

/// Readies a decided request for the upstream: origin-form, HTTP/1.1, a
/// `Host`, `X-Forwarded-For`, and a gRPC call's `te: trailers`.
fn prepare(request: &mut Request<Incoming>, upstream: &Upstream, peer_value: &HeaderValue, grpc: bool) {
    let target =
        request.uri().path_and_query().map_or_else(|| Uri::from_static("/"), |pq| Uri::from(pq.clone()));
    *request.uri_mut() = target;
    *request.version_mut() = http::Version::HTTP_11;
    if !request.headers().contains_key(header::HOST) {
        // Only HTTP/1.0 comes without Host (`worker::refuse` answers an
        // HTTP/1.1 request without one 400); forwarded as HTTP/1.1, it needs one.
        if let Ok(host) = HeaderValue::from_str(upstream.authority().as_str()) {
            request.headers_mut().insert(header::HOST, host);
        }
    }
    append_forwarded_for(request.headers_mut(), peer_value);
    if grpc {
        grpc::keep_te_trailers(request.headers_mut());
    }
}

/// The upstream's answer as the client gets it: HTTP/1.1, hop-by-hop and
/// cost headers gone (a `101`'s upgrade headers put back), the rate limit
/// headers of the charge or of the decision.
fn relay(
    mut response: Response<ServeBody>,
    limiter: &RateLimiter<crate::store::AnyStore>,
    charged: Option<RateHeaders>,
    verdict: Option<&Verdict<'_>>,
) -> Response<ServeBody> {
    // Speak HTTP/1.1 to the client whatever the upstream spoke.
    *response.version_mut() = http::Version::HTTP_11;
    strip_hop_by_hop(response.headers_mut());
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        websocket::switching(response.headers_mut());
    }
    // The upstream's word to slidegate, not the client's business:
    // every rule's cost header, whichever rule matched, if any.
    limiter.cost_headers().strip(response.headers_mut());
    match (charged, verdict) {
        (Some(charged), _) => charged.insert_into(response.headers_mut()),
        (None, Some(v)) => headers::apply(response.headers_mut(), v, limiter.legacy_headers()),
        (None, None) => {}
    }
    response
}

/// A handshake's answer, charged now if its rule charges after the
/// response: the tunnel's traffic is not the request, its handshake is.
async fn charge_handshake(
    limiter: &RateLimiter<crate::store::AnyStore>,
    pending: Option<PendingCharge>,
    response: Response<Incoming>,
) -> (Response<ServeBody>, Option<RateHeaders>) {
    let charged = match pending {
        Some(pending) => limiter.charge_response(&pending, response.status(), response.headers()).await,
        None => None,
    };
    let headers = charged.filter(Verdict::allowed).map(|v| RateHeaders::of(&v, limiter.legacy_headers()));
    (response.map(|body| body.map_err(Into::into).boxed()), headers)
}

/// Sends a request whose rule charges after the response, and charges what
/// the response says, even if the client hangs up first: hyper then drops
/// the handler's future, and with it anything still to do, while the
/// upstream, which already has the request, does the work all the same. The
/// exchange and the charge are one future polled in place, which a
/// [`FinishOnDrop`] hands to a task of its own if it is dropped before its
/// end; the request's place among its identity's requests in flight
/// (`max_in_flight`, held by `pending`) is given back when the charge is made.
/// `settling` tracks the exchange: a shutdown awaits it (within
/// `shutdown_grace`) before the worker's runtime, and its tasks, end.
///
/// Why not reserve the rule's cost before forwarding and settle after: a
/// charge is final in every algorithm's decision (only a lease's unused
/// permits go back, `LeaseStore::give_back`, under the fixed window and the
/// sliding window counter), so a reservation would charge every request the most it
/// could cost and refuse requests that would fit once priced. Finishing
/// the exchange charges exactly what the upstream said. Why not always run
/// it in a task: a task per request costs a wake-up and a scheduling hop
/// (about 1.5 µs of a 20 µs proxied request,
/// `scripts/measure-charged-latency.py`); a hung-up client is rare, and
/// only then is the future moved to a task.
///
/// Returns the response with the rate limit headers of the charge (`None`
/// when nothing was charged, or the charge was denied: the peek's headers
/// then stand).
async fn exchange_charged(
    upstream: &Arc<Upstream>,
    limiter: &RateLimiter<crate::store::AnyStore>,
    settling: &tokio_util::task::TaskTracker,
    request: Request<Incoming>,
    client: ClientKey,
    pending: PendingCharge,
) -> Result<(Response<PooledBody>, Option<RateHeaders>), UpstreamError> {
    let upstream = Arc::clone(upstream);
    let limiter = limiter.clone();
    FinishOnDrop::new(settling.track_future(async move {
        let response = upstream.send(request, client).await?;
        let charged = limiter.charge_response(&pending, response.status(), response.headers()).await;
        let headers = charged.filter(Verdict::allowed).map(|v| RateHeaders::of(&v, limiter.legacy_headers()));
        Ok((response, headers))
    }))
    .await
}

/// A future run to its end even when whoever awaits it goes away: polled in
/// place, and spawned on the current runtime (its output dropped) if it is
/// dropped unfinished.
struct FinishOnDrop<T: Send + 'static> {
    future: Option<Pin<Box<dyn Future<Output = T> + Send>>>,
}

impl<T: Send + 'static> FinishOnDrop<T> {
    fn new(future: impl Future<Output = T> + Send + 'static) -> Self {
        Self { future: Some(Box::pin(future)) }
    }
}

impl<T: Send + 'static> Future for FinishOnDrop<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let Some(future) = self.future.as_mut() else {
            panic!("FinishOnDrop polled after completion");
        };
        let output = ready!(future.as_mut().poll(cx));
        self.future = None;
        Poll::Ready(output)
    }
}

impl<T: Send + 'static> Drop for FinishOnDrop<T> {
    fn drop(&mut self) {
        let Some(future) = self.future.take() else { return };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(future)),
            // hyper drops a connection's futures on its worker's runtime.
            Err(_) => tracing::warn!(
                "a request charged after its response was dropped outside a runtime: its charge is lost"
            ),
        }
    }
}

fn bad_request(path: &str, detail: &str) -> Response<ServeBody> {
    boxed(headers::problem(StatusCode::BAD_REQUEST, "about:blank", "Bad Request", detail, Some(path)))
}

fn bad_gateway(path: &str, detail: &str) -> Response<ServeBody> {
    boxed(headers::problem(StatusCode::BAD_GATEWAY, "about:blank", "Bad Gateway", detail, Some(path)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_dropped() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, x-secret-hop"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        h.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert("x-api-key", HeaderValue::from_static("k"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.keys().map(|k| k.as_str()).collect::<Vec<_>>(), ["x-api-key"]);
    }

    #[test]
    fn every_connection_line_names_hops_and_a_lone_hop_header_goes_too() {
        let mut h = HeaderMap::new();
        h.append(header::CONNECTION, HeaderValue::from_static("close"));
        h.append(header::CONNECTION, HeaderValue::from_static(" x-one ,x-two,, not a name "));
        h.append(header::CONNECTION, HeaderValue::from_bytes(b"x-\xff").unwrap());
        for name in ["x-one", "x-two", "x-three"] {
            h.insert(name, HeaderValue::from_static("1"));
        }
        strip_hop_by_hop(&mut h);
        assert_eq!(h.keys().map(|k| k.as_str()).collect::<Vec<_>>(), ["x-three"]);
        // No `Connection` at all: the hop-by-hop names themselves still go.
        let mut h = HeaderMap::new();
        h.insert(header::PROXY_AUTHORIZATION, HeaderValue::from_static("Basic eA=="));
        h.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        h.insert("x-api-key", HeaderValue::from_static("k"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.keys().map(|k| k.as_str()).collect::<Vec<_>>(), ["x-api-key"]);
    }

    #[test]
    fn connection_naming_fixed_hops_in_any_case_removes_only_what_is_there() {
        let mut h = HeaderMap::new();
        h.append(header::CONNECTION, HeaderValue::from_static("TE, Keep-Alive, CLOSE, Upgrade, x-gone"));
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        h.insert("x-api-key", HeaderValue::from_static("k"));
        strip_hop_by_hop(&mut h);
        let mut left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["x-api-key", "x-kept"]);
        // A message with no hop-by-hop header at all is left as it was.
        let mut h = HeaderMap::new();
        h.insert("x-connection", HeaderValue::from_static("x-api-key"));
        h.insert("x-api-key", HeaderValue::from_static("k"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 2);
    }

    #[test]
    fn the_peer_is_appended_to_x_forwarded_for() {
        let peer = forwarded_for_value("198.51.100.7:5000".parse().unwrap());
        let mut h = HeaderMap::new();
        append_forwarded_for(&mut h, &peer);
        assert_eq!(h["x-forwarded-for"], "198.51.100.7");
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", HeaderValue::from_static("1.1.1.1"));
        h.append("x-forwarded-for", HeaderValue::from_static("2.2.2.2, 3.3.3.3"));
        append_forwarded_for(&mut h, &peer);
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(h["x-forwarded-for"], "1.1.1.1, 2.2.2.2, 3.3.3.3, 198.51.100.7");
        assert_eq!(forwarded_for_value("[::ffff:10.0.0.1]:80".parse().unwrap()), "10.0.0.1");
    }
}
