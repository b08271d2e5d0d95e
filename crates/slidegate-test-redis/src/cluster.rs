//! [`RedisCluster`]: a throwaway local Redis Cluster.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

use tempfile::TempDir;

use crate::node::{self, redis_cli, wait_for, DirReaper, NodeSpec, RedisNode};

/// The number of hash slots in a Redis Cluster.
pub const SLOT_COUNT: u16 = 16384;
/// Masters in a started cluster; each has one replica.
const MASTERS: usize = 3;
/// Small, so a killed master is failed over within a few seconds, yet large
/// enough that a node slowed by busy cores is not failed by mistake.
const NODE_TIMEOUT_MS: u32 = 1500;
/// How long a cluster gets to form, fail over or settle after a change.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A local Redis Cluster of three masters with one replica each, killed on
/// drop and when the test process exits.
///
/// [`RedisCluster::shared`] starts one healthy cluster per test binary for
/// tests that only read and write; [`RedisCluster::start`] gives a test its own
/// cluster to break (kill a master, move slots). Methods that change the
/// topology take `&mut self`, so the shared cluster cannot be broken by
/// accident.
///
/// ```no_run
/// use slidegate_test_redis::RedisCluster;
/// let cluster = RedisCluster::shared();
/// let seeds = cluster.urls(); // ["redis://127.0.0.1:<port>", ...], the masters
/// assert_eq!(cluster.cli(cluster.masters()[0], &["-c", "SET", "{user:1}", "x"]), "OK");
/// # drop(seeds);
/// ```
pub struct RedisCluster {
    nodes: Vec<ClusterNode>,
    /// The slot the most recently killed master owned first, for
    /// [`wait_for_failover`](Self::wait_for_failover).
    killed_slot: Option<u16>,
    /// The extra `redis-server` arguments every node was started with, for
    /// nodes [`add_master`](Self::add_master) starts later.
    node_args: Vec<String>,
    // Dropped after the nodes (field order): removes the directory even when
    // the cluster is a never-dropped static.
    _reaper: Option<DirReaper>,
    dir: TempDir,
}

struct ClusterNode {
    id: String,
    process: RedisNode,
    killed: bool,
    /// What it was started with (its own `nodes.conf`), to start it again.
    spec: NodeSpec,
}

/// One line of `CLUSTER NODES`, as far as the harness needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct NodeView {
    id: String,
    port: u16,
    master: bool,
    failed: bool,
    /// The master's id, for a replica.
    replica_of: Option<String>,
    /// Owned slot ranges, inclusive; migration markers (`[..]`) left out.
    slots: Vec<(u16, u16)>,
}

