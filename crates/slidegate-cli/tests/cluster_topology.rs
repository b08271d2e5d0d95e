//! slidegate on a Redis Cluster whose topology is changing. `demo` and
//! `bench` with `--redis-cluster` on a cluster created a moment before, with
//! a slot being migrated whose importing node holds keys of the run: their
//! cleanup finds keys on a node that does not own them (which answers
//! `MOVED`) and must still delete every one. `serve` while the slots of its
//! hot identities move between masters: every answer a decision, exactly
//! the limit admitted, and while a fourth master joins and
//! `redis-cli --cluster rebalance` moves a quarter of the slots to it. A
//! penalty block holds while its slots move, and lifts after.

#![allow(clippy::unwrap_used)]

#[path = "common/mod.rs"]
mod common;

use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread;

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

/// Requests per hot identity in [`serve_decides_exactly_while_the_hot_slots_are_resharded`].
const HOT_REQUESTS: usize = 300;
/// The hot identities' limit (per hour: nothing expires during the test).
const HOT_LIMIT: usize = 100;

/// `serve` on `cluster`, one rule of [`HOT_LIMIT`] per hour, failing closed
/// (a store error answers 503) with a deadline far above any stall, and the
/// `[store]` extra `store_extra` (a lease).
fn hot_config(upstream: &Upstream, cluster: &RedisCluster, prefix: &str, store_extra: &str) -> String {
    let seeds: Vec<String> = cluster.urls().iter().map(|u| format!("{u:?}")).collect();
    let store = format!(
        "[store]\ncluster = [{}]\nprefix = \"{prefix}\"\ntimeout_ms = 5000\non_error = \"deny\"\nfallback = false\n{store_extra}",
        seeds.join(", ")
    );
    format!(
        "{head}\n[[rules]]\nname = \"hot\"\npath = \"/api/hot\"\nlimits = [{{ limit = {HOT_LIMIT}, window = \"1h\", algorithm = \"sliding_log\" }}]\n",
        head = keyed_head(upstream.addr, "threads = 2", &store),
    )
}

/// The slots of the keys under `prefix`, each with the master holding it.
fn slots_of_keys(cluster: &RedisCluster, prefix: &str) -> Vec<(u16, u16)> {
    let pattern = format!("{prefix}*");
    let mut slots: Vec<(u16, u16)> = cluster
        .masters()
        .into_iter()
        .flat_map(|port| {
            let keys = cluster.cli(port, &["--scan", "--pattern", &pattern]);
            keys.lines().map(|key| (slot_of(key), port)).collect::<Vec<_>>()
        })
        .collect();
    slots.sort_unstable();
    slots.dedup();
    slots
}

