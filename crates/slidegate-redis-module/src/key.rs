//! A key as a decision reads and writes it: its value through DMA, written
//! in place with its absolute expiry, the write propagated as a `SET`.
#![cfg_attr(test, allow(dead_code))]

use redis_module::{raw, RedisError};

use crate::clock::Clock;
use crate::propagation::{self, count_change, replicate_set};
use crate::stored::{Expiry, Write};
use crate::wire::WRITE_FAILED;

/// An open key, closed (and signalled as modified, when written) on drop.
pub struct OpenKey {
    key: *mut raw::RedisModuleKey,
    name: *mut raw::RedisModuleString,
}

impl OpenKey {
    /// Opens `name` for reading and writing.
    pub fn open(ctx: *mut raw::RedisModuleCtx, name: *mut raw::RedisModuleString) -> Self {
        let key = raw::open_key(ctx, name, raw::KeyMode::READ | raw::KeyMode::WRITE);
        Self { key, name }
    }

    /// The value a script (or this module) left, `None` for no key. Valid
    /// until the key is written or closed, which the borrow enforces.
    #[allow(unsafe_code)]
    pub fn value(&self) -> Result<Option<&[u8]>, RedisError> {
        // SAFETY: the key is open until `self` drops.
        let key_type = unsafe { raw::RedisModule_KeyType.map_or(-1, |f| f(self.key)) };
        match isize::try_from(key_type) {
            Ok(raw::REDISMODULE_KEYTYPE_EMPTY) => Ok(None),
            Ok(raw::REDISMODULE_KEYTYPE_STRING) => {
                let mut len = 0;
                let ptr = raw::string_dma(self.key, &mut len, raw::KeyMode::READ);
                if ptr.is_null() {
                    return Err(RedisError::WrongType);
                }
                // SAFETY: DMA gives `len` readable bytes, valid until the key
                // is written or closed, neither of which can happen while
                // `&self` is borrowed for the slice.
                Ok(Some(unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }))
            }
            _ => Err(RedisError::WrongType),
        }
    }

    /// Writes `write` with its expiry and propagates the same as a `SET`.
    #[allow(unsafe_code)]
    pub fn write(
        &mut self,
        ctx: *mut raw::RedisModuleCtx,
        write: &Write,
        clock: &Clock,
    ) -> Result<(), RedisError> {
        let value = write.value.as_slice().ok_or(WRITE_FAILED)?;
        // In place: truncating to the new length and writing through DMA
        // keeps the key's expiry, which `Expiry::Keep` relies on.
        if raw::string_truncate(self.key, value.len()) == raw::Status::Err {
            return Err(WRITE_FAILED);
        }
        let mut len = 0;
        let ptr = raw::string_dma(self.key, &mut len, raw::KeyMode::WRITE);
        if ptr.is_null() || len != value.len() {
            return Err(WRITE_FAILED);
        }
        // SAFETY: DMA gives `len` writable bytes, exactly the value's length.
        unsafe { std::ptr::copy_nonoverlapping(value.as_ptr(), ptr.cast::<u8>(), len) };
        let name = self.name;
        let propagate = propagation::needed(ctx);
        if !propagate {
            count_change(ctx)?;
        }
        match write.expiry {
            Expiry::Keep if propagate => replicate_set(ctx, name, value, None),
            Expiry::Keep => Ok(()),
            Expiry::IdleAt(idle_at) => {
                let at = clock.expire_at(idle_at)?;
                // SAFETY: the key is open for writing and holds the value just written.
                let status = unsafe { raw::RedisModule_SetAbsExpire.map_or(-1, |f| f(self.key, at)) };
                if status != raw::REDISMODULE_OK as i32 {
                    return Err(WRITE_FAILED);
                }
                if propagate {
                    replicate_set(ctx, name, value, Some(at))?;
                }
                Ok(())
            }
        }
    }
}

impl OpenKey {
    /// In client time, sets the expiry of a key whose state matters
    /// `reset_ms` more to cover it and the slack, charged or not (a
    /// refusal after the client's clock stepped back), and no more (a TTL
    /// lengthened while the clock was behind comes back down once it has
    /// caught up); creates nothing. Propagated as `PEXPIREAT`.
    #[allow(unsafe_code)]
    pub fn keep(
        &mut self,
        ctx: *mut raw::RedisModuleCtx,
        clock: &Clock,
        reset_ms: u64,
    ) -> Result<(), RedisError> {
        let Some(at) = clock.kept_until(reset_ms) else {
            return Ok(());
        };
        if self.value()?.is_none() {
            return Ok(());
        }
        // SAFETY: the key is open for writing and holds a value.
        let current = unsafe { raw::RedisModule_GetAbsExpire.map_or(-1, |f| f(self.key)) };
        // No expiry (-1) is a key no decision wrote: left as it is.
        if current < 0 || current == at {
            return Ok(());
        }
        // SAFETY: as above.
        let status = unsafe { raw::RedisModule_SetAbsExpire.map_or(-1, |f| f(self.key, at)) };
        if status != raw::REDISMODULE_OK as i32 {
            return Err(WRITE_FAILED);
        }
        if propagation::needed(ctx) {
            propagation::replicate_expire(ctx, self.name, at)
        } else {
            count_change(ctx)
        }
    }
}

impl Drop for OpenKey {
    fn drop(&mut self) {
        raw::close_key(self.key);
    }
}