impl RedisCluster {
    /// The cluster shared by every test in this test binary, started on first
    /// use. Its nodes die when the test process exits.
    ///
    /// # Panics
    /// If the cluster cannot be started (see [`start`](Self::start)).
    pub fn shared() -> &'static RedisCluster {
        static SHARED: OnceLock<RedisCluster> = OnceLock::new();
        SHARED.get_or_init(RedisCluster::start)
    }

    /// A cluster shared by every test in this test binary whose nodes all
    /// load the native module ([`crate::slidegate_module`]), started on first use.
    ///
    /// # Panics
    /// As [`shared`](Self::shared), or if the module cannot be built.
    pub fn shared_with_module() -> &'static RedisCluster {
        static SHARED: OnceLock<RedisCluster> = OnceLock::new();
        SHARED.get_or_init(|| {
            let args = crate::module_args();
            RedisCluster::start_with_args(&args.iter().map(String::as_str).collect::<Vec<_>>())
        })
    }

    /// Starts six nodes, joins them with `redis-cli --cluster create
    /// --cluster-replicas 1`, and waits until every node reports
    /// `cluster_state:ok`, agrees on the slot map, and every replica's link
    /// to its master is up.
    ///
    /// # Panics
    /// If `redis-server` is not installed or the cluster does not form within
    /// 30 s; the message holds the node logs.
    pub fn start() -> RedisCluster {
        Self::start_with_args(&[])
    }

    /// [`start`](Self::start), every node also given `args` (say
    /// `--loadmodule <path>`).
    ///
    /// # Panics
    /// As [`start`](Self::start).
    pub fn start_with_args(args: &[&str]) -> RedisCluster {
        let cluster = Self::create(args);
        cluster.wait_until_settled("the new cluster to form");
        cluster
    }

    /// Starts six nodes and joins them as [`start`](Self::start) does, but
    /// returns as soon as the first node reports `cluster_state:ok`, without
    /// waiting for the others to agree: the state a cluster is in just after
    /// `redis-cli --cluster create`, where a node may still see a new
    /// replica as a master or not yet know every slot's owner.
    ///
    /// # Panics
    /// As [`start`](Self::start).
    pub fn start_fresh() -> RedisCluster {
        let cluster = Self::create(&[]);
        let first = cluster.nodes[0].process.port();
        wait_for(
            "the first node of the new cluster to report cluster_state:ok",
            SETTLE_TIMEOUT,
            || {
                let info = cluster.cli(first, &["CLUSTER", "INFO"]);
                match node::info_field(&info, "cluster_state") {
                    Some("ok") => Ok(()),
                    _ => Err(format!("port {first}: {info}")),
                }
            },
            || cluster.logs(),
        );
        cluster
    }

    /// Six nodes joined by `redis-cli --cluster create --cluster-replicas 1`.
    fn create(args: &[&str]) -> RedisCluster {
        let dir = tempfile::Builder::new()
            .prefix("slidegate-cluster-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temp dir for the cluster: {e}"));
        let reaper = node::remove_at_exit(dir.path());
        // In parallel: each start mostly waits for its node to answer.
        let nodes: Vec<ClusterNode> = std::thread::scope(|scope| {
            let starts: Vec<_> = (0..MASTERS * 2)
                .map(|_| {
                    scope.spawn(|| {
                        let spec = node_spec(&dir, args);
                        let process = RedisNode::start(&spec, dir.path());
                        let id = redis_cli(process.port(), &[], &["CLUSTER", "MYID"]);
                        ClusterNode { id, process, killed: false, spec }
                    })
                })
                .collect();
            // A start that panicked has its message printed already; repeat the gist.
            starts
                .into_iter()
                .map(|s| s.join().unwrap_or_else(|_| panic!("a cluster node did not start")))
                .collect()
        });
        let node_args = args.iter().map(|a| (*a).to_owned()).collect();
        let cluster = RedisCluster { nodes, killed_slot: None, node_args, _reaper: reaper, dir };
        let addrs: Vec<String> =
            cluster.nodes.iter().map(|n| format!("127.0.0.1:{}", n.process.port())).collect();
        let out = std::process::Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli --cluster create: {e}"));
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        if !out.status.success() || !text.contains("All 16384 slots covered") {
            panic!("redis-cli --cluster create failed:\n{text}\n{}", cluster.logs());
        }
        cluster
    }

    /// `redis://127.0.0.1:<port>` of each master, in slot order: seeds for a
    /// cluster client.
    pub fn urls(&self) -> Vec<String> {
        self.masters().into_iter().map(|p| format!("redis://127.0.0.1:{p}")).collect()
    }

    /// The ports of the masters that own slots, ordered by their lowest slot
    /// (the first master owns slot 0), as the live cluster reports them.
    pub fn masters(&self) -> Vec<u16> {
        let view = self.view();
        let mut masters: Vec<&NodeView> = view.iter().filter(|n| n.master && !n.slots.is_empty()).collect();
        masters.sort_by_key(|n| n.slots.iter().map(|r| r.0).min());
        masters.into_iter().map(|n| n.port).collect()
    }

    /// The ports of the running replicas, as the live cluster reports them.
    pub fn replicas(&self) -> Vec<u16> {
        let view = self.view();
        let mut ports: Vec<u16> = view
            .iter()
            .filter(|n| !n.master && !n.failed && self.alive().any(|a| a.id == n.id))
            .map(|n| n.port)
            .collect();
        ports.sort_unstable();
        ports
    }

    /// The ports of all running nodes.
    pub fn node_ports(&self) -> Vec<u16> {
        self.alive().map(|n| n.process.port()).collect()
    }

    /// The port of the master that owns `slot`.
    pub fn master_of_slot(&self, slot: u16) -> u16 {
        let view = self.view();
        view.iter()
            .find(|n| n.master && n.slots.iter().any(|&(lo, hi)| (lo..=hi).contains(&slot)))
            .map(|n| n.port)
            .unwrap_or_else(|| panic!("no master owns slot {slot}: {view:?}"))
    }

    /// The slot ranges (inclusive) the node on `port` owns, lowest first, as
    /// the live cluster reports them; empty for a replica or an empty master.
    pub fn slot_ranges(&self, port: u16) -> Vec<(u16, u16)> {
        let mut ranges =
            self.view().into_iter().find(|n| n.port == port).map(|n| n.slots).unwrap_or_default();
        ranges.sort_unstable();
        ranges
    }

    /// The node id of the node on `port`.
    pub fn node_id(&self, port: u16) -> &str {
        &self.node(port).id
    }

    /// Runs `redis-cli` against the node on `port` and returns its output
    /// (trailing newline removed). Pass `-c` first to follow `MOVED`/`ASK`.
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        redis_cli(port, &[], args)
    }

    /// Kills (SIGKILL) the `i`-th master of [`masters`](Self::masters) and
    /// returns its port. Follow with [`wait_for_failover`](Self::wait_for_failover).
    ///
    /// # Panics
    /// If there is no `i`-th master.
    pub fn kill_master(&mut self, i: usize) -> u16 {
        let masters = self.masters();
        let port = *masters.get(i).unwrap_or_else(|| panic!("no master #{i}; masters: {masters:?}"));
        self.killed_slot = Some(self.first_slot_of(port));
        self.kill_node(port);
        port
    }

    /// Kills (SIGKILL) the node on `port`, master or replica.
    pub fn kill_node(&mut self, port: u16) {
        let node = self.nodes.iter_mut().find(|n| n.process.port() == port);
        let node = node.unwrap_or_else(|| panic!("no cluster node on port {port}"));
        node.process.kill();
        node.killed = true;
    }

    /// Starts the killed node on `port` again, on the same port with its
    /// own `nodes.conf` and no data (nothing is saved): it rejoins as a
    /// replica of the master that took its slots, as a crashed master
    /// restarted by its supervisor does. Waits until the cluster agrees.
    ///
    /// # Panics
    /// If no node on `port` was killed, or it does not start and rejoin
    /// within 30 s.
    pub fn restart_node(&mut self, port: u16) {
        let dir = self.dir.path().to_owned();
        let node = self.nodes.iter_mut().find(|n| n.process.port() == port && n.killed);
        let node = node.unwrap_or_else(|| panic!("no killed cluster node on port {port}"));
        node.process = RedisNode::start_on(&node.spec, &dir, port)
            .unwrap_or_else(|why| panic!("cannot start the node on port {port} again: {why}"));
        node.killed = false;
        self.wait_until_settled("the restarted node to rejoin");
    }

    /// Waits until the slots of the killed master(s) belong to promoted
    /// replicas, every running node reports `cluster_state:ok` and agrees on
    /// the slot map; returns the port of the master that now owns the slots of
    /// the master most recently killed with [`kill_master`](Self::kill_master).
    ///
    /// # Panics
    /// If that does not happen within 30 s (the message holds the logs).
    pub fn wait_for_failover(&self) -> u16 {
        self.wait_until_settled("a replica to take over the killed master's slots");
        let slot = self.killed_slot.unwrap_or_else(|| panic!("wait_for_failover without kill_master"));
        self.master_of_slot(slot)
    }

    /// Moves `count` slots from the master on `from` to the master on `to`
    /// with `redis-cli --cluster reshard` (keys included), then waits until
    /// every node agrees on the new slot map.
    pub fn move_slots(&mut self, from: u16, to: u16, count: u16) {
        let (from_id, to_id) = (self.node(from).id.clone(), self.node(to).id.clone());
        let (from_addr, count_arg) = (format!("127.0.0.1:{from}"), count.to_string());
        self.run_cluster_tool(
            &[
                "reshard",
                &from_addr,
                "--cluster-from",
                &from_id,
                "--cluster-to",
                &to_id,
                "--cluster-slots",
                &count_arg,
                "--cluster-yes",
            ],
            &format!("reshard {from} -> {to} ({count} slots)"),
        );
        self.wait_until_settled("the cluster to agree on the resharded slots");
    }

    /// Starts one more node, joins it to the cluster as a master owning no
    /// slots (`redis-cli --cluster add-node`), waits until every node knows
    /// it, and returns its port. [`rebalance`](Self::rebalance) gives it slots.
    ///
    /// # Panics
    /// If the node does not start or join within 30 s.
    pub fn add_master(&mut self) -> u16 {
        let args: Vec<&str> = self.node_args.iter().map(String::as_str).collect();
        let spec = node_spec(&self.dir, &args);
        let process = RedisNode::start(&spec, self.dir.path());
        let port = process.port();
        let id = redis_cli(port, &[], &["CLUSTER", "MYID"]);
        let seed = self.masters()[0];
        self.run_cluster_tool(
            &["add-node", &format!("127.0.0.1:{port}"), &format!("127.0.0.1:{seed}")],
            &format!("add-node {port}"),
        );
        self.nodes.push(ClusterNode { id, process, killed: false, spec });
        self.wait_until_settled("every node to know the added master");
        port
    }

    /// Spreads the slots evenly over every master, empty ones included
    /// (`redis-cli --cluster rebalance --cluster-use-empty-masters`), keys
    /// moved with them, then waits until every node agrees on the slot map.
    /// `redis-cli` takes each giving master's lowest slots first.
    pub fn rebalance(&mut self) {
        let seed = format!("127.0.0.1:{}", self.masters()[0]);
        self.run_cluster_tool(&["rebalance", &seed, "--cluster-use-empty-masters"], "rebalance");
        self.wait_until_settled("the cluster to agree on the rebalanced slots");
    }

    /// Runs `redis-cli --cluster <args>`, panicking with its output and the
    /// logs if it fails.
    fn run_cluster_tool(&self, args: &[&str], what: &str) {
        let out = std::process::Command::new("redis-cli")
            .arg("--cluster")
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli --cluster {what}: {e}"));
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        if !out.status.success() || text.contains("[ERR]") {
            panic!("redis-cli --cluster {what} failed:\n{text}\n{}", self.logs());
        }
    }

    /// Moves one slot, with its keys, from the master on `from` to the master
    /// on `to`: [`begin_slot_migration`](Self::begin_slot_migration), then
    /// [`finish_slot_migration`](Self::finish_slot_migration), then waits until
    /// every node agrees.
    pub fn migrate_slot(&mut self, slot: u16, from: u16, to: u16) {
        self.begin_slot_migration(slot, from, to);
        self.finish_slot_migration(slot, from, to);
        self.wait_until_settled("the cluster to agree on the migrated slot");
    }

    /// Marks `slot` `IMPORTING` on `to` and `MIGRATING` on `from` and moves no
    /// keys: clients now get `ASK` redirections for keys missing on `from`.
    pub fn begin_slot_migration(&mut self, slot: u16, from: u16, to: u16) {
        let (from_id, to_id) = (self.node(from).id.clone(), self.node(to).id.clone());
        let slot = slot.to_string();
        self.expect_ok(to, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id]);
        self.expect_ok(from, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id]);
    }

    /// Moves every key of `slot` from `from` to `to` with `MIGRATE` and
    /// assigns the slot to `to` on every master (`CLUSTER SETSLOT .. NODE`).
    pub fn finish_slot_migration(&mut self, slot: u16, from: u16, to: u16) {
        let to_id = self.node(to).id.clone();
        let slot_arg = slot.to_string();
        loop {
            let keys = self.cli(from, &["CLUSTER", "GETKEYSINSLOT", &slot_arg, "100"]);
            let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            let to_port = to.to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &to_port, "", "0", "5000", "KEYS"];
            args.extend(&keys);
            self.expect_ok(from, &args);
        }
        // The target first, so the source never redirects to a node that
        // would bounce the client back (the order Redis documents).
        self.expect_ok(to, &["CLUSTER", "SETSLOT", &slot_arg, "NODE", &to_id]);
        self.expect_ok(from, &["CLUSTER", "SETSLOT", &slot_arg, "NODE", &to_id]);
        for master in self.masters() {
            if master != to && master != from {
                self.expect_ok(master, &["CLUSTER", "SETSLOT", &slot_arg, "NODE", &to_id]);
            }
        }
    }

    /// Writes each of `keys` (value `1`) on the node on `port` after
    /// `ASKING`, as a client redirected there by `ASK` would: into a slot
    /// the node is importing ([`begin_slot_migration`](Self::begin_slot_migration)),
    /// which it holds keys of but does not own.
    ///
    /// # Panics
    /// If a `SET` is refused.
    pub fn set_asking(&self, port: u16, keys: &[String]) {
        use std::io::Write;
        let mut child = std::process::Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run redis-cli: {e}"));
        // One connection: ASKING holds for the command right after it only.
        let commands: String = keys.iter().map(|key| format!("ASKING\nSET {key} 1\n")).collect();
        let mut stdin = child.stdin.take().unwrap_or_else(|| panic!("redis-cli has no stdin"));
        stdin.write_all(commands.as_bytes()).unwrap_or_else(|e| panic!("cannot write to redis-cli: {e}"));
        drop(stdin);
        let out = child.wait_with_output().unwrap_or_else(|e| panic!("redis-cli failed: {e}"));
        let replies = String::from_utf8_lossy(&out.stdout);
        let expected = "OK\n".repeat(2 * keys.len());
        if replies != expected {
            panic!("ASKING + SET on port {port} answered {replies:?}\n{}", self.logs());
        }
    }

    /// Every node's log, one section each.
    pub fn logs(&self) -> String {
        node::logs(self.nodes.iter().map(|n| &n.process))
    }

    /// The directory holding node configs and logs.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    fn expect_ok(&self, port: u16, args: &[&str]) {
        let reply = self.cli(port, args);
        if reply != "OK" {
            panic!("`{}` on port {port} answered {reply:?}\n{}", args.join(" "), self.logs());
        }
    }

    fn node(&self, port: u16) -> &ClusterNode {
        let node = self.nodes.iter().find(|n| n.process.port() == port);
        node.unwrap_or_else(|| panic!("no cluster node on port {port}"))
    }

    fn alive(&self) -> impl Iterator<Item = &ClusterNode> {
        self.nodes.iter().filter(|n| !n.killed)
    }

    fn first_slot_of(&self, port: u16) -> u16 {
        let view = self.view();
        let node = view.iter().find(|n| n.port == port);
        node.and_then(|n| n.slots.iter().map(|r| r.0).min())
            .unwrap_or_else(|| panic!("node on port {port} owns no slots: {view:?}"))
    }

    /// `CLUSTER NODES` as the first running node sees it.
    fn view(&self) -> Vec<NodeView> {
        let node = self.alive().next().unwrap_or_else(|| panic!("every cluster node was killed"));
        parse_nodes(&self.cli(node.process.port(), &["CLUSTER", "NODES"]))
    }

    fn wait_until_settled(&self, what: &str) {
        wait_for(what, SETTLE_TIMEOUT, || self.settled(), || self.logs());
    }

    /// `Ok` when every running node reports `cluster_state:ok`; all see the
    /// same slot map, covering every slot with running masters; all see every
    /// running node healthy and in the role that node gives itself (gossip
    /// spreads a new replica's role a little later than its link comes up);
    /// and every running replica's link to its master is up. Else why not.
    fn settled(&self) -> Result<(), String> {
        let mut views = Vec::new();
        for node in self.alive() {
            let port = node.process.port();
            let info = self.cli(port, &["CLUSTER", "INFO"]);
            if node::info_field(&info, "cluster_state") != Some("ok") {
                return Err(format!("port {port}: {info}"));
            }
            views.push((node, parse_nodes(&self.cli(port, &["CLUSTER", "NODES"]))));
        }
        let mut first: Option<BTreeMap<(u16, u16), String>> = None;
        for (node, view) in &views {
            let port = node.process.port();
            let mut map = BTreeMap::new();
            for n in view.iter().filter(|n| n.master) {
                for &range in &n.slots {
                    map.insert(range, n.id.clone());
                }
            }
            let covered: u32 = map.keys().map(|&(lo, hi)| u32::from(hi - lo) + 1).sum();
            if covered != u32::from(SLOT_COUNT) {
                return Err(format!("port {port} sees {covered} slots assigned"));
            }
            if let Some(dead) = map.values().find(|id| !self.alive().any(|a| &a.id == *id)) {
                return Err(format!("port {port} still sees slots on killed node {dead}"));
            }
            match &first {
                None => first = Some(map),
                Some(seen) if *seen != map => return Err(format!("port {port} disagrees on the slot map")),
                Some(_) => {}
            }
            for (other, other_view) in &views {
                let own = other_view.iter().find(|v| v.id == other.id);
                let seen = view.iter().find(|v| v.id == other.id);
                let (Some(own), Some(seen)) = (own, seen) else {
                    return Err(format!("port {port} does not (yet) know node {}", other.id));
                };
                if seen.failed || (seen.master, &seen.replica_of) != (own.master, &own.replica_of) {
                    return Err(format!("port {port} sees {seen:?}, the node itself says {own:?}"));
                }
            }
            let me = view.iter().find(|v| v.id == node.id);
            if me.is_some_and(|me| !me.master) {
                let info = self.cli(port, &["INFO", "replication"]);
                if node::info_field(&info, "master_link_status") != Some("up") {
                    return Err(format!("replica {port}: link to its master not up"));
                }
            }
        }
        Ok(())
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            node::print_logs("cluster node", self.nodes.iter().map(|n| &n.process));
        }
    }
}

