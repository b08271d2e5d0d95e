//! Who a limit applies to, as one value made once at the edge.
//!
//! An [`Identity`] is a scope (a rule's name, an application's namespace),
//! the [`Source`] it was derived from (an API key, a client address, a name
//! the application chose) and a fixed-size [`Digest`] of that value. A
//! personal value (an API key, an address) is never kept: [`IdentityHasher`]
//! keeps only its BLAKE3 hash keyed with an instance secret, shown as
//! `<scope>:<k|ip>:<32 hex digits>` and written in Redis keys as
//! `<scope>:<k|ip>:<22 base64url digits>` (the same 128 bits, shorter). An application's own name
//! ([`Identity::named`]) is kept as given, so its key stays short and
//! readable: `<scope>:n:<name>`. Every store, cache and summary keys its
//! state by the identity; a Redis key is written from it once, and nothing
//! parses it back.

use std::fmt;
use std::sync::Arc;

/// What an identity was derived from. One enum for the concept, wherever it
/// is shown (keys, metrics, the offenders page).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Source {
    /// An API key presented by the client.
    ApiKey,
    /// A client address (an IPv6 address grouped by its prefix).
    Ip,
    /// A name the application chose (a user id, a tenant).
    Named,
}

impl Source {
    /// The short tag written in store keys: `k`, `ip` or `n`. Part of the key
    /// layout: changing it orphans every key already written.
    pub fn tag(self) -> &'static str {
        match self {
            Source::ApiKey => "k",
            Source::Ip => "ip",
            Source::Named => "n",
        }
    }

    /// The name shown to people (JSON, metrics): `api_key`, `ip` or `named`.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::ApiKey => "api_key",
            Source::Ip => "ip",
            Source::Named => "named",
        }
    }
}

/// 128 bits of a BLAKE3 hash: collisions are out of reach, and the full
/// 256 bits would only cost memory.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(pub [u8; 16]);

impl Digest {
    /// The digest as one integer (big-endian), for tables keyed by numbers.
    pub fn as_u128(&self) -> u128 {
        u128::from_be_bytes(self.0)
    }

    /// The first 64 bits (big-endian): what a 64-bit table or a short
    /// display needs, still uniformly distributed.
    pub fn high_u64(&self) -> u64 {
        (self.as_u128() >> 64) as u64
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({self})")
    }
}

impl fmt::Display for Digest {
    /// 32 lowercase hex digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.as_u128())
    }
}

/// Who a decision is for: a scope, a source and a digest.
///
/// Cheap to clone (the scope is shared). Two identities are the same only if
/// all three parts are: the same API key under two rules is two identities.
///
/// ```
/// use slidegate::{Identity, IdentityHasher, Source};
///
/// // An application's own ids, written as given.
/// let user = Identity::named("app", "user:42");
/// assert_eq!(user.source(), Source::Named);
/// assert_eq!(user.to_string(), "app:n:user:42");
/// // Personal values: hashed with a secret only this deployment knows.
/// let hasher = IdentityHasher::new(b"instance secret");
/// let client = hasher.identity("search", Source::Ip, &[198, 51, 100, 7]);
/// assert_eq!(client.to_string().len(), "search:ip:".len() + 32);
/// ```
#[derive(Clone)]
pub struct Identity {
    scope: Arc<str>,
    source: Source,
    digest: Digest,
    /// The name an application chose (`Identity::named`): the key text.
    name: Option<Arc<str>>,
    /// The three parts folded into 64 bits once, when the identity is made:
    /// what in-process tables hash, so a lookup hashes one integer, not a
    /// string. Equality still compares every part.
    folded: u64,
}

impl PartialEq for Identity {
    fn eq(&self, other: &Self) -> bool {
        self.folded == other.folded
            && self.digest == other.digest
            && self.source == other.source
            && self.scope == other.scope
    }
}

impl Eq for Identity {}

impl std::hash::Hash for Identity {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.folded);
    }
}

impl Identity {
    /// An identity from its parts: `scope` names where it applies (a rule);
    /// `digest` is already a hash of the value.
    pub fn new(scope: impl Into<Arc<str>>, source: Source, digest: Digest) -> Self {
        use std::hash::BuildHasher;
        let scope = scope.into();
        // A fixed seed: the value only ever keys tables of this process, each
        // of which hashes it again with its own random seed.
        let folded =
            foldhash::fast::FixedState::with_seed(0x5c0b_e1de_4c7a_9e31).hash_one((&*scope, source, digest));
        Self { scope, source, digest, name: None, folded }
    }

    /// The first character of the key text (its `Display`); `None` when
    /// the text is empty (an empty name in the empty scope).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn first_char(&self) -> Option<char> {
        match &self.name {
            Some(name) if self.scope.is_empty() => name.chars().next(),
            _ => self.scope.chars().next().or(Some(':')),
        }
    }

    /// The name an application chose ([`Identity::named`]), `None` for a
    /// hashed value: what a store key writes instead of the digest.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The identity folded into 64 bits (not stable across versions): for
    /// keying in-process tables, which hash it again with their own seed.
    pub fn folded(&self) -> u64 {
        self.folded
    }

    /// The identity of an application's own `name` (a user id, a tenant) in
    /// `scope`: its digest the unkeyed BLAKE3 hash of the name, its key text
    /// the name itself: `<scope>:n:<name>`, or just `<name>` in the empty
    /// scope (the key layout of an application's own keys, the shortest; the
    /// application then keeps its names apart from any other scope's keys
    /// under the same Redis prefix). For values that are personal data use
    /// [`IdentityHasher`], which keeps only a keyed hash nobody without the
    /// secret can recompute.
    pub fn named(scope: impl Into<Arc<str>>, name: &str) -> Self {
        let hash = blake3::hash(name.as_bytes());
        Self { name: Some(name.into()), ..Self::new(scope, Source::Named, truncate(hash.as_bytes())) }
    }

    /// Where the identity applies: the rule, or the application's namespace.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// What the identity was derived from.
    pub fn source(&self) -> Source {
        self.source
    }

    /// The hash of the value.
    pub fn digest(&self) -> Digest {
        self.digest
    }
}

