//! One `redis-server` process that cannot outlive the test process.
//!
//! A test binary's statics are never dropped, so a server kept in a
//! `OnceLock` would be orphaned when the binary exits. Instead of relying on
//! `Drop`, every node runs under a small `sh` wrapper whose standard input is
//! a pipe held by the test process:
//!
//! ```text
//! exec 3<&0                              # keep the pipe: `&` jobs get /dev/null
//! redis-server ARGS 3<&- & server=$!
//! ( read line <&3; kill -9 $server ) &   # EOF on the pipe kills the server
//! watcher=$!
//! echo $server                           # the test learns the server's pid
//! wait $server                           # the wrapper lives as long as the server
//! kill $watcher                          # a dead server's pid is never signalled
//! ```
//!
//! The kernel closes the pipe's write end however the test process ends
//! (normal exit, panic, SIGKILL), so the watcher always sees EOF and kills the
//! server. [`RedisNode::kill`] closes the pipe itself and waits, so a kill in a
//! test is as prompt as a direct SIGKILL.

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a started node gets to answer before the start counts as failed.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Fresh ports tried before giving up on starting a node.
const START_ATTEMPTS: usize = 8;
/// How often conditions are polled while waiting.
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Ports tests must never take, nor use as a cluster bus: the developer's own
/// Redis (6379), its cluster bus (16379) and Sentinel (26379).
const RESERVED_PORTS: [u16; 3] = [6379, 16379, 26379];
/// The cluster bus listens on the data port plus this offset.
const CLUSTER_BUS_OFFSET: u16 = 10_000;

const WRAPPER: &str = r#"exec 3<&0
redis-server "$@" 3<&- >/dev/null 2>&1 &
server=$!
( read line <&3; kill -9 $server 2>/dev/null ) &
watcher=$!
exec 3<&-
echo $server
wait $server
status=$?
kill $watcher 2>/dev/null
exit $status"#;

/// A `redis-server` process (data node, cluster node or sentinel) on
/// `127.0.0.1`, killed on [`kill`](Self::kill), on drop, and when the test
/// process exits, however it exits.
pub struct RedisNode {
    port: u16,
    pid: u32,
    wrapper: Option<Child>,
    /// The write end of the wrapper's stdin; closing it kills the server.
    lifeline: Option<ChildStdin>,
    log: PathBuf,
    /// `redis-cli` options that connect to this node (TLS, credentials).
    connect: Vec<String>,
}

/// What a node is started with; the port is added per attempt.
#[derive(Clone, Debug, Default)]
pub(crate) struct NodeSpec {
    /// Arguments for `redis-server` before `--port` (a config file path, say).
    pub leading: Vec<String>,
    /// Arguments for `redis-server` after the common ones.
    pub args: Vec<String>,
    /// `redis-cli` options that reach the node once it runs.
    pub connect: Vec<String>,
    /// Whether the port is the TLS port (`--tls-port P --port 0`).
    pub tls_port: bool,
    /// Whether `port + 10000` must be free too (cluster bus).
    pub needs_bus: bool,
}

impl RedisNode {
    /// Starts a node from `spec` in `dir` on a fresh free port, retrying with
    /// other ports when one is taken meanwhile.
    pub(crate) fn start(spec: &NodeSpec, dir: &Path) -> RedisNode {
        crate::ensure_installed();
        let mut failures = Vec::new();
        for _ in 0..START_ATTEMPTS {
            let port = free_port(spec.needs_bus);
            match RedisNode::start_on(spec, dir, port) {
                Ok(node) => return node,
                Err(why) => failures.push(format!("port {port}: {why}")),
            }
        }
        panic!("could not start redis-server after {START_ATTEMPTS} attempts:\n{}", failures.join("\n"));
    }

