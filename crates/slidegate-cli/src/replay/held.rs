//! The requests a rule's `delay` holds during a replay, on the simulated
//! clock: each waits for the time it is decided again, bounded as `serve`
//! bounds them (per identity under a rule, and `max_delayed` over all).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use http::HeaderMap;
use slidegate_http::offenders::IdentityHash;

use super::access_log::Entry;

/// A request held: what to ask again, and since when.
pub struct Held {
    /// When it is decided again (simulated ms).
    pub due_ms: u64,
    /// When it was first decided.
    pub since_ms: u64,
    /// Decisions taken after the first.
    pub decisions: u32,
    /// The rule's number.
    pub rule: usize,
    pub identity: IdentityHash,
    pub entry: Entry,
    pub headers: HeaderMap,
}

/// The held requests, soonest first; memory is what is held, at most the cap.
pub struct Holds {
    cap: u32,
    due: BinaryHeap<Reverse<(u64, u64)>>,
    waiting: HashMap<u64, Held>,
    per_identity: HashMap<(usize, IdentityHash), u32>,
    next_seq: u64,
}

impl Holds {
    /// Room for `cap` held at once.
    pub fn new(cap: u32) -> Self {
        Self {
            cap,
            due: BinaryHeap::new(),
            waiting: HashMap::new(),
            per_identity: HashMap::new(),
            next_seq: 0,
        }
    }

    /// Holds `held` if its identity has fewer than `per_identity` held under
    /// its rule and the cap is not reached; whether it did.
    pub fn hold(&mut self, held: Held, per_identity: u32) -> bool {
        let count = self.per_identity.get(&(held.rule, held.identity)).copied().unwrap_or(0);
        if count >= per_identity || self.waiting.len() >= self.cap as usize {
            return false;
        }
        self.per_identity.insert((held.rule, held.identity), count + 1);
        self.push(held);
        true
    }

    /// Puts back a request taken with [`Holds::take_due`] that waits again:
    /// it keeps the place it had.
    pub fn hold_again(&mut self, held: Held) {
        *self.per_identity.entry((held.rule, held.identity)).or_default() += 1;
        self.push(held);
    }

    fn push(&mut self, held: Held) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.due.push(Reverse((held.due_ms, seq)));
        self.waiting.insert(seq, held);
    }

    /// The soonest request due at or before `until_ms`, taken out (its
    /// places freed), in order of time and then of holding.
    pub fn take_due(&mut self, until_ms: u64) -> Option<Held> {
        let Reverse((due, seq)) = *self.due.peek()?;
        if due > until_ms {
            return None;
        }
        self.due.pop();
        let held = self.waiting.remove(&seq)?;
        let key = (held.rule, held.identity);
        match self.per_identity.get_mut(&key) {
            Some(n) if *n > 1 => *n -= 1,
            _ => {
                self.per_identity.remove(&key);
            }
        }
        Some(held)
    }
}
