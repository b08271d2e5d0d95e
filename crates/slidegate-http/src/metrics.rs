//! Counters and the store latency histogram, rendered as Prometheus text.
//!
//! Hand-rolled on atomics: a handful of counters does not need a metrics
//! framework, and rendering them is a page of code.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// Upper bounds of the store latency histogram, in microseconds.
const BUCKETS_US: [u64; 12] =
    [100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000];

/// Picks one counter of a rule.
type CounterOf = fn(&RuleCounters) -> &AtomicU64;
/// Picks one store counter.
type StoreCounterOf = fn(&StoreCounters) -> &AtomicU64;

/// Counter shards: threads spread over them so that busy threads do not
/// bounce one cache line between cores on every request.
const SHARDS: usize = 16;

/// What happened to requests under one rule.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct RuleCounters {
    /// Decided and allowed.
    pub allowed: AtomicU64,
    /// Decided and denied (answered 429).
    pub denied: AtomicU64,
    /// Denied by a shadow-mode rule, and let through.
    pub shadow_denied: AtomicU64,
    /// Let through without a decision because the store failed.
    pub fail_open: AtomicU64,
    /// Refused without a decision because the store failed.
    pub fail_closed: AtomicU64,
    /// Decided by the embedded fallback limiter because the store failed.
    pub fallback: AtomicU64,
    /// Allowed with at most a tenth of a limit left: clients about to be denied.
    pub near_limit: AtomicU64,
    /// Refused because the penalty box blocks the identity.
    pub blocked: AtomicU64,
    /// Blocked by the penalty box of a shadow-mode rule, and let through.
    pub shadow_blocked: AtomicU64,
    /// Held by the rule's `delay` and then allowed (counted in `allowed` too).
    pub delayed: AtomicU64,
    /// Milliseconds requests were held by the rule's `delay`, allowed or not at the end.
    pub delayed_ms: AtomicU64,
    /// Answered by the rule's allow or deny list.
    pub lists: ListCounters,
}

/// Requests an allow or a deny list answered, without a store call.
#[derive(Debug, Default)]
pub struct ListCounters {
    /// Named by an allow list: let through, not limited.
    pub exempt: AtomicU64,
    /// Named by a deny list: refused with 403.
    pub denied: AtomicU64,
}

/// Picks one list counter.
type ListCounterOf = fn(&ListCounters) -> &AtomicU64;

/// What happened to calls to the store.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct StoreCounters {
    /// Calls made to the store (probes excluded).
    pub calls: AtomicU64,
    /// Store calls that failed with an error.
    pub errors: AtomicU64,
    /// Store calls that hit the deadline.
    pub timeouts: AtomicU64,
    /// Decisions that skipped the store because the breaker was open.
    pub skipped: AtomicU64,
    /// Background probes of an open breaker.
    pub probes: AtomicU64,
    /// Times the breaker opened.
    pub breaker_opened: AtomicU64,
    /// Decisions that tried the store while the breaker was open (half-open trials).
    pub trials: AtomicU64,
    /// Denials answered by the local deny cache, without a store call.
    pub deny_cache_hits: AtomicU64,
    /// Penalty blocks lifted through this instance (one per rule).
    pub penalty_lifts: AtomicU64,
    /// Lifts, by any instance, this instance applied to its deny cache.
    pub lifts_applied: AtomicU64,
    latency_buckets: [AtomicU64; BUCKETS_US.len()],
    latency_count: AtomicU64,
    latency_sum_us: AtomicU64,
}

impl StoreCounters {
    /// Records the latency of one store call that answered.
    pub fn observe_latency(&self, elapsed: Duration) {
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        if let Some(i) = BUCKETS_US.iter().position(|&b| us <= b) {
            self.latency_buckets[i].fetch_add(1, Relaxed);
        }
        self.latency_count.fetch_add(1, Relaxed);
        self.latency_sum_us.fetch_add(us, Relaxed);
    }
}