#[test]
fn serve_decides_exactly_while_the_hot_slots_are_resharded() {
    let mut cluster = RedisCluster::start();
    let upstream = Upstream::start();
    let identities = ["hot-a", "hot-b", "hot-c", "hot-d"];
    for (prefix, lease) in [("nolease:", ""), ("lease:", "lease = { max = 16, horizon = \"50ms\" }")] {
        let sg = Slidegate::start(&hot_config(&upstream, &cluster, prefix, lease));
        // One request each, so that their keys exist and their slots are known.
        for identity in identities {
            assert_eq!(sg.get("/api/hot", &[("x-api-key", identity)]).status, 200);
        }
        let slots = slots_of_keys(&cluster, prefix);
        assert!(!slots.is_empty(), "no keys under {prefix}");
        let sent = AtomicUsize::new(identities.len());
        let statuses = Mutex::new(Vec::new());
        thread::scope(|scope| {
            for identity in identities {
                let (sg, sent, statuses) = (&sg, &sent, &statuses);
                scope.spawn(move || {
                    for _ in 1..HOT_REQUESTS {
                        let status = sg.get("/api/hot", &[("x-api-key", identity)]).status;
                        statuses.lock().unwrap().push((identity, status));
                        sent.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
            // Each hot slot moved to the next master while the requests run:
            // half moved (ASK for keys already gone), then assigned (MOVED).
            let masters = cluster.masters();
            for &(slot, from) in &slots {
                let to = masters[(masters.iter().position(|&m| m == from).unwrap() + 1) % masters.len()];
                cluster.begin_slot_migration(slot, from, to);
                wait_for_more(&sent, 20);
                cluster.finish_slot_migration(slot, from, to);
                wait_for_more(&sent, 20);
            }
        });
        let statuses = statuses.into_inner().unwrap();
        let odd: Vec<_> = statuses.iter().filter(|(_, s)| *s != 200 && *s != 429).collect();
        assert_eq!(odd, Vec::<&(&str, u16)>::new(), "{prefix}: answers other than 200 and 429");
        for identity in identities {
            // The first request, then those of the run.
            let allowed = 1 + statuses.iter().filter(|&&(id, s)| id == identity && s == 200).count();
            assert_eq!(allowed, HOT_LIMIT, "{prefix}: {identity} admitted {allowed} of {HOT_REQUESTS}");
        }
        let moved = slots_of_keys(&cluster, prefix);
        assert!(moved.iter().all(|m| !slots.contains(m)), "{prefix}: slots not moved: {slots:?} → {moved:?}");
    }
}

/// Waits until `n` more requests were answered (at most 20 s: a stalled
/// `serve` shows in the counts asserted afterwards, not here).
fn wait_for_more(sent: &AtomicUsize, n: usize) {
    let target = sent.load(Ordering::Relaxed) + n;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while sent.load(Ordering::Relaxed) < target && std::time::Instant::now() < deadline {
        thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Requests per identity before [`serve_decides_exactly_while_a_fourth_master_takes_slots`]
/// stops its load: the rebalance runs under load until it ends.
const REBALANCE_MIN_REQUESTS: usize = 150;

/// Of `serve`'s identities `hot-0`, `hot-1`, …, the first `n` whose keys
/// all lie in the lowest 1,000 slots of their master: `redis-cli --cluster
/// rebalance` moves each giving master's lowest slots first, ~1,365 of
/// them to a fourth master, so these keys certainly move. Each candidate
/// is sent one request (admitted) to create its keys. Returns each chosen
/// identity with the slots of its keys.
fn identities_that_rebalance_moves(
    sg: &Slidegate,
    cluster: &RedisCluster,
    prefix: &str,
    n: usize,
) -> Vec<(String, Vec<u16>)> {
    let mut chosen = Vec::new();
    let mut seen = keys_left(cluster, prefix);
    for i in 0.. {
        let identity = format!("hot-{i}");
        assert_eq!(sg.get("/api/hot", &[("x-api-key", &identity)]).status, 200);
        let now = keys_left(cluster, prefix);
        let slots: Vec<u16> = now.iter().filter(|k| !seen.contains(k)).map(slot_of).collect();
        seen = now;
        let moves = !slots.is_empty()
            && slots.iter().all(|&slot| slot - cluster.slot_ranges(cluster.master_of_slot(slot))[0].0 < 1000);
        if moves {
            chosen.push((identity, slots));
            if chosen.len() == n {
                return chosen;
            }
        }
        assert!(i < 200, "no {n} identities among 200 have keys in their master's lowest slots");
    }
    unreachable!()
}

#[test]
fn serve_decides_exactly_while_a_fourth_master_takes_slots() {
    let upstream = Upstream::start();
    for (prefix, lease) in [("nolease:", ""), ("lease:", "lease = { max = 16, horizon = \"50ms\" }")] {
        let mut cluster = RedisCluster::start();
        let sg = Slidegate::start(&hot_config(&upstream, &cluster, prefix, lease));
        let chosen = identities_that_rebalance_moves(&sg, &cluster, prefix, 4);
        let identities: Vec<&String> = chosen.iter().map(|(identity, _)| identity).collect();
        let done = std::sync::atomic::AtomicBool::new(false);
        let statuses = Mutex::new(Vec::new());
        let added = thread::scope(|scope| {
            for &identity in &identities {
                let (sg, done, statuses) = (&sg, &done, &statuses);
                scope.spawn(move || {
                    let mut sent = 1;
                    while sent < REBALANCE_MIN_REQUESTS || !done.load(Ordering::Relaxed) {
                        let status = sg.get("/api/hot", &[("x-api-key", identity)]).status;
                        statuses.lock().unwrap().push((identity, status));
                        sent += 1;
                    }
                });
            }
            let added = cluster.add_master();
            cluster.rebalance();
            done.store(true, Ordering::Relaxed);
            added
        });
        let statuses = statuses.into_inner().unwrap();
        let odd: Vec<_> = statuses.iter().filter(|(_, s)| *s != 200 && *s != 429).collect();
        assert_eq!(odd, Vec::<&(&String, u16)>::new(), "{prefix}: answers other than 200 and 429");
        for identity in identities {
            let sent = 1 + statuses.iter().filter(|(id, _)| *id == identity).count();
            let allowed = 1 + statuses.iter().filter(|(id, s)| *id == identity && *s == 200).count();
            assert!(sent > HOT_LIMIT, "{prefix}: {identity} sent only {sent}");
            assert_eq!(allowed, HOT_LIMIT, "{prefix}: {identity} admitted {allowed} of {sent}");
        }
        // The premise: the keys decided on did move to the new master.
        for (identity, slots) in &chosen {
            let owners: Vec<u16> = slots.iter().map(|&slot| cluster.master_of_slot(slot)).collect();
            assert!(
                owners.iter().all(|&o| o == added),
                "{prefix}: {identity}'s slots {slots:?} on {owners:?}, not {added}"
            );
        }
    }
}

/// The penalty box on a Cluster whose slots move: a block recorded before
/// the abuser's slots migrate holds while each is half moved (`MIGRATING`
/// on the old master, `IMPORTING` on the new) and once it is reassigned
/// (`MOVED`); a lift then, sent to the new master, frees the client, whose
/// limit is still spent (a plain 429, not the block).
#[test]
fn a_penalty_block_holds_while_its_slots_move_and_lifts_after() {
    let mut cluster = RedisCluster::start();
    let upstream = Upstream::start();
    let prefix = "penalty:";
    let seeds: Vec<String> = cluster.urls().iter().map(|u| format!("{u:?}")).collect();
    let store =
        format!("[store]\ncluster = [{}]\nprefix = \"{prefix}\"\ntimeout_ms = 5000\n", seeds.join(", "));
    let config = format!(
        "{head}\n[[rules]]\nname = \"login\"\npath = \"/login\"\n\
         limits = [{{ limit = 2, window = \"1h\", algorithm = \"sliding_window_counter\" }}]\n\
         penalty = {{ after = 3, within = \"1h\", block = \"1h\" }}\n",
        head = keyed_head(
            upstream.addr,
            &format!("admin_listen = \"127.0.0.1:0\"\ncheck_token_env = \"{SECRET_ENV}\""),
            &store
        ),
    );
    let sg = Slidegate::start(&config);
    let login = || sg.get("/login", &[("x-api-key", "abuser-key")]);
    let blocked = |reply: &Reply| reply.status == 429 && reply.body.contains("abnormal-usage-detected");
    let statuses: Vec<u16> = (0..5).map(|_| login().status).collect();
    assert_eq!(statuses, [200, 200, 429, 429, 429]);
    assert!(blocked(&login()), "the 4th denial blocks");

    let slots = slots_of_keys(&cluster, prefix);
    assert!(!slots.is_empty(), "no keys under {prefix}");
    let masters = cluster.masters();
    for &(slot, from) in &slots {
        let to = masters[(masters.iter().position(|&m| m == from).unwrap() + 1) % masters.len()];
        cluster.begin_slot_migration(slot, from, to);
        for _ in 0..3 {
            let reply = login();
            assert!(blocked(&reply), "slot {slot} half moved: {reply:?}");
        }
        cluster.finish_slot_migration(slot, from, to);
        for _ in 0..3 {
            let reply = login();
            assert!(blocked(&reply), "slot {slot} moved: {reply:?}");
        }
    }
    let moved = slots_of_keys(&cluster, prefix);
    assert!(moved.iter().all(|m| !slots.contains(m)), "slots not moved: {slots:?} → {moved:?}");

    let id = full_key_id(&sg.config_path(), "abuser-key");
    let auth = "Bearer end-to-end-secret";
    let lift =
        request(sg.admin_addr(), "DELETE", &format!("/v1/penalty/{id}"), &[("authorization", auth)], b"");
    assert_eq!(lift.status, 204, "{lift:?}");
    let after = login();
    assert!(after.status == 429 && !blocked(&after), "the lift did not free the client: {after:?}");
}
