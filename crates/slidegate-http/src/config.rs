//! The configuration file: TOML, every key known, every error located.
//!
//! [`Config::load`] reads and validates a file; [`Config::parse`] does the
//! same for a string. Any error — a TOML syntax error, an unknown key, a value
//! of the wrong form, a rule that contradicts itself — is a [`ConfigError`]
//! naming the file, line and column and the form that was expected.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use http::{HeaderName, Method, Uri};
use ipnet::IpNet;
use serde::de::{self, Deserializer};
use serde::Deserialize;
use slidegate::algorithm::sliding_log;
use slidegate::{Algorithm, Limit, Quota};
use toml::Spanned;

use crate::identity::ForwardedHeader;
use crate::rules::PathPattern;

/// Why a configuration could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{}: cannot read the configuration: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The file was read but is not a valid configuration.
    #[error("{}:{line}:{column}: {message}{snippet}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// 1-based line of the offending value.
        line: usize,
        /// 1-based column (in characters) of the offending value.
        column: usize,
        /// What was wrong and what was expected.
        message: String,
        /// The offending source line with a caret under the value, starting with a newline.
        snippet: String,
    },
}

impl ConfigError {
    fn at(path: &Path, source: &str, span: Option<Range<usize>>, message: impl Into<String>) -> Self {
        let offset = span.as_ref().map_or(0, |s| s.start.min(source.len()));
        let before = &source[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = source[line_start..offset].chars().count() + 1;
        let line_text = source[line_start..].lines().next().unwrap_or("");
        let width = span
            .map(|s| {
                source[offset..s.end.min(source.len()).max(offset)].chars().take_while(|c| *c != '\n').count()
            })
            .unwrap_or(1)
            .max(1);
        let gutter = line.to_string().len();
        let snippet = format!(
            "\n{pad} |\n{line} | {line_text}\n{pad} | {spaces}{carets}",
            pad = " ".repeat(gutter),
            spaces = " ".repeat(column - 1),
            carets = "^".repeat(width),
        );
        let message: String = message.into();
        ConfigError::Invalid {
            path: path.to_owned(),
            line,
            column,
            message: message.trim().to_owned(),
            snippet,
        }
    }

    /// `(line, column)` of an invalid configuration; `None` for a read error.
    pub fn location(&self) -> Option<(usize, usize)> {
        match self {
            ConfigError::Invalid { line, column, .. } => Some((*line, *column)),
            ConfigError::Read { .. } => None,
        }
    }
}

/// A validated configuration.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// `[server]`: where to listen, where to forward.
    pub server: ServerConfig,
    /// `[store]`: where limiter state lives and what to do when it fails.
    pub store: StoreConfig,
    /// `[identity]`: who a request is.
    pub identity: IdentityConfig,
    /// `[headers]`: which response headers to send.
    pub headers: HeadersConfig,
    /// `[[rules]]`, in file order; the first rule that matches a request decides it.
    pub rules: Vec<RuleConfig>,
}

/// `[server]`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerConfig {
    /// The address `serve` listens on (port 0 picks a free port).
    pub listen: SocketAddr,
    /// The one upstream every non-admin request is forwarded to (`http://host:port`).
    pub upstream: Option<Uri>,
    /// The prefix of the admin endpoints (`{prefix}/v1/check`, `/metrics`, `/healthz`); empty by default.
    pub admin_prefix: String,
    /// A separate address for the admin endpoints; when set they are served
    /// only there, and the public listener forwards those paths upstream.
    pub admin_listen: Option<SocketAddr>,
    /// How long a graceful shutdown waits for open connections.
    pub shutdown_grace: Duration,
    /// Worker threads, each with its own runtime and upstream pool; `None`: one per CPU.
    pub threads: Option<usize>,
}

/// What to do with a request when the store failed or timed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Fail open: let the request through (logged and counted).
    Allow,
    /// Fail closed: answer 503.
    Deny,
}

/// `[store]`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StoreConfig {
    /// A Redis URL; `None` for the embedded store.
    pub url: Option<String>,
    /// A prefix for every Redis key.
    pub prefix: Option<String>,
    /// The deadline of one store call.
    pub timeout: Duration,
    /// The default failure policy of every rule.
    pub on_error: OnError,
    /// Consecutive failures that open the circuit breaker.
    pub breaker_failures: u32,
    /// How often an open breaker probes the store in the background.
    pub probe_interval: Duration,
    /// Whether an embedded limiter applies the rules while the store is unavailable.
    pub insurance: bool,
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
    /// IPv6 clients are grouped by this prefix length (128: no grouping; 64: one identity per /64).
    pub ipv6_prefix: u8,
}