impl std::fmt::Debug for RedisCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ports: Vec<u16> = self.nodes.iter().map(|n| n.process.port()).collect();
        f.debug_struct("RedisCluster").field("ports", &ports).field("dir", &self.dir.path()).finish()
    }
}

fn node_spec(dir: &TempDir, extra: &[&str]) -> NodeSpec {
    // The config file is named per node; `{port}` is unknown before a port is
    // picked, so each node gets a fresh file name from a counter instead.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let config = dir.path().join(format!("nodes-{n}.conf"));
    let mut args: Vec<String> = vec![
        "--cluster-enabled".into(),
        "yes".into(),
        "--cluster-config-file".into(),
        config.display().to_string(),
        "--cluster-node-timeout".into(),
        NODE_TIMEOUT_MS.to_string(),
        "--cluster-announce-ip".into(),
        "127.0.0.1".into(),
        // Fail over even when the replica's link has been down a while.
        "--cluster-replica-validity-factor".into(),
        "0".into(),
        // Replicas sync at once instead of waiting 5 s for more replicas.
        "--repl-diskless-sync-delay".into(),
        "0".into(),
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    NodeSpec { args, needs_bus: true, ..NodeSpec::default() }
}

fn parse_nodes(text: &str) -> Vec<NodeView> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 {
                return None;
            }
            let flags: Vec<&str> = fields[2].split(',').collect();
            let port = fields[1].split(['@', ',']).next()?.rsplit(':').next()?.parse().ok()?;
            let slots = fields[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((lo, hi)) => Some((lo.parse().ok()?, hi.parse().ok()?)),
                    None => s.parse().ok().map(|x| (x, x)),
                })
                .collect();
            Some(NodeView {
                id: fields[0].to_owned(),
                port,
                master: flags.contains(&"master"),
                failed: flags.contains(&"fail") || flags.contains(&"fail?") || flags.contains(&"handshake"),
                replica_of: (fields[3] != "-").then(|| fields[3].to_owned()),
                slots,
            })
        })
        .collect()
}

