//! Counters and the store latency histogram, exposed as OpenMetrics text.
//!
//! Requests count on sharded atomics, as cheap as counting gets; the
//! exposition is prometheus-client's: a [`Collector`] sums the shards at
//! scrape time and hands the sums to its OpenMetrics encoder as constant
//! counters, gauges and one histogram, so nothing on a request's path knows
//! the library is there.
//!
//! Two things the encoder leaves to its caller, done here:
//! - Label values. prometheus-client 0.24 writes them as given, and a rule
//!   may be named anything its configuration can spell: a `"`, `\` or line
//!   feed in one would end the value early or start a new line, and
//!   Prometheus would refuse the whole scrape. [`Escaped`] writes the three
//!   escapes both text formats define, and nothing else needs one: metric
//!   names and help texts are this file's constants.
//! - The end. [`Metrics::render`] writes metric families only, without the
//!   `# EOF` line an exposition ends with, so that whoever serves them can
//!   add families of its own (`serve` does: reloads, the access log) and then
//!   end the exposition with [`Metrics::end_exposition`].

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelValue, EncodeMetric, LabelValueEncoder, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

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
    counters: Counters,
}

/// The counters of one limiter: shared with the limiters a reload carries
/// them over to, and with a scrape while it encodes them.
#[derive(Debug, Clone)]
struct Counters {
    rule_names: Arc<[String]>,
    /// Per rule, one set of counters per shard.
    rules: Arc<[Arc<[RuleCounters]>]>,
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
    /// The `Content-Type` of an exposition of [`Metrics::render`]'s families.
    pub const CONTENT_TYPE: &'static str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

    /// Metrics for rules named `rules`, in rule order.
    pub fn new(rules: impl IntoIterator<Item = String>) -> Self {
        let rule_names: Arc<[String]> = rules.into_iter().collect();
        let rules = rule_names.iter().map(|_| shards()).collect();
        Self { counters: Counters { rule_names, rules, store: shards(), global_lists: shards() } }
    }

    /// Metrics for the rules named `rules` that go on counting where these
    /// left off: the store's counters, and those of each rule whose name
    /// was already here; a new name starts at zero, a name gone is no
    /// longer rendered.
    pub fn carried_over(&self, rules: impl IntoIterator<Item = String>) -> Self {
        let old = &self.counters;
        let rule_names: Arc<[String]> = rules.into_iter().collect();
        // By name in a map: a scan per rule made a reload of 30,000 rules
        // quadratic.
        let kept: std::collections::HashMap<&str, &Arc<_>> =
            old.rule_names.iter().map(String::as_str).zip(old.rules.iter()).collect();
        let rules = rule_names
            .iter()
            .map(|name| match kept.get(name.as_str()) {
                Some(&counters) => Arc::clone(counters),
                None => shards(),
            })
            .collect();
        let (store, global_lists) = (Arc::clone(&old.store), Arc::clone(&old.global_lists));
        Self { counters: Counters { rule_names, rules, store, global_lists } }
    }

    /// The calling thread's counters of rule number `index`.
    pub fn rule(&self, index: usize) -> &RuleCounters {
        &self.counters.rules[index][shard_index()]
    }

    /// The calling thread's counters of the global allow and deny lists.
    pub fn global_lists(&self) -> &ListCounters {
        &self.counters.global_lists[shard_index()]
    }

    /// The calling thread's store counters.
    pub fn store(&self) -> &StoreCounters {
        &self.counters.store[shard_index()]
    }

    /// The OpenMetrics families of every metric, without the `# EOF` line
    /// that ends an exposition ([`Metrics::end_exposition`]); `breaker_open`
    /// is the breaker's state now.
    pub fn render(&self, breaker_open: bool) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Scrape { counters: self.counters.clone(), breaker_open }));
        let mut out = String::with_capacity(4096);
        // A `String` takes every write, and the collector fails only when
        // its writer does.
        let _ = prometheus_client::encoding::text::encode_registry(&mut out, &registry);
        out
    }

    /// Ends the exposition in `out`, which holds [`Metrics::render`]'s
    /// families and any others served with them.
    pub fn end_exposition(out: &mut String) {
        let _ = prometheus_client::encoding::text::encode_eof(out);
    }
}

/// The unit of the delay counter and of the latency histogram.
static SECONDS: Unit = Unit::Seconds;

/// One scrape of a limiter's counters: each summed over its shards as it is
/// encoded, the breaker's state as it was when the scrape began.
#[derive(Debug)]
struct Scrape {
    counters: Counters,
    breaker_open: bool,
}

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        self.encode_rules(&mut encoder)?;
        self.encode_lists(&mut encoder)?;
        self.encode_store(&mut encoder)?;
        let help = "Whether the circuit breaker is open (1) or closed (0).";
        let family = encoder.encode_descriptor("slidegate_breaker_open", help, None, MetricType::Gauge)?;
        ConstGauge::new(i64::from(self.breaker_open)).encode(family)?;
        self.encode_latency(&mut encoder)
    }
}

