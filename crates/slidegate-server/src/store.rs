//! The store `serve` decides on, chosen at run time: embedded or Redis.
//!
//! [`Store`] returns `impl Future` and so cannot be a trait object; an enum
//! is the run-time choice instead, and costs one branch.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use slidegate::{
    Decision, DistinctStore, Identity, JointStore, MemoryStore, Outcome, Part, Quota, RedisOptions,
    RedisStore, RedisTarget, Request, SharedTables, Store, StoreError, TableEntry, TableName, Unavailable,
};
use tokio::sync::OnceCell;

/// The embedded store or Redis.
#[non_exhaustive]
pub enum AnyStore {
    /// The embedded store: state in this process only.
    Memory(MemoryStore),
    /// Redis, connected in the background if it was down at start.
    Redis(LazyRedis),
}

impl Store for AnyStore {
    async fn decide(&self, request: Request<'_>) -> Result<Outcome, StoreError> {
        match self {
            AnyStore::Memory(store) => store.decide_sync(request),
            AnyStore::Redis(store) => store.connected()?.decide(request).await,
        }
    }

    fn decide_now(&self, request: Request<'_>) -> Option<Result<Outcome, StoreError>> {
        match self {
            AnyStore::Memory(store) => store.decide_now(request),
            AnyStore::Redis(_) => None,
        }
    }

    fn distinct(&self) -> Option<impl DistinctStore + '_> {
        Some(self)
    }

    fn has_outages(&self) -> bool {
        match self {
            AnyStore::Memory(store) => store.has_outages(),
            AnyStore::Redis(_) => true,
        }
    }

    fn tables(&self) -> Option<impl SharedTables + '_> {
        Some(self)
    }

    fn leases(&self) -> Option<impl slidegate::LeaseStore + '_> {
        Some(self)
    }

    /// The embedded store and one Redis server decide jointly; a Redis
    /// Cluster does not (its identities live in different slots).
    fn joint(&self) -> Option<impl JointStore + '_> {
        match self {
            AnyStore::Memory(_) => Some(self),
            AnyStore::Redis(store) => {
                (!matches!(store.inner.target, RedisTarget::Cluster(_))).then_some(self)
            }
        }
    }

    async fn lift_penalty(
        &self,
        identity: &Identity,
        deadline: Option<Instant>,
    ) -> Result<Option<Duration>, StoreError> {
        match self {
            AnyStore::Memory(store) => store.lift_penalty_sync(identity),
            AnyStore::Redis(store) => store.connected()?.lift_penalty(identity, deadline).await,
        }
    }
}

/// Both stores keep shared tables (the embedded one's shared in process only).
impl SharedTables for AnyStore {
    async fn put_entry(
        &self,
        table: &TableName,
        field: &[u8],
        value: &[u8],
        ttl: Duration,
        deadline: Option<Instant>,
    ) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(store) => store.put_entry_sync(table, field, value, ttl),
            AnyStore::Redis(store) => store.connected()?.put_entry(table, field, value, ttl, deadline).await,
        }
    }

    async fn delete_entry(
        &self,
        table: &TableName,
        field: &[u8],
        deadline: Option<Instant>,
    ) -> Result<bool, StoreError> {
        match self {
            AnyStore::Memory(store) => store.delete_entry_sync(table, field),
            AnyStore::Redis(store) => store.connected()?.delete_entry(table, field, deadline).await,
        }
    }

    async fn read_table(
        &self,
        table: &TableName,
        deadline: Option<Instant>,
    ) -> Result<Vec<TableEntry>, StoreError> {
        match self {
            AnyStore::Memory(store) => store.read_table_sync(table),
            AnyStore::Redis(store) => store.connected()?.read_table(table, deadline).await,
        }
    }
}

/// Both stores grant leases.
impl slidegate::LeaseStore for AnyStore {
    async fn lease(
        &self,
        identity: &Identity,
        charge: slidegate::Charge,
        deadline: Option<std::time::Instant>,
    ) -> Result<slidegate::Lease, StoreError> {
        match self {
            AnyStore::Memory(store) => store.lease_sync(identity, charge),
            AnyStore::Redis(store) => {
                slidegate::LeaseStore::lease(store.connected()?, identity, charge, deadline).await
            }
        }
    }

