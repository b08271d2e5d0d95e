//! The Redis key of one identity's state under one limit.
//!
//! `<prefix>{<identity>}:<tag>:<limit>:<window_ms>`, the identity written as
//! `<scope>:<source tag>:<22 base64url digits>` (an application's name as
//! `<scope>:n:<name>`, or the bare name in the empty scope), e.g.
//! `slidegate:{api:k:XwzL…}:swc:100:60000`. The digits are the digest's 128
//! bits in the URL-safe base64 alphabet without padding (`A–Z a–z 0–9 - _`:
//! no `{`, `}` or glob character), 10 characters shorter than the 32 hex
//! digits an identity is shown with (offenders, penalty ids), which moves a
//! typical key into a jemalloc size class 16 bytes smaller (BENCHMARKS.md,
//! "Bytes per identity in Redis"). Keys written before in hex are not read:
//! they expire by themselves (README, "Keys": what an upgrade sees).
//!
//! The `{identity}` hash tag puts
//! every key of one identity in one Redis Cluster slot, so one script may
//! decide several of its limits. Redis takes the tag from the first `{` to
//! the first `}` after it; all keys of an identity share everything up to the
//! end of the identity, so a text containing `}` still yields one tag for
//! all its keys. Only a text *starting* with `}`, or an empty one (an empty
//! bare name), would give an empty tag (which Redis ignores, hashing the
//! whole key): such texts, and those starting with `{`, are written with one
//! extra `{` in front, which keeps the tag non-empty and the mapping from
//! identities to keys one-to-one.

use std::fmt;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use redis::{RedisWrite, ToRedisArgs, ToSingleRedisArg};

use super::layout::{packable, BucketTag};
use super::scripts;
use crate::{Identity, Limit};

/// Where an identity's keys live: the prefix, the hash tag and (in the
/// packed layout) the field of its packed state. Made once per request.
#[derive(Debug, Clone, Copy)]
pub(super) struct IdentityKeys<'a> {
    pub(super) prefix: &'a str,
    pub(super) identity: &'a Identity,
    /// The packed layout's bucket tag and field; `None` in the per-key
    /// layout, whose hash tag is the identity itself.
    pub(super) packed: Option<(BucketTag, [u8; 8])>,
}

impl<'a> IdentityKeys<'a> {
    /// The key of the identity's state under `limit`.
    pub(super) fn state(&self, limit: &'a Limit) -> StateKey<'a> {
        StateKey { keys: *self, limit }
    }

    /// The key of the identity's penalty box, in the slot of its state keys.
    pub(super) fn penalty(&self) -> PenaltyKey<'a> {
        PenaltyKey { keys: *self }
    }

    /// The field of the identity's packed state (empty in the per-key layout).
    pub(super) fn field(&self) -> &[u8] {
        match &self.packed {
            Some((_, field)) => field,
            None => &[],
        }
    }

    /// `<prefix>{<tag>}`, then the identity's text where the tag is its
    /// bucket's and `with_text`.
    fn write_head(&self, f: &mut fmt::Formatter<'_>, with_text: bool) -> fmt::Result {
        match &self.packed {
            None => write!(f, "{}{{{}{}}}", self.prefix, escape(self.identity), KeyText(self.identity)),
            Some((tag, _)) if with_text => write!(f, "{}{{{tag}}}{}", self.prefix, KeyText(self.identity)),
            Some((tag, _)) => write!(f, "{}{{{tag}}}", self.prefix),
        }
    }
}

/// A state key, written straight into the command buffer (no `String` per call).
///
/// Per key: `<prefix>{<identity>}:<alg>:<limit>:<window_ms>`. Packed, for
/// the algorithms the layout packs: the stem of the bucket's window hashes,
/// `<prefix>{<bucket tag>}:<alg>:<limit>:<window_ms>:`, to which the
/// scripts add the window's number; for the others
/// `<prefix>{<bucket tag>}<identity>:<alg>:<limit>:<window_ms>`.
#[derive(Debug, Clone, Copy)]
pub(super) struct StateKey<'a> {
    keys: IdentityKeys<'a>,
    limit: &'a Limit,
}

impl StateKey<'_> {
    /// Whether this key is the stem of packed window hashes.
    pub(super) fn is_packed(&self) -> bool {
        self.keys.packed.is_some() && packable(self.limit.algorithm)
    }
}

