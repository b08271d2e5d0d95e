//! Readiness apart from liveness, and the drain that begins a shutdown.
//!
//! `/healthz` says the process lives: it answers as long as a worker does,
//! whatever the store. `/readyz` says whether the instance should get
//! traffic: 200 when the config is loaded (it is, once `serve` serves; a
//! reload that fails keeps the old one) and either the store is reachable or
//! every rule decides without it (`on_error = "fallback"` or `"allow"`); 503
//! while the store is unreachable and some rule has `on_error = "deny"` (it
//! would refuse every request it matches), and 503 once a shutdown began.
//!
//! How the store is judged reachable, only when a deny rule makes it matter:
//! - the embedded store always is;
//! - an open circuit breaker means it is not, with no I/O: decisions skip
//!   the store then, and the breaker's own probe closes it when it answers;
//! - otherwise a check does what a decision does, a write (cost 1 of a
//!   billion per second, on an identity no rule has, expiring in 1 s) under
//!   the limiter's `timeout`. A write, not a `PING`: a Redis that refuses
//!   writes (out of memory) answers `PING` yet refuses every decision. The
//!   breaker alone would be cheaper but blind without traffic: a Redis dying
//!   while no request comes leaves it closed, and the instance would be
//!   ready until its first requests were refused. The check is made at most
//!   once per [`CHECK_REUSED_FOR`], however many probes ask (concurrent ones
//!   wait for it), so a probe costs the store at most one call a second per
//!   instance. On a Redis Cluster it reaches the node of its own key only.
//!
//! The drain ([`drain`]): on the shutdown signal `/readyz` turns 503 at once,
//! the listeners keep accepting for `drain_delay` (the time a load balancer
//! takes to stop sending new connections), and during it every response
//! carries `Connection: close`, so keep-alive clients reconnect, elsewhere
//! once the balancer has moved. `Server::run` then stops accepting and
//! finishes open connections within `shutdown_grace`.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use slidegate::{Algorithm, Charge, Digest, Identity, Limit, Quota, Request, Source, Store};
use slidegate_http::config::TimeSpan;
use slidegate_http::RateLimiter;
use tokio::sync::Mutex;

use crate::store::AnyStore;

/// How long one check of the store answers `/readyz`.
const CHECK_REUSED_FOR: Duration = Duration::from_secs(1);

/// Whether this instance should get traffic; shared by every worker.
pub(crate) struct Readiness {
    draining: AtomicBool,
    /// The store check's deadline: the limiter's `timeout`, a decision's.
    timeout: Duration,
    /// The last store check: when it ended, and what it found. Held across
    /// a check, so that concurrent probes wait for one check.
    last_check: Mutex<Option<(Instant, Result<(), String>)>>,
    /// The check's write: an identity no rule has, a charge always allowed.
    identity: Identity,
    charge: [Charge; 1],
}

/// What `/readyz` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// 200, with this text.
    Ready(String),
    /// 503, with this problem detail.
    NotReady(String),
}

impl Readiness {
    /// Ready, with store checks under `timeout`.
    pub(crate) fn new(timeout: TimeSpan) -> Self {
        let quota =
            Quota::new(1_000_000_000, Duration::from_secs(1)).expect("10^9 per second is a valid quota");
        Self {
            draining: AtomicBool::new(false),
            timeout: timeout.get(),
            last_check: Mutex::new(None),
            identity: Identity::new("slidegate-readyz", Source::Named, Digest([0; 16])),
            charge: [Charge::new(Limit::new(Algorithm::FixedWindow, quota), 1)],
        }
    }

