//! How each algorithm's state is kept in a table slot.
//!
//! The algorithms' states use `u64` fields so every quota is exact, but for
//! the window-based algorithms most of those bits are always zero: counters
//! never exceed the limit, and a state older than two windows is as good as
//! none. So the sliding window counter's `(window, cur, prev)` and the fixed
//! window's `(window, count)` are packed into one `u64` whenever the limit
//! leaves at least 16 bits for the window number: the counters take exactly
//! the bits the limit needs, and the window number is kept modulo `2^k`.
//!
//! Unpacking restores the full window number as the one nearest to a
//! reference time, which is exact while the state's window is less than
//! `2^(k−1)` windows from it. The table makes that hold by taking its last
//! sweep as the reference and sweeping again before a decision more than
//! `2^(k−2)` windows later ([`Packing::horizon_ms`]): every state it holds
//! was written between one window before the last sweep (a survivor) and one
//! horizon after it. The algorithm then runs on the restored state, so
//! decisions are identical to the unpacked ones.

use std::marker::PhantomData;

use crate::algorithm::fixed_window::{self, FixedWindow};
use crate::algorithm::sliding_window_counter::{self, SlidingWindowCounter};
use crate::algorithm::Definition;
use crate::Quota;

/// How one algorithm's states, under one quota, are stored in table slots.
pub(crate) trait Packing: Copy {
    /// The algorithm whose states are packed; they must be plain values.
    type Algorithm: Definition<State: Copy>;
    /// What a slot holds.
    type Packed: Copy + Default;
    /// The packing for `quota`, or `None` when the quota leaves it no room.
    fn new(quota: Quota) -> Option<Self>;
    /// The quota the states are decided under.
    fn quota(&self) -> &Quota;
    fn pack(&self, state: State<Self>) -> Self::Packed;
    /// What [`Packing::unpack`] needs to know about the reference time
    /// `at_ms`, computed once per sweep rather than once per decision.
    fn reference(&self, at_ms: u64) -> u64;
    /// The state `packed` holds, for a state written near the time `reference` describes.
    fn unpack(&self, packed: Self::Packed, reference: u64) -> State<Self>;
    /// The table must sweep idle states at least this often for [`Packing::unpack`] to be exact.
    fn horizon_ms(&self) -> u64;
}

/// The state type a packing packs.
pub(crate) type State<P> = <<P as Packing>::Algorithm as Definition>::State;

/// The state as it is, for algorithms whose state has no spare bits.
pub(crate) struct Plain<A> {
    quota: Quota,
    algorithm: PhantomData<fn() -> A>,
}

impl<A> Plain<A> {
    /// States of `A` under `quota`, stored as they are.
    pub(crate) fn of(quota: Quota) -> Self {
        Self { quota, algorithm: PhantomData }
    }
}

// Derived impls would require `A: Clone`; the algorithm is only a marker.
impl<A> Clone for Plain<A> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<A> Copy for Plain<A> {}

impl<A: Definition<State: Copy>> Packing for Plain<A> {
    type Algorithm = A;
    type Packed = A::State;
    fn new(quota: Quota) -> Option<Self> {
        Some(Self::of(quota))
    }
    #[inline]
    fn quota(&self) -> &Quota {
        &self.quota
    }
    #[inline]
    fn pack(&self, state: A::State) -> A::State {
        state
    }
    fn reference(&self, _at_ms: u64) -> u64 {
        0
    }
    #[inline]
    fn unpack(&self, packed: A::State, _reference: u64) -> A::State {
        packed
    }
    fn horizon_ms(&self) -> u64 {
        u64::MAX
    }
}

/// The fewest window bits a packed state keeps; below this, states stay plain.
const MIN_WINDOW_BITS: u32 = 16;

/// A window number kept modulo `2^bits`.
#[derive(Clone, Copy)]
struct WindowBits {
    window_ms: u64,
    bits: u32,
}

impl WindowBits {
    fn mask(&self) -> u64 {
        u64::MAX >> (64 - self.bits)
    }

    fn truncate(&self, window: u64) -> u64 {
        window & self.mask()
    }

    /// The window number congruent to `truncated` nearest to window `current`.
    #[inline]
    fn restore(&self, truncated: u64, current: u64) -> u64 {
        let behind = current.wrapping_sub(truncated) & self.mask();
        // Sign-extend the k-bit distance: a state may also be slightly ahead.
        let behind = ((behind << (64 - self.bits)) as i64 >> (64 - self.bits)) as u64;
        current.wrapping_sub(behind)
    }

    fn horizon_ms(&self) -> u64 {
        (1u64 << (self.bits - 2)).saturating_mul(self.window_ms)
    }
}

