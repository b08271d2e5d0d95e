//! Connecting: a single server, a Cluster, a Sentinel-watched primary,
//! or an existing connection; the scripts loaded and the server's clock
//! sampled before the first decision.

use crate::Unavailable;
use std::sync::Arc;

use redis::aio::ConnectionManager;
use redis::cluster::ClusterClientBuilder;

use super::cluster_link::ClusterLink;
use super::link::Link;
use super::scripts::{self, Assembly};
use super::target::{self, SentinelSource, Source};
use super::{Connection, Engine, RedisOptions, RedisStore, RedisTarget, TimeSource, DEFAULT_PREFIX};
use crate::store::StoreError;

impl RedisStore {
    /// Connects to the Redis at `url` (`redis://host:port/db`) with the
    /// default [`RedisOptions`] and loads the scripts.
    ///
    /// # Errors
    /// [`Unavailable::Redis`] when the URL is invalid or Redis refuses the
    /// connection, [`Unavailable::TimedOut`] when it does not answer within
    /// the connect timeout (500 ms).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, RedisOptions::default()).await
    }

    /// Connects to the Redis at `url` with `options` and loads the scripts.
    /// Fails within about twice the connect timeout (connect, then load).
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub async fn connect_with(url: &str, options: RedisOptions) -> Result<Self, StoreError> {
        Self::connect_to(&RedisTarget::Single(url.to_owned()), options).await
    }

    /// Connects to `target` with `options`.
    ///
    /// - [`RedisTarget::Single`] and [`RedisTarget::Sentinel`] share the
    ///   single-server behaviour: scripts loaded now, calls failing at once
    ///   while the connection is down, one background reconnect. For
    ///   Sentinel every (re)connect first asks the sentinels for the master,
    ///   and a `READONLY` reply (the master was demoted) also reconnects, so
    ///   the store follows a failover by itself.
    /// - [`RedisTarget::Cluster`] uses the `redis` crate's cluster client,
    ///   which follows `MOVED`/`ASK` and retries `TRYAGAIN` and dropped
    ///   connections within the deadline. Scripts are not loaded up front:
    ///   the first call on each node falls back to `EVAL` once. While a
    ///   node is dead, calls for its slots do not fail at once but time out
    ///   at the deadline (the client reconnects and refreshes its slot map
    ///   under the calls); calls for other slots are unaffected.
    ///
    /// # Errors
    /// As [`connect`](Self::connect); also [`Unavailable::Redis`] when the CA
    /// file cannot be read or a list of URLs is empty, and
    /// [`Unavailable::NotConnected`] when no sentinel knows the master.
    pub async fn connect_to(target: &RedisTarget, options: RedisOptions) -> Result<Self, StoreError> {
        let source = match target {
            RedisTarget::Single(url) => {
                let certs = target::certificates(&options)?;
                Source::Fixed(target::client(target::node_info(url, &options)?, certs.as_ref())?)
            }
            RedisTarget::Sentinel { sentinels, master_name } => {
                Source::Sentinel(SentinelSource::new(sentinels, master_name, &options)?)
            }
            RedisTarget::Cluster(urls) => return Self::connect_cluster(urls, options).await,
        };
        let link = Link::connect(source, options.clone()).await?;
        let store = Self {
            conn: Connection::Link(link),
            timeout: options.timeout,
            prefix: DEFAULT_PREFIX.into(),
            time: TimeSource::Server,
            engine: options.engine,
            module: Arc::default(),
            clock: Arc::default(),
            packing: None,
        };
        // Loading now saves the first call of each script its fallback; a
        // Redis that answers a connect but not this is as good as down.
        let load = async {
            let (_, mut conn) = store.connection()?;
            // A PING first, so that a refusal (`NOAUTH`, a missing ACL
            // permission) reads as one error, not as six failed loads.
            redis::cmd("PING").query_async::<()>(&mut conn).await?;
            // A server too old is refused here, naming what it lacks, rather
            // than at its first decision. One that will not say (INFO
            // refused by an ACL) is let be.
            if let Ok(info) = redis::cmd("INFO").arg("server").query_async::<String>(&mut conn).await {
                super::version::check(&info)?;
            }
            let mut pipe = redis::pipe();
            for lua in scripts::all(Assembly::of(options.layout)) {
                pipe.cmd("SCRIPT").arg("LOAD").arg(lua.source()).ignore();
            }
            pipe.query_async::<()>(&mut conn).await?;
            if store.engine == Engine::Auto {
                store.probe_module(0, &mut conn).await?;
            }
            Ok::<_, StoreError>(())
        };
        match tokio::time::timeout(options.connect_timeout, load).await {
            Ok(loaded) => loaded?,
            Err(_) => return Err(StoreError::Unavailable(Unavailable::TimedOut(options.connect_timeout))),
        }
        store.sample_time_now().await;
        Ok(store.with_layout(options.layout))
    }

    async fn connect_cluster(urls: &[String], options: RedisOptions) -> Result<Self, StoreError> {
        if urls.is_empty() {
            return Err(target::config_error("no cluster node URLs", String::new()));
        }
        let mut builder = ClusterClientBuilder::new(urls.to_vec())
            .connection_timeout(options.connect_timeout)
            .response_timeout(options.timeout)
            .overall_response_timeout(Some(options.timeout))
            // Redirects and `TRYAGAIN` during a slot migration are retried
            // until the store's deadline (the overall response timeout), a
            // few ms apart: a multi-key script whose keys are split between
            // the two nodes of a migrating slot gets `TRYAGAIN` until the
            // slot's keys have moved, which can take longer than the
            // client's default 16 quick retries. A constant pause (exponent
            // base 1) also keeps the client's `base^retry` from overflowing.
            .retries(1_000)
            .retry_wait_formula(10, 1)
            .min_retry_wait(2)
            .max_retry_wait(10);
        if let Some(username) = &options.username {
            builder = builder.username(username);
        }
        if let Some(password) = &options.password {
            builder = builder.password(password);
        }
        if let Some(certs) = target::certificates(&options)? {
            builder = builder.certs(certs);
        }
        if urls.iter().any(|url| url.starts_with("rediss://")) {
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let client = builder.build()?;
        let conn = match tokio::time::timeout(options.connect_timeout, client.get_async_connection()).await {
            Ok(conn) => conn?,
            Err(_) => return Err(StoreError::Unavailable(Unavailable::TimedOut(options.connect_timeout))),
        };
        // Every node's script cache loaded now, as one server's is: the
        // first call of each script on each master is then one call, not a
        // `NOSCRIPT` and its fallback. Best effort: a node that does not
        // answer yet gets the script from that fallback.
        let load = async {
            let mut conn = conn.clone();
            for lua in scripts::all(Assembly::of(options.layout)) {
                redis::cmd("SCRIPT").arg("LOAD").arg(lua.source()).query_async::<()>(&mut conn).await?;
            }
            Ok::<_, redis::RedisError>(())
        };
        let _ = tokio::time::timeout(options.connect_timeout, load).await;
        // Every node's version (the client asks each and answers a map of
        // their replies); a Cluster that will not say is let be.
        let (mut asking, mut info) = (conn.clone(), redis::cmd("INFO"));
        let info = info.arg("server").query_async::<redis::Value>(&mut asking);
        if let Ok(Ok(info)) = tokio::time::timeout(options.connect_timeout, info).await {
            super::version::check_reply(&info)?;
        }
        let store = Self {
            conn: Connection::Cluster(ClusterLink::new(client, conn, options.connect_timeout)),
            timeout: options.timeout,
            prefix: DEFAULT_PREFIX.into(),
            time: TimeSource::Server,
            engine: options.engine,
            module: Arc::default(),
            clock: Arc::default(),
            packing: None,
        };
        store.sample_time_now().await;
        Ok(store.with_layout(options.layout))
    }

    /// A store on an existing `ConnectionManager`, whose own timeouts and
    /// retries then apply underneath the store's deadline
    /// ([`with_timeout`](Self::with_timeout), 250 ms by default). Its
    /// reconnects are awaited by the calls made meanwhile; prefer
    /// [`connect_with`](Self::connect_with), which fails fast while Redis is
    /// down. Scripts are loaded on first use.
    pub fn from_connection(conn: ConnectionManager) -> Self {
        Self {
            conn: Connection::Manager(conn),
            timeout: RedisOptions::default().timeout,
            prefix: DEFAULT_PREFIX.into(),
            time: TimeSource::Server,
            engine: Engine::Auto,
            module: Arc::default(),
            clock: Arc::default(),
            packing: None,
        }
    }
}
