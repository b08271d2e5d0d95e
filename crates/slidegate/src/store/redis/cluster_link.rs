//! The Cluster connection a [`super::RedisStore`] decides on, and how it is
//! made anew when it stops answering.
//!
//! The `redis` crate's cluster connection follows `MOVED` and `ASK`,
//! reconnects to a node that went away and refreshes its slot map by
//! itself. Yet in the soak's kill variant (`SOAK_KILL=1 scripts/soak.sh`:
//! SIGKILL of the master holding the hot key, its replica promoted, the
//! node started again as a replica), three of twenty-four connections (one
//! per `serve` instance and kill) never answered again: every call, to
//! every master, timed out in the client for the remaining ten minutes.
//! The nodes listened on ports in the kernel's ephemeral range; while one
//! was dead, the client reconnecting to its port could be given that very
//! port as its own local port and connect to itself (a TCP self-connect:
//! a rerun logged its own `EVALSHA` read back as the reply), and the node,
//! started again, could not bind its port. Keeping Redis ports below the
//! ephemeral range (docs/serve.md) prevents that; this guards against any
//! connection that stops answering whatever the cause: when calls have
//! been made and none has succeeded for [`STUCK_AFTER`], one background
//! task opens a new connection from the same client (seeds, credentials,
//! TLS, retries) and swaps it in, the old one dropped once the calls
//! already sent on it end. A Cluster that is down as a whole costs one
//! connection attempt per [`STUCK_AFTER`], within the connect timeout.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;

/// How long calls may all fail before the connection is made anew: above a
/// failover's gap (a few seconds, during which other masters' slots still
/// answer and reset the clock) only when nothing answers at all.
pub(super) const STUCK_AFTER: Duration = Duration::from_secs(3);

/// A shared Cluster connection that is replaced when it stops answering.
/// Clones share it.
#[derive(Clone)]
pub(super) struct ClusterLink {
    shared: Arc<Shared>,
}

struct Shared {
    client: ClusterClient,
    connect_timeout: Duration,
    conn: RwLock<ClusterConnection>,
    epoch: Instant,
    /// Milliseconds since `epoch` of the first failure since the last
    /// success, plus one (0: the last call succeeded).
    failing_since: AtomicU64,
    /// Whether a new connection is being opened (at most one at a time).
    renewing: AtomicBool,
    /// How many times the connection was made anew.
    renewals: AtomicU64,
}

impl ClusterLink {
    pub(super) fn new(client: ClusterClient, conn: ClusterConnection, connect_timeout: Duration) -> Self {
        Self {
            shared: Arc::new(Shared {
                client,
                connect_timeout,
                conn: RwLock::new(conn),
                epoch: Instant::now(),
                failing_since: AtomicU64::new(0),
                renewing: AtomicBool::new(false),
                renewals: AtomicU64::new(0),
            }),
        }
    }

    /// The connection to send on now.
    pub(super) fn get(&self) -> ClusterConnection {
        self.shared.conn.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// How many times the connection was made anew.
    #[cfg(test)]
    fn renewals(&self) -> u64 {
        self.shared.renewals.load(Ordering::Relaxed)
    }

    /// Notes a call's outcome; after [`STUCK_AFTER`] of failures only,
    /// starts making the connection anew (on the current tokio runtime).
    pub(super) fn note(&self, succeeded: bool) {
        let shared = &self.shared;
        if succeeded {
            shared.failing_since.store(0, Ordering::Relaxed);
            return;
        }
        let now = u64::try_from(shared.epoch.elapsed().as_millis()).unwrap_or(u64::MAX).saturating_add(1);
        let since = match shared.failing_since.compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => return,
            Err(since) => since,
        };
        let stuck = u64::try_from(STUCK_AFTER.as_millis()).unwrap_or(u64::MAX);
        if now.saturating_sub(since) < stuck || shared.renewing.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            shared.renewing.store(false, Ordering::Release);
            return;
        };
        let shared = Arc::clone(shared);
        runtime.spawn(async move {
            let opened =
                tokio::time::timeout(shared.connect_timeout, shared.client.get_async_connection()).await;
            if let Ok(Ok(conn)) = opened {
                *shared.conn.write().unwrap_or_else(PoisonError::into_inner) = conn;
                shared.renewals.fetch_add(1, Ordering::Relaxed);
            }
            // Another STUCK_AFTER of failures before the next attempt.
            let now = u64::try_from(shared.epoch.elapsed().as_millis()).unwrap_or(u64::MAX).saturating_add(1);
            let _ = shared
                .failing_since
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| (s != 0).then_some(now));
            shared.renewing.store(false, Ordering::Release);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slidegate_test_redis::RedisCluster;

    async fn link() -> ClusterLink {
        let client =
            ClusterClient::new(RedisCluster::shared().urls()).unwrap_or_else(|e| panic!("client: {e}"));
        let conn = client.get_async_connection().await.unwrap_or_else(|e| panic!("connect: {e}"));
        ClusterLink::new(client, conn, Duration::from_secs(5))
    }

    async fn renewals_after(link: &ClusterLink, wait: Duration) -> u64 {
        tokio::time::sleep(wait).await;
        link.renewals()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_that_only_fails_is_made_anew_once_per_stuck_period() {
        let link = link().await;
        link.note(false);
        tokio::time::sleep(STUCK_AFTER / 2).await;
        link.note(false);
        assert_eq!(renewals_after(&link, Duration::from_millis(500)).await, 0, "renewed before STUCK_AFTER");
        tokio::time::sleep(STUCK_AFTER / 2).await;
        link.note(false);
        link.note(false);
        assert_eq!(
            renewals_after(&link, Duration::from_secs(2)).await,
            1,
            "one renewal for one stuck period"
        );
        // The new connection answers.
        let pong: String =
            redis::cmd("PING").query_async(&mut link.get()).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(pong, "PONG");
        // Failing on: the next renewal only after another period.
        link.note(false);
        assert_eq!(renewals_after(&link, Duration::from_millis(200)).await, 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_success_between_failures_keeps_the_connection() {
        let link = link().await;
        link.note(false);
        tokio::time::sleep(STUCK_AFTER - Duration::from_millis(500)).await;
        link.note(true);
        tokio::time::sleep(Duration::from_millis(800)).await;
        link.note(false);
        assert_eq!(renewals_after(&link, Duration::from_millis(500)).await, 0);
    }
}
