//! What a [`RateLimiter`](crate::RateLimiter) is built from, as plain types
//! a program builds in code (or `slidegate-server` reads from TOML), and
//! their defaults: the one place each default is written.

use http::{HeaderName, Method};
use ipnet::IpNet;
use serde::Deserialize;
use slidegate::{check_charge, Limit, StoreError};

use crate::extractor::ForwardedHeader;
use crate::rules::PathPattern;
use slidegate::protect::StoreGuard;
use slidegate::TimeSpan;

/// Everything a [`RateLimiter`](crate::RateLimiter) is built from: rules,
/// identities, headers and how it guards itself against its store.
///
/// Start from [`LimiterConfig::default`] and set the fields:
///
/// ```
/// use slidegate::{Algorithm, Limit, MemoryStore, Quota};
/// use slidegate_http::config::{IdentityKind, LimitConfig, LimiterConfig, RuleConfig, RuleLimits};
/// use slidegate_http::RateLimiter;
///
/// let limit = Limit::new(Algorithm::SlidingWindowCounter, Quota::per_second(10)?);
/// let mut config = LimiterConfig::default();
/// config.rules.push(RuleConfig::new(
///     "search",
///     "/api/search*".parse()?,
///     RuleLimits::Shared { identity: IdentityKind::Ip, limits: vec![LimitConfig::new("search", limit, 1)?] },
/// ));
/// let limiter = RateLimiter::from_config(&config, MemoryStore::new())?;
/// assert_eq!(limiter.rule_names(), ["search"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LimiterConfig {
    /// Who a request is.
    pub identity: IdentityConfig,
    /// Which response headers to send.
    pub headers: HeadersConfig,
    /// The rules, in order; the first rule that matches a request decides it.
    pub rules: Vec<RuleConfig>,
    /// The deadline, circuit breaker, fallback and deny cache in front of the store.
    pub guard: StoreGuard,
    /// Plans: other limits for the API keys mapped to them.
    pub plans: super::PlansConfig,
    /// Clients never limited or always refused, whatever rule they meet
    /// (the global deny list also refuses requests matching no rule).
    pub lists: crate::AccessLists,
    /// How many requests rules with [`RuleConfig::delay`] may hold at once,
    /// over every rule and identity ([`DelayConfig::DEFAULT_MAX_DELAYED`]
    /// unless set); one more is refused at once.
    pub max_delayed: u32,
}

impl Default for LimiterConfig {
    fn default() -> Self {
        Self {
            identity: IdentityConfig::default(),
            headers: HeadersConfig::default(),
            rules: Vec::new(),
            guard: StoreGuard::default(),
            max_delayed: DelayConfig::DEFAULT_MAX_DELAYED,
            lists: crate::AccessLists::default(),
            plans: super::PlansConfig::default(),
        }
    }
}

/// What to do with a request when the store failed or timed out.
///
/// The default keeps limiting: a store outage or slowdown never means
/// unlimited unless a rule asks for it with [`OnError::Allow`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Decide with the embedded fallback limiter, seeded with the store's
    /// last answers, each instance enforcing `limit / instances`
    /// ([`FallbackPolicy::instances`](slidegate::protect::FallbackPolicy::instances); bound in docs/serve.md, "Circuit breaker
    /// and fallback").
    #[default]
    Fallback,
    /// Fail open: let the request through (logged and counted).
    Allow,
    /// Fail closed: answer 503.
    Deny,
}

/// `[identity]`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct IdentityConfig {
    /// The header carrying the API key, if clients send one.
    pub api_key_header: Option<HeaderName>,
    /// The secret keying the identity hashes; `None` draws a random one per process.
    pub secret: Option<Vec<u8>>,
    /// Peers whose forwarding header is believed.
    pub trusted_proxies: Vec<IpNet>,
    /// The one forwarding header trusted proxies write (`X-Forwarded-For` by default).
    pub forwarded_header: ForwardedHeader,
    /// IPv6 clients are grouped by this prefix length (64 by default: one
    /// identity per /64, the smallest network a host or home is given, so a
    /// client cannot take a fresh quota from each of its 2^64 addresses; 128:
    /// no grouping).
    pub ipv6_prefix: u8,
}

