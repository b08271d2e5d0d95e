//! The sliding log's table: one log of permit times per identity, in a map
//! keyed by the identity's hash.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::hot;
use super::tables::LimitTable;
use crate::algorithm::sliding_log;
use crate::{Decision, Quota};

/// A sliding-log table is not swept before it holds this many identities.
const MIN_SWEEP: usize = 1024;

/// Hashes a key that already is a keyed hash: passes it through.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// The sliding logs of one limit, keyed by identity hash.
pub(super) struct Logs {
    quota: Quota,
    map: HashMap<u64, sliding_log::Log, BuildHasherDefault<Prehashed>>,
    sweep_at: usize,
}

impl Logs {
    fn sweep(&mut self, now: u64) {
        self.map.retain(|_, log| !sliding_log::is_idle(log, now, &self.quota));
        if self.map.len() * 4 <= self.map.capacity() {
            self.map.shrink_to_fit();
        }
    }
}

impl LimitTable for Logs {
    type State = sliding_log::Log;
    fn new(quota: Quota, _now: u64) -> Self {
        Self { quota, map: HashMap::default(), sweep_at: MIN_SWEEP }
    }

    fn decide(&mut self, id: u64, now: u64, cost: u64, commit: bool) -> Decision {
        let q = self.quota;
        let (decision, inserted) = match self.map.get_mut(&id) {
            Some(log) if commit => {
                let (next, decision) = sliding_log::decide(std::mem::take(log), now, cost, &q);
                *log = next;
                (decision, false)
            }
            Some(log) => (sliding_log::check(log, now, cost, &q), false),
            None => {
                let (log, decision) = sliding_log::decide(sliding_log::Log::default(), now, cost, &q);
                let insert = commit && decision.allowed && cost > 0;
                if insert {
                    self.map.insert(id, log);
                }
                (decision, insert)
            }
        };
        if inserted && self.map.len() >= self.sweep_at {
            self.sweep(now);
            self.sweep_at = (self.map.len() * 2).max(MIN_SWEEP);
        }
        decision
    }

    fn shrink(&mut self, now: u64) {
        self.sweep(now);
        self.map.shrink_to_fit();
        self.sweep_at = (self.map.len() * 2).max(MIN_SWEEP);
    }

    fn len(&self) -> usize {
        self.map.len()
    }
    // Decided under the shard's lock only: nothing to hold, no handle.
    fn hold(&mut self, _id: u64, _now: u64) {}
    fn release(&mut self) {}
    fn handle(&self, _id: u64) -> Option<hot::Handle> {
        None
    }
    // Never leased: each permit is a timestamp.
    fn give_back(&mut self, _id: u64, _now: u64, _window: u64, _unused: u64) -> u64 {
        0
    }
    fn for_each_state(&self, mut each: impl FnMut(u64, &sliding_log::Log)) {
        for (&id, log) in &self.map {
            each(id, log);
        }
    }
    fn restore(&mut self, _now: u64, states: Vec<(u64, sliding_log::Log)>) {
        self.map.reserve(states.len());
        for (id, log) in states {
            self.map.entry(id).or_insert(log);
        }
        self.sweep_at = (self.map.len() * 2).max(MIN_SWEEP);
    }
}
