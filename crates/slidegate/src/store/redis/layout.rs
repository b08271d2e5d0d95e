//! How a [`RedisStore`](crate::RedisStore) lays its state out in Redis: a key
//! per identity and limit, or identities packed as fields of shared hashes.
//!
//! Redis spends at least ~128 B on any key that expires (the key's string,
//! its dictionary entry, its entry in the expiry table, the value's object),
//! whatever the 12 bytes of state it holds. The packed layout keeps the
//! sliding window counter's and the fixed window's counts as fields of
//! per-window hashes, one hash per *bucket* of identities, limit and window:
//!
//! ```text
//! <prefix>{<bucket tag>}:swc:<limit>:<window_ms>:<window number>
//!     field: 8 bytes of the identity's place hash   value: its counts
//! ```
//!
//! A small hash is stored as a *listpack*, a flat array with no per-entry
//! pointers, no per-entry TTL and one key's overhead shared by every
//! identity in it: an identity costs its field (10 bytes) and value (2–5
//! bytes) in each window it is counted in. The price is that Redis finds
//! a field by scanning the listpack, so the hashes are kept small: the
//! bucket count is chosen from the identities expected ([`Layout::packed_for`]),
//! [`IDENTITIES_PER_BUCKET`] to a bucket on average. A deployment that
//! outgrows its bucket count keeps working, each decision scanning longer
//! hashes, until a hash passes Redis's `hash-max-listpack-entries` (512 by
//! default) and Redis converts it to a hash table (O(1) lookups, ~62 B a
//! field), still below a key per identity; raising the bucket count (each
//! identity then starts afresh once) brings short listpacks back.
//!
//! Each hash holds one window and expires, as one key, when every count in
//! it stops mattering: a sliding window counter's window at the end of the
//! next window, a fixed window's at its own end. Nothing is ever left
//! without a TTL, and identities that go idle leave with their window.
//!
//! The bucket tags spread the buckets over Redis Cluster's 16,384 slots,
//! one bucket to a slot while there are no more buckets than slots (see
//! [`Buckets`]); every key of one identity carries its bucket's tag, so its
//! limits, penalty box and crawl breadth stay in one slot and one script
//! decides them all or nothing.
//!
//! The other algorithms (sliding log, token bucket, GCRA) keep a key per
//! identity, tagged with the bucket; so do the penalty box and crawl breadth.
//!
//! The field is 64 bits of a hash of the identity; the bucket is chosen by
//! other bits of it. Two identities share counts only when both collide: at
//! a million identities, a chance in about 10^12 (see [`Place`]).

use std::fmt;
use std::sync::{Arc, LazyLock, Mutex};

use crate::{Algorithm, Identity};

/// Identities a bucket holds on average at the expected count. Redis finds
/// a field by scanning the listpack, so each field scanned costs every
/// decision (~11 ns a field and lookup here); each hash costs its key's
/// overhead (~200 B), shared by the identities in it. 32 is the measured
/// knee (BENCHMARKS.md, "The packed layout"): about 35 B per identity for
/// the sliding window counter at 1.2× a key's CPU, and the fullest of
/// 32,768 buckets holds 57 fields at a million identities (the mean plus
/// about 4.5 standard deviations), far below Redis's default
/// `hash-max-listpack-entries` (512).
pub const IDENTITIES_PER_BUCKET: u64 = 32;

/// The most buckets a packed layout has.
pub const MAX_BUCKETS: u32 = 1 << 18;

/// Redis Cluster's hash slots.
const SLOTS: u32 = 16_384;

/// Where a [`RedisStore`](crate::RedisStore) keeps its state (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Layout {
    /// One key per identity and limit: `<prefix>{<identity>}:<alg>:<limit>:<window_ms>`.
    #[default]
    PerKey,
    /// The sliding window counter's and the fixed window's counts as
    /// fields of per-window hashes, one per bucket of identities.
    Packed(Buckets),
}

