//! The keys a command writes into a Redis it was pointed at: each run writes
//! under a prefix of its own and deletes everything under it afterwards, so
//! the user's Redis is left as it was found.

use redis::aio::ConnectionLike;

/// A key prefix unique to this process, `<tag><pid>:`: two runs on one Redis
/// never share keys, and a crashed run's leftovers say who wrote them.
///
/// Short on purpose: key length is part of the memory per identity that
/// `demo` and `bench` report.
pub fn run_prefix(tag: &str) -> String {
    format!("{tag}{}:", std::process::id())
}

/// Deletes every key that starts with `prefix` (`SCAN` + `UNLINK`), on one
/// server or one cluster node.
///
/// The prefix is taken literally: glob characters in it match only
/// themselves, so a prefix like `a*:` never reaches another run's `ab:` keys.
///
/// On a cluster node this fails with `MOVED` for a key the node holds but
/// does not own (a slot it is importing): a cluster's keys are deleted
/// through a cluster client instead (`Nodes::delete_prefix`).
pub async fn delete_prefix(conn: &mut impl ConnectionLike, prefix: &str) -> Result<(), redis::RedisError> {
    let mut cursor: u64 = 0;
    loop {
        let (next, keys) = scan_prefix(conn, prefix, cursor).await?;
        if !keys.is_empty() {
            // One UNLINK per key, pipelined, as a cluster node would need
            // (it refuses one command whose keys lie in different slots).
            let mut pipe = redis::pipe();
            for key in &keys {
                pipe.cmd("UNLINK").arg(key).ignore();
            }
            pipe.query_async::<()>(conn).await?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// One `SCAN` step from `cursor` over the keys that start with `prefix`
/// (taken literally): the next cursor (0 at the end) and the keys found.
pub async fn scan_prefix(
    conn: &mut impl ConnectionLike,
    prefix: &str,
    cursor: u64,
) -> Result<(u64, Vec<String>), redis::RedisError> {
    redis::cmd("SCAN")
        .arg(cursor)
        .arg("MATCH")
        .arg(format!("{}*", glob_escape(prefix)))
        .arg("COUNT")
        .arg(10_000)
        .query_async(conn)
        .await
}

/// `UNLINK`s each of `keys` on `conn`, pipelined, and returns the keys
/// whose `UNLINK` failed (say, `MOVED` from a cluster node that holds a key
/// of a slot it does not own) with their errors.
pub async fn unlink_each(
    conn: &mut impl ConnectionLike,
    keys: &[String],
) -> Result<Vec<(String, redis::RedisError)>, redis::RedisError> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    for key in keys {
        pipe.cmd("UNLINK").arg(key);
    }
    let replies: Vec<redis::RedisResult<u64>> = pipe.ignore_errors().query_async(conn).await?;
    Ok(keys.iter().zip(replies).filter_map(|(key, reply)| Some((key.clone(), reply.err()?))).collect())
}

/// Escapes the glob metacharacters of a `SCAN MATCH` pattern (`* ? [ ] \`).
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use slidegate_test_redis::RedisServer;

    #[test]
    fn glob_characters_are_escaped_and_nothing_else() {
        assert_eq!(glob_escape("sgdemo42:"), "sgdemo42:");
        assert_eq!(glob_escape(r"a*b?c[d]e\f"), r"a\*b\?c\[d\]e\\f");
        assert_eq!(glob_escape("{id}:^-!"), "{id}:^-!");
    }

    #[test]
    fn run_prefix_names_the_tag_and_the_process() {
        assert_eq!(run_prefix("sgb"), format!("sgb{}:", std::process::id()));
    }

    #[test]
    fn a_prefix_with_glob_characters_deletes_only_its_own_keys() {
        let server = RedisServer::spawn();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(async {
            let client = redis::Client::open(server.url()).expect("url");
            let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
            // Unescaped, `a*[b]?:` would match all of these as a pattern.
            let own = ["a*[b]?:1", "a*[b]?:2", r"a*[b]?:\x"];
            let others = ["a*[b]?", "axb!:1", "ab?:1", "a*[b]x:1", "a*b?:1", "zz"];
            for key in own.iter().chain(&others) {
                redis::cmd("SET").arg(key).arg(1).query_async::<()>(&mut conn).await.expect("SET");
            }
            delete_prefix(&mut conn, "a*[b]?:").await.expect("delete_prefix");
            let mut left: Vec<String> =
                redis::cmd("KEYS").arg("*").query_async(&mut conn).await.expect("KEYS");
            left.sort_unstable();
            let mut expected: Vec<String> = others.iter().map(|k| (*k).to_owned()).collect();
            expected.sort_unstable();
            assert_eq!(left, expected);
        });
    }
}
