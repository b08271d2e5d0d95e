//! What decides inside Redis, the Lua scripts or the native module, and
//! how the store finds out whether a server has the module.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
use redis::{Cmd, Value};

use super::wire::{self, DecideAllArgs};
use super::{CallDeadline, Connection, RedisStore};
use crate::store::{Charge, Decisions, StoreError};
use crate::{Algorithm, Identity, Unavailable};

/// What decides inside Redis: the Lua scripts or the native module.
///
/// The native module (`crates/slidegate-redis-module`, loaded with
/// `--loadmodule`) runs `slidegate::algorithm` itself on the keys the Lua
/// scripts keep, so both engines interoperate on one key. It decides
/// [`crate::Store::decide`] (`SLIDEGATE.DECIDE` for one charge,
/// `SLIDEGATE.DECIDE_ALL` for several, all or nothing as the script) for
/// every algorithm but the sliding log, a sorted set the module leaves to the
/// scripts: a call with a sliding log among its limits runs the script
/// whatever the engine. A request under a penalty and
/// [`crate::DistinctStore::decide_distinct`] always use Lua. Quota leases
/// ([`crate::LeaseStore`]) go where decisions go: `SLIDEGATE.LEASE` and
/// `SLIDEGATE.GIVE_BACK`, or `lease.lua` and `give_back.lua`; under `Auto`,
/// a module older than the lease commands leases by Lua.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Engine {
    /// The module where Redis has it (asked at connect and after each
    /// reconnect with `COMMAND INFO SLIDEGATE.DECIDE_ALL`; on a Cluster,
    /// at the first decision, of every master, and the module is used only
    /// if all have it), else Lua. A call the server answers "unknown
    /// command" (the module unloaded, a failover to a node without it) ran
    /// nothing and is decided again by Lua, which decides from then on.
    #[default]
    Auto,
    /// Always the Lua scripts.
    Lua,
    /// Always the module: a Redis without it answers every decision with an error.
    Module,
}

/// The module command that decides one limit.
const MODULE_DECIDE: &str = "SLIDEGATE.DECIDE";
/// The module command that decides several limits of one identity.
const MODULE_DECIDE_ALL: &str = "SLIDEGATE.DECIDE_ALL";

impl Engine {
    /// Every engine, in the order of their names.
    pub const ALL: [Engine; 3] = [Engine::Auto, Engine::Lua, Engine::Module];

    /// The engine's name in configuration files and on the command line:
    /// `auto`, `lua` or `module`.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Auto => "auto",
            Engine::Lua => "lua",
            Engine::Module => "module",
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Engine {
    type Err = String;

    /// Parses `auto`, `lua` or `module`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Engine::ALL
            .into_iter()
            .find(|e| e.name() == s)
            .ok_or_else(|| format!("unknown engine {s:?}: expected \"auto\", \"lua\" or \"module\""))
    }
}

/// Whether the connection of one generation has the module ([`Engine::Auto`]).
#[derive(Debug, Default)]
pub(super) struct ModuleProbe {
    /// The link generation last asked, plus one; 0 before the first answer.
    asked: AtomicU64,
    present: AtomicBool,
    /// The module answered a lease command "unknown command" (a build older
    /// than `SLIDEGATE.LEASE`) since the last probe: leases run as Lua.
    without_leases: AtomicBool,
}

impl RedisStore {
    /// Asks the connection of `generation` whether it has the module and
    /// remembers the answer for that generation.
    pub(super) async fn probe_module<C: ConnectionLike + Send>(
        &self,
        generation: u64,
        conn: &mut C,
    ) -> Result<bool, StoreError> {
        let reply: Value = module_probe().query_async(conn).await?;
        self.remember_probe(generation, has_module(&reply))
    }