impl Layout {
    /// The packed layout sized for `identities` identities counted at once
    /// under one limit: [`IDENTITIES_PER_BUCKET`] to a bucket, rounded up
    /// to a power of two (at most [`MAX_BUCKETS`], at least 1).
    pub fn packed_for(identities: u64) -> Self {
        let wanted = identities.div_ceil(IDENTITIES_PER_BUCKET).clamp(1, u64::from(MAX_BUCKETS));
        let buckets = u32::try_from(wanted.next_power_of_two()).unwrap_or(MAX_BUCKETS);
        Layout::Packed(Buckets::new(buckets).unwrap_or(Buckets(MAX_BUCKETS)))
    }

    /// The layout's name in configuration files: `per_key` or `packed`.
    pub fn name(self) -> &'static str {
        match self {
            Layout::PerKey => "per_key",
            Layout::Packed(_) => "packed",
        }
    }

    /// Whether this layout packs `algorithm`'s state into shared hashes.
    pub fn packs(self, algorithm: Algorithm) -> bool {
        matches!(self, Layout::Packed(_)) && packable(algorithm)
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Layout::PerKey => f.write_str("per_key"),
            Layout::Packed(buckets) => write!(f, "packed ({} buckets)", buckets.get()),
        }
    }
}

/// Whether the packed layout packs `algorithm`: the window counts, not the
/// sliding log's sorted set nor the token bucket's and GCRA's timestamps.
pub(super) fn packable(algorithm: Algorithm) -> bool {
    matches!(algorithm, Algorithm::SlidingWindowCounter | Algorithm::FixedWindow)
}

/// A packed layout's bucket count: a power of two from 1 to [`MAX_BUCKETS`].
///
/// Every process deciding for the same identities must use the same count:
/// with another, an identity's counts are looked for in another bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buckets(u32);

impl Buckets {
    /// `count` buckets, or `None` unless it is a power of two from 1 to [`MAX_BUCKETS`].
    pub fn new(count: u32) -> Option<Self> {
        (count.is_power_of_two() && count <= MAX_BUCKETS).then_some(Self(count))
    }

    /// The number of buckets.
    pub fn get(self) -> u32 {
        self.0
    }
}

/// Where an identity's packed state lives: its bucket and its field.
///
/// Both come from one BLAKE3 hash of the identity's parts (scope, source,
/// digest), the same in every process and version: the bucket from its
/// first 64 bits, the field from the next 64. Two identities share a field
/// only if they fall in the same bucket and their fields are equal: for n
/// identities about n² / 2^65 pairs, one in 3.7 × 10^7 at a million (a
/// shared field counts both identities' requests together, so it can only
/// deny earlier, never admit more).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// The bucket, below the bucket count.
    pub bucket: u32,
    /// The field in the bucket's hashes.
    pub field: [u8; 8],
}

impl Place {
    /// The place of `identity` among `buckets`.
    pub fn of(identity: &Identity, buckets: Buckets) -> Self {
        let mut hasher = blake3::Hasher::new();
        let scope = identity.scope().as_bytes();
        // Length-prefixed, so that no two (scope, source) pairs hash alike.
        hasher.update(&(scope.len() as u64).to_le_bytes());
        hasher.update(scope);
        hasher.update(identity.source().tag().as_bytes());
        hasher.update(&[0]);
        hasher.update(&identity.digest().0);
        let hash = hasher.finalize();
        let bytes = hash.as_bytes();
        let mut high = [0u8; 8];
        high.copy_from_slice(&bytes[..8]);
        let mut field = [0u8; 8];
        field.copy_from_slice(&bytes[8..16]);
        Place { bucket: (u64::from_le_bytes(high) & u64::from(buckets.0 - 1)) as u32, field }
    }
}

/// The hash tags of every bucket of a bucket count.
///
/// Bucket `b`'s tag is `<b>.<n>`, with `n` the smallest number that puts it
/// in a Redis Cluster slot holding fewer buckets than any other would
/// (one bucket to a slot up to 16,384 buckets, then an even share), tried
/// in bucket order: a deterministic table, the same in every process, built
/// once per bucket count (some hundred thousand CRC16s, a few ms).
#[derive(Debug)]
pub(super) struct Tags {
    /// `n` per bucket.
    salts: Box<[u32]>,
}

