//! The Redis store: every decision is one Lua script, atomic inside Redis.
//!
//! - One script per algorithm for a request with one charge, plus one for
//!   several charges over any mix of algorithms. Scripts are loaded when connecting and called with
//!   `EVALSHA`; after a `NOSCRIPT` (Redis restarted, failed over, or ran
//!   `SCRIPT FLUSH`) the store sends the same call once more with `EVAL` and
//!   the source, which cannot fail with `NOSCRIPT` and caches the script
//!   again. A `NOSCRIPT` means the script did not run, so nothing is charged
//!   twice.
//! - Every call runs under a deadline ([`RedisOptions::with_timeout`], 250 ms
//!   by default, or the [`Request::deadline`] when earlier). While the
//!   connection is known to be lost, calls fail at once with
//!   [`Unavailable::NotConnected`] and one background task reconnects with a
//!   short, capped back-off (see `link.rs`). A thread running its own
//!   runtime can have a connection of its own ([`drive_connections_here`]),
//!   up and down with the shared one.
//! - The deadline travels with the call, on the server's clock (the offset
//!   learned from `TIME` samples, `server_clock.rs`, which states the
//!   bound): a script or module command that Redis reaches after it refuses
//!   the call before touching a key ([`Unavailable::Expired`]), so a call
//!   that timed out here charges nothing when a stalled Redis catches up.
//! - Time comes from Redis `TIME` inside the script by default
//!   ([`TimeSource::Server`]), so app servers with skewed clocks agree.
//! - One key per identity and limit, `<prefix>{<identity>}:<alg>:<limit>:<window_ms>`,
//!   the identity written as `<scope>:<source tag>:<22 base64url digits>`
//!   (see [`RedisStore::keys_for`] and `key.rs`); the `{identity}` hash tag keeps all keys of
//!   an identity in one Redis Cluster slot. The sliding window counter, fixed
//!   window and token bucket keep a packed string (12 bytes for limits below
//!   2^32), GCRA a 13-byte string (ms and a fraction of one), the sliding
//!   log a sorted set with one member per
//!   admitted permit.
//! - Every write sets its TTL in the same command (`SET … PXAT`; `SETRANGE`,
//!   which keeps the expiry, while a window's expiry is already right) or
//!   script, so idle identities free their memory by themselves. Denied
//!   requests and cost-0 requests write nothing.
//! - Arguments and replies are little-endian doubles (see `wire.rs`): cheaper
//!   for Lua to decode than decimal strings, and never truncated; an allowed
//!   single decision comes back as one integer, cheaper still.
//! - The Lua mirrors `crate::algorithm` formula for formula; a property test
//!   replays random traces through this store and [`crate::MemoryStore`] and
//!   asserts identical decisions.
//!
//! - [`RedisTarget`] picks one server, a Redis Cluster or a master behind
//!   Sentinel (see [`RedisStore::connect_to`]). Replication is asynchronous:
//!   after a failover the promoted replica may lack the last writes, and the
//!   identities they charged regain those permits (none lost in the tests,
//!   a local replica being a fraction of a millisecond behind; bounded by
//!   the writes of the replication lag before the master died).
//!
//! - Where Redis loads the native module (`crates/slidegate-redis-module`),
//!   its `SLIDEGATE.DECIDE` and `SLIDEGATE.DECIDE_ALL` decide instead of the
//!   scripts, on the same keys and values, unless a sliding log is among the
//!   limits ([`Engine`]).
//!
//! Needs Redis 7.0 or newer (`SET … PXAT`, `ZRANGE … BYSCORE`, and scripts
//! replicated by effects, which makes `TIME` inside a script safe).

mod cluster_link;
mod connect;
mod engine;
mod key;
mod layout;
mod layout_record;
mod lease;
mod link;
mod options;
mod scripts;
mod server_clock;
mod table;
mod target;
mod version;
mod wire;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{Cmd, ErrorKind, ServerErrorKind, ToRedisArgs, Value};

