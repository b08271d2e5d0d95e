//! Gives the heap's free pages back to the system while `serve` runs.
//!
//! glibc's allocator returns freed memory to the system only from the top
//! of each arena; what a burst of connections freed in between stays in
//! the process. Measured (BENCHMARKS.md, "Memory after connections
//! close"): 10,000 keep-alive connections to the hook, each asked once,
//! took `serve` from 22 MB to 219 MB, and after all of them closed it was
//! still 219 MB; a second round reached 283 MB. It was not a leak: calling
//! `malloc_trim(0)` in the process brought it back to 24 MB both times,
//! and `MALLOC_ARENA_MAX=1` changed nothing (the free memory is inside
//! arenas, not in extra ones). Other allocators kept more: mimalloc 0.1
//! (as the global allocator) 70 MB and then 350 MB two seconds after the
//! closes, Debian's jemalloc 5.3 (preloaded, default decay) 132 MB and
//! 158 MB seven seconds after; glibc with a trim on a timer came back to
//! within 2 MB of the start, with no new dependency.
//!
//! So a thread of its own calls `malloc_trim(0)` every [`TRIM_INTERVAL`]:
//! it walks each arena and hands its free whole pages back (`madvise`),
//! taking each arena's lock only while it walks that arena. Measured:
//! 14–52 µs idle, about 150 µs with 10,000 connections held, 33 ms for
//! the one call that gives back what they freed (a thread allocating from
//! an arena being walked waits that long, once).

use std::time::{Duration, Instant};

/// How often the free pages are given back: the longest that memory freed
/// by closed connections stays counted in the process's RSS.
pub const TRIM_INTERVAL: Duration = Duration::from_secs(5);

/// Starts the trimming thread (on glibc; elsewhere nothing to do).
pub fn spawn() {
    if !cfg!(all(target_os = "linux", target_env = "gnu")) {
        return;
    }
    let started = std::thread::Builder::new().name("slidegate-heap-trim".into()).spawn(|| loop {
        std::thread::sleep(TRIM_INTERVAL);
        let start = Instant::now();
        let released = trim();
        tracing::trace!(released, took_us = start.elapsed().as_micros(), "heap trimmed");
    });
    if let Err(err) = started {
        tracing::warn!(%err, "cannot start the heap trimming thread: freed memory stays in the process");
    }
}

/// Whether glibc gave memory back.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn trim() -> bool {
    // SAFETY: `malloc_trim` takes no pointer and only works under the
    // allocator's own locks; any thread may call it at any time.
    unsafe { libc::malloc_trim(0) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() -> bool {
    false
}
