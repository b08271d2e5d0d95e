//! `slidegate serve`: a rate-limiting reverse proxy to one upstream, with a
//! JSON decision API, Prometheus metrics and a health check.
//!
//! Requests under `[server] admin_prefix` go to the admin endpoints
//! (`/v1/check`, `/metrics`, `/healthz`); every other request is decided by
//! the rules and, unless denied, forwarded to the upstream with both bodies
//! streamed. With `[server] admin_listen` the admin endpoints are served on
//! that address only, and the public listener forwards every path.

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

/// What one worker thread serves with.
pub(crate) struct State {
    pub(crate) limiter: RateLimiter<AnyStore>,
    /// Set once the thread's runtime runs.
    pub(crate) proxy: Option<proxy::Proxy>,
    pub(crate) admin_prefix: String,
    /// Whether this listener serves the admin endpoints (false on the public
    /// listener when they have their own).
    pub(crate) admin_here: bool,
}

/// A bound, ready server.
///
/// It runs one single-threaded runtime per worker thread, each with its own
/// upstream connection pool, the way nginx runs workers: a request is parsed,
/// decided, forwarded and answered on one thread, with no wake-ups across
/// threads on the way. One acceptor deals connections to the workers in turn
/// (`SO_REUSEPORT` would spread them by address hash, unevenly: with 32
/// connections one worker got three times the other's load). Only the store
/// (and Redis' connection) is shared.
pub struct Server {
    listener: TcpListener,
    admin_listener: Option<TcpListener>,
    threads: usize,
    limiter: RateLimiter<AnyStore>,
    upstream: http::Uri,
    admin_prefix: String,
    grace: std::time::Duration,
}

/// A connection handed to a worker thread.
type Accepted = (std::net::TcpStream, SocketAddr);

impl Server {
    /// Connects the store named by `config` (or makes the embedded one) and
    /// binds the listen address. Call it inside a tokio runtime, which then
    /// runs the acceptor.
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
        let addr = config.server.listen;
        let listener = TcpListener::bind(addr).await.map_err(|source| ServeError::Bind { addr, source })?;
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
            grace: config.server.shutdown_grace,
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

    /// Serves until `shutdown` completes, then stops accepting and waits up to
    /// the configured grace period for open connections to finish.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let admin_here = self.admin_listener.is_none();
        let admin = self.admin_listener.map(|listener| {
            let state = State {
                limiter: self.limiter.clone(),
                proxy: None,
                admin_prefix: self.admin_prefix.clone(),
                admin_here: true,
            };
            tokio::spawn(serve_admin(listener, Arc::new(state)))
        });
        let mut workers = Vec::with_capacity(self.threads);
        let mut threads = Vec::with_capacity(self.threads);
        for i in 0..self.threads {
            let (hand, connections) = tokio::sync::mpsc::unbounded_channel::<Accepted>();
            let state = State {
                limiter: self.limiter.clone(),
                proxy: None,
                admin_prefix: self.admin_prefix.clone(),
                admin_here,
            };
            let (upstream, grace) = (self.upstream.clone(), self.grace);
            let thread = std::thread::Builder::new().name(format!("slidegate-{i}")).spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(runtime) => runtime,
                    Err(err) => return tracing::error!(%err, "cannot start a worker runtime"),
                };
                runtime.block_on(async move {
                    // The pool's connections belong to this thread's runtime.
                    let state = State { proxy: proxy::Proxy::new(&upstream), ..state };
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
            let (stream, peer) = tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok(conn) => conn,
                    Err(err) => {
                        // Out of file descriptors and the like: back off briefly.
                        tracing::warn!(%err, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                        continue;
                    }
                },
                () = &mut shutdown => break,
            };
            let _ = stream.set_nodelay(true);
            let Ok(stream) = stream.into_std() else { continue };
            next = (next + 1) % workers.len();
            if workers[next].send((stream, peer)).is_err() {
                tracing::error!("a worker thread stopped");
                workers.remove(next);
            }
        }
        drop(self.listener);
        if let Some(admin) = admin {
            admin.abort();
        }
        // Closing the channels tells every worker to finish its connections.
        drop(workers);
        tracing::info!("shutting down: waiting for open connections");
        let _ = tokio::task::spawn_blocking(move || {
            for thread in threads {
                let _ = thread.join();
            }
        })
        .await;
    }
}

/// One worker thread: serves the connections it is dealt until the acceptor
/// closes the channel, then waits up to `grace` for them to finish.
async fn worker(
    mut connections: tokio::sync::mpsc::UnboundedReceiver<Accepted>,
    state: Arc<State>,
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
    while let Some((stream, peer)) = connections.recv().await {
        let stream = match tokio::net::TcpStream::from_std(stream) {
            Ok(stream) => stream,
            Err(err) => {
                tracing::warn!(%err, "cannot register a connection");
                continue;
            }
        };
        let state = Arc::clone(&state);
        let peer_value = proxy::forwarded_for_value(peer);
        let service = service_fn(move |request: Request<Incoming>| {
            let state = Arc::clone(&state);
            let peer_value = peer_value.clone();
            async move { Ok::<_, Infallible>(handle(&state, request, peer, &peer_value).await) }
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
    heartbeat.abort();
    tokio::select! {
        () = graceful.shutdown() => tracing::debug!("all connections of this worker closed"),
        () = tokio::time::sleep(grace) => tracing::warn!("grace period over: closing the remaining connections"),
    }
}

/// The admin listener: few, short requests, served on the acceptor's runtime.
async fn serve_admin(listener: TcpListener, state: Arc<State>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(conn) => conn,
            Err(err) => {
                tracing::warn!(%err, "admin accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let state = Arc::clone(&state);
        let service = service_fn(move |request: Request<Incoming>| {
            let state = Arc::clone(&state);
            async move { Ok::<_, Infallible>(handle_admin(&state, request).await) }
        });
        tokio::spawn(async move {
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .serve_connection(TokioIo::new(stream), service);
            if let Err(err) = connection.await {
                tracing::debug!(%err, %peer, "admin connection ended with an error");
            }
        });
    }
}

/// A request on the admin listener: an admin endpoint, or 404.
async fn handle_admin(state: &State, request: Request<Incoming>) -> Response<ServeBody> {
    if let Some(endpoint) = admin_endpoint(state, request.uri().path()) {
        return admin::handle(state, endpoint, request).await;
    }
    let path = request.uri().path();
    boxed(crate::headers::problem(
        http::StatusCode::NOT_FOUND,
        "about:blank",
        "Not Found",
        &format!(
            "no admin endpoint at {path}: expected {0}/v1/check, {0}/metrics or {0}/healthz",
            state.admin_prefix
        ),
        Some(path),
    ))
}

fn admin_endpoint(state: &State, path: &str) -> Option<admin::Endpoint> {
    path.strip_prefix(state.admin_prefix.as_str()).and_then(admin::Endpoint::from_path)
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

async fn handle(
    state: &State,
    request: Request<Incoming>,
    peer: SocketAddr,
    peer_value: &http::HeaderValue,
) -> Response<ServeBody> {
    if state.admin_here {
        if let Some(endpoint) = admin_endpoint(state, request.uri().path()) {
            return admin::handle(state, endpoint, request).await;
        }
    }
    proxy::forward(state, request, peer, peer_value).await
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
