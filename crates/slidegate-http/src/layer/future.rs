//! [`ResponseFuture`]: the check when it waits, the inner service's answer,
//! and the charge after the response.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{Either, Full};
use pin_project_lite::pin_project;
use slidegate::Store;
use tower_service::Service;

use crate::headers::RateHeaders;
use crate::limiter::RateLimiter;
use crate::verdict::PendingCharge;

use super::RateLimitBody;

/// What the check decided: answer here, or the request to pass to the
/// inner service with the headers to add to its response (and the cost
/// header to take out of it).
// Moved once, out of the check: boxing the allowed request to even the
// variants out would cost an allocation on every request.
#[allow(clippy::large_enum_variant)]
pub(super) enum Decided<B> {
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
pub(super) struct AfterResponse {
    charge: Option<ChargeFn>,
}

impl AfterResponse {
    pub(super) fn new<S: Store + 'static>(limiter: RateLimiter<S>, pending: PendingCharge) -> Self {
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
pub(super) type CheckFuture<B> = Pin<Box<dyn Future<Output = Decided<B>> + Send>>;

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
    pub(super) enum State<Inner, B>
    where
        Inner: Service<Request<B>>,
    {
        Checking { check: CheckFuture<B>, inner: Option<Inner> },
        Blocked { response: Option<Response<Full<Bytes>>> },
        Forwarding { #[pin] future: Inner::Future, headers: RateHeaders, cost_header: crate::CostHeaders, charge: Option<AfterResponse> },
        Charging { charge: Charging, response: Option<Result<Inner::Response, Inner::Error>>, headers: RateHeaders },
    }
}

impl<Inner: Service<Request<B>>, B> ResponseFuture<Inner, B> {
    pub(super) fn new(state: State<Inner, B>) -> Self {
        Self { state }
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
