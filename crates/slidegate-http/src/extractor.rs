//! Who a request is: an API key or a client IP, only ever stored as a keyed hash.
//!
//! The client IP is the socket peer unless the peer is a trusted proxy; then
//! the forwarding chain of the one configured header (`X-Forwarded-For` by
//! default, or `Forwarded`) is read from the right, and the first address that
//! is not a trusted proxy is the client. Everything left of it was written by
//! the client and is ignored, so a spoofed header changes nothing. The other
//! header is never read: a proxy that appends `X-Forwarded-For` passes a
//! client's `Forwarded` through untouched, and reading it would let the client
//! pick its own identity.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use http::{HeaderMap, HeaderName};
use ipnet::IpNet;
use slidegate::{Identity, IdentityHasher, Source};

/// The one forwarding header trusted proxies write the client address into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1` (nginx, HAProxy, cloud load balancers).
    #[default]
    XForwardedFor,
    /// `Forwarded: for=client, for=proxy1` (RFC 7239).
    Forwarded,
}

/// A forwarding header slidegate does not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid forwarded_header {0:?}: expected \"x-forwarded-for\" or \"forwarded\" \
     (the header your trusted proxies append the client address to)"
)]
pub struct UnknownForwardedHeader(pub String);

/// A request naming its API key ambiguously: the key header on more than
/// one line, or a value with a comma
/// ([`IdentityExtractor::sole_api_key`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{}", AmbiguousKey::DETAIL)]
pub struct AmbiguousKey;

impl AmbiguousKey {
    /// What the client is told, as the detail of the 400.
    pub const DETAIL: &'static str = "the API key header must appear once, with one value (no comma): \
                                      which of several keys the upstream uses is its choice, not slidegate's";
}

impl std::str::FromStr for ForwardedHeader {
    type Err = UnknownForwardedHeader;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "x-forwarded-for" => Ok(ForwardedHeader::XForwardedFor),
            "forwarded" => Ok(ForwardedHeader::Forwarded),
            _ => Err(UnknownForwardedHeader(s.to_owned())),
        }
    }
}

/// Turns requests into store keys.
#[derive(Clone)]
pub struct IdentityExtractor {
    api_key_header: Option<HeaderName>,
    trusted_proxies: Vec<IpNet>,
    forwarded_header: ForwardedHeader,
    ipv6_prefix: u8,
    hasher: IdentityHasher,
}

impl std::fmt::Debug for IdentityExtractor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentityExtractor")
            .field("api_key_header", &self.api_key_header)
            .field("trusted_proxies", &self.trusted_proxies)
            .field("forwarded_header", &self.forwarded_header)
            .field("ipv6_prefix", &self.ipv6_prefix)
            .finish_non_exhaustive()
    }
}

impl IdentityExtractor {
    /// An extractor whose hashes are keyed by `secret` (every instance sharing
    /// a store must use the same secret).
    pub fn new(secret: &[u8]) -> Self {
        Self {
            api_key_header: None,
            trusted_proxies: Vec::new(),
            forwarded_header: ForwardedHeader::XForwardedFor,
            // One host or home is given a /64; counting per address would
            // hand each client 2^64 quotas.
            ipv6_prefix: 64,
            hasher: IdentityHasher::new(secret),
        }
    }

    /// An extractor keyed by a random secret drawn now: fine for one process
    /// on the embedded store, wrong for several instances sharing Redis.
    pub fn with_random_secret() -> Self {
        Self::new(&random_secret())
    }

    /// An extractor keyed as this one, every other setting at its default:
    /// what a reloaded configuration without a secret builds on, so that its
    /// identities, and the counters kept under them, stay the same.
    pub(crate) fn keyed_alike(&self) -> Self {
        Self { hasher: self.hasher.clone(), ..Self::new(&[]) }
    }

    /// Reads API keys from `header`.
    pub fn api_key_header(mut self, header: HeaderName) -> Self {
        self.api_key_header = Some(header);
        self
    }

    /// Believes forwarding headers from peers in `proxies`.
    pub fn trusted_proxies(mut self, proxies: Vec<IpNet>) -> Self {
        self.trusted_proxies = proxies;
        self
    }

