//! The penalty box: an identity denied more than `after` times within
//! `within` is blocked for `block`, doubling for each repeat offence up to
//! `max_block`.
//!
//! The state lives next to the identity's limits in the store (in Redis, one
//! hash `<prefix>{identity}:penalty` in the identity's slot), so every
//! instance sharing the store honours a block. This module is the arithmetic
//! both stores run: [`PenaltyState`] here, mirrored line for line in
//! `store/redis/penalty.lua`.
//!
//! - The denial count is a fixed window that starts at the first denial
//!   (`denials_until = now + within`) and starts over once it has passed.
//! - A block ends at `now + d`, with `d = min(block × 2^(strikes − 1),
//!   max_block)`; the strike count is forgotten `max_block` after the block
//!   it caused ends, so a client that behaves for that long starts over.
//! - While blocked the limits are not decided and nothing is charged or
//!   counted: a block is a denial, and denials are never charged.

use std::time::Duration;

use thiserror::Error;

use crate::{Charge, Decision};

/// Every policy's denial while an identity is blocked for `wait`: no permit
/// left, back (and retry) when the block ends. A block covers every cost:
/// unlike a limit's denial, a smaller request does not fit sooner.
///
/// The store keeps the block, so every instance sharing it refuses the
/// identity; the deny cache (`protect`) keeps it locally until it ends, so a
/// blocked identity costs no store call per request. Under a limit with a
/// penalty the deny cache answers blocks only, not the limits' own denials:
/// the store must count each denial to know when to block. So an abusive
/// identity costs at most `after + 1` store calls per `within` before its
/// block, then none until the block ends.
pub fn block_denials(charges: &[Charge], wait: Duration) -> Vec<Decision> {
    charges
        .iter()
        .map(|c| Decision {
            allowed: false,
            limit: c.limit.quota.permits(),
            remaining: 0,
            reset_after: wait,
            retry_after: Some(wait),
        })
        .collect()
}

/// The largest duration a penalty accepts (about 34 years, in ms): every
/// sum of two stays far below 2^53, so the Lua doubles stay exact.
pub const MAX_PENALTY_MS: u64 = 1 << 40;

/// When an identity goes to the penalty box, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Penalty {
    after: u64,
    within_ms: u64,
    block_ms: u64,
    max_block_ms: u64,
}

/// Why a [`Penalty`] cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PenaltyError {
    /// A duration is zero or above [`MAX_PENALTY_MS`].
    #[error("penalty {name} must be from 1 ms to {MAX_PENALTY_MS} ms, got {ms} ms")]
    Duration {
        /// Which duration.
        name: &'static str,
        /// Its value in ms.
        ms: u64,
    },
    /// `max_block` is shorter than `block`.
    #[error("penalty max_block ({max_block_ms} ms) is shorter than block ({block_ms} ms)")]
    MaxBelowBlock {
        /// `block` in ms.
        block_ms: u64,
        /// `max_block` in ms.
        max_block_ms: u64,
    },
    /// `after` is 0 (every denial would be a block: the limit's own
    /// denial never shows), or above 2^32 (no window sees that many denials).
    #[error("penalty after must be from 1 to 4294967296 (the denials tolerated before a block), got {0}")]
    After(u64),
}

impl Penalty {
    /// Blocks an identity denied more than `after` times within `within` for
    /// `block`, doubled per repeat offence up to `max_block`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use slidegate::Penalty;
    ///
    /// let p = Penalty::new(20, Duration::from_secs(60), Duration::from_secs(600), Duration::from_secs(86_400))?;
    /// assert_eq!(p.block_for(1), Duration::from_secs(600));
    /// assert_eq!(p.block_for(2), Duration::from_secs(1_200));
    /// assert_eq!(p.block_for(99), Duration::from_secs(86_400));
    /// # Ok::<(), slidegate::PenaltyError>(())
    /// ```
    ///
    /// # Errors
    /// [`PenaltyError`] for a zero or huge duration, or `max_block < block`.
    pub fn new(
        after: u64,
        within: Duration,
        block: Duration,
        max_block: Duration,
    ) -> Result<Self, PenaltyError> {
        let ms = |name, d: Duration| {
            let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
            if ms == 0 || ms > MAX_PENALTY_MS {
                return Err(PenaltyError::Duration { name, ms });
            }
            Ok(ms)
        };
        let (within_ms, block_ms, max_block_ms) =
            (ms("within", within)?, ms("block", block)?, ms("max_block", max_block)?);
        if max_block_ms < block_ms {
            return Err(PenaltyError::MaxBelowBlock { block_ms, max_block_ms });
        }
        if after == 0 || after > 1 << 32 {
            return Err(PenaltyError::After(after));
        }
        Ok(Self { after, within_ms, block_ms, max_block_ms })
    }

