//! `slidegate serve`: a rate-limiting reverse proxy to one upstream, with a
//! JSON decision API, Prometheus metrics and a health check.
//!
//! Requests under `[server] admin_prefix` go to the admin endpoints
//! (`/v1/check`, `/metrics`, `/healthz`); every other request is decided by
//! the rules and, unless denied, forwarded to the upstream with both bodies
//! streamed.

mod admin;
mod proxy;
mod upstream;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use slidegate::MemoryStore;
use tokio::net::TcpListener;

use crate::config::Config;
use crate::limiter::RateLimiter;
use crate::store::{AnyStore, LazyRedis};

/// The body of every response `serve` sends.
pub type ServeBody = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// Why `serve` could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// What the system said.
        source: std::io::Error,
    },
    /// The config has no `[server] upstream`.
    #[error("[server] upstream is required by serve: the address requests are forwarded to")]
    NoUpstream,
}

/// Shared by every connection.
/// What one worker thread serves with.
pub(crate) struct State {
    pub(crate) limiter: RateLimiter<AnyStore>,
    /// Set once the thread's runtime runs.
    pub(crate) proxy: Option<proxy::Proxy>,
    pub(crate) admin_prefix: String,
}

/// A bound, ready server.
///
/// It runs one single-threaded runtime per thread, each accepting on its own
/// `SO_REUSEPORT` listener and keeping its own upstream connection pool, the
/// way nginx runs workers: a request is parsed, decided, forwarded and answered
/// on one thread, with no wake-ups across threads on the way. Only the store
/// (and Redis' connection) is shared.
pub struct Server {
    listeners: Vec<std::net::TcpListener>,
    local_addr: SocketAddr,
    limiter: RateLimiter<AnyStore>,
    upstream: http::Uri,
    admin_prefix: String,
    grace: std::time::Duration,
}

impl Server {
    /// Connects the store named by `config` (or makes the embedded one) and
    /// binds the listen address, once per thread. Call it inside a tokio runtime.
    ///
    /// # Errors
    /// [`ServeError`] when there is no upstream or the address is taken.
    pub async fn bind(config: &Config) -> Result<Self, ServeError> {
        let upstream = config.server.upstream.clone().ok_or(ServeError::NoUpstream)?;
        let store = connect_store(config).await?;
        let limiter = RateLimiter::from_config(config, store);
        let threads = config
            .server
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .max(1);
        let mut addr = config.server.listen;
        let bind_error = |addr, source| ServeError::Bind { addr, source };
        let mut listeners = Vec::with_capacity(threads);
        for _ in 0..threads {
            let socket = if addr.is_ipv4() {
                tokio::net::TcpSocket::new_v4()
            } else {
                tokio::net::TcpSocket::new_v6()
            }
            .map_err(|e| bind_error(addr, e))?;
            #[cfg(unix)]
            socket.set_reuseport(true).map_err(|e| bind_error(addr, e))?;
            socket.set_reuseaddr(true).map_err(|e| bind_error(addr, e))?;
            socket.bind(addr).map_err(|e| bind_error(addr, e))?;
            let listener = socket.listen(1024).map_err(|e| bind_error(addr, e))?;
            // Port 0 picks a port once; the other threads join it.
            addr = listener.local_addr().map_err(|e| bind_error(addr, e))?;
            listeners.push(listener.into_std().map_err(|e| bind_error(addr, e))?);
            if cfg!(not(unix)) {
                break;
            }
        }
        Ok(Self {
            listeners,
            local_addr: addr,
            limiter,
            upstream,
            admin_prefix: config.server.admin_prefix.clone(),
            grace: config.server.shutdown_grace,
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves until `shutdown` completes, then stops accepting and waits up to
    /// the configured grace period for open connections to finish.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let mut threads = Vec::with_capacity(self.listeners.len());
        for (i, listener) in self.listeners.into_iter().enumerate() {
            let state =
                State { limiter: self.limiter.clone(), proxy: None, admin_prefix: self.admin_prefix.clone() };
            let (upstream, stopped, grace) = (self.upstream.clone(), stopped.clone(), self.grace);
            let thread = std::thread::Builder::new().name(format!("slidegate-{i}")).spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(runtime) => runtime,
                    Err(err) => return tracing::error!(%err, "cannot start a worker runtime"),
                };
                runtime.block_on(async move {
                    // The pool's connections belong to this thread's runtime.
                    let state = State { proxy: proxy::Proxy::new(&upstream), ..state };
                    match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => accept_loop(listener, Arc::new(state), stopped, grace).await,
                        Err(err) => tracing::error!(%err, "cannot register the listener"),
                    }
                });
            });
            match thread {
                Ok(handle) => threads.push(handle),
                Err(err) => tracing::error!(%err, "cannot start a worker thread"),
            }
        }
        shutdown.await;
        let _ = stop.send(true);
        tracing::info!("shutting down: waiting for open connections");
        let _ = tokio::task::spawn_blocking(move || {
            for thread in threads {
                let _ = thread.join();
            }
        })
        .await;
    }
}

