//! Reloading the configuration while serving: `SIGHUP` (the binary's) and
//! `POST /admin/reload` both call [`Reloader::reload`].
//!
//! A reload reads the file `serve` was started with, validates it as
//! `check-config` does and against the listeners running (a rule charged
//! after the response is refused while the forward-auth listener runs,
//! whatever the file says of `auth_listen`), and builds a limiter for its
//! rules, identity and headers over the running one's store and layers
//! ([`RateLimiter::reconfigure`]); only then is the new limiter handed to
//! every worker, each of which takes it for its next request. A request
//! already decided keeps the limiter it was decided by until it ends
//! (charges after the response included), so no request sees half of each.
//! Anything wrong changes nothing.
//!
//! What the running process was built around is kept until a restart:
//! `[server]` (the listeners, threads, upstream and its pool, the admin
//! surface and its token) and `[store]` (the store, its connection and the
//! guard's layers). A reload that changes them applies the rest and names
//! them in [`Reloaded::restart_required`].
//!
//! `compare.rs` tells what a file changes from what runs; this module runs
//! one reload at a time and applies it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{mpsc, Arc, Condvar, Mutex, PoisonError, Weak};

use slidegate_http::RateLimiter;

use crate::config::Config;
use crate::store::AnyStore;

mod compare;

pub use compare::Reloaded;
use compare::{changes, located, restart_required};

/// One worker's limiter: what its next request is decided by.
///
/// Each worker holds its own `Arc` of the limiter, so a request's clone of
/// it touches a reference count no other thread writes (the limiter's own
/// `Arc` is shared by every worker: cloning it per request would bounce its
/// cache line between cores). The lock is held only to clone or replace it.
pub(crate) struct Current(Mutex<Arc<RateLimiter<AnyStore>>>);

impl Current {
    fn new(limiter: &RateLimiter<AnyStore>) -> Self {
        Self(Mutex::new(Arc::new(limiter.clone())))
    }

