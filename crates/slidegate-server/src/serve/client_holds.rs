//! [`ClientHolds`]: the requests each client has forwarded to the upstream
//! right now, each client held to a share of the upstream pool that shrinks
//! as the pool fills.
//!
//! A fixed share alone lets a few clients together take the whole pool (16
//! clients at a sixteenth each; one IPv6 user with a /60 has 16 /64s), and a
//! body arriving above `min_body_rate` is never cut. So a client holding `h`
//! requests may forward another only while more than [`FREE_PER_HELD`] × `h`
//! of the pool's slots are free (the rule of `slidegate_http::client_share`,
//! which the delay queue follows too), and never more than its share: its
//! first request always goes on (to the wait for a slot), a client alone on
//! an idle pool reaches its share, and however many clients trickle, the
//! free slots stay above four times what the smallest of them holds — the
//! pool is left to the clients holding least. Only as many clients as there
//! are slots, each holding one, can take the pool whole.
//!
//! A client is its address as the limits group it (the client IP after
//! trusted proxies, an IPv6 address by its `ipv6_prefix` network), kept
//! only as a 64-bit keyed hash (std's SipHash under keys drawn from the
//! operating system's randomness when the process starts): no address is
//! stored, and a client cannot aim its hash at another's without the keys.
//! The counts never leave this process, so no other needs the keys, and
//! the limits' BLAKE3 identity hash (stable across instances, sent to the
//! store) would cost more for nothing here: it was 681 instructions of a
//! proxied request's 46 k (BENCHMARKS.md). The
//! API key plays no part: keys are not verified, and a client sending a new
//! one with each request would otherwise have a share per request.
//!
//! Memory is bounded without a sweeper: an entry exists only while its
//! count is above zero, and each count is a request being forwarded, so
//! there are never more entries than open client connections.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use std::hash::{BuildHasher, RandomState};

use slidegate_http::client_share::crowded;
pub(crate) use slidegate_http::client_share::FREE_PER_HELD;
use slidegate_http::IdentityExtractor;

/// Independent locks, so that worker threads forwarding for different
/// clients rarely wait on one another.
const SHARDS: usize = 16;

/// Why a client's request was not let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The client holds its whole share (`max_upstream_connections_per_client`).
    Share { held: usize },
    /// The client holds `held`, and only `free` of the pool's `max` slots are
    /// free: no more than [`FREE_PER_HELD`] × `held`.
    Crowded { held: usize, free: usize, max: usize },
}

/// One client, as [`ClientHolds`] counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ClientKey(u64);

/// The requests each client has forwarded, shared by every worker thread.
#[derive(Debug)]
pub(crate) struct ClientHolds {
    /// Requests one client may have forwarded at once.
    share: usize,
    /// The upstream pool's slots.
    max: usize,
    /// Requests forwarded now, all clients together.
    total: AtomicUsize,
    shards: [Mutex<HashMap<ClientKey, usize>>; SHARDS],
    /// Hashes the addresses under keys drawn when the process starts.
    hasher: RandomState,
}

impl ClientHolds {
    /// Holds each client to `share` requests at once (at least 1), and
    /// fewer as the `max` slots of the pool fill.
    pub(crate) fn new(share: usize, max: usize) -> Self {
        Self {
            share: share.max(1),
            max: max.max(1),
            total: AtomicUsize::new(0),
            shards: std::array::from_fn(|_| Mutex::new(HashMap::new())),
            hasher: RandomState::new(),
        }
    }

    /// The client at `ip` (after the trusted proxies), grouped by the
    /// limits' `identity` (IPv6 prefix).
    pub(crate) fn key(&self, identity: &IdentityExtractor, ip: IpAddr) -> ClientKey {
        ClientKey(self.hasher.hash_one(identity.ip_bytes(ip)))
    }

    /// One more request for `client`, held until the [`ClientHold`] is
    /// dropped; or why not: the client has its share, or holds too much of
    /// a pool this full.
    pub(crate) fn hold(self: &Arc<Self>, client: ClientKey) -> Result<ClientHold, Refusal> {
        let mut shard = self.shard(client);
        let held = shard.entry(client).or_insert(0);
        if *held >= self.share {
            return Err(Refusal::Share { held: *held });
        }
        // Taken before the check, so that requests of clients in other
        // shards, checked at the same time, each see the others'.
        let before = self.total.fetch_add(1, Ordering::AcqRel);
        let free = self.max.saturating_sub(before);
        if crowded(*held, free) {
            self.total.fetch_sub(1, Ordering::AcqRel);
            return Err(Refusal::Crowded { held: *held, free, max: self.max });
        }
        *held += 1;
        let held = *held;
        drop(shard);
        Ok(ClientHold { holds: Arc::clone(self), client, held })
    }

    /// How many requests `client` has forwarded now.
    #[cfg(test)]
    fn held(&self, client: ClientKey) -> usize {
        self.shard(client).get(&client).copied().unwrap_or(0)
    }

    /// The clients with a request forwarded now.
    #[cfg(test)]
    fn clients(&self) -> usize {
        self.shards.iter().map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).len()).sum()
    }

    fn shard(&self, client: ClientKey) -> std::sync::MutexGuard<'_, HashMap<ClientKey, usize>> {
        // The key is a keyed hash: uniform, and a client cannot choose its shard.
        self.shards[(client.0 % SHARDS as u64) as usize].lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A request of one client being forwarded; dropping it ends the hold.
#[derive(Debug)]
pub(crate) struct ClientHold {
    holds: Arc<ClientHolds>,
    client: ClientKey,
    /// The client's requests forwarded when this one was taken, itself included.
    held: usize,
}

impl ClientHold {
    /// The client's requests forwarded when this hold was taken, itself included.
    pub(crate) fn held(&self) -> usize {
        self.held
    }
}

