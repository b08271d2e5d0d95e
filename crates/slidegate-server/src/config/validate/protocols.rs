//! `[server] tls`, `upstream_ca`, `upstream_http2` and `http2`: the
//! protocols `serve` speaks on each side.

use std::path::PathBuf;

use http::Uri;
use toml::Spanned;

use super::super::error::ConfigError;
use super::super::protocols::{load_roots, Http2Limits, ListenerTls, TlsFileError};
use super::super::raw::{RawHttp2, RawServer, RawTls};
use super::super::types::ServerConfig;
use super::Validator;

/// The protocol keys of `[server]`, taken out of it to be validated last.
pub(super) struct RawProtocols {
    tls: Option<Spanned<RawTls>>,
    upstream_ca: Option<Spanned<String>>,
    upstream_http2: Option<Spanned<bool>>,
    http2: Option<Spanned<RawHttp2>>,
}

impl RawProtocols {
    pub(super) fn take(raw: &mut RawServer) -> Self {
        Self {
            tls: raw.tls.take(),
            upstream_ca: raw.upstream_ca.take(),
            upstream_http2: raw.upstream_http2.take(),
            http2: raw.http2.take(),
        }
    }
}

impl Validator<'_> {
    /// Sets `server`'s protocol settings from `raw` (after `upstream`, which
    /// `upstream_ca` refers to).
    pub(super) fn protocols(
        &self,
        mut raw: RawProtocols,
        server: &mut ServerConfig,
    ) -> Result<(), ConfigError> {
        if let Some(tls) = raw.tls.take() {
            server.tls = Some(self.listener_tls(tls.into_inner())?);
        }
        if let Some(ca) = raw.upstream_ca.take() {
            server.upstream_ca = Some(self.upstream_ca(&ca, server.upstream.as_ref())?);
        }
        if let Some(h2) = raw.upstream_http2.take() {
            server.upstream_http2 = *h2.get_ref();
        }
        if let Some(limits) = raw.http2.take() {
            server.http2 = self.http2_limits(limits.into_inner())?;
        }
        Ok(())
    }

    /// `tls = { cert, key }`: both files read, the key the certificate's.
    fn listener_tls(&self, raw: RawTls) -> Result<ListenerTls, ConfigError> {
        let (cert, key) = (self.beside_config(raw.cert.get_ref()), self.beside_config(raw.key.get_ref()));
        ListenerTls::load(&cert, &key).map_err(|err| {
            let (span, expected) = match &err {
                TlsFileError::Certificate(_) => {
                    (raw.cert.span(), "expected a PEM certificate chain, the server's certificate first")
                }
                TlsFileError::Key(_) => (raw.key.span(), "expected the PEM private key of the certificate"),
                _ => (raw.key.span(), "expected the private key of the certificate in `cert`"),
            };
            self.err(span, format!("tls: {err}: {expected}"))
        })
    }

    /// `upstream_ca`: a PEM file of CA certificates, for an `https://` upstream.
    fn upstream_ca(&self, ca: &Spanned<String>, upstream: Option<&Uri>) -> Result<PathBuf, ConfigError> {
        if upstream.is_some_and(|u| u.scheme_str() != Some("https")) {
            return Err(self.err(
                ca.span(),
                "upstream_ca is the CA an https:// upstream's certificate must chain to, \
                 but the upstream is http://: expected upstream = \"https://host:port\"",
            ));
        }
        let path = self.beside_config(ca.get_ref());
        load_roots(&path).map_err(|err| {
            self.err(ca.span(), format!("upstream_ca: {err}: expected a PEM file of CA certificates"))
        })?;
        Ok(path)
    }

    /// `http2 = { ... }`: each bound at least 1 (0 would refuse everything).
    fn http2_limits(&self, raw: RawHttp2) -> Result<Http2Limits, ConfigError> {
        let mut limits = Http2Limits::default();
        let positive = |value: Option<Spanned<u32>>, key: &str, example: u32| match value {
            None => Ok(None),
            Some(v) if *v.get_ref() == 0 => Err(self.err(
                v.span(),
                format!("http2.{key} must be at least 1: expected a bound such as {example}"),
            )),
            Some(v) => Ok(Some(*v.get_ref())),
        };
        if let Some(n) = positive(raw.max_concurrent_streams, "max_concurrent_streams", 100)? {
            limits.max_concurrent_streams = n;
        }
        if let Some(n) = positive(raw.max_header_list_size, "max_header_list_size", 32768)? {
            limits.max_header_list_size = n;
        }
        if let Some(n) = positive(raw.max_pending_reset_streams, "max_pending_reset_streams", 20)? {
            limits.max_pending_reset_streams = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(n) = positive(raw.max_local_error_resets, "max_local_error_resets", 256)? {
            limits.max_local_error_resets = usize::try_from(n).unwrap_or(usize::MAX);
        }
        Ok(limits)
    }

    /// `name` relative to the configuration file's directory (absolute as is).
    fn beside_config(&self, name: &str) -> PathBuf {
        self.path.parent().unwrap_or(std::path::Path::new("")).join(name)
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{Config, Http2Limits};

    fn parse(server: &str) -> Result<Config, crate::config::ConfigError> {
        Config::parse(&format!("[server]\nupstream = \"http://127.0.0.1:9000\"\n{server}\n"), "t.toml")
    }

    #[test]
    fn http2_bounds_default_on_and_are_set_one_by_one() {
        let config = parse("").unwrap();
        assert_eq!(config.server.http2, Http2Limits::default());
        assert!(!config.server.upstream_http2);
        let config = parse("upstream_http2 = true\nhttp2 = { max_concurrent_streams = 7 }").unwrap();
        assert_eq!(config.server.http2.max_concurrent_streams, 7);
        assert_eq!(config.server.http2.max_header_list_size, 32 * 1024);
        assert!(config.server.upstream_http2);
    }

    #[test]
    fn a_zero_http2_bound_or_an_unknown_key_is_a_located_error() {
        let err = parse("http2 = { max_pending_reset_streams = 0 }").unwrap_err();
        assert_eq!(err.location(), Some((3, 39)));
        assert!(err.to_string().contains("http2.max_pending_reset_streams must be at least 1"), "{err}");
        let err = parse("http2 = { max_streams = 10 }").unwrap_err();
        assert_eq!(err.location().map(|(line, _)| line), Some(3), "{err}");
    }

    #[test]
    fn a_missing_certificate_is_located_at_its_path() {
        let err = parse("tls = { cert = \"nowhere.crt\", key = \"nowhere.key\" }").unwrap_err();
        assert_eq!(err.location(), Some((3, 16)));
        assert!(err.to_string().contains("tls: cannot read nowhere.crt"), "{err}");
    }
}
