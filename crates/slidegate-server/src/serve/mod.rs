//! `slidegate serve`: a rate-limiting reverse proxy to one upstream, with a
//! JSON decision API, Prometheus metrics and a health check.
//!
//! Requests under `[server] admin_prefix` go to the admin endpoints
//! (`/v1/check`, `/metrics`, `/healthz`, `/readyz`, ...); every other
//! request is decided by the rules and, unless denied, forwarded to the
//! upstream with both bodies streamed. The admin endpoints are served only where the config says:
//! on their own address (`[server] admin_listen`) or, with
//! `admin_on_public = true`, on the public listener; by default nowhere, and
//! the public listener forwards every path.
//!
//! - `server`: [`Server`] binds, starts the workers and accepts until the
//!   caller's shutdown future completes (the binary passes a signal).
//! - `worker`: one thread's connections and the routing of each request.
//! - `admin`: the admin endpoints (served by the workers, whichever
//!   listener took the connection); `readiness`: what `/readyz` answers,
//!   and the drain that begins a shutdown.
//! - `proxy` and `upstream`: forwarding to the upstream; `client_holds`:
//!   each client's share of the upstream connections; `slots`: the pool's
//!   slots, handed to the clients holding least first.
//! - `websocket`: WebSocket handshakes tunnelled to the upstream; `grpc`:
//!   the gRPC answers `serve` makes itself (denials as `grpc-status`).
//! - `sweeper`: gives the embedded store's memory back on a timer;
//!   `snapshot`: restores its counters at start and writes them on a timer
//!   and at the end of a drain (`[store] snapshot`).
//! - `reload`: [`Reloader`] reloads the configuration file while serving
//!   (`SIGHUP` in the binary, `POST /admin/reload`).
//! - `access_log`: one JSON line per decision, written by a thread of its own.
//! - `error`: [`ServeError`]; `body`: [`ServeBody`].
//! - `connection`: one client connection: TLS, then HTTP/1.1 or HTTP/2,
//!   HTTP/2's bounds, and the header and idle timeouts (`activity`: what
//!   its requests are doing); `listener_caps`: each listener's cap on open
//!   connections; `tls`: rustls on both sides (the listener's
//!   certificate, swapped by a reload; the upstream's, verified).

mod access_log;
mod activity;
mod admin;
mod auth;
mod body;
mod client_holds;
mod connection;
mod error;
mod grpc;
mod lifts;
mod listener_caps;
mod offenders;
mod overrides;
mod penalty;
mod proxy;
mod readiness;
mod reload;
mod server;
mod slots;
mod snapshot;
mod sweeper;
mod tls;
mod token;
mod upstream;
mod websocket;
mod worker;

pub use access_log::AccessLogReopen;
pub use body::ServeBody;
pub(crate) use body::{boxed, full};
pub use error::ServeError;
pub use reload::{ReloadError, Reloaded, Reloader};
pub use server::{redis_options, Server};

use std::sync::Arc;

use slidegate_http::RateLimiter;

use crate::store::AnyStore;

/// What one worker thread (or the admin listener) serves with.
pub(crate) struct State {
    /// The limiter requests are decided by, replaced by a reload.
    pub(crate) current: Arc<reload::Current>,
    pub(crate) reloader: Reloader,
    /// Set once the thread's runtime runs.
    pub(crate) proxy: Option<proxy::Proxy>,
    pub(crate) admin_prefix: String,
    /// Whether this listener serves the admin endpoints (on the public
    /// listener only with `admin_on_public`).
    pub(crate) admin_here: bool,
    /// The bearer token `/v1/check` requires, if any.
    pub(crate) check_token: Option<String>,
    /// `[access_log]`, when configured.
    pub(crate) access_log: Option<access_log::AccessLog>,
    /// Whether the instance should get traffic (`/readyz`); shared by all.
    pub(crate) readiness: std::sync::Arc<readiness::Readiness>,
    /// This thread's charges of requests whose clients left (run in tasks
    /// of their own): awaited before the thread ends.
    pub(crate) settling: tokio_util::task::TaskTracker,
    /// Each listener's open connections against its cap, for `/metrics`.
    pub(crate) caps: std::sync::Arc<listener_caps::ListenerCaps>,
}

impl State {
    /// The limiter to decide a request by: the one current when the request
    /// came, kept by it to its end, whatever a reload does meanwhile.
    pub(crate) fn limiter(&self) -> Arc<RateLimiter<AnyStore>> {
        self.current.get()
    }
}

/// A problem+json answer of `status` for `path`, saying what was wrong.
pub(super) fn bad_request(status: http::StatusCode, path: &str, detail: &str) -> http::Response<ServeBody> {
    let title = status.canonical_reason().unwrap_or("Bad Request");
    boxed(slidegate_http::headers::problem(status, "about:blank", title, detail, Some(path)))
}
