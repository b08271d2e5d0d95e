//! What `demo` and `bench` say when a Redis cannot serve them: which Redis
//! (its URL, the password masked, as `serve` logs it), and, when it lacks
//! the native module `--engine module` asks for, how to load it.

use std::error::Error;

/// `url` as it may be printed: a password in it replaced by `***`.
pub fn shown(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            // Cannot fail on a URL that already has a password.
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        Ok(_) => url.to_owned(),
        // Unreadable: keep no user information, whatever it holds.
        Err(_) => match url.rsplit_once('@') {
            Some((_, host)) => format!("***@{host}"),
            None => url.to_owned(),
        },
    }
}

/// Several URLs, each [`shown`], comma-separated.
pub fn shown_all(urls: &[String]) -> String {
    urls.iter().map(|u| shown(u)).collect::<Vec<_>>().join(", ")
}

/// The error of reaching the Redis at `url`, naming it.
pub fn unreachable(url: &str, err: impl std::fmt::Display) -> Box<dyn Error> {
    format!("cannot reach Redis at {}: {err}", shown(url)).into()
}

/// The error of reaching the Redis Cluster with seed nodes `seeds`, naming them.
pub fn cluster_unreachable(seeds: &[String], err: impl std::fmt::Display) -> Box<dyn Error> {
    format!("cannot reach the Redis Cluster at {}: {err}", shown_all(seeds)).into()
}

/// Refuses a Redis without slidegate's module when `--engine module` asked
/// for it, saying how to load it: every decision would fail, or fall back
/// and be measured without Redis, and the figures would mean nothing.
pub async fn require_module(conn: &mut impl redis::aio::ConnectionLike) -> Result<(), Box<dyn Error>> {
    // One reply per command asked about: nil for a command the server lacks.
    let reply: Vec<redis::Value> =
        redis::cmd("COMMAND").arg("INFO").arg("SLIDEGATE.DECIDE").query_async(conn).await?;
    if reply.first().is_some_and(|v| *v != redis::Value::Nil) {
        return Ok(());
    }
    Err("--engine module, but this Redis has not loaded slidegate's module: build it (cargo build \
         --release -p slidegate-redis-module) and start Redis with --loadmodule \
         /path/to/target/release/libslidegate_redis_module.so (or MODULE LOAD it), or use --engine auto, \
         which decides in Lua where the module is absent"
        .into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_masked_and_nothing_else_changes() {
        assert_eq!(shown("redis://user:pw@127.0.0.1:6380/2"), "redis://user:***@127.0.0.1:6380/2");
        assert_eq!(shown("rediss://:pw@cache.internal:6380"), "rediss://:***@cache.internal:6380");
        assert_eq!(shown("redis://127.0.0.1:6380/"), "redis://127.0.0.1:6380/");
        assert_eq!(shown("redis://user@127.0.0.1"), "redis://user@127.0.0.1");
        assert_eq!(shown("redis://a:p%40ss@h:1"), "redis://a:***@h:1");
        assert_eq!(shown("not a url:pw@host"), "***@host");
        assert_eq!(
            shown_all(&["redis://:a@h:1".into(), "redis://h:2".into()]),
            "redis://:***@h:1, redis://h:2"
        );
    }
}
