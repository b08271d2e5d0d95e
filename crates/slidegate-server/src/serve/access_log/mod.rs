//! The access log (`[access_log]`): one JSON object a line per decision,
//! written by a thread of its own so that no request ever waits for a disk.
//!
//! A worker that decides a request makes an [`Entry`] from the verdict (the
//! rule, the keyed hash of the identity, the outcome) and, once the response
//! head is ready, hands it with the status to a bounded channel. The writer
//! thread takes what is waiting every 10 ms, formats, writes and flushes;
//! when the channel is full (a disk slower than the traffic) the record is
//! dropped and counted in `slidegate_access_log_dropped_total`, never
//! waited for. When the server shuts down, after its workers have finished,
//! the writer writes what is left and flushes.
//!
//! Sampling is deterministic: with `sample_allowed = p` the allowed request
//! that brings the running count of allowed requests from `n - 1` to `n` is
//! logged when `⌊n·p⌋` grows (in millionths), so exactly `⌊N·p⌋` of `N`
//! allowed requests are logged — every 100th at 0.01 — over all workers.
//! Requests an allow list exempts are sampled with them (a health checker
//! would fill the log); every other outcome (a denial, a block, a deny
//! list's refusal, a failing store) is logged.
//!
//! Never written: the API key, the client address, the query string (it
//! may carry tokens). The identity is the 16-hex-digit keyed hash the top
//! offenders page shows.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http::Method;
use serde::Serialize;
use slidegate_http::offenders::IdentityHash;
use slidegate_http::{DecisionSource, ListScope, Verdict};

use crate::config::{AccessLogConfig, AccessLogPath};

/// Records waiting for the writer: a few MB at most; a burst longer than
/// the disk can absorb is dropped, not queued.
pub(crate) const CAPACITY: usize = 16_384;

/// How often the writer takes what is waiting (see [`write_lines`]).
const POLL: Duration = Duration::from_millis(10);

/// Sampling granularity: `sample_allowed` in millionths.
const MILLION: u64 = 1_000_000;

/// What the workers hold: the channel to the writer, the sampler and the
/// drop counter. Cloned into each worker.
#[derive(Clone)]
pub(crate) struct AccessLog {
    sender: SyncSender<Record>,
    shared: Arc<Shared>,
}

struct Shared {
    /// `sample_allowed` in millionths.
    sample_ppm: u64,
    /// Allowed requests seen, for sampling.
    allowed: AtomicU64,
    /// Records dropped because the channel was full.
    dropped: AtomicU64,
    /// Set by [`AccessLog::reopen`], read by the writer before its next line.
    reopen: AtomicBool,
}

/// The writer thread; [`Writer::finish`] waits for it to write what is left.
pub(crate) struct Writer {
    thread: JoinHandle<()>,
}

/// What a decision logs, made when the verdict is known; the status comes
/// with the response.
pub(crate) struct Entry {
    record: Record,
}

/// One line of the access log, before formatting.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Record {
    pub(crate) time: SystemTime,
    pub(crate) rule: String,
    /// The decisive limit (the denying one with the longest wait, or the
    /// one with the fewest permits left); `None` when nobody decided.
    pub(crate) policy: Option<String>,
    pub(crate) identity: IdentityHash,
    pub(crate) outcome: Outcome,
    pub(crate) remaining: Option<u64>,
    /// How long the decision took: the store call and the limiter around it.
    pub(crate) decide: Duration,
    /// How long a rule's `delay` held the request, apart from `decide`.
    pub(crate) held: Option<Duration>,
    pub(crate) source: Source,
    pub(crate) method: Method,
    pub(crate) status: u16,
    /// The path without the query.
    pub(crate) path: String,
}

/// What became of the request, as the line says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Allowed,
    /// Held by the rule's `delay`, then allowed.
    Delayed,
    Denied,
    /// The identity is in the rule's penalty box.
    Blocked,
    /// Over the rule's `max_in_flight`.
    InFlight,
    ShadowDenied,
    ShadowBlocked,
    ShadowInFlight,
    /// The store failed and the rule let the request through.
    FailOpen,
    /// The store failed and the rule refused the request.
    FailClosed,
    /// An allow list named the client: not limited (sampled as allowed).
    Exempt,
    /// A deny list named the client: refused with 403.
    ListedDenied,
}

