//! How the scripts lay integers and counts out in a key's string value
//! (Lua's `string.pack` formats), and the stack buffer a write is built in.

use crate::wire::whole;

pub const TWO_32: u64 = 1 << 32;
pub const TWO_48: u64 = 1 << 48;

/// Little-endian unsigned integer of `bytes.len()` bytes (Lua's `I<n>`).
pub fn uint(bytes: &[u8]) -> u64 {
    bytes.iter().rev().fold(0, |acc, &b| (acc << 8) | u64::from(b))
}

pub fn push_uint(out: &mut Value, v: u64, n: usize) {
    out.extend_from_slice(&v.to_le_bytes()[..n]);
}

/// A little-endian double at the start of `bytes` (Lua's `d`).
pub fn double(bytes: &[u8]) -> Option<u64> {
    let mut le = [0u8; 8];
    le.copy_from_slice(bytes.get(..8)?);
    whole(f64::from_le_bytes(le))
}

/// A count in the layout the limit calls for: 4 bytes below 2^32, a double above.
pub fn push_count(out: &mut Value, v: u64, small: bool) {
    if small {
        push_uint(out, v, 4);
    } else {
        out.extend_from_slice(&(v as f64).to_le_bytes());
    }
}

/// A count stored in the layout the limit calls for.
pub fn count_at(bytes: &[u8], small: bool) -> Option<u64> {
    if small {
        Some(uint(bytes.get(..4)?))
    } else {
        double(bytes)
    }
}

/// The full window number a stored `window mod 2^32` stands for, seen from
/// window `now_window`: ahead by less than 2^31 windows, else behind (as
/// `window_skew` in `prelude.lua` reads it). `None` for a window before 0.
pub fn unwrap_window(stored: u64, now_window: u64) -> Option<u64> {
    let ahead = (stored + TWO_32 - now_window % TWO_32) % TWO_32;
    if ahead < TWO_32 / 2 {
        Some(now_window + ahead)
    } else {
        now_window.checked_sub(TWO_32 - ahead)
    }
}

/// A value as a decision writes it, on the stack: the longest layout is
/// the counter's for limits from 2^32, 20 bytes.
pub struct Value {
    bytes: [u8; 24],
    len: usize,
    /// More was pushed than fits: a broken layout, refused at write.
    overflow: bool,
}

impl Value {
    pub fn new() -> Self {
        Self { bytes: [0; 24], len: 0, overflow: false }
    }

    pub fn extend_from_slice(&mut self, more: &[u8]) {
        match self.bytes.get_mut(self.len..self.len + more.len()) {
            Some(room) => {
                room.copy_from_slice(more);
                self.len += more.len();
            }
            None => self.overflow = true,
        }
    }

    pub fn as_slice(&self) -> Option<&[u8]> {
        (!self.overflow).then(|| &self.bytes[..self.len])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_unwrap_ahead_and_behind() {
        assert_eq!(unwrap_window(5, 5), Some(5));
        assert_eq!(unwrap_window(4, 5), Some(4));
        assert_eq!(unwrap_window(6, 5), Some(6));
        assert_eq!(unwrap_window((TWO_32 + 3) % TWO_32, TWO_32 + 3), Some(TWO_32 + 3));
        assert_eq!(unwrap_window(TWO_32 - 1, TWO_32 + 1), Some(TWO_32 - 1));
        assert_eq!(unwrap_window(TWO_32 - 1, 1), None);
    }

    #[test]
    fn integers_use_the_scripts_little_endian_layout() {
        let mut v = Value::new();
        push_uint(&mut v, 0x0102_0304_0506, 6);
        assert_eq!(v.as_slice(), Some(&[6, 5, 4, 3, 2, 1][..]));
        assert_eq!(uint(&v.bytes[..6]), 0x0102_0304_0506);
        // A layout longer than any writes is refused, not truncated.
        v.extend_from_slice(&[0; 19]);
        assert_eq!(v.as_slice(), None);
    }
}
