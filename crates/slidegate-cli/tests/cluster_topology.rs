//! `demo` and `bench` with `--redis-cluster` on a Redis Cluster whose
//! topology is not settled: created a moment before, with a slot being
//! migrated whose importing node holds keys of the run. Their cleanup finds
//! keys on a node that does not own them (which answers `MOVED`) and must
//! still delete every one.

#![allow(clippy::unwrap_used)]

#[path = "common/mod.rs"]
mod common;

use std::process::{Command, Output, Stdio};

use common::*;
use serde_json::Value;
use slidegate_test_redis::{slot_of, RedisCluster};

/// The hash tag of the keys staged in the migrating slot.
const TAG: &str = "stale";
/// How many keys are staged per run.
const STAGED: usize = 20;

/// Runs `slidegate <args>` and, while it runs, writes [`STAGED`] keys under
/// its prefix (`<tag><pid>:`) on `importing` after `ASKING`: keys of a slot
/// that node does not own. Returns the output and the prefix.
fn run_with_staged_keys(
    cluster: &RedisCluster,
    importing: u16,
    tag: &str,
    args: &[&str],
) -> (Output, String) {
    let child =
        Command::new(binary()).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let prefix = format!("{tag}{}:", child.id());
    let staged: Vec<String> = (0..STAGED).map(|i| format!("{prefix}{{{TAG}}}:{i}")).collect();
    cluster.set_asking(importing, &staged);
    let pattern = format!("{prefix}{{{TAG}}}:*");
    let on_node = cluster.cli(importing, &["--scan", "--pattern", &pattern]);
    assert_eq!(on_node.lines().count(), STAGED, "staged keys on {importing}: {on_node}");
    (child.wait_with_output().unwrap(), prefix)
}

/// The keys starting with `prefix` on any master, sorted.
fn keys_left(cluster: &RedisCluster, prefix: &str) -> Vec<String> {
    let pattern = format!("{prefix}*");
    let mut keys: Vec<String> = cluster
        .masters()
        .into_iter()
        .flat_map(|port| {
            cluster
                .cli(port, &["--scan", "--pattern", &pattern])
                .lines()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    keys.sort_unstable();
    keys
}

#[test]
fn demo_and_bench_on_a_cluster_just_created_delete_keys_of_a_slot_being_imported() {
    let mut cluster = RedisCluster::start_fresh();
    let slot = slot_of(TAG);
    let owner = cluster.master_of_slot(slot);
    let importing = *cluster.masters().iter().find(|&&port| port != owner).unwrap();
    cluster.begin_slot_migration(slot, owner, importing);
    let seeds = cluster.urls().join(",");

    let (out, prefix) = run_with_staged_keys(
        &cluster,
        importing,
        "sgdemo",
        &["demo", "--json", "--identities", "200", "--redis-cluster", &seeds],
    );
    assert!(out.status.success(), "demo failed: {}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["error"], Value::Null, "demo stopped: {}", report["error"]);
    assert_eq!(report["store"], "redis_cluster");
    assert_eq!(report["boundary_burst"]["allowed"]["sliding_log"], 100);
    assert_eq!(keys_left(&cluster, &prefix), Vec::<String>::new(), "the demo left keys");

    let (out, prefix) = run_with_staged_keys(
        &cluster,
        importing,
        "sgb",
        &[
            "bench",
            "redis",
            "--json",
            "--seconds",
            "0.3",
            "--identities",
            "200",
            "--memory-identities",
            "200",
            "--connections",
            "2",
            "--in-flight",
            "8",
            "--redis-cluster",
            &seeds,
        ],
    );
    assert!(out.status.success(), "bench failed: {}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["setup"]["masters"], 3);
    assert_eq!(keys_left(&cluster, &prefix), Vec::<String>::new(), "the bench left keys");
}