impl fmt::Display for StateKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let packed = self.is_packed();
        self.keys.write_head(f, !packed)?;
        let (alg, limit, w) =
            (scripts::tag(self.limit.algorithm), self.limit.quota.permits(), self.limit.quota.window_ms());
        if packed {
            write!(f, ":{alg}:{limit}:{w}:")
        } else {
            write!(f, ":{alg}:{limit}:{w}")
        }
    }
}

/// The key of an identity's penalty state: `<prefix>{<identity>}:penalty`
/// (packed: `<prefix>{<bucket tag>}<identity>:penalty`), in the same slot as
/// its limits' state keys.
#[derive(Debug, Clone, Copy)]
pub(super) struct PenaltyKey<'a> {
    keys: IdentityKeys<'a>,
}

impl fmt::Display for PenaltyKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.keys.write_head(f, true)?;
        f.write_str(":penalty")
    }
}

/// The head of an identity's other keys (crawl breadth): `<prefix>{<identity>}`
/// or `<prefix>{<bucket tag>}<identity>`.
#[derive(Debug, Clone, Copy)]
pub(super) struct KeyHead<'a>(pub(super) IdentityKeys<'a>);

impl fmt::Display for KeyHead<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.write_head(f, true)
    }
}

/// Bytes of a 128-bit digest in unpadded base64: ⌈128 / 6⌉.
const DIGEST_DIGITS: usize = 22;

/// An identity as its keys write it inside the hash tag: an application's
/// name as given (`<scope>:n:<name>`, or the bare name in the empty
/// scope), a hashed value as `<scope>:<source tag>:<22 base64url digits>`.
/// The first character is the one `Identity`'s `Display` starts with,
/// which [`escape`] reads.
#[derive(Debug, Clone, Copy)]
pub(super) struct KeyText<'a>(pub(super) &'a Identity);

impl fmt::Display for KeyText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let identity = self.0;
        let tag = identity.source().tag();
        match identity.name() {
            Some(name) if identity.scope().is_empty() => f.write_str(name),
            Some(name) => write!(f, "{}:{tag}:{name}", identity.scope()),
            None => {
                let mut digits = [0u8; DIGEST_DIGITS];
                let n =
                    URL_SAFE_NO_PAD.encode_slice(identity.digest().0, &mut digits).map_err(|_| fmt::Error)?;
                let digits = std::str::from_utf8(&digits[..n]).map_err(|_| fmt::Error)?;
                write!(f, "{}:{tag}:{digits}", identity.scope())
            }
        }
    }
}

/// What goes before an identity inside its hash tag: one more `{` when its
/// key text starts with `{` or `}`, or is empty, so that the tag is never
/// empty.
pub(super) fn escape(identity: &Identity) -> &'static str {
    match identity.first_char() {
        None | Some('{' | '}') => "{",
        Some(_) => "",
    }
}

impl ToRedisArgs for StateKey<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + RedisWrite,
    {
        out.write_arg_fmt(self);
    }
}

impl ToSingleRedisArg for StateKey<'_> {}

