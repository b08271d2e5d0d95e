//! What the embedded-store benches share: the identities and the order they
//! are visited in.

use std::sync::Arc;

use slidegate::Identity;

/// Identities in the keyed benches.
pub const IDENTITIES: usize = 1_000_000;

/// Writes identity keys `user:<i>` into one reused buffer, as a server
/// would find the key in the request it is handling: in cache, no
/// allocation. (A pre-built `Vec<String>` of a million keys would add two
/// cache misses per decision that have nothing to do with the limiter.)
pub struct KeyWriter {
    buf: [u8; 32],
}

impl KeyWriter {
    pub fn new() -> Self {
        let mut buf = [0; 32];
        buf[..5].copy_from_slice(b"user:");
        Self { buf }
    }

    pub fn key(&mut self, mut i: usize) -> &str {
        let mut digits = [0u8; 20];
        let mut n = 0;
        loop {
            digits[n] = b'0' + (i % 10) as u8;
            n += 1;
            i /= 10;
            if i == 0 {
                break;
            }
        }
        for (slot, digit) in self.buf[5..5 + n].iter_mut().zip(digits[..n].iter().rev()) {
            *slot = *digit;
        }
        std::str::from_utf8(&self.buf[..5 + n]).expect("ASCII digits")
    }
}

/// The `i`-th identity visited: a stride coprime to the count scatters visits
/// over the table instead of walking it in insertion order.
pub fn scattered(i: u64) -> usize {
    (i.wrapping_mul(7_919) % IDENTITIES as u64) as usize
}

/// The identity of the one-identity benches.
pub fn user_42() -> Identity {
    Identity::named("bench", "user:42")
}

/// The identities of `user:<i>` for every `i` below [`IDENTITIES`], made
/// before any timing starts: a server makes each one once, at the edge,
/// before it asks the store. They share one scope, so none allocates.
pub fn identities() -> Vec<Identity> {
    let scope: Arc<str> = Arc::from("bench");
    let mut keys = KeyWriter::new();
    (0..IDENTITIES).map(|i| Identity::named(Arc::clone(&scope), keys.key(i))).collect()
}
