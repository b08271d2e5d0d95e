//! `slidegate replay`: recorded access logs through a config's rules on a
//! simulated clock, as fast as the machine allows, to see what the config
//! would have allowed, denied and blocked before enforcing it.
//!
//! The limiter is the one `serve` builds from the file (the same rules,
//! identities and hash secret), on the embedded store; what only `serve`
//! uses (`[server]`'s listeners, TLS files, token) is not asked for.
//! `replayer.rs` says how time, out-of-order lines and charges after the
//! response are handled. A malformed line (one dated before 2000 or in the
//! future too) is counted and listed by its line number, never fatal.
//!
//! Bounds. Memory grows with the rules and the identities seen, never with
//! the span of time a log covers: the chart keeps at most
//! [`tally::MAX_BUCKETS`] buckets per rule, widening them as the span grows.

mod access_log;
mod clip;
mod held;
mod line_reader;
mod replayer;
mod report;
mod tally;
mod timestamp;

use std::fs::File;
use std::io::{self, BufRead, BufReader, IsTerminal};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Instant, SystemTime};

use slidegate::{ManualClock, MemoryStore};
use slidegate_http::RateLimiter;
use slidegate_server::Config;

use self::line_reader::LineReader;
use self::replayer::Replayer;
use self::timestamp::Recorded;

/// EX_NOINPUT (sysexits.h): a log named on the command line cannot be read.
const EX_NOINPUT: u8 = 66;

/// Lines between two updates of the progress bar.
const PROGRESS_EVERY: u64 = 8192;

/// Arguments of `slidegate replay`.
#[derive(clap::Args)]
pub struct ReplayArgs {
    /// The configuration file (TOML), as `serve` reads it; no upstream is needed.
    #[arg(long, short, value_name = "FILE")]
    config: PathBuf,
    /// Access logs, replayed in the order given: nginx/Apache combined
    /// format, or JSON lines (time, method, path, ip, api_key or
    /// api_key_hash, status); `-` reads standard input.
    #[arg(value_name = "LOG", required = true)]
    logs: Vec<PathBuf>,
    /// Print the report as one JSON document.
    #[arg(long)]
    json: bool,
    /// Write a chart of refusals over time, per rule, to this SVG file.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Identities listed per rule, the most refused first.
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = crate::args::count(0..=10_000))]
    top: usize,
    /// Malformed lines listed with their line numbers (all are counted).
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = crate::args::count(0..=100_000))]
    show_malformed: usize,
}

/// A log opened for reading.
struct Log {
    name: String,
    reader: Box<dyn BufRead>,
}

/// Runs `slidegate replay`.
pub fn run(args: ReplayArgs) -> crate::exit::CommandResult {
    let mut config = match Config::load_limiter(&args.config) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("slidegate: {err}");
            return Ok(ExitCode::from(crate::exit::EX_USAGE));
        }
    };
    // The deny cache counts on the process's clock, not the replay's; it is
    // exact, so without it every decision is the same.
    config.guard.deny_cache = 0;
    // The replay holds what a rule's `delay` would, on its own clock; the
    // limiter answers at once (see `replayer`).
    let delays: Vec<_> = config.rules.iter_mut().map(|r| r.delay.take()).collect();
    // Every log is opened before anything is replayed: a typo in the last
    // name does not cost a long replay of the first.
    let mut logs = Vec::new();
    let mut total_bytes = Some(0u64);
    for path in &args.logs {
        match open(path) {
            Ok((log, size)) => {
                total_bytes = total_bytes.zip(size).map(|(a, b)| a + b);
                logs.push(log);
            }
            Err(err) => {
                eprintln!("slidegate: cannot open {}: {err}", path.display());
                return Ok(ExitCode::from(EX_NOINPUT));
            }
        }
    }

    let clock = ManualClock::new(0);
    let limiter = RateLimiter::from_config(&config, MemoryStore::with_clock(clock.clone()))?;
    let key_header = config.identity.api_key_header.clone();
    // Whole seconds: the range is printed, and a millisecond says nothing.
    let now_ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs().saturating_mul(1000));
    let recorded = Recorded::at(now_ms);
    let mut replay = Replayer::new(limiter, clock, &config.rules, key_header, args.show_malformed, recorded)
        .with_delays(delays, config.max_delayed);
    let bar = progress_bar(total_bytes);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let started = Instant::now();
    runtime.block_on(async {
        let mut done = 0;
        for log in logs {
            let mut reader = LineReader::new(log.reader);
            let mut number = 0u64;
            loop {
                let line = reader.next_line().map_err(|e| format!("cannot read {}: {e}", log.name))?;
                let Some(line) = line else { break };
                number += 1;
                replay.line(&log.name, number, line).await;
                if number.is_multiple_of(PROGRESS_EVERY) {
                    bar.set_position(done + reader.consumed);
                }
            }
            done += reader.consumed;
        }
        replay.finish().await;
        Ok::<_, String>(())
    })?;
    let wall = started.elapsed();
    bar.finish_and_clear();

    if let Some(path) = &args.svg {
        report::write_svg(path, &replay).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report::to_json(&replay, wall, args.top))?);
    } else {
        report::print_text(&replay, wall, args.top);
    }
    Ok(ExitCode::SUCCESS)
}

/// Opens `path` (`-`: standard input) with its size, when known.
fn open(path: &Path) -> io::Result<(Log, Option<u64>)> {
    if path.as_os_str() == "-" {
        return Ok((Log { name: "-".to_owned(), reader: Box::new(BufReader::new(io::stdin())) }, None));
    }
    let file = File::open(path)?;
    let meta = file.metadata()?;
    if meta.is_dir() {
        return Err(io::Error::other("it is a directory"));
    }
    let size = meta.is_file().then_some(meta.len());
    let reader = Box::new(BufReader::with_capacity(1 << 16, file));
    Ok((Log { name: path.display().to_string(), reader }, size))
}

/// A bar over the logs' bytes on a terminal (a spinner when a size is
/// unknown); nothing when stderr is piped.
fn progress_bar(total_bytes: Option<u64>) -> indicatif::ProgressBar {
    if !io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let (bar, template) = match total_bytes {
        Some(total) => {
            (indicatif::ProgressBar::new(total), "replaying {wide_bar} {bytes}/{total_bytes} ({eta})")
        }
        None => (indicatif::ProgressBar::new_spinner(), "replaying {spinner} {bytes}"),
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(template)
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}