/// `[headers]`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct HeadersConfig {
    /// Whether `X-RateLimit-Limit`, `-Remaining` and `-Reset` are sent besides the IETF headers.
    pub legacy: bool,
}

/// Whose quota a rule's `limits` count against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdentityKind {
    /// The API key when the request carries one, the hashed client IP otherwise.
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
    /// The failure policy, overriding `[store] on_error`.
    pub on_error: OnError,
    /// Decide, count and send headers, but never block.
    pub shadow: bool,
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

/// One limit of a rule.
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

// ---------------------------------------------------------------- raw TOML

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    server: RawServer,
    #[serde(default)]
    store: RawStore,
    #[serde(default)]
    identity: RawIdentity,
    #[serde(default)]
    headers: RawHeaders,
    #[serde(default)]
    rules: Vec<Spanned<RawRule>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawServer {
    listen: Option<Parsed<SocketAddr>>,
    upstream: Option<Spanned<String>>,
    admin_prefix: Option<Spanned<String>>,
    admin_listen: Option<Spanned<Parsed<SocketAddr>>>,
    shutdown_grace: Option<WindowValue>,
    threads: Option<Spanned<u16>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    url: Option<Spanned<String>>,
    prefix: Option<String>,
    #[serde(default = "default_timeout_ms")]
    timeout_ms: Spanned<u64>,
    #[serde(default = "default_on_error")]
    on_error: OnError,
    #[serde(default = "default_breaker_failures")]
    breaker_failures: Spanned<u32>,
    #[serde(default = "default_probe_interval_ms")]
    probe_interval_ms: Spanned<u64>,
    #[serde(default)]
    insurance: bool,
}

impl Default for RawStore {
    fn default() -> Self {
        Self {
            url: None,
            prefix: None,
            timeout_ms: default_timeout_ms(),
            on_error: default_on_error(),
            breaker_failures: default_breaker_failures(),
            probe_interval_ms: default_probe_interval_ms(),
            insurance: false,
        }
    }
}

fn default_timeout_ms() -> Spanned<u64> {
    Spanned::new(0..0, 50)
}
fn default_on_error() -> OnError {
    OnError::Allow
}
fn default_breaker_failures() -> Spanned<u32> {
    Spanned::new(0..0, 3)
}
fn default_probe_interval_ms() -> Spanned<u64> {
    Spanned::new(0..0, 500)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawIdentity {
    api_key_header: Option<Parsed<HeaderName>>,
    ip_hash_secret_env: Option<Spanned<String>>,
    #[serde(default)]
    trusted_proxies: Vec<Spanned<String>>,
    #[serde(default)]
    forwarded_header: Option<Parsed<ForwardedHeader>>,
    #[serde(default = "default_ipv6_prefix")]
    ipv6_prefix: Spanned<u8>,
}

impl Default for RawIdentity {
    fn default() -> Self {
        Self {
            api_key_header: None,
            ip_hash_secret_env: None,
            trusted_proxies: Vec::new(),
            forwarded_header: None,
            ipv6_prefix: default_ipv6_prefix(),
        }
    }
}

fn default_ipv6_prefix() -> Spanned<u8> {
    Spanned::new(0..0, 128)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHeaders {
    #[serde(default = "yes")]
    legacy: bool,
}

impl Default for RawHeaders {
    fn default() -> Self {
        Self { legacy: true }
    }
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    name: Spanned<String>,
    path: Parsed<PathPattern>,
    #[serde(default)]
    methods: Vec<Spanned<String>>,
    identity: Option<Spanned<IdentityKind>>,
    limits: Option<Spanned<Vec<Spanned<RawLimit>>>>,
    authenticated: Option<Spanned<Vec<Spanned<RawLimit>>>>,
    anonymous: Option<Spanned<Vec<Spanned<RawLimit>>>>,
    on_error: Option<OnError>,
    #[serde(default)]
    shadow: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    name: Option<Spanned<String>>,
    limit: Spanned<u64>,
    window: WindowValue,
    #[serde(default)]
    algorithm: Parsed<AlgorithmName>,
    #[serde(default = "default_cost")]
    cost: Spanned<u64>,
}

fn default_cost() -> Spanned<u64> {
    Spanned::new(0..0, 1)
}

/// A value parsed from a TOML string with [`FromStr`], the parse error
/// reported at the value's position.
struct Parsed<T>(T);

impl<'de, T> Deserialize<'de> for Parsed<T>
where
    T: FromStr,
    T::Err: fmt::Display,
{
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map(Parsed).map_err(de::Error::custom)
    }
}

impl Default for Parsed<AlgorithmName> {
    fn default() -> Self {
        Parsed(AlgorithmName(Algorithm::SlidingWindowCounter))
    }
}

struct AlgorithmName(Algorithm);

impl FromStr for AlgorithmName {
    type Err = slidegate::UnknownAlgorithm;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(AlgorithmName)
    }
}

