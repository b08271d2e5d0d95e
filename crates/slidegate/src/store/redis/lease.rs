//! The Redis store's quota leases: `lease.lua` decides a lease's permits as
//! `decide.lua` decides any charge and answers the window it charged;
//! `give_back.lua` undoes unused permits in that window (see
//! `store/lease.rs` for why that is exact). Both run as Lua whatever the
//! [`Engine`](super::Engine): the native module has no lease command.

use std::time::Instant;

use super::wire::{self, DecideArgs};
use super::{scripts, RedisStore};
use crate::store::lease::{usable_for, GiveBack, Lease, LeaseStore};
use crate::store::{check_charge, Charge, StoreError};
use crate::{Algorithm, Identity};

/// Window numbers as the scripts keep them: modulo 2^32.
const WINDOWS: u64 = 1 << 32;

impl LeaseStore for RedisStore {
    async fn lease(
        &self,
        identity: &Identity,
        charge: Charge,
        deadline: Option<Instant>,
    ) -> Result<Lease, StoreError> {
        let Some(lua) = scripts::lease(charge.limit.algorithm) else {
            return Err(StoreError::NotLeased(charge.limit.algorithm));
        };
        check_charge(&charge.limit, charge.cost)?;
        let now_ms = self.client_now()?;
        let deadline = self.deadline(deadline);
        let args =
            DecideArgs { now_ms, limit: charge.limit, cost: charge.cost, deadline_ms: deadline.server_ms };
        let key = self.state_key(identity, &charge.limit);
        let reply = self.eval(lua, &[key], &args, deadline).await?;
        let (decision, window) = wire::leased(&reply, charge.limit.quota.permits())?;
        if !decision.allowed {
            return Ok(Lease { decision, window: 0, usable_for: std::time::Duration::ZERO });
        }
        Ok(Lease { decision, window, usable_for: usable_for(&charge.limit, decision.reset_after) })
    }

    async fn give_back(
        &self,
        identity: &Identity,
        back: GiveBack,
        deadline: Option<Instant>,
    ) -> Result<u64, StoreError> {
        let kind: u8 = match back.limit.algorithm {
            Algorithm::SlidingWindowCounter => 1,
            Algorithm::FixedWindow => 2,
            other => return Err(StoreError::NotLeased(other)),
        };
        if back.unused == 0 {
            return Ok(0);
        }
        let deadline = self.deadline(deadline);
        let deadline_arg: i64 = deadline.server_ms.map_or(-1, |ms| ms as i64);
        let args = (kind, back.limit.quota.permits(), back.window % WINDOWS, back.unused, deadline_arg);
        let key = self.state_key(identity, &back.limit);
        let reply = self.eval(scripts::give_back(), &[key], &args, deadline).await?;
        redis::from_redis_value(reply).map_err(|e| StoreError::UnexpectedReply(format!("give_back: {e}")))
    }
}