use self::cluster_link::ClusterLink;
pub use self::engine::Engine;
use self::engine::ModuleProbe;
use self::key::{IdentityKeys, KeyHead, StateKey};
use self::layout::Tags;
pub use self::layout::{Buckets, Layout, Place, IDENTITIES_PER_BUCKET, MAX_BUCKETS};
pub use self::layout_record::LayoutConflict;
pub use self::link::drive_connections_here;
use self::link::Link;
pub use self::options::{RedisOptions, TimeSource};
use self::scripts::{Assembly, Lua};
use self::server_clock::ServerClock;
pub use self::target::RedisTarget;
pub use self::version::MIN_SERVER;
use self::wire::{DecideAllArgs, DecideArgs, WithFields};
use crate::store::joint::{self, JointStore, Part};
use crate::store::{
    check_time, validate, Charge, DistinctStore, Outcome, Request, SharedTables, Store, StoreError,
};
use crate::{Clock, Decision, Identity, Limit, Penalty, Quota, Unavailable};

/// The key prefix when none is set.
pub const DEFAULT_PREFIX: &str = "slidegate:";

/// What a store sends its commands on.
#[derive(Clone)]
enum Connection {
    /// The store's own: fails fast while down, reconnects in the background.
    Link(Link),
    /// A caller's `ConnectionManager` ([`RedisStore::from_connection`]).
    Manager(ConnectionManager),
    /// The `redis` crate's cluster connection: routes each script by its
    /// keys' slot, follows `MOVED`/`ASK`, retries `TRYAGAIN`, all within the
    /// store's deadline.
    Cluster(ClusterLink),
}

/// A [`Store`] in Redis. Cheap to clone: clones share one multiplexed,
/// automatically reconnecting connection (and a thread that asked with
/// [`drive_connections_here`] decides on one of its own).
///
/// ```no_run
/// use slidegate::{Algorithm, Charge, Digest, Identity, Limit, Quota, RedisStore, Request, Source, Store};
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::connect("redis://127.0.0.1/").await?.with_prefix("myapp:");
/// let limit = Limit::new(Algorithm::SlidingWindowCounter, Quota::per_minute(100)?);
/// let user = Identity::new("api", Source::Named, Digest([0x42; 16]));
/// let outcome = store.decide(Request::new(&user, &[Charge::new(limit, 1)])).await?;
/// assert_eq!(store.keys_for(&user, &limit), ["myapp:{api:n:QkJCQkJCQkJCQkJCQkJCQg}:swc:100:60000"]);
/// # let _ = outcome;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    conn: Connection,
    timeout: Duration,
    prefix: Arc<str>,
    time: TimeSource,
    engine: Engine,
    module: Arc<ModuleProbe>,
    /// The server's clock as seen from here, to send each call's deadline.
    clock: Arc<ServerClock>,
    /// The packed layout's buckets; `None` for a key per identity.
    packing: Option<Packing>,
}

/// A packed layout's bucket count and the tags of its buckets.
#[derive(Clone)]
struct Packing {
    buckets: Buckets,
    tags: Arc<Tags>,
}

/// When one call is given up: here, and on the server's clock (`None`
/// before the offset is known).
#[derive(Debug, Clone, Copy)]
struct CallDeadline {
    local: Instant,
    budget: Duration,
    server_ms: Option<u64>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("time", &self.time)
            .field("timeout", &self.timeout)
            .field("engine", &self.engine)
            .field("layout", &self.layout())
            .finish()
    }
}

