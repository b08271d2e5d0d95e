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

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{Either, Full};
use tower_layer::Layer;

use crate::grpc::GrpcDenialStatus;
use crate::limiter::RateLimiter;

mod future;
mod service;

pub use future::ResponseFuture;
pub use service::RateLimit;

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
