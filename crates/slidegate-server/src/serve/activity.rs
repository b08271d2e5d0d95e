//! What a connection is doing, for its timeouts: whether a request came
//! yet (`header_timeout` on the first one), how many are in flight, and
//! since when none is (`idle_timeout`).
//!
//! A request is in flight from the moment hyper hands it to the service
//! until its response body is dropped — sent or abandoned —, so a long
//! download or a gRPC stream keeps its connection busy, not idle.
//!
//! The timers run beside hyper's connection in the connection's task, each
//! inside an [`OnWake`]: polled when its own timer fires, not at each of the
//! task's wake-ups for the connection's I/O.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{ready, Context, Poll, Wake, Waker};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::service::Service;
use tokio::time::Instant;

/// One connection's requests, seen from its service.
pub(super) struct Activity {
    opened: Instant,
    seen: AtomicBool,
    in_flight: AtomicUsize,
    /// Milliseconds from `opened` to the last time a request started or ended.
    last_ms: AtomicU64,
}

impl Activity {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Self {
            opened: Instant::now(),
            seen: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            last_ms: AtomicU64::new(0),
        })
    }

    fn touch(&self) {
        let ms = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Relaxed);
    }

    /// Completes once `timeout` has passed with no request seen; never after one.
    pub(super) async fn first_request_overdue(&self, timeout: Duration) {
        tokio::time::sleep(timeout).await;
        if self.seen.load(Relaxed) {
            std::future::pending::<()>().await;
        }
    }

    /// Completes once no request has been in flight for `idle`.
    pub(super) async fn idle_for(&self, idle: Duration) {
        loop {
            let last = self.last_ms.load(Relaxed);
            tokio::time::sleep_until(self.opened + Duration::from_millis(last) + idle).await;
            if self.in_flight.load(Relaxed) == 0 {
                if self.last_ms.load(Relaxed) == last {
                    return;
                }
            } else {
                // Busy: look again within `idle`; its end moves `last_ms`.
                tokio::time::sleep(idle).await;
            }
        }
    }

    fn start(self: &Arc<Self>) -> Busy {
        self.seen.store(true, Relaxed);
        // No clock read: while a request is in flight the connection is not
        // idle, and its end (`Busy`'s drop) sets the time idleness counts from.
        self.in_flight.fetch_add(1, Relaxed);
        Busy(Arc::clone(self))
    }
}

/// A request in flight; its drop ends it.
struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Relaxed);
    }
}

/// A service whose requests are counted in an [`Activity`].
pub(super) struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S> Tracked<S> {
    pub(super) fn new(inner: S, activity: &Arc<Activity>) -> Self {
        Self { inner, activity: Arc::clone(activity) }
    }
}

impl<S, B> Service<Request<Incoming>> for Tracked<S>
where
    S: Service<Request<Incoming>, Response = Response<B>>,
{
    type Response = Response<TrackedBody<B>>;
    type Error = S::Error;
    type Future = TrackedFuture<S::Future>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let busy = Some(self.activity.start());
        TrackedFuture { inner: self.inner.call(request), busy }
    }
}

pin_project_lite::pin_project! {
    /// The service's answer, which hands the request's [`Busy`] on to its body.
    pub(super) struct TrackedFuture<F> {
        #[pin]
        inner: F,
        busy: Option<Busy>,
    }
}

impl<F, B, E> Future for TrackedFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<TrackedBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let answer = ready!(this.inner.poll(cx));
        let busy = this.busy.take();
        Poll::Ready(answer.map(|response| response.map(|body| TrackedBody { body, _busy: busy })))
    }
}

pin_project_lite::pin_project! {
    /// A response body that keeps its request in flight until it is dropped.
    pub(super) struct TrackedBody<B> {
        #[pin]
        body: B,
        _busy: Option<Busy>,
    }
}

impl<B: Body> Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        self.project().body.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A future polled only when its own waker has fired since its last poll.
///
/// `select!` polls every branch at each of the task's wake-ups, and a
/// connection's task wakes for its I/O several times a request: its two
/// timers (the first request's deadline, the idle timeout) cost about 600
/// instructions a proxied request that way, for timers that fire once in a
/// connection's life (BENCHMARKS.md, "Where a proxied request's CPU goes").
/// Wrapped, each is passed by unless its timer woke the task.
pub(super) struct OnWake<F> {
    future: Pin<Box<F>>,
    woken: Arc<Woken>,
    waker: Waker,
}

