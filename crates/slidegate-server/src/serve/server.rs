//! [`Server`]: binds the listeners, starts the worker threads, and accepts
//! connections until its caller's shutdown future completes.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use slidegate::{MemoryStore, RedisOptions};
use slidegate_http::config::Delay;
use slidegate_http::RateLimiter;
use tokio::net::TcpListener;

use super::access_log::{self, AccessLog};
use super::error::ServeError;
use super::upstream::UpstreamLimits;
use super::worker::{worker, Accepted, Listener};
use super::{proxy, sweeper, State};
use crate::config::Config;
use crate::store::{AnyStore, LazyRedis};

/// The deadline of one Redis connection attempt: at start, before serving
/// without it, and for each background reconnect. Short, because a reconnect
/// attempt stuck on an unreachable host delays the recovery by as much.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// A bound, ready server.
///
/// It runs one single-threaded runtime per worker thread, each with its own
/// upstream connection pool, the way nginx runs workers: a request is parsed,
/// decided, forwarded and answered on one thread, with no wake-ups across
/// threads on the way. One acceptor deals connections to the workers in turn
/// (`SO_REUSEPORT` would spread them by address hash, unevenly: with 32
/// connections one worker got three times the other's load), those of the
/// admin listener too: the decision service (`/v1/check`) runs on the same
/// `[server] threads` as the proxy, not on a runtime of its own whose
/// threads would compete with the workers for the cores. Only the store
/// (and Redis' connection) is shared.
pub struct Server {
    listener: TcpListener,
    admin_listener: Option<TcpListener>,
    threads: usize,
    limiter: RateLimiter<AnyStore>,
    upstream: http::Uri,
    admin_prefix: String,
    admin_on_public: bool,
    check_token: Option<String>,
    limits: UpstreamLimits,
    grace: Delay,
    access_log: Option<(AccessLog, access_log::Writer)>,
}