async fn accept_loop(
    listener: TcpListener,
    state: Arc<State>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
    grace: std::time::Duration,
) {
    let graceful = GracefulShutdown::new();
    // hyper arms a 30 s header-read timer per request (slowloris protection).
    // tokio wakes its driver through an eventfd whenever a new timer is due
    // before every other one — with no other timer, that is every request.
    // A timer that always fires within a second keeps the driver's next wake
    // early, so arming the 30 s timers costs no system call.
    let heartbeat = tokio::spawn(async {
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(500));
        loop {
            tick.tick().await;
        }
    });
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(err) => {
                    // Out of file descriptors and the like: back off briefly.
                    tracing::warn!(%err, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = stopped.wait_for(|stop| *stop) => break,
        };
        let _ = stream.set_nodelay(true);
        let state = Arc::clone(&state);
        let service = service_fn(move |request: Request<Incoming>| {
            let state = Arc::clone(&state);
            async move { Ok::<_, Infallible>(handle(&state, request, peer).await) }
        });
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(%err, %peer, "connection ended with an error");
            }
        });
    }
    drop(listener);
    heartbeat.abort();
    tokio::select! {
        () = graceful.shutdown() => tracing::debug!("all connections of this thread closed"),
        () = tokio::time::sleep(grace) => tracing::warn!("grace period over: closing the remaining connections"),
    }
}

async fn connect_store(config: &Config) -> Result<AnyStore, ServeError> {
    match &config.store.url {
        None => Ok(AnyStore::Memory(MemoryStore::new())),
        Some(url) => {
            let (store, error) = LazyRedis::connect(url, config.store.prefix.clone(), CONNECT_TIMEOUT).await;
            if let Some(err) = error {
                // Start anyway: rules fail open or closed as configured, and
                // the store connects in the background once Redis is back.
                tracing::error!(%err, %url, "cannot connect to Redis at start; serving with the failure policy until it answers");
            }
            Ok(AnyStore::Redis(store))
        }
    }
}

/// How long `serve` waits for Redis at start before serving without it.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

async fn handle(state: &State, request: Request<Incoming>, peer: SocketAddr) -> Response<ServeBody> {
    if let Some(rest) = request.uri().path().strip_prefix(state.admin_prefix.as_str()) {
        if let Some(endpoint) = admin::Endpoint::from_path(rest) {
            return admin::handle(state, endpoint, request).await;
        }
    }
    proxy::forward(state, request, peer).await
}

/// Completes on SIGTERM or Ctrl-C (SIGINT).
///
/// The handlers are installed when this is called, not when the future is
/// first polled, so a signal that arrives while the server is busy is not lost
/// to the default action. Call it inside the runtime.
pub fn shutdown_signal() -> impl Future<Output = ()> {
    #[cfg(unix)]
    let (mut term, mut int) = {
        use tokio::signal::unix::{signal, SignalKind};
        (signal(SignalKind::terminate()).ok(), signal(SignalKind::interrupt()).ok())
    };
    async move {
        #[cfg(unix)]
        {
            let term = async {
                match term.as_mut() {
                    Some(s) => drop(s.recv().await),
                    None => std::future::pending().await,
                }
            };
            let int = async {
                match int.as_mut() {
                    Some(s) => drop(s.recv().await),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = term => {},
                () = int => {},
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("shutdown signal received");
    }
}

/// A boxed body holding `bytes`.
pub(crate) fn full(bytes: impl Into<Bytes>) -> ServeBody {
    http_body_util::Full::new(bytes.into()).map_err(|never| match never {}).boxed()
}

/// Boxes a full-body response.
pub(crate) fn boxed(response: Response<http_body_util::Full<Bytes>>) -> Response<ServeBody> {
    response.map(|body| body.map_err(|never| match never {}).boxed())
}

/// Installs a log subscriber writing to stderr at the level in
/// `SLIDEGATE_LOG` (`error`, `warn`, `info`, `debug`, `trace`; default `info`).
pub fn init_logging() {
    let level = std::env::var("SLIDEGATE_LOG")
        .ok()
        .and_then(|l| l.parse::<tracing_subscriber::filter::LevelFilter>().ok())
        .unwrap_or(tracing_subscriber::filter::LevelFilter::INFO);
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level)
        .with_target(false)
        .try_init();
}
