//! The cluster, sentinel, auth and TLS harness against real `redis-server`s.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use slidegate_test_redis::{slot_of, RedisCluster, RedisSentinel, SecuredRedis};

/// Keys whose slots fall on every master of a fresh cluster.
const KEYS: [&str; 8] = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "{user:7}.a", "{user:7}.b"];

#[test]
fn the_shared_cluster_serves_keys_in_every_slot_range() {
    let cluster = RedisCluster::shared();
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3, "{cluster:?}");
    assert_eq!(cluster.replicas().len(), 3, "{cluster:?} {}", cluster.cli(masters[0], &["CLUSTER", "NODES"]));
    assert_eq!(cluster.urls().len(), 3);
    assert!(masters.iter().all(|&p| p != 6379 && p < 55536));
    let owners: std::collections::BTreeSet<u16> =
        KEYS.iter().map(|k| cluster.master_of_slot(slot_of(k))).collect();
    assert_eq!(owners.len(), 3, "the keys should span all masters");
    for key in KEYS {
        let value = format!("value-of-{key}");
        assert_eq!(cluster.cli(masters[0], &["-c", "SET", key, &value]), "OK");
        // Read through a different entry node: redirections are followed.
        assert_eq!(cluster.cli(masters[2], &["-c", "GET", key]), value);
        // The owner answers without a redirection.
        assert_eq!(cluster.cli(cluster.master_of_slot(slot_of(key)), &["GET", key]), value);
    }
}

#[test]
fn slot_of_matches_cluster_keyslot() {
    let cluster = RedisCluster::shared();
    let port = cluster.masters()[0];
    let keys = [
        "foo",
        "",
        "{user1000}.following",
        "foo{}{bar}",
        "foo{{bar}}zap",
        "foo{bar}{zap}",
        "{}",
        "a{b",
        "rl:ip:10.0.0.1",
    ];
    for key in keys {
        let expected: u16 = cluster.cli(port, &["CLUSTER", "KEYSLOT", key]).parse().expect("a slot number");
        assert_eq!(slot_of(key), expected, "key {key:?}");
    }
}

#[test]
fn a_killed_master_is_replaced_by_its_replica() {
    let mut cluster = RedisCluster::start();
    let port = cluster.masters()[0];
    let key = KEYS.iter().find(|k| cluster.master_of_slot(slot_of(k)) == port).expect("a key on master 0");
    // Replication is asynchronous; WAIT makes the write reach the replica.
    assert_eq!(set_and_wait(port, key, "kept"), "OK\n1");

    let started = Instant::now();
    let killed = cluster.kill_master(0);
    assert_eq!(killed, port);
    let promoted = cluster.wait_for_failover();
    let took = started.elapsed();
    eprintln!("failover took {took:?}");
    assert!(took < Duration::from_secs(20), "failover took {took:?}");
    assert_ne!(promoted, killed);
    assert!(!cluster.masters().contains(&killed));
    assert_eq!(cluster.cli(promoted, &["GET", key]), "kept");
    let other = cluster.masters()[1];
    assert_eq!(cluster.cli(other, &["-c", "GET", key]), "kept");
}

#[test]
fn slots_move_between_masters_with_their_keys() {
    let mut cluster = RedisCluster::start();
    let masters = cluster.masters();
    let (from, to) = (masters[0], masters[1]);
    // Slot 0 is the first slot master 0 gives away; fill it and a neighbour.
    let in_slot_0: Vec<String> = (0..).map(|i| format!("k{i}")).filter(|k| slot_of(k) == 0).take(3).collect();
    for key in &in_slot_0 {
        assert_eq!(cluster.cli(from, &["SET", key, key]), "OK");
    }

    cluster.move_slots(from, to, 10);
    assert_eq!(cluster.master_of_slot(0), to);
    for key in &in_slot_0 {
        assert_eq!(&cluster.cli(to, &["GET", key]), key);
        assert!(cluster.cli(from, &["GET", key]).starts_with("MOVED 0 "));
    }

    // One slot by hand, keys included: slot 0 goes back.
    cluster.migrate_slot(0, to, from);
    assert_eq!(cluster.master_of_slot(0), from);
    for key in &in_slot_0 {
        assert_eq!(&cluster.cli(from, &["GET", key]), key);
        assert_eq!(&cluster.cli(masters[2], &["-c", "GET", key]), key);
    }

    // Mid-migration, a missing key on the source answers ASK.
    cluster.begin_slot_migration(0, from, to);
    let missing = (0..).map(|i| format!("m{i}")).find(|k| slot_of(k) == 0).expect("a key in slot 0");
    assert!(cluster.cli(from, &["GET", &missing]).starts_with("ASK 0 "));
    cluster.finish_slot_migration(0, from, to);
    assert_eq!(cluster.master_of_slot(0), to);
}

