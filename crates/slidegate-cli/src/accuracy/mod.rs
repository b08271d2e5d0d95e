//! `slidegate accuracy`: synthetic traffic replayed through every algorithm
//! and scored against the exact sliding log (see `accuracy/replay.rs` for the
//! precise definitions of the three figures), and again with quota leases
//! on for the algorithms that lease (`accuracy/leases.rs`).

mod leases;
mod replay;
mod traffic;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::{json, Map, Value};
use slidegate::protect::LeasePolicy;
use slidegate::store::lease::leasable;
use slidegate::{Algorithm, Quota};

use self::leases::LeaseScore;
use self::replay::AlgorithmReport;
use self::traffic::Class;

/// Arguments of `slidegate accuracy`.
#[derive(clap::Args)]
pub struct AccuracyArgs {
    /// Requests to replay (about 16 bytes of memory each).
    #[arg(long, default_value_t = 1_000_000, value_parser = crate::args::count(1..=100_000_000))]
    requests: usize,
    /// Distinct sources (55% steady, 25% near the limit, 12% bursty scrapers, 8% boundary attackers).
    #[arg(long, default_value_t = 2_000, value_parser = crate::args::count(1..=10_000_000))]
    sources: usize,
    /// Seed of the traffic generator: the same seed gives the same figures.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The limit every source is held to, per window.
    #[arg(long, default_value_t = 100)]
    limit: u64,
    /// The window, in seconds.
    #[arg(long, default_value_t = 60)]
    window_secs: u64,
    /// Lease layers (instances) sharing one store, requests dealt to them
    /// round-robin, for the leased section (0: leave it out).
    #[arg(long, default_value_t = 3, value_parser = crate::args::count(0..=64))]
    lease_instances: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Write SVG charts into this directory.
    #[arg(long, value_name = "DIR")]
    plot: Option<PathBuf>,
}

/// Runs `slidegate accuracy`.
pub fn run(args: AccuracyArgs) -> crate::exit::CommandResult {
    let quota = Quota::new(args.limit, std::time::Duration::from_secs(args.window_secs))?;
    let traffic =
        traffic::generate(args.requests, args.sources, quota.permits(), quota.window_ms(), args.seed);
    let leased: Vec<Algorithm> =
        Algorithm::ALL.into_iter().filter(|a| args.lease_instances > 0 && leasable(*a)).collect();
    let total = traffic.requests.len() as u64 * (Algorithm::ALL.len() + leased.len()) as u64;
    let bar = if std::io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{msg:>22} {wide_bar} {pos}/{len} decisions ({eta})")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut reports = Vec::new();
    for algorithm in Algorithm::ALL {
        bar.set_message(algorithm.name());
        let report = replay::replay(algorithm, &traffic, &quota, |n| bar.inc(n));
        reports.push((algorithm, report));
    }
    let policy = LeasePolicy::default();
    let mut leased_reports = Vec::new();
    for algorithm in leased {
        bar.set_message(format!("{} leased", algorithm.name()));
        let score =
            leases::replay(algorithm, &traffic, &quota, args.lease_instances, policy, |n| bar.inc(n))?;
        leased_reports.push((algorithm, score));
    }
    bar.finish_and_clear();

    if let Some(dir) = &args.plot {
        plot(dir, &quota, &reports)?;
    }
    let leased = Leased { instances: args.lease_instances, policy, scores: leased_reports };
    if args.json {
        let mut json = to_json(&args, &traffic, &quota, &reports);
        json["leases"] = leases_json(&leased, &reports);
        outln!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        print_table(&args, &traffic, &quota, &reports);
        print_leases(&leased, &reports);
    }
    Ok(ExitCode::SUCCESS)
}

