//! The limiter's own time: milliseconds on tokio's monotonic clock (which
//! tests pause and advance), since the limiter was built. The deny cache,
//! the breaker and the fallback's seeds all count on it, so their deadlines
//! agree.

/// Milliseconds since an epoch, on tokio's clock. Copy it into every layer
/// that must agree on time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ticks {
    epoch: tokio::time::Instant,
}

impl Ticks {
    /// A clock starting now.
    pub(crate) fn start() -> Self {
        Self { epoch: tokio::time::Instant::now() }
    }

    /// Milliseconds since the epoch.
    pub(crate) fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}
