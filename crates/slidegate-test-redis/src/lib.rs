//! A throwaway `redis-server` for tests.
//!
//! [`RedisServer::spawn`] starts a server on an ephemeral loopback port with
//! persistence off and its log in a temporary directory, waits until it
//! answers `PING`, and kills it when dropped. When the dropping thread is
//! panicking (a failed test) the server's log is printed to stderr.
//!
//! ```no_run
//! let server = slidegate_test_redis::RedisServer::spawn();
//! let url = server.url(); // "redis://127.0.0.1:<port>/"
//! # drop(url);
//! ```
//!
//! There is no silent skip: if `redis-server` is not on `PATH`, `spawn`
//! panics and says how to install it. Port 6379 is never used.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

mod cluster;
mod commandstats;
mod module;
mod node;
mod secured;
mod sentinel;
mod tls;

pub use cluster::{slot_of, RedisCluster, SLOT_COUNT};
pub use commandstats::CommandStats;
pub use module::{module_args, slidegate_module};
pub use secured::{SecuredRedis, SecuredRedisBuilder};
pub use sentinel::RedisSentinel;
pub use tls::TlsCerts;

/// How long a started server gets to answer `PING` before the start counts as failed.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Fresh ports tried by [`RedisServer::spawn`] before giving up.
const SPAWN_ATTEMPTS: usize = 8;
/// The port every developer's own Redis listens on; tests must never touch it.
const DEFAULT_REDIS_PORT: u16 = 6379;

/// A `redis-server` child process on `127.0.0.1:<ephemeral port>`, killed on drop.
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    dir: TempDir,
    /// More `redis-server` arguments, given at every (re)start.
    args: Vec<String>,
}

impl RedisServer {
    /// Starts a server on a fresh ephemeral port and waits until it answers `PING`.
    ///
    /// # Panics
    /// If `redis-server` is not installed, or no server could be started.
    pub fn spawn() -> RedisServer {
        Self::spawn_with_args(&[])
    }

    fn spawn_configured(args: &[&str]) -> RedisServer {
        ensure_installed();
        let dir = tempfile::Builder::new()
            .prefix("slidegate-redis-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temp dir for redis-server: {e}"));
        let mut server =
            RedisServer { port: 0, child: None, dir, args: args.iter().map(|a| (*a).to_owned()).collect() };
        let mut failures = Vec::new();
        for _ in 0..SPAWN_ATTEMPTS {
            server.port = free_port();
            match server.start() {
                Ok(()) => return server,
                Err(why) => failures.push(format!("port {}: {why}", server.port)),
            }
        }
        panic!(
            "could not start redis-server after {SPAWN_ATTEMPTS} attempts:\n{}\n--- log ---\n{}",
            failures.join("\n"),
            server.log()
        );
    }

    /// The connection URL, `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The port the server listens on (the same across [`restart`](Self::restart)).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The socket address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.port))
    }

    /// Whether the server process is running (started and not killed).
    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Kills the server (SIGKILL) and waits for it to exit. Its data is lost
    /// (persistence is off). Idempotent.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server process (SIGSTOP): it keeps its connections and its
    /// data but answers nothing, as a Redis stalled by a long command or a
    /// frozen host would, until [`resume`](Self::resume).
    pub fn pause(&mut self) {
        self.signal("-STOP");
    }

    /// Lets a [`pause`](Self::pause)d server run again (SIGCONT).
    pub fn resume(&mut self) {
        self.signal("-CONT");
    }

    fn signal(&mut self, signal: &str) {
        let Some(child) = &self.child else { panic!("redis-server is not running") };
        let status = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .unwrap_or_else(|e| panic!("cannot run kill {signal}: {e}"));
        assert!(status.success(), "kill {signal} failed: {status}");
    }

    /// Kills the server if it runs, then starts a fresh, empty one on the same
    /// port and waits until it answers `PING`.
    ///
    /// # Panics
    /// If the server cannot be started again within a few seconds.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match self.start() {
                Ok(()) => return,
                // The port can stay busy for a moment after the old process died.
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
                Err(why) => {
                    panic!(
                        "could not restart redis-server on port {}: {why}\n--- log ---\n{}",
                        self.port,
                        self.log()
                    )
                }
            }
        }
    }

    /// The server's log so far (every start since [`spawn`](Self::spawn)).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// Starts the process on `self.port` and waits for `PING`; on failure the
    /// process is gone again.
    fn start(&mut self) -> Result<(), String> {
        assert_ne!(self.port, DEFAULT_REDIS_PORT, "tests must never use port 6379");
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--daemonize", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.log_path())
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run redis-server: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(Some(status)) = self.child.as_mut().map(|c| c.try_wait().ok().flatten()) {
                self.child = None;
                return Err(format!("redis-server exited early ({status})"));
            }
            // Answering is not enough: when two tests pick the same free port at
            // once, the loser's server exits on bind while the winner answers.
            let pid = self.child.as_ref().map(Child::id);
            if pid.is_some() && server_pid(self.addr()) == pid {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(format!("no PONG within {READY_TIMEOUT:?}"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // A paused server would ignore nothing but SIGKILL anyway; resume it
        // first so that its log is complete.
        if let Some(child) = &self.child {
            let _ = Command::new("kill").args(["-CONT", &child.id().to_string()]).status();
        }
        self.kill();
        if std::thread::panicking() {
            eprintln!("--- redis-server log (port {}) ---\n{}", self.port, self.log());
        }
    }
}

impl std::fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisServer").field("port", &self.port).field("dir", &self.dir.path()).finish()
    }
}