    /// Reads the client address from `header` only (default `X-Forwarded-For`).
    pub fn forwarded_header(mut self, header: ForwardedHeader) -> Self {
        self.forwarded_header = header;
        self
    }

    /// Counts IPv6 clients per `/prefix` network (default 64: one identity
    /// per /64; 128: one per address).
    pub fn ipv6_prefix(mut self, prefix: u8) -> Self {
        self.ipv6_prefix = prefix.clamp(1, 128);
        self
    }

    /// The API key the request carries, if any (empty values count as none).
    pub fn api_key<'h>(&self, headers: &'h HeaderMap) -> Option<&'h [u8]> {
        let value = headers.get(self.api_key_header.as_ref()?)?.as_bytes();
        (!value.is_empty()).then_some(value)
    }

    /// The API key the request carries, as [`api_key`](Self::api_key)
    /// reads it, or [`AmbiguousKey`] when the request names it ambiguously:
    /// the header on more than one line, or a value with a comma. Upstreams
    /// disagree on which of several keys counts (the first, the last, or
    /// all joined with `, `), so a client could be counted under one key
    /// and served under another; [`RateLimiter::admit`](crate::RateLimiter::admit)
    /// refuses such a request with 400. One lookup of the header.
    ///
    /// # Errors
    /// [`AmbiguousKey`], as above.
    pub fn sole_api_key<'h>(&self, headers: &'h HeaderMap) -> Result<Option<&'h [u8]>, AmbiguousKey> {
        let Some(name) = self.api_key_header.as_ref() else { return Ok(None) };
        let mut values = headers.get_all(name).iter();
        match (values.next(), values.next()) {
            (None, _) => Ok(None),
            (Some(value), None) if !value.as_bytes().contains(&b',') => {
                Ok(Some(value.as_bytes()).filter(|v| !v.is_empty()))
            }
            _ => Err(AmbiguousKey),
        }
    }

    /// Whether the request names its API key ambiguously: see
    /// [`sole_api_key`](Self::sole_api_key).
    pub fn api_key_is_ambiguous(&self, headers: &HeaderMap) -> bool {
        self.sole_api_key(headers).is_err()
    }

    /// Removes every other spelling of the headers that say who the client
    /// is — the API key header and `X-Forwarded-For` — with `_` for some
    /// `-` (`x_api_key`, `x-api_key`). WSGI and CGI upstreams read
    /// `x_api_key` as `HTTP_X_API_KEY`, the key header; others drop it
    /// (nginx, gunicorn) or keep it apart. Counting it under the key would
    /// charge a random key for what most upstreams serve anonymously; not
    /// counting it let a key holder with many addresses be served under its
    /// key while counted per address. Removed, as nginx drops headers with
    /// underscores, every upstream receives the identity slidegate counted.
    /// [`RateLimiter::admit`](crate::RateLimiter::admit) calls it before
    /// deciding, for `serve` and the tower layer alike.
    pub fn strip_header_aliases(&self, headers: &mut HeaderMap) {
        // The common request has none: one pass over the names, most of
        // them ruled out by their length alone.
        if !headers.keys().any(|name| self.is_alias(name)) {
            return;
        }
        let aliases: Vec<HeaderName> = headers.keys().filter(|name| self.is_alias(name)).cloned().collect();
        for name in aliases {
            headers.remove(&name);
        }
    }

    /// Whether `name`, with an `_` where an identity header has `-`, is
    /// another spelling of that header.
    fn is_alias(&self, name: &HeaderName) -> bool {
        let name = name.as_str();
        let spells = |header: &str| {
            name.len() == header.len()
                && name != header
                && name.bytes().zip(header.bytes()).all(|(n, h)| n == h || (n == b'_' && h == b'-'))
        };
        spells("x-forwarded-for") || self.api_key_header.as_ref().is_some_and(|h| spells(h.as_str()))
    }

    /// A 16-byte keyed digest of `value`, for values too long to send to a
    /// store as they are (a crawl-breadth value): the same for the same
    /// value and secret, and without the secret a client cannot make two
    /// values collide.
    pub(crate) fn value_digest(&self, value: &[u8]) -> [u8; 16] {
        self.hasher.digest(Source::Named, value).0
    }

    /// Whether `ip` is one of the trusted proxies, whose forwarding header
    /// is believed.
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.trusted_proxies.iter().any(|net| net.contains(&ip))
    }

    /// The client's address: `peer` itself, or — when `peer` is a trusted
    /// proxy — the right-most address in the forwarding chain that is not.
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let peer = peer.to_canonical();
        if !self.is_trusted(peer) {
            return peer;
        }
        let chain = forwarding_chain(self.forwarded_header, headers);
        let mut client = peer;
        for hop in chain.iter().rev() {
            match hop {
                // An entry we cannot read: nothing left of it can be trusted,
                // so the last trusted hop stands for the client.
                None => return client,
                Some(ip) => {
                    client = *ip;
                    if !self.is_trusted(*ip) {
                        return client;
                    }
                }
            }
        }
        client
    }

    /// The identity of `value` from `source` under `scope` (a rule's name):
    /// its keyed hash, made once here and never parsed back. Written into
    /// Redis keys as `{scope}:k:{22 base64url digits}` for an API key,
    /// `{scope}:ip:{…}` for a client IP (IPv6 grouped by the prefix); shown
    /// to people (logs, the offenders page) as 32 hex digits.
    pub fn identity(&self, scope: &Arc<str>, source: Source, value: &[u8]) -> Identity {
        self.hasher.identity(Arc::clone(scope), source, value)
    }

    /// The digest of the API key `key`, the same under every rule: what an
    /// API key's identity holds ([`Identity::new`] with [`Source::ApiKey`]),
    /// and what plans map keys by.
    pub fn key_digest(&self, key: &[u8]) -> slidegate::Digest {
        self.hasher.digest(Source::ApiKey, key)
    }

    /// The 16 bytes an IP address is hashed from: IPv6 after grouping,
    /// IPv4 as its IPv4-mapped IPv6 form.
    pub fn ip_bytes(&self, ip: IpAddr) -> [u8; 16] {
        match ip.to_canonical() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            IpAddr::V6(v6) => {
                let bits = u128::from(v6);
                let mask = if self.ipv6_prefix >= 128 { u128::MAX } else { !(u128::MAX >> self.ipv6_prefix) };
                Ipv6Addr::from(bits & mask).octets()
            }
        }
    }
}

