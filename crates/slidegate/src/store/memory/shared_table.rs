//! The embedded store's shared tables: in process, so "shared" means by
//! every user of this `MemoryStore`. One mutex over all tables: they are
//! small and written by operators, never on a decision's path.

use crate::TableError;
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::store::table::{check_field, check_put, MAX_TABLE_ENTRIES};
use crate::store::{StoreError, TableEntry, TableName};

/// One entry: its value and the store-clock ms at which it expires.
#[derive(Debug)]
struct Entry {
    value: Box<[u8]>,
    expires_at: u64,
}

/// One table's entries, by field.
type Entries = HashMap<Box<[u8]>, Entry>;

/// Every table, by name.
#[derive(Debug, Default)]
pub(super) struct Tables {
    tables: Mutex<HashMap<TableName, Entries>>,
}

impl Tables {
    /// Writes an entry at `now` (see [`crate::SharedTables::put_entry`]); a
    /// new field in a table at the bound forgets its expired ones first.
    pub(super) fn put(
        &self,
        table: &TableName,
        field: &[u8],
        value: &[u8],
        ttl: Duration,
        now: u64,
    ) -> Result<(), StoreError> {
        let ttl_ms = check_put(field, value, ttl)?;
        let mut tables = self.tables.lock().unwrap_or_else(PoisonError::into_inner);
        let entries = tables.entry(table.clone()).or_default();
        if entries.len() >= MAX_TABLE_ENTRIES && !entries.contains_key(field) {
            entries.retain(|_, e| e.expires_at > now);
            if entries.len() >= MAX_TABLE_ENTRIES {
                return Err(StoreError::Table(TableError::Full {
                    table: table.to_string(),
                    max: MAX_TABLE_ENTRIES,
                }));
            }
        }
        entries.insert(field.into(), Entry { value: value.into(), expires_at: now + ttl_ms });
        Ok(())
    }

    /// Removes an entry; whether a live one was there.
    pub(super) fn delete(&self, table: &TableName, field: &[u8], now: u64) -> Result<bool, StoreError> {
        check_field(field)?;
        let mut tables = self.tables.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(entries) = tables.get_mut(table) else { return Ok(false) };
        let live = entries.remove(field).is_some_and(|e| e.expires_at > now);
        if entries.is_empty() {
            tables.remove(table);
        }
        Ok(live)
    }

    /// The live entries of `table` at `now`.
    pub(super) fn read(&self, table: &TableName, now: u64) -> Result<Vec<TableEntry>, StoreError> {
        let tables = self.tables.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(entries) = tables.get(table) else { return Ok(Vec::new()) };
        let live: Vec<TableEntry> = entries
            .iter()
            .filter(|(_, e)| e.expires_at > now)
            .map(|(field, e)| TableEntry {
                field: field.to_vec(),
                value: e.value.to_vec(),
                expires_in: Duration::from_millis(e.expires_at - now),
            })
            .collect();
        if live.len() > MAX_TABLE_ENTRIES {
            return Err(StoreError::Table(TableError::Full {
                table: table.to_string(),
                max: MAX_TABLE_ENTRIES,
            }));
        }
        Ok(live)
    }

    /// Forgets every expired entry (and emptied table) at `now`.
    pub(super) fn sweep(&self, now: u64) {
        let mut tables = self.tables.lock().unwrap_or_else(PoisonError::into_inner);
        tables.retain(|_, entries| {
            entries.retain(|_, e| e.expires_at > now);
            !entries.is_empty()
        });
    }
}
