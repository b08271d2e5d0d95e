//! The harness of the TLS and HTTP/2 tests (`tls.rs`, `http2.rs`): an
//! upstream that speaks HTTP/1.1 and HTTP/2, in clear or over TLS, and says
//! what it saw; curl as the client not written here; a tokio runtime for the
//! clients written here (hyper's, and `h2`'s raw one).

#![allow(dead_code, clippy::unwrap_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

pub use slidegate_test_redis::TlsCerts;

/// A runtime for the clients and upstreams of one test.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// An upstream answering `{method} {path} v={version} host={authority or Host} sni={name}`,
/// `/slow` after 400 ms; counts connections and requests.
pub struct ProtoUpstream {
    pub addr: SocketAddr,
    pub connections: Arc<AtomicUsize>,
    pub hits: Arc<AtomicUsize>,
    _runtime: tokio::runtime::Runtime,
}

impl ProtoUpstream {
    /// In clear, HTTP/1.1 and prior-knowledge HTTP/2, on `ip`.
    pub fn clear(ip: &str) -> ProtoUpstream {
        Self::start(ip, None)
    }

    /// Over TLS with `certs`' server certificate (ALPN h2 and http/1.1), on `ip`.
    pub fn tls(ip: &str, certs: &TlsCerts) -> ProtoUpstream {
        Self::start(ip, Some(server_config(certs)))
    }

    fn start(ip: &str, tls: Option<Arc<rustls::ServerConfig>>) -> ProtoUpstream {
        let runtime = runtime();
        let listener = runtime.block_on(tokio::net::TcpListener::bind((ip, 0))).unwrap();
        let addr = listener.local_addr().unwrap();
        let (connections, hits) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (c, h) = (Arc::clone(&connections), Arc::clone(&hits));
        runtime.spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                c.fetch_add(1, Ordering::SeqCst);
                let (tls, h) = (tls.clone(), Arc::clone(&h));
                tokio::spawn(async move {
                    match tls {
                        None => serve(TokioIo::new(stream), String::new(), h).await,
                        Some(config) => {
                            let Ok(stream) = tokio_rustls::TlsAcceptor::from(config).accept(stream).await
                            else {
                                return;
                            };
                            let sni = stream.get_ref().1.server_name().unwrap_or("-").to_owned();
                            serve(TokioIo::new(stream), sni, h).await;
                        }
                    }
                });
            }
        });
        ProtoUpstream { addr, connections, hits, _runtime: runtime }
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

async fn serve<I>(io: I, sni: String, hits: Arc<AtomicUsize>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let (sni, hits) = (sni.clone(), Arc::clone(&hits));
        async move {
            hits.fetch_add(1, Ordering::SeqCst);
            if request.uri().path() == "/slow" {
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
            let host = request
                .uri()
                .authority()
                .map(|a| a.to_string())
                .or_else(|| request.headers().get("host").map(|h| h.to_str().unwrap().to_owned()))
                .unwrap_or_default();
            let body = format!(
                "{} {} v={:?} host={host} sni={sni}",
                request.method(),
                request.uri().path(),
                request.version()
            );
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body))))
        }
    });
    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
        .serve_connection(io, service)
        .await;
}

fn server_config(certs: &TlsCerts) -> Arc<rustls::ServerConfig> {
    let chain =
        CertificateDer::pem_file_iter(&certs.server_cert).unwrap().collect::<Result<Vec<_>, _>>().unwrap();
    let key = PrivateKeyDer::from_pem_file(&certs.server_key).unwrap();
    let mut config =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Arc::new(config)
}

/// A TLS client trusting `ca` and offering `alpn`.
pub fn tls_connector(ca: &Path, alpn: &[&[u8]]) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

// ---------------------------------------------------------------- curl

/// What curl got: its exit code, then (when it got an answer) status,
/// HTTP version, headers (lower-cased names) and body.
#[derive(Debug)]
pub struct Curl {
    pub exit: i32,
    pub status: u16,
    pub version: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
    pub stderr: String,
}

impl Curl {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// Runs `curl -s -i` with `args`, the URL last.
pub fn curl(args: &[&str]) -> Curl {
    let out = Command::new("curl")
        .args(["-s", "-S", "-i", "--max-time", "10", "-w", "\n@@%{http_code} %{http_version}"])
        .args(args)
        .output()
        .expect("the TLS and HTTP/2 tests need curl (with HTTP/2: apt-get install curl)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (reply, tail) = text.rsplit_once("\n@@").unwrap_or((&text, "0 0"));
    let (status, version) = tail.split_once(' ').unwrap_or(("0", "0"));
    // With -i the head of the last answer comes first.
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or(("", reply));
    let headers = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Curl {
        exit: out.status.code().unwrap_or(-1),
        status: status.parse().unwrap_or(0),
        version: version.trim().to_owned(),
        headers,
        body: body.to_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `--resolve` arguments so `https://localhost:{port}` reaches 127.0.0.1.
pub fn localhost(addr: SocketAddr) -> String {
    format!("localhost:{}:127.0.0.1", addr.port())
}