impl Scrape {
    /// The counters of each rule, one sample per rule.
    fn encode_rules(&self, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
        let per_rule: [(&'static str, &str, CounterOf); 10] = [
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
        let Counters { rule_names, rules, .. } = &self.counters;
        for (sample, help, field) in per_rule {
            let mut family = counter_family(encoder, sample, help)?;
            for (rule, shards) in rule_names.iter().zip(rules.iter()) {
                ConstCounter::new(sum(shards, field))
                    .encode(family.encode_family(&[("rule", Escaped(rule))])?)?;
            }
        }
        let help = "Time requests were held by the rule's delay, allowed or not at the end.";
        let mut family =
            encoder.encode_descriptor("slidegate_delayed", help, Some(&SECONDS), MetricType::Counter)?;
        for (rule, shards) in rule_names.iter().zip(rules.iter()) {
            let seconds = sum(shards, |c| &c.delayed_ms) as f64 / 1e3;
            ConstCounter::new(seconds).encode(family.encode_family(&[("rule", Escaped(rule))])?)?;
        }
        Ok(())
    }

    /// The list counters: one sample per rule, and one labelled
    /// `list="global"` for the global lists (a rule may be named `global`).
    fn encode_lists(&self, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
        let lists: [(&'static str, &str, ListCounterOf); 2] = [
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
        let Counters { rule_names, rules, global_lists, .. } = &self.counters;
        for (sample, help, field) in lists {
            let mut family = counter_family(encoder, sample, help)?;
            let global = sum(global_lists, field);
            ConstCounter::new(global).encode(family.encode_family(&[("list", Escaped("global"))])?)?;
            for (rule, shards) in rule_names.iter().zip(rules.iter()) {
                let value = sum(shards, |c| field(&c.lists));
                ConstCounter::new(value).encode(family.encode_family(&[("rule", Escaped(rule))])?)?;
            }
        }
        Ok(())
    }

    /// The store's counters, one sample each.
    fn encode_store(&self, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
        let global: [(&'static str, &str, StoreCounterOf); 10] = [
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
        for (sample, help, field) in global {
            ConstCounter::new(sum(&self.counters.store, field))
                .encode(counter_family(encoder, sample, help)?)?;
        }
        Ok(())
    }

    /// `slidegate_store_latency_seconds`, the histogram of store calls that
    /// answered.
    fn encode_latency(&self, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
        let store = &self.counters.store;
        // The encoder takes each bucket's own count and sums them itself.
        let mut buckets = Vec::with_capacity(BUCKETS_US.len() + 1);
        for (i, bound) in BUCKETS_US.iter().enumerate() {
            buckets.push((*bound as f64 / 1e6, sum(store, |s| &s.latency_buckets[i])));
        }
        let bucketed: u64 = buckets.iter().map(|(_, n)| n).sum();
        // A call counts in its bucket, then in the count, each on its own
        // atomic, read shard by shard: a scrape may see it in one and not the
        // other. The count is at least the buckets' sum, so that `+Inf`
        // (the rest: the calls slower than the last bound) never goes below
        // the bucket before it and always equals `_count`.
        let count = sum(store, |s| &s.latency_count).max(bucketed);
        buckets.push((f64::MAX, count - bucketed));
        let seconds = sum(store, |s| &s.latency_sum_us) as f64 / 1e6;
        let help = "Latency of store calls that answered.";
        let mut family = encoder.encode_descriptor(
            "slidegate_store_latency",
            help,
            Some(&SECONDS),
            MetricType::Histogram,
        )?;
        family.encode_histogram::<NoLabelSet>(seconds, count, &buckets, None)
    }
}

/// Opens the counter family whose samples are named `sample`, as dashboards
/// and alerts name them: the encoder appends the `_total` itself.
fn counter_family<'e>(
    encoder: &'e mut DescriptorEncoder,
    sample: &'static str,
    help: &str,
) -> Result<MetricEncoder<'e>, std::fmt::Error> {
    let name = sample.strip_suffix("_total").unwrap_or(sample);
    encoder.encode_descriptor(name, help, None, MetricType::Counter)
}

/// The sum of one counter over every shard.
fn sum<T>(shards: &[T], field: impl Fn(&T) -> &AtomicU64) -> u64 {
    shards.iter().map(|s| field(s).load(Relaxed)).sum()
}

/// One set of counters per shard.
fn shards<T: Default>() -> Arc<[T]> {
    (0..SHARDS).map(|_| T::default()).collect()
}

/// A label value with its `\`, `"` and line feeds escaped as `\\`, `\"` and
/// `\n`, the escapes OpenMetrics (and Prometheus's older text format)
/// define: the encoder writes a value as it is given.
#[derive(Debug)]
struct Escaped<'a>(&'a str);

impl EncodeLabelValue for Escaped<'_> {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
        let mut rest = self.0;
        while let Some(at) = rest.find(['\\', '"', '\n']) {
            encoder.write_str(&rest[..at])?;
            encoder.write_str(match rest.as_bytes()[at] {
                b'\\' => "\\\\",
                b'"' => "\\\"",
                _ => "\\n",
            })?;
            rest = &rest[at + 1..];
        }
        encoder.write_str(rest)
    }
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
        // prometheus-client writes a bound as a float, `1.0` where the
        // hand-written text had `1`: the same bound to `histogram_quantile`.
        assert!(text.contains("slidegate_store_latency_seconds_bucket{le=\"1.0\"} 2\n"), "{text}");
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

    #[test]
    fn sample_names_are_the_ones_dashboards_and_alerts_query() {
        let text = Metrics::new(["search".to_owned()]).render(false);
        let names: std::collections::BTreeSet<&str> = text
            .lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| line.split(['{', ' ']).next())
            .collect();
        let expected = [
            "slidegate_breaker_open",
            "slidegate_breaker_opened_total",
            "slidegate_breaker_trials_total",
            "slidegate_delayed_seconds_total",
            "slidegate_deny_cache_hits_total",
            "slidegate_penalty_lifts_applied_total",
            "slidegate_penalty_lifts_total",
            "slidegate_requests_allowed_total",
            "slidegate_requests_blocked_total",
            "slidegate_requests_delayed_total",
            "slidegate_requests_denied_total",
            "slidegate_requests_exempt_total",
            "slidegate_requests_fail_closed_total",
            "slidegate_requests_fail_open_total",
            "slidegate_requests_fallback_total",
            "slidegate_requests_listed_denied_total",
            "slidegate_requests_near_limit_total",
            "slidegate_requests_shadow_blocked_total",
            "slidegate_requests_shadow_denied_total",
            "slidegate_store_calls_total",
            "slidegate_store_errors_total",
            "slidegate_store_latency_seconds_bucket",
            "slidegate_store_latency_seconds_count",
            "slidegate_store_latency_seconds_sum",
            "slidegate_store_probes_total",
            "slidegate_store_skipped_total",
            "slidegate_store_timeouts_total",
        ];
        assert_eq!(names.into_iter().collect::<Vec<_>>(), expected, "{text}");
    }

