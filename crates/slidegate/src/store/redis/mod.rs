//! The Redis store: every decision is one Lua script, atomic inside Redis.
//!
//! - One script per algorithm, plus one for [`Store::decide_all`] over any mix
//!   of algorithms. Scripts are loaded when connecting and called with
//!   `EVALSHA`; after a `NOSCRIPT` (Redis restarted, failed over, or ran
//!   `SCRIPT FLUSH`) the store loads the script again and retries, once.
//! - Time comes from Redis `TIME` inside the script by default
//!   ([`TimeSource::Server`]), so app servers with skewed clocks agree.
//! - One key per identity and limit, `<prefix>{<identity>}:<alg>:<limit>:<window_ms>`
//!   (see [`RedisStore::keys_for`]); the `{identity}` hash tag keeps all keys of
//!   an identity in one Redis Cluster slot. The sliding window counter, fixed
//!   window and token bucket keep a packed string (12 bytes for limits below
//!   2^32), GCRA one integer, the sliding log a sorted set with one member per
//!   admitted permit.
//! - Every write sets its TTL in the same command (`SET … PXAT`, or `KEEPTTL`
//!   while a window's expiry is already right) or script, so idle identities
//!   free their memory by themselves. Denied requests and cost-0 requests
//!   write nothing.
//! - Arguments and replies are little-endian doubles (see `wire.rs`): cheaper
//!   for Lua to decode than decimal strings, and never truncated.
//! - The Lua mirrors `crate::algorithm` formula for formula; a property test
//!   replays random traces through this store and [`crate::MemoryStore`] and
//!   asserts identical decisions.
//!
//! Needs Redis 7.0 or newer (`SET … PXAT`, `ZRANGE … BYSCORE`, and scripts
//! replicated by effects, which makes `TIME` inside a script safe).

mod key;
mod scripts;
mod wire;

use std::fmt;
use std::sync::Arc;

use redis::aio::ConnectionManager;
use redis::{Cmd, ErrorKind, Script, ServerErrorKind, Value};

use self::key::StateKey;
use self::wire::{DecideAllArgs, DecideArgs};
use crate::store::{check_time, validate, Store, StoreError};
use crate::{Clock, Decision, Limit};

/// The key prefix when none is set.
pub const DEFAULT_PREFIX: &str = "slidegate:";

/// Where a [`RedisStore`] takes the current time from.
#[derive(Clone, Default)]
pub enum TimeSource {
    /// Redis `TIME`, read inside each script: one clock for every app server.
    #[default]
    Server,
    /// The given clock, sent with each call: for tests and replays (a
    /// [`crate::ManualClock`]), or to share a clock with a [`crate::MemoryStore`].
    ///
    /// TTLs still run on Redis's own clock, so in this mode each key lives 10 s
    /// longer than its state matters: a client clock that runs slow (or only
    /// moves when told to) does not see its state expire early.
    Client(Arc<dyn Clock>),
}

impl fmt::Debug for TimeSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TimeSource::Server => f.write_str("Server"),
            TimeSource::Client(clock) => write!(f, "Client(now_ms = {})", clock.now_ms()),
        }
    }
}

/// A [`Store`] in Redis. Cheap to clone: clones share one multiplexed,
/// automatically reconnecting connection.
///
/// ```no_run
/// use slidegate::{Algorithm, Limit, Quota, RedisStore, Store};
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::connect("redis://127.0.0.1/").await?.with_prefix("myapp:");
/// let limit = Limit::new(Algorithm::SlidingWindowCounter, Quota::per_minute(100)?);
/// let decision = store.decide("user-42", &limit, 1).await?;
/// assert_eq!(store.keys_for("user-42", &limit), ["myapp:{user-42}:swc:100:60000"]);
/// # let _ = decision;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    prefix: Arc<str>,
    time: TimeSource,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore").field("prefix", &self.prefix).field("time", &self.time).finish()
    }
}