impl RedisStore {
    /// The same store with `timeout` as the deadline of each decision.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The deadline of each decision.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The same store writing its keys under `prefix` (default `"slidegate:"`).
    ///
    /// The prefix should not contain `{` or `}`: Redis Cluster would take the
    /// hash tag from the prefix and put every identity in one slot.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into().into();
        self
    }

    /// The same store taking the time from `time`.
    pub fn with_time_source(mut self, time: TimeSource) -> Self {
        self.time = time;
        self
    }

    /// The same store deciding with `engine` (default [`Engine::Auto`]).
    pub fn with_engine(mut self, engine: Engine) -> Self {
        self.engine = engine;
        self.module = Arc::default();
        self
    }

    /// The engine setting (not what [`Engine::Auto`] found).
    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The time source.
    pub fn time_source(&self) -> &TimeSource {
        &self.time
    }

    /// The same store keeping its state in `layout` (default
    /// [`Layout::PerKey`]; see [`Layout`] for the packed one). Every process
    /// deciding for the same identities under one prefix must use the same
    /// layout and bucket count: a store in another layout does not see the
    /// state written in this one (each identity starts afresh once, as
    /// after any change of key shape).
    pub fn with_layout(mut self, layout: Layout) -> Self {
        self.packing = match layout {
            Layout::PerKey => None,
            Layout::Packed(buckets) => Some(Packing { buckets, tags: Tags::of(buckets) }),
        };
        self
    }

    /// The layout the state is kept in.
    pub fn layout(&self) -> Layout {
        self.packing.as_ref().map_or(Layout::PerKey, |p| Layout::Packed(p.buckets))
    }

    /// Where `identity`'s state under `limit` lives: its key, or in the
    /// packed layout (for the algorithms it packs) the stem of its bucket's
    /// window hashes and its field in them.
    pub fn location(&self, identity: &Identity, limit: &Limit) -> Location {
        let keys = self.keys(identity);
        let key = keys.state(limit);
        match keys.packed {
            Some((_, field)) if key.is_packed() => Location::Packed { stem: key.to_string(), field },
            _ => Location::Key(key.to_string()),
        }
    }

    /// The scripts of the store's layout.
    fn assembly(&self) -> Assembly {
        Assembly::of(self.layout())
    }

    /// Where `identity`'s keys are: computed once per request.
    fn keys<'a>(&'a self, identity: &'a Identity) -> IdentityKeys<'a> {
        let packed = self.packing.as_ref().map(|p| {
            let place = Place::of(identity, p.buckets);
            (p.tags.tag(place.bucket), place.field)
        });
        IdentityKeys { prefix: &self.prefix, identity, packed }
    }

    /// The fields a packed script takes after its arguments: the field of
    /// each key's identity, in order; `None` in the per-key layout.
    fn fields<'a>(&self, keys: impl Iterator<Item = &'a IdentityKeys<'a>>) -> Option<Vec<u8>> {
        self.packing.is_some().then(|| keys.flat_map(|k| k.field().iter().copied()).collect())
    }

    /// The Redis keys that hold `identity`'s state under `limit` (for tests,
    /// `MEMORY USAGE`, cleanup). In the per-key layout every algorithm uses
    /// exactly one key (in the packed layout see [`location`](Self::location)):
    /// `<prefix>{<scope>:<source tag>:<22 base64url digits>}:<alg>:<limit>:<window_ms>`
    /// with `<alg>` one of `swc`, `fw`, `log`, `tb`, `gcra` (an application's
    /// name is written as given, `<scope>:n:<name>`; the digits are the
    /// digest's 128 bits, shown elsewhere as 32 hex digits).
    ///
    /// An identity whose scope starts with `{` or `}` is written with one
    /// more `{` in front, so that its hash tag is never empty.
    pub fn keys_for(&self, identity: &Identity, limit: &Limit) -> Vec<String> {
        match self.location(identity, limit) {
            Location::Key(key) => vec![key],
            Location::Packed { stem, .. } => vec![stem],
        }
    }

    fn state_key<'a>(&'a self, identity: &'a Identity, limit: &'a Limit) -> StateKey<'a> {
        self.keys(identity).state(limit)
    }

    /// The client's time in ms, or `None` for Redis `TIME`; a client time
    /// outside [`crate::store::MAX_TIME_MS`] is an error before any script runs.
    fn client_now(&self) -> Result<Option<u64>, StoreError> {
        match &self.time {
            TimeSource::Server => Ok(None),
            TimeSource::Client(clock) => check_time(clock.now_ms()).map(Some),
        }
    }

    /// The live connection of a [`Connection::Link`] and its generation, or
    /// an error at once while it is down.
    fn connection(&self) -> Result<(u64, redis::aio::MultiplexedConnection), StoreError> {
        match &self.conn {
            Connection::Link(link) => link.get(),
            Connection::Manager(_) | Connection::Cluster(_) => Err(StoreError::Unavailable(
                Unavailable::NotConnected("only a store's own link is used here".to_owned()),
            )),
        }
    }

    /// Runs `lua` on `keys` and `args` until `deadline`.
    async fn eval<K: ToRedisArgs + Sync, A: ToRedisArgs + Sync>(
        &self,
        lua: &Lua,
        keys: &[K],
        args: &A,
        deadline: CallDeadline,
    ) -> Result<Value, StoreError> {
        // `redis::ScriptInvocation` does the same, but copies every key and
        // argument into a Vec of its own; a `Cmd` writes them into one buffer.
        let capacity = 64 + keys.len() * (self.prefix.len() + 64);
        let mut cmd = Cmd::with_capacity(4 + keys.len(), capacity);
        cmd.arg("EVALSHA").arg(lua.hash()).arg(keys.len());
        for key in keys {
            cmd.arg(key);
        }
        cmd.arg(args);
        let fallback = || {
            let mut cmd = Cmd::with_capacity(4 + keys.len(), capacity + lua.source().len());
            cmd.arg("EVAL").arg(lua.source()).arg(keys.len());
            for key in keys {
                cmd.arg(key);
            }
            cmd.arg(args);
            cmd
        };
        let call = async {
            match &self.conn {
                Connection::Link(link) => {
                    let (generation, mut conn) = link.get()?;
                    let reply = run(&mut conn, &cmd, fallback).await;
                    if let Err(err) = &reply {
                        link.failed(generation, err);
                    }
                    Ok(reply?)
                }
                Connection::Manager(manager) => Ok(run(&mut manager.clone(), &cmd, fallback).await?),
                Connection::Cluster(cluster) => {
                    let reply = run(&mut cluster.get(), &cmd, fallback).await;
                    cluster.note(reply.is_ok());
                    Ok(reply?)
                }
            }
        };
        self.settle(tokio::time::timeout_at(deadline.local.into(), call).await, deadline)
    }

    /// Sends `cmd` until `deadline`.
    async fn send(&self, cmd: &Cmd, deadline: CallDeadline) -> Result<Value, StoreError> {
        let call = async {
            match &self.conn {
                Connection::Link(link) => {
                    let (generation, mut conn) = link.get()?;
                    let reply = cmd.query_async(&mut conn).await;
                    if let Err(err) = &reply {
                        link.failed(generation, err);
                    }
                    Ok(reply?)
                }
                Connection::Manager(manager) => Ok(cmd.query_async(&mut manager.clone()).await?),
                Connection::Cluster(cluster) => {
                    let reply = cmd.query_async(&mut cluster.get()).await;
                    cluster.note(reply.is_ok());
                    Ok(reply?)
                }
            }
        };
        self.settle(tokio::time::timeout_at(deadline.local.into(), call).await, deadline)
    }

    /// A call's answer: its reply, a timeout at the deadline, or the
    /// server's refusal of a call it reached too late, whose time it learns.
    fn settle(
        &self,
        answer: Result<Result<Value, StoreError>, tokio::time::error::Elapsed>,
        deadline: CallDeadline,
    ) -> Result<Value, StoreError> {
        match answer {
            Ok(Err(StoreError::Unavailable(Unavailable::Redis(err)))) => match wire::expired(&err) {
                Some(server_ms) => {
                    self.clock.learn(server_ms, Instant::now());
                    Err(StoreError::Unavailable(Unavailable::Expired))
                }
                None => Err(StoreError::Unavailable(Unavailable::Redis(err))),
            },
            Ok(reply) => reply,
            Err(_) => Err(StoreError::Unavailable(Unavailable::TimedOut(deadline.budget))),
        }
    }

    /// The deadline of a call starting now: the store's own, or the
    /// caller's when earlier; on the server's clock too when its offset is
    /// known. Asks the server's time in the background when a sample is due.
    fn deadline(&self, requested: Option<Instant>) -> CallDeadline {
        let now = Instant::now();
        let own = now + self.timeout;
        let local = requested.map_or(own, |d| d.min(own));
        if self.clock.claim_sample(now) {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let store = self.clone();
                runtime.spawn(async move { store.sample_time().await });
            }
        }
        CallDeadline {
            local,
            budget: local.saturating_duration_since(now),
            server_ms: self.clock.server_deadline(local),
        }
    }

    /// Samples the server's time now if a sample is due (when connecting).
    async fn sample_time_now(&self) {
        if self.clock.claim_sample(Instant::now()) {
            self.sample_time().await;
        }
    }

    /// Asks the server's `TIME` and learns the clock offset from the answer
    /// (see `server_clock.rs`). A failure teaches nothing.
    async fn sample_time(&self) {
        let deadline =
            CallDeadline { local: Instant::now() + self.timeout, budget: self.timeout, server_ms: None };
        let Ok(reply) = self.send(&redis::cmd("TIME"), deadline).await else { return };
        let received = Instant::now();
        if let Ok((secs, micros)) = redis::from_redis_value::<(u64, u64)>(reply) {
            self.clock.learn(secs.saturating_mul(1000).saturating_add(micros / 1000), received);
        }
    }
}

