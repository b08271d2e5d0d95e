//! [`Slots`]: the permits of the upstream pool, one per open connection,
//! handed to waiting requests by how little their clients hold.
//!
//! tokio's `Semaphore` serves waiters in arrival order, so a client with
//! many requests queued is served before a newcomer that came after them.
//! Here a freed slot goes to the waiting request whose client had the fewest
//! requests forwarded when it began to wait (arrival order among equals):
//! a client holding nothing is served before clients holding many. A waiter
//! that gives up (its wait ends, or its request is dropped) leaves the queue
//! at once, and a slot granted to it in that instant is handed on.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;

/// The slots of one upstream, shared by every worker thread.
#[derive(Debug)]
pub(crate) struct Slots {
    state: Mutex<State>,
    /// How many requests wait, written under the lock: read without it by
    /// each connection coming back to an idle pool (see [`Slots::awaited`]).
    waiting: AtomicUsize,
}

#[derive(Debug)]
struct State {
    /// Slots nobody holds; never above 0 while a request waits.
    free: usize,
    /// Waiting requests by (their client's holding, arrival).
    waiting: BTreeMap<(usize, u64), oneshot::Sender<()>>,
    arrivals: u64,
}

/// One slot, given back when dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    slots: Arc<Slots>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut state = self.slots.lock();
        state.release();
        self.slots.waiting.store(state.waiting.len(), Ordering::Relaxed);
    }
}

impl Slots {
    /// `max` slots, all free.
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State { free: max, waiting: BTreeMap::new(), arrivals: 0 }),
            waiting: AtomicUsize::new(0),
        })
    }

    /// Whether a request waits for a slot: a connection that would go back
    /// to an idle pool is better closed, so that its slot serves the waiter
    /// (a waiter waits for a slot, not for an idle connection).
    pub(crate) fn awaited(&self) -> bool {
        self.waiting.load(Ordering::Relaxed) > 0
    }

    /// A slot for a request whose client has `held` requests forwarded
    /// (this one included), waiting up to `wait` for one; `None` when none
    /// came in time.
    pub(crate) async fn acquire(self: &Arc<Self>, held: usize, wait: Duration) -> Option<Slot> {
        let (sender, receiver) = oneshot::channel();
        let key = {
            let mut state = self.lock();
            if state.free > 0 {
                state.free -= 1;
                return Some(Slot { slots: Arc::clone(self) });
            }
            state.arrivals += 1;
            let key = (held, state.arrivals);
            state.waiting.insert(key, sender);
            self.waiting.store(state.waiting.len(), Ordering::Relaxed);
            key
        };
        let mut waiter = Waiter { slots: self, key, receiver };
        if let Ok(Ok(())) = tokio::time::timeout(wait, &mut waiter.receiver).await {
            return Some(Slot { slots: Arc::clone(self) });
        }
        // Out of time; a slot may have been granted in that very instant
        // (it is sent under the lock, so it is there once the lock is ours).
        let mut state = self.lock();
        let granted = state.waiting.remove(&key).is_none() && waiter.receiver.try_recv().is_ok();
        self.waiting.store(state.waiting.len(), Ordering::Relaxed);
        granted.then(|| Slot { slots: Arc::clone(self) })
    }

    /// The slots free now.
    #[cfg(test)]
    fn free(&self) -> usize {
        self.lock().free
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl State {
    /// Gives a slot to the first waiter still waiting, or frees it.
    fn release(&mut self) {
        while let Some((_, waiter)) = self.waiting.pop_first() {
            if waiter.send(()).is_ok() {
                return;
            }
        }
        self.free += 1;
    }
}

/// A request in the queue: leaves it when dropped (its request dropped
/// while waiting), handing on a slot granted to it meanwhile.
struct Waiter<'a> {
    slots: &'a Slots,
    key: (usize, u64),
    receiver: oneshot::Receiver<()>,
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let mut state = self.slots.lock();
        if state.waiting.remove(&self.key).is_none() && self.receiver.try_recv().is_ok() {
            state.release();
        }
        self.slots.waiting.store(state.waiting.len(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_secs(1);

    #[tokio::test(start_paused = true)]
    async fn a_freed_slot_goes_to_the_waiter_whose_client_holds_least() {
        let slots = Slots::new(1);
        let first = slots.acquire(1, WAIT).await.unwrap();
        assert_eq!(slots.free(), 0);
        // Three requests wait: clients holding 5, 1 and 3 (in this order).
        let waiters: Vec<_> = [5, 1, 3]
            .into_iter()
            .map(|held| {
                let slots = Arc::clone(&slots);
                tokio::spawn(async move { (held, slots.acquire(held, WAIT).await) })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(slots.awaited());
        drop(first);
        tokio::time::sleep(Duration::from_millis(10)).await;
        // The one holding least got it; then, freed again, the next least.
        let mut waiters = waiters.into_iter();
        let (held_5, held_1, held_3) =
            (waiters.next().unwrap(), waiters.next().unwrap(), waiters.next().unwrap());
        assert!(held_1.is_finished() && !held_5.is_finished() && !held_3.is_finished());
        drop(held_1.await.unwrap().1.unwrap());
        tokio::time::sleep(Duration::from_millis(10)).await;
        let (held, slot) = held_3.await.unwrap();
        assert_eq!(held, 3);
        // The last one's wait ends without a slot; the pool has its slot back.
        assert!(held_5.await.unwrap().1.is_none());
        assert!(!slots.awaited());
        drop(slot);
        assert_eq!(slots.free(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_dropped_while_waiting_leaves_the_queue() {
        let slots = Slots::new(1);
        let held = slots.acquire(1, WAIT).await.unwrap();
        let gone = {
            let slots = Arc::clone(&slots);
            tokio::spawn(async move { slots.acquire(1, WAIT).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        gone.abort();
        let _ = gone.await;
        assert_eq!(slots.lock().waiting.len(), 0);
        assert!(!slots.awaited());
        // Its slot is not lost: the next request takes it at once.
        drop(held);
        assert_eq!(slots.free(), 1);
        assert!(slots.acquire(1, Duration::ZERO).await.is_some());
    }
}