    pub(crate) fn start_on(spec: &NodeSpec, dir: &Path, port: u16) -> Result<RedisNode, String> {
        let log = dir.join(format!("redis-{port}.log"));
        let port_args: Vec<String> = if spec.tls_port {
            vec!["--tls-port".into(), port.to_string(), "--port".into(), "0".into()]
        } else {
            vec!["--port".into(), port.to_string()]
        };
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(WRAPPER)
            .arg("slidegate-redis-node")
            .args(&spec.leading)
            .args(&port_args)
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(&log)
            .args(&spec.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run sh to start redis-server: {e}"))?;
        let lifeline = child.stdin.take();
        let mut pid_line = String::new();
        if let Some(stdout) = child.stdout.take() {
            let _ = BufReader::new(stdout).read_line(&mut pid_line);
        }
        let pid: u32 =
            pid_line.trim().parse().map_err(|_| format!("the wrapper printed no pid: {pid_line:?}"))?;
        let mut node =
            RedisNode { port, pid, wrapper: Some(child), lifeline, log, connect: spec.connect.clone() };
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if !node.is_running() {
                return Err(format!("redis-server exited early\n--- log ---\n{}", node.log()));
            }
            // Answering is not enough: when two tests pick the same free port at
            // once, the loser's server exits on bind while the winner answers.
            if node.reported_pid() == Some(pid) {
                return Ok(node);
            }
            if Instant::now() >= deadline {
                let log = node.log();
                node.kill();
                return Err(format!("no answer within {READY_TIMEOUT:?}\n--- log ---\n{log}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The port the node listens on (its TLS port for a TLS node).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether the server process is still running.
    pub fn is_running(&mut self) -> bool {
        match &mut self.wrapper {
            Some(wrapper) => matches!(wrapper.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Kills the server (SIGKILL) and waits until it is gone. Idempotent.
    pub fn kill(&mut self) {
        // EOF on the lifeline makes the watcher SIGKILL the server; the
        // wrapper exits once the server is reaped.
        drop(self.lifeline.take());
        if let Some(mut wrapper) = self.wrapper.take() {
            let _ = wrapper.wait();
        }
    }

    /// The node's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Runs `redis-cli` against this node (with its TLS and credential
    /// options) and returns its standard output (then standard error, if
    /// any), trailing newline removed.
    /// Redis error replies come back as text (`"ERR ..."`), not as a panic;
    /// options such as `-c` may lead `args`.
    ///
    /// # Panics
    /// If `redis-cli` cannot be run.
    pub fn cli(&self, args: &[&str]) -> String {
        redis_cli(self.port, &self.connect, args)
    }

    /// `process_id` from `INFO server`, if the node answers.
    fn reported_pid(&self) -> Option<u32> {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(&self.connect)
            .args(["INFO", "server"])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()?;
        info_field(&String::from_utf8_lossy(&out.stdout), "process_id")?.parse().ok()
    }
}

impl Drop for RedisNode {
    fn drop(&mut self) {
        self.kill();
    }
}

impl std::fmt::Debug for RedisNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisNode").field("port", &self.port).field("pid", &self.pid).finish()
    }
}

/// Runs `redis-cli -h 127.0.0.1 -p <port> <connect...> <args...>` and returns
/// its standard output, then its standard error if any, without the trailing
/// newline.
///
/// # Panics
/// If `redis-cli` cannot be run.
pub(crate) fn redis_cli(port: u16, connect: &[String], args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(connect)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run redis-cli (is it installed with redis-server?): {e}"));
    // Failed connections and AUTH are reported on stderr, with exit code 0.
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !stderr.trim().is_empty() {
        text = format!("{}\n{stderr}", text.trim_end_matches(['\r', '\n']));
    }
    text.trim_end_matches(['\r', '\n']).to_owned()
}

/// The value of `field:` in an `INFO`-style reply.
pub(crate) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':')).map(str::trim)
}

/// Polls `check` until it yields a value or `timeout` passes; then panics
/// with `what`, the last reason `check` gave, and `logs()`.
pub(crate) fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Result<T, String>,
    logs: impl FnOnce() -> String,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match check() {
            Ok(value) => return value,
            Err(why) if Instant::now() >= deadline => {
                panic!("timed out after {timeout:?} waiting for {what}: {why}\n{}", logs())
            }
            Err(_) => std::thread::sleep(POLL_INTERVAL),
        }
    }
}

/// Where cluster nodes listen, their bus ports (+10000) included: below the
/// kernel's ephemeral range (32768–60999 by default). A node's port in that
/// range, once the node is killed, can be handed to an outgoing connection
/// as its local port — to a client reconnecting to that very port, which
/// then connects to itself (a TCP self-connect) and reads its own commands
/// back as replies, and the node cannot bind its port again.
const CLUSTER_PORTS: std::ops::Range<u16> = 20_000..22_768;

/// A loopback port that was free a moment ago, never a reserved one. With
/// `needs_bus`, a port of [`CLUSTER_PORTS`] whose `port + 10000` was free
/// too. Another process may take it before redis-server binds it; node
/// starts retry with a new one then.
fn free_port(needs_bus: bool) -> u16 {
    use std::hash::{BuildHasher, Hasher};
    loop {
        if needs_bus {
            let random = std::collections::hash_map::RandomState::new().build_hasher().finish();
            let span = u64::from(CLUSTER_PORTS.end - CLUSTER_PORTS.start);
            let port = CLUSTER_PORTS.start + u16::try_from(random % span).unwrap_or(0);
            let bus = port + CLUSTER_BUS_OFFSET;
            if RESERVED_PORTS.contains(&port) || RESERVED_PORTS.contains(&bus) {
                continue;
            }
            let free = |p: u16| TcpListener::bind((Ipv4Addr::LOCALHOST, p)).is_ok();
            if free(port) && free(bus) {
                return port;
            }
            continue;
        }
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap_or_else(|e| panic!("cannot bind an ephemeral port on 127.0.0.1: {e}"));
        let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
        if port != 0 && !RESERVED_PORTS.contains(&port) {
            return port;
        }
    }
}

/// A `sh` process that removes `dir` when the test process exits (EOF on its
/// stdin), for directories of shared instances whose `TempDir` never drops.
/// Dropping the returned handle's stdin removes the directory early.
pub(crate) fn remove_at_exit(dir: &Path) -> Option<DirReaper> {
    let mut child = Command::new("sh")
        .args(["-c", r#"read line; rm -rf "$1""#, "slidegate-redis-reaper"])
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let lifeline = child.stdin.take();
    Some(DirReaper { child, lifeline })
}

/// See [`remove_at_exit`].
pub(crate) struct DirReaper {
    child: Child,
    lifeline: Option<ChildStdin>,
}

impl Drop for DirReaper {
    fn drop(&mut self) {
        drop(self.lifeline.take());
        let _ = self.child.wait();
    }
}

/// Prints the logs of `nodes` to stderr, for a test that is failing.
pub(crate) fn print_logs<'a>(what: &str, nodes: impl IntoIterator<Item = &'a RedisNode>) {
    for node in nodes {
        eprintln!("--- {what} log (port {}) ---\n{}", node.port(), node.log());
    }
}

/// The logs of `nodes`, one section each, for panic messages.
pub(crate) fn logs<'a>(nodes: impl IntoIterator<Item = &'a RedisNode>) -> String {
    nodes.into_iter().map(|n| format!("--- log of port {} ---\n{}\n", n.port(), n.log())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alive(pid: u32) -> bool {
        Path::new(&format!("/proc/{pid}")).exists()
            && !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z ")
    }

    fn wait_until_gone(pid: u32) {
        wait_for(
            "redis-server to die",
            Duration::from_secs(10),
            || if alive(pid) { Err(format!("pid {pid} alive")) } else { Ok(()) },
            String::new,
        );
    }

    #[test]
    fn kill_and_drop_end_the_server() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let mut node = RedisNode::start(&NodeSpec::default(), dir.path());
        assert!(alive(node.pid));
        assert_eq!(node.cli(&["PING"]), "PONG");
        let pid = node.pid;
        node.kill();
        assert!(!node.is_running());
        wait_until_gone(pid);
        assert!(node.cli(&["PING"]).contains("Could not connect"));

        let node = RedisNode::start(&NodeSpec::default(), dir.path());
        let pid = node.pid;
        drop(node);
        wait_until_gone(pid);
    }

    #[test]
    fn a_server_never_dropped_dies_with_the_test_process() {
        const CHILD: &str = "SLIDEGATE_TEST_REDIS_LEAK_A_NODE";
        if std::env::var_os(CHILD).is_some() {
            let dir = tempfile::tempdir().expect("a temp dir");
            let node = RedisNode::start(&NodeSpec::default(), dir.path());
            println!("pid={}", node.pid);
            // Like a static: never dropped, so only the lifeline can end it.
            std::mem::forget(node);
            std::mem::forget(dir);
            return;
        }
        let exe = std::env::current_exe().expect("the test binary");
        let out = Command::new(exe)
            .args([
                "--exact",
                "node::tests::a_server_never_dropped_dies_with_the_test_process",
                "--nocapture",
            ])
            .env(CHILD, "1")
            .output()
            .expect("run the test binary");
        let text = String::from_utf8_lossy(&out.stdout);
        let pid: u32 = text
            .lines()
            .find_map(|l| l.strip_prefix("pid="))
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("the child printed no pid:\n{text}"));
        wait_until_gone(pid);
    }
}
