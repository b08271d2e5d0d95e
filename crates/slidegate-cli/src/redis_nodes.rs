//! The Redis servers a command reaches past the store: one server, or every
//! master of a Redis Cluster. `demo` and `bench` read figures (`INFO`,
//! `MEMORY USAGE`) and delete their keys through it; on a cluster a key lives
//! on one master only and `INFO` describes one node, so both go to each master.
//!
//! On a cluster the keys are found on each master (`SCAN`) and unlinked
//! there, pipelined; but a node may hold keys of a slot it does not own (a
//! slot it is importing), or lose a slot between `SCAN` and `UNLINK` (a
//! reshard), and then answers `MOVED` or `ASK` for those keys, which a plain
//! connection's pipeline takes as the commands' errors. Those keys are
//! deleted again through a cluster client, one at a time: it follows `MOVED`
//! (refreshing its slot map) and `ASK` (`ASKING` first), up to
//! [`CLEANUP_RETRIES`] times per key. The cluster client's own pipelines
//! would not do: they must stay within one slot and, their error carrying no
//! redirect address, retry an `ASK` at the node that sent it.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;

use crate::redis_info::used_memory;
use crate::redis_keys::{delete_prefix, scan_prefix, unlink_each};

/// How often the cluster client retries one key's `UNLINK` after a
/// redirection, a `TRYAGAIN` or a dropped connection before giving up.
const CLEANUP_RETRIES: u32 = 16;

/// One connection per master (a single server is its own only master).
pub struct Nodes {
    masters: Vec<(String, ConnectionManager)>,
    /// On a cluster, the client that deletes keys wherever they live now.
    cluster: Option<ClusterConnection>,
}

impl Nodes {
    /// The one server at `url`.
    pub async fn single(url: &str) -> Result<Self, Box<dyn std::error::Error>> {
        let conn = connect(url).await?;
        Ok(Nodes { masters: vec![(url.to_owned(), conn)], cluster: None })
    }

    /// Every master of the cluster that the seed nodes `seeds` belong to,
    /// found with `CLUSTER NODES` on the first seed that answers, each
    /// confirmed by the node itself (`ROLE`): just after a cluster is
    /// created, a seed may still list a new replica as a master, whose
    /// `INFO` would count its master's keys twice.
    pub async fn cluster(seeds: &[String]) -> Result<Self, Box<dyn std::error::Error>> {
        let mut last = String::from("no seed node given");
        for seed in seeds {
            let mut conn = match connect(seed).await {
                Ok(conn) => conn,
                Err(e) => {
                    last = format!("cannot reach {}: {e}", crate::redis_errors::shown(seed));
                    continue;
                }
            };
            let nodes: String = redis::cmd("CLUSTER").arg("NODES").query_async(&mut conn).await?;
            let mut masters = Vec::new();
            for addr in master_addresses(&nodes) {
                let url = with_address(seed, &addr);
                let mut conn = connect(&url).await.map_err(|e| format!("cannot reach master {addr}: {e}"))?;
                // A node that will not say (ROLE refused by an ACL) is kept.
                if is_master(&mut conn).await.unwrap_or(true) {
                    masters.push((url, conn));
                }
            }
            if masters.is_empty() {
                return Err(format!("{seed}: CLUSTER NODES lists no master").into());
            }
            let cluster = ClusterClientBuilder::new(seeds.to_vec())
                .connection_timeout(Duration::from_secs(5))
                .response_timeout(Duration::from_secs(30))
                .retries(CLEANUP_RETRIES)
                .build()?
                .get_async_connection()
                .await
                .map_err(|e| {
                    format!(
                        "cannot connect a cluster client to {}: {e}",
                        crate::redis_errors::shown_all(seeds)
                    )
                })?;
            return Ok(Nodes { masters, cluster: Some(cluster) });
        }
        Err(last.into())
    }

    /// Whether these are a cluster's masters.
    pub fn is_cluster(&self) -> bool {
        self.cluster.is_some()
    }

    /// How many masters.
    pub fn len(&self) -> usize {
        self.masters.len()
    }

    /// The masters' connections, to send a command to each.
    pub fn connections(&mut self) -> impl Iterator<Item = &mut ConnectionManager> {
        self.masters.iter_mut().map(|(_, conn)| conn)
    }

