//! Where a [`super::RedisStore`]'s data lives, and how to reach it: URLs,
//! credentials, TLS, and the master behind a Sentinel.

use crate::Unavailable;
use redis::{
    Client, ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo, RedisError, TlsCertificates,
};

use super::RedisOptions;
use crate::store::StoreError;

/// Where the Redis store's data lives.
///
/// Every target takes `redis://` and `rediss://` (TLS) URLs; the
/// credentials and CA of [`RedisOptions`] apply to the data nodes of each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server: `redis://` or `rediss://` URL (credentials may be in the URL).
    Single(String),
    /// A Redis Cluster: seed node URLs (any subset of the nodes). All keys of
    /// one identity share its `{identity}` hash tag, so every script runs on
    /// one node, a request with several charges included.
    Cluster(Vec<String>),
    /// A master found through Sentinel: the sentinels' URLs (asked as they
    /// are, credentials in the URL if they need any) and the name they
    /// monitor the master under. After a failover the store asks the
    /// sentinels again for the new master.
    Sentinel {
        /// The sentinels' URLs.
        sentinels: Vec<String>,
        /// The name the sentinels know the master by.
        master_name: String,
    },
}

/// An error in the store's configuration: the call never reached Redis.
pub(super) fn config_error(what: &'static str, detail: String) -> StoreError {
    StoreError::Unavailable(Unavailable::Redis(RedisError::from((
        ErrorKind::InvalidClientConfig,
        what,
        detail,
    ))))
}

/// The CA the options name, read once: `None` trusts the system roots.
pub(super) fn certificates(options: &RedisOptions) -> Result<Option<TlsCertificates>, StoreError> {
    let Some(path) = &options.tls_ca else { return Ok(None) };
    // rustls needs one crypto provider for the process; an application that
    // installed its own keeps it (the error only says one is there already).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pem = std::fs::read(path)
        .map_err(|e| config_error("cannot read the TLS CA file", format!("{}: {e}", path.display())))?;
    Ok(Some(TlsCertificates { client_tls: None, root_cert: Some(pem) }))
}

/// `url` with the options' credentials in place of the URL's.
pub(super) fn node_info(url: &str, options: &RedisOptions) -> Result<ConnectionInfo, StoreError> {
    let info = url.into_connection_info()?;
    Ok(with_credentials(info, options))
}

fn with_credentials(info: ConnectionInfo, options: &RedisOptions) -> ConnectionInfo {
    let mut redis = info.redis_settings().clone();
    if let Some(username) = &options.username {
        redis = redis.set_username(username);
    }
    if let Some(password) = &options.password {
        redis = redis.set_password(password);
    }
    info.set_redis_settings(redis)
}

/// Whether `info` asks for TLS.
pub(super) fn is_tls(info: &ConnectionInfo) -> bool {
    matches!(info.addr(), ConnectionAddr::TcpTls { .. })
}

/// A client for one node; a `rediss://` node with a CA given trusts that
/// CA, without one the system roots.
pub(super) fn client(info: ConnectionInfo, certs: Option<&TlsCertificates>) -> Result<Client, StoreError> {
    if is_tls(&info) {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    match certs {
        Some(certs) if is_tls(&info) => Ok(Client::build_with_tls(info, certs.clone())?),
        _ => Ok(Client::open(info)?),
    }
}

/// How a [`super::link::Link`] finds the server to connect to.
pub(super) enum Source {
    /// Always the same server.
    Fixed(Client),
    /// Whichever master the sentinels name now.
    Sentinel(SentinelSource),
}

/// The sentinels, and how to connect to the master they name.
pub(super) struct SentinelSource {
    sentinels: Vec<Client>,
    master_name: String,
    /// Credentials, database and protocol for the master.
    master: ConnectionInfo,
    certs: Option<TlsCertificates>,
}

impl SentinelSource {
    /// The sentinels at `urls`, for the master named `master_name`. The
    /// master is reached over TLS when the sentinels are, or when a CA is
    /// given; with the options' credentials, else the first sentinel URL's.
    pub(super) fn new(
        urls: &[String],
        master_name: &str,
        options: &RedisOptions,
    ) -> Result<Self, StoreError> {
        let first = urls.first().ok_or_else(|| config_error("no sentinel URLs", String::new()))?;
        let sentinels =
            urls.iter().map(|url| Ok(Client::open(url.as_str())?)).collect::<Result<Vec<_>, StoreError>>()?;
        let certs = certificates(options)?;
        let mut master = node_info(first, options)?;
        if certs.is_some() && !is_tls(&master) {
            master = master.set_addr(ConnectionAddr::TcpTls {
                host: String::new(),
                port: 0,
                insecure: false,
                tls_params: None,
            });
        }
        Ok(Self { sentinels, master_name: master_name.to_owned(), master, certs })
    }

    /// Asks the sentinels in turn for the master's address, each within the
    /// connect timeout, and returns a client for it.
    pub(super) async fn resolve(&self, options: &RedisOptions) -> Result<Client, StoreError> {
        let mut last = StoreError::Unavailable(Unavailable::NotConnected(format!(
            "no sentinel knows master {:?}",
            self.master_name
        )));
        for sentinel in &self.sentinels {
            let ask = async {
                let mut conn = sentinel.get_multiplexed_async_connection().await?;
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(&self.master_name)
                    .query_async::<Option<(String, u16)>>(&mut conn)
                    .await
            };
            match tokio::time::timeout(options.connect_timeout, ask).await {
                Ok(Ok(Some((host, port)))) => {
                    let addr = if is_tls(&self.master) {
                        ConnectionAddr::TcpTls { host, port, insecure: false, tls_params: None }
                    } else {
                        ConnectionAddr::Tcp(host, port)
                    };
                    return client(self.master.clone().set_addr(addr), self.certs.as_ref());
                }
                Ok(Ok(None)) => {}
                Ok(Err(e)) => last = e.into(),
                Err(_) => last = StoreError::Unavailable(Unavailable::TimedOut(options.connect_timeout)),
            }
        }
        Err(last)
    }
}

impl Source {
    /// The client to connect with now.
    pub(super) async fn client(&self, options: &RedisOptions) -> Result<Client, StoreError> {
        match self {
            Source::Fixed(client) => Ok(client.clone()),
            Source::Sentinel(sentinel) => sentinel.resolve(options).await,
        }
    }

    /// Whether the server can change under the same source, so that a
    /// `READONLY` reply (a demoted master) calls for asking again.
    pub(super) fn follows_failover(&self) -> bool {
        matches!(self, Source::Sentinel(_))
    }
}