struct MethodName(Method);

impl FromStr for MethodName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let upper = s.to_ascii_uppercase();
        if upper.is_empty() || !upper.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(format!("invalid method {s:?}: expected an HTTP method such as \"GET\" or \"POST\""));
        }
        Method::from_bytes(upper.as_bytes()).map(MethodName).map_err(|e| format!("invalid method {s:?}: {e}"))
    }
}

/// A CIDR block; a bare address is its own /32 or /128.
struct Cidr(IpNet);

impl FromStr for Cidr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(net) = s.parse::<IpNet>() {
            return Ok(Cidr(net.trunc()));
        }
        s.parse::<IpAddr>().map(|ip| Cidr(IpNet::from(ip))).map_err(|_| {
            format!("invalid trusted proxy {s:?}: expected a CIDR block such as \"10.0.0.0/8\" or an address")
        })
    }
}

/// A duration written as a whole number and a unit: `"500ms"`, `"1s"`, `"60s"`, `"5m"`, `"1h"`, `"1d"`.
#[derive(Debug, Clone)]
struct WindowValue {
    duration: Duration,
    text: String,
    span: Range<usize>,
}

/// Parses `"60s"`-style durations.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let expected = "expected a whole number followed by ms, s, m, h or d, such as \"60s\"";
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = s.split_at(digits);
    let n: u64 = number.parse().map_err(|_| format!("invalid duration {s:?}: {expected}"))?;
    let ms_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("invalid duration {s:?}: {expected}")),
    };
    n.checked_mul(ms_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("invalid duration {s:?}: too long"))
}

impl<'de> Deserialize<'de> for WindowValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let spanned = Spanned::<String>::deserialize(d)?;
        let span = spanned.span();
        let text = spanned.into_inner();
        let duration = parse_duration(&text).map_err(de::Error::custom)?;
        Ok(WindowValue { duration, text, span })
    }
}

// ---------------------------------------------------------------- validation

impl Config {
    /// Reads and validates the configuration in `path`.
    ///
    /// # Errors
    /// [`ConfigError::Read`] when the file cannot be read, [`ConfigError::Invalid`]
    /// with line and column for anything wrong inside it.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let source = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        Self::parse(&source, path)
    }

    /// Validates the configuration text `source`; `path` names it in errors.
    /// Environment variables named by the config (the hash secret) are read now.
    ///
    /// ```
    /// use slidegate_http::Config;
    ///
    /// let err = Config::parse("[server]\nlisten = \"127.0.0.1:8080\"\nlisten_on = 1\n", "demo.toml")
    ///     .unwrap_err();
    /// assert_eq!(err.location(), Some((3, 1)));
    /// assert!(err.to_string().starts_with("demo.toml:3:1: unknown field `listen_on`"));
    /// ```
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the line and column of the first problem.
    pub fn parse(source: &str, path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let fail = |span: Option<Range<usize>>, message: String| ConfigError::at(path, source, span, message);
        let raw: RawConfig = toml::from_str(source).map_err(|e| fail(e.span(), e.message().to_owned()))?;
        Validator { fail: &fail }.config(raw)
    }
}

struct Validator<'a> {
    fail: &'a dyn Fn(Option<Range<usize>>, String) -> ConfigError,
}

