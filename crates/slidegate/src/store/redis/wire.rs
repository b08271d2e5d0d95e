//! What travels to and from the scripts: little-endian doubles.
//!
//! ARGV[1] and the reply are byte strings of little-endian `f64`s (Lua's
//! `struct` format `'<d'`), not decimal strings: decoding a double in Lua
//! costs a fraction of `tonumber` on a decimal string, and a string reply
//! converts faster than a table. Every value is an integer below 2^53, which
//! a double holds exactly; the decoder checks that it got integers.

use std::time::Duration;

use redis::{RedisWrite, ToRedisArgs, ToSingleRedisArg, Value};

use super::scripts;
use crate::store::StoreError;
use crate::store::{Charge, Outcome};
use crate::{Decision, Limit, Penalty, Unavailable};

/// The time argument that makes a script read Redis `TIME`.
const NOW_FROM_REDIS: f64 = -1.0;
/// Bytes of one decision in a reply.
const DECISION_BYTES: usize = 32;

fn now_arg(now_ms: Option<u64>) -> f64 {
    now_ms.map_or(NOW_FROM_REDIS, |ms| ms as f64)
}

/// ARGV[1] of `decide.lua`: now (or -1), limit, window in ms, cost, then
/// the deadline on the server's clock when there is one.
pub(super) struct DecideArgs {
    pub(super) now_ms: Option<u64>,
    pub(super) limit: Limit,
    pub(super) cost: u64,
    pub(super) deadline_ms: Option<u64>,
}

impl ToRedisArgs for DecideArgs {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + RedisWrite,
    {
        let values = [
            now_arg(self.now_ms),
            self.limit.quota.permits() as f64,
            self.limit.quota.window_ms() as f64,
            self.cost as f64,
            self.deadline_ms.map_or(0.0, |ms| ms as f64),
        ];
        let mut bytes = [0u8; 40];
        for (chunk, v) in bytes.chunks_exact_mut(8).zip(values) {
            chunk.copy_from_slice(&v.to_le_bytes());
        }
        let len = if self.deadline_ms.is_some() { 40 } else { 32 };
        out.write_arg(&bytes[..len]);
    }
}

impl ToSingleRedisArg for DecideArgs {}

/// ARGV[1] of `decide_all.lua`: now (or -1), then per limit its algorithm
/// number ([`scripts::number`]), limit, window in ms and cost, then the
/// deadline on the server's clock when there is one (the scripts and the
/// module tell it by the length: 16 + 32 n bytes rather than 8 + 32 n).
pub(super) struct DecideAllArgs<'a> {
    pub(super) now_ms: Option<u64>,
    pub(super) charges: &'a [Charge],
    pub(super) deadline_ms: Option<u64>,
}

impl ToRedisArgs for DecideAllArgs<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + RedisWrite,
    {
        let mut bytes = Vec::with_capacity(16 + 32 * self.charges.len());
        bytes.extend_from_slice(&now_arg(self.now_ms).to_le_bytes());
        for &Charge { limit, cost } in self.charges {
            for v in [
                scripts::number(limit.algorithm) as f64,
                limit.quota.permits() as f64,
                limit.quota.window_ms() as f64,
                cost as f64,
            ] {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
        }
        if let Some(ms) = self.deadline_ms {
            bytes.extend_from_slice(&(ms as f64).to_le_bytes());
        }
        out.write_arg(&bytes);
    }
}

impl ToSingleRedisArg for DecideAllArgs<'_> {}

/// A script's arguments, then (in the packed layout) one more: the fields
/// of its keys' identities (`decide.lua`'s ARGV[2], `decide_all.lua`'s last).
pub(super) struct WithFields<A> {
    pub(super) args: A,
    pub(super) fields: Option<Vec<u8>>,
}

impl<A: ToRedisArgs> ToRedisArgs for WithFields<A> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + RedisWrite,
    {
        self.args.write_redis_args(out);
        if let Some(fields) = &self.fields {
            out.write_arg(fields);
        }
    }
}

/// The error code of a call the server reached after its deadline:
/// `EXPIRED <server ms>`, from the scripts and the module alike.
const EXPIRED: &str = "EXPIRED";

/// The server's time in a refusal of a call past its deadline, or `None`
/// when `err` is not one.
pub(super) fn expired(err: &redis::RedisError) -> Option<u64> {
    if err.code() != Some(EXPIRED) {
        return None;
    }
    Some(err.detail().and_then(|d| d.trim().parse().ok()).unwrap_or(0))
}

/// The decisions in a script's reply, one per limit in `limits`.
pub(super) fn decisions(
    reply: &Value,
    limits: impl ExactSizeIterator<Item = u64>,
) -> Result<Vec<Decision>, StoreError> {
    let bytes = reply_bytes(reply, limits.len())?;
    bytes.chunks_exact(DECISION_BYTES).zip(limits).map(|(chunk, limit)| decision(chunk, limit)).collect()
}

/// ARGV[2] of `penalty.lua`: after, within, block and max_block as doubles.
pub(super) struct PenaltyArgs<'a>(pub(super) &'a Penalty);

