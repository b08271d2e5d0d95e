//! [`ServeBody`], the one body type of every response `serve` sends.

use bytes::Bytes;
use http::Response;
use http_body_util::combinators::BoxBody;
use http_body_util::BodyExt;

/// The body of every response `serve` sends.
pub type ServeBody = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// A boxed body holding `bytes`.
pub(crate) fn full(bytes: impl Into<Bytes>) -> ServeBody {
    http_body_util::Full::new(bytes.into()).map_err(|never| match never {}).boxed()
}

/// Boxes a full-body response.
pub(crate) fn boxed(response: Response<http_body_util::Full<Bytes>>) -> Response<ServeBody> {
    response.map(|body| body.map_err(|never| match never {}).boxed())
}

/// What went wrong on the client's side of a forwarded request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClientFault {
    /// The body broke the protocol (a malformed chunk, a connection cut short).
    Malformed,
    /// The body stayed silent longer than `[server] body_timeout`.
    Timeout,
}

/// Where a [`RequestBody`] records a [`ClientFault`] for the code that sent it.
#[derive(Debug, Default)]
pub(crate) struct FaultCell(std::sync::atomic::AtomicU8);

impl FaultCell {
    fn set(&self, fault: ClientFault) {
        let code = match fault {
            ClientFault::Malformed => 1,
            ClientFault::Timeout => 2,
        };
        self.0.store(code, std::sync::atomic::Ordering::Relaxed);
    }

    /// The fault recorded, if any.
    pub(crate) fn get(&self) -> Option<ClientFault> {
        match self.0.load(std::sync::atomic::Ordering::Relaxed) {
            1 => Some(ClientFault::Malformed),
            2 => Some(ClientFault::Timeout),
            _ => None,
        }
    }
}

/// Why a [`RequestBody`] stopped: the body was silent too long.
#[derive(Debug, thiserror::Error)]
#[error("the request body sent nothing for {0:?}")]
struct BodyTimeout(std::time::Duration);

pin_project_lite::pin_project! {
    /// A client's request body on its way upstream: fails when it stays silent
    /// longer than its idle timeout (a client trickling bytes would otherwise
    /// pin an upstream connection for as long as it likes), and records whose
    /// fault a failure was, so the client gets 400 or 408 rather than 502.
    pub(crate) struct RequestBody {
        #[pin]
        inner: hyper::body::Incoming,
        idle: std::time::Duration,
        #[pin]
        deadline: tokio::time::Sleep,
        // The clock starts when the upstream first asks for the body, not
        // while the request waits for a connection.
        started: bool,
        fault: std::sync::Arc<FaultCell>,
    }
}

impl RequestBody {
    /// Wraps `inner`; it may stay silent for `idle` at a time.
    pub(crate) fn new(
        inner: hyper::body::Incoming,
        idle: std::time::Duration,
        fault: std::sync::Arc<FaultCell>,
    ) -> Self {
        Self { inner, idle, deadline: tokio::time::sleep(idle), started: false, fault }
    }
}

impl hyper::body::Body for RequestBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        use std::future::Future;
        use std::task::Poll;
        let mut this = self.project();
        if !*this.started {
            *this.started = true;
            this.deadline.as_mut().reset(tokio::time::Instant::now() + *this.idle);
        }
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.deadline.as_mut().reset(tokio::time::Instant::now() + *this.idle);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(err))) => {
                this.fault.set(ClientFault::Malformed);
                Poll::Ready(Some(Err(err.into())))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match this.deadline.poll(cx) {
                Poll::Ready(()) => {
                    this.fault.set(ClientFault::Timeout);
                    Poll::Ready(Some(Err(BodyTimeout(*this.idle).into())))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}
