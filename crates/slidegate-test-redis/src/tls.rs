//! Throwaway TLS certificates, made with the `openssl` command line.
//!
//! A self-signed CA signs a server certificate valid for `127.0.0.1` and
//! `localhost` (P-256 keys: quick to generate). The TLS tests need `openssl`
//! on `PATH`; it is installed wherever `redis-server` is built with TLS.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// PEM files of a test CA and of a server certificate it signed.
#[derive(Clone, Debug)]
pub struct TlsCerts {
    /// The CA certificate: what a client trusts.
    pub ca_cert: PathBuf,
    /// The server certificate, for `127.0.0.1` and `localhost`.
    pub server_cert: PathBuf,
    /// The server certificate's private key.
    pub server_key: PathBuf,
}

impl TlsCerts {
    /// Writes a fresh CA and server certificate into `dir`.
    ///
    /// # Panics
    /// If `openssl` is missing or fails; the message holds its output.
    pub fn generate(dir: &Path) -> TlsCerts {
        let certs = TlsCerts {
            ca_cert: dir.join("ca.crt"),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
        };
        let ca_key = dir.join("ca.key");
        let csr = dir.join("server.csr");
        let ext = dir.join("server.ext");
        std::fs::write(&ext, "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", ext.display()));
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
        openssl(
            &[&["req", "-x509"][..], &ec, &["-days", "2", "-subj", "/CN=slidegate test CA"]].concat(),
            &[("-keyout", &ca_key), ("-out", &certs.ca_cert)],
        );
        openssl(
            &[&["req"][..], &ec, &["-subj", "/CN=127.0.0.1"]].concat(),
            &[("-keyout", &certs.server_key), ("-out", &csr)],
        );
        openssl(
            &["x509", "-req", "-days", "2", "-CAcreateserial"],
            &[
                ("-in", &csr),
                ("-CA", &certs.ca_cert),
                ("-CAkey", &ca_key),
                ("-extfile", &ext),
                ("-out", &certs.server_cert),
            ],
        );
        certs
    }

    /// Writes into `dir` a server certificate for `127.0.0.1` and
    /// `localhost` made the usual self-signed way, `openssl req -x509`
    /// (which marks it `CA:TRUE`): it is its own CA, so `ca_cert` is
    /// `server_cert`.
    ///
    /// # Panics
    /// If `openssl` is missing or fails; the message holds its output.
    pub fn self_signed(dir: &Path) -> TlsCerts {
        let server_cert = dir.join("self-signed.crt");
        let certs =
            TlsCerts { ca_cert: server_cert.clone(), server_cert, server_key: dir.join("self-signed.key") };
        openssl(
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=localhost",
                "-addext",
                "subjectAltName=IP:127.0.0.1,DNS:localhost",
            ],
            &[("-keyout", &certs.server_key), ("-out", &certs.server_cert)],
        );
        certs
    }
}

fn openssl(args: &[&str], paths: &[(&str, &Path)]) {
    let mut command = Command::new("openssl");
    command.args(args);
    for (flag, path) in paths {
        command.arg(flag).arg(path);
    }
    let out = command.stdin(Stdio::null()).output().unwrap_or_else(|e| {
        panic!("cannot run openssl (the TLS tests need it on PATH; `sudo apt-get install openssl`): {e}")
    });
    if !out.status.success() {
        panic!(
            "openssl {} failed ({}):\n{}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
