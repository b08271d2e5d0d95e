//! How each algorithm's state is written in a snapshot and read back
//! ([`Persisted`]), and the table records built on it, generated from
//! `for_each_algorithm!` so that an algorithm without a format is a
//! compile error.
//!
//! A table record: `algorithm u8 | permits u64 | window_ms u64 | count u64`,
//! then `count` times `id u64` and the state. States are written as the
//! algorithm holds them, times in ms since the epoch, so a restored state
//! is aged by the wall clock like any other.
//!
//! A state is read back only if the algorithm could have written it under
//! the record's quota (counts within the limit, times within
//! [`MAX_TIME_MS`](crate::store::MAX_TIME_MS) and a window, a log in order):
//! the arithmetic never meets a value it was not proven on.

use std::collections::VecDeque;
use std::time::Duration;

use super::super::kept::{Kept, States, Table};
use super::super::tables::LimitTable;
use super::format::{put_u64, Reader};
use super::Corruption;
use crate::algorithm::fixed_window::{self, FixedWindow};
use crate::algorithm::gcra::{self, Gcra};
use crate::algorithm::sliding_log::{self, SlidingLog};
use crate::algorithm::sliding_window_counter::{self, SlidingWindowCounter};
use crate::algorithm::token_bucket::{self, TokenBucket};
use crate::algorithm::{for_each_algorithm, Definition};
use crate::store::{check_charge, MAX_TIME_MS};
use crate::{Algorithm, Limit, Quota};