impl Drop for ClientHold {
    fn drop(&mut self) {
        self.holds.total.fetch_sub(1, Ordering::AcqRel);
        let mut shard = self.holds.shard(self.client);
        if let Some(held) = shard.get_mut(&self.client) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                shard.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv6Addr};

    use http::HeaderMap;
    use slidegate_http::IdentityExtractor;

    use super::*;

    fn key(holds: &ClientHolds, extractor: &IdentityExtractor, ip: &str) -> ClientKey {
        holds.key(extractor, ip.parse::<IpAddr>().unwrap())
    }

    #[test]
    fn a_client_holds_at_most_its_share_and_the_entry_goes_at_zero() {
        let holds = Arc::new(ClientHolds::new(2, 100));
        let extractor = IdentityExtractor::new(b"secret");
        let a = key(&holds, &extractor, "192.0.2.1");
        let b = key(&holds, &extractor, "192.0.2.2");
        let first = holds.hold(a).unwrap();
        let second = holds.hold(a).unwrap();
        assert_eq!((first.held(), second.held()), (1, 2));
        assert_eq!(holds.hold(a).unwrap_err(), Refusal::Share { held: 2 });
        // Another client is not affected.
        let other = holds.hold(b).unwrap();
        assert_eq!((holds.held(a), holds.held(b), holds.clients()), (2, 1, 2));
        drop(first);
        let third = holds.hold(a).unwrap();
        drop((second, third, other));
        assert_eq!((holds.held(a), holds.clients()), (0, 0));
    }

    #[test]
    fn the_share_shrinks_as_the_pool_fills_so_many_clients_cannot_take_it_whole() {
        // A pool of 64, a share of 4: alone, a client reaches its share.
        let holds = Arc::new(ClientHolds::new(4, 64));
        let extractor = IdentityExtractor::new(b"secret");
        let alone = key(&holds, &extractor, "192.0.2.1");
        let mine: Vec<ClientHold> = (0..4).map(|_| holds.hold(alone).unwrap()).collect();
        assert_eq!(holds.hold(alone).unwrap_err(), Refusal::Share { held: 4 });
        drop(mine);
        // 17 clients, one more request each per round: one holding h gets
        // another only while more than 4 × h slots are free.
        let clients: Vec<ClientKey> =
            (1..=17).map(|i| key(&holds, &extractor, &format!("198.51.100.{i}"))).collect();
        let mut held = Vec::new();
        let mut refused = Vec::new();
        for _ in 0..4 {
            for &client in &clients {
                match holds.hold(client) {
                    Ok(hold) => held.push(hold),
                    Err(refusal) => refused.push(refusal),
                }
            }
        }
        // 17 + 17 + 17 + 1: 12 of 64 stay free.
        assert_eq!(held.len(), 52);
        assert_eq!(refused.first(), Some(&Refusal::Crowded { held: 3, free: 12, max: 64 }));
        assert_eq!(refused.len(), 16);
        // A newcomer, holding less, still gets as far as the others.
        let newcomer = key(&holds, &extractor, "203.0.113.1");
        let mine: Vec<ClientHold> = (0..3).map(|_| holds.hold(newcomer).unwrap()).collect();
        assert_eq!(holds.hold(newcomer).unwrap_err(), Refusal::Crowded { held: 3, free: 9, max: 64 });
        // As the others finish, room comes back.
        held.truncate(40);
        assert_eq!(holds.hold(newcomer).unwrap().held(), 4);
        drop((mine, held));
        assert_eq!((holds.total.load(Ordering::SeqCst), holds.clients()), (0, 0));
    }

    #[test]
    fn clients_are_grouped_as_the_limits_group_them() {
        let holds = ClientHolds::new(1, 1);
        let extractor = IdentityExtractor::new(b"secret")
            .trusted_proxies(vec!["10.0.0.0/8".parse().unwrap()])
            .ipv6_prefix(64);
        // One /64 is one client.
        assert_eq!(key(&holds, &extractor, "2001:db8::1"), key(&holds, &extractor, "2001:db8::ffff:2"));
        assert_ne!(key(&holds, &extractor, "2001:db8::1"), key(&holds, &extractor, "2001:db8:0:1::1"));
        // An IPv4-mapped address is the IPv4 client.
        let mapped = IpAddr::V6(Ipv6Addr::from([0, 0, 0, 0, 0, 0xffff, 0xc000, 0x0201]));
        let seen =
            |peer: IpAddr, headers: &HeaderMap| holds.key(&extractor, extractor.client_ip(peer, headers));
        assert_eq!(seen(mapped, &HeaderMap::new()), key(&holds, &extractor, "192.0.2.1"));
        // The client the admission works out: behind a trusted proxy, the
        // forwarded address.
        let mut headers = HeaderMap::new();
        headers.insert("x-forwarded-for", "198.51.100.9".parse().unwrap());
        let proxied = seen("10.1.2.3".parse().unwrap(), &headers);
        assert_eq!(proxied, key(&holds, &extractor, "198.51.100.9"));
        // From an untrusted peer the header is ignored.
        let direct = seen("192.0.2.7".parse().unwrap(), &headers);
        assert_eq!(direct, key(&holds, &extractor, "192.0.2.7"));
        // The key is a keyed hash under the process's secret: another
        // process, another key; the limits' secret plays no part.
        let other = IdentityExtractor::new(b"other secret").ipv6_prefix(64);
        assert_eq!(key(&holds, &extractor, "192.0.2.1"), key(&holds, &other, "192.0.2.1"));
        let elsewhere = ClientHolds::new(1, 1);
        assert_ne!(key(&holds, &extractor, "192.0.2.1"), key(&elsewhere, &extractor, "192.0.2.1"));
    }
}
