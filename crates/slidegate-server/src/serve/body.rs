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
    /// The body arrived slower than `[server] min_body_rate` after its grace.
    TooSlow,
}

/// Where a [`RequestBody`] records a [`ClientFault`] for the code that sent it.
#[derive(Debug, Default)]
pub(crate) struct FaultCell(std::sync::atomic::AtomicU8);

impl FaultCell {
    fn set(&self, fault: ClientFault) {
        let code = match fault {
            ClientFault::Malformed => 1,
            ClientFault::Timeout => 2,
            ClientFault::TooSlow => 3,
        };
        self.0.store(code, std::sync::atomic::Ordering::Relaxed);
    }

    /// The fault recorded, if any.
    pub(crate) fn get(&self) -> Option<ClientFault> {
        match self.0.load(std::sync::atomic::Ordering::Relaxed) {
            1 => Some(ClientFault::Malformed),
            2 => Some(ClientFault::Timeout),
            3 => Some(ClientFault::TooSlow),
            _ => None,
        }
    }
}

/// Why a [`RequestBody`] stopped: silent too long, or too slow on average.
#[derive(Debug, thiserror::Error)]
enum BodyStopped {
    #[error("the request body sent nothing for {0:?}")]
    Silent(std::time::Duration),
    #[error("the request body arrived slower than {0} bytes/s")]
    TooSlow(u32),
}

/// How slowly a request body may arrive: after `grace`, at `bytes_per_second`
/// on average (Apache's `mod_reqtimeout` `MinRate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BodyPace {
    /// The longest silence between two pieces of the body.
    pub(crate) idle: std::time::Duration,
    /// The minimum average rate; 0: none.
    pub(crate) bytes_per_second: u32,
    /// How long the body may take before the rate applies.
    pub(crate) grace: std::time::Duration,
}

impl BodyPace {
    /// When a body that has sent `received` bytes and kept us waiting for
    /// `waited` falls below the rate, counted from `since`, the moment it
    /// started keeping us waiting again; `None` without a minimum rate.
    fn too_slow_at(
        &self,
        since: tokio::time::Instant,
        received: u64,
        waited: std::time::Duration,
    ) -> Option<tokio::time::Instant> {
        if self.bytes_per_second == 0 {
            return None;
        }
        // The body has earned `received / rate` of waiting beyond the grace.
        let earned_nanos = u128::from(received) * 1_000_000_000 / u128::from(self.bytes_per_second);
        let earned = std::time::Duration::from_nanos(u64::try_from(earned_nanos).unwrap_or(u64::MAX));
        let allowed = self.grace.saturating_add(earned).saturating_sub(waited);
        Some(since.checked_add(allowed).unwrap_or(since + std::time::Duration::from_secs(86_400 * 365)))
    }
}

pin_project_lite::pin_project! {
    /// A client's request body on its way upstream: fails when it stays silent
    /// longer than its idle timeout, or when, after a grace, it arrives
    /// slower than a minimum average rate (a client trickling bytes would
    /// otherwise pin an upstream connection for as long as it likes), and
    /// records whose fault a failure was, so the client gets 400 or 408
    /// rather than 502.
    ///
    /// The rate counts only the time the body kept the upstream waiting: from
    /// a poll that found nothing to read until the next bytes. While the
    /// upstream is not asking for more (its own back-pressure), the client is
    /// not charged for the time.
    pub(crate) struct RequestBody {
        #[pin]
        inner: hyper::body::Incoming,
        pace: BodyPace,
        #[pin]
        deadline: tokio::time::Sleep,
        // The clock starts when the upstream first asks for the body, not
        // while the request waits for a connection.
        started: bool,
        // When the body falls silent for too long.
        silent_at: tokio::time::Instant,
        // Bytes received so far.
        received: u64,
        // Time spent waiting on the client before the current wait.
        waited: std::time::Duration,
        // When the current wait on the client began.
        waiting_since: Option<tokio::time::Instant>,
        fault: std::sync::Arc<FaultCell>,
    }
}

impl RequestBody {
    /// Wraps `inner`, to arrive at `pace`.
    pub(crate) fn new(
        inner: hyper::body::Incoming,
        pace: BodyPace,
        fault: std::sync::Arc<FaultCell>,
    ) -> Self {
        // Both reset when the upstream first asks for the body: one clock read here.
        let deadline = tokio::time::sleep(pace.idle);
        Self {
            inner,
            pace,
            started: false,
            silent_at: deadline.deadline(),
            deadline,
            received: 0,
            waited: std::time::Duration::ZERO,
            waiting_since: None,
            fault,
        }
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
            *this.silent_at = tokio::time::Instant::now() + this.pace.idle;
        }
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let now = tokio::time::Instant::now();
                if let Some(since) = this.waiting_since.take() {
                    *this.waited += now.saturating_duration_since(since);
                }
                *this.received += frame.data_ref().map_or(0, |d| d.len() as u64);
                *this.silent_at = now + this.pace.idle;
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(err))) => {
                this.fault.set(ClientFault::Malformed);
                Poll::Ready(Some(Err(err.into())))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                let since = *this.waiting_since.get_or_insert_with(tokio::time::Instant::now);
                let slow_at = this.pace.too_slow_at(since, *this.received, *this.waited);
                let (at, fault) = match slow_at {
                    Some(slow_at) if slow_at < *this.silent_at => (slow_at, ClientFault::TooSlow),
                    _ => (*this.silent_at, ClientFault::Timeout),
                };
                if this.deadline.deadline() != at {
                    this.deadline.as_mut().reset(at);
                }
                match this.deadline.poll(cx) {
                    Poll::Ready(()) => {
                        this.fault.set(fault);
                        let err = match fault {
                            ClientFault::TooSlow => BodyStopped::TooSlow(this.pace.bytes_per_second),
                            _ => BodyStopped::Silent(this.pace.idle),
                        };
                        Poll::Ready(Some(Err(err.into())))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::BodyPace;

    fn pace(bytes_per_second: u32, grace_s: u64) -> BodyPace {
        BodyPace { idle: Duration::from_secs(30), bytes_per_second, grace: Duration::from_secs(grace_s) }
    }

    #[test]
    fn a_body_earns_waiting_time_by_the_bytes_it_sent() {
        let since = tokio::time::Instant::now();
        let at =
            |p: BodyPace, received, waited_s| p.too_slow_at(since, received, Duration::from_secs(waited_s));
        // Nothing sent: the grace alone.
        assert_eq!(at(pace(500, 10), 0, 0), Some(since + Duration::from_secs(10)));
        // 1,000 bytes earn 2 s at 500 bytes/s; 4 s already waited are spent.
        assert_eq!(at(pace(500, 10), 1000, 4), Some(since + Duration::from_secs(8)));
        // One byte every 5 s for 35 s (7 bytes): past the grace, behind the rate.
        assert_eq!(at(pace(500, 10), 7, 35), Some(since));
        // No minimum rate.
        assert_eq!(at(pace(0, 10), 0, 1000), None);
        // Extremes saturate rather than overflow.
        assert!(at(pace(1, u64::MAX / 2), u64::MAX, 0).is_some());
    }
}
