//! Conformance cases of the shared tables ([`slidegate::SharedTables`]):
//! expiry to the millisecond on the store's clock, replace and delete,
//! binary fields and values, and every bound refused with the error naming it.

use std::time::Duration;

use slidegate::store::table::{MAX_FIELD_BYTES, MAX_TABLE_ENTRIES, MAX_TABLE_TTL, MAX_VALUE_BYTES};
use slidegate::{ManualClock, SharedTables, Store, StoreError, TableEntry, TableError, TableName};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `table`'s live entries as `(field, value, ms left)`, sorted.
async fn entries<T: SharedTables>(tables: &T, table: &TableName) -> Vec<(Vec<u8>, Vec<u8>, u64)> {
    let mut all: Vec<_> = tables
        .read_table(table, None)
        .await
        .expect("read the table")
        .into_iter()
        .map(|TableEntry { field, value, expires_in }| (field, value, expires_in.as_millis() as u64))
        .collect();
    all.sort();
    all
}

fn entry(field: &str, value: &str, left: u64) -> (Vec<u8>, Vec<u8>, u64) {
    (field.as_bytes().to_vec(), value.as_bytes().to_vec(), left)
}

/// Entries live exactly their TTL on the store's clock; a put replaces, a
/// delete says whether a live entry was there; tables are independent.
pub async fn shared_tables_expire_replace_and_delete<S: Store>(store: &S, clock: &ManualClock) {
    let tables = store.tables().expect("this store keeps shared tables");
    let lifts = TableName::new("lifts").expect("valid");
    let other = TableName::new("overrides").expect("valid");
    assert_eq!(entries(&tables, &lifts).await, []);
    tables.put_entry(&lifts, b"a", b"1", ms(1000), None).await.expect("put");
    tables.put_entry(&lifts, b"b", b"2", ms(500), None).await.expect("put");
    tables.put_entry(&other, b"a", b"x", ms(300), None).await.expect("put");
    assert_eq!(entries(&tables, &lifts).await, [entry("a", "1", 1000), entry("b", "2", 500)]);
    clock.advance(ms(499));
    assert_eq!(entries(&tables, &lifts).await, [entry("a", "1", 501), entry("b", "2", 1)]);
    clock.advance(ms(1));
    assert_eq!(entries(&tables, &lifts).await, [entry("a", "1", 500)]);
    assert_eq!(entries(&tables, &other).await, [], "its own TTL: 300 ms");
    tables.put_entry(&lifts, b"a", b"3", ms(2000), None).await.expect("replace");
    assert_eq!(entries(&tables, &lifts).await, [entry("a", "3", 2000)]);
    assert!(tables.delete_entry(&lifts, b"a", None).await.expect("delete"));
    assert!(!tables.delete_entry(&lifts, b"a", None).await.expect("delete again"));
    assert!(!tables.delete_entry(&lifts, b"never", None).await.expect("delete unknown"));
    tables.put_entry(&lifts, b"c", b"", ms(10), None).await.expect("put an empty value");
    clock.advance(ms(10));
    assert!(!tables.delete_entry(&lifts, b"c", None).await.expect("delete expired"), "expired is not live");
    assert_eq!(entries(&tables, &lifts).await, []);
    // Binary-safe, ':' and all (the Redis store writes '<expiry>:<value>').
    let field = [0u8, 255, b':', b'{', b'}'];
    let value = [b':', 0, 1, b':', 200];
    tables.put_entry(&lifts, &field, &value, ms(5), None).await.expect("put binary");
    let read = tables.read_table(&lifts, None).await.expect("read");
    assert_eq!(read, [TableEntry { field: field.to_vec(), value: value.to_vec(), expires_in: ms(5) }]);
    let longest = tables.put_entry(&lifts, b"long", b"v", MAX_TABLE_TTL, None).await;
    assert!(longest.is_ok(), "the longest TTL is accepted: {longest:?}");
}

