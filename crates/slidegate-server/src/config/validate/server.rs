//! `[server]`: the listeners, the upstream and the admin endpoints.

use std::net::SocketAddr;

use http::Uri;
use slidegate_http::config::TimeSpan;
use toml::Spanned;

use super::super::error::ConfigError;
use super::super::raw::RawServer;
use super::super::types::{GrpcDenialStatus, LogFormat, ServerConfig};
use super::super::values::Parsed;
use super::Validator;

/// The longest `drain_delay`.
const MAX_DRAIN_DELAY: TimeSpan = TimeSpan::from_secs(300);

impl Validator<'_> {
    pub(super) fn server(&self, mut raw: RawServer) -> Result<ServerConfig, ConfigError> {
        let mut server = ServerConfig::default();
        let protocols = super::protocols::RawProtocols::take(&mut raw);
        if let Some(format) = raw.log_format {
            server.log_format = match format.get_ref().as_str() {
                "text" => LogFormat::Text,
                "json" => LogFormat::Json,
                other => {
                    return Err(self.err(
                        format.span(),
                        format!("unknown log_format {other:?}: expected \"text\" or \"json\""),
                    ))
                }
            };
        }
        if let Some(upstream) = raw.upstream {
            server.upstream = Some(self.upstream(upstream)?);
        }
        if let Some(prefix) = raw.admin_prefix {
            server.admin_prefix = self.admin_prefix(prefix)?;
        }
        if let Some(listen) = raw.listen {
            server.listen = listen.0;
        }
        let mut placed = vec![("listen", server.listen)];
        if let Some(admin) = raw.admin_listen {
            server.admin_listen = Some(self.own_address("admin_listen", admin, &mut placed)?);
        }
        if let Some(grpc) = raw.grpc_listen {
            server.grpc_listen = Some(self.own_address("grpc_listen", grpc, &mut placed)?);
        }
        if let Some(auth) = raw.auth_listen {
            server.auth_listen = Some(self.own_address("auth_listen", auth, &mut placed)?);
        }
        if let Some(on) = raw.admin_on_public {
            if *on.get_ref() && server.admin_listen.is_some() {
                return Err(self.err(
                    on.span(),
                    "admin_on_public and admin_listen both set: expected one place for the admin endpoints",
                ));
            }
            server.admin_on_public = *on.get_ref();
        }
        if let Some(var) = raw.check_token_env {
            let holds = "check_token_env names the variable holding the bearer token /v1/check requires";
            server.check_token = Some(self.env_value(&var, holds)?);
        }
        if let Some(t) = raw.body_timeout {
            if t.get_ref().0.get().is_zero() {
                return Err(self.err(
                    t.span(),
                    "body_timeout must be longer than 0: expected a duration such as \"30s\"",
                ));
            }
            server.body_timeout = t.into_inner().0;
        }
        if let Some(m) = raw.max_upstream_connections {
            if *m.get_ref() == 0 {
                return Err(self.err(m.span(), "max_upstream_connections must be at least 1"));
            }
            server.max_upstream_connections = usize::try_from(*m.get_ref()).unwrap_or(usize::MAX);
        }
        if let Some(rate) = raw.min_body_rate {
            server.min_body_rate = *rate.get_ref();
        }
        if let Some(t) = raw.body_rate_grace {
            if t.get_ref().0.get().is_zero() {
                return Err(self.err(
                    t.span(),
                    "body_rate_grace must be longer than 0: expected a duration such as \"10s\" \
                     (no body has arrived at its first instant)",
                ));
            }
            server.body_rate_grace = t.into_inner().0;
        }
        if let Some(c) = raw.max_upstream_connections_per_client {
            let max = server.max_upstream_connections;
            let per_client = usize::try_from(*c.get_ref()).unwrap_or(usize::MAX);
            if per_client == 0 || per_client > max {
                return Err(self.err(
                    c.span(),
                    format!(
                        "max_upstream_connections_per_client must be 1 to max_upstream_connections ({max}): \
                         expected a small share of the pool, such as {}",
                        (max / 16).max(1)
                    ),
                ));
            }
            server.max_upstream_connections_per_client = Some(per_client);
        }
        if let Some(grace) = raw.shutdown_grace {
            server.shutdown_grace = grace.0;
        }
        if let Some(delay) = raw.drain_delay {
            server.drain_delay = self.drain_delay(delay)?;
        }
        if let Some(t) = raw.threads {
            if *t.get_ref() == 0 {
                return Err(self.err(t.span(), "threads must be at least 1"));
            }
            server.threads = Some(usize::from(*t.get_ref()));
        }
        if let Some(connections) = raw.connections {
            server.connections = self.connections(connections.into_inner())?;
        }
        server.watch_config = raw.watch_config.unwrap_or_default();
        self.tunnels_and_grpc(&mut server, raw.websocket_idle_timeout, raw.grpc_denial_status)?;
        self.protocols(protocols, &mut server)?;
        Ok(server)
    }

    /// `websocket_idle_timeout` (above 0) and `grpc_denial_status`.
    fn tunnels_and_grpc(
        &self,
        server: &mut ServerConfig,
        idle: Option<Spanned<Parsed<TimeSpan>>>,
        grpc: Option<Spanned<String>>,
    ) -> Result<(), ConfigError> {
        if let Some(t) = idle {
            if t.get_ref().0.get().is_zero() {
                return Err(self.err(
                    t.span(),
                    "websocket_idle_timeout must be longer than 0: expected a duration such as \"300s\"",
                ));
            }
            server.websocket_idle_timeout = t.into_inner().0;
        }
        if let Some(status) = grpc {
            server.grpc_denial_status = match status.get_ref().as_str() {
                "resource_exhausted" => GrpcDenialStatus::ResourceExhausted,
                "unavailable" => GrpcDenialStatus::Unavailable,
                other => {
                    return Err(self.err(
                        status.span(),
                        format!(
                            "unknown grpc_denial_status {other:?}: expected \"resource_exhausted\" or \"unavailable\""
                        ),
                    ))
                }
            };
        }
        Ok(())
    }

    /// `upstream`: `http://host:port` or `https://host:port`, nothing more.
    fn upstream(&self, u: Spanned<String>) -> Result<Uri, ConfigError> {
        let invalid = |why: &str| self.err(u.span(), format!("invalid upstream {:?}: {why}", u.get_ref()));
        let uri: Uri = u.get_ref().parse().map_err(|_| invalid("expected http://host:port"))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.authority().is_none() {
            return Err(invalid("expected http://host:port or https://host:port"));
        }
        if let Some(authority) = uri.authority() {
            if authority.as_str().contains('@') {
                // hyper would drop them silently: the upstream never sees them.
                return Err(invalid("credentials in the URL are not sent; expected http://host:port"));
            }
            // `http` reads a port that does not fit in 16 bits as no port at all.
            let port = authority.as_str().get(authority.host().len()..).and_then(|r| r.strip_prefix(':'));
            if port.is_some_and(|p| !matches!(p.parse::<u16>(), Ok(1..))) {
                // Otherwise the port is read as absent and 80 is used.
                return Err(invalid("the port must be 1 to 65535"));
            }
        }
        if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
            return Err(invalid("expected no path, only http://host:port"));
        }
        Ok(uri)
    }

    /// `drain_delay`: up to [`MAX_DRAIN_DELAY`]. It covers the time a load
    /// balancer takes to stop sending new connections, seconds; a longer one
    /// would hold every stop (and a rolling update) for nothing.
    fn drain_delay(&self, d: Spanned<Parsed<TimeSpan>>) -> Result<TimeSpan, ConfigError> {
        let delay = d.get_ref().0;
        if delay > MAX_DRAIN_DELAY {
            return Err(self.err(
                d.span(),
                format!(
                    "drain_delay must be at most {}s: it covers the time a load balancer takes to \
                     stop sending new connections; expected a duration such as \"5s\"",
                    MAX_DRAIN_DELAY.get().as_secs()
                ),
            ));
        }
        Ok(delay)
    }

    /// `admin_prefix`: empty, or a path without a trailing slash.
    fn admin_prefix(&self, p: Spanned<String>) -> Result<String, ConfigError> {
        let text = p.get_ref().trim_end_matches('/');
        if !text.is_empty() && (!text.starts_with('/') || text.contains(['?', '#', '*', '{'])) {
            return Err(self.err(
                p.span(),
                format!("invalid admin_prefix {:?}: expected a path such as \"/_slidegate\"", p.get_ref()),
            ));
        }
        Ok(text.to_owned())
    }

    /// The address of listener `name`, which must not be one another
    /// listener in `placed` binds (or, through a wildcard, shares): two
    /// would pass `check-config` and then fail to start. Port 0 (a port the
    /// system picks) never clashes.
    fn own_address(
        &self,
        name: &'static str,
        a: Spanned<Parsed<SocketAddr>>,
        placed: &mut Vec<(&'static str, SocketAddr)>,
    ) -> Result<SocketAddr, ConfigError> {
        let addr = a.get_ref().0;
        if let Some(&(other, taken)) = placed.iter().find(|(_, taken)| shares_a_socket(addr, *taken)) {
            let example = match name {
                "grpc_listen" => "127.0.0.1:8081",
                "auth_listen" => "127.0.0.1:9092",
                _ => "127.0.0.1:9091",
            };
            let clash = if addr == taken {
                format!("{name} {addr} is the {other} address")
            } else {
                format!("{name} {addr} and {other} {taken} share port {}", addr.port())
            };
            return Err(
                self.err(a.span(), format!("{clash}: expected another address, such as \"{example}\""))
            );
        }
        placed.push((name, addr));
        Ok(addr)
    }
}

/// Whether listeners on `a` and `b` cannot both bind: the same port (not 0)
/// and the same address, or a wildcard covering the other (`[::]` takes
/// IPv4 too, as Linux binds it by default).
fn shares_a_socket(a: SocketAddr, b: SocketAddr) -> bool {
    use std::net::IpAddr::{V4, V6};
    if a.port() != b.port() || a.port() == 0 {
        return false;
    }
    match (a.ip(), b.ip()) {
        (x, y) if x == y => true,
        (V6(x), _) | (_, V6(x)) if x.is_unspecified() => true,
        (V4(x), V4(y)) => x.is_unspecified() || y.is_unspecified(),
        _ => false,
    }
}