impl Default for IdentityConfig {
    fn default() -> Self {
        Self {
            api_key_header: None,
            secret: None,
            trusted_proxies: Vec::new(),
            forwarded_header: ForwardedHeader::default(),
            ipv6_prefix: 64,
        }
    }
}

/// `[headers]`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct HeadersConfig {
    /// Whether `X-RateLimit-Limit`, `-Remaining` and `-Reset` are sent besides the IETF headers.
    pub legacy: bool,
}

impl Default for HeadersConfig {
    fn default() -> Self {
        Self { legacy: true }
    }
}

/// Whose quota a rule's `limits` count against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdentityKind {
    /// The API key when the request carries one, the hashed client IP otherwise.
    #[default]
    ApiKey,
    /// The hashed client IP, always.
    Ip,
}

/// One `[[rules]]` entry.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RuleConfig {
    /// The rule's name: in metrics, policy names and `/v1/check`.
    pub name: String,
    /// The path pattern.
    pub path: PathPattern,
    /// The methods it applies to; empty: all.
    pub methods: Vec<Method>,
    /// Who is counted, and against which limits.
    pub limits: RuleLimits,
    /// What to do when the store fails, overriding `[store] on_error`.
    pub on_error: OnError,
    /// Decide, count and send headers, but never block.
    pub shadow: bool,
    /// The largest `cost` one `/v1/check` call may charge under this rule
    /// (and the most a `cost_header` may charge).
    pub max_cost: u64,
    /// How many distinct paths or parameter values an identity may touch per window.
    pub breadth: Option<crate::BreadthConfig>,
    /// Charge after the response: by status, or by a header's cost.
    pub response_cost: crate::ResponseCost,
    /// How many requests of one identity may be in flight at once when the
    /// rule charges after the response (`response_cost`); one more is
    /// refused with 429. Rules charged before forwarding ignore it.
    pub max_in_flight: u32,
    /// The penalty box: identities denied too often are blocked for a while.
    pub penalty: Option<slidegate::Penalty>,
    /// Delay instead of refuse: a request denied with a short wait is held
    /// and decided again (see [`DelayConfig`]).
    pub delay: Option<DelayConfig>,
    /// Clients this rule never limits or always refuses (besides the
    /// global lists, [`LimiterConfig::lists`]).
    pub lists: crate::AccessLists,
}

impl RuleConfig {
    /// A rule named `name` for every method on `path`, deciding with the
    /// fallback limiter while the store fails, not in shadow mode.
    ///
    /// ```
    /// use slidegate::{Algorithm, Limit, Quota};
    /// use slidegate_http::config::{IdentityKind, LimitConfig, RuleConfig, RuleLimits};
    ///
    /// let limit = Limit::new(Algorithm::SlidingWindowCounter, Quota::per_second(10)?);
    /// let rule = RuleConfig::new(
    ///     "search",
    ///     "/api/search*".parse()?,
    ///     RuleLimits::Shared { identity: IdentityKind::Ip, limits: vec![LimitConfig::new("search", limit, 1)?] },
    /// );
    /// assert_eq!(rule.name, "search");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(name: impl Into<String>, path: PathPattern, limits: RuleLimits) -> Self {
        Self {
            name: name.into(),
            path,
            methods: Vec::new(),
            limits,
            on_error: OnError::default(),
            shadow: false,
            max_cost: Self::DEFAULT_MAX_COST,
            breadth: None,
            response_cost: crate::ResponseCost::default(),
            max_in_flight: Self::DEFAULT_MAX_IN_FLIGHT,
            penalty: None,
            delay: None,
            lists: crate::AccessLists::default(),
        }
    }

    /// `max_in_flight` unless the rule says otherwise: above the 6
    /// connections a browser opens to one host, so a page's requests never
    /// meet it, while one identity's requests charged after the response can
    /// overshoot a limit by at most 8 × `max_cost` (per instance).
    pub const DEFAULT_MAX_IN_FLIGHT: u32 = 8;

    /// `max_cost` unless the rule says otherwise: a `/v1/check` call charges
    /// what one proxied request charges, no more.
    pub const DEFAULT_MAX_COST: u64 = 1;
}

