//! `[server] connections.<listener> = { max, header_timeout, idle_timeout }`:
//! what bounds the client connections of each listener — the public one
//! (`listen`), `admin_listen`, `auth_listen` and `grpc_listen`.
//!
//! Every listener has all three bounds, on by default: a connection costs
//! memory and a file descriptor for as long as it is open, whoever opened
//! it, so no listener may hold an unbounded number of them, nor keep one a
//! client neither finishes nor uses.

use slidegate_http::config::TimeSpan;

/// The bounds of one listener's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectionLimits {
    /// Connections open at once (`max`). One more is accepted and closed
    /// at once, unread, and counted in `/metrics`
    /// (`slidegate_listener_connections_refused_total`): a client waiting
    /// in the kernel's queue would pin memory and learn nothing.
    pub max: usize,
    /// How long a connection may take to send a complete request head
    /// (`header_timeout`). On HTTP/1.1 hyper's timer runs from the moment
    /// the connection waits for a request, so it also closes an idle
    /// keep-alive connection; on HTTP/2 it bounds the wait for the preface
    /// and the first request (later half-sent requests are the idle timeout's).
    pub header_timeout: TimeSpan,
    /// How long a connection with no request in flight stays open
    /// (`idle_timeout`); then it is closed gracefully (HTTP/2: GOAWAY).
    pub idle_timeout: TimeSpan,
}

impl ConnectionLimits {
    /// The most `max`: each connection is a file descriptor, and Linux
    /// lets a process have about a million (`fs.nr_open`).
    pub const MAX_CONNECTIONS: usize = 1_000_000;

    /// The longest `header_timeout`: a client that needs longer to send a
    /// request head is broken or a slowloris.
    pub const MAX_HEADER_TIMEOUT: TimeSpan = TimeSpan::from_secs(600);

    /// The longest `idle_timeout`.
    pub const MAX_IDLE_TIMEOUT: TimeSpan = TimeSpan::from_secs(86_400);

    /// The bounds with `max` connections, and the default timeouts: a
    /// 30 s header timeout (hyper's own, what `serve` always had) and 60 s
    /// idle (a proxy or Envoy reconnects after a GOAWAY at no cost).
    const fn with_max(max: usize) -> Self {
        Self { max, header_timeout: TimeSpan::from_secs(30), idle_timeout: TimeSpan::from_secs(60) }
    }
}

/// `[server] connections`: the bounds of each listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListenerConnections {
    /// `listen`: clients, directly or through a load balancer. 10,000 by
    /// default, each a file descriptor (the packaged unit allows 65,536)
    /// and about 20 KB while idle.
    pub public: ConnectionLimits,
    /// `admin_listen`: operators and a metrics scraper; 64 by default.
    pub admin: ConnectionLimits,
    /// `auth_listen`: the proxies that ask the hook, each with its pool of
    /// connections; 4,096 by default.
    pub auth: ConnectionLimits,
    /// `grpc_listen`: Envoy opens a few HTTP/2 connections per instance
    /// and multiplexes on them; 1,024 by default.
    pub grpc: ConnectionLimits,
}

impl Default for ListenerConnections {
    fn default() -> Self {
        Self {
            public: ConnectionLimits::with_max(10_000),
            admin: ConnectionLimits::with_max(64),
            auth: ConnectionLimits::with_max(4_096),
            grpc: ConnectionLimits::with_max(1_024),
        }
    }
}