fn to_json(
    args: &AccuracyArgs,
    traffic: &traffic::Traffic,
    quota: &Quota,
    reports: &[(Algorithm, AlgorithmReport)],
) -> Value {
    let mut algorithms = Map::new();
    for (algorithm, report) in reports {
        let t = &report.total;
        let mut classes = Map::new();
        for (class, s) in &report.by_class {
            classes.insert(
                class.name().to_owned(),
                json!({
                    "requests": s.requests,
                    "wrongly_allowed_pct": s.wrongly_allowed_pct(),
                    "wrongly_denied_pct": s.wrongly_denied_pct(),
                    "avg_rate_diff_pct": s.avg_rate_diff_pct(),
                    "sources_over_limit": s.sources_over_limit,
                    "peak_admitted_in_a_window": s.peak_admitted,
                }),
            );
        }
        algorithms.insert(
            algorithm.name().to_owned(),
            json!({
                "wrongly_allowed_pct": t.wrongly_allowed_pct(),
                "wrongly_denied_pct": t.wrongly_denied_pct(),
                "avg_rate_diff_pct": t.avg_rate_diff_pct(),
                "allowed": t.allowed,
                "wrongly_allowed": t.wrongly_allowed,
                "wrongly_denied": t.wrongly_denied,
                "sources_over_limit": t.sources_over_limit,
                "peak_admitted_in_a_window": t.peak_admitted,
                "classes": classes,
            }),
        );
    }
    json!({
        "requests": traffic.requests.len(),
        "sources": traffic.classes.len(),
        "seed": args.seed,
        "limit": quota.permits(),
        "window_ms": quota.window_ms(),
        "algorithms": algorithms,
    })
}

/// The leased section: how it was run and each leased algorithm's score.
struct Leased {
    instances: usize,
    policy: LeasePolicy,
    scores: Vec<(Algorithm, LeaseScore)>,
}

/// What `algorithm` allowed without leases (one store, every request asked).
fn allowed_without(reports: &[(Algorithm, AlgorithmReport)], algorithm: Algorithm) -> u64 {
    reports.iter().find(|(a, _)| *a == algorithm).map_or(0, |(_, r)| r.total.allowed)
}

fn leases_json(leased: &Leased, reports: &[(Algorithm, AlgorithmReport)]) -> Value {
    let mut algorithms = Map::new();
    for (algorithm, s) in &leased.scores {
        algorithms.insert(
            algorithm.name().to_owned(),
            json!({
                "allowed": s.allowed,
                "allowed_without_leases": allowed_without(reports, *algorithm),
                "from_leases": s.from_leases,
                "from_leases_pct": s.leased_pct(),
                "refused_while_store_had_permits": s.refused_with_permits,
                "refused_while_store_had_permits_pct": s.refused_with_permits_pct(),
                "over_admitted": s.over_admitted,
            }),
        );
    }
    json!({
        "instances": leased.instances,
        "max": leased.policy.max,
        "horizon_ms": leased.policy.horizon.as_millis(),
        "algorithms": algorithms,
    })
}

fn print_leases(leased: &Leased, reports: &[(Algorithm, AlgorithmReport)]) {
    if leased.scores.is_empty() {
        return;
    }
    outln!();
    outln!(
        "with quota leases: {} instances on one store, round-robin, lease max {}, horizon {} ms;",
        leased.instances,
        leased.policy.max,
        leased.policy.horizon.as_millis()
    );
    outln!("scored against the store's algorithm fed only the requests admitted");
    outln!(
        "{:<24} {:>14} {:>14} {:>14} {:>22} {:>14}",
        "algorithm",
        "allowed",
        "without leases",
        "from leases %",
        "refused w/ permits (%)",
        "over-admitted"
    );
    for (algorithm, s) in &leased.scores {
        outln!(
            "{:<24} {:>14} {:>14} {:>14.2} {:>22} {:>14}",
            algorithm.name(),
            s.allowed,
            allowed_without(reports, *algorithm),
            s.leased_pct(),
            format!("{} ({:.4})", s.refused_with_permits, s.refused_with_permits_pct()),
            s.over_admitted
        );
    }
}