/// Bits needed to hold every count from 0 to `limit`.
fn count_bits(limit: u64) -> u32 {
    64 - limit.leading_zeros()
}

/// The sliding window counter in one `u64`: `window mod 2^k | cur | prev`.
#[derive(Clone, Copy)]
pub(crate) struct PackedCounter {
    quota: Quota,
    window: WindowBits,
    count_bits: u32,
}

impl Packing for PackedCounter {
    type Algorithm = SlidingWindowCounter;
    type Packed = u64;
    /// `None` when the limit leaves too few window bits.
    fn new(quota: Quota) -> Option<Self> {
        let count_bits = count_bits(quota.permits());
        let bits = 64u32.saturating_sub(2 * count_bits);
        (bits >= MIN_WINDOW_BITS).then_some(Self {
            quota,
            window: WindowBits { window_ms: quota.window_ms(), bits },
            count_bits,
        })
    }
    #[inline]
    fn quota(&self) -> &Quota {
        &self.quota
    }
    #[inline]
    fn pack(&self, s: sliding_window_counter::State) -> u64 {
        let b = self.count_bits;
        (self.window.truncate(s.window) << (2 * b)) | (s.cur << b) | s.prev
    }
    fn reference(&self, at_ms: u64) -> u64 {
        at_ms / self.window.window_ms
    }
    #[inline]
    fn unpack(&self, packed: u64, reference: u64) -> sliding_window_counter::State {
        let b = self.count_bits;
        let counter = u64::MAX >> (64 - b);
        sliding_window_counter::State {
            window: self.window.restore(packed >> (2 * b), reference),
            cur: (packed >> b) & counter,
            prev: packed & counter,
        }
    }
    fn horizon_ms(&self) -> u64 {
        self.window.horizon_ms()
    }
}

/// The fixed window in one `u64`: `window mod 2^k | count`.
#[derive(Clone, Copy)]
pub(crate) struct PackedFixed {
    quota: Quota,
    window: WindowBits,
    count_bits: u32,
}

impl Packing for PackedFixed {
    type Algorithm = FixedWindow;
    type Packed = u64;
    /// `None` when the limit leaves too few window bits.
    fn new(quota: Quota) -> Option<Self> {
        let count_bits = count_bits(quota.permits());
        let bits = 64u32.saturating_sub(count_bits);
        (bits >= MIN_WINDOW_BITS).then_some(Self {
            quota,
            window: WindowBits { window_ms: quota.window_ms(), bits },
            count_bits,
        })
    }
    #[inline]
    fn quota(&self) -> &Quota {
        &self.quota
    }
    #[inline]
    fn pack(&self, s: fixed_window::State) -> u64 {
        (self.window.truncate(s.window) << self.count_bits) | s.count
    }
    fn reference(&self, at_ms: u64) -> u64 {
        at_ms / self.window.window_ms
    }
    #[inline]
    fn unpack(&self, packed: u64, reference: u64) -> fixed_window::State {
        let b = self.count_bits;
        fixed_window::State {
            window: self.window.restore(packed >> b, reference),
            count: packed & (u64::MAX >> (64 - b)),
        }
    }
    fn horizon_ms(&self) -> u64 {
        self.window.horizon_ms()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn counter_states_round_trip_near_the_current_window() {
        let q = Quota::new(100, Duration::from_millis(1000)).unwrap();
        let p = PackedCounter::new(q).unwrap();
        assert_eq!(p.count_bits, 7);
        let now = 1_700_000_000_500;
        let w = now / 1000;
        for window in [w - 5, w - 1, w, w + 3] {
            let s = sliding_window_counter::State { window, cur: 100, prev: 37 };
            assert_eq!(p.unpack(p.pack(s), p.reference(now)), s);
        }
    }

    #[test]
    fn restores_across_the_modulus_with_few_window_bits() {
        let wb = WindowBits { window_ms: 1, bits: 16 };
        for current in [0u64, 1, 65_535, 65_536, 65_537, 1 << 40] {
            for back in [0u64, 1, 2, 100, 16_384] {
                if let Some(window) = current.checked_sub(back) {
                    assert_eq!(wb.restore(wb.truncate(window), current), window, "{current} − {back}");
                }
            }
            assert_eq!(wb.restore(wb.truncate(current + 3), current), current + 3);
        }
        assert_eq!(wb.horizon_ms(), 16_384);
    }

    #[test]
    fn large_limits_stay_plain() {
        let q = Quota::new(1 << 24, Duration::from_millis(1000)).unwrap();
        assert!(PackedCounter::new(q).is_none());
        assert!(PackedFixed::new(q).is_some());
        let q = Quota::new((1 << 24) - 1, Duration::from_millis(1000)).unwrap();
        assert!(PackedCounter::new(q).is_some());
    }
}
