//! [`Server`]: binds the listeners, starts the worker threads, and accepts
//! connections until its caller's shutdown future completes.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use slidegate::{MemoryStore, RedisOptions, RedisTarget, StoreError, Unavailable};
use slidegate_http::config::{LimitConfig, RuleLimits, TimeSpan};
use slidegate_http::RateLimiter;
use tokio::net::TcpListener;

use super::access_log::{self, AccessLog};
use super::connection::Protocols;
use super::error::ServeError;
use super::listener_caps::{ConnectionSlot, ListenerCaps};
use super::readiness::{self, Readiness};
use super::snapshot::{self, Snapshots};
use super::tls::{self, ListenerCerts, UpstreamTls};
use super::upstream::UpstreamLimits;
use super::worker::{worker, Accepted, Listener, ListenerProtocols, WorkerEnd};
use super::{proxy, sweeper, Reloader, State};
use crate::config::Config;
use crate::envoy::{GrpcHealth, GrpcRoutes};
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
/// admin listener and of the gRPC listener too: the decision service
/// (`/v1/check`) and Envoy's rate limit service run on the same `[server]
/// threads` as the proxy, not on a runtime of their own whose threads would
/// compete with the workers for the cores (on tokio's work-stealing runtime
/// a gRPC call cost 1.3× the server CPU it costs here: BENCHMARKS.md). Only
/// the store (and Redis' connection) is shared.
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
    grace: TimeSpan,
    drain_delay: TimeSpan,
    readiness: Arc<Readiness>,
    reloader: Reloader,
    /// What the reloader starts from.
    config: Config,
    /// TLS, HTTP/1.1 and HTTP/2 on each listener.
    protocols: ListenerProtocols,
    /// The public listener's certificate, when it has TLS: a reload swaps it.
    certs: Option<Arc<ListenerCerts>>,
    access_log: Option<(AccessLog, access_log::Writer)>,
    /// `[server] grpc_listen`: Envoy's rate limit service, and what its
    /// health service answers.
    grpc: Option<(TcpListener, GrpcHealth)>,
    /// `[server] auth_listen`: a proxy's forward-auth hook.
    auth_listener: Option<TcpListener>,
    /// `[store] snapshot`: the embedded store's counters across restarts.
    snapshots: Option<Snapshots>,
    /// Each listener's cap on open connections.
    caps: Arc<ListenerCaps>,
}

impl Server {
    /// Connects the store named by `config` (or makes the embedded one) and
    /// binds the listen address. Call it inside a tokio runtime, which then
    /// runs the acceptor.
    ///
    /// # Errors
    /// [`ServeError`] when there is no upstream, the address is taken, or
    /// TLS cannot be set up.
    pub async fn bind(config: &Config) -> Result<Self, ServeError> {
        let upstream = config.server.upstream.clone().ok_or(ServeError::NoUpstream)?;
        let upstream_tls = UpstreamTls::of(&config.server).map_err(|e| ServeError::Tls(e.to_string()))?;
        let (protocols, certs) = listener_protocols(&config.server)?;
        let store = connect_store(config).await?;
        let limiter = RateLimiter::from_config(&config.limiter, store)?;
        let snapshots = Snapshots::new(&limiter, config.store.snapshot.as_ref());
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
        let grpc = match config.server.grpc_listen {
            None => None,
            Some(addr) => Some((
                TcpListener::bind(addr).await.map_err(|source| ServeError::Bind { addr, source })?,
                GrpcHealth::serving().await,
            )),
        };
        let auth_listener = match config.server.auth_listen {
            None => None,
            Some(addr) => {
                Some(TcpListener::bind(addr).await.map_err(|source| ServeError::Bind { addr, source })?)
            }
        };
        // The limiter holds the digests of the keys file's keys; the copy kept
        // to reload from holds no key as it is.
        let mut kept = config.clone();
        kept.limiter.plans.keys.forget_raw_keys();
        Ok(Self {
            listener,
            admin_listener,
            threads,
            upstream,
            admin_prefix: config.server.admin_prefix.clone(),
            admin_on_public: config.server.admin_on_public,
            check_token: config.server.check_token.clone(),
            limits: UpstreamLimits::new(&config.server, threads, upstream_tls),
            grace: config.server.shutdown_grace,
            drain_delay: config.server.drain_delay,
            readiness: Arc::new(Readiness::new(config.limiter.guard.calls.timeout)),
            reloader: Reloader::new(None, kept.clone(), limiter.clone(), certs.clone()),
            config: kept,
            protocols,
            certs,
            limiter,
            access_log,
            grpc,
            auth_listener,
            snapshots,
            caps: Arc::new(ListenerCaps::new(&config.server)),
        })
    }