/// The hash slot of `key`, as Redis Cluster computes it (`keyHashSlot`):
/// CRC16/XMODEM of the key modulo 16384, where a non-empty `{tag}` (the
/// first `{` and the first `}` after it) is hashed instead of the whole key.
pub fn slot_of(key: impl AsRef<[u8]>) -> u16 {
    let key = key.as_ref();
    let hashed = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    crc16_xmodem(hashed) % SLOT_COUNT
}

/// CRC16/XMODEM (polynomial 0x1021, initial value 0), bit by bit: slow but
/// obviously right, and test keys are short.
fn crc16_xmodem(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_matches_the_reference_check_value() {
        // The CRC catalogue's check value for CRC-16/XMODEM.
        assert_eq!(crc16_xmodem(b"123456789"), 0x31C3);
    }

    #[test]
    fn slot_of_honours_hash_tags_like_redis() {
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(slot_of("{user1000}.following"), slot_of("user1000"));
        assert_eq!(slot_of("{user1000}.followers"), slot_of("user1000"));
        assert_eq!(slot_of("foo{}{bar}"), slot_of("foo{}{bar}".as_bytes()));
        assert_ne!(slot_of("foo{}{bar}"), slot_of("bar"), "an empty first tag hashes the whole key");
        assert_eq!(slot_of("foo{{bar}}zap"), slot_of("{bar"));
        assert_eq!(slot_of("foo{bar}{zap}"), slot_of("bar"));
    }

    #[test]
    fn parses_cluster_nodes_lines() {
        let text = "a1 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460 [5461->-b2]\n\
                    b2 127.0.0.1:30002@40002,host master,fail - 0 0 2 connected 5461\n\
                    c3 127.0.0.1:30003@40003 slave a1 0 0 1 connected\n";
        let view = parse_nodes(text);
        assert_eq!(view.len(), 3);
        assert_eq!(view[0].slots, vec![(0, 5460)]);
        assert_eq!((view[1].port, view[1].failed, view[1].slots.clone()), (30002, true, vec![(5461, 5461)]));
        assert!(!view[2].master);
        assert_eq!(view[2].replica_of.as_deref(), Some("a1"));
    }
}
