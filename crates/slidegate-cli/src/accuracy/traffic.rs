//! Synthetic traffic: thousands of sources in four classes, deterministic
//! for a seed.

use std::fmt;

/// How a source behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    /// Poisson arrivals at 10–70% of the limit: should never be limited.
    Steady,
    /// Poisson arrivals at 85–115% of the limit: decided at the edge all the time.
    NearLimit,
    /// Silent for a while, then 0.5–2.5× the limit within 0.5–10 s.
    BurstyScraper,
    /// The limit in the last second before a window boundary and again in
    /// the first second after it: the fixed window's blind spot.
    BoundaryAttacker,
}

impl Class {
    /// Every class, in report order.
    pub const ALL: [Class; 4] =
        [Class::Steady, Class::NearLimit, Class::BurstyScraper, Class::BoundaryAttacker];

    /// The name in JSON and charts.
    pub fn name(self) -> &'static str {
        match self {
            Class::Steady => "steady",
            Class::NearLimit => "near_limit",
            Class::BurstyScraper => "bursty_scraper",
            Class::BoundaryAttacker => "boundary_attacker",
        }
    }

    /// The class of source `i` of `n`: 55% steady, 25% near the limit, 12%
    /// bursty, 8% boundary attackers, interleaved so any prefix is mixed.
    fn of(i: usize) -> Class {
        match i % 100 {
            0..=54 => Class::Steady,
            55..=79 => Class::NearLimit,
            80..=91 => Class::BurstyScraper,
            _ => Class::BoundaryAttacker,
        }
    }

    /// Expected requests per window, in limits, used to size the time span.
    fn mean_load(self) -> f64 {
        match self {
            Class::Steady => 0.4,
            Class::NearLimit => 1.0,
            Class::BurstyScraper => 0.55,
            Class::BoundaryAttacker => 0.8,
        }
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One request: when, and from which source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Request {
    /// Milliseconds since the epoch.
    pub at_ms: u64,
    /// Index into [`Traffic::classes`].
    pub source: u32,
}

/// A replayable trace: requests in time order and each source's class.
pub struct Traffic {
    /// Requests ordered by time (ties by source).
    pub requests: Vec<Request>,
    /// The class of each source.
    pub classes: Vec<Class>,
}

/// Generates `requests` requests from `sources` sources under a limit of
/// `limit` per `window_ms`. The same arguments give the same trace.
pub fn generate(requests: usize, sources: usize, limit: u64, window_ms: u64, seed: u64) -> Traffic {
    let sources = sources.max(1);
    let classes: Vec<Class> = (0..sources).map(Class::of).collect();
    let load: f64 = classes.iter().map(|c| c.mean_load()).sum::<f64>() * limit as f64;
    // Long enough for about 10% more than asked; the trace is cut at `requests`.
    let windows = (requests as f64 * 1.1 / load).ceil().max(3.0);
    let mut rng = fastrand::Rng::with_seed(seed);
    // A start at an arbitrary phase of the window, as real traffic has.
    let start_ms = 1_700_000_000_000 + rng.u64(0..window_ms);
    let end_ms = start_ms + (windows * window_ms as f64) as u64;
    let mut all = Vec::with_capacity(requests + requests / 5);
    for (i, class) in classes.iter().enumerate() {
        let mut rng = fastrand::Rng::with_seed(seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut emit = |at_ms: u64| all.push(Request { at_ms, source: i as u32 });
        source_times(*class, &mut rng, start_ms, end_ms, limit, window_ms, &mut emit);
    }
    all.sort_unstable();
    all.truncate(requests);
    Traffic { requests: all, classes }
}

/// An exponential gap with the given mean, in whole ms.
fn exponential(rng: &mut fastrand::Rng, mean_ms: f64) -> u64 {
    (-(1.0 - rng.f64()).ln() * mean_ms) as u64
}

fn source_times(
    class: Class,
    rng: &mut fastrand::Rng,
    start_ms: u64,
    end_ms: u64,
    limit: u64,
    window_ms: u64,
    emit: &mut impl FnMut(u64),
) {
    let w = window_ms as f64;
    let l = limit as f64;
    match class {
        Class::Steady | Class::NearLimit => {
            let share = if class == Class::Steady { 0.1 + 0.6 * rng.f64() } else { 0.85 + 0.3 * rng.f64() };
            let mean_gap = w / (share * l);
            let mut t = start_ms + exponential(rng, mean_gap);
            while t < end_ms {
                emit(t);
                t += exponential(rng, mean_gap);
            }
        }
        Class::BurstyScraper => {
            let mut t = start_ms + exponential(rng, 2.0 * w);
            while t < end_ms {
                let count = ((0.5 + 2.0 * rng.f64()) * l) as u64;
                let spread = 500 + rng.u64(0..9_500).min(window_ms);
                for _ in 0..count {
                    emit(t + rng.u64(0..spread));
                }
                t += spread + exponential(rng, 2.0 * w);
            }
        }
        Class::BoundaryAttacker => {
            // The last and first second around a boundary (or a tenth of the window if shorter).
            let edge = 1_000.min(window_ms / 10).max(1);
            let mut boundary = (start_ms / window_ms + 1 + rng.u64(0..3)) * window_ms;
            while boundary + edge < end_ms {
                for _ in 0..limit {
                    emit(boundary - 1 - rng.u64(0..edge));
                    emit(boundary + rng.u64(0..edge));
                }
                boundary += window_ms * (2 + rng.u64(0..2));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_trace_and_every_class_appears() {
        let a = generate(20_000, 200, 100, 60_000, 7);
        let b = generate(20_000, 200, 100, 60_000, 7);
        assert_eq!(a.requests, b.requests);
        assert_eq!(a.requests.len(), 20_000);
        assert!(a.requests.windows(2).all(|p| p[0] <= p[1]));
        for class in Class::ALL {
            let n = a.requests.iter().filter(|r| a.classes[r.source as usize] == class).count();
            assert!(n > 500, "{class}: {n}");
        }
        assert_ne!(generate(20_000, 200, 100, 60_000, 8).requests, a.requests);
    }
}
