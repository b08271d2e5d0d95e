//! The tower middleware: [`RateLimitLayer`] builds [`RateLimit`] services.
//!
//! Works with anything built on `http` requests and responses, whatever the
//! body type. Denied requests are answered here and never reach the inner
//! service; allowed ones get the rate limit headers added to the inner
//! service's response.
//!
//! The client address comes from the [`PeerAddr`] request extension; each
//! server keeps the socket peer somewhere of its own, so one line per server
//! copies it there, or [`RateLimitLayer::peer_from`] reads it where the
//! server keeps it. Without it, every client is counted as one.
//!
//! - axum: `Router::layer(RateLimitLayer::new(limiter))`, then
//!   `.layer(axum::middleware::map_request(..))` outside it copying
//!   `ConnectInfo<SocketAddr>` into [`PeerAddr`] (shown on [`PeerAddr`];
//!   `examples/axum.rs`); or, with no copy per request,
//!   `RateLimitLayer::new(limiter).peer_from(..)` reading `ConnectInfo`
//!   (shown on [`RateLimitLayer::peer_from`]).
//! - hyper: wrap the service with `hyper_util::service::TowerToHyperService`
//!   and insert [`PeerAddr`] per connection, where the socket is accepted
//!   (`examples/hyper.rs`).
//! - tonic: `Server::builder().layer(..)`, with a `map_request` copying
//!   tonic's `TcpConnectInfo` into [`PeerAddr`] (`examples/tonic.rs`). A
//!   gRPC call is denied in gRPC's own terms, as `serve` denies it
//!   ([`crate::grpc`]): `grpc-status` 8, `RESOURCE_EXHAUSTED`, for a 429
//!   (14, `UNAVAILABLE`, with [`RateLimitLayer::grpc_denial`]), with the
//!   rate limit headers as metadata. The test of the example checks it with
//!   a tonic client.
//!
//! Every request goes through [`RateLimiter::admit`], the admission
//! pipeline `serve` runs too: header clean-up, refused paths (400),
//! ambiguous API keys (400), the check, the denial.
//!
//! A rule charged after the response (`cost_header`, `count_status`) is
//! charged when the inner service answers, and its cost header is removed
//! from the response. When the server drops the response future first (hyper
//! does when the client hangs up), the inner service's future is dropped
//! with it and its answer never comes: the request is then charged the most
//! its answer could have cost ([`RateLimiter::charge_abandoned`]), in a task
//! spawned on the current tokio runtime, so hanging up never costs less than
//! waiting. A charge under way when the future is dropped is finished the
//! same way. Without a tokio runtime at that moment the charge is lost
//! (logged): serve the layer from tokio, as axum, hyper-util and tonic do.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{ready, Context, Poll, Waker};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{Either, Full};
use pin_project_lite::pin_project;
use slidegate::Store;
use tower_layer::Layer;
use tower_service::Service;

use crate::grpc::GrpcDenialStatus;
use crate::headers::RateHeaders;
use crate::limiter::RateLimiter;
use crate::verdict::{PendingCharge, Verdict};