    #[test]
    fn families_are_openmetrics_and_the_exposition_ends_once() {
        let m = Metrics::new(["search".to_owned()]);
        m.rule(0).delayed_ms.fetch_add(1_500, Relaxed);
        m.global_lists().exempt.fetch_add(2, Relaxed);
        let mut text = m.render(false);
        // A counter's family is named without the `_total` its samples carry.
        assert!(
            text.contains(
                "# HELP slidegate_requests_allowed Requests decided and allowed.\n\
                 # TYPE slidegate_requests_allowed counter\n\
                 slidegate_requests_allowed_total{rule=\"search\"} 0\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "# TYPE slidegate_delayed_seconds counter\n\
                 # UNIT slidegate_delayed_seconds seconds\n\
                 slidegate_delayed_seconds_total{rule=\"search\"} 1.5\n"
            ),
            "{text}"
        );
        assert!(text.contains("slidegate_requests_exempt_total{list=\"global\"} 2\n"), "{text}");
        assert!(text.contains("# TYPE slidegate_breaker_open gauge\nslidegate_breaker_open 0\n"), "{text}");
        assert!(text.contains("# TYPE slidegate_store_latency_seconds histogram\n"), "{text}");
        // Families only: the server adds its own and then ends the exposition.
        assert!(!text.contains("# EOF"), "{text}");
        Metrics::end_exposition(&mut text);
        assert!(text.ends_with("slidegate_store_latency_seconds_bucket{le=\"+Inf\"} 0\n# EOF\n"), "{text}");
        assert_eq!(text.matches("# EOF").count(), 1);
    }

    #[test]
    fn label_values_escape_quotes_backslashes_and_line_feeds() {
        let name = "say \"hi\"\\now\nthen";
        let m = Metrics::new([name.to_owned(), "plain".to_owned()]);
        m.rule(0).allowed.fetch_add(2, Relaxed);
        m.rule(0).lists.denied.fetch_add(3, Relaxed);
        let text = m.render(false);
        assert!(
            text.contains("slidegate_requests_allowed_total{rule=\"say \\\"hi\\\"\\\\now\\nthen\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "slidegate_requests_listed_denied_total{rule=\"say \\\"hi\\\"\\\\now\\nthen\"} 3\n"
            ),
            "{text}"
        );
        // The line feed split no sample: every line is a comment or one
        // whole sample, and the rule after it is intact.
        assert!(text.lines().all(|l| l.starts_with("# ") || l.starts_with("slidegate_")), "{text}");
        assert!(text.contains("slidegate_requests_allowed_total{rule=\"plain\"} 0\n"), "{text}");
    }
}