fn ensure_installed() {
    match Command::new("redis-server").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status() {
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => panic!(
            "redis-server is not installed (not found on PATH); the Redis tests need it. \
             Install it with `sudo apt-get install redis-server` (Debian/Ubuntu) or \
             `brew install redis` (macOS), then run the tests again."
        ),
        Err(e) => panic!("cannot run redis-server --version: {e}"),
    }
}

/// An ephemeral loopback port that was free a moment ago. Another process may
/// take it before redis-server binds it; `spawn` retries with a new one then.
fn free_port() -> u16 {
    loop {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap_or_else(|e| panic!("cannot bind an ephemeral port on 127.0.0.1: {e}"));
        let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
        if port != 0 && port != DEFAULT_REDIS_PORT {
            return port;
        }
    }
}

/// Whether a Redis server at `addr` answers an inline `PING` with `+PONG`.
#[cfg(test)]
fn ping(addr: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut reply = [0u8; 7];
    let mut read = 0;
    while read < reply.len() {
        match stream.read(&mut reply[read..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => read += n,
        }
    }
    reply.starts_with(b"+PONG")
}

/// The `process_id` a Redis server at `addr` reports in `INFO server`.
fn server_pid(addr: SocketAddr) -> Option<u32> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    stream.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    stream.write_all(b"INFO server\r\n").ok()?;
    // A bulk reply, "$<len>\r\n<text>\r\n", read until the whole text is in.
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        reply.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&reply);
        let (header, body) = text.split_once("\r\n")?;
        let len: usize = header.strip_prefix('$')?.parse().ok()?;
        if body.len() >= len {
            return body
                .lines()
                .find_map(|l| l.strip_prefix("process_id:"))
                .and_then(|p| p.trim().parse().ok());
        }
    }
}

impl RedisServer {
    /// As [`spawn`](Self::spawn), with more `redis-server` arguments (kept
    /// across [`restart`](Self::restart)), e.g. `["--loadmodule", path]`.
    ///
    /// # Panics
    /// As [`spawn`](Self::spawn); also when the arguments keep the server from starting.
    pub fn spawn_with_args(args: &[&str]) -> RedisServer {
        Self::spawn_configured(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spawns_answers_restarts_on_the_same_port_and_dies_on_drop() {
        let mut server = RedisServer::spawn();
        let port = server.port();
        assert_ne!(port, DEFAULT_REDIS_PORT);
        assert_eq!(server.url(), format!("redis://127.0.0.1:{port}/"));
        assert!(ping(server.addr()));
        assert!(server.is_running());
        assert_eq!(server_pid(server.addr()), server.child.as_ref().map(Child::id));

        server.kill();
        assert!(!server.is_running());
        assert!(!ping(server.addr()));

        server.restart();
        assert_eq!(server.port(), port);
        assert!(ping(server.addr()));

        let addr = server.addr();
        drop(server);
        assert!(!ping(addr));
    }

    #[test]
    fn a_missing_redis_server_fails_and_says_how_to_install_it() {
        const CHILD: &str = "SLIDEGATE_TEST_REDIS_NO_PATH";
        if std::env::var_os(CHILD).is_some() {
            RedisServer::spawn();
            return;
        }
        // Run this very test again in a child process whose PATH has no redis-server.
        let exe = std::env::current_exe().expect("the test binary");
        let out = Command::new(exe)
            .args([
                "--exact",
                "tests::a_missing_redis_server_fails_and_says_how_to_install_it",
                "--nocapture",
            ])
            .env(CHILD, "1")
            .env("PATH", "/nonexistent")
            .output()
            .expect("run the test binary");
        let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "spawn without redis-server must fail:\n{text}");
        assert!(text.contains("redis-server is not installed"), "{text}");
        assert!(text.contains("apt-get install redis-server"), "{text}");
    }

    #[test]
    fn servers_get_distinct_ports() {
        let a = RedisServer::spawn();
        let b = RedisServer::spawn();
        assert_ne!(a.port(), b.port());
        assert!(ping(a.addr()) && ping(b.addr()));
    }
}
