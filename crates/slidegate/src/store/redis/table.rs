//! The Redis store's shared tables (`table.lua`): one hash per table,
//! `<prefix>{table:<name>}` — one key, hence one Cluster slot, and a key
//! that ends at its hash tag, which no identity's key does — each field's
//! value carrying its absolute expiry, since Redis 7.0 has no per-field TTL.
//! A read leaves out expired fields; a put of a new field into a hash at
//! the bound forgets them and refuses it if the live ones fill it, so the
//! hash never holds more fields than the bound; every put extends the
//! hash's own expiry to its latest entry's.

use crate::{TableError, Unavailable};
use std::time::{Duration, Instant};

use redis::Value;

use super::{scripts, RedisStore};
use crate::store::table::{check_field, check_put, MAX_TABLE_ENTRIES};
use crate::store::{SharedTables, StoreError, TableEntry, TableName};

/// The code `table.lua` answers a full table with.
const TABLE_FULL: &str = "TABLEFULL";

impl RedisStore {
    /// The Redis key of shared table `table`: `<prefix>{table:<name>}`.
    pub fn table_key(&self, table: &TableName) -> String {
        format!("{}{{table:{table}}}", self.prefix)
    }

    /// Runs `table.lua`'s `op` on `table` with `rest` after the common
    /// arguments, refusing a full table with [`TableError::Full`](crate::TableError::Full).
    async fn table_call<A: redis::ToRedisArgs + Sync>(
        &self,
        table: &TableName,
        op: &str,
        rest: A,
        deadline: Option<Instant>,
    ) -> Result<Value, StoreError> {
        let now = self.client_now()?;
        let deadline = self.deadline(deadline);
        let now_arg: i64 = now.map_or(-1, |n| n as i64);
        let deadline_arg: i64 = deadline.server_ms.map_or(-1, |ms| ms as i64);
        let slack: u64 = if now.is_some() { 10_000 } else { 0 };
        let args = (now_arg, deadline_arg, op, MAX_TABLE_ENTRIES, slack, rest);
        match self.eval(scripts::table(), &[self.table_key(table)], &args, deadline).await {
            Err(StoreError::Unavailable(Unavailable::Redis(err))) if err.code() == Some(TABLE_FULL) => {
                Err(StoreError::Table(TableError::Full { table: table.to_string(), max: MAX_TABLE_ENTRIES }))
            }
            reply => reply,
        }
    }
}

impl SharedTables for RedisStore {
    async fn put_entry(
        &self,
        table: &TableName,
        field: &[u8],
        value: &[u8],
        ttl: Duration,
        deadline: Option<Instant>,
    ) -> Result<(), StoreError> {
        let ttl_ms = check_put(field, value, ttl)?;
        self.table_call(table, "put", (field, value, ttl_ms), deadline).await?;
        Ok(())
    }

    async fn delete_entry(
        &self,
        table: &TableName,
        field: &[u8],
        deadline: Option<Instant>,
    ) -> Result<bool, StoreError> {
        check_field(field)?;
        let reply = self.table_call(table, "del", field, deadline).await?;
        let removed: i64 = redis::from_redis_value(reply).map_err(|e| {
            StoreError::Unavailable(Unavailable::UnexpectedReply(format!("table delete: {e}")))
        })?;
        Ok(removed == 1)
    }

    async fn read_table(
        &self,
        table: &TableName,
        deadline: Option<Instant>,
    ) -> Result<Vec<TableEntry>, StoreError> {
        let reply = self.table_call(table, "read", Vec::<&[u8]>::new(), deadline).await?;
        let flat: Vec<(Vec<u8>, Vec<u8>, u64)> = redis::from_redis_value(reply)
            .map_err(|e| StoreError::Unavailable(Unavailable::UnexpectedReply(format!("table read: {e}"))))?;
        Ok(flat
            .into_iter()
            .map(|(field, value, ms)| TableEntry {
                field,
                value,
                expires_in: Duration::from_millis(ms.max(1)),
            })
            .collect())
    }
}