/// Sends `cmd`, an `EVALSHA`; on `NOSCRIPT` (the script cache was flushed,
/// or this is a new Redis) sends `fallback()`, the same call as `EVAL` with
/// the source. `EVAL` cannot fail with `NOSCRIPT`, so one fallback is enough
/// however often the cache is flushed, and since a `NOSCRIPT` call did not
/// run, the fallback never charges twice.
async fn run<C: ConnectionLike + Send>(
    conn: &mut C,
    cmd: &Cmd,
    fallback: impl FnOnce() -> Cmd,
) -> Result<Value, redis::RedisError> {
    match cmd.query_async(conn).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            fallback().query_async(conn).await
        }
        reply => reply,
    }
}

impl Store for RedisStore {
    async fn decide(&self, request: Request<'_>) -> Result<Outcome, StoreError> {
        let Request { identity, charges, penalty, deadline } = request;
        validate(charges)?;
        let now_ms = self.client_now()?;
        let deadline = self.deadline(deadline);
        if let Some(penalty) = penalty {
            return self.decide_penalized(identity, charges, penalty, now_ms, deadline).await;
        }
        if self.use_module(charges.iter().map(|c| c.limit.algorithm)).await? {
            match self.decide_by_module(identity, charges, now_ms, deadline).await {
                Err(err) if self.module_gone(&err) => {}
                decided => return decided.map(Outcome::decided),
            }
        }
        let deadline_ms = deadline.server_ms;
        let identity_keys = self.keys(identity);
        let assembly = self.assembly();
        if let [charge] = charges {
            let args = DecideArgs { now_ms, limit: charge.limit, cost: charge.cost, deadline_ms };
            let args = WithFields { args, fields: self.fields(std::iter::once(&identity_keys)) };
            let key = identity_keys.state(&charge.limit);
            let lua = scripts::decide(charge.limit.algorithm, assembly);
            let reply = self.eval(lua, &[key], &args, deadline).await?;
            return wire::single_decision(&reply, charge.limit.quota.permits()).map(Outcome::decided);
        }
        let keys: Vec<StateKey<'_>> = charges.iter().map(|c| identity_keys.state(&c.limit)).collect();
        let args = DecideAllArgs { now_ms, charges, deadline_ms };
        let args = WithFields { args, fields: self.fields(charges.iter().map(|_| &identity_keys)) };
        let reply = self.eval(scripts::decide_all(assembly), &keys, &args, deadline).await?;
        wire::decisions(&reply, charges.iter().map(|c| c.limit.quota.permits())).map(Outcome::decided)
    }

