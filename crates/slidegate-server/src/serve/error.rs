//! [`ServeError`]: why `serve` could not start.

use std::net::SocketAddr;

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
    /// The access log file could not be opened.
    #[error("cannot open the access log {}: {source}", path.display())]
    AccessLog {
        /// The file.
        path: std::path::PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// TLS could not be set up: the listener's (`[server] tls`) or the
    /// `https://` upstream's (its roots, its host name).
    #[error("TLS: {0}")]
    Tls(String),
    /// Another instance recorded another layout or bucket count under the
    /// store's prefix (`[store] layout`, `expected_identities`).
    #[error("[store] layout and expected_identities: {0}")]
    LayoutConflict(Box<slidegate::LayoutConflict>),
    /// A rule needs what the store cannot do.
    #[error(transparent)]
    Limiter(#[from] slidegate_http::LimiterError),
    /// The snapshot could not be restored, and `[store] snapshot_corrupt =
    /// "refuse"` says not to start without it.
    #[error("{0} ([store] snapshot_corrupt = \"refuse\"; move the file away to start with empty counters)")]
    Snapshot(slidegate::SnapshotError),
}
