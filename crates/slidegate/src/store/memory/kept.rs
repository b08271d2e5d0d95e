//! Which table the embedded store keeps each algorithm's states in
//! ([`Kept`]), and the per-limit [`Table`] that dispatches to it, generated
//! from `for_each_algorithm!`.

use super::counter_table::CounterTable;
use super::hot;
use super::logs::Logs;
use super::packing::PackedFixed;
use super::tables::{Keyed, LimitTable, PackedTable, PlainTable};
use crate::algorithm::fixed_window::FixedWindow;
use crate::algorithm::gcra::Gcra;
use crate::algorithm::sliding_log::SlidingLog;
use crate::algorithm::sliding_window_counter::SlidingWindowCounter;
use crate::algorithm::token_bucket::TokenBucket;
use crate::algorithm::{for_each_algorithm, Definition};
use crate::{Algorithm, Decision, Limit};

/// What the embedded store keeps per algorithm: the kind of table for its
/// states. Implemented here for each algorithm's unit type, so the
/// algorithms know nothing of the store; the table of [`States`] is built
/// from `for_each_algorithm!` through this trait, and an algorithm without
/// an implementation is a compile error.
pub(super) trait Kept: Definition {
    /// How the states of one limit under the algorithm are kept.
    type Table: LimitTable<State = Self::State>;
}

impl Kept for SlidingWindowCounter {
    type Table = PackedTable<CounterTable>;
}

impl Kept for FixedWindow {
    type Table = PackedTable<Keyed<PackedFixed>>;
}

impl Kept for SlidingLog {
    type Table = Logs;
}

impl Kept for TokenBucket {
    type Table = PlainTable<Self>;
}

impl Kept for Gcra {
    type Table = PlainTable<Self>;
}

/// The states of one limit, in the table its algorithm is [`Kept`] in.
macro_rules! memory_states {
    ($($variant:ident => $module:ident),* $(,)?) => {
        pub(super) enum States {
            $($variant(<crate::algorithm::$module::$variant as Kept>::Table),)*
        }

        impl States {
            pub(super) fn new(limit: &Limit, now: u64) -> Self {
                match limit.algorithm {
                    $(Algorithm::$variant => Self::$variant(LimitTable::new(limit.quota, now)),)*
                }
            }

            #[inline]
            pub(super) fn decide(&mut self, id: u64, now: u64, cost: u64, commit: bool) -> Decision {
                match self {
                    $(Self::$variant(t) => t.decide(id, now, cost, commit),)*
                }
            }

            pub(super) fn shrink(&mut self, now: u64) {
                match self {
                    $(Self::$variant(t) => t.shrink(now),)*
                }
            }

            pub(super) fn len(&self) -> usize {
                match self {
                    $(Self::$variant(t) => t.len(),)*
                }
            }

            pub(super) fn hold(&mut self, id: u64, now: u64) {
                match self {
                    $(Self::$variant(t) => t.hold(id, now),)*
                }
            }

            pub(super) fn release(&mut self) {
                match self {
                    $(Self::$variant(t) => t.release(),)*
                }
            }

            pub(super) fn handle(&self, id: u64) -> Option<hot::Handle> {
                match self {
                    $(Self::$variant(t) => t.handle(id),)*
                }
            }

            pub(super) fn give_back(&mut self, id: u64, now: u64, window: u64, unused: u64) -> u64 {
                match self {
                    $(Self::$variant(t) => LimitTable::give_back(t, id, now, window, unused),)*
                }
            }
        }
    };
}

for_each_algorithm!(memory_states);

pub(super) struct Table {
    pub(super) limit: Limit,
    pub(super) states: States,
}

impl Table {
    pub(super) fn new(limit: Limit, now: u64) -> Self {
        Self { limit, states: States::new(&limit, now) }
    }

    /// Decides `cost` for identity `id`; charges it only when `commit`.
    #[inline]
    pub(super) fn decide(&mut self, id: u64, now: u64, cost: u64, commit: bool) -> Decision {
        self.states.decide(id, now, cost, commit)
    }

    /// Forgets every identity whose state no longer matters and gives back
    /// the memory the rest does not need.
    pub(super) fn shrink(&mut self, now: u64) {
        self.states.shrink(now);
    }

    pub(super) fn len(&self) -> usize {
        self.states.len()
    }
}
