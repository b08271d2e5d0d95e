//! [`RateLimit`], the service: the check made at the call, polled once in place.

use std::task::{Context, Poll, Waker};

use http::{Request, Response};
use slidegate::Store;
use tower_service::Service;

use crate::grpc::GrpcDenialStatus;
use crate::headers::RateHeaders;
use crate::limiter::RateLimiter;
use crate::verdict::Verdict;

use super::future::{AfterResponse, CheckFuture, Decided, ResponseFuture, State};
use super::{peer_addr_extension, PeerFn, RateLimitBody};

/// A service that rate-limits requests before `Inner` sees them.
pub struct RateLimit<Inner, S> {
    pub(super) inner: Inner,
    pub(super) limiter: RateLimiter<S>,
    pub(super) peer: PeerFn,
    pub(super) grpc_denial: GrpcDenialStatus,
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
    /// the [`PeerAddr`](super::PeerAddr) extension.
    pub fn new(inner: Inner, limiter: RateLimiter<S>) -> Self {
        Self { inner, limiter, peer: peer_addr_extension, grpc_denial: GrpcDenialStatus::default() }
    }

    /// The gRPC status of a rate limit denial of a gRPC call, as
    /// [`RateLimitLayer::grpc_denial`](super::RateLimitLayer::grpc_denial).
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
        ResponseFuture::new(state)
    }
}