impl Validator<'_> {
    fn err(&self, span: Range<usize>, message: impl Into<String>) -> ConfigError {
        (self.fail)(Some(span), message.into())
    }

    /// Parses each string of an array, reporting an error at the element.
    fn each<T>(&self, values: Vec<Spanned<String>>) -> Result<Vec<T>, ConfigError>
    where
        T: FromStr,
        T::Err: fmt::Display,
    {
        values
            .into_iter()
            .map(|v| v.get_ref().parse().map_err(|e: T::Err| self.err(v.span(), e.to_string())))
            .collect()
    }

    fn config(&self, raw: RawConfig) -> Result<Config, ConfigError> {
        let server = self.server(raw.server)?;
        let store = self.store(raw.store)?;
        let identity = self.identity(raw.identity)?;
        let mut rules: Vec<RuleConfig> = Vec::with_capacity(raw.rules.len());
        for rule in raw.rules {
            let name_span = rule.get_ref().name.span();
            let rule = self.rule(rule, store.on_error)?;
            if rules.iter().any(|r| r.name == rule.name) {
                return Err(self.err(
                    name_span,
                    format!("duplicate rule name {:?}: rule names must be unique", rule.name),
                ));
            }
            rules.push(rule);
        }
        Ok(Config { server, store, identity, headers: HeadersConfig { legacy: raw.headers.legacy }, rules })
    }

    fn server(&self, raw: RawServer) -> Result<ServerConfig, ConfigError> {
        let upstream = match raw.upstream {
            None => None,
            Some(u) => {
                let uri: Uri = u.get_ref().parse().map_err(|_| {
                    self.err(
                        u.span(),
                        format!("invalid upstream {:?}: expected http://host:port", u.get_ref()),
                    )
                })?;
                if uri.scheme_str() != Some("http") || uri.authority().is_none() {
                    return Err(self.err(
                        u.span(),
                        format!(
                            "invalid upstream {:?}: expected http://host:port (https is not supported)",
                            u.get_ref()
                        ),
                    ));
                }
                if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
                    return Err(self.err(
                        u.span(),
                        format!(
                            "invalid upstream {:?}: expected no path, only http://host:port",
                            u.get_ref()
                        ),
                    ));
                }
                Some(uri)
            }
        };
        let admin_prefix = match raw.admin_prefix {
            None => String::new(),
            Some(p) => {
                let text = p.get_ref().trim_end_matches('/');
                if !text.is_empty() && (!text.starts_with('/') || text.contains(['?', '#', '*', '{'])) {
                    return Err(self.err(
                        p.span(),
                        format!(
                            "invalid admin_prefix {:?}: expected a path such as \"/_slidegate\"",
                            p.get_ref()
                        ),
                    ));
                }
                text.to_owned()
            }
        };
        let listen = raw.listen.map_or(SocketAddr::from(([127, 0, 0, 1], 8080)), |p| p.0);
        let admin_listen = match raw.admin_listen {
            None => None,
            Some(a) if a.get_ref().0 == listen && listen.port() != 0 => {
                return Err(self.err(
                    a.span(),
                    format!(
                        "admin_listen {} is the listen address: expected another address, such as \"127.0.0.1:9091\"",
                        a.get_ref().0
                    ),
                ))
            }
            Some(a) => Some(a.into_inner().0),
        };
        Ok(ServerConfig {
            listen,
            upstream,
            admin_prefix,
            admin_listen,
            shutdown_grace: raw.shutdown_grace.map_or(Duration::from_secs(10), |w| w.duration),
            threads: match raw.threads {
                Some(t) if *t.get_ref() == 0 => return Err(self.err(t.span(), "threads must be at least 1")),
                Some(t) => Some(usize::from(*t.get_ref())),
                None => None,
            },
        })
    }

    fn store(&self, raw: RawStore) -> Result<StoreConfig, ConfigError> {
        if let Some(url) = &raw.url {
            let u = url.get_ref();
            if !(u.starts_with("redis://") || u.starts_with("rediss://") || u.starts_with("redis+unix://")) {
                return Err(
                    self.err(url.span(), format!("invalid store url {u:?}: expected redis://host:port"))
                );
            }
        }
        if *raw.timeout_ms.get_ref() == 0 {
            return Err(self.err(raw.timeout_ms.span(), "timeout_ms must be at least 1"));
        }
        if *raw.breaker_failures.get_ref() == 0 {
            return Err(self.err(raw.breaker_failures.span(), "breaker_failures must be at least 1"));
        }
        if *raw.probe_interval_ms.get_ref() == 0 {
            return Err(self.err(raw.probe_interval_ms.span(), "probe_interval_ms must be at least 1"));
        }
        Ok(StoreConfig {
            url: raw.url.map(Spanned::into_inner),
            prefix: raw.prefix,
            timeout: Duration::from_millis(*raw.timeout_ms.get_ref()),
            on_error: raw.on_error,
            breaker_failures: *raw.breaker_failures.get_ref(),
            probe_interval: Duration::from_millis(*raw.probe_interval_ms.get_ref()),
            insurance: raw.insurance,
        })
    }

    fn identity(&self, raw: RawIdentity) -> Result<IdentityConfig, ConfigError> {
        let secret = match raw.ip_hash_secret_env {
            None => None,
            Some(var) => match std::env::var(var.get_ref()) {
                Ok(value) if !value.is_empty() => Some(value.into_bytes()),
                _ => {
                    return Err(self.err(
                        var.span(),
                        format!(
                        "environment variable {} is not set: ip_hash_secret_env names the variable holding \
                             the identity hash secret (every instance sharing a store needs the same one)",
                        var.get_ref()
                    ),
                    ))
                }
            },
        };
        let prefix = *raw.ipv6_prefix.get_ref();
        if !(1..=128).contains(&prefix) {
            return Err(
                self.err(raw.ipv6_prefix.span(), format!("ipv6_prefix must be 1 to 128, got {prefix}"))
            );
        }
        Ok(IdentityConfig {
            api_key_header: raw.api_key_header.map(|h| h.0),
            secret,
            trusted_proxies: self.each::<Cidr>(raw.trusted_proxies)?.into_iter().map(|c| c.0).collect(),
            forwarded_header: raw.forwarded_header.map_or(ForwardedHeader::XForwardedFor, |h| h.0),
            ipv6_prefix: prefix,
        })
    }

    fn rule(&self, spanned: Spanned<RawRule>, default_on_error: OnError) -> Result<RuleConfig, ConfigError> {
        let rule_span = spanned.span();
        let raw = spanned.into_inner();
        let name = raw.name.get_ref().clone();
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            return Err(self.err(
                raw.name.span(),
                format!("invalid rule name {name:?}: expected letters, digits, '-', '_' or '.'"),
            ));
        }
        let limits = match (raw.limits, raw.authenticated, raw.anonymous) {
            (Some(limits), None, None) => RuleLimits::Shared {
                identity: raw.identity.map_or(IdentityKind::ApiKey, |i| *i.get_ref()),
                limits: self.limits(&name, limits)?,
            },
            (None, Some(auth), Some(anon)) => {
                if let Some(identity) = raw.identity {
                    return Err(self.err(
                        identity.span(),
                        "identity applies to `limits` only: `authenticated` limits count per API key and \
                         `anonymous` limits per client IP",
                    ));
                }
                RuleLimits::Split { authenticated: self.limits(&name, auth)?, anonymous: self.limits(&name, anon)? }
            }
            (Some(limits), _, _) => {
                return Err(self.err(
                    limits.span(),
                    format!(
                        "rule {name:?} has both `limits` and `authenticated`/`anonymous`: expected either \
                         `limits` or both `authenticated` and `anonymous`"
                    ),
                ))
            }
            (None, Some(one), None) | (None, None, Some(one)) => {
                return Err(self.err(
                    one.span(),
                    format!("rule {name:?} needs both `authenticated` and `anonymous` limits, or `limits` alone"),
                ))
            }
            (None, None, None) => {
                return Err(self.err(
                    rule_span,
                    format!("rule {name:?} has no limits: expected `limits = [{{ limit = 10, window = \"1s\" }}]` or `authenticated` and `anonymous` lists"),
                ))
            }
        };
        Ok(RuleConfig {
            name,
            path: raw.path.0,
            methods: self.each::<MethodName>(raw.methods)?.into_iter().map(|m| m.0).collect(),
            limits,
            on_error: raw.on_error.unwrap_or(default_on_error),
            shadow: raw.shadow,
        })
    }

    fn limits(
        &self,
        rule: &str,
        list: Spanned<Vec<Spanned<RawLimit>>>,
    ) -> Result<Vec<LimitConfig>, ConfigError> {
        let list_span = list.span();
        let list = list.into_inner();
        if list.is_empty() {
            return Err(self.err(
                list_span,
                format!("rule {rule:?} has an empty limit list: expected at least one limit"),
            ));
        }
        let single = list.len() == 1;
        let mut out: Vec<LimitConfig> = Vec::with_capacity(list.len());
        for spanned in list {
            let span = spanned.span();
            let raw = spanned.into_inner();
            let quota = Quota::new(*raw.limit.get_ref(), raw.window.duration).map_err(|e| {
                let at = if matches!(e, slidegate::QuotaError::ZeroLimit) {
                    raw.limit.span()
                } else {
                    raw.window.span.clone()
                };
                self.err(at, format!("invalid limit: {e}"))
            })?;
            let algorithm = raw.algorithm.0 .0;
            if algorithm == Algorithm::SlidingLog && quota.permits() > sliding_log::MAX_LIMIT {
                return Err(self.err(
                    raw.limit.span(),
                    format!(
                        "invalid limit: sliding_log keeps one entry per permit, so its limit must be at most {}, \
                         got {}; use sliding_window_counter for larger limits",
                        sliding_log::MAX_LIMIT,
                        quota.permits()
                    ),
                ));
            }
            let limit = Limit::new(algorithm, quota);
            let cost = *raw.cost.get_ref();
            if cost == 0 {
                return Err(self.err(raw.cost.span(), "cost must be at least 1, got 0"));
            }
            if cost > quota.permits() {
                return Err(self.err(
                    raw.cost.span(),
                    format!("cost {cost} exceeds the limit {}: no request could ever pass", quota.permits()),
                ));
            }
            let name = match &raw.name {
                Some(n) => n.get_ref().clone(),
                None if single => rule.to_owned(),
                None => format!("{rule}-{}", raw.window.text),
            };
            if name.is_empty()
                || name.contains(['"', '\\'])
                || !name.bytes().all(|b| (0x20..=0x7e).contains(&b))
            {
                let at = raw.name.as_ref().map_or(span.clone(), Spanned::span);
                return Err(self.err(
                    at,
                    format!("invalid policy name {name:?}: expected printable ASCII without quotes"),
                ));
            }
            if let Some(dup) = out.iter().find(|l| l.name == name || l.limit == limit) {
                let what = if dup.limit == limit { "the same limit twice" } else { "two limits named alike" };
                return Err(self.err(
                    span,
                    format!("rule {rule:?} has {what} ({name:?}): give each limit its own `name` and window"),
                ));
            }
            out.push(LimitConfig { name, limit, cost });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The configuration of issue 4, word for word (also the README's).
    pub(crate) const ISSUE_EXAMPLE: &str = include_str!("../../../examples/slidegate.toml");

    /// The Redis URL the example names; tests only parse it, never connect.
    pub(crate) fn example_redis_url() -> &'static str {
        ISSUE_EXAMPLE.lines().find_map(|l| l.strip_prefix("url = \"")?.split('"').next()).unwrap()
    }

    fn err(source: &str) -> (usize, usize, String) {
        let e = Config::parse(source, "t.toml").unwrap_err();
        let (line, column) = e.location().unwrap();
        let ConfigError::Invalid { message, .. } = e else { unreachable!() };
        (line, column, message)
    }

    #[test]
    fn the_issue_example_parses_as_written() {
        std::env::set_var("SLIDEGATE_IP_SECRET", "test-secret");
        let c = Config::parse(ISSUE_EXAMPLE, "slidegate.toml").unwrap();
        assert_eq!(c.server.listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(c.store.url.as_deref(), Some(example_redis_url()));
        assert_eq!(c.store.timeout, Duration::from_millis(50));
        assert_eq!(c.store.on_error, OnError::Allow);
        assert_eq!(c.identity.api_key_header.as_ref().unwrap().as_str(), "x-api-key");
        assert_eq!(c.identity.secret.as_deref(), Some(&b"test-secret"[..]));
        assert_eq!(c.identity.trusted_proxies, vec!["127.0.0.1/32".parse::<IpNet>().unwrap()]);
        assert_eq!(c.rules.len(), 2);
        let RuleLimits::Split { authenticated, anonymous } = &c.rules[0].limits else { panic!() };
        assert_eq!((anonymous[0].name.as_str(), anonymous[0].limit.quota.permits()), ("trending", 100));
        assert_eq!(authenticated[0].limit.algorithm, Algorithm::SlidingLog);
        assert_eq!(c.rules[0].methods, vec![Method::GET]);
        let RuleLimits::Shared { identity, limits } = &c.rules[1].limits else { panic!() };
        assert_eq!(*identity, IdentityKind::ApiKey);
        let names: Vec<_> =
            limits.iter().map(|l| (l.name.as_str(), l.limit.quota.window_ms(), l.cost)).collect();
        assert_eq!(names, [("search-1s", 1000, 1), ("search-1h", 3_600_000, 1)]);
        assert_eq!(limits[0].limit.algorithm, Algorithm::SlidingWindowCounter);
    }

    #[test]
    fn unknown_keys_are_located() {
        assert_eq!(err("[store]\ntimeout_ms = 5\nretries = 3\n"), (3, 1, "unknown field `retries`, expected one of `url`, `prefix`, `timeout_ms`, `on_error`, `breaker_failures`, `probe_interval_ms`, `insurance`".into()));
        let (line, column, message) = err(
            "[[rules]]\nname = \"a\"\npath = \"/\"\nlimits = [{ limit = 1, window = \"1s\", burst = 2 }]\n",
        );
        assert_eq!((line, column), (4, 39));
        assert!(message.starts_with("unknown field `burst`"), "{message}");
    }

    #[test]
    fn bad_values_are_located_and_say_what_was_expected() {
        let rule = |limits: &str| format!("[[rules]]\nname = \"a\"\npath = \"/x\"\nlimits = [{limits}]\n");
        assert_eq!(
            err(&rule("{ limit = 1, window = \"60x\" }")),
            (4, 33, "invalid duration \"60x\": expected a whole number followed by ms, s, m, h or d, such as \"60s\"".into())
        );
        let (l, c, m) = err(&rule("{ limit = 1, window = \"1s\", algorithm = \"leaky\" }"));
        assert_eq!((l, c), (4, 51));
        assert!(m.starts_with("unknown algorithm \"leaky\": expected one of sliding_window_counter"), "{m}");
        assert_eq!(
            err(&rule("{ limit = 0, window = \"1s\" }")),
            (4, 21, "invalid limit: limit must be at least 1, got 0".into())
        );
        assert_eq!(
            err(&rule("{ limit = 5, window = \"1s\", cost = 6 }")),
            (4, 46, "cost 6 exceeds the limit 5: no request could ever pass".into())
        );
        assert_eq!(
            err(&rule("{ limit = 5, window = \"1s\", cost = 0 }")),
            (4, 46, "cost must be at least 1, got 0".into())
        );
        assert_eq!(
            err(&rule("{ limit = 1000001, window = \"1h\", algorithm = \"sliding_log\" }")),
            (
                4,
                21,
                "invalid limit: sliding_log keeps one entry per permit, so its limit must be at most 1000000, \
                 got 1000001; use sliding_window_counter for larger limits"
                    .into()
            )
        );
        assert!(Config::parse(
            &rule("{ limit = 1000000, window = \"1h\", algorithm = \"sliding_log\" }"),
            "t.toml"
        )
        .is_ok());
        assert!(Config::parse(&rule("{ limit = 1000001, window = \"1h\" }"), "t.toml").is_ok());
        assert_eq!(
            err(&rule("{ name = \"a\\u0007b\", limit = 1, window = \"1s\" }")),
            (4, 20, "invalid policy name \"a\\u{7}b\": expected printable ASCII without quotes".into())
        );
        assert_eq!(
            err(&rule("{ name = \"a\\tb\", limit = 1, window = \"1s\" }")),
            (4, 20, "invalid policy name \"a\\tb\": expected printable ASCII without quotes".into())
        );
        let (l, c, m) = err("[server]\nlisten = \"localhost\"\n");
        assert_eq!((l, c), (2, 10));
        assert!(m.contains("invalid socket address"), "{m}");
        let (l, c, m) = err("[identity]\ntrusted_proxies = [\"10.0.0.0/8\", \"10.0.0.300\"]\n");
        assert_eq!((l, c), (2, 34));
        assert!(m.starts_with("invalid trusted proxy \"10.0.0.300\""), "{m}");
        let (l, c, m) = err("[[rules]]\nname = \"a\"\npath = \"/\"\nmethods = [\"GET\", \"G-T\"]\nlimits = [{ limit = 1, window = \"1s\" }]\n");
        assert_eq!((l, c), (4, 19));
        assert!(m.starts_with("invalid method \"G-T\": expected an HTTP method"), "{m}");
        let (l, c, m) = err("[server]\nupstream = \"https://example.test\"\n");
        assert_eq!((l, c), (2, 12));
        assert!(m.contains("https is not supported"), "{m}");
        let (l, c, _) = err("[identity]\nip_hash_secret_env = \"SLIDEGATE_TEST_SURELY_UNSET\"\n");
        assert_eq!((l, c), (2, 22));
    }

    #[test]
    fn forwarded_header_defaults_to_x_forwarded_for_and_bad_values_are_located() {
        let c = Config::parse("[identity]\ntrusted_proxies = [\"10.0.0.0/8\"]\n", "t.toml").unwrap();
        assert_eq!(c.identity.forwarded_header, ForwardedHeader::XForwardedFor);
        let c = Config::parse("[identity]\nforwarded_header = \"forwarded\"\n", "t.toml").unwrap();
        assert_eq!(c.identity.forwarded_header, ForwardedHeader::Forwarded);
        let (l, c, m) = err("[identity]\nforwarded_header = \"x-real-ip\"\n");
        assert_eq!((l, c), (2, 20));
        assert!(
            m.starts_with(
                "invalid forwarded_header \"x-real-ip\": expected \"x-forwarded-for\" or \"forwarded\""
            ),
            "{m}"
        );
        let (l, c, m) = err("[identity]\nforwarded_headers = \"forwarded\"\n");
        assert_eq!((l, c), (2, 1));
        assert!(m.starts_with("unknown field `forwarded_headers`"), "{m}");
    }

    #[test]
    fn admin_listen_is_optional_and_located_when_bad() {
        let c = Config::parse("[server]\nlisten = \"127.0.0.1:8080\"\n", "t.toml").unwrap();
        assert_eq!(c.server.admin_listen, None);
        let c = Config::parse("[server]\nadmin_listen = \"127.0.0.1:9091\"\n", "t.toml").unwrap();
        assert_eq!(c.server.admin_listen, Some("127.0.0.1:9091".parse().unwrap()));
        let (l, c, m) = err("[server]\nadmin_listen = \"localhost\"\n");
        assert_eq!((l, c), (2, 16));
        assert!(m.contains("invalid socket address"), "{m}");
        let (l, c, m) = err("[server]\nlisten = \"127.0.0.1:8080\"\nadmin_listen = \"127.0.0.1:8080\"\n");
        assert_eq!((l, c), (3, 16));
        assert_eq!(m, "admin_listen 127.0.0.1:8080 is the listen address: expected another address, such as \"127.0.0.1:9091\"");
    }

    #[test]
    fn contradictory_rules_are_located() {
        let (l, c, m) = err("[[rules]]\nname = \"a\"\npath = \"/\"\n\n[[rules]]\nname = \"a\"\npath = \"/b\"\nlimits = [{ limit = 1, window = \"1s\" }]\n");
        // The first rule has no limits; it is reported at its own table.
        assert_eq!((l, c), (1, 1), "{m}");
        assert!(m.starts_with("rule \"a\" has no limits"), "{m}");
        let (l, c2, m) =
            err("[[rules]]\nname = \"a\"\npath = \"/\"\nanonymous = [{ limit = 1, window = \"1s\" }]\n");
        assert_eq!((l, c2), (4, 13));
        assert!(m.contains("needs both `authenticated` and `anonymous`"), "{m}");
        let dup = "[[rules]]\nname = \"a\"\npath = \"/\"\nlimits = [{ limit = 1, window = \"1s\" }]\n";
        let (l, c3, m) = err(&format!("{dup}\n{dup}"));
        assert_eq!((l, c3), (7, 8));
        assert_eq!(m, "duplicate rule name \"a\": rule names must be unique");
        let (l, _, m) = err("[[rules]]\nname = \"a\"\npath = \"/\"\nlimits = [{ limit = 1, window = \"1s\" }, { limit = 2, window = \"1s\" }]\n");
        assert_eq!(l, 4);
        assert!(m.contains("two limits named alike (\"a-1s\")"), "{m}");
    }

    #[test]
    fn the_error_display_names_file_line_column_and_shows_the_line() {
        let e = Config::parse("[server]\nlisten = 8080\n", "conf/slidegate.toml").unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with("conf/slidegate.toml:2:10: invalid type: integer `8080`, expected a string"),
            "{text}"
        );
        assert!(text.ends_with("2 | listen = 8080\n  |          ^^^^"), "{text}");
    }

    #[test]
    fn durations_need_a_unit() {
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
        assert!(parse_duration("60").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("1.5s").is_err());
    }
}