    /// Reloads from `path` (the file `config` was read from) when asked:
    /// `POST /admin/reload`, or whoever holds [`Server::reloader`]. Without
    /// it, a reload answers that there is no file.
    #[must_use]
    pub fn reload_from(mut self, path: impl Into<PathBuf>) -> Self {
        self.reloader =
            Reloader::new(Some(path.into()), self.config.clone(), self.limiter.clone(), self.certs.clone());
        self
    }

    /// The handle that reloads this server's configuration (for a signal).
    pub fn reloader(&self) -> Reloader {
        self.reloader.clone()
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

    /// The address of Envoy's rate limit service when `[server]
    /// grpc_listen` is set.
    pub fn grpc_addr(&self) -> Option<SocketAddr> {
        self.grpc.as_ref().and_then(|(listener, _)| listener.local_addr().ok())
    }

    /// The address of the forward-auth endpoint when `[server]
    /// auth_listen` is set.
    pub fn auth_addr(&self) -> Option<SocketAddr> {
        self.auth_listener.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// What has the access log reopen its file (after a rotation moved it),
    /// when `[access_log]` names one; take it before [`Server::run`].
    pub fn access_log_reopen(&self) -> Option<super::AccessLogReopen> {
        self.access_log.as_ref().map(|(log, _)| log.reopener())
    }

    /// Starts one worker thread per configured thread, each with its own
    /// single-threaded runtime and upstream pool: the channels that hand
    /// them connections, and their handles.
    fn spawn_workers(
        &self,
    ) -> (Vec<tokio::sync::mpsc::UnboundedSender<Accepted>>, Vec<std::thread::JoinHandle<WorkerEnd>>) {
        let mut workers = Vec::with_capacity(self.threads);
        let mut threads = Vec::with_capacity(self.threads);
        for i in 0..self.threads {
            let (hand, connections) = tokio::sync::mpsc::unbounded_channel::<Accepted>();
            let state = State {
                current: self.reloader.worker(),
                reloader: self.reloader.clone(),
                proxy: None,
                admin_prefix: self.admin_prefix.clone(),
                // Only an explicit setting puts the decision API and metrics
                // where every client can reach them.
                admin_here: self.admin_on_public,
                check_token: self.check_token.clone(),
                readiness: Arc::clone(&self.readiness),
                settling: tokio_util::task::TaskTracker::new(),
                access_log: self.access_log.as_ref().map(|(log, _)| log.clone()),
                caps: Arc::clone(&self.caps),
            };
            let (upstream, grace, limits) = (self.upstream.clone(), self.grace, self.limits.clone());
            let protocols = self.protocols.clone();
            // Each worker its own handle on the service's limiter (a reload replaces them all).
            let grpc = self.grpc.as_ref().map(|(_, health)| GrpcRoutes::new(self.reloader.envoy(), health));
            let thread = std::thread::Builder::new().name(format!("slidegate-{i}")).spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(runtime) => runtime,
                    Err(err) => {
                        tracing::error!(%err, "cannot start a worker runtime");
                        return WorkerEnd::default();
                    }
                };
                runtime.block_on(async move {
                    // Redis replies wake this thread's calls from its own
                    // runtime, not the acceptor's.
                    slidegate::store::redis::drive_connections_here();
                    // The pool's connections belong to this thread's runtime.
                    let state = State { proxy: proxy::Proxy::new(&upstream, limits), ..state };
                    worker(connections, Arc::new(state), grace, protocols, grpc).await
                })
            });
            match thread {
                Ok(handle) => {
                    threads.push(handle);
                    workers.push(hand);
                }
                Err(err) => tracing::error!(%err, "cannot start a worker thread"),
            }
        }
        (workers, threads)
    }

    /// Serves until `shutdown` completes; then drains: `/readyz` answers
    /// 503 at once, every listener keeps accepting for `drain_delay`, then
    /// stop, and open connections, and the charges of requests whose clients
    /// left, are given up to `shutdown_grace` to finish.
    ///
    /// The caller decides what stops the server: a signal in the binary, a
    /// channel in a test.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let sweeper = sweeper::spawn(&self.limiter);
        let snapshotter = self.snapshots.as_ref().map(Snapshots::spawn);
        let lifts = super::lifts::spawn(self.reloader.worker());
        let overrides = super::overrides::spawn_poller(self.limiter.clone());
        let (mut workers, threads) = self.spawn_workers();
        let grpc_listener = self.grpc.map(|(listener, _)| listener);
        let readiness = Arc::clone(&self.readiness);
        let mut shutdown = std::pin::pin!(readiness::drain(shutdown, &readiness, self.drain_delay));
        let mut next = 0;
        while !workers.is_empty() {
            let (accepted, listener) = tokio::select! {
                accepted = self.listener.accept() => (accepted, Listener::Public),
                accepted = accept(self.admin_listener.as_ref()) => (accepted, Listener::Admin),
                accepted = accept(grpc_listener.as_ref()) => (accepted, Listener::Grpc),
                accepted = accept(self.auth_listener.as_ref()) => (accepted, Listener::Auth),
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
            // Over the cap: closed at once (`listener_caps`).
            let Some(slot) = admit(&self.caps, listener) else { continue };
            let _ = stream.set_nodelay(true);
            let Ok(stream) = stream.into_std() else { continue };
            deal(&mut workers, &mut next, (stream, peer, listener, slot));
        }
        tracing::info!(
            grace_ms = self.grace.as_millis(),
            "drain delay over: no new connections; finishing open ones within the shutdown grace"
        );
        // Connections the kernel completed before the close are served, not
        // reset by it (within the caps).
        let closing = [
            (Some(self.listener), Listener::Public),
            (self.admin_listener, Listener::Admin),
            (grpc_listener, Listener::Grpc),
            (self.auth_listener, Listener::Auth),
        ];
        for (listener, which) in closing {
            for (stream, peer) in listener.map(queued).unwrap_or_default() {
                if let Some(slot) = admit(&self.caps, which) {
                    deal(&mut workers, &mut next, (stream, peer, which, slot));
                }
            }
        }
        if let Some(sweeper) = sweeper {
            sweeper.abort();
        }
        if let Some(lifts) = lifts {
            lifts.abort();
        }
        overrides.abort();
        // Closing the channels tells every worker to finish its connections.
        drop(workers);
        let access_log = self.access_log.map(|(_, writer)| writer);
        let ends = tokio::task::spawn_blocking(move || {
            let ends =
                threads.into_iter().filter_map(|thread| thread.join().ok()).collect::<Vec<WorkerEnd>>();
            // The workers' handles are gone with them: what is left is written.
            if let Some(writer) = access_log {
                writer.finish();
            }
            ends
        })
        .await
        .unwrap_or_default();
        // Every request is answered: the counters are final, and kept.
        if let Some(snapshots) = &self.snapshots {
            if let Some(snapshotter) = snapshotter {
                snapshotter.abort();
            }
            if let Some(report) = snapshots.write("drain").await {
                tracing::info!(
                    states = report.states,
                    penalties = report.penalties,
                    "snapshot written at the end of the drain"
                );
            }
        }
        // Every request is answered: leased permits nobody will use go back
        // to the store, so other instances may admit them (within the
        // grace: a store that does not answer keeps them until their window ends).
        match tokio::time::timeout(self.grace.get(), self.limiter.give_back_leases()).await {
            Ok(0) => {}
            Ok(given) => tracing::info!(permits = given, "unused leased permits given back to the store"),
            Err(_) => {
                tracing::warn!("shutdown grace over: unused leased permits stay charged in their window")
            }
        }
        log_end(&ends);
    }
}