/// Who answered: the store, its deny cache, the fallback, or nobody.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    Store,
    Cache,
    Fallback,
    /// The global allow or deny list.
    GlobalList,
    /// The rule's allow or deny list.
    RuleList,
    None,
}

impl Outcome {
    fn of(verdict: &Verdict<'_>) -> Self {
        match verdict.source {
            DecisionSource::FailOpen => return Outcome::FailOpen,
            DecisionSource::FailClosed => return Outcome::FailClosed,
            DecisionSource::AllowList(_) => return Outcome::Exempt,
            DecisionSource::DenyList(_) => return Outcome::ListedDenied,
            DecisionSource::Store | DecisionSource::Fallback => {}
        }
        if verdict.allowed() {
            return if verdict.delayed().is_some() { Outcome::Delayed } else { Outcome::Allowed };
        }
        match (verdict.blocked, verdict.over_in_flight().is_some(), verdict.shadow) {
            (true, _, false) => Outcome::Blocked,
            (true, _, true) => Outcome::ShadowBlocked,
            (false, true, false) => Outcome::InFlight,
            (false, true, true) => Outcome::ShadowInFlight,
            (false, false, false) => Outcome::Denied,
            (false, false, true) => Outcome::ShadowDenied,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Delayed => "delayed",
            Outcome::Denied => "denied",
            Outcome::Blocked => "blocked",
            Outcome::InFlight => "in_flight",
            Outcome::ShadowDenied => "shadow_denied",
            Outcome::ShadowBlocked => "shadow_blocked",
            Outcome::ShadowInFlight => "shadow_in_flight",
            Outcome::FailOpen => "fail_open",
            Outcome::FailClosed => "fail_closed",
            Outcome::Exempt => "exempt",
            Outcome::ListedDenied => "listed_denied",
        }
    }
}

impl Source {
    fn of(verdict: &Verdict<'_>) -> Self {
        match verdict.source {
            DecisionSource::Store if verdict.cached() => Source::Cache,
            DecisionSource::Store => Source::Store,
            DecisionSource::Fallback => Source::Fallback,
            DecisionSource::AllowList(ListScope::Global) | DecisionSource::DenyList(ListScope::Global) => {
                Source::GlobalList
            }
            DecisionSource::AllowList(ListScope::Rule) | DecisionSource::DenyList(ListScope::Rule) => {
                Source::RuleList
            }
            DecisionSource::FailOpen | DecisionSource::FailClosed => Source::None,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Source::Store => "store",
            Source::Cache => "cache",
            Source::Fallback => "fallback",
            Source::GlobalList => "global_list",
            Source::RuleList => "rule_list",
            Source::None => "none",
        }
    }
}

impl AccessLog {
    /// Opens the log `config` names and starts its writer thread.
    ///
    /// # Errors
    /// The file cannot be opened for appending.
    pub(crate) fn start(config: &AccessLogConfig) -> io::Result<(Self, Writer)> {
        Self::start_with(config, CAPACITY)
    }

    fn start_with(config: &AccessLogConfig, capacity: usize) -> io::Result<(Self, Writer)> {
        let output = Output::open(&config.path)?;
        let (log, receiver) = Self::channel(config, capacity);
        let shared = Arc::clone(&log.shared);
        let thread = std::thread::Builder::new()
            .name("slidegate-access-log".into())
            .spawn(move || write_lines(&receiver, output, &shared))?;
        Ok((log, Writer { thread }))
    }

    /// The handle and the receiving end of its channel, with no writer yet.
    fn channel(config: &AccessLogConfig, capacity: usize) -> (Self, Receiver<Record>) {
        let (sender, receiver) = mpsc::sync_channel(capacity);
        let shared = Arc::new(Shared {
            sample_ppm: (config.sample_allowed * MILLION as f64).round() as u64,
            allowed: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            reopen: AtomicBool::new(false),
        });
        (Self { sender, shared }, receiver)
    }