/// The socket peer of a request, as a request extension: the address
/// [`RateLimit`] counts anonymous clients by (after the trusted-proxy
/// headers the identity configuration names).
///
/// Insert it where the server knows the connection. In axum, copy it from
/// `ConnectInfo`, outside the rate limit layer:
///
/// ```
/// use std::net::SocketAddr;
///
/// use axum::extract::{ConnectInfo, Request};
/// use axum::{middleware, routing::get, Router};
/// use slidegate::{Algorithm, Limit, MemoryStore, Quota};
/// use slidegate_http::config::{IdentityKind, LimitConfig, RuleConfig, RuleLimits};
/// use slidegate_http::{LimiterConfig, PeerAddr, RateLimitLayer, RateLimiter};
///
/// /// Fails with a 500 when the app is served without connect info, rather
/// /// than counting every client as one.
/// async fn peer_addr(ConnectInfo(addr): ConnectInfo<SocketAddr>, mut request: Request) -> Request {
///     request.extensions_mut().insert(PeerAddr(addr));
///     request
/// }
///
/// let limit = Limit::new(Algorithm::SlidingWindowCounter, Quota::per_minute(100)?);
/// let limits = vec![LimitConfig::new("all", limit, 1)?];
/// let mut config = LimiterConfig::default();
/// config.rules.push(RuleConfig::new("all", "/*".parse()?, RuleLimits::Shared { identity: IdentityKind::Ip, limits }));
/// let app: Router = Router::new()
///     .route("/", get(|| async { "hello" }))
///     .layer(RateLimitLayer::new(RateLimiter::from_config(&config, MemoryStore::new())?))
///     // Added last, so it runs first.
///     .layer(middleware::map_request(peer_addr));
/// // Serve with `app.into_make_service_with_connect_info::<SocketAddr>()`.
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// The response body of a [`RateLimit`] service: the inner body, or ours.
pub type RateLimitBody<B> = Either<B, Full<Bytes>>;

/// Builds [`RateLimit`] services around a shared [`RateLimiter`].
///
/// ```
/// use slidegate::{Algorithm, Limit, MemoryStore, Quota};
/// use slidegate_http::config::{IdentityKind, LimitConfig, RuleConfig, RuleLimits};
/// use slidegate_http::{LimiterConfig, RateLimitLayer, RateLimiter};
///
/// let limit = Limit::new(Algorithm::SlidingWindowCounter, Quota::per_minute(100)?);
/// let limits = vec![LimitConfig::new("api", limit, 1)?];
/// let mut config = LimiterConfig::default();
/// config.rules.push(RuleConfig::new("api", "/api/*".parse()?, RuleLimits::Shared { identity: IdentityKind::Ip, limits }));
/// let layer = RateLimitLayer::new(RateLimiter::from_config(&config, MemoryStore::new())?);
/// # drop(layer);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RateLimitLayer<S> {
    limiter: RateLimiter<S>,
    peer: PeerFn,
    grpc_denial: GrpcDenialStatus,
}

/// Where a request's socket peer is read from, in its extensions: the
/// [`PeerAddr`] extension unless [`RateLimitLayer::peer_from`] says otherwise.
///
/// A plain function, so the layer needs to know no server's types: in axum,
/// `|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|info| info.0)` reads the
/// peer axum already keeps, with no `map_request` copying it per request.
pub type PeerFn = fn(&http::Extensions) -> Option<SocketAddr>;

/// The default [`PeerFn`]: the [`PeerAddr`] extension.
fn peer_addr_extension(extensions: &http::Extensions) -> Option<SocketAddr> {
    extensions.get::<PeerAddr>().map(|peer| peer.0)
}

// By hand: a derive would ask for `S: Clone`, and the limiter shares its store.
impl<S> Clone for RateLimitLayer<S> {
    fn clone(&self) -> Self {
        Self { limiter: self.limiter.clone(), peer: self.peer, grpc_denial: self.grpc_denial }
    }
}

impl<S> RateLimitLayer<S> {
    /// A layer deciding with `limiter`; the client address comes from the
    /// [`PeerAddr`] extension.
    pub fn new(limiter: RateLimiter<S>) -> Self {
        Self { limiter, peer: peer_addr_extension, grpc_denial: GrpcDenialStatus::default() }
    }

    /// The gRPC status of a rate limit denial of a gRPC call:
    /// `RESOURCE_EXHAUSTED` (8) unless set to [`GrpcDenialStatus::Unavailable`]
    /// (14), as `serve`'s `[server] grpc_denial_status`. See [`crate::grpc`].
    pub fn grpc_denial(mut self, status: GrpcDenialStatus) -> Self {
        self.grpc_denial = status;
        self
    }

