//! A thread that drives its own runtime (`drive_connections_here`, as each
//! of `serve`'s workers does) decides on a Redis connection of its own:
//! what it changes (the connections Redis sees) and what it must not (the
//! counts, failing fast while Redis is down, coming back after it).
#![cfg(feature = "redis")]

mod support;

use std::time::{Duration, Instant};

use slidegate::store::redis::drive_connections_here;
use slidegate::{Algorithm, Limit, RedisStore};
use slidegate_test_redis::RedisServer;
use support::{admin, id, limit, unique_prefix, Decide};

/// One client of the server, as `CLIENT LIST` shows it.
struct Client {
    id: String,
    /// The last command it sent.
    cmd: String,
}

/// One connection of the test's own, to look at the server.
struct Admin(redis::aio::MultiplexedConnection);

impl Admin {
    async fn to(server: &RedisServer) -> Self {
        Self(admin(server).await)
    }

    /// The server's clients but this one.
    async fn store_clients(&mut self) -> Vec<Client> {
        let list: String =
            redis::cmd("CLIENT").arg("LIST").query_async(&mut self.0).await.expect("CLIENT LIST");
        list.lines()
            .map(|line| {
                let field = |name: &str| {
                    line.split(' ')
                        .find_map(|kv| kv.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
                        .unwrap_or_default()
                        .to_owned()
                };
                Client { id: field("id"), cmd: field("cmd") }
            })
            .filter(|c| c.cmd != "client|list")
            .collect()
    }

    /// How many connections the server has accepted since it started.
    async fn connections_received(&mut self) -> u64 {
        let info: String = redis::cmd("INFO").arg("stats").query_async(&mut self.0).await.expect("INFO");
        info.lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("total_connections_received")
    }

    /// Decides cost-0 peeks until the server has `n` store clients (a lane
    /// opens in the background, at a call).
    async fn until_clients(&mut self, store: &RedisStore, l: &Limit, n: usize) -> Vec<Client> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let _ = store.decide_one(&id("peek"), l, 0).await;
            let clients = self.store_clients().await;
            if clients.len() == n {
                return clients;
            }
            assert!(Instant::now() < deadline, "{} store clients, not {n}, after 10 s", clients.len());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Admits `identity` until denied: how many were admitted.
async fn admit_all(store: &RedisStore, identity: &str, l: &Limit) -> u64 {
    let mut admitted = 0;
    while store.decide_one(&id(identity), l, 1).await.expect("decide").allowed {
        admitted += 1;
        assert!(admitted <= 1_000, "never denied");
    }
    admitted
}

#[tokio::test]
async fn a_driving_thread_decides_on_a_connection_of_its_own_and_counts_are_shared() {
    let server = RedisServer::spawn();
    let mut admin = Admin::to(&server).await;
    let store = RedisStore::connect(&server.url()).await.expect("connect").with_prefix(unique_prefix("lane"));
    let l = limit(Algorithm::SlidingWindowCounter, 10, 60_000);
    for _ in 0..4 {
        assert!(store.decide_one(&id("a"), &l, 1).await.expect("decide").allowed);
    }
    let shared = admin.store_clients().await;
    assert_eq!(shared.len(), 1, "a thread shares the store's connection by default");

    drive_connections_here();
    let clients = admin.until_clients(&store, &l, 2).await;
    let lane = clients.iter().find(|c| c.id != shared[0].id).expect("a new client").id.clone();
    // With the shared connection gone, this thread decides on without a
    // failure: on its own connection. The 6 permits left are admitted,
    // and no more: both connections charge the same counter.
    kill(&mut admin, &shared[0].id).await;
    assert_eq!(admit_all(&store, "a", &l).await, 6);
    let clients = admin.store_clients().await;
    assert_eq!(clients.len(), 1, "the lane alone");
    assert_eq!(clients[0].id, lane);

    // Another thread, which asked for nothing, shares the store's
    // connection (driven by this test's runtime, which awaits it): the
    // first call finds it killed, and the link reconnects.
    let other = store.clone();
    let admitted_elsewhere = tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(async {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match other.decide_one(&id("a"), &l, 1).await {
                    Ok(d) => return d.allowed,
                    Err(e) => assert!(e.is_unavailable() && Instant::now() < deadline, "{e}"),
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    })
    .await
    .expect("thread");
    assert!(!admitted_elsewhere, "the counter is the same for every connection");
    // That thread's reconnect ran on its runtime, now gone: this thread's
    // calls find the link down and connect it again, and the lane follows.
    admin.until_clients(&store, &l, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asking_on_a_work_stealing_runtime_changes_nothing() {
    let server = RedisServer::spawn();
    let mut admin = Admin::to(&server).await;
    let store = RedisStore::connect(&server.url()).await.expect("connect").with_prefix(unique_prefix("ws"));
    let l = limit(Algorithm::FixedWindow, 20, 60_000);
    drive_connections_here();
    assert_eq!(admit_all(&store, "b", &l).await, 20);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _ = store.decide_one(&id("b"), &l, 0).await;
    assert_eq!(admin.store_clients().await.len(), 1, "a task here may run on either thread: no lane");
}

/// Redis killed under a thread's lane: its calls fail at once without
/// being sent (the shared connection is marked down with it), and after
/// Redis returns the thread decides on a lane again.
#[tokio::test]
async fn a_lane_fails_fast_while_redis_is_down_and_opens_again_after() {
    let mut server = RedisServer::spawn();
    let store = RedisStore::connect(&server.url()).await.expect("connect").with_prefix(unique_prefix("down"));
    let l = limit(Algorithm::SlidingWindowCounter, 50, 3_600_000);
    drive_connections_here();
    Admin::to(&server).await.until_clients(&store, &l, 2).await;
    server.kill();
    // The first calls may be the ones that find the connections gone: the
    // lane's (closed alone), then the shared one's (the link goes down).
    let _ = store.decide_one(&id("v"), &l, 1).await;
    let _ = store.decide_one(&id("v"), &l, 1).await;
    for _ in 0..20 {
        let start = Instant::now();
        let err = store.decide_one(&id("v"), &l, 1).await.expect_err("Redis is dead");
        assert!(!err.may_have_charged(), "{err}");
        assert!(start.elapsed() < Duration::from_millis(100), "failed after {:?}", start.elapsed());
    }
    server.restart();
    // The shared connection and the lane, both back.
    Admin::to(&server).await.until_clients(&store, &l, 2).await;
    assert_eq!(admit_all(&store, "v", &l).await, 50, "the unsent calls charged nothing");
}

/// A lane's connection killed by the server (`CLIENT KILL`): the call on
/// it fails as on any lost connection, the thread's next calls take the
/// shared connection (left alone), and the lane opens again: one new
/// connection, not one a call.
#[tokio::test]
async fn a_killed_lane_is_replaced_alone_without_a_connection_storm() {
    let server = RedisServer::spawn();
    let mut admin = Admin::to(&server).await;
    let store = RedisStore::connect(&server.url()).await.expect("connect").with_prefix(unique_prefix("kill"));
    let l = limit(Algorithm::SlidingWindowCounter, 100_000, 3_600_000);
    let shared = admin.store_clients().await;
    drive_connections_here();
    let clients = admin.until_clients(&store, &l, 2).await;
    let lane = clients.iter().find(|c| c.id != shared[0].id).expect("a new client").id.clone();
    let received = admin.connections_received().await;
    kill(&mut admin, &lane).await;
    let (mut ok, mut failed) = (0, 0);
    let end = Instant::now() + Duration::from_millis(500);
    while Instant::now() < end {
        match store.decide_one(&id("k"), &l, 1).await {
            Ok(_) => ok += 1,
            Err(err) => {
                assert!(err.is_unavailable(), "{err}");
                failed += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let clients = admin.until_clients(&store, &l, 2).await;
    assert!(!clients.iter().any(|c| c.id == lane), "the killed lane is gone");
    assert!(clients.iter().any(|c| c.id == shared[0].id), "the shared connection was left alone");
    let opened = admin.connections_received().await - received;
    eprintln!("lane killed: {ok} decided, {failed} failed, {opened} connections opened");
    assert!(ok > 0 && failed <= 1, "{ok} decided, {failed} failed");
    assert_eq!(opened, 1, "one new connection: the lane");
}

/// Kills the client `id`.
async fn kill(admin: &mut Admin, id: &str) {
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(id)
        .query_async(&mut admin.0)
        .await
        .expect("CLIENT KILL");
    assert_eq!(killed, 1, "client {id}");
}
