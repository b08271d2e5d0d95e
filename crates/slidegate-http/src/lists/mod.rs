//! Allow and deny lists: clients (networks, API keys) that are never limited
//! or always refused, globally ([`LimiterConfig::lists`](crate::LimiterConfig::lists))
//! or under one rule ([`RuleConfig::lists`](crate::config::RuleConfig::lists)).
//!
//! A request is judged before any store call, on who it is after the
//! trusted-proxy logic ([`IdentityExtractor::client_ip`](crate::IdentityExtractor::client_ip)):
//! a forwarding header from a peer that is not a trusted proxy is never
//! read, so a client cannot list itself by writing one. The order:
//!
//! 1. the global deny list, then the rule's: refused (403);
//! 2. the rule's allow list, then the global one: exempt — no store call,
//!    no rate limit headers, so an exempt client passes while the store is
//!    down.
//!
//! Deny beats allow. A request matching no rule meets the global deny list
//! only (nothing limits it anyway). Lists ignore shadow mode: shadow mode
//! trials limits, whose effect is unknown; a list names its clients.
//!
//! API keys are never kept: a [`KeyList`] holds the first 64 bits of each
//! key's keyed hash, the digest the offenders page and `slidegate identity
//! hash` show when its [`KeyHasher`] is the identity secret's. Networks are
//! looked up by prefix length: one hash probe per distinct length listed,
//! whatever the list's size.

use std::collections::HashSet;
use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, OnceLock};

use ipnet::{IpNet, Ipv4Net};
use slidegate::{IdentityHasher, Source};

/// The keyed hash API keys are listed by: the identity secret's (then a
/// listed hash is the one `slidegate identity hash` prints), or one drawn
/// once per process when there is no secret. Cheap to clone.
#[derive(Clone)]
pub struct KeyHasher(Arc<IdentityHasher>, u64);

impl KeyHasher {
    /// Hashes as the identity extractor keyed by `secret` does.
    pub fn keyed(secret: &[u8]) -> Self {
        let hasher = IdentityHasher::new(secret);
        // What tells two hashers apart without keeping their secret twice.
        let probe = hasher.digest(Source::Named, b"slidegate key list probe").high_u64();
        Self(Arc::new(hasher), probe)
    }

    /// A hasher keyed by a random secret drawn once per process: every list
    /// loaded by this process hashes alike (a reload compares them), no
    /// other process can.
    pub fn per_process() -> Self {
        static HASHER: OnceLock<KeyHasher> = OnceLock::new();
        HASHER
            .get_or_init(|| {
                let mut secret = [0u8; 32];
                if getrandom::fill(&mut secret).is_err() {
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default();
                    secret[..16].copy_from_slice(&now.as_nanos().to_le_bytes());
                }
                Self::keyed(&secret)
            })
            .clone()
    }

    /// The listed form of `key`: its digest's first 64 bits.
    pub fn hash(&self, key: &[u8]) -> u64 {
        self.0.digest(Source::ApiKey, key).high_u64()
    }
}

impl fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyHasher")
    }
}

/// API keys, by the first 64 bits of their keyed hash (never the keys).
#[derive(Clone)]
pub struct KeyList {
    hasher: KeyHasher,
    hashes: HashSet<u64>,
}

impl Default for KeyList {
    fn default() -> Self {
        Self::new(KeyHasher::per_process())
    }
}

impl KeyList {
    /// An empty list hashing with `hasher`.
    pub fn new(hasher: KeyHasher) -> Self {
        Self { hasher, hashes: HashSet::new() }
    }

    /// Lists `key`, hashed now; returns whether it was new.
    pub fn insert_key(&mut self, key: &[u8]) -> bool {
        let hash = self.hasher.hash(key);
        self.hashes.insert(hash)
    }

    /// Lists a key by its hash as [`KeyHasher::hash`] makes it (16 hex
    /// digits on the offenders page); returns whether it was new.
    pub fn insert_hash(&mut self, hash: u64) -> bool {
        self.hashes.insert(hash)
    }

    /// Whether the key hashing to `hash` is listed.
    pub fn contains_hash(&self, hash: u64) -> bool {
        self.hashes.contains(&hash)
    }

    /// Whether `key` is listed.
    pub fn contains_key(&self, key: &[u8]) -> bool {
        !self.hashes.is_empty() && self.contains_hash(self.hasher.hash(key))
    }

