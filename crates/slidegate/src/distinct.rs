//! Counting distinct values per identity: the HyperLogLog of Redis's
//! `PFADD`/`PFCOUNT`, reimplemented from the published algorithms so the
//! embedded store estimates exactly what Redis estimates.
//!
//! - Hash: MurmurHash64A (Austin Appleby), seed `0xadc83b19`, blocks read
//!   little-endian, as Redis hashes `PFADD` elements on every platform.
//! - Registers: p = 14, so 2^14 = 16384 registers of 6 bits. The low 14 bits
//!   of the hash pick the register; the register keeps the maximum of
//!   "trailing zeros of the remaining 50 bits, plus one" (51 when they are all
//!   zero).
//! - Estimate: Otmar Ertl's improved raw estimator ("New cardinality
//!   estimation algorithms for HyperLogLog sketches", 2017, algorithm 6),
//!   which Redis uses since 5.0: a register histogram, the σ and τ
//!   corrections for empty and saturated registers, `α∞ m² / z` rounded.
//!   It needs no bias table and no switch to linear counting: σ makes small
//!   counts exact-ish (see the error table in `docs/serve.md`).
//!
//! Same hash, same registers, same floating-point operations in the same
//! order: the estimate of a set of values is bit-for-bit the one Redis gives
//! (a test with a real Redis compares them). Redis's sparse and dense
//! encodings only change how registers are stored, never the estimate.
//!
//! Memory: this store keeps a sparse list (4 bytes per non-empty register)
//! until it would outgrow the dense array (16384 bytes, one per register),
//! then switches. Redis's sparse encoding takes a few bytes per run of
//! registers and turns dense (12304 bytes) past 3000 bytes
//! (`hll-sparse-max-bytes`).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::{Decision, Identity, Quota};

/// log2 of the register count, as in Redis.
const P: u32 = 14;
/// Registers per sketch.
pub const REGISTERS: usize = 1 << P;
/// Bits of the hash left after the register index.
const Q: u32 = 64 - P;
/// MurmurHash64A's seed in Redis's `PFADD`.
const SEED: u64 = 0xadc8_3b19;
/// 1 / (2 ln 2): α for m → ∞.
const ALPHA_INF: f64 = 0.721_347_520_444_481_7;
/// Sparse entries past which the dense array is smaller.
const SPARSE_MAX: usize = REGISTERS / 4;