/// The hash tag Redis Cluster derives from `key`, as its `keyHashSlot` does.
#[cfg(test)]
fn hash_tag(key: &str) -> &str {
    match key.find('{') {
        Some(open) => match key[open + 1..].find('}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::time::Duration;

    use super::*;
    use crate::{Algorithm, Digest, Quota, Source};

    fn key(identity: &Identity, limit: &Limit) -> String {
        IdentityKeys { prefix: "slidegate:", identity, packed: None }.state(limit).to_string()
    }

    /// An identity in `scope`: the scope is the only free-form part of a key.
    fn in_scope(scope: &str) -> Identity {
        Identity::new(scope, Source::Named, Digest([0x42; 16]))
    }

    fn limits() -> Vec<Limit> {
        Algorithm::ALL
            .into_iter()
            .flat_map(|a| {
                [
                    Limit::new(a, Quota::per_minute(100).expect("valid")),
                    Limit::new(a, Quota::new(5, Duration::from_millis(1500)).expect("valid")),
                ]
            })
            .collect()
    }

    #[test]
    fn tags_are_the_ones_existing_keys_carry() {
        let tags = Algorithm::ALL.map(scripts::tag);
        assert_eq!(tags, ["swc", "fw", "log", "tb", "gcra"]);
    }

    #[test]
    fn layout_names_prefix_identity_algorithm_and_quota() {
        let limit = Limit::new(Algorithm::SlidingWindowCounter, Quota::per_minute(100).expect("valid"));
        let user = Identity::new("api", Source::ApiKey, Digest([0xab; 16]));
        // 0xab × 16 in unpadded base64url: `q6ur` per three bytes, the last byte `qw`.
        let digits = format!("{}qw", "q6ur".repeat(5));
        assert_eq!(key(&user, &limit), format!("slidegate:{{api:k:{digits}}}:swc:100:60000"));
        let gcra = Limit::new(Algorithm::Gcra, Quota::per_second(7).expect("valid"));
        let client = Identity::new("search", Source::Ip, Digest([0x01; 16]));
        assert_eq!(key(&client, &gcra), "slidegate:{search:ip:AQEBAQEBAQEBAQEBAQEBAQ}:gcra:7:1000");
        let penalty =
            IdentityKeys { prefix: "slidegate:", identity: &user, packed: None }.penalty().to_string();
        assert_eq!(penalty, format!("slidegate:{{api:k:{digits}}}:penalty"));
        // An application's names are written as given.
        let named = Identity::named("app", "user:42");
        assert_eq!(key(&named, &limit), "slidegate:{app:n:user:42}:swc:100:60000");
        assert_eq!(key(&Identity::named("", "user-42"), &limit), "slidegate:{user-42}:swc:100:60000");
    }

    #[test]
    fn the_digest_is_22_url_safe_digits_of_all_its_bits() {
        let limit = Limit::new(Algorithm::SlidingWindowCounter, Quota::per_minute(100).expect("valid"));
        let mut seen = HashSet::new();
        for byte in 0..=255u8 {
            // Multiplying by an odd number is one-to-one: 256 distinct digests.
            let digest = u128::from(byte).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835);
            let identity = Identity::new("api", Source::ApiKey, Digest(digest.to_be_bytes()));
            let text = KeyText(&identity).to_string();
            let digits = text.strip_prefix("api:k:").expect("scope and tag first");
            assert_eq!(digits.len(), DIGEST_DIGITS, "{text}");
            assert!(digits.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'), "{text}");
            assert!(seen.insert(text), "two digests, one key text");
        }
        // The production default prefix and a short rule name: 54 bytes, a
        // 64-byte sds allocation (3 header bytes and a NUL) instead of 80.
        let identity = Identity::new("api", Source::ApiKey, Digest([0xff; 16]));
        assert_eq!(key(&identity, &limit).len(), 54);
    }

    /// Every free-form text a key can start with: a scope, or an
    /// application's bare name in the empty scope.
    fn identities(texts: &[&str]) -> Vec<Identity> {
        texts.iter().flat_map(|t| [in_scope(t), Identity::named("", t), Identity::named(*t, "n")]).collect()
    }

    #[test]
    fn every_identity_has_one_non_empty_tag_for_all_its_keys() {
        let texts = ["user-42", "a}b", "}x", "{", "}", "{a}", "}}", "x{y}z", "{}", "é{}", "a", ""];
        for identity in identities(&texts) {
            let scope = identity.to_string();
            let tags: HashSet<String> =
                limits().iter().map(|l| hash_tag(&key(&identity, l)).to_owned()).collect();
            assert_eq!(tags.len(), 1, "{scope:?} spreads over tags {tags:?}");
            let tag = tags.into_iter().next().expect("one tag");
            // The tag never reaches past the identity into the limit's part.
            let written = format!("{}{}", escape(&identity), KeyText(&identity));
            assert!(!tag.is_empty() && written.starts_with(&tag), "{scope:?} got tag {tag:?}");
        }
    }

    #[test]
    fn distinct_identities_and_limits_get_distinct_keys() {
        let scopes = ["a", "{a", "}a", "{{a", "{}a", "a}", "a}:swc:100:60000", "{", "b", ""];
        let others = scopes.into_iter().flat_map(|scope| {
            [
                Identity::new(scope, Source::Ip, Digest([0x42; 16])),
                Identity::new(scope, Source::Named, Digest([0x43; 16])),
            ]
        });
        let mut seen = HashSet::new();
        for identity in identities(&scopes).into_iter().chain(others) {
            for l in limits() {
                assert!(seen.insert(key(&identity, &l)), "duplicate key for {identity:?} {l}");
            }
        }
    }
}