    /// How many keys are listed.
    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    /// Whether no key is listed.
    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    /// The hasher keys are listed by.
    pub fn hasher(&self) -> &KeyHasher {
        &self.hasher
    }

    /// An order-independent fold of the hashes: equal lists print alike.
    fn fingerprint(&self) -> u64 {
        self.hashes.iter().fold(0u64, |acc, h| acc.wrapping_add(h.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ h))
    }
}

impl PartialEq for KeyList {
    fn eq(&self, other: &Self) -> bool {
        self.hasher.1 == other.hasher.1 && self.hashes == other.hashes
    }
}

impl fmt::Debug for KeyList {
    /// The count and a fingerprint, never the hashes one by one: a list
    /// may hold many, and a reload compares configurations by their debug
    /// form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyList({} keys, {:016x})", self.hashes.len(), self.fingerprint())
    }
}

/// The clients one list names: networks (IPv4 and IPv6, an IPv4-mapped
/// IPv6 network counting as the IPv4 one) and API keys.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct ClientList {
    /// Client networks; an address is its own /32 or /128.
    pub cidrs: Vec<IpNet>,
    /// API keys, hashed.
    pub keys: KeyList,
}

impl ClientList {
    /// Whether the list names nobody.
    pub fn is_empty(&self) -> bool {
        self.cidrs.is_empty() && self.keys.is_empty()
    }
}

/// An allow list and a deny list, global or one rule's.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct AccessLists {
    /// Clients never limited.
    pub allow: ClientList,
    /// Clients always refused (403); beats `allow`.
    pub deny: ClientList,
}

impl AccessLists {
    /// Whether both lists are empty.
    pub fn is_empty(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }
}

/// Which lists decided: the global ones or the rule's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListScope {
    /// `[lists]`.
    Global,
    /// The matched rule's `allow` / `deny`.
    Rule,
}

/// `net` with an IPv4-mapped IPv6 network (`::ffff:10.0.0.0/104`) written
/// as the IPv4 one (`10.0.0.0/8`): client addresses are judged in their
/// canonical form, so the mapped network would match nobody. Host bits are
/// dropped.
pub fn canonical_net(net: IpNet) -> IpNet {
    if let IpNet::V6(v6) = net {
        if let (Some(v4), true) = (v6.addr().to_ipv4_mapped(), v6.prefix_len() >= 96) {
            if let Ok(mapped) = Ipv4Net::new(v4, v6.prefix_len() - 96) {
                return IpNet::V4(mapped.trunc());
            }
        }
    }
    net.trunc()
}

/// Networks by prefix length: a lookup is one probe per length present.
#[derive(Debug, Default)]
struct NetSet {
    v4: Vec<(u8, HashSet<u32>)>,
    v6: Vec<(u8, HashSet<u128>)>,
}

fn mask4(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

fn mask6(prefix: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0)
}

impl NetSet {
    fn new(nets: &[IpNet]) -> Self {
        let mut set = NetSet::default();
        for net in nets.iter().map(|n| canonical_net(*n)) {
            match net {
                IpNet::V4(n) => {
                    let p = n.prefix_len();
                    let bits = u32::from(n.addr()) & mask4(p);
                    match set.v4.iter_mut().find(|(len, _)| *len == p) {
                        Some((_, s)) => drop(s.insert(bits)),
                        None => set.v4.push((p, HashSet::from([bits]))),
                    }
                }
                IpNet::V6(n) => {
                    let p = n.prefix_len();
                    let bits = u128::from(n.addr()) & mask6(p);
                    match set.v6.iter_mut().find(|(len, _)| *len == p) {
                        Some((_, s)) => drop(s.insert(bits)),
                        None => set.v6.push((p, HashSet::from([bits]))),
                    }
                }
            }
        }
        set
    }

    fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.v6.is_empty()
    }

    fn contains(&self, ip: IpAddr) -> bool {
        match ip.to_canonical() {
            IpAddr::V4(v4) => {
                let bits = u32::from(v4);
                self.v4.iter().any(|(p, s)| s.contains(&(bits & mask4(*p))))
            }
            IpAddr::V6(v6) => {
                let bits = u128::from(v6);
                self.v6.iter().any(|(p, s)| s.contains(&(bits & mask6(*p))))
            }
        }
    }
}