    /// The entry of a decided request, or `None` when it is an allowed
    /// request sampling leaves out. `started` is when the decision began;
    /// `path` is the request's path, without its query.
    pub(crate) fn entry(
        &self,
        verdict: &Verdict<'_>,
        method: &Method,
        path: &str,
        started: Instant,
    ) -> Option<Entry> {
        let outcome = Outcome::of(verdict);
        if matches!(outcome, Outcome::Allowed | Outcome::Exempt) && !self.samples_allowed() {
            return None;
        }
        // Read after sampling: a request left out reads the clock once only.
        let held = verdict.delayed();
        let decide = started.elapsed().saturating_sub(held.unwrap_or_default());
        let decisive = verdict.decisive();
        Some(Entry {
            record: Record {
                time: SystemTime::now(),
                rule: verdict.rule.to_owned(),
                policy: decisive.map(|p| p.name.to_owned()),
                identity: verdict.identity_hash(),
                outcome,
                remaining: decisive.map(|p| p.decision.remaining),
                decide,
                held,
                source: Source::of(verdict),
                method: method.clone(),
                status: 0,
                path: path.to_owned(),
            },
        })
    }

    /// Whether this allowed request is one of those logged: the running
    /// count's share crosses a whole number (see the module docs).
    fn samples_allowed(&self) -> bool {
        match self.shared.sample_ppm {
            0 => false,
            MILLION.. => true,
            ppm => {
                let n = u128::from(self.shared.allowed.fetch_add(1, Relaxed)) + 1;
                let ppm = u128::from(ppm);
                (n * ppm) / u128::from(MILLION) > ((n - 1) * ppm) / u128::from(MILLION)
            }
        }
    }

    /// Logs `entry` with the status the client was sent; drops it (counted)
    /// if the writer is behind.
    pub(crate) fn write(&self, mut entry: Entry, status: http::StatusCode) {
        entry.record.status = status.as_u16();
        match self.sender.try_send(entry.record) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.shared.dropped.fetch_add(1, Relaxed);
            }
        }
    }

    /// Records dropped because the writer was behind.
    pub(crate) fn dropped(&self) -> u64 {
        self.shared.dropped.load(Relaxed)
    }

    /// What reopens the file (see [`AccessLogReopen`]).
    pub(crate) fn reopener(&self) -> AccessLogReopen {
        AccessLogReopen { shared: Arc::clone(&self.shared) }
    }
}

/// Has the access log's writer reopen its file, for a rotation that moves
/// the file away (`logrotate` without `copytruncate`): call
/// [`AccessLogReopen::reopen`] after the move, on SIGHUP say.
#[derive(Clone)]
pub struct AccessLogReopen {
    shared: Arc<Shared>,
}

impl AccessLogReopen {
    /// The writer reopens the file (creating it) before its next line; the
    /// lines before go to the file it had open. Nothing for standard output.
    pub fn reopen(&self) {
        self.shared.reopen.store(true, Relaxed);
    }
}

impl std::fmt::Debug for AccessLogReopen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AccessLogReopen")
    }
}

impl Writer {
    /// Waits for the writer to write and flush every record sent. Call it
    /// once every [`AccessLog`] handle is dropped (the workers have ended),
    /// or it waits for them.
    pub(crate) fn finish(self) {
        if self.thread.join().is_err() {
            tracing::error!("the access log writer panicked");
        }
    }
}

/// The `slidegate_access_log_dropped` counter family, appended to `/metrics`
/// as OpenMetrics text: the family is named without `_total`, its sample
/// with it.
pub(crate) fn render_metrics(log: &AccessLog, body: &mut String) {
    use std::fmt::Write as _;
    let _ = write!(
        body,
        "# HELP slidegate_access_log_dropped Access log lines dropped because the writer was behind.\n\
         # TYPE slidegate_access_log_dropped counter\n\
         slidegate_access_log_dropped_total {}\n",
        log.dropped()
    );
}

/// Logs `entry`, if any, with the status of `response`, and returns it.
pub(crate) fn logged(
    log: Option<&AccessLog>,
    entry: Option<Entry>,
    response: http::Response<super::ServeBody>,
) -> http::Response<super::ServeBody> {
    if let (Some(log), Some(entry)) = (log, entry) {
        log.write(entry, response.status());
    }
    response
}

