//! Where time comes from: injected, so tests move it by hand and never sleep.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in milliseconds since the Unix epoch.
///
/// Windows are aligned to multiples of their length since the epoch, so every
/// store and every app server that agree on the time agree on the windows.
pub trait Clock: Send + Sync {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        // A clock before 1970 is a broken machine; count it as the epoch.
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
    }
}

/// A clock that moves only when told to. Clones share the same time.
///
/// ```
/// use std::time::Duration;
/// use slidegate::{Clock, ManualClock};
///
/// let clock = ManualClock::new(1_000);
/// clock.advance(Duration::from_millis(500));
/// assert_eq!(clock.now_ms(), 1_500);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock reading `now_ms` milliseconds since the epoch.
    pub fn new(now_ms: u64) -> Self {
        Self(Arc::new(AtomicU64::new(now_ms)))
    }

    /// Moves the clock forward by `by` (truncated to whole milliseconds).
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }

    /// Sets the clock to `now_ms`; it may go backwards.
    pub fn set(&self, now_ms: u64) {
        self.0.store(now_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now_ms(&self) -> u64 {
        (**self).now_ms()
    }
}