/// One list as the limiter looks it up.
#[derive(Debug, Default)]
struct Compiled {
    nets: NetSet,
    keys: Option<KeyList>,
}

impl Compiled {
    fn new(list: &ClientList) -> Self {
        Self { nets: NetSet::new(&list.cidrs), keys: (!list.keys.is_empty()).then(|| list.keys.clone()) }
    }

    fn names(&self, client: &mut Client<'_>) -> Option<Source> {
        if let Some(ip) = client.ip {
            if self.nets.contains(ip) {
                return Some(Source::Ip);
            }
        }
        match (&self.keys, client.key) {
            (Some(keys), Some(key)) => {
                keys.contains_hash(client.hash(key, keys.hasher())).then_some(Source::ApiKey)
            }
            _ => None,
        }
    }
}

/// Who a request is, for the lists: its client address and API key, the
/// key's hash made once per hasher.
struct Client<'a> {
    ip: Option<IpAddr>,
    key: Option<&'a [u8]>,
    hashed: Option<(KeyHasher, u64)>,
}

impl Client<'_> {
    fn hash(&mut self, key: &[u8], hasher: &KeyHasher) -> u64 {
        match &self.hashed {
            Some((by, hash)) if Arc::ptr_eq(&by.0, &hasher.0) => *hash,
            _ => {
                let hash = hasher.hash(key);
                self.hashed = Some((hasher.clone(), hash));
                hash
            }
        }
    }
}

/// What the lists say of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Listed {
    /// Refused (a deny list) or exempt (an allow list).
    pub(crate) denied: bool,
    pub(crate) scope: ListScope,
    /// What named the client: its address or its API key.
    pub(crate) by: Source,
}

/// The lists of one limiter: the global pair and each rule's, by rule number.
#[derive(Debug, Default)]
pub(crate) struct Lists {
    global: [Compiled; 2],
    /// Per rule: `[allow, deny]`.
    rules: Vec<[Compiled; 2]>,
    /// Whether any list names a network (the client address is needed).
    nets: bool,
    /// Whether any list names a key.
    keys: bool,
}

const ALLOW: usize = 0;
const DENY: usize = 1;

impl Lists {
    /// The lists of `global` and of each rule, in rule order.
    pub(crate) fn new<'a>(global: &AccessLists, rules: impl Iterator<Item = &'a AccessLists>) -> Self {
        let pair = |l: &AccessLists| [Compiled::new(&l.allow), Compiled::new(&l.deny)];
        let global = pair(global);
        let rules: Vec<[Compiled; 2]> = rules.map(pair).collect();
        let all = || global.iter().chain(rules.iter().flatten());
        let nets = all().any(|c| !c.nets.is_empty());
        let keys = all().any(|c| c.keys.is_some());
        Self { global, rules, nets, keys }
    }

    /// Whether a request's client address is needed to judge it.
    pub(crate) fn needs_ip(&self) -> bool {
        self.nets
    }

    /// Whether a request's API key is needed to judge it.
    pub(crate) fn needs_key(&self) -> bool {
        self.keys
    }

    /// Whether no list names anybody: nothing to judge.
    pub(crate) fn is_empty(&self) -> bool {
        !self.nets && !self.keys
    }

    /// What the lists say of a client at `ip` with `key` under rule number
    /// `rule` (`None`: no rule matched, only the global deny list applies).
    pub(crate) fn judge(
        &self,
        rule: Option<usize>,
        ip: Option<IpAddr>,
        key: Option<&[u8]>,
    ) -> Option<Listed> {
        let mut client = Client { ip, key, hashed: None };
        let rule = rule.and_then(|i| self.rules.get(i));
        let listed = |denied, scope, by| Listed { denied, scope, by };
        if let Some(by) = self.global[DENY].names(&mut client) {
            return Some(listed(true, ListScope::Global, by));
        }
        let rule = rule?;
        if let Some(by) = rule[DENY].names(&mut client) {
            return Some(listed(true, ListScope::Rule, by));
        }
        if let Some(by) = rule[ALLOW].names(&mut client) {
            return Some(listed(false, ListScope::Rule, by));
        }
        self.global[ALLOW].names(&mut client).map(|by| listed(false, ListScope::Global, by))
    }
}

#[cfg(test)]
mod tests;
