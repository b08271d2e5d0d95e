//! The oldest server the stores run on, checked when they connect.
//!
//! Every decision writes with `SET … PXAT` (the expiry in the write), crawl
//! breadth copies its sketch with `COPY`, and the sliding log finds its
//! oldest live entry with `ZRANGE … BYSCORE LIMIT`: all three came with
//! Redis 6.2.0, the newest of everything the scripts use. The native
//! module's newest API call, `RedisModule_SetAbsExpire`, came with 6.2.2;
//! an older server cannot load the module, so it never decides there.
//! README's support table lists each command and call with its version.

use crate::{StoreError, Unavailable};

/// The oldest Redis the stores run on (Valkey, forked from 7.2, has all
/// of it).
pub const MIN_SERVER: (u32, u32, u32) = (6, 2, 0);

/// Refuses a server whose `INFO server` (`info`) names a version older than
/// [`MIN_SERVER`]; one that names none (a proxy in front of Redis, a
/// server that hides it) is let be, and its first decision fails if it
/// lacks a command.
pub(super) fn check(info: &str) -> Result<(), StoreError> {
    let Some(version) = info.lines().find_map(|line| line.strip_prefix("redis_version:")).map(str::trim)
    else {
        return Ok(());
    };
    let mut parts = version.split('.').map(|part| part.parse::<u32>().ok());
    let (Some(Some(major)), Some(Some(minor)), patch) = (parts.next(), parts.next(), parts.next()) else {
        return Ok(());
    };
    let patch = patch.flatten().unwrap_or(0);
    if (major, minor, patch) >= MIN_SERVER {
        return Ok(());
    }
    let (a, b, c) = MIN_SERVER;
    Err(StoreError::Unavailable(Unavailable::Incompatible(format!(
        "Redis {version} is older than {a}.{b}.{c}, which slidegate needs: SET … PXAT (every decision's \
         write), COPY (crawl breadth) and ZRANGE … BYSCORE LIMIT (the sliding log) came with 6.2.0; \
         upgrade the server to Redis 6.2 or later, or Valkey"
    ))))
}

/// [`check`] of each server's `INFO server` in `reply`: one server's text,
/// or a Cluster client's map of its nodes' replies.
pub(super) fn check_reply(reply: &redis::Value) -> Result<(), StoreError> {
    match reply {
        redis::Value::BulkString(bytes) => check(&String::from_utf8_lossy(bytes)),
        redis::Value::VerbatimString { text, .. } | redis::Value::SimpleString(text) => check(text),
        redis::Value::Map(nodes) => nodes.iter().try_for_each(|(_, info)| check_reply(info)),
        redis::Value::Array(nodes) => nodes.iter().try_for_each(check_reply),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(version: &str) -> String {
        format!("# Server\r\nredis_version:{version}\r\nredis_git_sha1:00000000\r\nredis_mode:standalone\r\n")
    }

    #[test]
    fn a_server_older_than_6_2_is_refused_naming_what_it_lacks() {
        for old in ["6.0.16", "5.0.14", "6.1.9", "4.0.0"] {
            let err = check(&info(old)).unwrap_err().to_string();
            assert!(err.starts_with(&format!("Redis {old} is older than 6.2.0")), "{err}");
            assert!(err.contains("SET … PXAT") && err.contains("COPY") && err.contains("BYSCORE"), "{err}");
            assert!(!StoreError::Unavailable(Unavailable::Incompatible(err)).may_have_charged());
        }
    }

    #[test]
    fn newer_servers_valkey_and_servers_that_do_not_say_are_let_be() {
        for new in ["6.2.0", "6.2.14", "7.0.15", "7.2.4", "8.0.1", "7.4"] {
            assert!(check(&info(new)).is_ok(), "{new}");
        }
        // Valkey says redis_version:7.2.4 (for clients that check) and its own.
        assert!(check("redis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.0.1\r\n").is_ok());
        assert!(check("# Server\r\nredis_mode:standalone\r\n").is_ok());
        assert!(check("redis_version:unknown\r\n").is_ok());
    }

    #[test]
    fn one_old_node_of_a_cluster_refuses_the_cluster() {
        let node = |version: &str| redis::Value::BulkString(info(version).into_bytes());
        let name = |port: u16| redis::Value::SimpleString(format!("127.0.0.1:{port}"));
        let cluster = |third: &str| {
            redis::Value::Map(vec![
                (name(7000), node("7.0.15")),
                (name(7001), node("7.0.15")),
                (name(7002), node(third)),
            ])
        };
        assert!(check_reply(&cluster("7.0.15")).is_ok());
        let err = check_reply(&cluster("6.0.9")).unwrap_err().to_string();
        assert!(err.starts_with("Redis 6.0.9 is older than 6.2.0"), "{err}");
        assert!(check_reply(&node("6.0.9")).is_err());
    }
}