    /// Reads the client address with `peer` instead of from [`PeerAddr`]:
    /// from the extension the server itself keeps it in. A request `peer`
    /// finds no address for is counted as an unknown client, as one
    /// without [`PeerAddr`] is.
    ///
    /// ```
    /// use std::net::SocketAddr;
    ///
    /// use axum::extract::ConnectInfo;
    /// use axum::{routing::get, Router};
    /// use slidegate::{Algorithm, Limit, MemoryStore, Quota};
    /// use slidegate_http::config::{IdentityKind, LimitConfig, RuleConfig, RuleLimits};
    /// use slidegate_http::{LimiterConfig, RateLimitLayer, RateLimiter};
    ///
    /// let limit = Limit::new(Algorithm::SlidingWindowCounter, Quota::per_minute(100)?);
    /// let limits = vec![LimitConfig::new("all", limit, 1)?];
    /// let mut config = LimiterConfig::default();
    /// config.rules.push(RuleConfig::new("all", "/*".parse()?, RuleLimits::Shared { identity: IdentityKind::Ip, limits }));
    /// let layer = RateLimitLayer::new(RateLimiter::from_config(&config, MemoryStore::new())?)
    ///     .peer_from(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|info| info.0));
    /// let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(layer);
    /// // Serve with `app.into_make_service_with_connect_info::<SocketAddr>()`.
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peer_from(mut self, peer: PeerFn) -> Self {
        self.peer = peer;
        self
    }
}

impl<S, Inner> Layer<Inner> for RateLimitLayer<S> {
    type Service = RateLimit<Inner, S>;

    fn layer(&self, inner: Inner) -> Self::Service {
        RateLimit { inner, limiter: self.limiter.clone(), peer: self.peer, grpc_denial: self.grpc_denial }
    }
}

/// A service that rate-limits requests before `Inner` sees them.
pub struct RateLimit<Inner, S> {
    inner: Inner,
    limiter: RateLimiter<S>,
    peer: PeerFn,
    grpc_denial: GrpcDenialStatus,
}

impl<Inner: Clone, S> Clone for RateLimit<Inner, S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            limiter: self.limiter.clone(),
            peer: self.peer,
            grpc_denial: self.grpc_denial,
        }
    }
}

impl<Inner, S> RateLimit<Inner, S> {
    /// `inner`, rate-limited by `limiter`; the client address comes from
    /// the [`PeerAddr`] extension.
    pub fn new(inner: Inner, limiter: RateLimiter<S>) -> Self {
        Self { inner, limiter, peer: peer_addr_extension, grpc_denial: GrpcDenialStatus::default() }
    }

    /// The gRPC status of a rate limit denial of a gRPC call, as
    /// [`RateLimitLayer::grpc_denial`].
    pub fn grpc_denial(mut self, status: GrpcDenialStatus) -> Self {
        self.grpc_denial = status;
        self
    }