/// A rule's `delay`: a request its limits deny, that would be allowed
/// within `max_wait`, is held and decided again instead of refused, as
/// nginx's `limit_req ... delay=` does; at most `per_identity` requests of
/// one identity are held at once under the rule, and at most
/// [`LimiterConfig::max_delayed`] over all. Beyond either, or when the wait
/// is longer, the request is refused at once.
///
/// ```
/// use slidegate_http::config::{TimeSpan, DelayConfig};
///
/// let delay = DelayConfig::new(TimeSpan::from_millis(500), 4)?;
/// assert_eq!((delay.max_wait, delay.per_identity), (TimeSpan::from_millis(500), 4));
/// assert!(DelayConfig::new(TimeSpan::from_secs(61), 4).is_err());
/// # Ok::<(), slidegate_http::config::DelayError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct DelayConfig {
    /// The longest a request is held, over all its decisions.
    pub max_wait: TimeSpan,
    /// How many requests of one identity the rule holds at once.
    pub per_identity: u32,
}

/// Why a [`DelayConfig`] cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DelayError {
    /// `max_wait` is zero or above [`DelayConfig::MAX_WAIT`].
    #[error("max_wait must be more than 0 and at most {}s, got {}ms", DelayConfig::MAX_WAIT.as_millis() / 1000, .0.as_millis())]
    MaxWait(TimeSpan),
    /// `per_identity` is zero or above [`DelayConfig::MAX_PER_IDENTITY`].
    #[error("per_identity must be from 1 to {}, got {}", DelayConfig::MAX_PER_IDENTITY, .0)]
    PerIdentity(u32),
}

impl DelayConfig {
    /// The longest `max_wait`: a client that cannot handle 429 can still
    /// time out, and a held request keeps its connection open.
    pub const MAX_WAIT: TimeSpan = TimeSpan::from_secs(60);

    /// The most `per_identity`.
    pub const MAX_PER_IDENTITY: u32 = 1_000;

    /// `per_identity` unless a configuration file says otherwise: the
    /// few requests a page sends at once.
    pub const DEFAULT_PER_IDENTITY: u32 = 4;

    /// [`LimiterConfig::max_delayed`] unless set.
    pub const DEFAULT_MAX_DELAYED: u32 = 1_000;

    /// The most [`LimiterConfig::max_delayed`] may be.
    pub const MAX_MAX_DELAYED: u32 = 1_000_000;

    /// Hold for at most `max_wait`, at most `per_identity` requests of one identity.
    ///
    /// # Errors
    /// [`DelayError`] for a zero or too long `max_wait`, or a zero or too
    /// large `per_identity`.
    pub fn new(max_wait: TimeSpan, per_identity: u32) -> Result<Self, DelayError> {
        if max_wait == TimeSpan::default() || max_wait > Self::MAX_WAIT {
            return Err(DelayError::MaxWait(max_wait));
        }
        if per_identity == 0 || per_identity > Self::MAX_PER_IDENTITY {
            return Err(DelayError::PerIdentity(per_identity));
        }
        Ok(Self { max_wait, per_identity })
    }
}

/// The limits of a rule, by identity.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum RuleLimits {
    /// One list for everybody, counted per `identity`.
    Shared {
        /// Whose quota.
        identity: IdentityKind,
        /// The limits, decided together.
        limits: Vec<LimitConfig>,
    },
    /// Separate lists for requests with an API key (counted per key) and
    /// without (counted per hashed IP).
    Split {
        /// For requests carrying an API key.
        authenticated: Vec<LimitConfig>,
        /// For the others.
        anonymous: Vec<LimitConfig>,
    },
}

/// One limit of a rule: a named policy in the `RateLimit-Policy` sense.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LimitConfig {
    /// The policy name in headers and problem bodies.
    pub name: String,
    /// The algorithm and quota.
    pub limit: Limit,
    /// Permits one request costs.
    pub cost: u64,
}

impl LimitConfig {
    /// Permits a request costs unless the limit says otherwise.
    pub const DEFAULT_COST: u64 = 1;

    /// The policy `name`: `limit`, each request costing `cost` permits.
    ///
    /// # Errors
    /// What [`slidegate::check_charge`] says of `(limit, cost)`: a cost above
    /// the limit, or a sliding log too large to keep.
    pub fn new(name: impl Into<String>, limit: Limit, cost: u64) -> Result<Self, StoreError> {
        check_charge(&limit, cost)?;
        Ok(Self { name: name.into(), limit, cost })
    }
}
