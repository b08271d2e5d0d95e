//! A finished replay as people read it (a table), as programs read it (one
//! JSON document with the same figures) and as a chart (refusals over time,
//! one line per rule). Identities appear only as the keyed hashes the
//! offenders page shows; no key or address is ever printed.

use std::io;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Map, Value};

use super::replayer::Replayer;
use super::tally::Counts;
use super::timestamp::{format_rfc3339, format_span};

/// The JSON document: every figure of the table, and the chart's series.
pub fn to_json(replay: &Replayer<'_>, wall: Duration, top: usize) -> Value {
    let (start, end) = (replay.first_ms, replay.now_ms);
    let rules: Vec<Value> = replay
        .rules()
        .iter()
        .zip(&replay.tallies)
        .map(|(rule, tally)| {
            let mut v = counts_json(&tally.counts);
            v["name"] = rule.name.clone().into();
            v["shadow"] = rule.shadow.into();
            v["top"] = tally
                .heaviest(top)
                .into_iter()
                .map(|(hash, counts)| {
                    let mut v = counts_json(&counts);
                    v["identity"] = hash.short_hex().into();
                    v["kind"] = hash.kind().as_str().into();
                    v
                })
                .collect();
            v
        })
        .collect();
    let mut over_time = Map::new();
    for (i, rule) in replay.rules().iter().enumerate() {
        over_time.insert(rule.name.clone(), replay.timeline.series(i).into());
    }
    json!({
        "lines": replay.lines,
        "requests": replay.requests,
        "unmatched": replay.unmatched,
        "refused": {
            "count": replay.refused.values().sum::<u64>(),
            "reasons": replay.refused.iter().map(|(reason, n)| json!({ "reason": reason, "requests": n }))
                .collect::<Vec<_>>(),
        },
        "malformed": {
            "count": replay.malformed,
            "out_of_range": {
                "lines": replay.out_of_range,
                "from": format_rfc3339(replay.recorded.from_ms),
                "until": format_rfc3339(replay.recorded.until_ms),
            },
            "first": replay.first_malformed.iter().map(|m| json!({
                "file": m.file, "line": m.line, "reason": m.reason,
            })).collect::<Vec<_>>(),
        },
        "out_of_order": { "lines": replay.out_of_order, "max_behind_ms": replay.max_behind_ms },
        "start": start.map(format_rfc3339),
        "end": end.map(format_rfc3339),
        "replayed_ms": replayed_ms(replay),
        "wall_ms": wall.as_secs_f64() * 1000.0,
        "lines_per_second": lines_per_second(replay, wall),
        "rules": rules,
        "denials_over_time": {
            "start": start.map(format_rfc3339),
            "bucket_ms": replay.timeline.bucket_ms(),
            "rules": over_time,
        },
    })
}