    /// Asks every master of the cluster whether it has the module: `true`
    /// only if all do. (A replica promoted later without it answers the
    /// module's commands "unknown command", which ran nothing: Lua decides,
    /// see [`RedisStore::module_gone`].)
    pub(super) async fn probe_cluster_module(
        &self,
        cluster: &mut ClusterConnection,
    ) -> Result<bool, StoreError> {
        let every_node = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
        // One reply per node, keyed by its address.
        let reply = cluster.route_command(module_probe(), every_node).await?;
        let present = match &reply {
            Value::Map(nodes) => !nodes.is_empty() && nodes.iter().all(|(_, reply)| has_module(reply)),
            other => has_module(other),
        };
        self.remember_probe(0, present)
    }

    /// The engine that decides (a call with a sliding log, a penalty or
    /// crawl breadth aside, which Lua always decides): the setting when it
    /// is [`Engine::Lua`] or [`Engine::Module`]; under [`Engine::Auto`], what
    /// the last probe of the server found, [`Engine::Module`] or
    /// [`Engine::Lua`], and `None` before any probe answered (the first
    /// decision without a sliding log asks; so does connecting to one
    /// server). [`RedisStore::engine`] is the setting.
    pub fn engine_in_use(&self) -> Option<Engine> {
        match self.engine {
            Engine::Auto if self.module.asked.load(Ordering::Acquire) == 0 => None,
            Engine::Auto if self.module.present.load(Ordering::Relaxed) => Some(Engine::Module),
            Engine::Auto => Some(Engine::Lua),
            setting => Some(setting),
        }
    }

    fn remember_probe(&self, generation: u64, present: bool) -> Result<bool, StoreError> {
        self.module.present.store(present, Ordering::Relaxed);
        self.module.without_leases.store(false, Ordering::Relaxed);
        self.module.asked.store(generation + 1, Ordering::Release);
        Ok(present)
    }

    /// Whether a decision under `algorithms` goes to the module.
    pub(super) async fn use_module(
        &self,
        mut algorithms: impl Iterator<Item = Algorithm>,
    ) -> Result<bool, StoreError> {
        let layout = self.layout();
        if algorithms.any(|a| a == Algorithm::SlidingLog || layout.packs(a)) {
            // A sorted set, or packed state: the module leaves both to the scripts.
            return Ok(false);
        }
        match self.engine {
            Engine::Lua => return Ok(false),
            Engine::Module => return Ok(true),
            Engine::Auto => {}
        }
        // A reconnect may have reached another server (a restart without the
        // module, a failover): each connection generation is asked once.
        let generation = match &self.conn {
            Connection::Link(link) => link.get()?.0,
            Connection::Manager(_) | Connection::Cluster(_) => 0,
        };
        if self.module.asked.load(Ordering::Acquire) == generation + 1 {
            return Ok(self.module.present.load(Ordering::Relaxed));
        }
        let probe = async {
            match &self.conn {
                Connection::Link(link) => {
                    let (generation, mut conn) = link.get()?;
                    self.probe_module(generation, &mut conn).await
                }
                Connection::Manager(manager) => self.probe_module(0, &mut manager.clone()).await,
                Connection::Cluster(cluster) => self.probe_cluster_module(&mut cluster.get()).await,
            }
        };
        match tokio::time::timeout(self.timeout, probe).await {
            Ok(present) => present,
            Err(_) => Err(StoreError::Unavailable(Unavailable::TimedOut(self.timeout))),
        }
    }