    /// Deletes every key starting with `prefix` on every master.
    ///
    /// # Errors
    /// A node that fails `SCAN`; on a cluster, the keys the cluster client
    /// could not delete within its retries, the first named with its slot,
    /// the node that held it and the last error (a redirection names the node
    /// it pointed to).
    pub async fn delete_prefix(&mut self, prefix: &str) -> Result<(), Box<dyn std::error::Error>> {
        let Some(cluster) = &self.cluster else {
            for conn in self.connections() {
                delete_prefix(conn, prefix).await?;
            }
            return Ok(());
        };
        for (url, conn) in &mut self.masters {
            let mut cursor = 0;
            loop {
                let (next, keys) = scan_prefix(conn, prefix, cursor).await?;
                // Pipelined on the node that holds them; a key it does not
                // own (MOVED, ASK) then one at a time through the cluster
                // client. Not concurrently: the client sends `ASKING` as a
                // request of its own on a connection that other requests
                // share, so another key's `UNLINK` could take its place.
                let mut failed = Vec::new();
                for (key, _) in unlink_each(conn, &keys).await? {
                    let mut cluster = cluster.clone();
                    if let Err(e) = redis::cmd("UNLINK").arg(&key).query_async::<u64>(&mut cluster).await {
                        failed.push((key, e));
                    }
                }
                if let Some((key, error)) = failed.first() {
                    let slot = redis::cmd("CLUSTER")
                        .arg("KEYSLOT")
                        .arg(key)
                        .query_async::<u16>(conn)
                        .await
                        .map_or_else(|_| "?".to_owned(), |slot| slot.to_string());
                    return Err(format!(
                        "{} of {} keys under {prefix} not deleted; the first, {key:?} (slot {slot}, found on {}): {error}",
                        failed.len(),
                        keys.len(),
                        crate::redis_errors::shown(url),
                    )
                    .into());
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(())
    }

    /// `used_memory` summed over the masters.
    pub async fn used_memory(&mut self) -> Result<u64, Box<dyn std::error::Error>> {
        let mut total = 0;
        for conn in self.connections() {
            total += used_memory(conn).await?;
        }
        Ok(total)
    }

    /// The connection to the master that holds `key`: the one that answers
    /// `EXISTS` instead of redirecting (`MOVED`).
    pub async fn owner_of(
        &mut self,
        key: &str,
    ) -> Result<&mut ConnectionManager, Box<dyn std::error::Error>> {
        let mut owner = None;
        for (i, (_, conn)) in self.masters.iter_mut().enumerate() {
            if redis::cmd("EXISTS").arg(key).query_async::<u64>(conn).await.is_ok() {
                owner = Some(i);
                break;
            }
        }
        let i = owner.ok_or_else(|| format!("no master accepts key {key:?}"))?;
        Ok(&mut self.masters[i].1)
    }

    /// `MEMORY USAGE key SAMPLES 0` on the master holding `key`; 0 when absent.
    pub async fn memory_usage(&mut self, key: &str) -> Result<u64, Box<dyn std::error::Error>> {
        let conn = self.owner_of(key).await?;
        let bytes: Option<u64> =
            redis::cmd("MEMORY").arg("USAGE").arg(key).arg("SAMPLES").arg(0).query_async(conn).await?;
        Ok(bytes.unwrap_or(0))
    }
}

/// Whether the node says it is a master (`ROLE`), whatever others say of it.
async fn is_master(conn: &mut ConnectionManager) -> Result<bool, redis::RedisError> {
    let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(conn).await?;
    Ok(match role.first() {
        Some(redis::Value::BulkString(role)) => role.as_slice() == b"master",
        Some(redis::Value::SimpleString(role)) => role == "master",
        _ => false,
    })
}

/// A connection that waits out a loaded machine: a stall belongs in the
/// figures, not in an error.
async fn connect(url: &str) -> Result<ConnectionManager, redis::RedisError> {
    let client = redis::Client::open(url)?;
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_secs(30)))
        .set_connection_timeout(Some(Duration::from_secs(5)));
    ConnectionManager::new_with_config(client, config).await
}

/// `host:port` of every master in `CLUSTER NODES` output that is not failed.
fn master_addresses(nodes: &str) -> Vec<String> {
    nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flags = fields.get(2)?;
            let is_master = flags.split(',').any(|f| f == "master");
            let failed = flags.split(',').any(|f| f == "fail" || f == "fail?" || f == "noaddr");
            let addr = fields.get(1)?.split(['@', ',']).next()?;
            (is_master && !failed && !addr.starts_with(':')).then(|| addr.to_owned())
        })
        .collect()
}