impl Tags {
    /// The table for `buckets`, shared by every store that uses the count.
    pub(super) fn of(buckets: Buckets) -> Arc<Tags> {
        /// The tables built so far, by bucket count (a process uses one or two).
        type Built = Vec<(u32, Arc<Tags>)>;
        static TABLES: LazyLock<Mutex<Built>> = LazyLock::new(Mutex::default);
        let mut tables = TABLES.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((_, tags)) = tables.iter().find(|(count, _)| *count == buckets.0) {
            return Arc::clone(tags);
        }
        let tags = Arc::new(Tags::build(buckets.0));
        tables.push((buckets.0, Arc::clone(&tags)));
        tags
    }

    fn build(buckets: u32) -> Tags {
        let per_slot = buckets.div_ceil(SLOTS);
        let mut taken = vec![0u32; SLOTS as usize];
        let mut text = String::new();
        let salts = (0..buckets)
            .map(|bucket| {
                (0u32..)
                    .find(|salt| {
                        text.clear();
                        std::fmt::Write::write_fmt(&mut text, format_args!("{bucket}.{salt}"))
                            .expect("writing to a String");
                        let slot = &mut taken[usize::from(slot(text.as_bytes()))];
                        let free = *slot < per_slot;
                        if free {
                            *slot += 1;
                        }
                        free
                    })
                    .expect("some salt reaches a free slot")
            })
            .collect();
        Tags { salts }
    }

    /// Bucket `bucket`'s tag, written without its braces.
    pub(super) fn tag(&self, bucket: u32) -> BucketTag {
        BucketTag { bucket, salt: self.salts[bucket as usize] }
    }
}

/// A bucket's hash tag, `<bucket>.<salt>`.
#[derive(Debug, Clone, Copy)]
pub(super) struct BucketTag {
    bucket: u32,
    salt: u32,
}

impl fmt::Display for BucketTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.bucket, self.salt)
    }
}

