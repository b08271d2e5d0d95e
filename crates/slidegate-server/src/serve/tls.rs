//! TLS on both sides of `serve`, with rustls and its ring provider.
//!
//! - The listener ([`ListenerCerts`], [`acceptor`]): TLS 1.2 and 1.3, ALPN
//!   `h2` then `http/1.1`. The certificate is looked up per handshake, so a
//!   reload that swaps it ([`ListenerCerts::replace`]) changes what the next
//!   handshake presents and leaves open connections as they are.
//! - The upstream ([`UpstreamTls`]): the server's certificate checked
//!   against the system's roots or `upstream_ca`, for the upstream's host
//!   (also its SNI). Verification cannot be turned off: a failure fails the
//!   request (502), and nothing is ever sent in clear instead. A
//!   certificate made the usual self-signed way (`openssl req -x509`, which
//!   marks it a CA) and named itself in `upstream_ca` is *pinned*: it is
//!   accepted as the upstream's own certificate, still only for the names
//!   it holds and while it is valid ([`Pinned`]), as nginx's
//!   `proxy_ssl_trusted_certificate` accepts it.

use std::sync::{Arc, PoisonError, RwLock};

use rustls::pki_types::ServerName;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::RootCertStore;

use crate::config::ServerConfig;

/// The protocols one connection may speak after TLS, in preference order.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// The listener's current certificate and key, swapped by a reload.
#[derive(Debug)]
pub(crate) struct ListenerCerts {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ListenerCerts {
    pub(crate) fn new(key: Arc<CertifiedKey>) -> Arc<Self> {
        Arc::new(Self { current: RwLock::new(key) })
    }

    /// Presents `key` from the next handshake on.
    pub(crate) fn replace(&self, key: Arc<CertifiedKey>) {
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = key;
    }
}

impl ResolvesServerCert for ListenerCerts {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.current.read().unwrap_or_else(PoisonError::into_inner)))
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

const VERSIONS: [&rustls::SupportedProtocolVersion; 2] = [&rustls::version::TLS13, &rustls::version::TLS12];

/// The acceptor of a TLS listener presenting `certs`.
pub(crate) fn acceptor(certs: Arc<ListenerCerts>) -> Result<tokio_rustls::TlsAcceptor, rustls::Error> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&VERSIONS)?
        .with_no_client_auth()
        .with_cert_resolver(certs);
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// How connections to an `https://` upstream are made.
#[derive(Clone)]
pub(crate) struct UpstreamTls {
    connector: tokio_rustls::TlsConnector,
    /// The upstream's host: what its certificate must name, sent as SNI.
    name: ServerName<'static>,
}

/// Why an `https://` upstream cannot be set up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpstreamTlsError {
    #[error(transparent)]
    Ca(#[from] crate::config::TlsFileError),
    #[error("no usable root certificate in the system's store ({0}): set [server] upstream_ca")]
    NoRoots(String),
    #[error("the upstream host {0:?} is not a name a certificate can be checked for")]
    Name(String),
    #[error(transparent)]
    Rustls(#[from] rustls::Error),
}

impl UpstreamTls {
    /// The TLS of `server`'s upstream when it is `https://`; `None` for `http://`.
    pub(crate) fn of(server: &ServerConfig) -> Result<Option<Self>, UpstreamTlsError> {
        let Some(upstream) = server.upstream.as_ref().filter(|u| u.scheme_str() == Some("https")) else {
            return Ok(None);
        };
        let host = upstream.host().unwrap_or("").trim_start_matches('[').trim_end_matches(']');
        let name =
            ServerName::try_from(host.to_owned()).map_err(|_| UpstreamTlsError::Name(host.to_owned()))?;
        let roots = match &server.upstream_ca {
            Some(path) => crate::config::load_roots(path)?,
            None => system_roots()?,
        };
        let pinned = match &server.upstream_ca {
            Some(path) => crate::config::load_certificates(path)?,
            None => Vec::new(),
        };
        let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .map_err(|e| UpstreamTlsError::Rustls(rustls::Error::General(e.to_string())))?;
        let verifier = Arc::new(Pinned { webpki, pinned });
        let mut config = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&VERSIONS)?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        config.alpn_protocols =
            vec![if server.upstream_http2 { b"h2".to_vec() } else { b"http/1.1".to_vec() }];
        Ok(Some(Self { connector: tokio_rustls::TlsConnector::from(Arc::new(config)), name }))
    }

    /// TLS over `stream`, the upstream's certificate verified.
    pub(crate) async fn connect(
        &self,
        stream: tokio::net::TcpStream,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        self.connector.connect(self.name.clone(), stream).await
    }
}

/// The upstream's certificate verifier: webpki's against the roots, and
/// one exception. A certificate webpki refuses only because it is a CA's
/// (`CaUsedAsEndEntity`: `openssl req -x509` marks every self-signed
/// certificate so) is accepted when it is, byte for byte, one of the
/// `upstream_ca` certificates — the operator named that very certificate —
/// and still only for the upstream's name and while valid: webpki checks
/// the validity period before the CA flag, and the name is checked here.
#[derive(Debug)]
struct Pinned {
    webpki: Arc<rustls::client::WebPkiServerVerifier>,
    pinned: Vec<rustls::pki_types::CertificateDer<'static>>,
}

impl rustls::client::danger::ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        intermediates: &[rustls::pki_types::CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let refused = match self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Ok(verified) => return Ok(verified),
            Err(refused) => refused,
        };
        let ca_as_end_entity = matches!(
            &refused,
            rustls::Error::InvalidCertificate(rustls::CertificateError::Other(other))
                if matches!(other.0.downcast_ref::<webpki::Error>(), Some(webpki::Error::CaUsedAsEndEntity))
        );
        if !ca_as_end_entity {
            return Err(refused);
        }
        if !self.pinned.iter().any(|pin| pin.as_ref() == end_entity.as_ref()) {
            let why = rustls::OtherError(Arc::new(NotPinned));
            return Err(rustls::Error::InvalidCertificate(rustls::CertificateError::Other(why)));
        }
        let parsed = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_name(&parsed, server_name)?;
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// A CA's certificate presented as the upstream's own, and not the one
/// `upstream_ca` names: what the log says, with the fix.
struct NotPinned;

impl std::fmt::Debug for NotPinned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "CaUsedAsEndEntity: the upstream presents a CA's certificate (CA:TRUE, as `openssl req -x509` makes) \
             as its own, and it is not one upstream_ca names; to pin a self-signed upstream certificate, name \
             that very certificate file in [server] upstream_ca",
        )
    }
}

impl std::fmt::Display for NotPinned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

impl std::error::Error for NotPinned {}

/// The system's trusted roots; those it cannot parse are skipped.
fn system_roots() -> Result<RootCertStore, UpstreamTlsError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = found.errors.first().map_or_else(|| "none found".to_owned(), ToString::to_string);
        return Err(UpstreamTlsError::NoRoots(why));
    }
    Ok(roots)
}