/// The table.
pub fn print_text(replay: &Replayer<'_>, wall: Duration, top: usize) {
    match (replay.first_ms, replay.now_ms) {
        (Some(start), Some(end)) => outln!(
            "replayed {} lines, {} to {} ({}), in {:.2} s: {:.0} lines/s",
            replay.lines,
            format_rfc3339(start),
            format_rfc3339(end),
            format_span(end - start),
            wall.as_secs_f64(),
            lines_per_second(replay, wall)
        ),
        _ => outln!("replayed {} lines: no request in them", replay.lines),
    }
    let late = if replay.out_of_order > 0 {
        format!(" (decided up to {} late)", format_span(replay.max_behind_ms))
    } else {
        String::new()
    };
    outln!(
        "  {} requests, {} matching no rule (not limited), {} refused before any rule (400), {} malformed, \
         {} out of order{late}",
        replay.requests,
        replay.unmatched,
        replay.refused.values().sum::<u64>(),
        replay.malformed,
        replay.out_of_order,
    );
    for (reason, n) in &replay.refused {
        outln!("  {n} refused: {reason}");
    }
    if replay.out_of_range > 0 {
        outln!(
            "  {} of the malformed lines are dated before {} or after {} (a day past this machine's clock): \
             not replayed",
            replay.out_of_range,
            format_rfc3339(replay.recorded.from_ms),
            format_rfc3339(replay.recorded.until_ms),
        );
    }
    outln!();
    let width = replay.rules().iter().map(|r| r.name.len()).max().unwrap_or(0).max(4);
    outln!(
        "{:<width$}  {:>10} {:>10} {:>10} {:>10} {:>10}",
        "rule",
        "requests",
        "allowed",
        "delayed",
        "denied",
        "blocked"
    );
    for (rule, tally) in replay.rules().iter().zip(&replay.tallies) {
        let c = &tally.counts;
        let shadow = if rule.shadow { "  shadow: nothing refused, counted as it would be" } else { "" };
        outln!(
            "{:<width$}  {:>10} {:>10} {:>10} {:>10} {:>10}{shadow}",
            rule.name,
            c.requests,
            c.allowed,
            c.delayed,
            c.denied,
            c.blocked
        );
    }
    let heaviest: Vec<_> = replay
        .rules()
        .iter()
        .zip(&replay.tallies)
        .flat_map(|(rule, tally)| tally.heaviest(top).into_iter().map(move |(h, c)| (rule, h, c)))
        .collect();
    if !heaviest.is_empty() {
        outln!();
        outln!("heaviest identities, by refusals (keyed hashes, as the offenders page shows them):");
        outln!(
            "{:<width$}  {:<7} {:<16} {:>10} {:>10} {:>10} {:>10} {:>10}",
            "rule",
            "kind",
            "identity",
            "requests",
            "allowed",
            "delayed",
            "denied",
            "blocked"
        );
        for (rule, hash, c) in heaviest {
            outln!(
                "{:<width$}  {:<7} {:<16} {:>10} {:>10} {:>10} {:>10} {:>10}",
                rule.name,
                hash.kind().as_str(),
                hash.short_hex(),
                c.requests,
                c.allowed,
                c.delayed,
                c.denied,
                c.blocked
            );
        }
    }
    if !replay.first_malformed.is_empty() {
        outln!();
        outln!("malformed lines (the first {} of {}):", replay.first_malformed.len(), replay.malformed);
        for m in &replay.first_malformed {
            outln!("  {}:{}: {}", m.file, m.line, m.reason);
        }
    }
}

/// The chart: refusals per bucket of time, one line per rule.
pub fn write_svg(path: &Path, replay: &Replayer<'_>) -> io::Result<()> {
    let timeline = &replay.timeline;
    let bucket = timeline.bucket_ms();
    let span = bucket * timeline.series(0).len() as u64;
    let (unit_ms, unit) = match span {
        0..=120_000 => (1_000, "seconds"),
        120_001..=7_200_000 => (60_000, "minutes"),
        7_200_001..=172_800_000 => (3_600_000, "hours"),
        _ => (86_400_000, "days"),
    };
    let x_label =
        format!("{unit} since {} (buckets of {})", format_rfc3339(timeline.start_ms()), format_span(bucket));
    let series: Vec<(&str, Vec<u64>)> = replay
        .rules()
        .iter()
        .enumerate()
        .map(|(i, r)| (r.name.as_str(), timeline.series(i).to_vec()))
        .collect();
    crate::plot::counts_over_time_svg(
        path,
        "Requests refused per rule (denied or blocked)",
        &x_label,
        "refused per bucket",
        bucket as f64 / unit_ms as f64,
        &series,
    )
}

fn counts_json(c: &Counts) -> Value {
    json!({
        "requests": c.requests,
        "allowed": c.allowed,
        "delayed": c.delayed,
        "denied": c.denied,
        "blocked": c.blocked,
    })
}

fn replayed_ms(replay: &Replayer<'_>) -> u64 {
    match (replay.first_ms, replay.now_ms) {
        (Some(start), Some(end)) => end - start,
        _ => 0,
    }
}

fn lines_per_second(replay: &Replayer<'_>, wall: Duration) -> f64 {
    replay.lines as f64 / wall.as_secs_f64().max(1e-9)
}