fn print_table(
    args: &AccuracyArgs,
    traffic: &traffic::Traffic,
    quota: &Quota,
    reports: &[(Algorithm, AlgorithmReport)],
) {
    outln!(
        "{} requests from {} sources, limit {} (seed {}); ground truth: the exact sliding log",
        traffic.requests.len(),
        traffic.classes.len(),
        quota,
        args.seed
    );
    outln!(
        "{:<24} {:>18} {:>18} {:>16} {:>14} {:>12}",
        "algorithm",
        "wrongly allowed %",
        "wrongly denied %",
        "avg rate diff %",
        "sources over",
        "peak/window"
    );
    for (algorithm, report) in reports {
        let t = &report.total;
        outln!(
            "{:<24} {:>18.4} {:>18.4} {:>16.2} {:>14} {:>12}",
            algorithm.name(),
            t.wrongly_allowed_pct(),
            t.wrongly_denied_pct(),
            t.avg_rate_diff_pct(),
            t.sources_over_limit,
            t.peak_admitted
        );
    }
    outln!();
    outln!("wrongly allowed % by traffic class:");
    out!("{:<24}", "algorithm");
    for class in Class::ALL {
        out!(" {:>18}", class.name());
    }
    outln!();
    for (algorithm, report) in reports {
        out!("{:<24}", algorithm.name());
        for class in Class::ALL {
            out!(" {:>18.4}", report.by_class[&class].wrongly_allowed_pct());
        }
        outln!();
    }
}

fn plot(
    dir: &std::path::Path,
    quota: &Quota,
    reports: &[(Algorithm, AlgorithmReport)],
) -> std::io::Result<()> {
    let categories: Vec<&str> = Class::ALL.iter().map(|c| c.name()).collect();
    let per_class = |f: fn(&replay::Score) -> f64| -> Vec<(&str, Vec<f64>)> {
        reports
            .iter()
            .map(|(a, r)| (a.name(), Class::ALL.iter().map(|c| f(&r.by_class[c])).collect()))
            .collect()
    };
    crate::plot::grouped_bars_svg(
        &dir.join("accuracy_wrongly_allowed.svg"),
        "Requests wrongly allowed, by traffic class (vs exact sliding log)",
        "% of the class's requests",
        &categories,
        &per_class(replay::Score::wrongly_allowed_pct),
    )?;
    crate::plot::grouped_bars_svg(
        &dir.join("accuracy_wrongly_denied.svg"),
        "Requests wrongly denied, by traffic class (vs exact sliding log)",
        "% of the class's requests",
        &categories,
        &per_class(replay::Score::wrongly_denied_pct),
    )?;
    crate::plot::grouped_bars_svg(
        &dir.join("accuracy_rate_diff.svg"),
        "Average difference between estimated and real rate, by traffic class",
        "% of the real rate",
        &categories,
        &per_class(replay::Score::avg_rate_diff_pct),
    )?;
    // The first boundary attack of the first attacker, as each algorithm admitted it.
    let w = quota.window_ms();
    let first = reports.iter().filter_map(|(_, r)| r.attacker_admissions.first().copied()).min();
    if let Some(first) = first {
        // Attacks start just before a boundary: show the window before it and the one after.
        let origin = (first / w) * w;
        let series: Vec<(&str, Vec<(u64, u64)>)> = reports
            .iter()
            .map(|(a, r)| {
                let points = r
                    .attacker_admissions
                    .iter()
                    .filter(|&&t| t >= origin && t < origin + 2 * w)
                    .enumerate()
                    .map(|(n, &t)| (t - origin, n as u64 + 1))
                    .collect();
                (a.name(), points)
            })
            .collect();
        crate::plot::boundary_burst_svg(&dir.join("accuracy_boundary_attack.svg"), w, &series)?;
    }
    Ok(())
}
