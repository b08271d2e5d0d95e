//! Shared tables: small keyed tables every instance on a store reads and
//! writes, each entry expiring by itself — an operator's runtime state (a
//! lifted penalty, a per-key override) that must reach every instance.
//!
//! A capability some stores have, asked for through [`crate::Store::tables`],
//! like [`crate::DistinctStore`]. Tables are small and bounded: at most
//! [`MAX_TABLE_ENTRIES`] live entries, fields of at most
//! [`MAX_FIELD_BYTES`], values of at most [`MAX_VALUE_BYTES`], TTLs from
//! 1 ms to [`MAX_TABLE_TTL`]; a write past a bound is refused with an error
//! that says which, and so is a read of a table that holds more entries than
//! the bound (a reader never takes in an unbounded answer).
//!
//! Expiry is the store's clock's, per entry: an entry is live until
//! `ttl` after it was written, then every read leaves it out.

use crate::TableError;
use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

use crate::store::StoreError;

/// The most live entries a table holds: a write of a new field beyond it is
/// refused ([`TableError::Full`]), and so is a read of a table that
/// (through concurrent writes) holds more.
pub const MAX_TABLE_ENTRIES: usize = 10_000;
/// The longest field, in bytes.
pub const MAX_FIELD_BYTES: usize = 256;
/// The longest value, in bytes.
pub const MAX_VALUE_BYTES: usize = 1024;
/// The longest an entry lives: ten years (365.25 days each).
pub const MAX_TABLE_TTL: Duration = Duration::from_millis(315_576_000_000);
/// The longest table name.
pub const MAX_TABLE_NAME: usize = 32;

/// A table's name: 1 to [`MAX_TABLE_NAME`] characters of `a-z`, `0-9`, `_`
/// and `-`, so that it is the same text in every store's keys and logs.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TableName(Box<str>);

impl TableName {
    /// `name`, if it is a valid table name.
    ///
    /// ```
    /// use slidegate::store::TableName;
    /// assert_eq!(TableName::new("lifts")?.as_str(), "lifts");
    /// assert!(TableName::new("Lifts").is_err());
    /// # Ok::<(), slidegate::StoreError>(())
    /// ```
    ///
    /// # Errors
    /// [`TableError::InvalidEntry`] naming what is wrong.
    pub fn new(name: &str) -> Result<Self, StoreError> {
        let valid = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-';
        if name.is_empty() || name.len() > MAX_TABLE_NAME || !name.chars().all(valid) {
            return Err(StoreError::Table(TableError::InvalidEntry(format!(
                "table name {name:?}: expected 1 to {MAX_TABLE_NAME} characters of a-z, 0-9, '_' and '-'"
            ))));
        }
        Ok(Self(name.into()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One live entry of a shared table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableEntry {
    /// The entry's field (its key within the table).
    pub field: Vec<u8>,
    /// Its value.
    pub value: Vec<u8>,
    /// How long it lives on, on the store's clock (at least 1 ms).
    pub expires_in: Duration,
}

/// The ability to keep small tables shared by every instance on the store,
/// with per-entry expiry: asked for through [`crate::Store::tables`].
///
/// Every call takes an optional deadline: a store that can carries it along
/// and refuses the call unrun when it reaches it later
/// ([`Unavailable::Expired`](crate::Unavailable::Expired)), as decisions do.
pub trait SharedTables: Send + Sync {
    /// Writes `value` under `field` in `table`, replacing what was there,
    /// live for `ttl`.
    ///
    /// # Errors
    /// [`TableError::InvalidEntry`] for a field, value or TTL out of
    /// bounds, [`TableError::Full`] for a new field in a table holding
    /// [`MAX_TABLE_ENTRIES`] live ones, or the store's failure.
    fn put_entry(
        &self,
        table: &TableName,
        field: &[u8],
        value: &[u8],
        ttl: Duration,
        deadline: Option<Instant>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Removes `field` from `table`. Answers whether a live entry was there.
    ///
    /// # Errors
    /// [`TableError::InvalidEntry`] for a field out of bounds, or the
    /// store's failure.
    fn delete_entry(
        &self,
        table: &TableName,
        field: &[u8],
        deadline: Option<Instant>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Every live entry of `table`, in no particular order.
    ///
    /// # Errors
    /// [`TableError::Full`] when it holds more than
    /// [`MAX_TABLE_ENTRIES`] live entries, or the store's failure.
    fn read_table(
        &self,
        table: &TableName,
        deadline: Option<Instant>,
    ) -> impl Future<Output = Result<Vec<TableEntry>, StoreError>> + Send;
}

/// The [`SharedTables`] of a store that has none: it cannot be made, so such
/// a store returns `None::<NoTables>` from [`crate::Store::tables`].
#[derive(Debug)]
pub enum NoTables {}

impl SharedTables for NoTables {
    async fn put_entry(
        &self,
        _: &TableName,
        _: &[u8],
        _: &[u8],
        _: Duration,
        _: Option<Instant>,
    ) -> Result<(), StoreError> {
        match *self {}
    }

    async fn delete_entry(&self, _: &TableName, _: &[u8], _: Option<Instant>) -> Result<bool, StoreError> {
        match *self {}
    }

    async fn read_table(&self, _: &TableName, _: Option<Instant>) -> Result<Vec<TableEntry>, StoreError> {
        match *self {}
    }
}

impl<T: SharedTables> SharedTables for &T {
    fn put_entry(
        &self,
        table: &TableName,
        field: &[u8],
        value: &[u8],
        ttl: Duration,
        deadline: Option<Instant>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).put_entry(table, field, value, ttl, deadline)
    }

    fn delete_entry(
        &self,
        table: &TableName,
        field: &[u8],
        deadline: Option<Instant>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        (**self).delete_entry(table, field, deadline)
    }

    fn read_table(
        &self,
        table: &TableName,
        deadline: Option<Instant>,
    ) -> impl Future<Output = Result<Vec<TableEntry>, StoreError>> + Send {
        (**self).read_table(table, deadline)
    }
}

/// The bounds of a write, checked by every store before touching state:
/// `ttl` in whole milliseconds on success.
pub(crate) fn check_put(field: &[u8], value: &[u8], ttl: Duration) -> Result<u64, StoreError> {
    check_field(field)?;
    if value.len() > MAX_VALUE_BYTES {
        return Err(StoreError::Table(TableError::InvalidEntry(format!(
            "a value of {} bytes: at most {MAX_VALUE_BYTES}",
            value.len()
        ))));
    }
    let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 || ttl > MAX_TABLE_TTL {
        return Err(StoreError::Table(TableError::InvalidEntry(format!(
            "a TTL of {ttl:?}: expected 1 ms to {} days",
            MAX_TABLE_TTL.as_secs() / 86_400
        ))));
    }
    Ok(ms)
}

/// The bounds of a field.
pub(crate) fn check_field(field: &[u8]) -> Result<(), StoreError> {
    if field.is_empty() || field.len() > MAX_FIELD_BYTES {
        return Err(StoreError::Table(TableError::InvalidEntry(format!(
            "a field of {} bytes: expected 1 to {MAX_FIELD_BYTES}",
            field.len()
        ))));
    }
    Ok(())
}