    /// Never: every decision is a round trip.
    fn decide_now(&self, _request: Request<'_>) -> Option<Result<Outcome, StoreError>> {
        None
    }

    fn distinct(&self) -> Option<impl DistinctStore + '_> {
        Some(self)
    }

    fn tables(&self) -> Option<impl SharedTables + '_> {
        Some(self)
    }

    fn leases(&self) -> Option<impl crate::store::LeaseStore + '_> {
        Some(self)
    }

    /// One server's: a Cluster's identities live in different slots, which
    /// no script call can write together.
    fn joint(&self) -> Option<impl JointStore + '_> {
        (!matches!(self.conn, Connection::Cluster(_))).then_some(self)
    }

    async fn lift_penalty(
        &self,
        identity: &Identity,
        deadline: Option<Instant>,
    ) -> Result<Option<Duration>, StoreError> {
        let now = self.client_now()?;
        let deadline = self.deadline(deadline);
        let now_arg: i64 = now.map_or(-1, |n| n as i64);
        let deadline_arg: i64 = deadline.server_ms.map_or(-1, |ms| ms as i64);
        let key = self.keys(identity).penalty().to_string();
        let reply = self.eval(scripts::lift(), &[key], &(now_arg, deadline_arg), deadline).await?;
        let left: i64 = redis::from_redis_value(reply)
            .map_err(|e| StoreError::Unavailable(Unavailable::UnexpectedReply(format!("lift: {e}"))))?;
        Ok(u64::try_from(left).ok().map(Duration::from_millis))
    }

    /// A server over the network: it can be down, slow or unreachable.
    fn has_outages(&self) -> bool {
        true
    }
}

