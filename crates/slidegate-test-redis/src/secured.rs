//! [`SecuredRedis`]: a throwaway `redis-server` with a password, ACL users or TLS.

use std::path::Path;

use tempfile::TempDir;

use crate::node::{self, NodeSpec, RedisNode};
use crate::tls::TlsCerts;

/// How to start a [`SecuredRedis`]; see [`SecuredRedis::builder`].
#[derive(Clone, Debug, Default)]
pub struct SecuredRedisBuilder {
    password: Option<String>,
    users: Vec<(String, String, String)>,
    tls: bool,
}

impl SecuredRedisBuilder {
    /// Requires `password` for the default user (`--requirepass`).
    pub fn password(mut self, password: &str) -> Self {
        self.password = Some(password.to_owned());
        self
    }

    /// Adds an enabled ACL user with `password` and ACL `rules` such as
    /// `"~* +@all"` or `"~rl:* +evalsha +eval +script"` (`--user`).
    pub fn user(mut self, name: &str, password: &str, rules: &str) -> Self {
        self.users.push((name.to_owned(), password.to_owned(), rules.to_owned()));
        self
    }

    /// Serves TLS only (`--tls-port P --port 0`) with a fresh CA and server
    /// certificate; clients are not asked for certificates.
    pub fn tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// Starts the server and waits until it answers.
    ///
    /// # Panics
    /// If `redis-server` (or, with TLS, `openssl`) is missing, or the server
    /// does not start.
    pub fn start(self) -> SecuredRedis {
        let dir = tempfile::Builder::new()
            .prefix("slidegate-secured-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temp dir for redis-server: {e}"));
        let mut spec = NodeSpec::default();
        if let Some(password) = &self.password {
            spec.args.extend(["--requirepass".into(), password.clone()]);
            spec.connect.extend(["--no-auth-warning".into(), "-a".into(), password.clone()]);
        }
        for (name, password, rules) in &self.users {
            spec.args.extend(["--user".into(), name.clone(), "on".into(), format!(">{password}")]);
            spec.args.extend(rules.split_whitespace().map(str::to_owned));
        }
        let certs = self.tls.then(|| TlsCerts::generate(dir.path()));
        if let Some(certs) = &certs {
            spec.tls_port = true;
            for (flag, path) in [
                ("--tls-cert-file", &certs.server_cert),
                ("--tls-key-file", &certs.server_key),
                ("--tls-ca-cert-file", &certs.ca_cert),
            ] {
                spec.args.extend([flag.to_owned(), path.display().to_string()]);
            }
            spec.args.extend(["--tls-auth-clients".into(), "no".into()]);
            spec.connect.extend(tls_cli_options(certs));
        }
        let node = RedisNode::start(&spec, dir.path());
        SecuredRedis { node, password: self.password, certs, dir }
    }
}

/// A `redis-server` with a password, ACL users and/or TLS, killed on drop and
/// when the test process exits.
///
/// ```no_run
/// use slidegate_test_redis::SecuredRedis;
/// let server = SecuredRedis::builder().password("s3cret").user("limiter", "pw", "~* +@all").tls().start();
/// let url = server.url(); // "rediss://:s3cret@127.0.0.1:<port>/"
/// let ca = server.ca_cert(); // what the client must trust
/// # drop((url, ca));
/// ```
pub struct SecuredRedis {
    node: RedisNode,
    password: Option<String>,
    certs: Option<TlsCerts>,
    dir: TempDir,
}

impl SecuredRedis {
    /// Options for the server to start.
    pub fn builder() -> SecuredRedisBuilder {
        SecuredRedisBuilder::default()
    }

    /// The URL with the default user's password, if any:
    /// `redis[s]://[:password@]127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        match &self.password {
            Some(password) => self.url_with(None, password),
            None => format!("{}://127.0.0.1:{}/", self.scheme(), self.node.port()),
        }
    }

    /// The URL for `user` (the default user when `None`) with `password`.
    pub fn url_with(&self, user: Option<&str>, password: &str) -> String {
        format!("{}://{}:{password}@127.0.0.1:{}/", self.scheme(), user.unwrap_or(""), self.node.port())
    }

    /// The port the server listens on (its TLS port with TLS).
    pub fn port(&self) -> u16 {
        self.node.port()
    }

    /// The CA certificate (PEM) a client must trust, with TLS.
    pub fn ca_cert(&self) -> Option<&Path> {
        self.certs.as_ref().map(|c| c.ca_cert.as_path())
    }

    /// The certificate files, with TLS.
    pub fn certs(&self) -> Option<&TlsCerts> {
        self.certs.as_ref()
    }

    /// Runs `redis-cli` as the default user (with the builder's password, if
    /// any) and, with TLS, trusting the CA; returns its output. Without a
    /// password the default user needs none, ACL users or not.
    pub fn cli(&self, args: &[&str]) -> String {
        self.node.cli(args)
    }

    /// Runs `redis-cli` with TLS options when needed but no credentials, so
    /// tests can check what an unauthenticated client gets; options such as
    /// `--user U --pass P` may lead `args`.
    pub fn cli_unauthenticated(&self, args: &[&str]) -> String {
        let connect: Vec<String> = self.certs.as_ref().map(tls_cli_options).unwrap_or_default();
        node::redis_cli(self.node.port(), &connect, args)
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        self.node.log()
    }

    fn scheme(&self) -> &'static str {
        if self.certs.is_some() {
            "rediss"
        } else {
            "redis"
        }
    }
}

impl Drop for SecuredRedis {
    fn drop(&mut self) {
        self.node.kill();
        if std::thread::panicking() {
            eprintln!("--- redis-server log (port {}) ---\n{}", self.node.port(), self.node.log());
        }
    }
}

impl std::fmt::Debug for SecuredRedis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecuredRedis")
            .field("port", &self.node.port())
            .field("tls", &self.certs.is_some())
            .field("dir", &self.dir.path())
            .finish()
    }
}

fn tls_cli_options(certs: &TlsCerts) -> Vec<String> {
    vec!["--tls".into(), "--cacert".into(), certs.ca_cert.display().to_string()]
}
