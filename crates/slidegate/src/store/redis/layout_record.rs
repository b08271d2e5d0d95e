//! One layout per prefix: the record, in Redis, of the layout and bucket
//! count every store deciding under a prefix must share.
//!
//! Two stores under one prefix in different layouts (or packed with
//! different bucket counts) look for an identity's state in different keys:
//! each counts alone, and together they admit the limit once each. So the
//! first store to record its layout writes `<prefix>layout` (`per_key` or
//! `packed <buckets>`, written only if missing, inside one script), and every
//! store after it compares: the same record lengthens the key's TTL, another
//! is a [`LayoutConflict`] naming both, and the store should not decide.
//!
//! The record lives as long as the caller says (at least as long as the
//! longest state it decides on lives) and every live store renews it: once
//! every store has been gone that long, their counts have expired too, and a
//! store in another layout may start afresh under the prefix. The key has no
//! hash tag: one key, on whichever Cluster node owns its slot.

use std::fmt;
use std::time::Duration;

use redis::Value;

use super::{scripts, Layout, RedisStore};
use crate::store::StoreError;
use crate::Unavailable;

/// The record's key under a prefix: `<prefix>layout`, which no identity's
/// key (`<prefix>{…}…`) can be.
pub(super) fn record_key(prefix: &str) -> String {
    format!("{prefix}layout")
}

/// How a layout is written in the record: `per_key` or `packed <buckets>`.
fn record_text(layout: Layout) -> String {
    match layout {
        Layout::PerKey => "per_key".to_owned(),
        Layout::Packed(buckets) => format!("packed {}", buckets.get()),
    }
}

/// Another store recorded another layout, or another bucket count, under
/// this store's prefix ([`RedisStore::record_layout`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutConflict {
    /// The record's key.
    pub key: String,
    /// The layout recorded there, as written (`per_key`, `packed <buckets>`,
    /// or whatever else the key held, cut to 64 bytes).
    pub recorded: String,
    /// This store's layout.
    pub this: Layout,
}

impl fmt::Display for LayoutConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let recorded = match self.recorded.split_once(' ') {
            Some(("packed", buckets)) => format!("packed ({buckets} buckets)"),
            _ if self.recorded == "per_key" => "per_key".to_owned(),
            _ => format!("an unknown record {:?}", self.recorded),
        };
        write!(
            f,
            "the prefix's layout is recorded in Redis as {recorded} (key {key}), but this store is {this}: \
             stores under one prefix in different layouts or bucket counts count separately and admit the \
             limit once each. To switch, use a new prefix for the new settings, or switch every instance \
             at once: stop them all, delete the record (DEL {key}), and start them with the new settings",
            key = self.key,
            this = self.this,
        )
    }
}

impl std::error::Error for LayoutConflict {}

impl RedisStore {
    /// Records this store's layout and bucket count under its prefix if no
    /// store has yet, or checks it against the record, which then lives
    /// `keep_for` more (give at least the longest life of any state decided
    /// under the prefix, and call again well within it while deciding, so
    /// that the record lasts as long as some store uses it).
    ///
    /// # Errors
    /// [`Unavailable::LayoutConflict`] when another layout or bucket count
    /// is recorded (this store should then not decide: its counts would be
    /// apart from the others'); [`Unavailable::Incompatible`] when the key
    /// holds something other than a string; as any call when Redis fails.
    pub async fn record_layout(&self, keep_for: Duration) -> Result<(), StoreError> {
        let key = record_key(&self.prefix);
        let this = record_text(self.layout());
        let keep_ms = u64::try_from(keep_for.as_millis()).unwrap_or(u64::MAX).max(1).to_string();
        let deadline = self.deadline(None);
        let reply = match self.eval(scripts::layout_record(), &[&key], &(&this, keep_ms), deadline).await {
            Err(StoreError::Unavailable(Unavailable::Redis(err))) if err.code() == Some("LAYOUT_RECORD") => {
                let kind = err.detail().unwrap_or_default().to_owned();
                return Err(StoreError::Unavailable(Unavailable::Incompatible(format!(
                    "the layout record {key} holds a {kind}, not a layout: delete it (DEL {key}) if nothing \
                     else uses it, or give this store another prefix"
                ))));
            }
            reply => reply?,
        };
        let recorded = match reply {
            Value::BulkString(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Value::SimpleString(text) => text,
            other => {
                return Err(StoreError::Unavailable(Unavailable::UnexpectedReply(format!(
                    "layout record: {other:?}"
                ))))
            }
        };
        if recorded == this {
            return Ok(());
        }
        let mut recorded = recorded;
        if recorded.len() > 64 {
            let mut cut = 64;
            while !recorded.is_char_boundary(cut) {
                cut -= 1;
            }
            recorded.truncate(cut);
        }
        Err(StoreError::Unavailable(Unavailable::LayoutConflict(Box::new(LayoutConflict {
            key,
            recorded,
            this: self.layout(),
        }))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Buckets;

    #[test]
    fn a_conflict_names_both_settings_and_how_to_switch() {
        let conflict = LayoutConflict {
            key: "app:layout".to_owned(),
            recorded: "packed 1024".to_owned(),
            this: Layout::Packed(Buckets::new(32).expect("a power of two")),
        };
        let text = conflict.to_string();
        assert!(text.contains("recorded in Redis as packed (1024 buckets) (key app:layout)"), "{text}");
        assert!(text.contains("this store is packed (32 buckets)"), "{text}");
        assert!(text.contains("use a new prefix") && text.contains("DEL app:layout"), "{text}");
        let other = LayoutConflict { recorded: "per_key".to_owned(), ..conflict.clone() };
        assert!(other.to_string().contains("as per_key (key"), "{other}");
        let odd = LayoutConflict { recorded: "x\ny".to_owned(), ..conflict };
        assert!(odd.to_string().contains(r#"an unknown record "x\ny""#), "{odd}");
        assert_eq!(record_text(Layout::PerKey), "per_key");
        assert_eq!(record_text(Layout::packed_for(20_000)), "packed 1024");
    }
}
