//! Replays a trace through every algorithm and scores each decision against
//! the exact sliding log.
//!
//! Each algorithm runs on its own: its state per source evolves with its own
//! decisions. For each request, the ground truth is the exact sliding log's
//! rule — a permit admitted at `t` counts while `now < t + W`; a request fits
//! when fewer than `limit` permits count — applied to the permits *this
//! algorithm* admitted from that source: the decision an exact limiter would
//! make given the same history.
//!
//! - **wrongly allowed**: the algorithm allowed a request that would make
//!   more than `limit` admitted within one window (exact log: denied);
//! - **wrongly denied**: the algorithm denied a request that fit (exact log:
//!   allowed);
//! - **average rate difference**: before each request, the algorithm's own
//!   estimate of the source's current rate (permits in the last window, as
//!   its state implies: [`IdentityState::usage`]) against the real count of permits it admitted in
//!   that window: `100 × Σ|estimate − real| / Σ real` over all requests.
//!
//! For the sliding log itself all three are 0 by construction.
//!
//! Per source, as Cloudflare also reported: how many sources ever had more
//! than `limit` permits admitted within one window (any window, not only the
//! aligned ones), and the largest such count.

use std::collections::{BTreeMap, VecDeque};

use slidegate::algorithm::IdentityState;
use slidegate::{Algorithm, Quota};

use super::traffic::{Class, Traffic};

/// Counts for one algorithm (and one traffic class).
#[derive(Debug, Clone, Copy, Default)]
pub struct Score {
    /// Requests decided.
    pub requests: u64,
    /// Requests allowed.
    pub allowed: u64,
    /// Allowed although the exact log would deny.
    pub wrongly_allowed: u64,
    /// Denied although the exact log would allow.
    pub wrongly_denied: u64,
    /// Σ |estimated − real| permits in the window, over requests.
    pub rate_diff_sum: f64,
    /// Σ real permits in the window, over requests.
    pub real_rate_sum: f64,
    /// Sources that had more than `limit` permits admitted within some window.
    pub sources_over_limit: u64,
    /// The largest number of permits admitted to one source within one window.
    pub peak_admitted: u64,
}

impl Score {
    /// Wrongly allowed requests, % of all requests.
    pub fn wrongly_allowed_pct(&self) -> f64 {
        pct(self.wrongly_allowed as f64, self.requests as f64)
    }

    /// Wrongly denied requests, % of all requests.
    pub fn wrongly_denied_pct(&self) -> f64 {
        pct(self.wrongly_denied as f64, self.requests as f64)
    }

    /// Average difference between the estimated and the real rate, % of the real rate.
    pub fn avg_rate_diff_pct(&self) -> f64 {
        pct(self.rate_diff_sum, self.real_rate_sum)
    }

    fn add(&mut self, other: &Score) {
        self.requests += other.requests;
        self.allowed += other.allowed;
        self.wrongly_allowed += other.wrongly_allowed;
        self.wrongly_denied += other.wrongly_denied;
        self.rate_diff_sum += other.rate_diff_sum;
        self.real_rate_sum += other.real_rate_sum;
        self.sources_over_limit += other.sources_over_limit;
        self.peak_admitted = self.peak_admitted.max(other.peak_admitted);
    }
}

fn pct(part: f64, whole: f64) -> f64 {
    if whole == 0.0 {
        0.0
    } else {
        100.0 * part / whole
    }
}

/// The outcome for one algorithm.
#[derive(Debug, Clone)]
pub struct AlgorithmReport {
    /// Over all requests.
    pub total: Score,
    /// Per traffic class.
    pub by_class: BTreeMap<Class, Score>,
    /// Admission times (ms since the epoch) of the first boundary attacker,
    /// for the boundary chart.
    pub attacker_admissions: Vec<u64>,
}

/// Replays `traffic` through `algorithm` under `quota`, calling `progress`
/// with the number of requests done every so often.
pub fn replay(
    algorithm: Algorithm,
    traffic: &Traffic,
    quota: &Quota,
    mut progress: impl FnMut(u64),
) -> AlgorithmReport {
    let sources = traffic.classes.len();
    let mut states = vec![IdentityState::new(algorithm); sources];
    // What this algorithm admitted, per source: the exact log of its output.
    // Admission times, oldest first, of the permits still in the window.
    let mut admitted = vec![VecDeque::<u64>::new(); sources];
    // The most permits each source had admitted within one window.
    let mut peak = vec![0u64; sources];
    let mut by_class: BTreeMap<Class, Score> = Class::ALL.iter().map(|c| (*c, Score::default())).collect();
    let attacker = traffic.classes.iter().position(|c| *c == Class::BoundaryAttacker);
    let mut attacker_admissions = Vec::new();
    let (limit, window) = (quota.permits(), quota.window_ms());
    for (i, request) in traffic.requests.iter().enumerate() {
        let (now, source) = (request.at_ms, request.source as usize);
        // The sliding log's rule: a permit admitted at t counts while now < t + W.
        let log = &mut admitted[source];
        while log.front().is_some_and(|&t| t + window <= now) {
            log.pop_front();
        }
        let real = log.len() as u64;
        let exact_allows = real < limit;
        // The library's own view of the rate: the code users run, not a copy.
        let estimate = states[source].usage(now, quota).permits();
        let allowed = states[source].decide(now, 1, quota).allowed;
        if allowed {
            log.push_back(now);
            peak[source] = peak[source].max(log.len() as u64);
            if Some(source) == attacker {
                attacker_admissions.push(now);
            }
        }
        let score = by_class.get_mut(&traffic.classes[source]).expect("every class has a score");
        score.requests += 1;
        score.allowed += u64::from(allowed);
        score.wrongly_allowed += u64::from(allowed && !exact_allows);
        score.wrongly_denied += u64::from(!allowed && exact_allows);
        score.rate_diff_sum += (estimate - real as f64).abs();
        score.real_rate_sum += real as f64;
        if i % 65_536 == 65_535 {
            progress(65_536);
        }
    }
    progress(traffic.requests.len() as u64 % 65_536);
    for (source, &p) in peak.iter().enumerate() {
        let score = by_class.get_mut(&traffic.classes[source]).expect("every class has a score");
        score.sources_over_limit += u64::from(p > limit);
        score.peak_admitted = score.peak_admitted.max(p);
    }
    let mut total = Score::default();
    for score in by_class.values() {
        total.add(score);
    }
    AlgorithmReport { total, by_class, attacker_admissions }
}

#[cfg(test)]
mod tests {
    use super::super::traffic::generate;
    use super::*;

    #[test]
    fn the_exact_log_scores_zero_and_the_fixed_window_leaks_at_boundaries() {
        let q = Quota::per_minute(100).unwrap();
        let traffic = generate(50_000, 200, 100, 60_000, 3);
        let log = replay(Algorithm::SlidingLog, &traffic, &q, |_| {});
        assert_eq!(log.total.requests, 50_000);
        assert_eq!((log.total.wrongly_allowed, log.total.wrongly_denied), (0, 0));
        assert!(log.total.avg_rate_diff_pct() < 1e-9);
        let fixed = replay(Algorithm::FixedWindow, &traffic, &q, |_| {});
        let attackers = fixed.by_class[&Class::BoundaryAttacker];
        assert!(attackers.wrongly_allowed > 1_000, "{attackers:?}");
        assert_eq!(fixed.by_class[&Class::Steady].wrongly_allowed, 0);
    }
}
