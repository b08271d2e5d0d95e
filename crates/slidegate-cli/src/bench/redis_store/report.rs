//! What `bench redis` reports: the JSON (whose field names BENCHMARKS.md
//! and the tests read) and the table.

use serde_json::{json, Map, Value};
use slidegate::{Buckets, Layout, Quota};

use super::{round, Candidate, Figures, Measured, RedisArgs};

/// The JSON report: field names are read by BENCHMARKS.md and the tests.
pub(super) fn json_report(args: &RedisArgs, quota: &Quota, measured: &Measured, masters: usize) -> Value {
    let reference = measured.reference_script.as_ref();
    let mut algorithms = Map::new();
    let mut ratios = Map::new();
    for (algorithm, f) in &measured.algorithms {
        algorithms.insert(algorithm.name().to_owned(), f.to_json());
        if let Some(reference) = reference {
            ratios
                .insert(algorithm.name().to_owned(), ratio_json(f, reference, measured.redis_benchmark_p16));
        }
    }
    // The packed layout: its figures, and its ratios to the same algorithm
    // a key per identity in the same run.
    let mut packed = Map::new();
    let mut packed_ratios = Map::new();
    for (algorithm, f) in &measured.packed {
        packed.insert(algorithm.name().to_owned(), f.to_json());
        if let Some((_, per_key)) = measured.algorithms.iter().find(|(a, _)| a == algorithm) {
            packed_ratios.insert(algorithm.name().to_owned(), ratio_json(f, per_key, None));
        }
    }
    json!({
        "algorithms": algorithms,
        "packed": packed,
        "packed_vs_per_key": packed_ratios,
        "reference_script": reference.map(|r| r.to_json()),
        "redis_benchmark_p16_per_sec": measured.redis_benchmark_p16.map(|v| round(v, 0)),
        "ratios_vs_reference": ratios,
        "setup": {
            "redis_url": args.redis_url,
            "redis_cluster": (!args.redis_cluster.is_empty()).then_some(&args.redis_cluster),
            "masters": masters,
            "seconds": args.seconds,
            "connections": args.connections,
            "in_flight_per_connection": args.in_flight,
            "identities": args.identities,
            "memory_identities": args.memory_identities,
            "packed_buckets_load": args.packed_buckets.map_or_else(|| bucket_count(args.identities), Buckets::get),
            "packed_buckets_memory": args.packed_buckets.map_or_else(|| bucket_count(args.memory_identities), Buckets::get),
            "limit": quota.permits(),
            "window_ms": quota.window_ms(),
            "engine": args.engine.name(),
            "time_source": if args.client_time { "client for both" } else { "server (Redis TIME) for slidegate; client ms in ARGV for the reference script" },
        },
    })
}

/// The buckets [`Layout::packed_for`] gives `identities`.
fn bucket_count(identities: usize) -> u32 {
    match Layout::packed_for(identities as u64) {
        Layout::Packed(buckets) => buckets.get(),
        _ => 0,
    }
}

fn ratio_json(f: &Figures, reference: &Figures, redis_benchmark: Option<f64>) -> Value {
    json!({
        "decisions_per_sec": round(f.decisions_per_sec / reference.decisions_per_sec, 3),
        "server_us_per_decision": round(f.server_us_per_decision / reference.server_us_per_decision, 3),
        "bytes_per_identity": round(f.bytes_per_identity / reference.bytes_per_identity, 3),
        "of_redis_benchmark_p16": redis_benchmark.map(|rb| round(f.decisions_per_sec / rb, 3)),
    })
}

/// The table report: figures per candidate, then ratios to the reference script.
pub(super) fn print_table(measured: &Measured) {
    outln!(
        "{:<30} {:>12} {:>9} {:>9} {:>12} {:>10} {:>9}",
        "",
        "decisions/s",
        "p50 µs",
        "p99 µs",
        "server µs",
        "B/identity",
        "allowed%"
    );
    for (name, f) in measured.rows() {
        outln!(
            "{:<30} {:>12.0} {:>9.1} {:>9.1} {:>12.2} {:>10.1} {:>9.1}",
            name,
            f.decisions_per_sec,
            f.p50_us,
            f.p99_us,
            f.server_us_per_decision,
            f.bytes_per_identity,
            f.allowed_pct
        );
    }
    if !measured.packed.is_empty() {
        outln!();
        outln!(
            "{:<30} {:>12} {:>12} {:>12}",
            "packed vs a key per identity",
            "throughput",
            "server CPU",
            "memory"
        );
        for (algorithm, f) in &measured.packed {
            let Some((_, k)) = measured.algorithms.iter().find(|(a, _)| a == algorithm) else { continue };
            outln!(
                "{:<30} {:>11.2}× {:>11.2}× {:>11.2}×",
                algorithm.name(),
                f.decisions_per_sec / k.decisions_per_sec,
                f.server_us_per_decision / k.server_us_per_decision,
                f.bytes_per_identity / k.bytes_per_identity
            );
        }
    }
    let Some(r) = &measured.reference_script else {
        outln!("\nreference script, redis-benchmark: not run (on a cluster, or left out by --only)");
        return;
    };
    outln!();
    outln!("{:<30} {:>12} {:>12} {:>12}", "vs reference script", "throughput", "server CPU", "memory");
    let packed = measured.packed.iter().map(|(a, f)| (Candidate::Packed(*a).name(), f));
    for (name, f) in measured.algorithms.iter().map(|(a, f)| (a.name(), f)).chain(packed) {
        outln!(
            "{:<30} {:>11.2}× {:>11.2}× {:>11.2}×",
            name,
            f.decisions_per_sec / r.decisions_per_sec,
            f.server_us_per_decision / r.server_us_per_decision,
            f.bytes_per_identity / r.bytes_per_identity
        );
    }
    match measured.redis_benchmark_p16 {
        Some(v) => outln!("\nredis-benchmark -P 16, reference script: {v:.0} calls/s"),
        None => outln!("\nredis-benchmark: not run (not on PATH, or --no-redis-benchmark)"),
    }
}
