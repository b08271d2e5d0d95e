//! Heap accounting for `demo`'s memory experiment: what a store holds per
//! identity, counted at the allocator.
//!
//! The binary's global allocator is the system's behind a switch: it counts
//! only while a [`HeapCount`] is alive, and only `demo` makes one. Every
//! other command (`serve` above all) pays one relaxed read of a flag that
//! nothing writes while it runs, a cache line every core keeps shared, and
//! not the read-modify-write of one counter that every allocating thread
//! would pull from the others' caches.
//!
//! While counting, every allocation adds its requested size and every free
//! subtracts it, whichever thread makes it and whenever the block was
//! allocated, so a count's figure is exactly what an always-on counter
//! (such as `cap::Cap`) gives between the same two
//! points.
//!
//! Why a switch rather than the alternatives: a cargo feature picks per
//! build, and `demo` and `serve` are one binary (`cargo run -- demo` must
//! print the figures, and a default build must not count for `serve`); a
//! separate measuring binary is not built by `cargo run -- demo`; the
//! allocator's own statistics (glibc's `mallinfo2`, jemalloc's
//! `stats.allocated`) include chunk headers and size classes, so the
//! figures would change, and jemalloc would change `serve`'s allocator too.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};

/// The system allocator, counting while a [`HeapCount`] is alive.
pub struct CountingAllocator;

/// How many [`HeapCount`]s are alive: counting is on while this is not 0.
static COUNTS_ALIVE: AtomicUsize = AtomicUsize::new(0);
/// Bytes allocated minus bytes freed while counting was on.
static NET_BYTES: AtomicIsize = AtomicIsize::new(0);

impl CountingAllocator {
    #[inline]
    fn record(delta: isize) {
        if COUNTS_ALIVE.load(Ordering::Relaxed) != 0 {
            NET_BYTES.fetch_add(delta, Ordering::Relaxed);
        }
    }
}

/// A size as a signed delta; no allocation exceeds `isize::MAX` bytes.
#[inline]
fn signed(size: usize) -> isize {
    isize::try_from(size).unwrap_or(isize::MAX)
}

// SAFETY: every call is forwarded unchanged to `System`, which upholds the
// `GlobalAlloc` contract; the accounting around it touches two atomics and
// never allocates.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for CountingAllocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's promises about `layout` are `System`'s.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            Self::record(signed(layout.size()));
        }
        ptr
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            Self::record(signed(layout.size()));
        }
        ptr
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, that is from `System`, with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        Self::record(-signed(layout.size()));
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from `System` with `layout`; the caller's
        // promises about `new_size` are `System`'s.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            Self::record(signed(new_size) - signed(layout.size()));
        }
        new
    }
}

/// Counts the heap bytes the process allocates and does not free from its
/// creation on, on every thread, until it is dropped.
pub struct HeapCount {
    start: isize,
}

impl HeapCount {
    /// Starts counting.
    pub fn start() -> Self {
        COUNTS_ALIVE.fetch_add(1, Ordering::SeqCst);
        Self { start: NET_BYTES.load(Ordering::SeqCst) }
    }

    /// Bytes allocated and not freed since [`HeapCount::start`] (0 if more was freed).
    pub fn bytes(&self) -> usize {
        usize::try_from(NET_BYTES.load(Ordering::SeqCst) - self.start).unwrap_or(0)
    }
}

impl Drop for HeapCount {
    fn drop(&mut self) {
        COUNTS_ALIVE.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::HeapCount;

    /// The count is process-wide, so the other tests of this binary,
    /// allocating and freeing on their own threads meanwhile (megabytes: the
    /// accuracy replays), move it too. The block is a GiB, zeroed, so the
    /// system maps it without touching a page, and each bound leaves a
    /// quarter of it for that noise.
    #[test]
    fn counts_what_is_allocated_and_kept() {
        const BLOCK: usize = 1 << 30;
        const NOISE: usize = BLOCK / 4;
        let count = HeapCount::start();
        let kept = std::hint::black_box(vec![0u8; BLOCK]);
        let held = count.bytes();
        assert!(held >= BLOCK - NOISE, "{held} B while a {BLOCK} B block is held");
        drop(kept);
        let after = count.bytes();
        assert!(after < NOISE, "{after} B after the {BLOCK} B block was freed");
    }
}
