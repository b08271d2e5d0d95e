//! [`RedisSentinel`]: a throwaway Redis Sentinel deployment.

use std::sync::OnceLock;
use std::time::Duration;

use tempfile::TempDir;

use crate::node::{self, wait_for, DirReaper, NodeSpec, RedisNode};

/// The name the sentinels monitor the master under.
const MASTER_NAME: &str = "slidegate";
const SENTINELS: usize = 3;
const QUORUM: usize = 2;
/// Small, so a killed master is failed over within a few seconds.
const DOWN_AFTER_MS: u32 = 1000;
const FAILOVER_TIMEOUT_MS: u32 = 5000;
/// How long the deployment gets to form or to fail over.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A master, a replica and three sentinels, killed on drop and when the test
/// process exits.
///
/// ```no_run
/// use slidegate_test_redis::RedisSentinel;
/// let mut deployment = RedisSentinel::start();
/// let sentinels = deployment.sentinel_urls(); // ["redis://127.0.0.1:<port>", ...]
/// let old = deployment.kill_master();
/// let new = deployment.wait_for_failover();
/// assert_ne!(old, new);
/// # drop(sentinels);
/// ```
pub struct RedisSentinel {
    /// The master and the replica, in start order; roles change on failover.
    data: Vec<RedisNode>,
    sentinels: Vec<RedisNode>,
    /// The port of the master most recently killed by [`kill_master`](Self::kill_master).
    killed: Option<u16>,
    // Dropped after the nodes: removes the directory even for the shared,
    // never-dropped deployment.
    _reaper: Option<DirReaper>,
    dir: TempDir,
}

