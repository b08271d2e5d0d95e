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
//! reference window `R` (the table's last sweep), which is exact for the
//! windows `R − 2^(k−1) < window ≤ R + 2^(k−1)` ([`Packing::restores`]).
//! The invariant: a packed table holds only states in that range, whatever
//! the clock does, so the algorithm always runs on the state as written and
//! decisions are identical to the unpacked ones. It holds because:
//!
//! - The table decides only at times whose window is within `B = 2^(k−2)`
//!   windows of `R` (its [`Reach`], [`Packing::reach`]; one comparison per
//!   decision). Such a decision writes either the current window, in range,
//!   or leaves a state's window as it was: a state written later than the
//!   clock now reads is decided as at the start of its own window
//!   (`algorithm::skew_ms`) and keeps it.
//! - A sweep (as the table grows, or `evict_idle`) at a later time takes its
//!   own window as the new `R`: every state that survives it counts in that
//!   window or the one before, or was ahead of the old `R` by at most
//!   `2^(k−1)`, so it is ahead of the new `R` by less. A sweep at an
//!   earlier time keeps `R`.
//! - Before a decision outside its reach, forward or back, the table
//!   restores every state relative to the old `R` and repacks them relative
//!   to the window of the decision if they all fit. It forgets none: a
//!   plain table would not, and a state idle now counts again if the clock
//!   steps back before its window ends. When one does not fit — a state
//!   written before the clock stepped back more than `B` windows, or one
//!   left more than `2^(k−1)` windows behind by a jump forward — the table
//!   keeps its states plain (`tables.rs`) until a decision outside the
//!   reach of that moment, or a sweep, finds that they all fit again.
//!
//! So a packed table forgets a state exactly where a plain one does, when
//! it grows or is swept. The lock-free handles (`hot.rs`) only decide for
//! a state the table holds, before the end of its reach.

use std::marker::PhantomData;

use crate::algorithm::fixed_window::{self, FixedWindow};
use crate::algorithm::sliding_window_counter::{self, SlidingWindowCounter};
use crate::algorithm::Definition;
use crate::store::lease::GivesBack;
use crate::Quota;

/// How one algorithm's states, under one quota, are stored in table slots.
pub(crate) trait Packing: Copy {
    /// The algorithm whose states are packed; they must be plain values.
    type Algorithm: Definition<State: Copy> + GivesBack;
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
    /// The times at which a table referenced at `at_ms` may decide (see the module doc).
    fn reach(&self, at_ms: u64) -> Reach;
    /// Whether [`Packing::unpack`] restores `state` exactly relative to `reference`.
    fn restores(&self, state: State<Self>, reference: u64) -> bool {
        self.unpack(self.pack(state), reference) == state
    }
}

/// The times from `from_ms` for `span_ms` milliseconds: those at which a
/// table may decide without re-referencing its packed states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reach {
    from_ms: u64,
    span_ms: u64,
}

impl Reach {
    /// Every time a store decides at (they end before `u64::MAX`).
    const ALWAYS: Self = Self { from_ms: 0, span_ms: u64::MAX };

    /// Whether the table may decide at `now_ms`: one subtraction and one
    /// comparison on every decision, either way out of the reach.
    #[inline(always)]
    pub(crate) fn covers(&self, now_ms: u64) -> bool {
        now_ms.wrapping_sub(self.from_ms) < self.span_ms
    }

    /// The first time after the reach, when the table must sweep first.
    pub(crate) fn until_ms(&self) -> u64 {
        self.from_ms.saturating_add(self.span_ms)
    }
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

impl<A: Definition<State: Copy> + GivesBack> Packing for Plain<A> {
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
    fn reach(&self, _at_ms: u64) -> Reach {
        Reach::ALWAYS
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

    /// `B = 2^(k−2)` windows either side of the window of `at_ms`, ending
    /// `B` windows after `at_ms` itself.
    fn reach(&self, at_ms: u64) -> Reach {
        let b = 1u64 << (self.bits - 2);
        let from_ms = (at_ms / self.window_ms).saturating_sub(b).saturating_mul(self.window_ms);
        let until_ms = at_ms.saturating_add(b.saturating_mul(self.window_ms));
        Reach { from_ms, span_ms: until_ms - from_ms }
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
    fn reach(&self, at_ms: u64) -> Reach {
        self.window.reach(at_ms)
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
    fn reach(&self, at_ms: u64) -> Reach {
        self.window.reach(at_ms)
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
        let reach = wb.reach(100_000);
        assert_eq!((reach.from_ms, reach.until_ms()), (100_000 - 16_384, 100_000 + 16_384));
        assert!(!reach.covers(100_000 - 16_385) && reach.covers(100_000 - 16_384));
        assert!(reach.covers(100_000 + 16_383) && !reach.covers(100_000 + 16_384));
        assert_eq!(wb.reach(5).from_ms, 0, "no reach before time 0");
        let wide = WindowBits { window_ms: 1000, bits: 63 }.reach(1_700_000_000_000);
        assert_eq!((wide.from_ms, wide.until_ms()), (0, u64::MAX), "saturates");
    }

    #[test]
    fn restores_exactly_within_half_the_modulus() {
        let q = Quota::new(10_000_000, Duration::from_millis(3)).unwrap();
        let p = PackedCounter::new(q).unwrap();
        assert_eq!(p.window.bits, 16);
        let r = 1_000_000;
        let at = |window| sliding_window_counter::State { window, cur: 1, prev: 0 };
        assert!(p.restores(at(r + (1 << 15)), r) && !p.restores(at(r + (1 << 15) + 1), r));
        assert!(p.restores(at(r - (1 << 15) + 1), r) && !p.restores(at(r - (1 << 15)), r));
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
