//! Response headers and bodies: draft-ietf-httpapi-ratelimit-headers-11,
//! the legacy `X-RateLimit-*` trio, 429 with `Retry-After`, RFC 9457 problems.
//!
//! Seconds are always rounded up: a client that waits the announced time
//! must find the quota back.

use std::time::Duration;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use http_body_util::Full;

use crate::lists::ListScope;
use crate::verdict::{DecisionSource, PolicyResult, SetValues, Verdict};

/// `RateLimit-Policy`.
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`.
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `X-RateLimit-Limit`.
pub static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`.
pub static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset` (seconds until reset).
pub static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// The problem type of draft-ietf-httpapi-ratelimit-headers for an exceeded quota.
pub const QUOTA_EXCEEDED_TYPE: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// The problem type of draft-ietf-httpapi-ratelimit-headers (section 5.3)
/// for a client refused because of an abusive pattern: the penalty box.
pub const ABNORMAL_USAGE_TYPE: &str =
    "https://iana.org/assignments/http-problem-types#abnormal-usage-detected";

/// `d` in whole seconds, rounded up.
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_nanos().div_ceil(1_000_000_000).try_into().unwrap_or(u64::MAX)
}

/// Where header values are rendered: a growing `Vec`, or the fixed buffer
/// of one response's values ([`Inline`]).
trait Out {
    fn put(&mut self, bytes: &[u8]);
    fn len(&self) -> usize;
}

impl Out for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }

    fn len(&self) -> usize {
        Vec::len(self)
    }
}

/// Room for one response's rendered values in [`Inline`]: a rule's usual
/// few policies with short names fit; more spill into a `Vec`.
const INLINE: usize = 240;

/// A fixed buffer that notes when something did not fit, so the caller
/// renders again into a `Vec`. The owner of the bytes every value of one
/// response is a slice of: one allocation for all of them.
struct Inline {
    bytes: [u8; INLINE],
    len: usize,
    overflowed: bool,
}

impl Inline {
    fn new() -> Self {
        Self { bytes: [0; INLINE], len: 0, overflowed: false }
    }
}

impl Out for Inline {
    fn put(&mut self, bytes: &[u8]) {
        match self.bytes.get_mut(self.len..self.len + bytes.len()) {
            Some(room) => {
                room.copy_from_slice(bytes);
                self.len += bytes.len();
            }
            None => self.overflowed = true,
        }
    }

    fn len(&self) -> usize {
        self.len
    }
}

impl AsRef<[u8]> for Inline {
    fn as_ref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// `00` to `99`: [`push_u64`] writes two digits per division.
const DIGIT_PAIRS: [u8; 200] = {
    let mut pairs = [0u8; 200];
    let mut i = 0;
    while i < 100 {
        pairs[2 * i] = b'0' + (i / 10) as u8;
        pairs[2 * i + 1] = b'0' + (i % 10) as u8;
        i += 1;
    }
    pairs
};

/// Appends `n` in decimal: header values are built per request, without the
/// formatting machinery.
fn push_u64(out: &mut impl Out, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    while n >= 10 {
        let pair = (n % 100) as usize * 2;
        n /= 100;
        i -= 2;
        digits[i..i + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
    }
    // The last pair was `10..=99` (no leading zero), or one digit is left.
    if n > 0 || i == digits.len() {
        i -= 1;
        digits[i] = b'0' + n as u8;
    }
    out.put(&digits[i..]);
}

fn push_policy(out: &mut impl Out, i: usize, name: &str, quota: &slidegate::Quota) {
    if i > 0 {
        out.put(b", ");
    }
    out.put(b"\"");
    out.put(name.as_bytes());
    out.put(b"\";q=");
    push_u64(out, quota.permits());
    out.put(b";w=");
    push_u64(out, ceil_secs(quota.window()).max(1));
}

fn policy_items<'p, 'a: 'p>(out: &mut impl Out, policies: impl Iterator<Item = &'p PolicyResult<'a>>) {
    for (i, p) in policies.enumerate() {
        push_policy(out, i, p.name, &p.quota);
    }
}

/// Writes `RateLimit` items; returns where the numbers of `decisive`'s item
/// (`r` and `t`) lie in `out`, when it is among `policies`.
fn ratelimit_items<'p, 'a: 'p>(
    out: &mut impl Out,
    policies: impl Iterator<Item = &'p PolicyResult<'a>>,
    decisive: Option<&PolicyResult<'a>>,
) -> Option<[std::ops::Range<usize>; 2]> {
    let mut numbers = None;
    for (i, p) in policies.enumerate() {
        if i > 0 {
            out.put(b", ");
        }
        out.put(b"\"");
        out.put(p.name.as_bytes());
        out.put(b"\";r=");
        let remaining = out.len();
        push_u64(out, p.decision.remaining);
        let remaining = remaining..out.len();
        out.put(b";t=");
        let reset = out.len();
        push_u64(out, ceil_secs(p.decision.reset_after));
        if decisive.is_some_and(|d| std::ptr::eq(d, p)) {
            numbers = Some([remaining, reset..out.len()]);
        }
    }
    numbers
}

/// `RateLimit-Policy` items: `"name";q=10;w=1, "name2";q=500;w=3600`.
/// `w` must be a positive integer, so sub-second windows announce 1.
pub fn policy_header(policies: &[&PolicyResult<'_>]) -> String {
    let mut out = Vec::with_capacity(64);
    policy_items(&mut out, policies.iter().copied());
    String::from_utf8_lossy(&out).into_owned()
}

/// `RateLimit` items: `"name";r=9;t=1`.
pub fn ratelimit_header(policies: &[&PolicyResult<'_>]) -> String {
    let mut out = Vec::with_capacity(48);
    ratelimit_items(&mut out, policies.iter().copied(), None);
    String::from_utf8_lossy(&out).into_owned()
}

fn number(n: u64) -> HeaderValue {
    HeaderValue::from(n)
}

fn value(bytes: Vec<u8>) -> Option<HeaderValue> {
    HeaderValue::from_maybe_shared(Bytes::from(bytes)).ok()
}

/// The rate limit headers of one verdict, rendered: every policy when
/// allowed, the violated ones when denied; `X-RateLimit-*` (when `legacy`)
/// for the binding policy; `Retry-After` on a denial that blocks.
///
/// Rendered where the verdict is (it borrows the limiter) and inserted into
/// the response later, straight into the response's own map: no second map
/// to build and merge per request. The values made per request are written
/// into one buffer, and each is a slice of it: one allocation per response.
#[derive(Debug, Default)]
pub struct RateHeaders {
    values: [Option<HeaderValue>; 6],
}

/// Where each value of [`RateHeaders::values`] lies in the buffer it was
/// rendered into (`None`: not rendered).
type Spans = [Option<std::ops::Range<usize>>; 6];

/// The names of [`RateHeaders::values`], in order.
const RATE_HEADER_NAMES: [&HeaderName; 6] = [
    &RATELIMIT_POLICY,
    &RATELIMIT,
    &X_RATELIMIT_LIMIT,
    &X_RATELIMIT_REMAINING,
    &X_RATELIMIT_RESET,
    &RETRY_AFTER,
];

impl RateHeaders {
    /// The headers of `verdict`.
    pub fn of(verdict: &Verdict, legacy: bool) -> Self {
        let mut values: [Option<HeaderValue>; 6] = Default::default();
        let Some(decisive) = verdict.decisive() else { return Self { values } };
        if let Some(set) = verdict.set_values {
            if verdict.allowed() {
                // Every policy of the set, as the limiter rendered it once.
                values[0] = Some(set.policy.clone());
            }
            if legacy {
                let index = verdict.policies.iter().position(|p| std::ptr::eq(p, decisive));
                values[2] = index.and_then(|i| set.limits.get(i)).cloned();
            }
        }
        let rendered = Rendered { policies: values[0].is_none(), limit: values[2].is_none() };
        let mut inline = Inline::new();
        let spans = render(verdict, legacy, rendered, &mut inline);
        let (bytes, spans) = if inline.overflowed {
            let mut out = Vec::with_capacity(2 * INLINE);
            let spans = render(verdict, legacy, rendered, &mut out);
            (Bytes::from(out), spans)
        } else {
            (Bytes::from_owner(inline), spans)
        };
        for (value, span) in values.iter_mut().zip(spans) {
            if let Some(span) = span {
                // Policy names are validated ASCII without quotes, so these are valid values.
                *value = HeaderValue::from_maybe_shared(bytes.slice(span)).ok();
            }
        }
        Self { values }
    }

    /// Whether there is nothing to add (no rule matched, or nobody decided).
    pub fn is_empty(&self) -> bool {
        self.values.iter().all(Option::is_none)
    }

    /// Inserts the headers into `headers`, each replacing a value of the same name.
    pub fn insert_into(self, headers: &mut HeaderMap) {
        if self.is_empty() {
            return;
        }
        // Room for every header at once, and for the `content-length` a
        // framework adds after the layer (axum's routes do): a map grown
        // while full moves every entry, one grown now moves the few it has.
        headers.reserve(self.values.iter().flatten().count() + 1);
        for (name, value) in RATE_HEADER_NAMES.into_iter().zip(self.values) {
            if let Some(value) = value {
                headers.insert(name.clone(), value);
            }
        }
    }
}

/// Which of the values the limiter may have rendered once are rendered per
/// response.
#[derive(Clone, Copy)]
struct Rendered {
    /// `RateLimit-Policy`.
    policies: bool,
    /// `X-RateLimit-Limit`.
    limit: bool,
}

/// Writes the values of `verdict`'s headers made per request into `out`,
/// `RateLimit-Policy` and `X-RateLimit-Limit` only as `rendered` says (else
/// the limiter's rendering of them is used).
fn render(verdict: &Verdict, legacy: bool, rendered: Rendered, out: &mut impl Out) -> Spans {
    let mut spans: Spans = Default::default();
    let Some(decisive) = verdict.decisive() else { return spans };
    let allowed = verdict.allowed();
    let shown = || verdict.policies.iter().filter(|p| allowed || !p.decision.allowed);
    if rendered.policies {
        let from = out.len();
        policy_items(out, shown());
        spans[0] = Some(from..out.len());
    }
    let from = out.len();
    let decisive_numbers = ratelimit_items(out, shown(), Some(decisive));
    spans[1] = Some(from..out.len());
    if legacy {
        if rendered.limit {
            let from = out.len();
            push_u64(out, decisive.quota.permits());
            spans[2] = Some(from..out.len());
        }
        // `X-RateLimit-Remaining` and `-Reset` are the decisive policy's
        // `r` and `t`: the same bytes, sliced from its `RateLimit` item.
        let numbers = decisive_numbers.unwrap_or_else(|| {
            [decisive.decision.remaining, ceil_secs(decisive.decision.reset_after)].map(|n| {
                let from = out.len();
                push_u64(out, n);
                from..out.len()
            })
        });
        let [remaining, reset] = numbers;
        spans[3] = Some(remaining);
        spans[4] = Some(reset);
    }
    if let Some(wait) = decisive.decision.retry_after.filter(|_| verdict.blocks()) {
        let from = out.len();
        push_u64(out, ceil_secs(wait));
        spans[5] = Some(from..out.len());
    }
    spans
}

/// Adds the rate limit headers of `verdict` to `headers`; see [`RateHeaders`].
pub fn apply(headers: &mut HeaderMap, verdict: &Verdict, legacy: bool) {
    RateHeaders::of(verdict, legacy).insert_into(headers);
}

/// The values of a policy set's headers that never change, rendered once
/// when the limiter is built: `RateLimit-Policy` items of every policy, and
/// each policy's `X-RateLimit-Limit`.
pub(crate) fn set_values<'a>(
    policies: impl Iterator<Item = (&'a str, slidegate::Quota)>,
) -> Option<SetValues> {
    let mut out = Vec::new();
    let mut limits = Vec::new();
    for (i, (name, quota)) in policies.enumerate() {
        push_policy(&mut out, i, name, &quota);
        limits.push(number(quota.permits()));
    }
    Some(SetValues { policy: value(out)?, limits })
}

/// An RFC 9457 problem, members in the order the RFC lists them.
#[derive(serde::Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    title: &'a str,
    status: u16,
    detail: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    instance: Option<&'a str>,
    #[serde(rename = "violated-policies", skip_serializing_if = "Option::is_none")]
    violated_policies: Option<Vec<&'a str>>,
}

/// An `application/problem+json` response.
pub fn problem(
    status: StatusCode,
    kind: &str,
    title: &str,
    detail: &str,
    instance: Option<&str>,
) -> Response<Full<Bytes>> {
    problem_with(Problem { kind, title, status: status.as_u16(), detail, instance, violated_policies: None })
}

fn problem_with(problem: Problem<'_>) -> Response<Full<Bytes>> {
    let bytes = serde_json::to_vec(&problem).unwrap_or_default();
    let mut response = Response::new(Full::new(Bytes::from(bytes)));
    *response.status_mut() =
        StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// The response to a request `verdict` blocks: 429 naming the violated
/// policy, 503 when the store failed and the rule fails closed, or 403 when
/// a deny list names the client.
pub fn blocked_response(verdict: &Verdict, legacy: bool, path: &str) -> Response<Full<Bytes>> {
    if let DecisionSource::DenyList(scope) = verdict.source {
        return listed_denial(scope, verdict.rule, path);
    }
    let Some(decisive) = verdict.violated().max_by_key(|p| p.decision.retry_after) else {
        let mut response = problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "about:blank",
            "Service Unavailable",
            &format!("the rate limit store is unavailable and rule {:?} fails closed", verdict.rule),
            Some(path),
        );
        response.headers_mut().insert(RETRY_AFTER, number(1));
        return response;
    };
    let wait = ceil_secs(decisive.decision.retry_after.unwrap_or_default());
    if verdict.blocked {
        let detail = format!(
            "denied too often under rule {:?}: blocked for abnormal usage; retry in {wait} s",
            verdict.rule
        );
        let mut response = problem_with(Problem {
            kind: ABNORMAL_USAGE_TYPE,
            title: "Request not satisfied due to detection of abnormal request pattern",
            status: StatusCode::TOO_MANY_REQUESTS.as_u16(),
            detail: &detail,
            instance: Some(path),
            violated_policies: Some(verdict.violated().map(|p| p.name).collect()),
        });
        apply(response.headers_mut(), verdict, legacy);
        return response;
    }
    let detail = match verdict.over_in_flight {
        Some(max) => format!(
            "at most {max} requests of one client may be in flight under rule {:?}; retry in {wait} s",
            verdict.rule
        ),
        None => format!(
            "policy {:?} allows {} requests per {}; retry in {} s",
            decisive.name,
            decisive.quota.permits(),
            window_text(decisive.quota.window()),
            wait
        ),
    };
    let mut response = problem_with(Problem {
        kind: QUOTA_EXCEEDED_TYPE,
        title: "Request cannot be satisfied as assigned quota has been exceeded",
        status: StatusCode::TOO_MANY_REQUESTS.as_u16(),
        detail: &detail,
        instance: Some(path),
        violated_policies: Some(verdict.violated().map(|p| p.name).collect()),
    });
    apply(response.headers_mut(), verdict, legacy);
    response
}

/// 403 for a client a deny list names: no rate limit headers, no
/// `Retry-After` (waiting changes nothing); the detail says which list, not
/// which entry.
fn listed_denial(scope: ListScope, rule: &str, path: &str) -> Response<Full<Bytes>> {
    let detail = match scope {
        ListScope::Global => "the client is on the deny list".to_owned(),
        ListScope::Rule => format!("the client is on the deny list of rule {rule:?}"),
    };
    problem(StatusCode::FORBIDDEN, "about:blank", "Forbidden", &detail, Some(path))
}

/// `1 s`, `60 s`, `1 h`, `250 ms`: a window as a reader would write it.
fn window_text(window: Duration) -> String {
    let ms = window.as_millis();
    match ms {
        ms if ms % 3_600_000 == 0 => format!("{} h", ms / 3_600_000),
        ms if ms % 1000 == 0 => format!("{} s", ms / 1000),
        ms => format!("{ms} ms"),
    }
}

#[cfg(test)]
mod tests;
