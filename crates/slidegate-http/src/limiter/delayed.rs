//! A request of a rule with `delay`: held and decided again rather than
//! refused, when its wait is short (the policy is in `crate::delay`).

use std::net::IpAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use slidegate::{Identity, Store};

use super::rule::{Mode, PolicySet};
use super::{Inner, RateLimiter};
use crate::config::DelayConfig;
use crate::delay::{max_decisions, wait_for, Delays};
use crate::verdict::{DecisionSource, Verdict};

impl<S: Store + 'static> RateLimiter<S> {
    /// Decides a request under a rule with `delay`, charging: a denial that
    /// [`wait_for`] says fits is held (if `Delays` has room for its
    /// identity and for `client`, its address after the trusted proxies)
    /// and decided again, at most [`max_decisions`] times. Only the answer
    /// given is counted, as allowed or denied; a held request is counted as
    /// delayed too, and its time held.
    pub(super) async fn decide_delayed<'s>(
        &'s self,
        index: usize,
        identity: &Identity,
        client: Option<IpAddr>,
        set: &'s PolicySet,
        delay: &DelayConfig,
    ) -> Verdict<'s> {
        let mut verdict = self.ask(index, identity, set, 1, Mode::Charge).await;
        let first_wait = wait_for(delay, &verdict, std::time::Duration::ZERO);
        let delays = &self.inner.delays;
        let slot = first_wait.and_then(|_| {
            delays.enter(identity, delay.per_identity, delays.client(&self.inner.identity, client))
        });
        if let (Some(mut wait), Some(_slot)) = (first_wait, slot) {
            let started = tokio::time::Instant::now();
            for _ in 0..max_decisions(delay) {
                tokio::time::sleep(wait).await;
                verdict = self.ask(index, identity, set, 1, Mode::Charge).await;
                match wait_for(delay, &verdict, started.elapsed()) {
                    Some(next) => wait = next,
                    None => break,
                }
            }
            let held = started.elapsed();
            verdict.delayed = Some(held);
            let counters = self.inner.metrics.rule(index);
            counters.delayed_ms.fetch_add(u64::try_from(held.as_millis()).unwrap_or(u64::MAX), Relaxed);
            // Allowed by a decision, not let through by a failing store.
            let decided = matches!(verdict.source, DecisionSource::Store | DecisionSource::Fallback);
            if verdict.allowed() && decided {
                counters.delayed.fetch_add(1, Relaxed);
            }
        }
        self.count(index, identity, &verdict, Mode::Charge);
        verdict
    }

    /// Requests held by rules with `delay` now, over every rule and identity.
    pub fn delayed_now(&self) -> u32 {
        self.inner.delays.held()
    }

    /// This limiter with room for `cap` requests held at once (a limiter
    /// just built, whose `Inner` nobody shares yet).
    pub(super) fn with_max_delayed(mut self, cap: u32) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.delays = Arc::new(Delays::new(cap));
        }
        self
    }
}