    /// Denials allowed within `within` before the next one blocks.
    pub fn after(&self) -> u64 {
        self.after
    }

    /// The window of the denial count, in ms.
    pub fn within_ms(&self) -> u64 {
        self.within_ms
    }

    /// The first block, in ms.
    pub fn block_ms(&self) -> u64 {
        self.block_ms
    }

    /// The longest block, in ms.
    pub fn max_block_ms(&self) -> u64 {
        self.max_block_ms
    }

    /// How long the `strike`-th block in a row lasts (the first is 1).
    pub fn block_for(&self, strike: u64) -> Duration {
        Duration::from_millis(self.block_ms_for(strike))
    }

    fn block_ms_for(&self, strike: u64) -> u64 {
        // Doubling stops at the cap, so the loop runs at most ~40 times.
        let mut d = self.block_ms;
        for _ in 1..strike {
            if d >= self.max_block_ms {
                break;
            }
            d = d.saturating_mul(2);
        }
        d.min(self.max_block_ms)
    }
}

/// One identity's penalty state: times in the store's ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PenaltyState {
    /// Denials counted in the current window.
    pub denials: u64,
    /// When the denial window ends (0: none open).
    pub denials_until: u64,
    /// When the block ends (0 or past: not blocked).
    pub block_until: u64,
    /// Blocks in a row.
    pub strikes: u64,
    /// When the strike count is forgotten.
    pub strikes_until: u64,
}

impl PenaltyState {
    /// How long the identity stays blocked at `now`, if it is.
    pub fn blocked_for(&self, now: u64) -> Option<u64> {
        (self.block_until > now).then(|| self.block_until - now)
    }

    /// Counts one denial at `now`; returns the block it starts, in ms.
    pub fn deny(&mut self, penalty: &Penalty, now: u64) -> Option<u64> {
        if self.denials_until <= now {
            self.denials = 0;
            self.denials_until = now + penalty.within_ms;
        }
        self.denials += 1;
        if self.denials <= penalty.after {
            return None;
        }
        if self.strikes_until <= now {
            self.strikes = 0;
        }
        self.strikes += 1;
        let d = penalty.block_ms_for(self.strikes);
        self.block_until = now + d;
        self.strikes_until = now + d + penalty.max_block_ms;
        self.denials = 0;
        self.denials_until = 0;
        Some(d)
    }

    /// Whether the state changes no decision any more (it may be forgotten).
    pub fn is_idle(&self, now: u64) -> bool {
        self.denials_until <= now && self.block_until <= now && self.strikes_until <= now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn penalty() -> Penalty {
        Penalty::new(2, Duration::from_millis(1_000), Duration::from_millis(100), Duration::from_millis(350))
            .unwrap()
    }

    #[test]
    fn blocks_after_more_than_after_denials_within_the_window() {
        let p = penalty();
        let mut s = PenaltyState::default();
        assert_eq!(s.deny(&p, 10), None);
        assert_eq!(s.deny(&p, 20), None);
        assert_eq!(s.deny(&p, 30), Some(100));
        assert_eq!(s.blocked_for(30), Some(100));
        assert_eq!(s.blocked_for(129), Some(1));
        assert_eq!(s.blocked_for(130), None);
    }

    #[test]
    fn the_window_starts_over() {
        let p = penalty();
        let mut s = PenaltyState::default();
        s.deny(&p, 0);
        s.deny(&p, 999);
        assert_eq!(s.deny(&p, 1_000), None, "the window of the first denial ended at 1000");
    }

    #[test]
    fn repeat_offenders_double_up_to_the_cap_and_are_forgiven_later() {
        let p = penalty();
        let mut s = PenaltyState::default();
        let mut now = 0;
        let mut blocks = Vec::new();
        for _ in 0..4 {
            let block = (0..3).find_map(|_| s.deny(&p, now)).unwrap();
            blocks.push(block);
            now += block;
        }
        assert_eq!(blocks, [100, 200, 350, 350]);
        now += 350;
        assert!(s.is_idle(now));
        assert_eq!((0..3).find_map(|_| s.deny(&p, now)), Some(100), "forgiven after max_block");
    }

    #[test]
    fn rejects_nonsense() {
        let ms = Duration::from_millis;
        assert!(Penalty::new(1, ms(0), ms(1), ms(1)).is_err());
        assert!(Penalty::new(1, ms(1), ms(2), ms(1)).is_err());
        assert!(Penalty::new(1, ms(1), ms(1), ms(MAX_PENALTY_MS + 1)).is_err());
    }
}