/// Whether an [`OnWake`]'s future asked to be polled, and the task to wake then.
struct Woken {
    asked: AtomicBool,
    task: futures_util::task::AtomicWaker,
}

impl Wake for Woken {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.asked.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl<F: Future> OnWake<F> {
    /// `future`, polled at the first poll and then when it wakes.
    pub(super) fn new(future: F) -> Self {
        let woken = Arc::new(Woken { asked: AtomicBool::new(true), task: Default::default() });
        Self { future: Box::pin(future), waker: Waker::from(Arc::clone(&woken)), woken }
    }
}

impl<F: Future> Future for OnWake<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        // Registered before the flag is read: a wake-up in between is not lost.
        this.woken.task.register(cx.waker());
        if !this.woken.asked.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        this.future.as_mut().poll(&mut Context::from_waker(&this.waker))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn idle_counts_from_the_end_of_the_last_request() {
        let activity = Activity::new();
        let idle = Duration::from_secs(10);
        tokio::time::advance(Duration::from_secs(3)).await;
        let busy = activity.start();
        tokio::time::advance(Duration::from_secs(25)).await;
        let waiting = activity.idle_for(idle);
        tokio::pin!(waiting);
        // In flight: never idle however long it takes.
        assert!(tokio::time::timeout(Duration::from_secs(60), waiting.as_mut()).await.is_err());
        drop(busy);
        let ended = Instant::now();
        waiting.await;
        assert_eq!(Instant::now() - ended, idle);
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_request_timer_stops_at_the_first_request() {
        let activity = Activity::new();
        let overdue = activity.first_request_overdue(Duration::from_secs(5));
        let _busy = activity.start();
        assert!(tokio::time::timeout(Duration::from_secs(60), overdue).await.is_err());
        let late = Activity::new();
        let start = Instant::now();
        late.first_request_overdue(Duration::from_secs(5)).await;
        assert_eq!(Instant::now() - start, Duration::from_secs(5));
    }

    /// A task waker that counts its wake-ups.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Relaxed);
        }
    }

    #[test]
    fn a_future_on_wake_is_polled_only_when_its_own_waker_fired() {
        let polls = Arc::new(AtomicUsize::new(0));
        let inner: Arc<std::sync::Mutex<Option<Waker>>> = Arc::default();
        let (counted, kept) = (Arc::clone(&polls), Arc::clone(&inner));
        let mut future = OnWake::new(std::future::poll_fn(move |cx| {
            *kept.lock().unwrap() = Some(cx.waker().clone());
            match counted.fetch_add(1, Relaxed) {
                2 => Poll::Ready("done"),
                _ => Poll::Pending,
            }
        }));
        let task = Arc::new(Count::default());
        let waker = Waker::from(Arc::clone(&task));
        let mut cx = Context::from_waker(&waker);
        // The first poll reaches the future; the next ones, with no wake-up, do not.
        assert!(Pin::new(&mut future).poll(&mut cx).is_pending());
        assert!(Pin::new(&mut future).poll(&mut cx).is_pending());
        assert!(Pin::new(&mut future).poll(&mut cx).is_pending());
        assert_eq!(polls.load(Relaxed), 1);
        // Its own wake-up wakes the task, and the next poll reaches it.
        inner.lock().unwrap().take().unwrap().wake();
        assert_eq!(task.0.load(Relaxed), 1);
        assert!(Pin::new(&mut future).poll(&mut cx).is_pending());
        assert_eq!(polls.load(Relaxed), 2);
        assert!(Pin::new(&mut future).poll(&mut cx).is_pending());
        assert_eq!(polls.load(Relaxed), 2);
        inner.lock().unwrap().take().unwrap().wake_by_ref();
        assert_eq!(Pin::new(&mut future).poll(&mut cx), Poll::Ready("done"));
        assert_eq!((polls.load(Relaxed), task.0.load(Relaxed)), (3, 2));
    }
}