/// A slot under `listener`'s cap, or `None` when it holds its `max`.
fn admit(caps: &ListenerCaps, listener: Listener) -> Option<ConnectionSlot> {
    match listener {
        Listener::Public => caps.public.admit(),
        Listener::Admin => caps.admin.as_ref()?.admit(),
        Listener::Auth => caps.auth.as_ref()?.admit(),
        Listener::Grpc => caps.grpc.as_ref()?.admit(),
    }
}

/// The protocols of each listener: TLS on the public one when `[server]
/// tls` is set (never on the admin one, which should not face the
/// internet, nor on the gRPC one, which Envoy reaches in clear), HTTP/1.1
/// and HTTP/2 on the public and admin ones, HTTP/2 only on the gRPC one;
/// and the certificate a reload swaps.
fn listener_protocols(
    server: &crate::config::ServerConfig,
) -> Result<(ListenerProtocols, Option<Arc<ListenerCerts>>), ServeError> {
    let certs = server.tls.as_ref().map(|tls| ListenerCerts::new(tls.certified_key()));
    let acceptor = match &certs {
        None => None,
        Some(certs) => Some(tls::acceptor(Arc::clone(certs)).map_err(|e| ServeError::Tls(e.to_string()))?),
    };
    let limits = &server.connections;
    let public = Arc::new(Protocols::new(server, acceptor, limits.public));
    let admin = Arc::new(Protocols::new(server, None, limits.admin));
    let auth = Arc::new(Protocols::new(server, None, limits.auth));
    let grpc = Arc::new(Protocols::grpc(server));
    Ok((ListenerProtocols { public, admin, auth, grpc }, certs))
}