impl fmt::Display for Identity {
    /// The form shown: `<scope>:<tag>:<32 hex digits>`, or for an
    /// application's name `<scope>:n:<name>` (`<name>` alone in the empty
    /// scope). A Redis key writes the same but for the digest, in 22
    /// base64url digits (`store/redis/key.rs`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.name {
            Some(name) if self.scope.is_empty() => f.write_str(name),
            Some(name) => write!(f, "{}:{}:{name}", self.scope, self.source.tag()),
            None => write!(f, "{}:{}:{}", self.scope, self.source.tag(), self.digest),
        }
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Identity({self})")
    }
}

/// Makes identities from personal values with a keyed BLAKE3 hash: the same
/// value and secret always give the same digest; without the secret, a digest
/// cannot be tied back to its value (not even by trying every IPv4 address).
#[derive(Clone)]
pub struct IdentityHasher {
    key: [u8; 32],
}

impl IdentityHasher {
    /// A hasher keyed by `secret` (any length; instances that must agree on
    /// identities, as several `serve` processes sharing a Redis, share it).
    pub fn new(secret: &[u8]) -> Self {
        Self { key: blake3::derive_key("slidegate 2026 identity hash v1", secret) }
    }

    /// The identity of `value` from `source` in `scope`.
    pub fn identity(&self, scope: impl Into<Arc<str>>, source: Source, value: &[u8]) -> Identity {
        Identity::new(scope, source, self.digest(source, value))
    }

    /// The digest of `value` from `source`: the source's tag, a zero byte,
    /// then the value, so an API key never hashes like an address.
    pub fn digest(&self, source: Source, value: &[u8]) -> Digest {
        let tag = source.tag().as_bytes();
        // A short value (an API key, an address) is hashed in one call from
        // a buffer on the stack: the same bytes, so the same digest, without
        // the streaming hasher's state and three updates.
        let mut buffer = [0u8; ONE_SHOT];
        if let Some(input) = buffer.get_mut(..tag.len() + 1 + value.len()) {
            let (head, rest) = input.split_at_mut(tag.len());
            head.copy_from_slice(tag);
            rest[1..].copy_from_slice(value);
            return truncate(blake3::keyed_hash(&self.key, input).as_bytes());
        }
        let mut hasher = blake3::Hasher::new_keyed(&self.key);
        hasher.update(tag);
        hasher.update(&[0]);
        hasher.update(value);
        truncate(hasher.finalize().as_bytes())
    }
}

/// The longest input [`IdentityHasher::digest`] hashes in one call: one
/// BLAKE3 block.
const ONE_SHOT: usize = 64;

impl fmt::Debug for IdentityHasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("IdentityHasher { key: <secret> }")
    }
}

fn truncate(hash: &[u8; 32]) -> Digest {
    let mut digest = [0; 16];
    digest.copy_from_slice(&hash[..16]);
    Digest(digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_long_values_hash_as_one_stream() {
        let hasher = IdentityHasher::new(b"s");
        // Either side of the one-call buffer's length, and at it.
        for len in [0, 1, 60, 61, 62, 63, 64, 200] {
            let value = vec![b'x'; len];
            for source in [Source::ApiKey, Source::Ip, Source::Named] {
                let mut streamed = blake3::Hasher::new_keyed(&hasher.key);
                streamed.update(source.tag().as_bytes());
                streamed.update(&[0]);
                streamed.update(&value);
                assert_eq!(hasher.digest(source, &value), truncate(streamed.finalize().as_bytes()), "{len}");
            }
        }
    }

    #[test]
    fn identities_differ_by_every_part() {
        let hasher = IdentityHasher::new(b"s");
        let a = hasher.identity("r", Source::ApiKey, b"v");
        assert_eq!(a, hasher.identity("r", Source::ApiKey, b"v"));
        assert_ne!(a, hasher.identity("other", Source::ApiKey, b"v"));
        assert_ne!(a.digest(), hasher.identity("r", Source::Ip, b"v").digest());
        assert_ne!(a.digest(), IdentityHasher::new(b"t").identity("r", Source::ApiKey, b"v").digest());
    }

    #[test]
    fn the_key_form_is_scope_tag_and_32_hex_digits() {
        let id = Identity::new("search", Source::Ip, Digest([0xab; 16]));
        assert_eq!(id.to_string(), format!("search:ip:{}", "ab".repeat(16)));
        assert_eq!(id.digest().high_u64(), 0xabab_abab_abab_abab);
    }

    #[test]
    fn named_identities_keep_their_name_as_key_text() {
        let id = Identity::named("app", "user:42");
        assert_eq!(id.to_string(), "app:n:user:42");
        assert_eq!(id, Identity::named("app", "user:42"));
        assert_ne!(id, Identity::named("app", "user:43"));
        // A name cannot pass for a hashed identity: its tag is `n`.
        let hashed = IdentityHasher::new(b"s").identity("app", Source::ApiKey, b"user:42");
        assert!(hashed.to_string().starts_with("app:k:"));
        // In the empty scope, the name as given; still its own identity.
        let bare = Identity::named("", "user:42");
        assert_eq!(bare.to_string(), "user:42");
        assert_ne!(bare, id);
    }
}