/// The writer thread: every [`POLL`], formats and writes the records
/// waiting, then flushes, until every sender is gone and the channel empty.
///
/// It polls rather than blocks on the channel: a receiver blocked on it is
/// woken by the next send with a system call on the worker's thread (a
/// futex wake), and with that and a write per line, logging every request
/// took 1.5× the CPU of a request without the log (BENCHMARKS.md, The
/// access log); a sender that finds no one waiting makes no system call.
/// The queue holds [`CAPACITY`] records, a [`POLL`] of lines at 1.6
/// million a second.
fn write_lines(receiver: &Receiver<Record>, mut output: Output, shared: &Shared) {
    let mut line = Vec::with_capacity(512);
    let mut failing = false;
    loop {
        let mut wrote = false;
        loop {
            let record = match receiver.try_recv() {
                Ok(record) => record,
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    report(output.flush(), &mut failing);
                    return;
                }
            };
            if shared.reopen.swap(false, Relaxed) {
                report(output.reopen(), &mut failing);
            }
            line.clear();
            record.write_json(&mut line);
            report(output.write_all(&line), &mut failing);
            wrote = true;
        }
        if wrote {
            report(output.flush(), &mut failing);
        }
        std::thread::sleep(POLL);
    }
}

/// Logs the first failure of a run of failed writes (a full disk would
/// otherwise log once per line), and the recovery.
fn report(result: io::Result<()>, failing: &mut bool) {
    match (result, *failing) {
        (Ok(()), true) => {
            *failing = false;
            tracing::info!("the access log is written again");
        }
        (Err(err), false) => {
            *failing = true;
            tracing::error!(%err, "cannot write the access log: lines are lost until it can");
        }
        _ => {}
    }
}

/// Where the lines go.
enum Output {
    Stdout(BufWriter<io::Stdout>),
    File { path: std::path::PathBuf, file: BufWriter<File> },
}

impl Output {
    fn open(path: &AccessLogPath) -> io::Result<Self> {
        Ok(match path {
            AccessLogPath::Stdout => Output::Stdout(BufWriter::with_capacity(64 * 1024, io::stdout())),
            AccessLogPath::File(path) => Output::File { path: path.clone(), file: append(path)? },
        })
    }

    fn reopen(&mut self) -> io::Result<()> {
        if let Output::File { path, file } = self {
            file.flush()?;
            *file = append(path)?;
        }
        Ok(())
    }

    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Output::Stdout(out) => out.write_all(bytes),
            Output::File { file, .. } => file.write_all(bytes),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Output::Stdout(out) => out.flush(),
            Output::File { file, .. } => file.flush(),
        }
    }
}

/// Opened for appending: every write lands at the end even after a
/// `copytruncate` rotation emptied the file.
fn append(path: &std::path::Path) -> io::Result<BufWriter<File>> {
    let file = OpenOptions::new().create(true).append(true).open(path)?;
    Ok(BufWriter::with_capacity(64 * 1024, file))
}

/// The line as serialized: field order is the order written.
#[derive(Serialize)]
struct Line<'a> {
    time: &'a str,
    rule: &'a str,
    policy: Option<&'a str>,
    identity: &'a str,
    kind: &'static str,
    outcome: &'static str,
    remaining: Option<u64>,
    decide_us: u64,
    /// Only on a request a rule's `delay` held.
    #[serde(skip_serializing_if = "Option::is_none")]
    held_ms: Option<u64>,
    source: &'static str,
    method: &'a str,
    status: u16,
    path: &'a str,
}

impl Record {
    /// Appends the record as one JSON object and a newline.
    pub(crate) fn write_json(&self, out: &mut Vec<u8>) {
        let time = rfc3339_millis(self.time);
        let identity = self.identity.short_hex();
        let line = Line {
            time: &time,
            rule: &self.rule,
            policy: self.policy.as_deref(),
            identity: &identity,
            kind: self.identity.kind().as_str(),
            outcome: self.outcome.as_str(),
            remaining: self.remaining,
            decide_us: u64::try_from(self.decide.as_micros()).unwrap_or(u64::MAX),
            held_ms: self.held.map(|h| u64::try_from(h.as_millis()).unwrap_or(u64::MAX)),
            source: self.source.as_str(),
            method: self.method.as_str(),
            status: self.status,
            path: &self.path,
        };
        // Writing plain fields to a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, &line);
        out.push(b'\n');
    }
}

/// `time` as `2026-12-01T19:46:11.123Z` (UTC, milliseconds).
fn rfc3339_millis(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60,
        since.subsec_millis()
    )
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, for days ≥ 0).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests;