/// MurmurHash64A of `data` with `seed` (Austin Appleby, public domain).
pub fn murmur64a(data: &[u8], seed: u64) -> u64 {
    const M: u64 = 0xc6a4_a793_5bd1_e995;
    const R: u32 = 47;
    let mut h = seed ^ (data.len() as u64).wrapping_mul(M);
    let mut blocks = data.chunks_exact(8);
    for block in &mut blocks {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(block);
        let mut k = u64::from_le_bytes(bytes);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h ^= k;
        h = h.wrapping_mul(M);
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        for (i, byte) in tail.iter().enumerate() {
            h ^= u64::from(*byte) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> R;
    h = h.wrapping_mul(M);
    h ^= h >> R;
    h
}

/// The register `value` updates and the rank it offers it (1 to 51).
fn register_of(value: &[u8]) -> (usize, u8) {
    let hash = murmur64a(value, SEED);
    let index = (hash & (REGISTERS as u64 - 1)) as usize;
    // The sentinel bit bounds the rank at Q + 1 when the rest is all zeros.
    let rest = (hash >> P) | (1 << Q);
    (index, rest.trailing_zeros() as u8 + 1)
}

/// σ(x) of Ertl's estimator: the correction for the share `x` of empty registers.
fn sigma(mut x: f64) -> f64 {
    if x == 1.0 {
        return f64::INFINITY;
    }
    let mut y = 1.0;
    let mut z = x;
    loop {
        x *= x;
        let previous = z;
        z += x * y;
        y += y;
        // The series converges to the last bit: stop when a term adds nothing.
        if previous == z {
            return z;
        }
    }
}

/// τ(x) of Ertl's estimator: the correction for the share `x` of saturated registers.
fn tau(mut x: f64) -> f64 {
    if x == 0.0 || x == 1.0 {
        return 0.0;
    }
    let mut y = 1.0;
    let mut z = 1.0 - x;
    loop {
        x = x.sqrt();
        let previous = z;
        y *= 0.5;
        z -= (1.0 - x) * (1.0 - x) * y;
        if previous == z {
            return z / 3.0;
        }
    }
}

/// The estimate from a histogram of register values (`histogram[r]` registers hold `r`).
fn estimate(histogram: &[u32; Q as usize + 2]) -> u64 {
    let m = REGISTERS as f64;
    let q = Q as usize;
    let mut z = m * tau((m - f64::from(histogram[q + 1])) / m);
    for count in histogram[1..=q].iter().rev() {
        z += f64::from(*count);
        z *= 0.5;
    }
    z += m * sigma(f64::from(histogram[0]) / m);
    // Non-negative and far below 2^64 (at most ~m·2^51); an empty sketch
    // gives z = ∞ and so 0.
    (ALPHA_INF * m * m / z).round() as u64
}

/// The registers of one sketch: sparse while few are set.
#[derive(Debug, Clone)]
enum Registers {
    /// `(index << 8) | rank`, sorted by index: 4 bytes per non-empty register.
    Sparse(Vec<u32>),
    /// One byte per register.
    Dense(Box<[u8]>),
}

/// A HyperLogLog sketch estimating as Redis's `PFCOUNT` does.
///
/// ```
/// use slidegate::distinct::HyperLogLog;
///
/// let mut hll = HyperLogLog::new();
/// for id in 0..1000 {
///     hll.insert(format!("/api/videos/{id}").as_bytes());
/// }
/// let estimate = hll.count();
/// assert!((980..=1020).contains(&estimate), "{estimate}");
/// ```
#[derive(Debug, Clone)]
pub struct HyperLogLog {
    registers: Registers,
    /// The estimate until a register changes (Redis caches it too).
    cached: Option<u64>,
}

impl Default for HyperLogLog {
    fn default() -> Self {
        Self::new()
    }
}

impl HyperLogLog {
    /// An empty sketch.
    pub fn new() -> Self {
        Self { registers: Registers::Sparse(Vec::new()), cached: Some(0) }
    }

    /// Whether inserting `value` would change a register (`PFADD` would return 1).
    pub fn would_change(&self, value: &[u8]) -> bool {
        let (index, rank) = register_of(value);
        self.rank(index) < rank
    }

    fn rank(&self, index: usize) -> u8 {
        match &self.registers {
            Registers::Sparse(entries) => {
                match entries.binary_search_by_key(&index, |e| (*e >> 8) as usize) {
                    Ok(at) => (entries[at] & 0xff) as u8,
                    Err(_) => 0,
                }
            }
            Registers::Dense(registers) => registers[index],
        }
    }

    /// Adds `value`; whether a register changed (`PFADD`'s reply).
    pub fn insert(&mut self, value: &[u8]) -> bool {
        let (index, rank) = register_of(value);
        if self.rank(index) >= rank {
            return false;
        }
        self.cached = None;
        let entry = ((index as u32) << 8) | u32::from(rank);
        match &mut self.registers {
            Registers::Sparse(entries) => {
                match entries.binary_search_by_key(&index, |e| (*e >> 8) as usize) {
                    Ok(at) => entries[at] = entry,
                    Err(at) => entries.insert(at, entry),
                }
                if entries.len() > SPARSE_MAX {
                    let mut dense = vec![0u8; REGISTERS].into_boxed_slice();
                    for e in entries.iter() {
                        dense[(*e >> 8) as usize] = (*e & 0xff) as u8;
                    }
                    self.registers = Registers::Dense(dense);
                }
            }
            Registers::Dense(registers) => registers[index] = rank,
        }
        true
    }

    /// The estimated number of distinct values inserted (`PFCOUNT`).
    pub fn count(&mut self) -> u64 {
        if let Some(count) = self.cached {
            return count;
        }
        let mut histogram = [0u32; Q as usize + 2];
        match &self.registers {
            Registers::Sparse(entries) => {
                histogram[0] = (REGISTERS - entries.len()) as u32;
                for e in entries {
                    histogram[(*e & 0xff) as usize] += 1;
                }
            }
            Registers::Dense(registers) => {
                for r in registers.iter() {
                    histogram[*r as usize] += 1;
                }
            }
        }
        let count = estimate(&histogram);
        self.cached = Some(count);
        count
    }

    /// Bytes of register storage this sketch holds.
    pub fn bytes(&self) -> usize {
        match &self.registers {
            Registers::Sparse(entries) => entries.capacity() * 4,
            Registers::Dense(_) => REGISTERS,
        }
    }
}

/// The decision on one value under a distinct-values quota, given the
/// sketch of the current window (`None` when the window has none yet).
///
/// The rule both stores follow: a value is admitted when the sketch already
/// holds it (adding it changes no register, as `PFADD` returning 0 says), or
/// when the estimate of the values seen so far in this window is below the
/// quota's permits; only an admitted value is added. So a denial writes
/// nothing, and a re-visit of a value seen is always admitted.
pub(crate) fn decide(sketch: &mut HyperLogLog, quota: &Quota, now_ms: u64, value: &[u8]) -> Decision {
    let window = quota.window_ms();
    let reset_after = Duration::from_millis(window - now_ms % window);
    let limit = quota.permits();
    let before = sketch.count();
    let allowed = before < limit || !sketch.would_change(value);
    let count = if allowed && sketch.insert(value) { sketch.count() } else { before };
    Decision {
        allowed,
        limit,
        remaining: limit.saturating_sub(count),
        reset_after,
        retry_after: (!allowed).then_some(reset_after),
    }
}

/// Shards of the embedded store's sketches.
const SHARDS: usize = 16;

/// One identity's sketch and the window it counts.
#[derive(Debug)]
struct Entry {
    window: u64,
    sketch: HyperLogLog,
}

/// One shard of the sketches: `(identity, quota)` → the current window's sketch.
type Sketches = HashMap<(Identity, Quota), Entry>;

/// The embedded store's sketches.
#[derive(Debug)]
pub(crate) struct DistinctTable {
    shards: Box<[Mutex<Sketches>]>,
    hasher: std::hash::RandomState,
    /// The shard [`DistinctTable::sweep_step`] sweeps next.
    next_sweep: std::sync::atomic::AtomicUsize,
}

impl Default for DistinctTable {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: std::hash::RandomState::new(),
            next_sweep: std::sync::atomic::AtomicUsize::new(0),
        }
    }
}