    /// The limiter to decide the next request by.
    pub(crate) fn get(&self) -> Arc<RateLimiter<AnyStore>> {
        Arc::clone(&self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn set(&self, limiter: &RateLimiter<AnyStore>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Arc::new(limiter.clone());
    }
}

/// Reloads the configuration of a running server. Cheap to clone.
#[derive(Clone)]
pub struct Reloader {
    inner: Arc<Shared>,
}

struct Shared {
    /// The file to read; `None` for a server built from a configuration in
    /// memory, which has nothing to reload.
    path: Option<PathBuf>,
    /// What the server runs with; locked to apply a reload and to hand out
    /// workers' handles.
    running: Mutex<Running>,
    /// The reloads asked for and run: one runs at a time, and the calls
    /// that arrive while it runs share the next one.
    turns: Mutex<Turns>,
    turn_over: Condvar,
    /// Hands a reload to the thread every reload runs on, started by the
    /// first. One thread, so one allocator arena: with glibc's allocator a
    /// reload run on whichever thread asked left its garbage in that
    /// thread's arena, out of the next reload's reach, and the process grew
    /// by about a configuration for each thread that had reloaded.
    reload_thread: Mutex<Option<mpsc::Sender<Answer>>>,
    reloads_ok: AtomicU64,
    reloads_failed: AtomicU64,
    /// The TLS listener's certificate: a reload presents the file's from
    /// the next handshake on (open connections keep theirs).
    certs: Option<Arc<super::tls::ListenerCerts>>,
}

impl Shared {
    fn turns(&self) -> std::sync::MutexGuard<'_, Turns> {
        self.turns.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Where a reload's answer goes back to the caller that asked for it.
type Answer = mpsc::Sender<Result<Reloaded, ReloadError>>;

/// The reloads run so far, numbered from 1.
///
/// A call that arrives while a reload runs cannot take that one's answer:
/// the file may have changed after that reload read it. It waits for the
/// next to start, which reads the file after the call arrived; every call
/// that waited meanwhile takes that same answer. So fifty parallel calls
/// (an endpoint, `SIGHUP`, the file watch) make at most two reloads, one
/// after the other, and never two configurations parsed at once (each in
/// memory whole: 50 at once of a 2,000-rule file peaked at ~500 MB).
#[derive(Default)]
struct Turns {
    started: u64,
    finished: u64,
    running: bool,
    /// The answer of reload number `finished`.
    answer: Option<Result<Reloaded, ReloadError>>,
}

/// What the server runs with now.
struct Running {
    config: Config,
    limiter: RateLimiter<AnyStore>,
    workers: Vec<Arc<Current>>,
    /// The Envoy rate limit service's limiter and descriptors.
    envoy: Vec<Arc<crate::envoy::Current>>,
}

/// Why a reload changed nothing.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ReloadError {
    /// The server was not started from a file.
    #[error("this server was not started from a configuration file: there is nothing to reload")]
    NoFile,
    /// The file does not validate: `check-config`'s errors, each located,
    /// one a line.
    #[error("the configuration was not reloaded: {0}")]
    Invalid(String),
}

impl Reloader {
    pub(super) fn new(
        path: Option<PathBuf>,
        config: Config,
        limiter: RateLimiter<AnyStore>,
        certs: Option<Arc<super::tls::ListenerCerts>>,
    ) -> Self {
        let running = Running { config, limiter, workers: Vec::new(), envoy: Vec::new() };
        Self {
            inner: Arc::new(Shared {
                path,
                running: Mutex::new(running),
                turns: Mutex::new(Turns::default()),
                turn_over: Condvar::new(),
                reload_thread: Mutex::new(None),
                reloads_ok: AtomicU64::new(0),
                reloads_failed: AtomicU64::new(0),
                certs,
            }),
        }
    }

    /// A worker's handle on the current limiter, replaced on every reload.
    pub(super) fn worker(&self) -> Arc<Current> {
        let mut running = self.lock();
        let current = Arc::new(Current::new(&running.limiter));
        running.workers.push(Arc::clone(&current));
        current
    }

    /// The Envoy rate limit service's handle on the current limiter and
    /// descriptors, replaced on every reload.
    pub(super) fn envoy(&self) -> Arc<crate::envoy::Current> {
        let mut running = self.lock();
        let current = Arc::new(crate::envoy::Current::new(&running.limiter, &running.config.envoy));
        running.envoy.push(Arc::clone(&current));
        current
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Running> {
        // A panic mid-reload left the previous configuration in place.
        self.inner.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads, validates and applies the configuration file; logs and counts
    /// the outcome. One reload runs at a time: a call made while one runs
    /// waits for the next, shared with every call that arrived meanwhile
    /// (see `Turns`), and answers what it did. Blocking (it reads a file, and
    /// may wait for a reload in progress): call it off a busy runtime
    /// thread.
    ///
    /// # Errors
    /// [`ReloadError`] when nothing changed.
    pub fn reload(&self) -> Result<Reloaded, ReloadError> {
        let mut turns = self.inner.turns();
        let covering = turns.started + 1;
        while turns.running && turns.finished < covering {
            turns = self.inner.turn_over.wait(turns).unwrap_or_else(PoisonError::into_inner);
        }
        if turns.finished >= covering {
            if let Some(answer) = &turns.answer {
                return answer.clone();
            }
        }
        turns.running = true;
        turns.started += 1;
        let number = turns.started;
        drop(turns);
        // Ends the turn even if the reload panics: the waiters then run
        // their own rather than wait for ever.
        struct TurnOver<'a>(&'a Shared, u64, Option<Result<Reloaded, ReloadError>>);
        impl Drop for TurnOver<'_> {
            fn drop(&mut self) {
                let mut turns = self.0.turns();
                turns.running = false;
                if let Some(answer) = self.2.take() {
                    turns.finished = self.1;
                    turns.answer = Some(answer);
                }
                self.0.turn_over.notify_all();
            }
        }
        let mut over = TurnOver(&self.inner, number, None);
        let answer = self.on_reload_thread();
        over.2 = Some(answer.clone());
        drop(over);
        answer
    }

    /// [`reload_now`](Self::reload_now) on the reload thread, started if
    /// it is not running (again, if it ended); on the caller's thread only
    /// if no thread can be started. A reload that panics is answered as an
    /// error, and the thread goes on.
    fn on_reload_thread(&self) -> Result<Reloaded, ReloadError> {
        let mut thread = self.inner.reload_thread.lock().unwrap_or_else(PoisonError::into_inner);
        let (answer, answered) = mpsc::channel();
        // Not taken: no thread yet, or it ended (its receiver is gone).
        let unsent = match thread.as_ref() {
            Some(jobs) => jobs.send(answer).err().map(|mpsc::SendError(answer)| answer),
            None => Some(answer),
        };
        if let Some(unsent) = unsent {
            *thread = None;
            let Some(jobs) = self.start_reload_thread() else {
                drop(thread);
                return self.reload_now();
            };
            // The thread was just started and holds the receiver.
            let _ = jobs.send(unsent);
            *thread = Some(jobs);
        }
        drop(thread);
        answered.recv().unwrap_or_else(|_| {
            Err(ReloadError::Invalid(
                "the reload thread ended unexpectedly; the running configuration stays".into(),
            ))
        })
    }

    /// Starts the reload thread; `None` if it cannot be.
    fn start_reload_thread(&self) -> Option<mpsc::Sender<Answer>> {
        let (jobs, queue) = mpsc::channel::<Answer>();
        // Weak: the thread ends once the server (and its sender) is gone.
        let shared: Weak<Shared> = Arc::downgrade(&self.inner);
        let started = std::thread::Builder::new().name("slidegate-reload".into()).spawn(move || {
            for answer in queue {
                let Some(inner) = shared.upgrade() else { return };
                let reloader = Reloader { inner };
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| reloader.reload_now()))
                    .unwrap_or_else(|_| {
                        Err(ReloadError::Invalid(
                            "the reload failed unexpectedly (a bug: see the log); the running configuration stays"
                                .into(),
                        ))
                    });
                let _ = answer.send(outcome);
            }
        });
        started.ok().map(|_| jobs)
    }