/// Every bound is refused before anything is written, with an error naming it.
pub async fn shared_tables_refuse_what_is_out_of_bounds<S: Store>(store: &S, clock: &ManualClock) {
    let tables = store.tables().expect("this store keeps shared tables");
    let t = TableName::new("bounds").expect("valid");
    let field = vec![b'f'; MAX_FIELD_BYTES];
    let value = vec![b'v'; MAX_VALUE_BYTES];
    tables.put_entry(&t, &field, &value, ms(1), None).await.expect("the largest entry fits");
    let cases: [(&[u8], &[u8], Duration, &str); 5] = [
        (b"", b"v", ms(1), "a field of 0 bytes"),
        (&[b'f'; MAX_FIELD_BYTES + 1], b"v", ms(1), "a field of 257 bytes"),
        (b"f", &[b'v'; MAX_VALUE_BYTES + 1], ms(1), "a value of 1025 bytes: at most 1024"),
        (b"f", b"v", Duration::ZERO, "a TTL of 0ns"),
        (b"f", b"v", MAX_TABLE_TTL + ms(1), "expected 1 ms to 3652 days"),
    ];
    for (field, value, ttl, message) in cases {
        let err = tables.put_entry(&t, field, value, ttl, None).await.expect_err(message);
        assert!(matches!(err, StoreError::Table(TableError::InvalidEntry(_))), "{message}: {err}");
        assert!(err.to_string().contains(message), "{err} should say {message:?}");
    }
    let err = tables.delete_entry(&t, &[b'f'; MAX_FIELD_BYTES + 1], None).await.expect_err("long field");
    assert!(matches!(err, StoreError::Table(TableError::InvalidEntry(_))), "{err}");
    for bad in ["", "Lifts", "a:b", "{t}", &"x".repeat(33)] {
        let err = TableName::new(bad).expect_err(bad);
        assert!(err.to_string().contains("expected 1 to 32 characters"), "{bad:?}: {err}");
    }
    clock.advance(ms(1));
    assert_eq!(entries(&tables, &t).await, [], "nothing but the largest entry was ever written");
}

/// A table holds at most `MAX_TABLE_ENTRIES` live entries: a new field
/// beyond is refused, a live one may still be replaced, and expired entries
/// make room again.
pub async fn shared_tables_are_bounded<S: Store>(store: &S, clock: &ManualClock) {
    let tables = store.tables().expect("this store keeps shared tables");
    let t = TableName::new("full").expect("valid");
    for i in 0..MAX_TABLE_ENTRIES {
        let ttl = if i == 0 { ms(10) } else { ms(60_000) };
        tables.put_entry(&t, format!("f{i}").as_bytes(), b"v", ttl, None).await.expect("fits");
    }
    let err = tables.put_entry(&t, b"one-more", b"v", ms(60_000), None).await.expect_err("full");
    assert!(matches!(err, StoreError::Table(TableError::Full { max: MAX_TABLE_ENTRIES, .. })), "{err}");
    assert!(err.to_string().contains("\"full\" is full: it may hold at most 10000 live entries"), "{err}");
    tables.put_entry(&t, b"f1", b"w", ms(60_000), None).await.expect("a live field may be replaced");
    assert_eq!(tables.read_table(&t, None).await.expect("read").len(), MAX_TABLE_ENTRIES);
    clock.advance(ms(10));
    tables.put_entry(&t, b"one-more", b"v", ms(60_000), None).await.expect("f0 expired: room for one");
    let err = tables.put_entry(&t, b"two-more", b"v", ms(60_000), None).await.expect_err("full again");
    assert!(matches!(err, StoreError::Table(TableError::Full { .. })), "{err}");
}

/// A lift forgets the identity's penalty box: its block (answering how long
/// it had left), its denials and strikes; the limits decide again, and an
/// identity that is not blocked answers `None`.
pub async fn a_lift_forgets_the_penalty_box<S: Store>(store: &S, clock: &ManualClock) {
    use crate::support::{id, limit, Decide};
    use slidegate::{Algorithm, Penalty};
    let l = limit(Algorithm::FixedWindow, 1, 1000);
    let penalty = Penalty::new(1, ms(60_000), ms(10_000), ms(40_000)).expect("valid");
    let who = id("lifted");
    assert!(store.decide_all_penalized(&who, &[(l, 1)], &penalty).await.expect("decide").allowed());
    let first = store.decide_all_penalized(&who, &[(l, 1)], &penalty).await.expect("decide");
    assert_eq!(first.blocked_for, None, "one denial is allowed");
    let second = store.decide_all_penalized(&who, &[(l, 1)], &penalty).await.expect("decide");
    assert_eq!(second.blocked_for, Some(ms(10_000)), "the second blocks");
    clock.advance(ms(1500));
    assert_eq!(store.lift_penalty(&who, None).await.expect("lift"), Some(ms(8_500)));
    let after = store.decide_all_penalized(&who, &[(l, 1)], &penalty).await.expect("decide");
    assert!(after.allowed(), "the limit has room again and the block is gone: {after:?}");
    assert_eq!(store.lift_penalty(&who, None).await.expect("lift"), None, "nothing left to lift");
    assert_eq!(store.lift_penalty(&id("never"), None).await.expect("lift"), None);
    // The strikes went too: the next block is the first one's length again.
    let denied = store.decide_all_penalized(&who, &[(l, 1)], &penalty).await.expect("decide");
    assert_eq!(denied.blocked_for, None, "the denials went too: one is allowed again");
    let again = store.decide_all_penalized(&who, &[(l, 1)], &penalty).await.expect("decide");
    assert_eq!(again.blocked_for, Some(ms(10_000)), "a first block again, not a doubled one");
}