impl<S> Inner<S> {
    /// The held requests a reloaded limiter with a cap of `cap` shares:
    /// these when the cap is unchanged, else a new cap over the same
    /// per-identity counts.
    pub(super) fn delays_for(&self, cap: u32) -> Arc<Delays> {
        if self.delays.cap() == cap {
            Arc::clone(&self.delays)
        } else {
            Arc::new(self.delays.with_cap(cap))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};
    use std::time::Duration;

    use http::{HeaderMap, Method};
    use slidegate::{Algorithm, Clock, Limit, MemoryStore, Quota};

    use super::*;
    use crate::config::{IdentityKind, LimitConfig, LimiterConfig, RuleConfig, RuleLimits, TimeSpan};

    /// The store's clock on tokio's, which the tests pause: a whole second
    /// of the epoch plus what tokio says has passed.
    struct TokioClock(tokio::time::Instant);

    impl Clock for TokioClock {
        fn now_ms(&self) -> u64 {
            1_700_000_000_000 + self.0.elapsed().as_millis() as u64
        }
    }

    type Limiter = RateLimiter<MemoryStore<TokioClock>>;

    /// 2 per second (GCRA: one permit every 500 ms), held up to
    /// `max_wait_ms`, `per_identity` at once, `cap` over all.
    fn limiter(max_wait_ms: u64, per_identity: u32, cap: u32) -> Limiter {
        let limit = Limit::new(Algorithm::Gcra, Quota::per_second(2).unwrap());
        let limits = vec![LimitConfig::new("api", limit, 1).unwrap()];
        let mut rule = RuleConfig::new(
            "api",
            "/api/*".parse().unwrap(),
            RuleLimits::Shared { identity: IdentityKind::Ip, limits },
        );
        rule.delay = Some(DelayConfig::new(TimeSpan::from_millis(max_wait_ms), per_identity).unwrap());
        let mut config = LimiterConfig::default();
        config.rules.push(rule);
        config.max_delayed = cap;
        let store = MemoryStore::with_clock(TokioClock(tokio::time::Instant::now()));
        RateLimiter::from_config(&config, store).unwrap()
    }

    fn peer(n: u8) -> Option<IpAddr> {
        Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, n)))
    }

    /// (allowed, held for, retry_after of a denial in ms), when it ended.
    type Answer = (bool, Option<Duration>, Option<u64>);

    async fn request(limiter: &Limiter, client: u8) -> Answer {
        let verdict =
            limiter.check_request(&Method::GET, "/api/x", &HeaderMap::new(), peer(client)).await.unwrap();
        let wait = verdict.decisive().and_then(|p| p.decision.retry_after).map(|d| d.as_millis() as u64);
        (verdict.allowed(), verdict.delayed(), wait.filter(|_| !verdict.allowed()))
    }

    /// A request in a task of its own, once it is held.
    async fn held(limiter: &Limiter, client: u8) -> tokio::task::JoinHandle<Answer> {
        let before = limiter.delayed_now();
        let l = limiter.clone();
        let task = tokio::spawn(async move { request(&l, client).await });
        while limiter.delayed_now() == before {
            assert!(!task.is_finished(), "answered at once, not held");
            tokio::task::yield_now().await;
        }
        task
    }

    #[tokio::test(start_paused = true)]
    async fn the_third_waits_and_is_allowed_the_fourth_beyond_the_queue_is_refused_at_once() {
        let limiter = limiter(600, 1, 10);
        let start = tokio::time::Instant::now();
        assert_eq!(request(&limiter, 1).await, (true, None, None));
        assert_eq!(request(&limiter, 1).await, (true, None, None));
        let third = held(&limiter, 1).await;
        assert_eq!(request(&limiter, 1).await, (false, None, Some(500)), "the queue of one is full");
        assert_eq!(start.elapsed(), Duration::ZERO, "refused at once");
        assert_eq!(third.await.unwrap(), (true, Some(Duration::from_millis(500)), None));
        assert_eq!(limiter.delayed_now(), 0);
        let c = limiter.metrics().rule(0);
        let counts = [&c.allowed, &c.denied, &c.delayed, &c.delayed_ms].map(|a| a.load(Relaxed));
        assert_eq!(counts, [3, 1, 1, 500]);
        let text = limiter.render_metrics();
        assert!(text.contains("\nslidegate_delayed_requests 0\n"), "{text}");
        assert!(text.contains("\nslidegate_delayed_requests_max 10\n"), "{text}");
        assert!(text.contains("slidegate_requests_delayed_total{rule=\"api\"} 1\n"), "{text}");
        assert!(text.contains("slidegate_delayed_seconds_total{rule=\"api\"} 0.5\n"), "{text}");
    }

    /// A wait beyond `max_wait` is refused at once, as without `delay`.
    #[tokio::test(start_paused = true)]
    async fn a_wait_longer_than_max_wait_is_refused_at_once() {
        let limiter = limiter(400, 4, 10);
        request(&limiter, 1).await;
        request(&limiter, 1).await;
        assert_eq!(request(&limiter, 1).await, (false, None, Some(500)));
        assert_eq!(limiter.metrics().rule(0).delayed_ms.load(Relaxed), 0);
    }

    /// Four held at once wake together: one is allowed at each turn, the
    /// others are denied again and held on while their new wait fits in
    /// `max_wait`; each has its turn.
    #[tokio::test(start_paused = true)]
    async fn requests_held_together_each_have_their_turn_within_max_wait() {
        // A cap of 100: one client alone holds up to a fifth of it.
        let limiter = limiter(2_000, 4, 100);
        request(&limiter, 1).await;
        request(&limiter, 1).await;
        let mut tasks = Vec::new();
        for _ in 0..4 {
            tasks.push(held(&limiter, 1).await);
        }
        let mut held = Vec::new();
        for task in tasks {
            let (allowed, delayed, _) = task.await.unwrap();
            held.push((allowed, delayed.unwrap().as_millis()));
        }
        held.sort();
        assert_eq!(held, [(true, 500), (true, 1_000), (true, 1_500), (true, 2_000)]);
    }

    /// With less time left than the next wait, a request denied again is
    /// refused: three held together under a `max_wait` with room for two turns.
    #[tokio::test(start_paused = true)]
    async fn a_request_whose_turn_would_come_after_max_wait_is_refused_then() {
        let limiter = limiter(1_000, 4, 100);
        request(&limiter, 1).await;
        request(&limiter, 1).await;
        let mut tasks = Vec::new();
        for _ in 0..3 {
            tasks.push(held(&limiter, 1).await);
        }
        let mut answers = Vec::new();
        for task in tasks {
            let (allowed, delayed, wait) = task.await.unwrap();
            answers.push((allowed, delayed.unwrap().as_millis(), wait));
        }
        answers.sort();
        assert_eq!(answers, [(false, 1_000, Some(500)), (true, 500, None), (true, 1_000, None)]);
        let c = limiter.metrics().rule(0);
        assert_eq!([&c.allowed, &c.denied, &c.delayed].map(|a| a.load(Relaxed)), [4, 1, 2]);
    }

    /// A held request whose future is dropped (the client hung up) frees its
    /// places at once; the request was never charged.
    #[tokio::test(start_paused = true)]
    async fn a_dropped_request_frees_its_place() {
        let limiter = limiter(600, 1, 10);
        request(&limiter, 1).await;
        request(&limiter, 1).await;
        let gone = held(&limiter, 1).await;
        gone.abort();
        assert!(gone.await.unwrap_err().is_cancelled());
        assert_eq!(limiter.delayed_now(), 0);
        let next = held(&limiter, 1).await;
        assert_eq!(
            next.await.unwrap(),
            (true, Some(Duration::from_millis(500)), None),
            "its permit was left"
        );
    }

    /// Many identities at once never hold more than the cap; the rest are
    /// refused at once, and every held one ends allowed.
    #[tokio::test(start_paused = true)]
    async fn many_identities_never_hold_more_than_the_cap() {
        let limiter = limiter(600, 4, 5);
        let mut tasks = Vec::new();
        let mut refused = 0;
        for client in 0..40u8 {
            request(&limiter, client).await;
            request(&limiter, client).await;
            if limiter.delayed_now() < 5 {
                tasks.push(held(&limiter, client).await);
            } else {
                assert_eq!(request(&limiter, client).await, (false, None, Some(500)));
                refused += 1;
            }
            assert!(limiter.delayed_now() <= 5);
        }
        assert_eq!((tasks.len(), refused), (5, 35));
        for task in tasks {
            assert_eq!(task.await.unwrap(), (true, Some(Duration::from_millis(500)), None));
        }
    }

    /// A reload keeps the places held when the cap is unchanged.
    #[tokio::test(start_paused = true)]
    async fn a_reload_with_the_same_cap_shares_what_is_held() {
        let old = limiter(600, 1, 3);
        request(&old, 1).await;
        request(&old, 1).await;
        let task = held(&old, 1).await;
        let mut config = LimiterConfig { max_delayed: 3, ..Default::default() };
        let same = old.reconfigure(&config).unwrap();
        assert_eq!(same.delayed_now(), 1);
        config.max_delayed = 4;
        assert_eq!(old.reconfigure(&config).unwrap().delayed_now(), 0, "a new cap counts anew");
        task.await.unwrap();
    }
}