/// `url` with its `host:port` replaced by `addr`, keeping scheme and user information.
fn with_address(url: &str, addr: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("redis", url));
    let authority = rest.split('/').next().unwrap_or(rest);
    let userinfo = authority.rfind('@').map_or("", |at| &authority[..=at]);
    format!("{scheme}://{userinfo}{addr}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use slidegate_test_redis::{slot_of, RedisCluster};

    /// The keys on the node `port` that start with `prefix`, sorted.
    fn keys_on(cluster: &RedisCluster, port: u16, prefix: &str) -> Vec<String> {
        let pattern = format!("{prefix}*");
        let mut keys: Vec<String> =
            cluster.cli(port, &["--scan", "--pattern", &pattern]).lines().map(str::to_owned).collect();
        keys.sort_unstable();
        keys
    }

    /// `n` keys `<prefix>{<tag>}:<name><i>`.
    fn keys(prefix: &str, tag: &str, name: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}{{{tag}}}:{name}{i}")).collect()
    }

    /// A hash tag `<stem><i>` whose slot the master on `port` owns.
    fn tag_on(cluster: &RedisCluster, port: u16, stem: &str) -> (String, u16) {
        (0..)
            .map(|i| format!("{stem}{i}"))
            .map(|tag| {
                let slot = slot_of(&tag);
                (tag, slot)
            })
            .find(|(_, slot)| cluster.master_of_slot(*slot) == port)
            .unwrap_or_else(|| unreachable!("some tag hashes to every master"))
    }

    #[test]
    fn a_cluster_prefix_is_deleted_where_the_keys_moved_after_the_slot_map_was_read() {
        let mut cluster = RedisCluster::start();
        let masters = cluster.masters();
        let (a, b, c) = (masters[0], masters[1], masters[2]);
        let prefix = "sgnodes:";
        let (moved, moved_slot) = tag_on(&cluster, a, "moved");
        let (asked, asked_slot) = tag_on(&cluster, a, "asked");
        let (kept, _) = tag_on(&cluster, a, "kept");
        let (moved_keys, asked_keys, mut kept_keys) =
            (keys(prefix, &moved, "k", 10), keys(prefix, &asked, "k", 10), keys(prefix, &kept, "k", 10));
        kept_keys.sort_unstable();
        for key in moved_keys.iter().chain(&asked_keys).chain(&kept_keys) {
            assert_eq!(cluster.cli(a, &["SET", key, "1"]), "OK");
        }
        let other = format!("other:{{{kept}}}");
        assert_eq!(cluster.cli(a, &["SET", &other, "1"]), "OK");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(async {
            // The cluster client reads the slot map now, before it changes.
            let mut nodes = Nodes::cluster(&cluster.urls()).await.expect("connect");
            assert_eq!(nodes.len(), 3);
            // Two slots moved to `c` after the client read the map: it
            // sends their keys to `a`, which answers MOVED.
            cluster.migrate_slot(moved_slot, a, c);
            cluster.migrate_slot(asked_slot, a, c);
            // One of them then halfway from `c` to `b`: 5 keys migrated, 5
            // still on `c`, and 5 new ones written on `b` after ASK. `b`
            // holds keys of a slot it does not own and answers MOVED for
            // them; `c` answers ASK for the keys it no longer has.
            cluster.begin_slot_migration(asked_slot, c, b);
            let b_port = b.to_string();
            let mut migrate = vec!["MIGRATE", "127.0.0.1", &b_port, "", "0", "5000", "KEYS"];
            migrate.extend(asked_keys[..5].iter().map(String::as_str));
            assert_eq!(cluster.cli(c, &migrate), "OK");
            let new_keys = keys(prefix, &asked, "new", 5);
            cluster.set_asking(b, &new_keys);
            let mut on_b: Vec<String> = asked_keys[..5].iter().chain(&new_keys).cloned().collect();
            on_b.sort_unstable();
            assert_eq!(keys_on(&cluster, b, prefix), on_b);
            assert_eq!(keys_on(&cluster, c, prefix).len(), 15);
            assert_eq!(keys_on(&cluster, a, prefix), kept_keys);

            nodes.delete_prefix(prefix).await.expect("delete_prefix");
        });
        for port in [a, b, c] {
            assert_eq!(keys_on(&cluster, port, prefix), Vec::<String>::new(), "keys left on {port}");
        }
        assert_eq!(cluster.cli(a, &["GET", &other]), "1", "a key outside the prefix was deleted");
    }

    #[test]
    fn masters_are_read_from_cluster_nodes_and_failed_ones_left_out() {
        let nodes = "a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n\
                     b2 127.0.0.1:7001@17001 master - 0 0 2 connected 5461-10922\n\
                     c3 127.0.0.1:7002@17002,host master,fail - 0 0 3 disconnected\n\
                     d4 127.0.0.1:7003@17003 slave a1 0 0 1 connected\n";
        assert_eq!(master_addresses(nodes), ["127.0.0.1:7000", "127.0.0.1:7001"]);
    }

    #[test]
    fn a_master_url_keeps_the_seeds_scheme_and_credentials() {
        assert_eq!(with_address("redis://127.0.0.1:7000", "127.0.0.1:7001"), "redis://127.0.0.1:7001");
        assert_eq!(
            with_address("rediss://u:p@localhost:7000/0", "127.0.0.1:7002"),
            "rediss://u:p@127.0.0.1:7002"
        );
    }
}
