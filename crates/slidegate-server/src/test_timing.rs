//! How long a test's own thread works, for the tests that compare how work
//! grows with its size: wall-clock time also counts the time other tests
//! and processes keep the cores from it, which made such ratios flaky on a
//! busy 2-core machine.

use std::time::{Duration, Instant};

/// The least time one run of `f` took on the calling thread's CPU, over
/// three measurements (Linux's `/proc/thread-self/schedstat`, whose count
/// moves at scheduler ticks: each measurement repeats `f` until the thread
/// has worked 100 ms, and divides; wall time where it cannot be read).
/// What `f` returns is dropped after the clock stops.
pub(crate) fn fastest<T>(mut f: impl FnMut() -> T) -> Duration {
    const ENOUGH: Duration = Duration::from_millis(100);
    (0..3)
        .map(|_| {
            let (cpu, wall) = (on_cpu(), Instant::now());
            let mut runs = 0u32;
            loop {
                let kept = f();
                runs += 1;
                let took = match (cpu, on_cpu()) {
                    (Some(before), Some(after)) => after.saturating_sub(before),
                    _ => wall.elapsed(),
                };
                drop(kept);
                if took >= ENOUGH || wall.elapsed() >= ENOUGH * 100 {
                    return took / runs;
                }
            }
        })
        .min()
        .unwrap_or_default()
}

/// The calling thread's time on a CPU so far.
fn on_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    stat.split_whitespace().next()?.parse().ok().map(Duration::from_nanos)
}
