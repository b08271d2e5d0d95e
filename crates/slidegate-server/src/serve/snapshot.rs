//! `[store] snapshot`: the embedded store's counters and penalty box kept
//! across restarts. Restored once before the listeners open; written every
//! `snapshot_interval` while serving and once more when the drain is over
//! (every request answered), so a graceful stop loses nothing and a crash
//! at most one interval.
//!
//! Each write is [`MemoryStore::save_snapshot`]: shard by shard under each
//! shard's lock, to a temporary file renamed over the last one. It runs on
//! tokio's blocking pool, off the acceptor's thread; one write at a time.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use slidegate::{Clock, MemoryStore, SnapshotError, SystemClock};
use slidegate_http::RateLimiter;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use super::error::ServeError;
use crate::config::{OnCorruptSnapshot, SnapshotConfig};
use crate::store::AnyStore;

/// Restores `config`'s snapshot into `store`, which must be new. A missing
/// file is an empty start; an unusable one is an error under `"refuse"`,
/// else logged, moved aside to `<file>.corrupt` (so the next write does not
/// destroy it) and an empty start.
///
/// # Errors
/// [`ServeError::Snapshot`] under `snapshot_corrupt = "refuse"`.
pub(super) fn restore(config: &SnapshotConfig, store: &mut MemoryStore) -> Result<(), ServeError> {
    let path = &config.path;
    match store.load_snapshot(path) {
        Ok(None) => {
            tracing::info!(snapshot = %path.display(), "no snapshot yet: starting with empty counters")
        }
        Ok(Some(report)) => {
            let now = SystemClock.now_ms();
            let age_ms = now.saturating_sub(report.written_at_ms);
            if now < report.written_at_ms {
                tracing::warn!(
                    snapshot = %path.display(),
                    ahead_ms = report.written_at_ms - now,
                    "the snapshot was written at a later time than the clock reads now: its windows \
                     count as written, none ends sooner"
                );
            }
            tracing::info!(
                snapshot = %path.display(),
                states = report.states,
                penalties = report.penalties,
                age_ms,
                "counters and penalty box restored from the snapshot"
            );
        }
        Err(err) if config.on_corrupt == OnCorruptSnapshot::Refuse => return Err(ServeError::Snapshot(err)),
        Err(err) => {
            let aside = matches!(err, SnapshotError::Corrupt { .. }).then(|| {
                let mut aside = path.clone().into_os_string();
                aside.push(".corrupt");
                std::path::PathBuf::from(aside)
            });
            let moved = aside.as_ref().map(|aside| std::fs::rename(path, aside));
            tracing::error!(
                %err,
                kept_as = aside.as_ref().map(|a| a.display().to_string()),
                move_failed = moved.and_then(Result::err).map(|e| e.to_string()),
                "snapshot unusable: starting with empty counters ([store] snapshot_corrupt = \"start-empty\")"
            );
        }
    }
    Ok(())
}

/// Writes the snapshots of one server: on the interval, and once at the end.
#[derive(Clone)]
pub(super) struct Snapshots {
    limiter: RateLimiter<AnyStore>,
    config: SnapshotConfig,
    /// One write at a time: the interval's and the last one may meet.
    writing: Arc<Mutex<()>>,
}

impl Snapshots {
    /// For `limiter`'s embedded store, when `config` keeps a snapshot.
    pub(super) fn new(limiter: &RateLimiter<AnyStore>, config: Option<&SnapshotConfig>) -> Option<Self> {
        let config = config?.clone();
        matches!(limiter.store(), AnyStore::Memory(_)).then(|| Self {
            limiter: limiter.clone(),
            config,
            writing: Arc::default(),
        })
    }

    /// Writes one snapshot now, on the blocking pool; logs a failure.
    pub(super) async fn write(&self, why: &'static str) -> Option<slidegate::SnapshotReport> {
        let this = self.clone();
        let written = tokio::task::spawn_blocking(move || {
            let _one = this.writing.lock().unwrap_or_else(PoisonError::into_inner);
            let AnyStore::Memory(store) = this.limiter.store() else { return None };
            let started = Instant::now();
            Some((store.save_snapshot(&this.config.path), started.elapsed()))
        })
        .await;
        match written {
            Ok(Some((Ok(report), took))) => {
                tracing::debug!(
                    snapshot = %self.config.path.display(),
                    why,
                    states = report.states,
                    penalties = report.penalties,
                    bytes = report.bytes,
                    took_ms = took.as_millis() as u64,
                    "snapshot written"
                );
                Some(report)
            }
            Ok(Some((Err(err), _))) => {
                tracing::error!(%err, why, "snapshot not written: the previous one stays");
                None
            }
            Ok(None) | Err(_) => None,
        }
    }

    /// Writes a snapshot every interval until aborted.
    pub(super) fn spawn(&self) -> JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let period = this.config.interval.max(Duration::from_millis(1));
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let _ = this.write("interval").await;
            }
        })
    }
}