/// How one algorithm's state is written and read back.
pub(super) trait Persisted: Kept {
    /// The fewest bytes one state takes (a sliding log's count alone).
    const MIN_BYTES: usize;
    fn write(state: &Self::State, out: &mut Vec<u8>);
    /// A state written by [`Persisted::write`] under `quota`, checked; an
    /// error names the byte the identity's entry starts at, `at`.
    fn read(input: &mut Reader<'_>, at: usize, quota: &Quota) -> Result<Self::State, Corruption>;
}

/// The last window number a decision can write under `quota`.
fn last_window(quota: &Quota) -> u64 {
    MAX_TIME_MS / quota.window_ms()
}

/// `Ok` when `ok`, else `what` as the error found at byte `at`.
fn check(input: &Reader<'_>, at: usize, ok: bool, what: impl FnOnce() -> String) -> Result<(), Corruption> {
    if ok {
        Ok(())
    } else {
        Err(input.invalid(at, what()))
    }
}

impl Persisted for SlidingWindowCounter {
    const MIN_BYTES: usize = 24;
    fn write(s: &sliding_window_counter::State, out: &mut Vec<u8>) {
        for n in [s.window, s.cur, s.prev] {
            put_u64(out, n);
        }
    }
    fn read(
        input: &mut Reader<'_>,
        at: usize,
        quota: &Quota,
    ) -> Result<sliding_window_counter::State, Corruption> {
        let (window, cur, prev) = (input.u64("window")?, input.u64("cur")?, input.u64("prev")?);
        let limit = quota.permits();
        check(input, at, cur <= limit && prev <= limit, || {
            format!("counts {cur} and {prev} above the limit {limit}")
        })?;
        check(input, at, window <= last_window(quota), || format!("window {window} past the year 9999"))?;
        Ok(sliding_window_counter::State { window, cur, prev })
    }
}

impl Persisted for FixedWindow {
    const MIN_BYTES: usize = 16;
    fn write(s: &fixed_window::State, out: &mut Vec<u8>) {
        put_u64(out, s.window);
        put_u64(out, s.count);
    }
    fn read(input: &mut Reader<'_>, at: usize, quota: &Quota) -> Result<fixed_window::State, Corruption> {
        let (window, count) = (input.u64("window")?, input.u64("count")?);
        let limit = quota.permits();
        check(input, at, count <= limit, || format!("count {count} above the limit {limit}"))?;
        check(input, at, window <= last_window(quota), || format!("window {window} past the year 9999"))?;
        Ok(fixed_window::State { window, count })
    }
}

impl Persisted for TokenBucket {
    const MIN_BYTES: usize = 16;
    fn write(s: &token_bucket::State, out: &mut Vec<u8>) {
        put_u64(out, s.used);
        put_u64(out, s.last_ms);
    }
    fn read(input: &mut Reader<'_>, at: usize, quota: &Quota) -> Result<token_bucket::State, Corruption> {
        let (used, last_ms) = (input.u64("used")?, input.u64("last_ms")?);
        // The quota keeps permits × window within 2^53.
        let capacity = quota.permits() * quota.window_ms();
        check(input, at, used <= capacity, || format!("{used} units used, above the bucket's {capacity}"))?;
        check(input, at, last_ms <= MAX_TIME_MS, || format!("time {last_ms} ms past the year 9999"))?;
        Ok(token_bucket::State { used, last_ms })
    }
}

impl Persisted for Gcra {
    const MIN_BYTES: usize = 16;
    fn write(s: &gcra::State, out: &mut Vec<u8>) {
        put_u64(out, s.tat_ms);
        put_u64(out, s.frac);
    }
    fn read(input: &mut Reader<'_>, at: usize, quota: &Quota) -> Result<gcra::State, Corruption> {
        let (tat_ms, frac) = (input.u64("tat_ms")?, input.u64("frac")?);
        let limit = quota.permits();
        check(input, at, frac < limit, || format!("fraction {frac} not below the limit {limit}"))?;
        // A decision at the last time moves the TAT at most one window on.
        let last = MAX_TIME_MS + quota.window_ms();
        check(input, at, tat_ms <= last, || format!("time {tat_ms} ms past the year 9999"))?;
        Ok(gcra::State { tat_ms, frac })
    }
}

impl Persisted for SlidingLog {
    const MIN_BYTES: usize = 8;
    fn write(log: &sliding_log::Log, out: &mut Vec<u8>) {
        put_u64(out, log.entries().len() as u64);
        for t in log.entries() {
            put_u64(out, t);
        }
    }
    fn read(input: &mut Reader<'_>, at: usize, quota: &Quota) -> Result<sliding_log::Log, Corruption> {
        let n = input.count(8, "the log's length")?;
        let limit = quota.permits();
        check(input, at, n as u64 <= limit, || format!("{n} entries in a log of limit {limit}"))?;
        let mut entries = VecDeque::with_capacity(n);
        for _ in 0..n {
            let t = input.u64("an admission time")?;
            check(input, at, t <= MAX_TIME_MS, || format!("time {t} ms past the year 9999"))?;
            check(input, at, entries.back().is_none_or(|&last| last <= t), || {
                "a log out of order".to_owned()
            })?;
            entries.push_back(t);
        }
        Ok(sliding_log::Log::from_entries(entries))
    }
}

/// The limit of a table record: a known algorithm, a valid quota, and a
/// limit the store would decide under.
fn read_limit(input: &mut Reader<'_>) -> Result<Limit, Corruption> {
    let at = input.at();
    let index = input.u8("the algorithm")?;
    let permits = input.u64("the limit")?;
    let window_ms = input.u64("the window")?;
    let algorithm = *Algorithm::ALL.get(usize::from(index)).ok_or_else(|| {
        input.invalid(at, format!("algorithm {index}: this build knows {}", Algorithm::ALL.len()))
    })?;
    let quota = Quota::new(permits, Duration::from_millis(window_ms))
        .map_err(|e| input.invalid(at, format!("quota {permits} per {window_ms} ms: {e}")))?;
    let limit = Limit::new(algorithm, quota);
    check_charge(&limit, 0).map_err(|e| input.invalid(at, e.to_string()))?;
    Ok(limit)
}

/// `(id, state)` pairs read from a record, before they are checked for idleness.
fn read_pairs<A: Persisted>(
    input: &mut Reader<'_>,
    quota: &Quota,
) -> Result<Vec<(u64, A::State)>, Corruption> {
    let n = input.count(8 + A::MIN_BYTES, "the state count")?;
    let mut states = Vec::with_capacity(n);
    for _ in 0..n {
        let at = input.at();
        let id = input.u64("an identity")?;
        if id & 1 == 0 {
            return Err(input.invalid(at, format!("identity {id:#x}: stored ids are odd")));
        }
        let state = A::read(input, at, quota)?;
        states.push((id, state));
    }
    Ok(states)
}

/// The states of one record, by algorithm.
macro_rules! snapshot_states {
    ($($variant:ident => $module:ident),* $(,)?) => {
        /// One table record's states, read and checked.
        pub(super) enum Restored {
            $($variant(Vec<(u64, <$variant as Definition>::State)>),)*
        }

        /// Appends `table`'s record (kind excluded): its limit, then every
        /// state it holds.
        pub(super) fn write_table(table: &Table, out: &mut Vec<u8>) {
            let limit = table.limit;
            let index = Algorithm::ALL.iter().position(|a| *a == limit.algorithm).unwrap_or_default();
            out.push(index as u8);
            put_u64(out, limit.quota.permits());
            put_u64(out, limit.quota.window_ms());
            let count_at = out.len();
            put_u64(out, 0);
            let mut count = 0u64;
            match &table.states {
                $(States::$variant(t) => t.for_each_state(|id, state| {
                    put_u64(out, id);
                    <$variant as Persisted>::write(state, out);
                    count += 1;
                }),)*
            }
            out[count_at..count_at + 8].copy_from_slice(&count.to_le_bytes());
        }

        /// A table record (after its kind): its limit and states.
        pub(super) fn read_table(input: &mut Reader<'_>) -> Result<(Limit, Restored), Corruption> {
            let limit = read_limit(input)?;
            let restored = match limit.algorithm {
                $(Algorithm::$variant => Restored::$variant(read_pairs::<$variant>(input, &limit.quota)?),)*
            };
            Ok((limit, restored))
        }

        impl Restored {
            /// How many states the record holds.
            pub(super) fn len(&self) -> usize {
                match self {
                    $(Self::$variant(states) => states.len(),)*
                }
            }

            /// Splits the states by the shard `shard_of` their id picks,
            /// dropping those idle at `now`.
            pub(super) fn by_shard(self, quota: &Quota, now: u64, shards: usize, shard_of: impl Fn(u64) -> usize) -> Vec<Restored> {
                match self {
                    $(Self::$variant(states) => {
                        let mut split: Vec<Vec<_>> = (0..shards).map(|_| Vec::new()).collect();
                        for (id, state) in states {
                            if !<$variant as Definition>::is_idle(&state, now, quota) {
                                split[shard_of(id)].push((id, state));
                            }
                        }
                        split.into_iter().map(Self::$variant).collect()
                    })*
                }
            }

            /// Adds the states to `table`, the table of their limit.
            pub(super) fn restore_into(self, table: &mut Table, now: u64) {
                match (self, &mut table.states) {
                    $((Self::$variant(states), States::$variant(t)) => t.restore(now, states),)*
                    // The table of a limit runs the limit's algorithm.
                    _ => unreachable!("a table restored under another algorithm"),
                }
            }
        }
    };
}

for_each_algorithm!(snapshot_states);