    /// The inner service.
    pub fn get_ref(&self) -> &Inner {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut Inner {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> Inner {
        self.inner
    }
}

impl<Inner, S, B, ResBody> Service<Request<B>> for RateLimit<Inner, S>
where
    Inner: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S: Store + 'static,
    B: Send + 'static,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = Inner::Error;
    type Future = ResponseFuture<Inner, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let limiter = self.limiter.clone();
        let peer = (self.peer)(request.extensions()).map(|addr| addr.ip());
        let grpc_denial = self.grpc_denial;
        let mut check: CheckFuture<B> = Box::pin(async move {
            let mut admission = limiter.admit(&mut request, peer, grpc_denial).await;
            if let Some(refusal) = admission.refusal(request.uri().path()) {
                return Decided::Blocked(refusal);
            }
            // The headers are rendered here because the verdict borrows the
            // limiter, which stays in this future.
            let pending = admission.verdict.as_mut().and_then(Verdict::take_pending);
            let cost_header = limiter.cost_headers().clone();
            let headers = match &admission.verdict {
                Some(verdict) => RateHeaders::of(verdict, limiter.legacy_headers()),
                None => RateHeaders::default(),
            };
            // A rule counting responses charges when the inner service has
            // answered: the charge runs on its own clone of the limiter.
            let charge = pending.map(|pending| AfterResponse::new(limiter.clone(), pending));
            Decided::Allowed { request, headers, cost_header, charge }
        });
        // The check is polled here once: the embedded store, the deny cache
        // and the breaker answer at once, and then the service driven to
        // readiness is called now, with no clone of it kept for later. A
        // check that waits (a remote store, a rule's `delay`) is polled again
        // by the response future with the caller's waker; spurious polls are
        // allowed, so the one here with a waker that does nothing loses no
        // wake-up.
        let state = match check.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(Decided::Blocked(response)) => State::Blocked { response: Some(response) },
            Poll::Ready(Decided::Allowed { request, headers, cost_header, charge }) => {
                State::Forwarding { future: self.inner.call(request), headers, cost_header, charge }
            }
            Poll::Pending => {
                // The service that was driven to readiness serves this
                // request; a clone, not yet ready, stays behind for the next one.
                let clone = self.inner.clone();
                let inner = std::mem::replace(&mut self.inner, clone);
                State::Checking { check, inner: Some(inner) }
            }
        };
        ResponseFuture { state }
    }
}

/// What the check decided: answer here, or the request to pass to the
/// inner service with the headers to add to its response (and the cost
/// header to take out of it).
// Moved once, out of the check: boxing the allowed request to even the
// variants out would cost an allocation on every request.
#[allow(clippy::large_enum_variant)]
enum Decided<B> {
    Blocked(Response<Full<Bytes>>),
    Allowed {
        request: Request<B>,
        headers: RateHeaders,
        cost_header: crate::CostHeaders,
        charge: Option<AfterResponse>,
    },
}

/// The charge after the response: given its status and headers (`None`: the
/// answer will never come), the rate limit headers of the charge's decision
/// (empty when nothing was charged).
type ChargeFn = Box<dyn FnOnce(Option<(StatusCode, HeaderMap)>) -> ChargeFuture + Send>;
type ChargeFuture = Pin<Box<dyn Future<Output = RateHeaders> + Send>>;

/// A charge owed after the response, made even if the response future is
/// dropped before the inner service answers: then as abandoned, in a task.
struct AfterResponse {
    charge: Option<ChargeFn>,
}

impl AfterResponse {
    fn new<S: Store + 'static>(limiter: RateLimiter<S>, pending: PendingCharge) -> Self {
        let charge: ChargeFn = Box::new(move |answer| {
            Box::pin(async move {
                let charged = match &answer {
                    Some((status, headers)) => limiter.charge_response(&pending, *status, headers).await,
                    None => limiter.charge_abandoned(&pending).await,
                };
                match charged {
                    Some(v) if v.allowed() => RateHeaders::of(&v, limiter.legacy_headers()),
                    _ => RateHeaders::default(),
                }
            })
        });
        Self { charge: Some(charge) }
    }

    /// The charge for the inner service's answer.
    fn settle(mut self, status: StatusCode, headers: HeaderMap) -> Charging {
        Charging { future: self.charge.take().map(|charge| charge(Some((status, headers)))) }
    }

    /// No charge: the inner service failed, which is no answer the client
    /// walked away from.
    fn cancel(mut self) {
        self.charge = None;
    }
}

impl Drop for AfterResponse {
    fn drop(&mut self) {
        if let Some(charge) = self.charge.take() {
            finish_detached(charge(None));
        }
    }
}

/// A charge under way, finished in a task if dropped before it is done.
struct Charging {
    future: Option<ChargeFuture>,
}

impl Charging {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<RateHeaders> {
        let Some(future) = self.future.as_mut() else { return Poll::Ready(RateHeaders::default()) };
        let headers = ready!(future.as_mut().poll(cx));
        self.future = None;
        Poll::Ready(headers)
    }
}

