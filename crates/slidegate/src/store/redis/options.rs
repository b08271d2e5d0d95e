//! How a [`RedisStore`](crate::RedisStore) connects and where it takes the time from.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::{Engine, Layout};
use crate::Clock;

/// Where a [`RedisStore`](crate::RedisStore) takes the current time from.
#[derive(Clone, Default)]
pub enum TimeSource {
    /// Redis `TIME`, read inside each script: one clock for every app server.
    #[default]
    Server,
    /// The given clock, sent with each call: for tests and replays (a
    /// [`crate::ManualClock`]), or to share a clock with a [`crate::MemoryStore`].
    ///
    /// TTLs still run on Redis's own clock, so in this mode each key lives 10 s
    /// longer than its state matters: a client clock that runs slow (or only
    /// moves when told to) does not see its state expire early.
    Client(Arc<dyn Clock>),
}

impl fmt::Debug for TimeSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TimeSource::Server => f.write_str("Server"),
            TimeSource::Client(clock) => write!(f, "Client(now_ms = {})", clock.now_ms()),
        }
    }
}

/// Deadlines, reconnection, credentials and TLS of a [`RedisStore`](crate::RedisStore), for
/// [`RedisStore::connect_with`](crate::RedisStore::connect_with) and [`RedisStore::connect_to`](crate::RedisStore::connect_to).
///
/// The defaults suit a Redis on the same network: a decision that takes
/// longer than 250 ms is better answered by a fallback than waited for.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisOptions {
    pub(super) timeout: Duration,
    pub(super) connect_timeout: Duration,
    pub(super) reconnect_min: Duration,
    pub(super) reconnect_max: Duration,
    pub(super) username: Option<String>,
    pub(super) password: Option<String>,
    pub(super) tls_ca: Option<PathBuf>,
    pub(super) engine: Engine,
    pub(super) layout: Layout,
}

impl fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisOptions")
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("reconnect_min", &self.reconnect_min)
            .field("reconnect_max", &self.reconnect_max)
            .field("username", &self.username)
            // Never printed: options end up in logs.
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("tls_ca", &self.tls_ca)
            .field("engine", &self.engine)
            .field("layout", &self.layout)
            .finish()
    }
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_millis(250),
            connect_timeout: Duration::from_millis(500),
            reconnect_min: Duration::from_millis(25),
            reconnect_max: Duration::from_millis(200),
            username: None,
            password: None,
            tls_ca: None,
            engine: Engine::Auto,
            layout: Layout::PerKey,
        }
    }
}

impl RedisOptions {
    /// The defaults: 250 ms per decision, 500 ms per connection attempt,
    /// reconnect back-off from 25 ms doubling up to 200 ms.
    pub fn new() -> Self {
        Self::default()
    }

    /// The deadline of one decision, from the call to the reply, the
    /// `NOSCRIPT` fallback included. Past it the call fails with
    /// [`Unavailable::TimedOut`](crate::Unavailable::TimedOut).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The deadline of one connection attempt (TCP and handshake), at
    /// [`RedisStore::connect_with`](crate::RedisStore::connect_with) and for each background reconnect.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The pause between background reconnect attempts: `min` after the
    /// first failure, doubling up to `max`. A short `max` bounds how long a
    /// store stays down after Redis is back.
    pub fn with_reconnect_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.reconnect_min = min.max(Duration::from_millis(1));
        self.reconnect_max = max.max(self.reconnect_min);
        self
    }

    /// The ACL user and password for the data nodes (the server, the
    /// cluster's nodes, the master behind Sentinel). Each one given
    /// overrides the URL's; `None` keeps the URL's. A password alone logs in
    /// as the `default` user (`requirepass`).
    pub fn with_credentials(mut self, username: Option<String>, password: Option<String>) -> Self {
        self.username = username;
        self.password = password;
        self
    }

    /// Trusts the CA certificate in this PEM file for `rediss://` servers,
    /// instead of the system roots.
    pub fn with_tls_ca(mut self, ca_cert_pem_path: PathBuf) -> Self {
        self.tls_ca = Some(ca_cert_pem_path);
        self
    }

    /// Decides with `engine` (default [`Engine::Auto`]).
    pub fn with_engine(mut self, engine: Engine) -> Self {
        self.engine = engine;
        self
    }

    /// Keeps the state in `layout` (default [`Layout::PerKey`]): the
    /// store [`RedisStore::with_layout`](crate::RedisStore::with_layout) makes.
    pub fn with_layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }

    /// The deadline of one decision.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The deadline of one connection attempt.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }
}