impl Server {
    /// Connects the store named by `config` (or makes the embedded one) and
    /// binds the listen address. Call it inside a tokio runtime, which then
    /// runs the acceptor.
    ///
    /// # Errors
    /// [`ServeError`] when there is no upstream or the address is taken.
    pub async fn bind(config: &Config) -> Result<Self, ServeError> {
        let upstream = config.server.upstream.clone().ok_or(ServeError::NoUpstream)?;
        let store = connect_store(config).await;
        let limiter = RateLimiter::from_config(&config.limiter, store)?;
        let threads = config
            .server
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .max(1);
        let addr = config.server.listen;
        let listener = TcpListener::bind(addr).await.map_err(|source| ServeError::Bind { addr, source })?;
        let access_log = match &config.access_log {
            None => None,
            Some(log) => Some(AccessLog::start(log).map_err(|source| ServeError::AccessLog {
                path: match &log.path {
                    crate::config::AccessLogPath::File(path) => path.clone(),
                    crate::config::AccessLogPath::Stdout => "-".into(),
                },
                source,
            })?),
        };
        let admin_listener = match config.server.admin_listen {
            None => None,
            Some(addr) => {
                Some(TcpListener::bind(addr).await.map_err(|source| ServeError::Bind { addr, source })?)
            }
        };
        Ok(Self {
            listener,
            admin_listener,
            threads,
            limiter,
            upstream,
            admin_prefix: config.server.admin_prefix.clone(),
            admin_on_public: config.server.admin_on_public,
            check_token: config.server.check_token.clone(),
            limits: UpstreamLimits::new(&config.server, threads),
            grace: config.server.shutdown_grace,
            access_log,
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)))
    }

    /// The address the admin endpoints are served on when `[server]
    /// admin_listen` is set.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_listener.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// What has the access log reopen its file (after a rotation moved it),
    /// when `[access_log]` names one; take it before [`Server::run`].
    pub fn access_log_reopen(&self) -> Option<super::AccessLogReopen> {
        self.access_log.as_ref().map(|(log, _)| log.reopener())
    }

    /// Serves until `shutdown` completes, then stops accepting (on both
    /// listeners) and waits up to the configured grace period for open
    /// connections to finish.
    ///
    /// The caller decides what stops the server: a signal in the binary, a
    /// channel in a test.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        // Only an explicit setting puts the decision API and metrics where
        // every client can reach them.
        let admin_here = self.admin_on_public;
        let sweeper = sweeper::spawn(&self.limiter);
        let mut workers = Vec::with_capacity(self.threads);
        let mut threads = Vec::with_capacity(self.threads);
        for i in 0..self.threads {
            let (hand, connections) = tokio::sync::mpsc::unbounded_channel::<Accepted>();
            let state = State {
                limiter: self.limiter.clone(),
                proxy: None,
                admin_prefix: self.admin_prefix.clone(),
                admin_here,
                check_token: self.check_token.clone(),
                access_log: self.access_log.as_ref().map(|(log, _)| log.clone()),
            };
            let (upstream, grace, limits) = (self.upstream.clone(), self.grace, self.limits.clone());
            let thread = std::thread::Builder::new().name(format!("slidegate-{i}")).spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(runtime) => runtime,
                    Err(err) => return tracing::error!(%err, "cannot start a worker runtime"),
                };
                runtime.block_on(async move {
                    // The pool's connections belong to this thread's runtime.
                    let state = State { proxy: proxy::Proxy::new(&upstream, limits), ..state };
                    worker(connections, Arc::new(state), grace).await;
                });
            });
            match thread {
                Ok(handle) => {
                    threads.push(handle);
                    workers.push(hand);
                }
                Err(err) => tracing::error!(%err, "cannot start a worker thread"),
            }
        }
        let mut shutdown = std::pin::pin!(shutdown);
        let mut next = 0;
        while !workers.is_empty() {
            let (accepted, listener) = tokio::select! {
                accepted = self.listener.accept() => (accepted, Listener::Public),
                accepted = accept(self.admin_listener.as_ref()) => (accepted, Listener::Admin),
                () = &mut shutdown => break,
            };
            let (stream, peer) = match accepted {
                Ok(conn) => conn,
                Err(err) => {
                    // Out of file descriptors and the like: back off briefly.
                    tracing::warn!(%err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let Ok(stream) = stream.into_std() else { continue };
            next = (next + 1) % workers.len();
            if workers[next].send((stream, peer, listener)).is_err() {
                tracing::error!("a worker thread stopped");
                workers.remove(next);
            }
        }
        drop(self.listener);
        drop(self.admin_listener);
        if let Some(sweeper) = sweeper {
            sweeper.abort();
        }
        // Closing the channels tells every worker to finish its connections.
        drop(workers);
        tracing::info!("shutting down: waiting for open connections");
        let access_log = self.access_log.map(|(_, writer)| writer);
        let _ = tokio::task::spawn_blocking(move || {
            for thread in threads {
                let _ = thread.join();
            }
            // The workers' handles are gone with them: what is left is written.
            if let Some(writer) = access_log {
                writer.finish();
            }
        })
        .await;
    }
}

/// The next connection on `listener`; never, without one.
async fn accept(listener: Option<&TcpListener>) -> std::io::Result<(tokio::net::TcpStream, SocketAddr)> {
    match listener {
        Some(listener) => listener.accept().await,
        None => std::future::pending().await,
    }
}

/// The store `config` names: Redis (one server, a cluster or through
/// Sentinel; connected now if it answers, in the background otherwise) or the
/// embedded one.
async fn connect_store(config: &Config) -> AnyStore {
    let store = &config.store;
    let Some(target) = store.redis.clone() else { return AnyStore::Memory(MemoryStore::new()) };
    // The limiter enforces `timeout` on every call; the store's own deadline
    // matches it, so a stalled call is dropped at once.
    let mut options = RedisOptions::new()
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_timeout(config.limiter.guard.timeout.get());
    if store.username.is_some() || store.password.is_some() {
        let password = store.password.as_ref().map(|p| p.expose().to_owned());
        options = options.with_credentials(store.username.clone(), password);
    }
    if let Some(ca) = &store.tls_ca {
        options = options.with_tls_ca(ca.clone());
    }
    options = options.with_engine(store.engine);
    let name = store.describe();
    let (lazy, error) = LazyRedis::connect_to(target, name.clone(), store.prefix.clone(), options).await;
    if let Some(err) = error {
        // Start anyway: rules fail open or closed as configured, and the
        // store connects in the background once Redis is back.
        tracing::error!(%err, store = %name, "cannot connect to Redis at start; serving with each rule's on_error until it answers");
    }
    AnyStore::Redis(lazy)
}