    fn reload_now(&self) -> Result<Reloaded, ReloadError> {
        let answer = self.try_reload();
        match &answer {
            Ok(reloaded) => {
                self.inner.reloads_ok.fetch_add(1, Relaxed);
                tracing::info!(
                    added = ?reloaded.rules_added,
                    removed = ?reloaded.rules_removed,
                    changed = ?reloaded.rules_changed,
                    limits_restarted = ?reloaded.limits_restarted,
                    plans_changed = ?reloaded.plans_changed,
                    plan_keys_changed = reloaded.plan_keys_changed,
                    lists_changed = reloaded.lists_changed,
                    "configuration reloaded"
                );
                if !reloaded.restart_required.is_empty() {
                    tracing::warn!(
                        settings = ?reloaded.restart_required,
                        "the file changes settings the running process keeps: each needs a restart"
                    );
                }
            }
            Err(err) => {
                self.inner.reloads_failed.fetch_add(1, Relaxed);
                tracing::error!(%err, "configuration reload failed; the running configuration stays");
            }
        }
        answer
    }

    fn try_reload(&self) -> Result<Reloaded, ReloadError> {
        let path = self.inner.path.as_ref().ok_or(ReloadError::NoFile)?;
        // Checked against the listeners running too: a reload keeps them.
        // `[server]` is the one the process started with (a reload keeps
        // it), read without holding the lock while the file is parsed.
        let started = self.lock().config.server.clone();
        let file =
            Config::load_to_reload(path, &started).map_err(|err| ReloadError::Invalid(located(&err)))?;
        let mut running = self.lock();
        let restart_required = restart_required(&running.config, &file);
        let file_tls = file.server.tls.clone();
        let mut applied = file;
        applied.server = running.config.server.clone();
        applied.store = running.config.store.clone();
        applied.limiter.guard = running.config.limiter.guard.clone();
        let limiter = running
            .limiter
            .reconfigure(&applied.limiter)
            .map_err(|err| ReloadError::Invalid(format!("{}: {err}", path.display())))?;
        let reloaded = Reloaded { restart_required, ..changes(&running.config, &applied) };
        applied.limiter.plans.keys.forget_raw_keys();
        for worker in &running.workers {
            worker.set(&limiter);
        }
        for envoy in &running.envoy {
            envoy.set(&limiter, &applied.envoy);
        }
        if let (Some(certs), Some(tls)) = (&self.inner.certs, file_tls) {
            certs.replace(tls.certified_key());
            applied.server.tls = Some(tls);
        }
        running.config = applied;
        running.limiter = limiter;
        Ok(reloaded)
    }

    /// The `slidegate_config_reloads` counter family, as OpenMetrics text:
    /// the family is named without `_total`, its samples with it.
    pub(super) fn render_metrics(&self, out: &mut String) {
        use std::fmt::Write as _;
        let _ = write!(
            out,
            "# HELP slidegate_config_reloads Configuration reloads, by outcome (error: nothing changed).\n\
             # TYPE slidegate_config_reloads counter\n\
             slidegate_config_reloads_total{{result=\"ok\"}} {}\n\
             slidegate_config_reloads_total{{result=\"error\"}} {}\n",
            self.inner.reloads_ok.load(Relaxed),
            self.inner.reloads_failed.load(Relaxed),
        );
    }
}