    /// Whether a shutdown began.
    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// What `/readyz` answers now.
    pub(crate) async fn answer(&self, limiter: &RateLimiter<AnyStore>) -> Answer {
        if self.is_draining() {
            return Answer::NotReady(
                "draining: a shutdown began; open requests are finished, new traffic belongs elsewhere"
                    .into(),
            );
        }
        let denying = limiter.rules_denying_without_store();
        if denying.is_empty() {
            // Nothing to check: the instance decides either way. Say what is
            // known without asking the store.
            return Answer::Ready(match unreachable_now(limiter) {
                None => "ready\n".into(),
                Some(why) => format!(
                    "ready: the rate limit store is unreachable ({why}); every rule decides without it \
                     (on_error = \"fallback\" or \"allow\")\n"
                ),
            });
        }
        let found = match limiter.store() {
            AnyStore::Memory(_) => Ok(()),
            AnyStore::Redis(_) if limiter.breaker_open() => Err("circuit breaker open".to_owned()),
            store @ AnyStore::Redis(_) => self.check(store).await,
        };
        match found {
            Ok(()) => Answer::Ready("ready\n".into()),
            Err(why) => {
                let names = denying.iter().map(|name| format!("{name:?}")).collect::<Vec<_>>().join(", ");
                let (rules, have, they, refuse, match_) = if denying.len() == 1 {
                    ("rule", "has", "it", "refuses", "matches")
                } else {
                    ("rules", "have", "they", "refuse", "match")
                };
                Answer::NotReady(format!(
                    "the rate limit store is unreachable ({why}) and {rules} {names} {have} on_error = \"deny\": \
                     {they} {refuse} every request {they} {match_} until the store answers"
                ))
            }
        }
    }

    /// The last check if it is recent, else a new one.
    async fn check(&self, store: &AnyStore) -> Result<(), String> {
        let mut last = self.last_check.lock().await;
        if let Some((at, found)) = &*last {
            if at.elapsed() < CHECK_REUSED_FOR {
                return found.clone();
            }
        }
        let request = Request::new(&self.identity, &self.charge).with_deadline(Instant::now() + self.timeout);
        // An unconnected store fails at once, and starts connecting.
        let found = match tokio::time::timeout(self.timeout, store.decide(request)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(err)) => Err(err.to_string()),
            Err(_) => Err(format!("no answer within {} ms", self.timeout.as_millis())),
        };
        *last = Some((Instant::now(), found.clone()));
        found
    }
}

/// Why the store is unreachable, as far as is known without asking it.
fn unreachable_now(limiter: &RateLimiter<AnyStore>) -> Option<&'static str> {
    match limiter.store() {
        AnyStore::Memory(_) => None,
        AnyStore::Redis(redis) if !redis.is_connected() => Some("not connected yet"),
        AnyStore::Redis(_) => limiter.breaker_open().then_some("circuit breaker open"),
    }
}

/// Completes `drain_delay` after `shutdown` does, having turned `/readyz`
/// 503 at the signal: the acceptor serves until then.
pub(crate) async fn drain(shutdown: impl Future<Output = ()>, readiness: &Readiness, drain_delay: TimeSpan) {
    shutdown.await;
    readiness.draining.store(true, Ordering::Relaxed);
    tracing::info!(
        drain_delay_ms = drain_delay.as_millis(),
        "draining: /readyz answers 503; new connections are still served for the drain delay"
    );
    tokio::time::sleep(drain_delay.get()).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use slidegate::MemoryStore;
    use slidegate_http::config::LimiterConfig;

    fn limiter() -> RateLimiter<AnyStore> {
        RateLimiter::from_config(&LimiterConfig::default(), AnyStore::Memory(MemoryStore::new())).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn the_drain_turns_readyz_503_at_the_signal_and_ends_after_the_delay() {
        let readiness = Readiness::new(TimeSpan::from_millis(50));
        let limiter = limiter();
        assert_eq!(readiness.answer(&limiter).await, Answer::Ready("ready\n".into()));
        let (signal, signalled) = tokio::sync::oneshot::channel::<()>();
        let start = tokio::time::Instant::now();
        let drain = drain(async { drop(signalled.await) }, &readiness, TimeSpan::from_secs(5));
        let mut drain = std::pin::pin!(drain);
        assert!(futures_poll(&mut drain).is_pending());
        assert!(!readiness.is_draining(), "not before the signal");
        signal.send(()).unwrap();
        assert!(futures_poll(&mut drain).is_pending());
        assert!(readiness.is_draining(), "at the signal");
        let Answer::NotReady(detail) = readiness.answer(&limiter).await else {
            panic!("ready while draining")
        };
        assert!(detail.starts_with("draining"), "{detail}");
        drain.await;
        assert_eq!(start.elapsed(), Duration::from_secs(5));
    }

    fn futures_poll<F: Future + Unpin>(future: &mut F) -> std::task::Poll<F::Output> {
        let waker = std::task::Waker::noop();
        std::pin::Pin::new(future).poll(&mut std::task::Context::from_waker(waker))
    }
}
