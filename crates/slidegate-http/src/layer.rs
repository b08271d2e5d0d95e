//! The tower middleware: [`RateLimitLayer`] builds [`RateLimit`] services.
//!
//! Works with anything built on `http` requests and responses. Denied
//! requests are answered here and never reach the inner service; allowed ones
//! get the rate limit headers added to the inner service's response.
//!
//! - axum: `Router::layer(RateLimitLayer::new(limiter).peer_addr(..))`, the peer
//!   read from `ConnectInfo<SocketAddr>` (see `examples/axum.rs`).
//! - hyper: wrap the service with `hyper_util::service::TowerToHyperService`
//!   and insert a [`PeerAddr`] extension per connection (as `serve` does).
//! - tonic: `Server::builder().layer(..)`; a denial is an HTTP 429, which gRPC
//!   clients map to `UNAVAILABLE` (gRPC's HTTP-to-status mapping). Not
//!   exercised by a test here.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{Either, Full};
use slidegate::Store;
use tower_layer::Layer;
use tower_service::Service;

use crate::headers;
use crate::limiter::RateLimiter;

/// The socket peer of a request, as a request extension. `serve` inserts it;
/// with other servers, insert it yourself or give the layer a
/// [`RateLimitLayer::peer_addr`] function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// Reads the peer address of a request.
pub type PeerFn<B> = Arc<dyn Fn(&Request<B>) -> Option<IpAddr> + Send + Sync>;

/// The response body of a [`RateLimit`] service: the inner body, or ours.
pub type RateLimitBody<B> = Either<B, Full<Bytes>>;

/// Builds [`RateLimit`] services around a shared [`RateLimiter`].
///
/// ```
/// use slidegate::MemoryStore;
/// use slidegate_http::{Config, RateLimitLayer, RateLimiter};
///
/// let config = Config::parse(r#"
/// [[rules]]
/// name = "api"
/// path = "/api/*"
/// limits = [{ limit = 100, window = "60s" }]
/// "#, "inline.toml")?;
/// let layer: RateLimitLayer<MemoryStore, String> =
///     RateLimitLayer::new(RateLimiter::from_config(&config, MemoryStore::new()));
/// # Ok::<(), slidegate_http::ConfigError>(())
/// ```
pub struct RateLimitLayer<S, B> {
    limiter: RateLimiter<S>,
    peer: PeerFn<B>,
}

impl<S, B> Clone for RateLimitLayer<S, B> {
    fn clone(&self) -> Self {
        Self { limiter: self.limiter.clone(), peer: Arc::clone(&self.peer) }
    }
}

impl<S, B> RateLimitLayer<S, B> {
    /// A layer deciding with `limiter`; the peer address comes from the
    /// [`PeerAddr`] extension.
    pub fn new(limiter: RateLimiter<S>) -> Self {
        Self {
            limiter,
            peer: Arc::new(|req: &Request<B>| req.extensions().get::<PeerAddr>().map(|p| p.0.ip())),
        }
    }

    /// Reads the peer address with `peer` instead, e.g. from axum's
    /// `ConnectInfo<SocketAddr>` extension.
    pub fn peer_addr(mut self, peer: impl Fn(&Request<B>) -> Option<IpAddr> + Send + Sync + 'static) -> Self {
        self.peer = Arc::new(peer);
        self
    }
}

impl<S, B, Inner> Layer<Inner> for RateLimitLayer<S, B> {
    type Service = RateLimit<Inner, S, B>;

    fn layer(&self, inner: Inner) -> Self::Service {
        RateLimit { inner, limiter: self.limiter.clone(), peer: Arc::clone(&self.peer) }
    }
}

/// A service that rate-limits requests before `Inner` sees them.
pub struct RateLimit<Inner, S, B> {
    inner: Inner,
    limiter: RateLimiter<S>,
    peer: PeerFn<B>,
}

impl<Inner: Clone, S, B> Clone for RateLimit<Inner, S, B> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone(), limiter: self.limiter.clone(), peer: Arc::clone(&self.peer) }
    }
}

impl<Inner, S, B, ResBody> Service<Request<B>> for RateLimit<Inner, S, B>
where
    Inner: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    Inner::Future: Send,
    S: Store + 'static,
    B: Send + 'static,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = Inner::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The clone that was driven to readiness serves this request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let limiter = self.limiter.clone();
        let peer = (self.peer)(&request);
        Box::pin(async move {
            let verdict =
                limiter.check_request(request.method(), request.uri().path(), request.headers(), peer).await;
            match verdict {
                None => Ok(inner.call(request).await?.map(Either::Left)),
                Some(verdict) if verdict.blocks() => {
                    let response =
                        headers::blocked_response(&verdict, limiter.legacy_headers(), request.uri().path());
                    Ok(response.map(Either::Right))
                }
                Some(verdict) => {
                    let mut response = inner.call(request).await?;
                    headers::apply(response.headers_mut(), &verdict, limiter.legacy_headers());
                    Ok(response.map(Either::Left))
                }
            }
        })
    }
}
