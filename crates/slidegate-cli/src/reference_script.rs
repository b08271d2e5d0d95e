//! The source article's sliding window counter script, the published baseline
//! that `demo` and `bench redis` compare slidegate against on the same Redis.
//! It makes no decision anywhere else.

use redis::aio::ConnectionLike;
use redis::Script;
use slidegate::Quota;

/// The article's script, loaded once and called with `EVALSHA`.
#[derive(Debug, Clone)]
pub struct ReferenceScript {
    script: Script,
}

impl ReferenceScript {
    /// The script as the article published it (`reference_script.lua`).
    pub fn new() -> Self {
        ReferenceScript { script: Script::new(include_str!("reference_script.lua")) }
    }

    /// The SHA1 that `EVALSHA` calls it by, for tools that call it directly.
    pub fn sha(&self) -> &str {
        self.script.get_hash()
    }

    /// Loads the script, so that timed calls never pay for a `NOSCRIPT` retry.
    pub async fn load(&self, conn: &mut impl ConnectionLike) -> Result<(), redis::RedisError> {
        self.script.load_async(conn).await.map(drop)
    }

    /// One request of `key` at `now_ms` (the caller's clock: the script reads
    /// no `TIME`); whether it was allowed.
    pub async fn decide(
        &self,
        conn: &mut impl ConnectionLike,
        key: &str,
        now_ms: u64,
        quota: &Quota,
    ) -> Result<bool, redis::RedisError> {
        let allowed: i64 = self
            .script
            .key(key)
            .arg(now_ms)
            .arg(quota.window_ms())
            .arg(quota.permits())
            .invoke_async(conn)
            .await?;
        Ok(allowed == 1)
    }
}