impl Drop for Charging {
    fn drop(&mut self) {
        if let Some(future) = self.future.take() {
            finish_detached(future);
        }
    }
}

/// Runs a charge to its end in a task of the current tokio runtime.
fn finish_detached(charge: ChargeFuture) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn(charge)),
        Err(_) => tracing::warn!(
            "a request charged after its response was dropped outside a tokio runtime: its charge is lost"
        ),
    }
}

/// The check, boxed: the store's `decide` is an `async fn` of the [`Store`]
/// trait, whose future has no name a field could hold.
type CheckFuture<B> = Pin<Box<dyn Future<Output = Decided<B>> + Send>>;

pin_project! {
    /// The response future of [`RateLimit`]: the rate limit check when it
    /// did not answer at once, then the inner service's future, polled in
    /// place.
    pub struct ResponseFuture<Inner, B>
    where
        Inner: Service<Request<B>>,
    {
        #[pin]
        state: State<Inner, B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<Inner, B>
    where
        Inner: Service<Request<B>>,
    {
        Checking { check: CheckFuture<B>, inner: Option<Inner> },
        Blocked { response: Option<Response<Full<Bytes>>> },
        Forwarding { #[pin] future: Inner::Future, headers: RateHeaders, cost_header: crate::CostHeaders, charge: Option<AfterResponse> },
        Charging { charge: Charging, response: Option<Result<Inner::Response, Inner::Error>>, headers: RateHeaders },
    }
}

impl<Inner, B, ResBody> Future for ResponseFuture<Inner, B>
where
    Inner: Service<Request<B>, Response = Response<ResBody>>,
{
    type Output = Result<Response<RateLimitBody<ResBody>>, Inner::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Checking { check, inner } => match ready!(check.as_mut().poll(cx)) {
                    Decided::Blocked(response) => return Poll::Ready(Ok(response.map(Either::Right))),
                    Decided::Allowed { request, headers, cost_header, charge } => {
                        let Some(mut inner) = inner.take() else {
                            panic!("ResponseFuture polled after completion");
                        };
                        let future = inner.call(request);
                        state.set(State::Forwarding { future, headers, cost_header, charge })
                    }
                },
                StateProj::Blocked { response } => {
                    let Some(response) = response.take() else {
                        panic!("ResponseFuture polled after completion");
                    };
                    return Poll::Ready(Ok(response.map(Either::Right)));
                }
                StateProj::Forwarding { future, headers, cost_header, charge } => {
                    let mut response = match ready!(future.poll(cx)) {
                        Ok(response) => response,
                        Err(err) => {
                            if let Some(charge) = charge.take() {
                                charge.cancel();
                            }
                            return Poll::Ready(Err(err));
                        }
                    };
                    let charge =
                        charge.take().map(|c| c.settle(response.status(), response.headers().clone()));
                    cost_header.strip(response.headers_mut());
                    if let Some(charge) = charge {
                        let headers = std::mem::take(headers);
                        state.set(State::Charging { charge, response: Some(Ok(response)), headers });
                        continue;
                    }
                    // Each name replaces the inner service's value.
                    std::mem::take(headers).insert_into(response.headers_mut());
                    return Poll::Ready(Ok(response.map(Either::Left)));
                }
                StateProj::Charging { charge, response, headers } => {
                    let charged = ready!(charge.poll(cx));
                    let Some(Ok(mut response)) = response.take() else {
                        panic!("ResponseFuture polled after completion");
                    };
                    std::mem::take(headers).insert_into(response.headers_mut());
                    // The charge's headers, when it decided, say what is left after it.
                    charged.insert_into(response.headers_mut());
                    return Poll::Ready(Ok(response.map(Either::Left)));
                }
            }
        }
    }
}

impl<Inner: Service<Request<B>>, B> std::fmt::Debug for ResponseFuture<Inner, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