/// 32 bytes of the operating system's randomness: a secret for hashes that
/// live in this process only.
pub(crate) fn random_secret() -> [u8; 32] {
    let mut secret = [0u8; 32];
    if getrandom::fill(&mut secret).is_err() {
        // No OS randomness is a broken machine; the time still separates runs.
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        secret[..16].copy_from_slice(&now.as_nanos().to_le_bytes());
    }
    secret
}

/// The hops of `header` — `X-Forwarded-For`, or `Forwarded` (RFC 7239
/// `for=`) — left to right; `None` for an entry that is no address
/// (`unknown`, an obfuscated `_name`, garbage).
fn forwarding_chain(header: ForwardedHeader, headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    if header == ForwardedHeader::Forwarded {
        let mut hops = Vec::new();
        for value in headers.get_all(http::header::FORWARDED).iter().map(|v| v.as_bytes()) {
            let Ok(text) = std::str::from_utf8(value) else {
                hops.push(None);
                continue;
            };
            for element in split_unquoted(text, ',') {
                let for_value = split_unquoted(element, ';').into_iter().find_map(|pair| {
                    let (name, value) = pair.split_once('=')?;
                    name.trim().eq_ignore_ascii_case("for").then(|| value.trim())
                });
                // An element without `for=` still marks a hop we cannot place.
                hops.push(for_value.and_then(parse_forwarded_node));
            }
        }
        return hops;
    }
    let mut hops = Vec::new();
    for value in headers.get_all("x-forwarded-for") {
        match value.to_str() {
            Ok(text) => hops.extend(text.split(',').map(|s| parse_node(s.trim()))),
            Err(_) => hops.push(None),
        }
    }
    hops
}

