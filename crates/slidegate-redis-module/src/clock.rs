//! The time of a call: the decision's clock (the client's, or the server's)
//! and the server's, which every expiry is set on.

use redis_module::{raw, RedisError};

use crate::wire::WRITE_FAILED;

/// As in `prelude.lua`: in client time a key outlives its state by this much
/// on the server's clock, covering a client clock that lags the server's.
const CLIENT_TTL_SLACK_MS: u64 = 10_000;

/// The time of one call: the decision's clock and the server's, which
/// every expiry is set on.
pub struct Clock {
    pub now: u64,
    server_now: u64,
    client_time: bool,
}

impl Clock {
    /// Reads the server's clock; the decision's is `client_now` if given.
    #[allow(unsafe_code)]
    pub fn read(client_now: Option<u64>) -> Result<Self, RedisError> {
        // SAFETY: Milliseconds takes no argument and is bound when the module loads.
        let server_now = unsafe { raw::RedisModule_Milliseconds.map_or(0, |f| f()) };
        let server_now = u64::try_from(server_now)
            .map_err(|_| RedisError::Str("ERR slidegate: the server clock is before 1970"))?;
        Ok(Self { now: client_now.unwrap_or(server_now), server_now, client_time: client_now.is_some() })
    }

    /// Refuses a call the server reached after the caller's `deadline`
    /// (ms on the server's clock): the caller counted it as failed, so it
    /// must write nothing. The error carries the server's time, which the
    /// caller learns its clock offset from (as the scripts' prelude).
    pub fn check_deadline(&self, deadline: Option<u64>) -> Result<(), RedisError> {
        match deadline {
            Some(deadline) if self.server_now > deadline => {
                Err(RedisError::String(format!("EXPIRED {}", self.server_now)))
            }
            _ => Ok(()),
        }
    }

    /// In client time, the expiry (on the server's clock) of a key whose
    /// state matters `reset_ms` more (0: idle): that plus the slack, no
    /// more. After a step back of the client's clock the expiry its last
    /// write set falls short of it, and once the clock has caught up one
    /// set then lies beyond it (the scripts' `keep`). `None` in server
    /// time, where every expiry is the state's own instant.
    pub fn kept_until(&self, reset_ms: u64) -> Option<i64> {
        if !self.client_time {
            return None;
        }
        let at = self.server_now.checked_add(reset_ms)?.checked_add(CLIENT_TTL_SLACK_MS)?;
        i64::try_from(at).ok()
    }

    /// The absolute expiry, on the server's clock, of a state idle at
    /// `idle_at` on the decision's clock: as the script's PXAT (server time),
    /// or its PX from now (client time, with slack).
    pub fn expire_at(&self, idle_at: u64) -> Result<i64, RedisError> {
        let at = if self.client_time {
            self.server_now + (idle_at + CLIENT_TTL_SLACK_MS).saturating_sub(self.now)
        } else {
            idle_at
        };
        i64::try_from(at).map_err(|_| WRITE_FAILED)
    }
}
