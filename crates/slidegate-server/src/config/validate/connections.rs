//! `[server] connections.<listener>`: each listener's connection cap and
//! timeouts, each within a range that can serve (a cap of 0 or a timeout
//! of 0 would refuse every client; a cap beyond the system's file
//! descriptors, or a timeout of days, bounds nothing).

use slidegate_http::config::TimeSpan;
use toml::Spanned;

use super::super::connections::{ConnectionLimits, ListenerConnections};
use super::super::error::ConfigError;
use super::super::raw::{RawConnectionLimits, RawConnections};
use super::super::values::Parsed;
use super::Validator;

impl Validator<'_> {
    /// `connections = { public, admin, auth, grpc }`: the defaults, with
    /// what the file sets.
    pub(super) fn connections(&self, raw: RawConnections) -> Result<ListenerConnections, ConfigError> {
        let mut connections = ListenerConnections::default();
        let listeners = [
            ("public", raw.public, &mut connections.public),
            ("admin", raw.admin, &mut connections.admin),
            ("auth", raw.auth, &mut connections.auth),
            ("grpc", raw.grpc, &mut connections.grpc),
        ];
        for (name, raw, limits) in listeners {
            if let Some(raw) = raw {
                self.connection_limits(name, raw.into_inner(), limits)?;
            }
        }
        Ok(connections)
    }

    /// One listener's `{ max, header_timeout, idle_timeout }` over its defaults.
    fn connection_limits(
        &self,
        listener: &str,
        raw: RawConnectionLimits,
        limits: &mut ConnectionLimits,
    ) -> Result<(), ConfigError> {
        if let Some(max) = raw.max {
            let most = ConnectionLimits::MAX_CONNECTIONS;
            limits.max = usize::try_from(*max.get_ref())
                .ok()
                .filter(|n| (1..=most).contains(n))
                .ok_or_else(|| {
                    self.err(
                        max.span(),
                        format!(
                            "connections.{listener}.max must be 1 to {most}, got {}: expected the connections \
                             the listener may hold open at once, such as {}",
                            max.get_ref(),
                            limits.max
                        ),
                    )
                })?;
        }
        let key = format!("connections.{listener}.header_timeout");
        if let Some(t) = raw.header_timeout {
            limits.header_timeout = self.connection_timeout(&key, t, ConnectionLimits::MAX_HEADER_TIMEOUT)?;
        }
        let key = format!("connections.{listener}.idle_timeout");
        if let Some(t) = raw.idle_timeout {
            limits.idle_timeout = self.connection_timeout(&key, t, ConnectionLimits::MAX_IDLE_TIMEOUT)?;
        }
        Ok(())
    }

    /// A timeout above 0 and at most `most`.
    fn connection_timeout(
        &self,
        key: &str,
        t: Spanned<Parsed<TimeSpan>>,
        most: TimeSpan,
    ) -> Result<TimeSpan, ConfigError> {
        let delay = t.get_ref().0;
        if delay.get().is_zero() || delay > most {
            return Err(self.err(
                t.span(),
                format!(
                    "{key} must be longer than 0 and at most {}s, got {}ms: expected a duration such as \"30s\"",
                    most.get().as_secs(),
                    delay.as_millis()
                ),
            ));
        }
        Ok(delay)
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{Config, ConnectionLimits, ListenerConnections};
    use slidegate_http::config::TimeSpan;

    fn parse(server: &str) -> Result<Config, crate::config::ConfigError> {
        Config::parse(&format!("[server]\nupstream = \"http://127.0.0.1:9000\"\n{server}\n"), "t.toml")
    }

    /// The message of the error `server` gets, which must be located on line 3.
    fn refused(server: &str) -> String {
        let err = parse(server).unwrap_err();
        assert_eq!(err.location().map(|(line, _)| line), Some(3), "{err}");
        err.to_string()
    }

    #[test]
    fn every_listener_is_bounded_by_default() {
        let connections = parse("").unwrap().server.connections;
        assert_eq!(connections, ListenerConnections::default());
        assert_eq!(
            [connections.public.max, connections.admin.max, connections.auth.max, connections.grpc.max],
            [10_000, 64, 4_096, 1_024]
        );
        for limits in [connections.public, connections.admin, connections.auth, connections.grpc] {
            assert_eq!(limits.header_timeout, TimeSpan::from_secs(30));
            assert_eq!(limits.idle_timeout, TimeSpan::from_secs(60));
        }
    }

    #[test]
    fn each_listener_and_key_is_set_on_its_own() {
        let config = parse(
            "connections.auth = { max = 3, header_timeout = \"2s\" }\n\
             connections.grpc = { idle_timeout = \"500ms\" }",
        )
        .unwrap();
        let connections = config.server.connections;
        assert_eq!(connections.auth.max, 3);
        assert_eq!(connections.auth.header_timeout, TimeSpan::from_secs(2));
        assert_eq!(connections.auth.idle_timeout, TimeSpan::from_secs(60));
        assert_eq!(connections.grpc.idle_timeout, TimeSpan::from_millis(500));
        assert_eq!(connections.grpc.max, 1_024);
        assert_eq!(connections.public, ListenerConnections::default().public);
        let most = parse("connections.public = { max = 1000000, idle_timeout = \"1d\" }").unwrap();
        assert_eq!(most.server.connections.public.max, ConnectionLimits::MAX_CONNECTIONS);
    }

    #[test]
    fn a_cap_of_zero_negative_or_absurd_is_a_located_error() {
        for (max, got) in [
            ("0", "0"),
            ("-1", "-1"),
            ("1000001", "1000001"),
            ("-9223372036854775808", "-9223372036854775808"),
        ] {
            let message = refused(&format!("connections.auth = {{ max = {max} }}"));
            assert!(
                message.contains(&format!("connections.auth.max must be 1 to 1000000, got {got}")),
                "{message}"
            );
        }
        let message = refused("connections.public = { max = 99999999999999999999 }");
        assert!(message.contains("max"), "{message}");
    }

    #[test]
    fn a_wrong_type_is_a_located_error() {
        for value in
            ["max = \"100\"", "max = 1.5", "max = true", "header_timeout = 30", "idle_timeout = [\"1s\"]"]
        {
            let message = refused(&format!("connections.admin = {{ {value} }}"));
            assert!(message.contains("invalid type"), "{value}: {message}");
        }
        let message = refused("connections = { public = 5 }");
        assert!(message.contains("invalid type"), "{message}");
    }

    #[test]
    fn a_timeout_of_zero_or_absurd_or_without_unit_is_a_located_error() {
        let message = refused("connections.grpc = { header_timeout = \"0s\" }");
        assert!(
            message.contains("connections.grpc.header_timeout must be longer than 0 and at most 600s"),
            "{message}"
        );
        let message = refused("connections.grpc = { header_timeout = \"11m\" }");
        assert!(message.contains("got 660000ms"), "{message}");
        let message = refused("connections.public = { idle_timeout = \"2d\" }");
        assert!(
            message.contains("connections.public.idle_timeout must be longer than 0 and at most 86400s"),
            "{message}"
        );
        let message = refused("connections.public = { idle_timeout = \"30\" }");
        assert!(message.contains("expected a whole number followed by ms, s, m, h or d"), "{message}");
        let message = refused("connections.public = { idle_timeout = \"-5s\" }");
        assert!(message.contains("invalid duration"), "{message}");
    }

    #[test]
    fn an_unknown_listener_or_key_is_a_located_error() {
        let message = refused("connections.hook = { max = 5 }");
        assert!(message.contains("unknown field `hook`"), "{message}");
        let message = refused("connections.auth = { max_connections = 5 }");
        assert!(message.contains("unknown field `max_connections`"), "{message}");
    }
}
