//! Parsers of single TOML values: each turns one string into one typed value,
//! with an error that says what form was expected.

use std::fmt;
use std::net::IpAddr;
use std::ops::Range;
use std::str::FromStr;
use std::time::Duration;

use http::Method;
use ipnet::IpNet;
use serde::de::{self, Deserializer};
use serde::Deserialize;
use slidegate::Algorithm;
use slidegate_http::config::{parse_duration, TimeSpan};
use toml::Spanned;

/// A value parsed from a TOML string with [`FromStr`], the parse error
/// reported at the value's position.
pub(super) struct Parsed<T>(pub(super) T);

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

/// An algorithm by its configuration name; `sliding_window_counter` when unnamed.
pub(super) struct AlgorithmName(pub(super) Algorithm);

impl Default for AlgorithmName {
    fn default() -> Self {
        AlgorithmName(Algorithm::SlidingWindowCounter)
    }
}

impl Default for Parsed<AlgorithmName> {
    fn default() -> Self {
        Parsed(AlgorithmName::default())
    }
}

impl FromStr for AlgorithmName {
    type Err = slidegate::UnknownAlgorithm;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(AlgorithmName)
    }
}

/// Why a value of a rule's `methods` is not an HTTP method.
#[derive(Debug, thiserror::Error)]
pub(super) enum MethodError {
    #[error("invalid method {0:?}: expected an HTTP method such as \"GET\" or \"POST\"")]
    NotLetters(String),
    #[error("invalid method {0:?}: {1}")]
    Invalid(String, http::method::InvalidMethod),
}

/// An HTTP method, written in any case.
pub(super) struct MethodName(pub(super) Method);

impl FromStr for MethodName {
    type Err = MethodError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let upper = s.to_ascii_uppercase();
        if upper.is_empty() || !upper.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(MethodError::NotLetters(s.to_owned()));
        }
        Method::from_bytes(upper.as_bytes())
            .map(MethodName)
            .map_err(|e| MethodError::Invalid(s.to_owned(), e))
    }
}

/// Why a trusted proxy is neither a CIDR block nor an address.
#[derive(Debug, thiserror::Error)]
#[error("invalid trusted proxy {0:?}: expected a CIDR block such as \"10.0.0.0/8\" or an address")]
pub(super) struct CidrError(String);

/// A CIDR block; a bare address is its own /32 or /128.
pub(super) struct Cidr(pub(super) IpNet);

impl FromStr for Cidr {
    type Err = CidrError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(net) = s.parse::<IpNet>() {
            return Ok(Cidr(net.trunc()));
        }
        s.parse::<IpAddr>().map(|ip| Cidr(IpNet::from(ip))).map_err(|_| CidrError(s.to_owned()))
    }
}

/// A rate-limit window as written (`"60s"`): its length, its text (which
/// names unnamed limits) and where it was.
#[derive(Debug, Clone)]
pub(super) struct WindowValue {
    pub(super) duration: Duration,
    pub(super) text: String,
    pub(super) span: Range<usize>,
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

/// A [`TimeSpan`] written as a whole number of milliseconds (`timeout_ms = 50`).
#[derive(Debug, Clone)]
pub(super) struct Millis {
    pub(super) delay: TimeSpan,
    pub(super) span: Range<usize>,
}

impl<'de> Deserialize<'de> for Millis {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let spanned = Spanned::<u64>::deserialize(d)?;
        Ok(Millis { delay: TimeSpan::from_millis(*spanned.get_ref()), span: spanned.span() })
    }
}
