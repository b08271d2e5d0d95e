//! The TOML text read into the [`RawConfig`] mirror part by part, so that a
//! misspelt key in one table does not hide what is wrong in the others.
//!
//! The text is parsed once, with toml's recovering parser, so every syntax
//! error is reported (and nothing else: a file that is not TOML has no parts
//! to check). The document is then read into `RawConfig` whole; only when
//! that fails is it read again one part at a time — each top-level table,
//! and each element of a top-level array such as `[[rules]]` — and every
//! part that fails gives its first error. The parts that read are kept and
//! validated as usual, so one pass reports the errors of every part.
//!
//! Nothing here names a table: a key added to `RawConfig` is read part by
//! part with the rest (top-level keys must stay optional, as they are: a
//! file holding one part is read on its own).

use std::collections::BTreeSet;

use serde::Deserialize as _;
use toml::de::{DeArray, DeTable, DeValue};
use toml::Spanned;

use super::super::error::ConfigError;
use super::super::raw::RawConfig;
use super::Found;

/// What could be read of a file.
pub(super) struct Read {
    /// The parts that were read.
    pub(super) raw: RawConfig,
    /// Top-level keys some part of which could not be read (its error is
    /// found already): checks that need the part skip it rather than
    /// report it missing.
    pub(super) unread: BTreeSet<String>,
}

/// Parses `source` and reads what it can into a `RawConfig`, adding every
/// error to `found`; `None` when the text is not TOML.
pub(super) fn read(
    source: &str,
    fail: &dyn Fn(Option<std::ops::Range<usize>>, String) -> ConfigError,
    found: &mut Found,
) -> Option<Read> {
    let located = |e: &toml::de::Error| fail(e.span(), e.message().to_owned());
    let (document, syntax) = DeTable::parse_recoverable(source);
    if !syntax.is_empty() {
        // What follows a syntax error on its line is the parser recovering.
        let line = |e: &toml::de::Error| {
            let start = e.span().map_or(0, |s| s.start.min(source.len()));
            source.as_bytes()[..start].iter().filter(|b| **b == b'\n').count()
        };
        let mut lines = BTreeSet::new();
        syntax.iter().filter(|e| lines.insert(line(e))).for_each(|e| found.push(located(e)));
        return None;
    }
    let whole = document.clone();
    if let Ok(raw) = deserialize(whole) {
        return Some(Read { raw, unread: BTreeSet::new() });
    }
    let span = document.span();
    let mut kept = DeTable::new();
    let mut unread = BTreeSet::new();
    let mut keep = |key: &Spanned<toml::de::DeString<'_>>, part: Spanned<DeValue<'_>>| {
        // A part is read as a document holding it alone.
        match deserialize(alone(key, part)) {
            Ok(_) => true,
            Err(e) => {
                found.push(located(&e));
                unread.insert(key.get_ref().to_string());
                false
            }
        }
    };
    for (key, value) in document.into_inner() {
        let value_span = value.span();
        let value = match value.into_inner() {
            // Each element of an array is a part of its own.
            DeValue::Array(items) => {
                let mut read = DeArray::new();
                for item in items.iter() {
                    let mut one = DeArray::new();
                    one.push(item.clone());
                    if keep(&key, Spanned::new(value_span.clone(), DeValue::Array(one))) {
                        read.push(item.clone());
                    }
                }
                DeValue::Array(read)
            }
            other => {
                if !keep(&key, Spanned::new(value_span.clone(), other.clone())) {
                    continue;
                }
                other
            }
        };
        kept.insert(key, Spanned::new(value_span, value));
    }
    match deserialize(Spanned::new(span, kept)) {
        Ok(raw) => Some(Read { raw, unread }),
        Err(e) => {
            // Parts that read alone but not together: reported as they are.
            found.push(located(&e));
            None
        }
    }
}

/// A document holding only `key = part`.
fn alone<'i>(key: &Spanned<toml::de::DeString<'i>>, part: Spanned<DeValue<'i>>) -> Spanned<DeTable<'i>> {
    let span = part.span();
    let mut table = DeTable::new();
    table.insert(key.clone(), part);
    Spanned::new(span, table)
}

fn deserialize(document: Spanned<DeTable<'_>>) -> Result<RawConfig, toml::de::Error> {
    RawConfig::deserialize(toml::de::Deserializer::from(document))
}
