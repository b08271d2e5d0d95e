//! slidegate: rate limiting that is as accurate as an exact log and as cheap
//! as two counters.
//!
//! The heart is Cloudflare's sliding window counter — `cur + prev × (1 −
//! elapsed/window)` — decided atomically: under a lock shard in the embedded
//! [`MemoryStore`], inside one Lua script in the Redis store. Beside it, for
//! comparison and for other needs: fixed window, sliding log (exact), token
//! bucket and GCRA. Every algorithm is pure integer arithmetic
//! ([`algorithm`]); the stores only decide where state lives.
//!
//! ```
//! use slidegate::{Algorithm, Charge, Identity, Limit, ManualClock, MemoryStore, Quota, Request};
//!
//! let clock = ManualClock::new(1_700_000_000_000);
//! let store = MemoryStore::with_clock(clock.clone());
//! let user = Identity::named("app", "user:42");
//! let charge = [Charge::new(Limit::new(Algorithm::SlidingWindowCounter, Quota::per_minute(2)?), 1)];
//! let request = Request::new(&user, &charge);
//!
//! assert!(store.decide_sync(request)?.allowed());
//! assert!(store.decide_sync(request)?.allowed());
//! let denied = store.decide_sync(request)?;
//! assert!(!denied.allowed());
//! assert_eq!(denied.decisions[0].remaining, 0);
//! let wait = denied.decisions[0].retry_after.expect("a denial says when to retry");
//! clock.advance(wait);
//! assert!(store.decide_sync(request)?.allowed());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod algorithm;
mod clock;
mod decision;
pub mod distinct;
mod identity;
mod penalty;
#[cfg(feature = "protect")]
pub mod protect;
mod quota;
pub mod store;
mod time_span;

pub use algorithm::{Algorithm, Limit, UnknownAlgorithm};
pub use clock::{Clock, ManualClock, SystemClock};
pub use decision::Decision;
pub use identity::{Digest, Identity, IdentityHasher, Source};
pub use penalty::{block_denials, Penalty, PenaltyError, PenaltyState, MAX_PENALTY_MS};
pub use quota::{Quota, QuotaError, MAX_EXACT, MAX_LIMIT, MAX_WINDOW};
pub use store::memory::{Corruption, MemoryStore, SnapshotError, SnapshotReport, SweepReport};
#[cfg(feature = "redis")]
pub use store::redis::{
    Buckets, Engine, Layout, LayoutConflict, Location, RedisOptions, RedisStore, RedisTarget, TimeSource,
};
pub use store::{
    check_charge, Charge, Decisions, DistinctStore, GiveBack, InvalidRequest, JointStore, Lease, LeaseStore,
    NoDistinct, NoJoint, NoLeases, NoTables, Origin, Outcome, Part, Request, SharedTables, Store, StoreError,
    TableEntry, TableError, TableName, Unavailable,
};
pub use time_span::{parse_duration, DurationError, TimeSpan};