/// Every metric of one limiter, sharded by thread and summed when rendered.
///
/// Each rule's counters and the store's are shared, not owned: a limiter
/// rebuilt for a reloaded configuration ([`Metrics::carried_over`]) counts
/// on in the same counters for every rule it keeps by name, and for the
/// store, whose layers it keeps.
#[derive(Debug)]
pub struct Metrics {
    rule_names: Vec<String>,
    /// Per rule, one set of counters per shard.
    rules: Vec<Arc<[RuleCounters]>>,
    /// One set per shard.
    store: Arc<[StoreCounters]>,
    /// What the global lists answered, one set per shard.
    global_lists: Arc<[ListCounters]>,
}

/// The shard of the calling thread.
fn shard_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Relaxed) % SHARDS;
    }
    INDEX.with(|i| *i)
}

impl Metrics {
    /// Metrics for rules named `rules`, in rule order.
    pub fn new(rules: impl IntoIterator<Item = String>) -> Self {
        let rule_names: Vec<String> = rules.into_iter().collect();
        let rules = rule_names.iter().map(|_| shards()).collect();
        Self { rule_names, rules, store: shards(), global_lists: shards() }
    }

    /// Metrics for the rules named `rules` that go on counting where these
    /// left off: the store's counters, and those of each rule whose name
    /// was already here; a new name starts at zero, a name gone is no
    /// longer rendered.
    pub fn carried_over(&self, rules: impl IntoIterator<Item = String>) -> Self {
        let rule_names: Vec<String> = rules.into_iter().collect();
        // By name in a map: a scan per rule made a reload of 30,000 rules
        // quadratic.
        let old: std::collections::HashMap<&str, &Arc<_>> =
            self.rule_names.iter().map(String::as_str).zip(&self.rules).collect();
        let rules = rule_names
            .iter()
            .map(|name| match old.get(name.as_str()) {
                Some(&counters) => Arc::clone(counters),
                None => shards(),
            })
            .collect();
        Self {
            rule_names,
            rules,
            store: Arc::clone(&self.store),
            global_lists: Arc::clone(&self.global_lists),
        }
    }

    /// The calling thread's counters of rule number `index`.
    pub fn rule(&self, index: usize) -> &RuleCounters {
        &self.rules[index][shard_index()]
    }

    /// The calling thread's counters of the global allow and deny lists.
    pub fn global_lists(&self) -> &ListCounters {
        &self.global_lists[shard_index()]
    }

    /// The calling thread's store counters.
    pub fn store(&self) -> &StoreCounters {
        &self.store[shard_index()]
    }

    fn sum<T>(shards: &[T], f: impl Fn(&T) -> &AtomicU64) -> u64 {
        shards.iter().map(|s| f(s).load(Relaxed)).sum()
    }

