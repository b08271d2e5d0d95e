//! The Redis store's quota leases: `lease.lua` decides a lease's permits as
//! `decide.lua` decides any charge and answers the window it charged;
//! `give_back.lua` undoes unused permits in that window (see
//! `store/lease.rs` for why that is exact). Where decisions go to the
//! native module ([`Engine`](super::Engine)), so do leases:
//! `SLIDEGATE.LEASE` (`SLIDEGATE.DECIDE`'s arguments, `lease.lua`'s reply)
//! and `SLIDEGATE.GIVE_BACK` (`give_back.lua`'s arguments and reply), on
//! the same keys and values. A module without them (an older build)
//! answers "unknown command", which ran nothing: the call goes to Lua.

use std::time::Instant;

use redis::{Cmd, Value};

use super::scripts::{self, Assembly};
use super::wire::{self, DecideAllArgs, DecideArgs, WithFields};
use super::{CallDeadline, RedisStore};
use crate::store::lease::{usable_for, GiveBack, Lease, LeaseStore};
use crate::store::{check_charge, Charge, StoreError};
use crate::{Algorithm, Identity, InvalidRequest, Unavailable};

/// Window numbers as the scripts keep them: modulo 2^32.
const WINDOWS: u64 = 1 << 32;

/// The module's command that decides a lease: `lease.lua`.
const MODULE_LEASE: &str = "SLIDEGATE.LEASE";
/// The module's command that gives permits back: `give_back.lua`.
const MODULE_GIVE_BACK: &str = "SLIDEGATE.GIVE_BACK";

impl LeaseStore for RedisStore {
    async fn lease(
        &self,
        identity: &Identity,
        charge: Charge,
        deadline: Option<Instant>,
    ) -> Result<Lease, StoreError> {
        let Some(lua) = scripts::lease(charge.limit.algorithm, self.assembly()) else {
            return Err(StoreError::Invalid(InvalidRequest::NotLeased(charge.limit.algorithm)));
        };
        check_charge(&charge.limit, charge.cost)?;
        let now_ms = self.client_now()?;
        let deadline = self.deadline(deadline);
        let deadline_ms = deadline.server_ms;
        let identity_keys = self.keys(identity);
        let key = identity_keys.state(&charge.limit);
        let by_module = || {
            let mut cmd = Cmd::with_capacity(3, 192 + self.prefix.len() + identity.scope().len());
            let charges = [charge];
            cmd.arg(MODULE_LEASE).arg(key).arg(DecideAllArgs { now_ms, charges: &charges, deadline_ms });
            cmd
        };
        let reply = match self.by_module(charge.limit.algorithm, by_module, deadline).await? {
            Some(reply) => reply,
            None => {
                let args = DecideArgs { now_ms, limit: charge.limit, cost: charge.cost, deadline_ms };
                let args = WithFields { args, fields: self.fields(std::iter::once(&identity_keys)) };
                self.eval(lua, &[key], &args, deadline).await?
            }
        };
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
            other => return Err(StoreError::Invalid(InvalidRequest::NotLeased(other))),
        };
        if back.unused == 0 {
            return Ok(0);
        }
        let deadline = self.deadline(deadline);
        let deadline_arg: i64 = deadline.server_ms.map_or(-1, |ms| ms as i64);
        let identity_keys = self.keys(identity);
        let key = identity_keys.state(&back.limit);
        if key.is_packed() {
            // The window in full: it names the window's hash.
            let args = (kind, back.limit.quota.permits(), back.window, back.unused, deadline_arg);
            let args = (args, identity_keys.field());
            let reply = self.eval(scripts::give_back(Assembly::Packed), &[key], &args, deadline).await?;
            return redis::from_redis_value(reply).map_err(|e| {
                StoreError::Unavailable(Unavailable::UnexpectedReply(format!("give_back: {e}")))
            });
        }
        let args = (kind, back.limit.quota.permits(), back.window % WINDOWS, back.unused, deadline_arg);
        let by_module = || {
            let mut cmd = Cmd::with_capacity(7, 128 + self.prefix.len() + identity.scope().len());
            cmd.arg(MODULE_GIVE_BACK).arg(key).arg(args);
            cmd
        };
        let reply = match self.by_module(back.limit.algorithm, by_module, deadline).await? {
            Some(reply) => reply,
            None => self.eval(scripts::give_back(Assembly::PerKey), &[key], &args, deadline).await?,
        };
        redis::from_redis_value(reply)
            .map_err(|e| StoreError::Unavailable(Unavailable::UnexpectedReply(format!("give_back: {e}"))))
    }
}

impl RedisStore {
    /// The module's reply to the command `cmd` builds, where leases of
    /// `algorithm` go to the module; `None` where they go to Lua, also
    /// after the module answered "unknown command" (nothing ran).
    async fn by_module(
        &self,
        algorithm: Algorithm,
        cmd: impl FnOnce() -> Cmd,
        deadline: CallDeadline,
    ) -> Result<Option<Value>, StoreError> {
        if !self.lease_by_module(algorithm).await? {
            return Ok(None);
        }
        match self.send(&cmd(), deadline).await {
            Err(err) if self.module_without_leases(&err) => Ok(None),
            reply => reply.map(Some),
        }
    }
}