    async fn give_back(
        &self,
        identity: &Identity,
        back: slidegate::GiveBack,
        deadline: Option<std::time::Instant>,
    ) -> Result<u64, StoreError> {
        match self {
            AnyStore::Memory(store) => store.give_back_sync(identity, back),
            AnyStore::Redis(store) => {
                slidegate::LeaseStore::give_back(store.connected()?, identity, back, deadline).await
            }
        }
    }
}

impl JointStore for AnyStore {
    async fn decide_joint(
        &self,
        parts: &[Part<'_>],
        deadline: Option<Instant>,
    ) -> Result<Vec<Outcome>, StoreError> {
        match self {
            AnyStore::Memory(store) => store.decide_joint_sync(parts),
            AnyStore::Redis(store) => store.connected()?.decide_joint(parts, deadline).await,
        }
    }
}

/// Both stores keep distinct-value sketches.
impl DistinctStore for AnyStore {
    async fn decide_distinct(
        &self,
        identity: &Identity,
        quota: &Quota,
        value: &[u8],
    ) -> Result<Decision, StoreError> {
        match self {
            AnyStore::Memory(store) => store.decide_distinct_sync(identity, quota, value),
            AnyStore::Redis(store) => store.connected()?.decide_distinct(identity, quota, value).await,
        }
    }
}

/// How long the layout record lives at least ([`LazyRedis::connect_to`]'s
/// `record_for` when nothing asks for longer).
pub const LAYOUT_RECORD_MIN: Duration = Duration::from_secs(3600);

/// How often a connected store renews its layout record: far within
/// [`LAYOUT_RECORD_MIN`], so that a Redis outage of many minutes does not
/// let the record of live instances expire.
const LAYOUT_RECORD_RENEW: Duration = Duration::from_secs(60);

/// A [`RedisStore`] that may not be connected yet.
///
/// When Redis is down as `serve` starts, the proxy starts anyway (its rules
/// fail open or closed as configured) and connects in the background: a
/// decision asked before then fails at once as unavailable, and starts a
/// connection attempt if none is running. Requests never wait for a connect.
///
/// Once connected, the [`RedisStore`] itself fails fast while Redis is down
/// and reconnects in the background with a back-off capped at 200 ms, so
/// decisions resume within a few hundred ms of Redis answering again. The
/// target may be one server, a Redis Cluster or a master behind Sentinel;
/// following a failover to the promoted replica is the store's part.
///
/// Before its first decision the store records its layout and bucket count
/// under its prefix, or checks them against the record
/// ([`RedisStore::record_layout`]): a store with other settings than the
/// first instance's never connects (its connect fails with the conflict,
/// logged at each attempt), and a connected one renews the record every
/// minute while it lives.
#[derive(Clone)]
pub struct LazyRedis {
    inner: Arc<LazyInner>,
}

struct LazyInner {
    target: RedisTarget,
    /// The target for logs, without secrets.
    name: String,
    prefix: Option<String>,
    options: RedisOptions,
    /// How long the layout record lives after each renewal.
    record_for: Duration,
    store: OnceCell<RedisStore>,
    connecting: AtomicBool,
}

impl LazyRedis {
    /// Connects to `url` now, waiting at most `connect_timeout`; on failure
    /// returns the store unconnected (with the error) and keeps trying when
    /// asked. Each call's own deadline is left to the caller (the limiter's
    /// `timeout`); the store's is set well above it.
    pub async fn connect(
        url: &str,
        prefix: Option<String>,
        connect_timeout: Duration,
    ) -> (Self, Option<StoreError>) {
        let options =
            RedisOptions::new().with_connect_timeout(connect_timeout).with_timeout(Duration::from_secs(30));
        LazyRedis::connect_with(url, prefix, options).await
    }