impl RedisStore {
    /// Connects to the Redis at `url` (`redis://host:port/db`) and loads the scripts.
    ///
    /// # Errors
    /// [`StoreError::Redis`] when the URL is invalid or Redis cannot be reached.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url)?;
        let mut conn = ConnectionManager::new(client).await?;
        for script in scripts::all() {
            script.load_async(&mut conn).await?;
        }
        Ok(Self::from_connection(conn))
    }

    /// A store on an existing connection, to choose its timeouts and retries
    /// ([`connect`](Self::connect) keeps the `redis` crate's defaults: 1 s to
    /// connect, 500 ms per response). Scripts are loaded on first use.
    pub fn from_connection(conn: ConnectionManager) -> Self {
        Self { conn, prefix: DEFAULT_PREFIX.into(), time: TimeSource::Server }
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

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The time source.
    pub fn time_source(&self) -> &TimeSource {
        &self.time
    }

    /// The Redis keys that hold `key`'s state under `limit` (for tests,
    /// `MEMORY USAGE`, cleanup). Every algorithm uses exactly one key:
    /// `<prefix>{<identity>}:<alg>:<limit>:<window_ms>` with `<alg>` one of
    /// `swc`, `fw`, `log`, `tb`, `gcra`.
    ///
    /// An identity starting with `{` or `}` is written with one more `{` in
    /// front, so that its hash tag is never empty.
    pub fn keys_for(&self, key: &str, limit: &Limit) -> Vec<String> {
        vec![self.state_key(key, limit).to_string()]
    }

    fn state_key<'a>(&'a self, identity: &'a str, limit: &'a Limit) -> StateKey<'a> {
        StateKey { prefix: &self.prefix, identity, limit }
    }

    /// The client's time in ms, or `None` for Redis `TIME`; a client time
    /// outside [`crate::store::MAX_TIME_MS`] is an error before any script runs.
    fn client_now(&self) -> Result<Option<u64>, StoreError> {
        match &self.time {
            TimeSource::Server => Ok(None),
            TimeSource::Client(clock) => check_time(clock.now_ms()).map(Some),
        }
    }

    /// Runs `cmd`, an `EVALSHA` of `script`; loads the script and retries once
    /// on `NOSCRIPT`.
    async fn eval(&self, script: &Script, cmd: &Cmd) -> Result<Value, StoreError> {
        // `redis::ScriptInvocation` does the same, but copies every key and
        // argument into a Vec of its own; a `Cmd` writes them into one buffer.
        let mut conn = self.conn.clone();
        match cmd.query_async(&mut conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                script.load_async(&mut conn).await?;
                Ok(cmd.query_async(&mut conn).await?)
            }
            reply => Ok(reply?),
        }
    }
}

impl Store for RedisStore {
    async fn decide(&self, key: &str, limit: &Limit, cost: u64) -> Result<Decision, StoreError> {
        validate(key, &[(*limit, cost)])?;
        let script = scripts::decide(limit.algorithm);
        let mut cmd = Cmd::with_capacity(5, 96 + self.prefix.len() + key.len());
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(1).arg(self.state_key(key, limit));
        cmd.arg(DecideArgs { now_ms: self.client_now()?, limit: *limit, cost });
        let reply = self.eval(script, &cmd).await?;
        wire::single_decision(&reply, limit.quota.permits())
    }

    async fn decide_all(&self, key: &str, charges: &[(Limit, u64)]) -> Result<Vec<Decision>, StoreError> {
        validate(key, charges)?;
        let script = scripts::decide_all();
        let n = charges.len();
        let mut cmd = Cmd::with_capacity(4 + n, 64 + n * (self.prefix.len() + key.len() + 64));
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(n);
        for (limit, _) in charges {
            cmd.arg(self.state_key(key, limit));
        }
        cmd.arg(DecideAllArgs { now_ms: self.client_now()?, charges });
        let reply = self.eval(script, &cmd).await?;
        wire::decisions(&reply, charges.iter().map(|(limit, _)| limit.quota.permits()))
    }
}