/// Hands a connection to the next worker, forgetting a worker that stopped.
fn deal(
    workers: &mut Vec<tokio::sync::mpsc::UnboundedSender<Accepted>>,
    next: &mut usize,
    accepted: Accepted,
) {
    if workers.is_empty() {
        return;
    }
    *next = (*next + 1) % workers.len();
    if workers[*next].send(accepted).is_err() {
        tracing::error!("a worker thread stopped");
        workers.remove(*next);
    }
}

/// The connections `listener` has completed but not yet accepted, as it
/// closes: a close resets them, and their clients may have sent a request.
fn queued(listener: TcpListener) -> Vec<(std::net::TcpStream, SocketAddr)> {
    // Non-blocking (tokio's mode, kept): `WouldBlock` once the queue is empty.
    let Ok(listener) = listener.into_std() else { return Vec::new() };
    let mut queued = Vec::new();
    loop {
        match listener.accept() {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                // A worker registers it with its runtime: non-blocking.
                if stream.set_nonblocking(true).is_ok() {
                    queued.push((stream, peer));
                }
            }
            // One client gave up while queued; the others are still there.
            Err(err) if err.kind() == std::io::ErrorKind::ConnectionAborted => {}
            Err(_) => return queued,
        }
    }
}

/// The last steps of a shutdown, logged once every worker has ended.
fn log_end(ends: &[WorkerEnd]) {
    let cut: usize = ends.iter().map(|e| e.connections_cut).sum();
    let settled: usize = ends.iter().map(|e| e.charges_settled).sum();
    let unsettled: usize = ends.iter().map(|e| e.charges_unsettled).sum();
    if cut == 0 {
        tracing::info!("open connections finished");
    } else {
        tracing::warn!(connections = cut, "shutdown grace over: open connections closed unfinished");
    }
    if unsettled == 0 {
        tracing::info!(charges = settled, "pending store work settled");
    } else {
        tracing::warn!(
            charges = unsettled,
            settled,
            "shutdown grace over: charges of requests whose clients left were not made"
        );
    }
    tracing::info!("shutdown complete");
}

