//! The lifts poller: once every [`INTERVAL`], reads the shared table of
//! lifted penalty blocks and makes this instance's deny cache and fallback
//! forget each lifted identity (see `slidegate_http::lift`). In the
//! background, under the store's deadline and breaker, never on a request's
//! path; a failed read is logged once per outage and retried next tick.
//! Only for Redis: with the embedded store a lift is applied in process.

use std::sync::Arc;
use std::time::Duration;

use slidegate_http::lift::AppliedLifts;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use super::reload::Current;
use crate::store::AnyStore;

/// How often the table is read: the bound on how long another instance
/// keeps answering a lifted block from its cache (plus one store call).
pub(super) const INTERVAL: Duration = Duration::from_secs(1);

/// Starts polling for the limiter `current` holds (the reloaded one after
/// a reload); abort the handle to stop. `None` on the embedded store.
pub(super) fn spawn(current: Arc<Current>) -> Option<JoinHandle<()>> {
    matches!(current.get().store(), AnyStore::Redis(_)).then(|| tokio::spawn(poll_every(current, INTERVAL)))
}

async fn poll_every(current: Arc<Current>, interval: Duration) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut applied = AppliedLifts::default();
    let mut failing = false;
    loop {
        ticks.tick().await;
        let limiter = current.get();
        match limiter.apply_lifts(&mut applied).await {
            Ok(n) => {
                if n > 0 {
                    tracing::info!(lifts = n, "forgot lifted penalty blocks from the deny cache");
                }
                failing = false;
            }
            Err(err) => {
                if !failing {
                    tracing::warn!(%err, "cannot read the lifted penalty blocks; retrying every second");
                }
                failing = true;
            }
        }
    }
}