impl RedisSentinel {
    /// The deployment shared by every test in this test binary, started on
    /// first use; for tests that do not kill anything. Its processes die when
    /// the test process exits.
    pub fn shared() -> &'static RedisSentinel {
        static SHARED: OnceLock<RedisSentinel> = OnceLock::new();
        SHARED.get_or_init(RedisSentinel::start)
    }

    /// Starts the master, the replica (waiting until its link is up) and the
    /// sentinels, and waits until every sentinel sees the master, the replica
    /// and the two other sentinels.
    ///
    /// # Panics
    /// If `redis-server` is not installed or the deployment does not form
    /// within 30 s; the message holds the logs.
    pub fn start() -> RedisSentinel {
        let dir = tempfile::Builder::new()
            .prefix("slidegate-sentinel-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temp dir for the sentinel deployment: {e}"));
        let reaper = node::remove_at_exit(dir.path());
        // Replicas sync at once instead of waiting 5 s for more replicas.
        let data_spec =
            NodeSpec { args: vec!["--repl-diskless-sync-delay".into(), "0".into()], ..NodeSpec::default() };
        let master = RedisNode::start(&data_spec, dir.path());
        let master_port = master.port();
        let mut replica_spec = data_spec.clone();
        replica_spec.args.extend(["--replicaof".into(), "127.0.0.1".into(), master_port.to_string()]);
        let replica = RedisNode::start(&replica_spec, dir.path());
        let mut deployment = RedisSentinel {
            data: vec![master, replica],
            sentinels: Vec::new(),
            killed: None,
            _reaper: reaper,
            dir,
        };
        wait_for(
            "the replica to sync with the master",
            SETTLE_TIMEOUT,
            || {
                let info = deployment.data[1].cli(&["INFO", "replication"]);
                match node::info_field(&info, "master_link_status") {
                    Some("up") => Ok(()),
                    _ => Err(info),
                }
            },
            || deployment.logs(),
        );
        for n in 0..SENTINELS {
            let config = deployment.dir.path().join(format!("sentinel-{n}.conf"));
            let text = format!(
                "sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} {QUORUM}\n\
                 sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n\
                 sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n"
            );
            std::fs::write(&config, text)
                .unwrap_or_else(|e| panic!("cannot write sentinel config {}: {e}", config.display()));
            let spec = NodeSpec {
                leading: vec![config.display().to_string()],
                args: vec!["--sentinel".into()],
                ..NodeSpec::default()
            };
            deployment.sentinels.push(RedisNode::start(&spec, deployment.dir.path()));
        }
        wait_for(
            "every sentinel to see the replica and the other sentinels",
            SETTLE_TIMEOUT,
            || deployment.formed(),
            || deployment.logs(),
        );
        deployment
    }

    /// `redis://127.0.0.1:<port>` of each sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinel_ports().into_iter().map(|p| format!("redis://127.0.0.1:{p}")).collect()
    }

    /// The ports of the sentinels.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(RedisNode::port).collect()
    }

    /// The name the sentinels know the master by.
    pub fn master_name(&self) -> &str {
        MASTER_NAME
    }

    /// The master's port, as the first sentinel reports it.
    pub fn master_port(&self) -> u16 {
        self.master_port_seen_by(&self.sentinels[0])
            .unwrap_or_else(|| panic!("sentinel does not know master {MASTER_NAME}\n{}", self.logs()))
    }

    /// The ports of the data nodes (master and replica), killed ones included.
    pub fn data_ports(&self) -> Vec<u16> {
        self.data.iter().map(RedisNode::port).collect()
    }

    /// Runs `redis-cli` against `port` (a data node or a sentinel) and
    /// returns its output, trailing newline removed.
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        node::redis_cli(port, &[], args)
    }

    /// Kills (SIGKILL) the current master and returns its port.
    pub fn kill_master(&mut self) -> u16 {
        let port = self.master_port();
        let node = self.data.iter_mut().find(|n| n.port() == port);
        node.unwrap_or_else(|| panic!("the master's port {port} is none of the data nodes")).kill();
        self.killed = Some(port);
        port
    }

    /// Waits until every sentinel names a new master, and that node reports
    /// `role:master`; returns its port.
    ///
    /// # Panics
    /// Without a preceding [`kill_master`](Self::kill_master), or if the
    /// failover does not complete within 30 s (the message holds the logs).
    pub fn wait_for_failover(&self) -> u16 {
        let old = self.killed.unwrap_or_else(|| panic!("wait_for_failover without kill_master"));
        let check = || {
            let seen: Vec<Option<u16>> = self.sentinels.iter().map(|s| self.master_port_seen_by(s)).collect();
            let new = match seen[0] {
                Some(port) if port != old && seen.iter().all(|s| *s == Some(port)) => port,
                _ => return Err(format!("sentinels name masters {seen:?} (old {old})")),
            };
            let info = self.cli(new, &["INFO", "replication"]);
            match node::info_field(&info, "role") {
                Some("master") => Ok(new),
                _ => Err(format!("{new} is not master yet: {info}")),
            }
        };
        wait_for("the sentinels to fail over", SETTLE_TIMEOUT, check, || self.logs())
    }

    /// Every process's log, one section each.
    pub fn logs(&self) -> String {
        node::logs(self.data.iter().chain(&self.sentinels))
    }

    fn master_port_seen_by(&self, sentinel: &RedisNode) -> Option<u16> {
        let reply = sentinel.cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME]);
        reply.lines().nth(1)?.trim().parse().ok()
    }

    fn formed(&self) -> Result<(), String> {
        for sentinel in &self.sentinels {
            let reply = sentinel.cli(&["SENTINEL", "MASTER", MASTER_NAME]);
            let lines: Vec<&str> = reply.lines().collect();
            let field =
                |name: &str| lines.iter().position(|l| *l == name).and_then(|i| lines.get(i + 1)).copied();
            let (replicas, others) = (field("num-slaves"), field("num-other-sentinels"));
            if replicas != Some("1")
                || others != Some(&(SENTINELS - 1).to_string())
                || field("flags") != Some("master")
            {
                return Err(format!("sentinel {}: {reply}", sentinel.port()));
            }
        }
        Ok(())
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        if std::thread::panicking() {
            node::print_logs("sentinel deployment", self.data.iter().chain(&self.sentinels));
        }
    }
}

impl std::fmt::Debug for RedisSentinel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSentinel")
            .field("data", &self.data_ports())
            .field("sentinels", &self.sentinel_ports())
            .field("dir", &self.dir.path())
            .finish()
    }
}