/// The Redis Cluster slot of a hash tag: CRC16 (XMODEM) modulo 16,384, as
/// Redis's `keyHashSlot`.
pub(super) fn slot(tag: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in tag {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc % SLOTS as u16
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::{Digest, Source};

    #[test]
    fn slots_are_redis_cluster_slots() {
        // CRC16/XMODEM's check value, and slots `CLUSTER KEYSLOT` gives.
        let crc = |t: &[u8]| slot(t) as u32;
        assert_eq!(crc(b"123456789"), 0x31c3 % SLOTS);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"bar"), 5061);
        assert_eq!(slot(b"user1000"), 3443);
    }

    #[test]
    fn bucket_counts_follow_the_expected_identities() {
        let count = |n| match Layout::packed_for(n) {
            Layout::Packed(b) => b.get(),
            Layout::PerKey => 0,
        };
        assert_eq!(count(0), 1);
        assert_eq!(count(32), 1);
        assert_eq!(count(33), 2);
        assert_eq!(count(1_000), 32);
        assert_eq!(count(100_000), 4096);
        assert_eq!(count(1_000_000), 32_768);
        assert_eq!(count(u64::MAX), MAX_BUCKETS);
        assert_eq!(Buckets::new(3), None);
        assert_eq!(Buckets::new(0), None);
        assert_eq!(Buckets::new(MAX_BUCKETS * 2), None);
    }

    #[test]
    fn every_bucket_has_its_own_slot_up_to_the_slot_count() {
        for count in [1u32, 16, 1024, SLOTS] {
            let tags = Tags::build(count);
            let slots: HashSet<u16> = (0..count).map(|b| slot(tags.tag(b).to_string().as_bytes())).collect();
            assert_eq!(slots.len(), count as usize, "{count} buckets");
        }
        // Past it, an even share: 4 buckets to every slot.
        let count = SLOTS * 4;
        let tags = Tags::build(count);
        let mut per_slot = vec![0u32; SLOTS as usize];
        for b in 0..count {
            per_slot[usize::from(slot(tags.tag(b).to_string().as_bytes()))] += 1;
        }
        assert!(per_slot.iter().all(|n| *n == 4));
    }

    #[test]
    fn tags_are_the_same_in_every_process() {
        // Part of the layout: a change would move every identity.
        let tags = Tags::build(SLOTS);
        let first: Vec<String> = (0..4).map(|b| tags.tag(b).to_string()).collect();
        assert_eq!(first, ["0.0", "1.0", "2.0", "3.0"]);
        let place = Place::of(&Identity::new("api", Source::ApiKey, Digest([0xab; 16])), Buckets(SLOTS));
        assert_eq!(
            place,
            Place::of(&Identity::new("api", Source::ApiKey, Digest([0xab; 16])), Buckets(SLOTS))
        );
        let other = Place::of(&Identity::new("api", Source::Ip, Digest([0xab; 16])), Buckets(SLOTS));
        assert_ne!(place.field, other.field);
        let scoped = Place::of(&Identity::new("ap", Source::ApiKey, Digest([0xab; 16])), Buckets(SLOTS));
        assert_ne!(place.field, scoped.field);
    }

    /// A million identities over the default bucket count for them: no two
    /// share a place, every bucket stays a listpack, and the slots and the
    /// masters of a 3-master Cluster get their share (printed with
    /// `--nocapture` for BENCHMARKS.md).
    #[test]
    fn a_million_identities_spread_evenly_over_buckets_and_slots() {
        let n = 1_000_000u32;
        let Layout::Packed(buckets) = Layout::packed_for(u64::from(n)) else { panic!("packed") };
        let tags = Tags::build(buckets.get());
        let slot_of: Vec<u16> =
            (0..buckets.get()).map(|b| slot(tags.tag(b).to_string().as_bytes())).collect();
        let mut per_bucket = vec![0u32; buckets.get() as usize];
        let mut per_slot = vec![0u32; SLOTS as usize];
        let mut fields = HashSet::new();
        for i in 0..n {
            let mut digest = [0u8; 16];
            digest[..4].copy_from_slice(&i.to_le_bytes());
            let place = Place::of(&Identity::new("api", Source::ApiKey, Digest(digest)), buckets);
            per_bucket[place.bucket as usize] += 1;
            per_slot[usize::from(slot_of[place.bucket as usize])] += 1;
            fields.insert((place.bucket, place.field));
        }
        assert_eq!(fields.len(), n as usize, "no two identities share a place");
        let heaviest_bucket = per_bucket.iter().copied().max().unwrap_or(0);
        assert!(heaviest_bucket < 80, "every bucket stays a listpack, with room: {heaviest_bucket}");
        let slot_mean = f64::from(n) / f64::from(SLOTS);
        let heaviest_slot = per_slot.iter().copied().max().unwrap_or(0);
        // Poisson(61): the heaviest of 16,384 about 4.5 deviations up.
        assert!(
            f64::from(heaviest_slot) <= 1.7 * slot_mean,
            "heaviest slot {heaviest_slot}, mean {slot_mean}"
        );
        let masters: Vec<u32> = [0..5461, 5461..10923, 10923..16384]
            .into_iter()
            .map(|range| per_slot[range].iter().sum())
            .collect();
        let master_mean = f64::from(n) / 3.0;
        let heaviest_master = f64::from(masters.iter().copied().max().unwrap_or(0));
        assert!(heaviest_master <= 1.01 * master_mean, "{masters:?}");
        println!(
            "{n} identities, {} buckets: heaviest bucket {heaviest_bucket} (mean {:.1}); heaviest slot \
             {heaviest_slot} = {:.2}x the mean {slot_mean:.1}; masters {masters:?} (heaviest {:.4}x the mean)",
            buckets.get(),
            f64::from(n) / f64::from(buckets.get()),
            f64::from(heaviest_slot) / slot_mean,
            heaviest_master / master_mean
        );
    }
}
