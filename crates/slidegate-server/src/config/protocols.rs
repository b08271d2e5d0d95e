//! What `[server]` says about the protocols `serve` speaks: the listener's
//! certificate (`tls`), the CA an `https://` upstream is checked against
//! (`upstream_ca`), and the bounds HTTP/2 adds (`http2`).
//!
//! The certificate and key are read and checked against each other while
//! the configuration is validated, so a file that is missing, not PEM, or a
//! key that is not the certificate's is a located configuration error, at
//! start and at a reload alike; the server then serves exactly what was
//! checked (no second read that could find another file).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use rustls::RootCertStore;

/// `[server] tls = { cert = "PATH", key = "PATH" }`: the listener speaks
/// TLS (1.2 and 1.3) with this certificate chain and key.
#[derive(Clone)]
pub struct ListenerTls {
    /// The certificate chain (PEM), the server's certificate first.
    pub cert: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    certified: Arc<CertifiedKey>,
}

impl ListenerTls {
    /// Reads `cert` and `key` and checks that the key is the certificate's.
    ///
    /// # Errors
    /// What was wrong, naming the file: unreadable, no PEM certificate or
    /// key in it, a key rustls cannot sign with, or one that does not match.
    pub fn load(cert: &Path, key: &Path) -> Result<Self, TlsFileError> {
        let chain = load_certificates(cert)?;
        let der = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsFileError::Key(pem_problem(key, &e)))?;
        let provider = rustls::crypto::ring::default_provider();
        let certified = CertifiedKey::from_der(chain, der, &provider).map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => TlsFileError::Mismatch(format!(
                "the key {} is not the key of the certificate {}",
                key.display(),
                cert.display()
            )),
            other => TlsFileError::Key(format!("{}: {other}", key.display())),
        })?;
        Ok(Self { cert: cert.to_owned(), key: key.to_owned(), certified: Arc::new(certified) })
    }

    /// The chain and key, ready for rustls.
    pub fn certified_key(&self) -> Arc<CertifiedKey> {
        Arc::clone(&self.certified)
    }
}

impl fmt::Debug for ListenerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ListenerTls").field("cert", &self.cert).field("key", &self.key).finish()
    }
}

/// Why a certificate, key or CA file cannot be used; the message names the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TlsFileError {
    /// The certificate (or CA) file is unreadable or holds no PEM certificate.
    #[error("{0}")]
    Certificate(String),
    /// The key file is unreadable, holds no PEM key, or a key rustls cannot use.
    #[error("{0}")]
    Key(String),
    /// The key is not the certificate's.
    #[error("{0}")]
    Mismatch(String),
}

/// The certificates of the PEM file `path`, at least one.
///
/// # Errors
/// [`TlsFileError::Certificate`] naming the file.
pub fn load_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let problem = |e: &rustls::pki_types::pem::Error| TlsFileError::Certificate(pem_problem(path, e));
    let chain = CertificateDer::pem_file_iter(path)
        .map_err(|e| problem(&e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| problem(&e))?;
    if chain.is_empty() {
        return Err(problem(&rustls::pki_types::pem::Error::NoItemsFound));
    }
    Ok(chain)
}

/// The roots in the PEM file `path` (`upstream_ca`): at least one, each a
/// certificate rustls can use as a trust anchor.
///
/// # Errors
/// [`TlsFileError::Certificate`] naming the file.
pub fn load_roots(path: &Path) -> Result<RootCertStore, TlsFileError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certificates(path)? {
        roots.add(cert).map_err(|e| {
            TlsFileError::Certificate(format!("{}: not a usable CA certificate: {e}", path.display()))
        })?;
    }
    Ok(roots)
}

fn pem_problem(path: &Path, err: &rustls::pki_types::pem::Error) -> String {
    use rustls::pki_types::pem::Error;
    match err {
        Error::Io(io) => format!("cannot read {}: {io}", path.display()),
        Error::NoItemsFound => format!("{}: no PEM item of the expected kind in the file", path.display()),
        other => format!("{}: not valid PEM: {other}", path.display()),
    }
}

/// `[server] http2 = { ... }`: what one HTTP/2 connection from a client may
/// ask for. Each bound is on by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Http2Limits {
    /// Streams (requests) open at once on one connection
    /// (`max_concurrent_streams`, advertised in SETTINGS); more are refused.
    pub max_concurrent_streams: u32,
    /// The largest header list of one request, in bytes as HTTP/2 counts
    /// them (`max_header_list_size`); a larger one is refused.
    pub max_header_list_size: u32,
    /// Streams the client may reset before the server has taken them
    /// (`max_pending_reset_streams`); past it the connection gets GOAWAY:
    /// the rapid reset attack (CVE-2023-44487).
    pub max_pending_reset_streams: usize,
    /// Streams the server may reset for the client's protocol errors on one
    /// connection (`max_local_error_resets`) before it sends GOAWAY.
    pub max_local_error_resets: usize,
}

impl Default for Http2Limits {
    fn default() -> Self {
        Self {
            max_concurrent_streams: 100,
            max_header_list_size: 32 * 1024,
            max_pending_reset_streams: 20,
            max_local_error_resets: 256,
        }
    }
}