/// Every part's state keys in one `decide_all.lua` call (always Lua: the
/// module's `DECIDE_ALL` takes one identity's keys), all checked before any
/// is charged.
impl JointStore for RedisStore {
    async fn decide_joint(
        &self,
        parts: &[Part<'_>],
        deadline: Option<Instant>,
    ) -> Result<Vec<Outcome>, StoreError> {
        joint::validate_parts(parts)?;
        let now_ms = self.client_now()?;
        let deadline = self.deadline(deadline);
        let charges: Vec<Charge> = parts.iter().flat_map(|p| p.charges.iter().copied()).collect();
        let identity_keys: Vec<IdentityKeys<'_>> = parts
            .iter()
            .flat_map(|p| {
                let keys = self.keys(p.identity);
                p.charges.iter().map(move |_| keys)
            })
            .collect();
        let keys: Vec<StateKey<'_>> =
            identity_keys.iter().zip(&charges).map(|(k, c)| k.state(&c.limit)).collect();
        let args = DecideAllArgs { now_ms, charges: &charges, deadline_ms: deadline.server_ms };
        let args = WithFields { args, fields: self.fields(identity_keys.iter()) };
        let reply = self.eval(scripts::decide_all(self.assembly()), &keys, &args, deadline).await?;
        let flat = wire::decisions(&reply, charges.iter().map(|c| c.limit.quota.permits()))?;
        Ok(joint::split(parts, &flat))
    }
}

impl DistinctStore for RedisStore {
    async fn decide_distinct(
        &self,
        identity: &Identity,
        quota: &Quota,
        value: &[u8],
    ) -> Result<Decision, StoreError> {
        let now = self.client_now()?;
        let deadline = self.deadline(None);
        let sketch = self.distinct_key(identity, quota);
        let keys = [format!("{sketch}:w"), format!("{sketch}:tmp"), sketch];
        let slack: u64 = if now.is_some() { 10_000 } else { 0 };
        let now_arg: i64 = now.map_or(-1, |n| n as i64);
        // The script wants the sketch first.
        let ordered = [&keys[2], &keys[0], &keys[1]];
        let args = (now_arg, quota.window_ms(), quota.permits(), value, slack);
        let reply = match deadline.server_ms {
            Some(ms) => self.eval(scripts::distinct(), &ordered, &(args, ms), deadline).await?,
            None => self.eval(scripts::distinct(), &ordered, &args, deadline).await?,
        };
        let (allowed, count, reset_after): (i64, u64, u64) = redis::from_redis_value(reply)
            .map_err(|e| StoreError::Unavailable(Unavailable::UnexpectedReply(format!("distinct: {e}"))))?;
        let reset_after = Duration::from_millis(reset_after);
        let allowed = allowed == 1;
        Ok(Decision {
            allowed,
            limit: quota.permits(),
            remaining: quota.permits().saturating_sub(count),
            reset_after,
            retry_after: (!allowed).then_some(reset_after),
        })
    }
}

impl RedisStore {
    /// `charges` under `penalty`, always in Lua (`penalty.lua` spliced into
    /// `decide_all.lua`). The penalty path formats its keys: one more key
    /// than a plain decision, and only rules with a penalty pay for the strings.
    async fn decide_penalized(
        &self,
        identity: &Identity,
        charges: &[Charge],
        penalty: &Penalty,
        now_ms: Option<u64>,
        deadline: CallDeadline,
    ) -> Result<Outcome, StoreError> {
        let identity_keys = self.keys(identity);
        let mut keys: Vec<String> =
            charges.iter().map(|c| identity_keys.state(&c.limit).to_string()).collect();
        keys.push(identity_keys.penalty().to_string());
        let args =
            (DecideAllArgs { now_ms, charges, deadline_ms: deadline.server_ms }, wire::PenaltyArgs(penalty));
        let args = WithFields { args, fields: self.fields(charges.iter().map(|_| &identity_keys)) };
        let reply = self.eval(scripts::penalty(self.assembly()), &keys, &args, deadline).await?;
        wire::penalized(&reply, charges.iter().map(|c| c.limit.quota.permits()))
    }

    /// The Redis key of `identity`'s distinct-value sketch under `quota`:
    /// `<prefix>{<identity>}:hll:<limit>:<window_ms>` (packed layout:
    /// `<prefix>{<bucket tag>}<identity>:hll:…`), in the slot of the
    /// identity's state keys (its window number lives in the same key plus `:w`).
    pub fn distinct_key(&self, identity: &Identity, quota: &Quota) -> String {
        let head = KeyHead(self.keys(identity));
        format!("{head}:hll:{}:{}", quota.permits(), quota.window_ms())
    }
}

/// Where an identity's state under one limit lives ([`RedisStore::location`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Location {
    /// A key of its own.
    Key(String),
    /// The field `field` of the window hashes `<stem><window number>`.
    Packed {
        /// The stem of the bucket's window hashes, up to the window number.
        stem: String,
        /// The identity's field in them (binary).
        field: [u8; 8],
    },
}
