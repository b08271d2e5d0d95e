//! The Redis key of one identity's state under one limit.
//!
//! `<prefix>{<identity>}:<tag>:<limit>:<window_ms>`, e.g.
//! `slidegate:{user-42}:swc:100:60000`. The `{identity}` hash tag puts every
//! key of one identity in one Redis Cluster slot, so `decide_all` may touch
//! several of them in one script. Redis takes the tag from the first `{` to
//! the first `}` after it; all keys of an identity share everything up to the
//! end of the identity, so an identity containing `}` still yields one tag for
//! all its keys. Only an identity *starting* with `}` would give an empty tag
//! (which Redis ignores, hashing the whole key): identities starting with `{`
//! or `}` are written with one extra `{` in front, which keeps the tag
//! non-empty and the mapping from identities to keys one-to-one.

use std::fmt;

use redis::{RedisWrite, ToRedisArgs, ToSingleRedisArg};

use crate::{Identity, Limit};

/// A state key, written straight into the command buffer (no `String` per call).
#[derive(Debug, Clone, Copy)]
pub(super) struct StateKey<'a> {
    pub(super) prefix: &'a str,
    pub(super) identity: &'a Identity,
    pub(super) limit: &'a Limit,
}

impl fmt::Display for StateKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}{{{}{}}}:{}:{}:{}",
            self.prefix,
            escape(self.identity),
            self.identity,
            self.limit.algorithm.tag(),
            self.limit.quota.permits(),
            self.limit.quota.window_ms()
        )
    }
}

/// The key of an identity's penalty state: `<prefix>{<identity>}:penalty`,
/// in the same slot as its limits' state keys.
#[derive(Debug, Clone, Copy)]
pub(super) struct PenaltyKey<'a> {
    pub(super) prefix: &'a str,
    pub(super) identity: &'a Identity,
}

impl fmt::Display for PenaltyKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{{{}{}}}:penalty", self.prefix, escape(self.identity), self.identity)
    }
}

/// What goes before an identity inside its hash tag: one more `{` when its
/// scope starts with `{` or `}`, so that the tag is never empty.
pub(super) fn escape(identity: &Identity) -> &'static str {
    if identity.scope().starts_with(['{', '}']) {
        "{"
    } else {
        ""
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
    use crate::{Algorithm, Quota};

    fn key(identity: &str, limit: &Limit) -> String {
        StateKey { prefix: "slidegate:", identity, limit }.to_string()
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
        let tags = Algorithm::ALL.map(Algorithm::tag);
        assert_eq!(tags, ["swc", "fw", "log", "tb", "gcra"]);
    }

    #[test]
    fn layout_names_prefix_identity_algorithm_and_quota() {
        let limit = Limit::new(Algorithm::SlidingWindowCounter, Quota::per_minute(100).expect("valid"));
        assert_eq!(key("user-42", &limit), "slidegate:{user-42}:swc:100:60000");
        let gcra = Limit::new(Algorithm::Gcra, Quota::per_second(7).expect("valid"));
        assert_eq!(key("1.2.3.4", &gcra), "slidegate:{1.2.3.4}:gcra:7:1000");
    }

    #[test]
    fn every_identity_has_one_non_empty_tag_for_all_its_keys() {
        let identities = ["user-42", "a}b", "}x", "{", "}", "{a}", "}}", "x{y}z", "{}", "é{}"];
        for identity in identities {
            let tags: HashSet<String> =
                limits().iter().map(|l| hash_tag(&key(identity, l)).to_owned()).collect();
            assert_eq!(tags.len(), 1, "{identity:?} spreads over tags {tags:?}");
            let tag = tags.into_iter().next().expect("one tag");
            assert!(!tag.is_empty() && !tag.contains(':'), "{identity:?} got tag {tag:?}");
        }
    }

    #[test]
    fn distinct_identities_and_limits_get_distinct_keys() {
        let identities = ["a", "{a", "}a", "{{a", "{}a", "a}", "a}:swc:100:60000", ""];
        let mut seen = HashSet::new();
        for identity in identities {
            for l in limits() {
                assert!(seen.insert(key(identity, &l)), "duplicate key for {identity:?} {l}");
            }
        }
    }
}