    /// As [`connect`](Self::connect), with the store's deadlines and
    /// reconnect back-off given by `options`.
    pub async fn connect_with(
        url: &str,
        prefix: Option<String>,
        options: RedisOptions,
    ) -> (Self, Option<StoreError>) {
        LazyRedis::connect_to(
            RedisTarget::Single(url.to_owned()),
            url.to_owned(),
            prefix,
            options,
            LAYOUT_RECORD_MIN,
        )
        .await
    }

    /// As [`connect_with`](Self::connect_with), to one server, a cluster or a
    /// master behind Sentinel; `name` stands for the target in logs (leave
    /// secrets out of it); the layout record lives `record_for` after each
    /// renewal (give at least the longest life of any state decided).
    pub async fn connect_to(
        target: RedisTarget,
        name: String,
        prefix: Option<String>,
        options: RedisOptions,
        record_for: Duration,
    ) -> (Self, Option<StoreError>) {
        let lazy = LazyRedis {
            inner: Arc::new(LazyInner {
                target,
                name,
                prefix,
                options,
                record_for,
                store: OnceCell::new(),
                connecting: AtomicBool::new(false),
            }),
        };
        let error = LazyRedis::attempt(&lazy.inner).await.err();
        (lazy, error)
    }

    async fn attempt(inner: &Arc<LazyInner>) -> Result<(), StoreError> {
        // `connect_with` bounds itself by the connect timeout (per step).
        let store = RedisStore::connect_to(&inner.target, inner.options.clone()).await?;
        let store = match &inner.prefix {
            Some(p) => store.with_prefix(p.clone()),
            None => store,
        };
        store.record_layout(inner.record_for).await?;
        if inner.store.set(store).is_ok() {
            tracing::info!(store = %inner.name, "connected to Redis");
            tokio::spawn(LazyRedis::renew_layout_record(Arc::downgrade(inner)));
        }
        Ok(())
    }

    /// Renews the layout record every [`LAYOUT_RECORD_RENEW`] while the
    /// store lives. A conflict found then (the record expired while Redis
    /// was away, or was deleted, and an instance with other settings wrote
    /// its own) is logged as an error at each renewal.
    async fn renew_layout_record(inner: Weak<LazyInner>) {
        loop {
            tokio::time::sleep(LAYOUT_RECORD_RENEW).await;
            let Some(inner) = inner.upgrade() else { return };
            let Some(store) = inner.store.get() else { return };
            match store.record_layout(inner.record_for).await {
                Err(err @ StoreError::Unavailable(Unavailable::LayoutConflict(_))) => {
                    tracing::error!(%err, store = %inner.name, "another layout is recorded for this prefix");
                }
                Err(err) => tracing::debug!(%err, store = %inner.name, "cannot renew the layout record"),
                Ok(()) => {}
            }
        }
    }

    /// A store that is already connected.
    pub fn from_store(store: RedisStore) -> Self {
        let cell = OnceCell::new();
        let _ = cell.set(store);
        LazyRedis {
            inner: Arc::new(LazyInner {
                target: RedisTarget::Single(String::new()),
                name: String::new(),
                prefix: None,
                options: RedisOptions::new(),
                record_for: LAYOUT_RECORD_MIN,
                store: cell,
                connecting: AtomicBool::new(false),
            }),
        }
    }

    /// Whether the connection is made.
    pub fn is_connected(&self) -> bool {
        self.inner.store.initialized()
    }

    fn connected(&self) -> Result<&RedisStore, StoreError> {
        if let Some(store) = self.inner.store.get() {
            return Ok(store);
        }
        if !self.inner.connecting.swap(true, Ordering::AcqRel) {
            let inner = Arc::clone(&self.inner);
            tokio::spawn(async move {
                if let Err(err) = LazyRedis::attempt(&inner).await {
                    tracing::warn!(%err, store = %inner.name, "still cannot connect to Redis");
                }
                inner.connecting.store(false, Ordering::Release);
            });
        }
        Err(unavailable("not connected to Redis yet"))
    }
}

fn unavailable(why: &str) -> StoreError {
    StoreError::Unavailable(Unavailable::NotConnected(why.to_owned()))
}