/// The next connection on `listener`; never, without one.
async fn accept(listener: Option<&TcpListener>) -> std::io::Result<(tokio::net::TcpStream, SocketAddr)> {
    match listener {
        Some(listener) => listener.accept().await,
        None => std::future::pending().await,
    }
}

/// The Redis `config` names and the options to connect to it with (the
/// deadline, credentials, CA, engine and layout of `[store]`); `None` for
/// the embedded store. The store's prefix is [`StoreConfig::prefix`](crate::StoreConfig::prefix).
pub fn redis_options(config: &Config) -> Option<(RedisTarget, RedisOptions)> {
    let store = &config.store;
    let target = store.redis.clone()?;
    // The limiter enforces `timeout` on every call; the store's own deadline
    // matches it, so a stalled call is dropped at once.
    let mut options = RedisOptions::new()
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_timeout(config.limiter.guard.calls.timeout.get());
    if store.username.is_some() || store.password.is_some() {
        let password = store.password.as_ref().map(|p| p.expose().to_owned());
        options = options.with_credentials(store.username.clone(), password);
    }
    if let Some(ca) = &store.tls_ca {
        options = options.with_tls_ca(ca.clone());
    }
    Some((target, options.with_engine(store.engine).with_layout(store.layout)))
}

/// How long the record of the store's layout lives after each renewal: at
/// least [`LAYOUT_RECORD_MIN`](crate::store::LAYOUT_RECORD_MIN), and at least
/// twice the longest window of any limit (a sliding window counter's state
/// lives two windows), so that a record expires only after the counts of
/// the instances that wrote it.
pub fn layout_record_ttl(config: &Config) -> Duration {
    let mut limits: Vec<&LimitConfig> = Vec::new();
    for rule in &config.limiter.rules {
        match &rule.limits {
            RuleLimits::Shared { limits: shared, .. } => limits.extend(shared),
            RuleLimits::Split { authenticated, anonymous } => {
                limits.extend(authenticated);
                limits.extend(anonymous);
            }
            _ => {}
        }
    }
    for plan in &config.limiter.plans.plans {
        limits.extend(plan.limits.iter().flat_map(|(_, l)| l));
    }
    let longest = limits.iter().map(|l| l.limit.quota.window_ms()).max().unwrap_or(0);
    crate::store::LAYOUT_RECORD_MIN.max(Duration::from_millis(longest.saturating_mul(2)))
}

/// The store `config` names: Redis (one server, a cluster or through
/// Sentinel; connected now if it answers, in the background otherwise) or the
/// embedded one.
///
/// # Errors
/// [`ServeError::LayoutConflict`] when Redis answers and another layout or
/// bucket count is recorded under the prefix; a snapshot that cannot be
/// restored under `snapshot_corrupt = "refuse"`.
async fn connect_store(config: &Config) -> Result<AnyStore, ServeError> {
    let store = &config.store;
    let Some((target, options)) = redis_options(config) else {
        let mut memory = MemoryStore::new();
        if let Some(kept) = &store.snapshot {
            snapshot::restore(kept, &mut memory)?;
        }
        return Ok(AnyStore::Memory(memory));
    };
    let name = store.describe();
    let record_for = layout_record_ttl(config);
    let (lazy, error) =
        LazyRedis::connect_to(target, name.clone(), store.prefix.clone(), options, record_for).await;
    match error {
        Some(StoreError::Unavailable(Unavailable::LayoutConflict(conflict))) => {
            return Err(ServeError::LayoutConflict(conflict));
        }
        // Start anyway: rules fail open or closed as configured, and the
        // store connects in the background once Redis is back (and checks
        // the layout record then).
        Some(err) => {
            tracing::error!(%err, store = %name, "cannot connect to Redis at start; serving with each rule's on_error until it answers");
        }
        None => {}
    }
    Ok(AnyStore::Redis(lazy))
}