impl ToRedisArgs for PenaltyArgs<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + RedisWrite,
    {
        let p = self.0;
        let mut bytes = Vec::with_capacity(32);
        for v in [p.after(), p.within_ms(), p.block_ms(), p.max_block_ms()] {
            bytes.extend_from_slice(&(v as f64).to_le_bytes());
        }
        out.write_arg(&bytes);
    }
}

impl ToSingleRedisArg for PenaltyArgs<'_> {}

/// A `penalty.lua` reply: one double (blocked, the remaining ms) or the
/// decisions followed by one double (the block this denial started, or -1).
pub(super) fn penalized(
    reply: &Value,
    limits: impl ExactSizeIterator<Item = u64>,
) -> Result<Outcome, StoreError> {
    let count = limits.len();
    let bytes = match reply {
        Value::BulkString(bytes) if bytes.len() == 8 || bytes.len() == count * DECISION_BYTES + 8 => bytes,
        other => {
            return Err(StoreError::Unavailable(Unavailable::UnexpectedReply(format!(
                "expected 8 or {} bytes ({count} decisions and a block), got {other:?}",
                count * DECISION_BYTES + 8
            ))))
        }
    };
    let (decided, block) = bytes.split_at(bytes.len() - 8);
    let mut le = [0u8; 8];
    le.copy_from_slice(block);
    let block = f64::from_le_bytes(le);
    let decisions = decided
        .chunks_exact(DECISION_BYTES)
        .zip(limits)
        .map(|(chunk, limit)| decision(chunk, limit))
        .collect::<Result<Vec<_>, _>>()?;
    // Integral ms below 2^53 by the penalty's bounds.
    Ok(if block >= 0.0 { Outcome::blocked(decisions, block as u64) } else { Outcome::decided(decisions) })
}

/// The one decision in a `decide.lua` reply (or the module's): an allowed
/// decision as the integer remaining × 2^32 + reset_after ms, when remaining
/// is below 2^21 and reset_after below 2^32 ms (Redis turns a Lua number into
/// an integer reply at a fraction of a string's cost); any other as the
/// four doubles.
pub(super) fn single_decision(reply: &Value, limit: u64) -> Result<Decision, StoreError> {
    match *reply {
        Value::Int(packed) => allowed_decision(packed, limit),
        _ => decision(reply_bytes(reply, 1)?, limit),
    }
}

/// The decision and the window number (modulo 2^32) in a `lease.lua` reply.
pub(super) fn leased(reply: &Value, limit: u64) -> Result<(Decision, u64), StoreError> {
    let bytes = match reply {
        Value::BulkString(bytes) if bytes.len() == DECISION_BYTES + 8 => bytes,
        other => {
            return Err(StoreError::Unavailable(Unavailable::UnexpectedReply(format!(
                "expected {} bytes (a lease), got {other:?}",
                DECISION_BYTES + 8
            ))))
        }
    };
    let (chunk, window) = bytes.split_at(DECISION_BYTES);
    let mut le = [0u8; 8];
    le.copy_from_slice(window);
    let window = f64::from_le_bytes(le);
    if !(0.0..4_294_967_296.0).contains(&window) || window.fract() != 0.0 {
        return Err(StoreError::Unavailable(Unavailable::UnexpectedReply(format!("lease window {window}"))));
    }
    Ok((decision(chunk, limit)?, window as u64))
}

/// remaining × 2^32 + reset_after ms, as `decide.lua` replies an allowed decision.
fn allowed_decision(packed: i64, limit: u64) -> Result<Decision, StoreError> {
    const REMAINING_BELOW: u64 = 1 << 21;
    let unexpected = || StoreError::Unavailable(Unavailable::UnexpectedReply(format!("decision {packed}")));
    let packed = u64::try_from(packed).map_err(|_| unexpected())?;
    let (remaining, reset_after) = (packed >> 32, packed & 0xffff_ffff);
    if remaining >= REMAINING_BELOW || remaining > limit {
        return Err(unexpected());
    }
    Ok(Decision {
        allowed: true,
        limit,
        remaining,
        reset_after: Duration::from_millis(reset_after),
        retry_after: None,
    })
}

fn reply_bytes(reply: &Value, count: usize) -> Result<&[u8], StoreError> {
    match reply {
        Value::BulkString(bytes) if bytes.len() == count * DECISION_BYTES => Ok(bytes),
        other => Err(StoreError::Unavailable(Unavailable::UnexpectedReply(format!(
            "expected {} bytes ({count} decisions), got {other:?}",
            count * DECISION_BYTES
        )))),
    }
}