    /// A decision by the module: `SLIDEGATE.DECIDE` for one charge (the key
    /// the scripts use, the arguments of `decide_all.lua` for one limit),
    /// `SLIDEGATE.DECIDE_ALL` for several (the keys first, so that a cluster
    /// client routes by the first); the scripts' reply.
    pub(super) async fn decide_by_module(
        &self,
        identity: &Identity,
        charges: &[Charge],
        now_ms: Option<u64>,
        deadline: CallDeadline,
    ) -> Result<Decisions, StoreError> {
        let deadline_ms = deadline.server_ms;
        let key_len = self.prefix.len() + identity.scope().len() + 64;
        if let [charge] = charges {
            let mut cmd = Cmd::with_capacity(3, 128 + key_len);
            cmd.arg(MODULE_DECIDE).arg(self.state_key(identity, &charge.limit)).arg(DecideAllArgs {
                now_ms,
                charges,
                deadline_ms,
            });
            let reply = self.send(&cmd, deadline).await?;
            return wire::single_decision(&reply, charge.limit.quota.permits()).map(Decisions::one);
        }
        let mut cmd = Cmd::with_capacity(2 + charges.len(), 64 + charges.len() * key_len);
        cmd.arg(MODULE_DECIDE_ALL);
        for charge in charges {
            cmd.arg(self.state_key(identity, &charge.limit));
        }
        cmd.arg(DecideAllArgs { now_ms, charges, deadline_ms });
        let reply = self.send(&cmd, deadline).await?;
        wire::decisions(&reply, charges.iter().map(|c| c.limit.quota.permits())).map(Decisions::from)
    }

    /// After the module answered "unknown command" under [`Engine::Auto`]
    /// (a `MODULE UNLOAD`, a failover to a node without it), or refused the
    /// arguments as a build older than the deadline argument does: nothing
    /// ran, so Lua decides, until the next probe.
    pub(super) fn module_gone(&self, err: &StoreError) -> bool {
        let gone = self.engine == Engine::Auto && (is_unknown_command(err) || is_older_module(err));
        if gone {
            self.module.present.store(false, Ordering::Relaxed);
        }
        gone
    }
}

impl RedisStore {
    /// Whether a lease or give-back under `algorithm` goes to the module:
    /// where decisions do, unless the module was found without the lease
    /// commands since the last probe.
    pub(super) async fn lease_by_module(&self, algorithm: Algorithm) -> Result<bool, StoreError> {
        Ok(self.use_module(std::iter::once(algorithm)).await?
            && !(self.engine == Engine::Auto && self.module.without_leases.load(Ordering::Relaxed)))
    }

    /// After a lease command answered "unknown command" under
    /// [`Engine::Auto`] (a module older than the lease commands, or none):
    /// nothing ran, so leases run as Lua until the next probe. Decisions
    /// keep the module; if it is gone altogether, their own "unknown
    /// command" tells ([`RedisStore::module_gone`]).
    pub(super) fn module_without_leases(&self, err: &StoreError) -> bool {
        let without = self.engine == Engine::Auto && is_unknown_command(err);
        if without {
            self.module.without_leases.store(true, Ordering::Relaxed);
        }
        without
    }
}

/// `COMMAND INFO SLIDEGATE.DECIDE_ALL`: the newer of the module's commands,
/// so that a server with an older build of the module counts as without.
fn module_probe() -> Cmd {
    let mut cmd = redis::cmd("COMMAND");
    cmd.arg("INFO").arg(MODULE_DECIDE_ALL);
    cmd
}

/// Whether a `COMMAND INFO` reply describes the command: one entry per name
/// asked, nil for a command the server does not know.
fn has_module(reply: &Value) -> bool {
    matches!(reply, Value::Array(entries) if entries.first().is_some_and(|e| !matches!(e, Value::Nil)))
}

/// Whether the module refused the arguments before running anything, as a
/// build that knows no deadline argument answers a call carrying one.
fn is_older_module(err: &StoreError) -> bool {
    matches!(err, StoreError::Unavailable(Unavailable::Redis(e)) if e.code() == Some("ERR")
        && e.detail().is_some_and(|d| d.starts_with("slidegate: malformed arguments")))
}

/// Whether Redis refused a command it does not know (nothing ran).
fn is_unknown_command(err: &StoreError) -> bool {
    matches!(err, StoreError::Unavailable(Unavailable::Redis(e)) if e.code() == Some("ERR")
        && e.detail().is_some_and(|d| d.starts_with("unknown command")))
}