impl DistinctTable {
    /// Decides `value` for `identity` under `quota` at `now_ms`; see [`decide`].
    pub(crate) fn decide(&self, identity: &Identity, quota: &Quota, now_ms: u64, value: &[u8]) -> Decision {
        let shard = (self.hasher.hash_one(identity) % SHARDS as u64) as usize;
        // A panic under the lock leaves whole entries: still sound.
        let mut map = self.shards[shard].lock().unwrap_or_else(PoisonError::into_inner);
        let window = now_ms / quota.window_ms();
        let entry = map
            .entry((identity.clone(), *quota))
            .or_insert_with(|| Entry { window, sketch: HyperLogLog::new() });
        // Window-aligned, as the Redis key's window number: a new window starts empty.
        if entry.window != window {
            *entry = Entry { window, sketch: HyperLogLog::new() };
        }
        decide(&mut entry.sketch, quota, now_ms, value)
    }

    /// Forgets the sketches of windows that ended; returns how many remain.
    pub(crate) fn sweep(&self, now_ms: u64) -> usize {
        self.shards.iter().map(|shard| Self::sweep_shard(shard, now_ms)).sum()
    }

    /// Sweeps the next `max_shards` shards (round-robin over calls), so a
    /// periodic caller's work per call stays a fraction of the table.
    pub(crate) fn sweep_step(&self, now_ms: u64, max_shards: usize) {
        let count = self.shards.len();
        let steps = max_shards.min(count);
        let first = self.next_sweep.fetch_add(steps, std::sync::atomic::Ordering::Relaxed) % count;
        for i in 0..steps {
            Self::sweep_shard(&self.shards[(first + i) % count], now_ms);
        }
    }

    fn sweep_shard(shard: &Mutex<Sketches>, now_ms: u64) -> usize {
        let mut map = shard.lock().unwrap_or_else(PoisonError::into_inner);
        map.retain(|(_, quota), entry| entry.window == now_ms / quota.window_ms());
        map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur64a_hashes_every_tail_length() {
        // That it is Redis's hash is checked against a real Redis in
        // tests/distinct.rs (equal PFCOUNTs for 1 to 100k values).
        assert_eq!(murmur64a(b"", 0), 0);
        assert_ne!(murmur64a(b"a", SEED), murmur64a(b"b", SEED));
        // Tails of every length hash differently from their prefixes.
        let data = b"0123456789abcdef";
        let hashes: std::collections::HashSet<u64> = (0..=16).map(|n| murmur64a(&data[..n], SEED)).collect();
        assert_eq!(hashes.len(), 17);
    }

    #[test]
    fn an_empty_sketch_counts_zero_and_one_value_counts_one() {
        let mut hll = HyperLogLog::new();
        assert_eq!(hll.count(), 0);
        assert!(hll.insert(b"/a"));
        assert!(!hll.insert(b"/a"));
        assert_eq!(hll.count(), 1);
    }

    #[test]
    fn sparse_and_dense_registers_estimate_alike() {
        let mut hll = HyperLogLog::new();
        for i in 0..20_000u32 {
            hll.insert(&i.to_le_bytes());
        }
        assert!(matches!(hll.registers, Registers::Dense(_)));
        let n = hll.count() as f64;
        assert!((n - 20_000.0).abs() / 20_000.0 < 0.03, "{n}");
    }

    #[test]
    fn a_value_seen_is_admitted_at_the_limit_and_a_new_one_denied() {
        let quota = Quota::new(3, Duration::from_secs(10)).unwrap();
        let mut hll = HyperLogLog::new();
        for v in [b"a", b"b", b"c"] {
            assert!(decide(&mut hll, &quota, 1_000, v).allowed);
        }
        let denied = decide(&mut hll, &quota, 1_000, b"d");
        assert!(!denied.allowed);
        assert_eq!(denied.retry_after, Some(Duration::from_millis(9_000)));
        assert_eq!(denied.remaining, 0);
        assert!(decide(&mut hll, &quota, 1_000, b"b").allowed);
        assert_eq!(hll.count(), 3, "a denial adds nothing");
    }

    #[test]
    fn sketches_of_ended_windows_are_swept() {
        let quota = Quota::new(3, Duration::from_secs(10)).unwrap();
        let table = DistinctTable::default();
        for i in 0..100u32 {
            table.decide(&Identity::named("t", &format!("id{i}")), &quota, 1_000, b"/a");
        }
        assert_eq!(table.sweep(9_999), 100);
        table.sweep_step(10_000, SHARDS);
        assert_eq!(table.sweep(10_000), 0);
    }
}
