//! Each listener's cap on open connections (`[server] connections.<listener>.max`).
//!
//! The acceptor takes a [`ConnectionSlot`] for every connection it accepts
//! and the connection's task holds it to its end. A connection that finds
//! its listener full is accepted and closed at once, unread: left in the
//! kernel's queue it would still pin memory and a file descriptor, and its
//! client would learn nothing; closed, the client (or the load balancer in
//! front) sees it at once and may try elsewhere. Each refusal is counted
//! (`slidegate_listener_connections_refused_total`) and logged, the first
//! and then every thousandth.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use crate::config::ServerConfig;

/// One listener's open connections against its cap.
pub(super) struct ListenerCap {
    /// The listener's name in metrics and logs: `public`, `admin`, `auth`, `grpc`.
    name: &'static str,
    max: usize,
    open: AtomicUsize,
    refused: AtomicU64,
}

impl ListenerCap {
    fn new(name: &'static str, max: usize) -> Arc<Self> {
        Arc::new(Self { name, max, open: AtomicUsize::new(0), refused: AtomicU64::new(0) })
    }

    /// A slot for one more connection, or `None` (counted) when the
    /// listener holds its `max`.
    pub(super) fn admit(self: &Arc<Self>) -> Option<ConnectionSlot> {
        // Only the acceptor adds, so no other thread takes the last slot
        // between this load and the add; the workers only give back.
        if self.open.load(Relaxed) >= self.max {
            let refused = self.refused.fetch_add(1, Relaxed) + 1;
            if refused % 1000 == 1 {
                tracing::warn!(
                    listener = self.name,
                    max = self.max,
                    refused,
                    "listener at its connection cap: new connections are closed at once \
                     ([server] connections.{}.max)",
                    self.name
                );
            }
            return None;
        }
        self.open.fetch_add(1, Relaxed);
        Some(ConnectionSlot(Arc::clone(self)))
    }
}

/// One open connection's place under its listener's cap, given back on drop.
pub(super) struct ConnectionSlot(Arc<ListenerCap>);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Relaxed);
    }
}

/// The caps of the listeners this server has.
pub(crate) struct ListenerCaps {
    pub(super) public: Arc<ListenerCap>,
    pub(super) admin: Option<Arc<ListenerCap>>,
    pub(super) auth: Option<Arc<ListenerCap>>,
    pub(super) grpc: Option<Arc<ListenerCap>>,
}

impl ListenerCaps {
    /// The caps of `server`'s listeners, those it configures.
    pub(super) fn new(server: &ServerConfig) -> Self {
        let limits = &server.connections;
        Self {
            public: ListenerCap::new("public", limits.public.max),
            admin: server.admin_listen.map(|_| ListenerCap::new("admin", limits.admin.max)),
            auth: server.auth_listen.map(|_| ListenerCap::new("auth", limits.auth.max)),
            grpc: server.grpc_listen.map(|_| ListenerCap::new("grpc", limits.grpc.max)),
        }
    }

    fn each(&self) -> impl Iterator<Item = &Arc<ListenerCap>> {
        std::iter::once(&self.public).chain(&self.admin).chain(&self.auth).chain(&self.grpc)
    }

    /// Appends each listener's open connections, cap and refusals to a
    /// Prometheus exposition.
    pub(crate) fn render_metrics(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "# HELP slidegate_listener_connections Client connections open on each listener.\n\
             # TYPE slidegate_listener_connections gauge"
        );
        for cap in self.each() {
            let _ = writeln!(
                out,
                "slidegate_listener_connections{{listener=\"{}\"}} {}",
                cap.name,
                cap.open.load(Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP slidegate_listener_connections_max The cap on each listener's open connections \
             ([server] connections.<listener>.max).\n\
             # TYPE slidegate_listener_connections_max gauge"
        );
        for cap in self.each() {
            let _ =
                writeln!(out, "slidegate_listener_connections_max{{listener=\"{}\"}} {}", cap.name, cap.max);
        }
        let _ = writeln!(
            out,
            "# HELP slidegate_listener_connections_refused Connections closed at once because their \
             listener held its cap.\n\
             # TYPE slidegate_listener_connections_refused counter"
        );
        for cap in self.each() {
            let _ = writeln!(
                out,
                "slidegate_listener_connections_refused_total{{listener=\"{}\"}} {}",
                cap.name,
                cap.refused.load(Relaxed)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_admits_max_then_refuses_until_a_slot_is_given_back() {
        let cap = ListenerCap::new("auth", 2);
        let first = cap.admit();
        let second = cap.admit();
        assert!(first.is_some() && second.is_some());
        assert!(cap.admit().is_none());
        assert!(cap.admit().is_none());
        assert_eq!(cap.refused.load(Relaxed), 2);
        drop(first);
        assert_eq!(cap.open.load(Relaxed), 1);
        assert!(cap.admit().is_some());
        assert_eq!(cap.refused.load(Relaxed), 2);
    }

    #[test]
    fn metrics_name_only_the_listeners_configured() {
        let server =
            ServerConfig { auth_listen: Some("127.0.0.1:0".parse().unwrap()), ..ServerConfig::default() };
        let caps = ListenerCaps::new(&server);
        let _held = caps.public.admit();
        let mut out = String::new();
        caps.render_metrics(&mut out);
        assert!(out.contains("slidegate_listener_connections{listener=\"public\"} 1\n"), "{out}");
        assert!(out.contains("slidegate_listener_connections_max{listener=\"auth\"} 4096\n"), "{out}");
        assert!(out.contains("slidegate_listener_connections_refused_total{listener=\"auth\"} 0\n"), "{out}");
        assert!(!out.contains("\"admin\"") && !out.contains("\"grpc\""), "{out}");
    }
}