/// Splits on `sep` outside double quotes.
fn split_unquoted(text: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c if c == sep && !quoted => {
                parts.push(&text[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

/// An RFC 7239 node: `192.0.2.43`, `"192.0.2.43:47011"`, `"[2001:db8::17]:4711"`.
fn parse_forwarded_node(value: &str) -> Option<IpAddr> {
    let unquoted = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(value);
    parse_node(unquoted)
}

/// An address with or without a port, IPv6 bare or in brackets.
fn parse_node(text: &str) -> Option<IpAddr> {
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    if let Ok(sock) = text.parse::<SocketAddr>() {
        return Some(sock.ip().to_canonical());
    }
    let inner = text.strip_prefix('[')?;
    let end = inner.find(']')?;
    inner[..end].parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn extractor() -> IdentityExtractor {
        IdentityExtractor::new(b"secret")
            .trusted_proxies(vec!["10.0.0.0/8".parse().unwrap(), "127.0.0.1/32".parse().unwrap()])
    }

    #[test]
    fn untrusted_peers_forwarding_headers_are_ignored() {
        let e = extractor();
        let spoof = headers(&[("x-forwarded-for", "1.2.3.4"), ("forwarded", "for=5.6.7.8")]);
        assert_eq!(e.client_ip(ip("203.0.113.9"), &spoof), ip("203.0.113.9"));
    }

    #[test]
    fn trusted_proxies_yield_the_right_most_untrusted_hop() {
        let e = extractor();
        // The client wrote "6.6.6.6"; the edge proxy appended the real peer.
        let h = headers(&[("x-forwarded-for", "6.6.6.6, 198.51.100.7, 10.1.2.3")]);
        assert_eq!(e.client_ip(ip("127.0.0.1"), &h), ip("198.51.100.7"));
        // Several header lines form one list.
        let h = headers(&[("x-forwarded-for", "6.6.6.6"), ("x-forwarded-for", "198.51.100.8")]);
        assert_eq!(e.client_ip(ip("10.0.0.1"), &h), ip("198.51.100.8"));
        // No header: the trusted peer is the client.
        assert_eq!(e.client_ip(ip("10.0.0.1"), &HeaderMap::new()), ip("10.0.0.1"));
        // Every hop trusted: the left-most is the client.
        let h = headers(&[("x-forwarded-for", "10.9.9.9, 10.0.0.2")]);
        assert_eq!(e.client_ip(ip("10.0.0.1"), &h), ip("10.9.9.9"));
        // Ports and IPv4-mapped IPv6 peers.
        let h = headers(&[("x-forwarded-for", "198.51.100.9:5555")]);
        assert_eq!(e.client_ip(ip("::ffff:127.0.0.1"), &h), ip("198.51.100.9"));
    }

    #[test]
    fn forwarded_is_parsed_per_rfc_7239_when_configured() {
        let e = extractor().forwarded_header(ForwardedHeader::Forwarded);
        let h = headers(&[
            ("x-forwarded-for", "7.7.7.7"),
            ("forwarded", "for=6.6.6.6, for=\"[2001:db8:cafe::17]:4711\";proto=https"),
            ("forwarded", "For=10.0.0.5;by=10.0.0.1"),
        ]);
        assert_eq!(e.client_ip(ip("10.0.0.1"), &h), ip("2001:db8:cafe::17"));
        // An unreadable hop stops the walk at the trusted proxy that wrote it.
        let h = headers(&[("forwarded", "for=198.51.100.1, for=unknown, for=10.0.0.5")]);
        assert_eq!(e.client_ip(ip("10.0.0.1"), &h), ip("10.0.0.5"));
        let h = headers(&[("x-forwarded-for", "198.51.100.1, garbage")]);
        assert_eq!(extractor().client_ip(ip("10.0.0.1"), &h), ip("10.0.0.1"));
        // Configured for `Forwarded`, an `X-Forwarded-For` is ignored.
        let h = headers(&[("x-forwarded-for", "198.51.100.1")]);
        assert_eq!(e.client_ip(ip("10.0.0.1"), &h), ip("10.0.0.1"));
    }

    #[test]
    fn only_the_configured_forwarding_header_is_read() {
        // nginx appends the real peer to X-Forwarded-For and passes the
        // client's own `Forwarded` through: the default ignores the latter.
        let e = extractor();
        assert_eq!(e.forwarded_header, ForwardedHeader::XForwardedFor);
        for spoof in ["for=6.6.6.6", "for=6.6.6.7", "for=\"[2001:db8::1]\""] {
            let h = headers(&[("forwarded", spoof), ("x-forwarded-for", "198.51.100.7")]);
            assert_eq!(e.client_ip(ip("127.0.0.1"), &h), ip("198.51.100.7"), "{spoof}");
        }
        // A `Forwarded` alone changes nothing either.
        let h = headers(&[("forwarded", "for=6.6.6.6")]);
        assert_eq!(e.client_ip(ip("127.0.0.1"), &h), ip("127.0.0.1"));
        assert_eq!("Forwarded".parse(), Ok(ForwardedHeader::Forwarded));
        assert_eq!("x-forwarded-for".parse(), Ok(ForwardedHeader::XForwardedFor));
        assert!("x-real-ip"
            .parse::<ForwardedHeader>()
            .unwrap_err()
            .to_string()
            .starts_with("invalid forwarded_header \"x-real-ip\""));
    }

    #[test]
    fn keys_are_keyed_hashes_never_raw_values() {
        let e = extractor();
        let search: Arc<str> = "search".into();
        let k = e.identity(&search, Source::Ip, &e.ip_bytes(ip("198.51.100.7")));
        let text = k.to_string();
        assert!(text.starts_with("search:ip:") && text.len() == "search:ip:".len() + 32, "{text}");
        assert!(!text.contains("198"));
        assert_eq!(k, e.identity(&search, Source::Ip, &Ipv6Addr::from(0xffff_c633_6407u128).octets()));
        // Another secret, another key; an API key never collides with an IP.
        let other = IdentityExtractor::new(b"other");
        assert_ne!(k, other.identity(&search, Source::Ip, &e.ip_bytes(ip("198.51.100.7"))));
        let s: Arc<str> = "s".into();
        assert_ne!(e.identity(&s, Source::ApiKey, b"a").digest(), e.identity(&s, Source::Ip, b"a").digest());
    }

    #[test]
    fn ipv6_clients_can_be_grouped_by_64() {
        let grouped = IdentityExtractor::new(b"s").ipv6_prefix(64);
        let a = grouped.ip_bytes(ip("2001:db8:1:2:aaaa::1"));
        assert_eq!(a, grouped.ip_bytes(ip("2001:db8:1:2:ffff::9")));
        assert_ne!(a, grouped.ip_bytes(ip("2001:db8:1:3::1")));
        let exact = IdentityExtractor::new(b"s").ipv6_prefix(128);
        assert_ne!(exact.ip_bytes(ip("2001:db8:1:2::1")), exact.ip_bytes(ip("2001:db8:1:2::2")));
        assert_eq!(grouped.ip_bytes(ip("192.0.2.1"))[10..], [0xff, 0xff, 192, 0, 2, 1]);
        assert_eq!(grouped.ip_bytes(ip("192.0.2.1")), grouped.ip_bytes(ip("::ffff:192.0.2.1")));
    }

    /// Two addresses of one /64 are one client unless configured otherwise:
    /// rotating through a /64 must not reset the quota.
    #[test]
    fn ipv6_addresses_of_one_64_share_a_key_by_default() {
        let e = IdentityExtractor::new(b"s");
        let rule: Arc<str> = "r".into();
        let key = |s: &str| e.identity(&rule, Source::Ip, &e.ip_bytes(ip(s)));
        assert_eq!(key("2001:db8:1:2::1"), key("2001:db8:1:2:ffff:ffff:ffff:fffe"));
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
    }

    #[test]
    fn api_keys_come_from_the_configured_header() {
        let e = extractor().api_key_header(HeaderName::from_static("x-api-key"));
        assert_eq!(e.api_key(&headers(&[("x-api-key", "abc")])), Some(&b"abc"[..]));
        assert_eq!(e.api_key(&headers(&[("x-api-key", "")])), None);
        assert_eq!(e.api_key(&headers(&[("authorization", "abc")])), None);
        assert_eq!(extractor().api_key(&headers(&[("x-api-key", "abc")])), None);
    }

    /// Two keys, on two lines or one, are refused rather than guessed at:
    /// the upstream may use another one than slidegate counted.
    #[test]
    fn several_api_keys_are_ambiguous() {
        let e = extractor().api_key_header(HeaderName::from_static("x-api-key"));
        assert!(!e.api_key_is_ambiguous(&headers(&[("x-api-key", "abc")])));
        assert!(!e.api_key_is_ambiguous(&headers(&[("x-other", "a, b")])));
        assert!(!e.api_key_is_ambiguous(&HeaderMap::new()));
        assert!(e.api_key_is_ambiguous(&headers(&[("x-api-key", "abc"), ("x-api-key", "def")])));
        assert!(e.api_key_is_ambiguous(&headers(&[("x-api-key", "abc"), ("x-api-key", "")])));
        assert!(e.api_key_is_ambiguous(&headers(&[("x-api-key", "abc, def")])));
        // Without an API key header configured, no header is one.
        assert!(!extractor().api_key_is_ambiguous(&headers(&[("x-api-key", "a"), ("x-api-key", "b")])));
        // The sole key is the one `api_key` reads; an empty value is none.
        let sole = |h: &[(&str, &str)]| e.sole_api_key(&headers(h)).map(|k| k.map(<[u8]>::to_vec));
        assert_eq!(sole(&[("x-api-key", "abc")]), Ok(Some(b"abc".to_vec())));
        assert_eq!(sole(&[("x-api-key", "")]), Ok(None));
        assert_eq!(sole(&[]), Ok(None));
        assert_eq!(sole(&[("x-api-key", ","), ("x-other", "a")]), Err(AmbiguousKey));
        assert_eq!(sole(&[("x-api-key", ""), ("x-api-key", "")]), Err(AmbiguousKey));
    }

    /// A WSGI upstream reads `x_api_key` as the key header; slidegate
    /// counted it as anonymous. Every `_` spelling of an identity header is
    /// removed before deciding, so upstream and limiter see one identity.
    #[test]
    fn underscore_spellings_of_identity_headers_are_removed() {
        let e = extractor().api_key_header(HeaderName::from_static("x-api-key"));
        let mut h = headers(&[
            ("x_api_key", "alias-1"),
            ("x-api_key", "alias-2"),
            ("x_api-key", "alias-3"),
            ("x_forwarded_for", "6.6.6.6"),
            ("x-forwarded_for", "6.6.6.7"),
            ("x-api-key", "counted"),
            ("x-forwarded-for", "198.51.100.7"),
            ("x_other_header", "kept"),
            ("x_api_keys", "kept"),
            ("xapi_key", "kept"),
        ]);
        e.strip_header_aliases(&mut h);
        let mut names: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["x-api-key", "x-forwarded-for", "x_api_keys", "x_other_header", "xapi_key"]);
        assert_eq!(e.api_key(&h), Some(&b"counted"[..]));
        assert!(!e.api_key_is_ambiguous(&h));
        // An alias alone leaves the request anonymous, as the upstream sees it.
        let mut h = headers(&[("x_api_key", "holder")]);
        e.strip_header_aliases(&mut h);
        assert!(h.is_empty() && e.api_key(&h).is_none());
        // Without an API key header, only the forwarding header's aliases go.
        let mut h = headers(&[("x_api_key", "k"), ("x_forwarded_for", "1.1.1.1")]);
        extractor().strip_header_aliases(&mut h);
        assert_eq!(h.keys().map(HeaderName::as_str).collect::<Vec<_>>(), ["x_api_key"]);
        // A header name without `-` has no alias.
        let plain = extractor().api_key_header(HeaderName::from_static("apikey"));
        let mut h = headers(&[("apikey", "k"), ("api_key", "other")]);
        plain.strip_header_aliases(&mut h);
        assert_eq!(h.len(), 2);
    }

    #[test]
    fn value_digests_are_keyed() {
        let e = extractor();
        assert_eq!(e.value_digest(b"v"), e.value_digest(b"v"));
        assert_ne!(e.value_digest(b"v"), e.value_digest(b"w"));
        assert_ne!(e.value_digest(b"v"), IdentityExtractor::new(b"other").value_digest(b"v"));
    }
}