/// allowed (1|0), remaining, reset_after ms, retry_after ms (-1 when allowed).
fn decision(chunk: &[u8], limit: u64) -> Result<Decision, StoreError> {
    let mut values = [0.0f64; 4];
    for (v, bytes) in values.iter_mut().zip(chunk.chunks_exact(8)) {
        let mut le = [0u8; 8];
        le.copy_from_slice(bytes);
        *v = f64::from_le_bytes(le);
    }
    let [allowed, remaining, reset_after, retry_after] = values;
    let unexpected = || StoreError::Unavailable(Unavailable::UnexpectedReply(format!("decision {values:?}")));
    // An integer in 0..=2^53, as every count and duration here is.
    let whole = |v: f64| (v >= 0.0 && v <= crate::MAX_EXACT as f64 && v.fract() == 0.0).then_some(v as u64);
    let allowed = match allowed {
        1.0 => true,
        0.0 => false,
        _ => return Err(unexpected()),
    };
    let retry_after = match (allowed, retry_after) {
        (true, NOW_FROM_REDIS) => None,
        (false, ms) => Some(Duration::from_millis(whole(ms).ok_or_else(unexpected)?)),
        _ => return Err(unexpected()),
    };
    Ok(Decision {
        allowed,
        limit,
        remaining: whole(remaining).ok_or_else(unexpected)?,
        reset_after: Duration::from_millis(whole(reset_after).ok_or_else(unexpected)?),
        retry_after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Algorithm;

    fn reply(values: &[f64]) -> Value {
        Value::BulkString(values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }

    #[test]
    fn decodes_allowed_and_denied_decisions() {
        let d = single_decision(&reply(&[1.0, 4.0, 1750.0, -1.0]), 5).expect("valid reply");
        let want = Decision {
            allowed: true,
            limit: 5,
            remaining: 4,
            reset_after: Duration::from_millis(1750),
            retry_after: None,
        };
        assert_eq!(d, want);
        let two = decisions(
            &reply(&[1.0, 4.0, 1750.0, -1.0, 0.0, 0.0, 9.0, 9_007_199_254_740_992.0]),
            [5, 7].into_iter(),
        )
        .expect("valid reply");
        assert_eq!(two[0], want);
        assert_eq!(two[1].retry_after, Some(Duration::from_millis(1 << 53)));
        assert_eq!((two[1].allowed, two[1].limit), (false, 7));
    }

    #[test]
    fn decodes_an_allowed_decision_packed_in_an_integer() {
        let d = single_decision(&Value::Int((4 << 32) + 1750), 5).expect("valid reply");
        let want = Decision {
            allowed: true,
            limit: 5,
            remaining: 4,
            reset_after: Duration::from_millis(1750),
            retry_after: None,
        };
        assert_eq!(d, want);
        let edge =
            single_decision(&Value::Int((((1 << 21) - 1) << 32) + 0xffff_ffff), 1 << 30).expect("valid");
        assert_eq!(edge.remaining, (1 << 21) - 1);
        assert_eq!(edge.reset_after, Duration::from_millis(0xffff_ffff));
        let none_left = single_decision(&Value::Int(0), 5).expect("valid reply");
        assert_eq!(
            (none_left.allowed, none_left.remaining, none_left.reset_after),
            (true, 0, Duration::ZERO)
        );
    }

    #[test]
    fn rejects_what_a_script_never_returns() {
        for bad in [
            reply(&[1.0, 4.0, 1750.0]),
            reply(&[2.0, 4.0, 1750.0, -1.0]),
            reply(&[1.0, 4.5, 1750.0, -1.0]),
            reply(&[1.0, -4.0, 1750.0, -1.0]),
            reply(&[1.0, 4.0, 1750.0, 3.0]),
            reply(&[0.0, 4.0, 1750.0, -1.0]),
            reply(&[0.0, 4.0, f64::NAN, 1.0]),
            Value::Int(-1),
            // remaining 6 of 5
            Value::Int((6 << 32) + 1750),
            Value::Okay,
        ] {
            let Err(err) = single_decision(&bad, 5) else { panic!("accepted {bad:?}") };
            assert!(matches!(err, StoreError::Unavailable(Unavailable::UnexpectedReply(_))), "{bad:?}");
        }
    }

    #[test]
    fn arguments_are_little_endian_doubles() {
        let limit = Limit::new(Algorithm::Gcra, crate::Quota::per_minute(100).expect("valid"));
        let doubles = |values: &[f64]| values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
        let args =
            DecideArgs { now_ms: Some(1_700_000_000_123), limit, cost: 3, deadline_ms: None }.to_redis_args();
        assert_eq!(args, [doubles(&[1_700_000_000_123.0, 100.0, 60_000.0, 3.0])]);
        let args =
            DecideArgs { now_ms: None, limit, cost: 3, deadline_ms: Some(1_700_000_000_173) }.to_redis_args();
        assert_eq!(args, [doubles(&[-1.0, 100.0, 60_000.0, 3.0, 1_700_000_000_173.0])]);
        let charges = [Charge::new(limit, 2)];
        let all = DecideAllArgs { now_ms: None, charges: &charges, deadline_ms: None }.to_redis_args();
        assert_eq!(all, [doubles(&[-1.0, 5.0, 100.0, 60_000.0, 2.0])]);
        let all = DecideAllArgs { now_ms: None, charges: &charges, deadline_ms: Some(7) }.to_redis_args();
        assert_eq!(all, [doubles(&[-1.0, 5.0, 100.0, 60_000.0, 2.0, 7.0])]);
    }
}