    /// The Prometheus text exposition of every metric; `breaker_open` is the
    /// breaker's state now.
    pub fn render(&self, breaker_open: bool) -> String {
        let mut out = String::with_capacity(4096);
        let per_rule: [(&str, &str, CounterOf); 10] = [
            ("slidegate_requests_allowed_total", "Requests decided and allowed.", |c| &c.allowed),
            ("slidegate_requests_denied_total", "Requests decided and denied with 429.", |c| &c.denied),
            (
                "slidegate_requests_shadow_denied_total",
                "Requests a shadow-mode rule would have denied.",
                |c| &c.shadow_denied,
            ),
            (
                "slidegate_requests_fail_open_total",
                "Requests let through undecided because the store failed.",
                |c| &c.fail_open,
            ),
            (
                "slidegate_requests_fail_closed_total",
                "Requests refused undecided because the store failed.",
                |c| &c.fail_closed,
            ),
            (
                "slidegate_requests_fallback_total",
                "Requests decided by the embedded fallback limiter because the store failed.",
                |c| &c.fallback,
            ),
            // Per rule only, never per identity: the top offenders page names
            // identities; a label per identity would grow without bound.
            (
                "slidegate_requests_near_limit_total",
                "Requests allowed with at most 10% of a limit left.",
                |c| &c.near_limit,
            ),
            (
                "slidegate_requests_blocked_total",
                "Requests refused because the penalty box blocks the identity.",
                |c| &c.blocked,
            ),
            (
                "slidegate_requests_shadow_blocked_total",
                "Requests a shadow-mode rule's penalty box would have refused.",
                |c| &c.shadow_blocked,
            ),
            (
                "slidegate_requests_delayed_total",
                "Requests held by the rule's delay and then allowed (also counted as allowed).",
                |c| &c.delayed,
            ),
        ];
        for (name, help, field) in per_rule {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (i, rule) in self.rule_names.iter().enumerate() {
                let value = Self::sum(&self.rules[i], field);
                let _ = writeln!(out, "{name}{{rule=\"{}\"}} {value}", escape(rule));
            }
        }
        let name = "slidegate_delayed_seconds_total";
        let _ = writeln!(
            out,
            "# HELP {name} Time requests were held by the rule's delay, allowed or not at the end.\n# TYPE {name} counter"
        );
        for (i, rule) in self.rule_names.iter().enumerate() {
            let ms = Self::sum(&self.rules[i], |c| &c.delayed_ms);
            let _ = writeln!(out, "{name}{{rule=\"{}\"}} {}", escape(rule), ms as f64 / 1e3);
        }
        self.render_lists(&mut out);
        let global: [(&str, &str, StoreCounterOf); 10] = [
            ("slidegate_store_calls_total", "Decisions asked of the store (probes excluded).", |c| &c.calls),
            ("slidegate_store_errors_total", "Store calls that failed.", |c| &c.errors),
            ("slidegate_store_timeouts_total", "Store calls that missed the deadline.", |c| &c.timeouts),
            (
                "slidegate_store_skipped_total",
                "Decisions that did not call the store because the circuit breaker was open.",
                |c| &c.skipped,
            ),
            ("slidegate_store_probes_total", "Background probes while the circuit breaker was open.", |c| {
                &c.probes
            }),
            ("slidegate_breaker_opened_total", "Times the circuit breaker opened.", |c| &c.breaker_opened),
            (
                "slidegate_breaker_trials_total",
                "Decisions that tried the store while the circuit breaker was open.",
                |c| &c.trials,
            ),
            (
                "slidegate_deny_cache_hits_total",
                "Denials answered by the local deny cache without a store call.",
                |c| &c.deny_cache_hits,
            ),
            (
                "slidegate_penalty_lifts_total",
                "Penalty blocks lifted through this instance's admin API.",
                |c| &c.penalty_lifts,
            ),
            (
                "slidegate_penalty_lifts_applied_total",
                "Lifted penalty blocks (by any instance) this instance forgot from its deny cache.",
                |c| &c.lifts_applied,
            ),
        ];
        for (name, help, field) in global {
            let value = Self::sum(&self.store, field);
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
        }
        let _ = writeln!(
            out,
            "# HELP slidegate_breaker_open Whether the circuit breaker is open (1) or closed (0).\n\
             # TYPE slidegate_breaker_open gauge\nslidegate_breaker_open {}",
            u8::from(breaker_open)
        );
        let name = "slidegate_store_latency_seconds";
        let _ = writeln!(out, "# HELP {name} Latency of store calls that answered.\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, bound) in BUCKETS_US.iter().enumerate() {
            cumulative += Self::sum(&self.store, |s| &s.latency_buckets[i]);
            let _ = writeln!(out, "{name}_bucket{{le=\"{}\"}} {cumulative}", *bound as f64 / 1e6);
        }
        let count = Self::sum(&self.store, |s| &s.latency_count);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {}", Self::sum(&self.store, |s| &s.latency_sum_us) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {count}");
        out
    }
}

impl Metrics {
    /// The list counters: one line per rule, and one labelled
    /// `list="global"` for the global lists (a rule may be named `global`).
    fn render_lists(&self, out: &mut String) {
        let lists: [(&str, &str, ListCounterOf); 2] = [
            (
                "slidegate_requests_exempt_total",
                "Requests an allow list let through unlimited, without a store call.",
                |c| &c.exempt,
            ),
            (
                "slidegate_requests_listed_denied_total",
                "Requests a deny list refused with 403, without a store call.",
                |c| &c.denied,
            ),
        ];
        for (name, help, field) in lists {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            let global = Self::sum(&self.global_lists, field);
            let _ = writeln!(out, "{name}{{list=\"global\"}} {global}");
            for (i, rule) in self.rule_names.iter().enumerate() {
                let value = Self::sum(&self.rules[i], |c| field(&c.lists));
                let _ = writeln!(out, "{name}{{rule=\"{}\"}} {value}", escape(rule));
            }
        }
    }
}

