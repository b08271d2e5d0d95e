//! The Redis servers a command reaches past the store: one server, or every
//! master of a Redis Cluster. `demo` and `bench` read figures (`INFO`,
//! `MEMORY USAGE`) and delete their keys through it; on a cluster a key lives
//! on one master only and `INFO` describes one node, so both go to each master.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::redis_info::used_memory;
use crate::redis_keys::delete_prefix;

/// One connection per master (a single server is its own only master).
pub struct Nodes {
    masters: Vec<(String, ConnectionManager)>,
    cluster: bool,
}

impl Nodes {
    /// The one server at `url`.
    pub async fn single(url: &str) -> Result<Self, Box<dyn std::error::Error>> {
        let conn = connect(url).await?;
        Ok(Nodes { masters: vec![(url.to_owned(), conn)], cluster: false })
    }

    /// Every master of the cluster that the seed nodes `seeds` belong to,
    /// found with `CLUSTER NODES` on the first seed that answers.
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
                let conn = connect(&url).await.map_err(|e| format!("cannot reach master {addr}: {e}"))?;
                masters.push((url, conn));
            }
            if masters.is_empty() {
                return Err(format!("{seed}: CLUSTER NODES lists no master").into());
            }
            return Ok(Nodes { masters, cluster: true });
        }
        Err(last.into())
    }

    /// Whether these are a cluster's masters.
    pub fn is_cluster(&self) -> bool {
        self.cluster
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
    pub async fn delete_prefix(&mut self, prefix: &str) -> Result<(), redis::RedisError> {
        for conn in self.connections() {
            delete_prefix(conn, prefix).await?;
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