#[test]
fn sentinels_report_the_master_and_follow_a_failover() {
    let mut deployment = RedisSentinel::start();
    assert_eq!(deployment.sentinel_urls().len(), 3);
    let old = deployment.master_port();
    assert_eq!(set_and_wait(old, "k", "v"), "OK\n1");
    for port in deployment.sentinel_ports() {
        let reply = deployment.cli(port, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", deployment.master_name()]);
        assert_eq!(reply, format!("127.0.0.1\n{old}"));
    }

    let started = Instant::now();
    assert_eq!(deployment.kill_master(), old);
    let new = deployment.wait_for_failover();
    let took = started.elapsed();
    eprintln!("sentinel failover took {took:?}");
    assert!(took < Duration::from_secs(25), "failover took {took:?}");
    assert_ne!(new, old);
    assert_eq!(deployment.master_port(), new);
    assert_eq!(deployment.cli(new, &["GET", "k"]), "v");
    assert_eq!(deployment.cli(new, &["SET", "k", "w"]), "OK");
}

#[test]
fn a_password_protected_server_rejects_anonymous_clients() {
    let server = SecuredRedis::builder().password("s3cret").user("limiter", "pw", "~rl:* +get +set").start();
    assert!(server.cli_unauthenticated(&["GET", "a"]).starts_with("NOAUTH"));
    assert!(server
        .cli_unauthenticated(&["--no-auth-warning", "-a", "wrong", "GET", "a"])
        .contains("WRONGPASS"));
    assert_eq!(server.cli(&["SET", "a", "1"]), "OK");
    assert_eq!(server.cli(&["GET", "a"]), "1");
    assert_eq!(server.url(), format!("redis://:s3cret@127.0.0.1:{}/", server.port()));

    let as_limiter = ["--no-auth-warning", "--user", "limiter", "--pass", "pw"];
    assert_eq!(server.cli_unauthenticated(&[&as_limiter[..], &["SET", "rl:x", "1"]].concat()), "OK");
    assert!(server
        .cli_unauthenticated(&[&as_limiter[..], &["SET", "other", "1"]].concat())
        .starts_with("NOPERM"));
    assert!(server.cli_unauthenticated(&[&as_limiter[..], &["DEL", "rl:x"]].concat()).starts_with("NOPERM"));
}

#[test]
fn a_tls_server_answers_clients_that_trust_its_ca() {
    let server = SecuredRedis::builder().tls().start();
    let ca = server.ca_cert().expect("a CA with TLS").to_path_buf();
    assert_eq!(server.url(), format!("rediss://127.0.0.1:{}/", server.port()));
    let out = std::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &server.port().to_string(), "--tls", "--cacert"])
        .arg(&ca)
        .arg("PING")
        .output()
        .expect("run redis-cli");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "PONG");
    // Plain text on the TLS port gets no answer.
    let plain = std::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &server.port().to_string(), "PING"])
        .output()
        .expect("run redis-cli");
    assert_ne!(String::from_utf8_lossy(&plain.stdout).trim(), "PONG");
}

#[test]
fn the_shared_sentinel_deployment_names_its_master() {
    let deployment = RedisSentinel::shared();
    let master = deployment.master_port();
    assert!(deployment.data_ports().contains(&master));
    assert_eq!(deployment.cli(master, &["ROLE"]).lines().next(), Some("master"));
    let replica = *deployment.data_ports().iter().find(|&&p| p != master).expect("a replica");
    assert_eq!(deployment.cli(replica, &["ROLE"]).lines().next(), Some("slave"));
}

/// `SET key value`, then `WAIT 1 5000` on the same connection: `WAIT` counts
/// from the calling client's own last write, so asked on a second connection
/// it would not wait for this one. The replies, one per line.
fn set_and_wait(port: u16, key: &str, value: &str) -> String {
    let mut cli = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run redis-cli");
    let mut stdin = cli.stdin.take().expect("redis-cli's stdin");
    writeln!(stdin, "SET {key} {value}\nWAIT 1 5000").expect("write to redis-cli");
    drop(stdin);
    let out = cli.wait_with_output().expect("redis-cli's output");
    String::from_utf8_lossy(&out.stdout).trim_end().to_owned()
}