/// One set of counters per shard.
fn shards<T: Default>() -> Arc<[T]> {
    (0..SHARDS).map(|_| T::default()).collect()
}

fn escape(label: &str) -> String {
    label.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// What the store's protections (`slidegate::protect`) do, counted in the
/// calling thread's store counters.
impl slidegate::protect::Events for Metrics {
    fn call(&self) {
        self.store().calls.fetch_add(1, Relaxed);
    }
    fn trial(&self) {
        self.store().trials.fetch_add(1, Relaxed);
    }
    fn skipped(&self) {
        self.store().skipped.fetch_add(1, Relaxed);
    }
    fn answered(&self, latency: Duration) {
        self.store().observe_latency(latency);
    }
    fn failed(&self) {
        self.store().errors.fetch_add(1, Relaxed);
    }
    fn timed_out(&self) {
        self.store().timeouts.fetch_add(1, Relaxed);
    }
    fn breaker_opened(&self) {
        self.store().breaker_opened.fetch_add(1, Relaxed);
    }
    fn probe(&self) {
        self.store().probes.fetch_add(1, Relaxed);
    }
    fn deny_cache_hit(&self) {
        self.store().deny_cache_hits.fetch_add(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_per_rule_and_a_cumulative_histogram() {
        let m = Metrics::new(["search".to_owned(), "trending".to_owned()]);
        m.rule(0).denied.fetch_add(3, Relaxed);
        m.rule(1).fail_open.fetch_add(2, Relaxed);
        m.rule(1).near_limit.fetch_add(4, Relaxed);
        m.rule(0).blocked.fetch_add(5, Relaxed);
        m.store().observe_latency(Duration::from_micros(80));
        m.store().observe_latency(Duration::from_micros(300));
        // Another thread counts in another shard; the sum is the same.
        std::thread::scope(|scope| {
            scope.spawn(|| m.store().observe_latency(Duration::from_secs(3)));
        });
        let text = m.render(true);
        assert!(text.contains("slidegate_requests_denied_total{rule=\"search\"} 3\n"), "{text}");
        assert!(text.contains("slidegate_requests_fail_open_total{rule=\"trending\"} 2\n"));
        assert!(text.contains("slidegate_requests_fail_open_total{rule=\"search\"} 0\n"));
        assert!(text.contains("slidegate_requests_near_limit_total{rule=\"trending\"} 4\n"), "{text}");
        assert!(text.contains("slidegate_requests_blocked_total{rule=\"search\"} 5\n"));
        assert!(text.contains("slidegate_breaker_open 1\n"));
        assert!(text.contains("slidegate_store_latency_seconds_bucket{le=\"0.0001\"} 1\n"));
        assert!(text.contains("slidegate_store_latency_seconds_bucket{le=\"0.00025\"} 1\n"));
        assert!(text.contains("slidegate_store_latency_seconds_bucket{le=\"0.0005\"} 2\n"));
        assert!(text.contains("slidegate_store_latency_seconds_bucket{le=\"1\"} 2\n"));
        assert!(text.contains("slidegate_store_latency_seconds_bucket{le=\"+Inf\"} 3\n"));
        assert!(text.contains("slidegate_store_latency_seconds_sum 3.00038\n"));
        assert!(text.contains("slidegate_store_latency_seconds_count 3\n"));
    }

    #[test]
    fn carried_over_metrics_share_the_store_and_the_rules_kept_by_name() {
        let old = Metrics::new(["search".to_owned(), "trending".to_owned()]);
        old.rule(0).denied.fetch_add(3, Relaxed);
        old.rule(1).denied.fetch_add(4, Relaxed);
        old.store().calls.fetch_add(7, Relaxed);
        let new = old.carried_over(["new".to_owned(), "search".to_owned()]);
        // A request still in flight under the old rules counts in the same place.
        old.rule(0).denied.fetch_add(1, Relaxed);
        let text = new.render(false);
        assert!(text.contains("slidegate_requests_denied_total{rule=\"search\"} 4\n"), "{text}");
        assert!(text.contains("slidegate_requests_denied_total{rule=\"new\"} 0\n"), "{text}");
        assert!(!text.contains("trending"), "{text}");
        assert!(text.contains("slidegate_store_calls_total 7\n"), "{text}");
    }
}
