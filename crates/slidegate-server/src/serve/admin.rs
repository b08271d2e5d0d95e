//! The admin endpoints: `POST /v1/check`, `GET /metrics`, `GET /healthz`,
//! `GET /readyz` (see `readiness`),
//! `GET /v1/offenders` and `GET /offenders` (the top offenders page),
//! `POST /admin/reload`, `DELETE /v1/penalty/{id}` (see `penalty.rs`),
//! `PUT`/`DELETE /v1/overrides/{key}` (see `overrides`),
//! served on the public listener or on their own.

use std::borrow::Cow;

use bytes::Bytes;
use http::header::{ALLOW, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::{Deserialize, Serialize};
use slidegate_http::headers::{self, ceil_secs};
use slidegate_http::DecisionSource;

use super::readiness::Answer;
use super::{bad_request, boxed, full, ServeBody, State};

/// The largest `/v1/check` body read.
const MAX_CHECK_BODY: usize = 16 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    Check,
    Metrics,
    Health,
    Ready,
    Offenders,
    OffendersPage,
    Reload,
    Penalty,
    /// `/v1/overrides/{key}`: the key follows the path.
    Overrides,
}

impl Endpoint {
    pub(crate) fn from_path(path: &str) -> Option<Self> {
        match path {
            "/v1/check" => Some(Endpoint::Check),
            "/metrics" => Some(Endpoint::Metrics),
            "/healthz" => Some(Endpoint::Health),
            "/readyz" => Some(Endpoint::Ready),
            "/v1/offenders" => Some(Endpoint::Offenders),
            "/offenders" => Some(Endpoint::OffendersPage),
            "/admin/reload" => Some(Endpoint::Reload),
            p if p == "/v1/penalty" || p.starts_with("/v1/penalty/") => Some(Endpoint::Penalty),
            _ if path.starts_with(super::overrides::PATH) => Some(Endpoint::Overrides),
            _ => None,
        }
    }

    fn method(self) -> Method {
        match self {
            Endpoint::Check | Endpoint::Reload => Method::POST,
            Endpoint::Penalty => Method::DELETE,
            Endpoint::Overrides => Method::PUT,
            Endpoint::Metrics
            | Endpoint::Health
            | Endpoint::Ready
            | Endpoint::Offenders
            | Endpoint::OffendersPage => Method::GET,
        }
    }

    fn allow(self) -> HeaderValue {
        match self {
            Endpoint::Check | Endpoint::Reload => HeaderValue::from_static("POST"),
            Endpoint::Penalty => HeaderValue::from_static("DELETE"),
            Endpoint::Overrides => HeaderValue::from_static("PUT, DELETE"),
            Endpoint::Metrics
            | Endpoint::Health
            | Endpoint::Ready
            | Endpoint::Offenders
            | Endpoint::OffendersPage => HeaderValue::from_static("GET, HEAD"),
        }
    }
}

/// The endpoint at `path` under the admin prefix, if any.
pub(crate) fn endpoint(state: &State, path: &str) -> Option<Endpoint> {
    path.strip_prefix(state.admin_prefix.as_str()).and_then(Endpoint::from_path)
}

/// A request on the admin listener: an admin endpoint, or 404.
pub(super) async fn handle_only_admin(state: &State, request: Request<Incoming>) -> Response<ServeBody> {
    if let Some(endpoint) = endpoint(state, request.uri().path()) {
        return handle(state, endpoint, request).await;
    }
    let path = request.uri().path();
    boxed(headers::problem(
        StatusCode::NOT_FOUND,
        "about:blank",
        "Not Found",
        &format!(
            "no admin endpoint at {path}: expected {0}/v1/check, {0}/metrics, {0}/healthz, {0}/readyz, {0}/v1/offenders, {0}/offenders, {0}/admin/reload, {0}/v1/penalty/{{id}} or {0}/v1/overrides/{{key}}",
            state.admin_prefix
        ),
        Some(path),
    ))
}

/// A `/v1/check` request. The strings borrow from the body unless JSON
/// escapes make a copy necessary.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckRequest<'a> {
    #[serde(borrow)]
    rule: Cow<'a, str>,
    #[serde(borrow)]
    key: Cow<'a, str>,
    #[serde(default = "one")]
    cost: u64,
    #[serde(default)]
    anonymous: bool,
}

fn one() -> u64 {
    1
}

/// A `/v1/check` answer.
#[derive(Debug, Serialize)]
struct CheckResponse<'a> {
    allowed: bool,
    limit: u64,
    remaining: u64,
    reset_after_ms: u64,
    retry_after_ms: Option<u64>,
    policy: &'a str,
    /// Set when the store was unavailable and the fallback limiter answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    degraded: Option<&'static str>,
    /// Set when an allow (`"allow"`) or deny (`"deny"`) list named the key:
    /// no limit was asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    listed: Option<&'static str>,
}

pub(crate) async fn handle(
    state: &State,
    endpoint: Endpoint,
    request: Request<Incoming>,
) -> Response<ServeBody> {
    if endpoint == Endpoint::Overrides {
        // Its own methods and token check; the key is the rest of the path.
        let path = request.uri().path().to_owned();
        let key = path.strip_prefix(state.admin_prefix.as_str()).unwrap_or(&path);
        let key = key.strip_prefix(super::overrides::PATH).unwrap_or_default();
        return Box::pin(super::overrides::handle(state, request, key)).await;
    }
    let method = request.method().clone();
    if method != endpoint.method() && !(method == Method::HEAD && endpoint.method() == Method::GET) {
        let mut response = bad_request(
            StatusCode::METHOD_NOT_ALLOWED,
            request.uri().path(),
            &format!("{} expects {}", request.uri().path(), endpoint.method()),
        );
        response.headers_mut().insert(ALLOW, endpoint.allow());
        return response;
    }
    match endpoint {
        Endpoint::Health => text(StatusCode::OK, "text/plain; charset=utf-8", "ok\n".into()),
        Endpoint::Ready => match Box::pin(state.readiness.answer(&state.limiter())).await {
            Answer::Ready(body) => text(StatusCode::OK, "text/plain; charset=utf-8", body),
            Answer::NotReady(detail) => {
                bad_request(StatusCode::SERVICE_UNAVAILABLE, request.uri().path(), &detail)
            }
        },
        Endpoint::Metrics => {
            let mut body = state.limiter().render_metrics();
            store_states(state, &mut body);
            state.reloader.render_metrics(&mut body);
            state.caps.render_metrics(&mut body);
            if let Some(proxy) = &state.proxy {
                proxy.render_metrics(&mut body);
            }
            if let Some(log) = &state.access_log {
                super::access_log::render_metrics(log, &mut body);
            }
            slidegate_http::Metrics::end_exposition(&mut body);
            text(StatusCode::OK, slidegate_http::Metrics::CONTENT_TYPE, body)
        }
        Endpoint::Offenders | Endpoint::OffendersPage => {
            let query = match super::offenders::Query::parse(request.uri().query()) {
                Ok(query) => query,
                Err(detail) => return bad_request(StatusCode::BAD_REQUEST, request.uri().path(), &detail),
            };
            if endpoint == Endpoint::Offenders {
                super::offenders::json(state, query)
            } else {
                super::offenders::page(state, query)
            }
        }
        // Answered above.
        Endpoint::Overrides => bad_request(StatusCode::NOT_FOUND, request.uri().path(), "no such endpoint"),
        Endpoint::Check | Endpoint::Reload | Endpoint::Penalty => {
            let name = match endpoint {
                Endpoint::Check => "/v1/check",
                Endpoint::Reload => "/admin/reload",
                _ => "/v1/penalty",
            };
            if let Some(refused) = super::token::refused(state, &request, name) {
                return refused;
            }
            // The rare endpoints boxed: their futures are large, and
            // `/v1/check`'s, inline, is moved with every decision's.
            match endpoint {
                Endpoint::Check => check(state, request).await,
                Endpoint::Reload => Box::pin(reload(state, request)).await,
                _ => Box::pin(super::penalty::lift(state, request, &state.admin_prefix)).await,
            }
        }
    }
}

/// `POST /admin/reload`: reloads the file `serve` was started with. 200 and
/// what changed, or 422 and why nothing did. The request carries nothing: a
/// configuration sent over the wire would be a second way in.
async fn reload(state: &State, request: Request<Incoming>) -> Response<ServeBody> {
    use hyper::body::Body as _;
    let path = request.uri().path().to_owned();
    if !request.body().is_end_stream() {
        return bad_request(
            StatusCode::BAD_REQUEST,
            &path,
            "POST /admin/reload takes no body: the configuration is read from the file serve was started with",
        );
    }
    let reloader = state.reloader.clone();
    // Reading and validating a file blocks: off this worker's runtime.
    let answer = match tokio::task::spawn_blocking(move || reloader.reload()).await {
        Ok(answer) => answer,
        Err(err) => return bad_request(StatusCode::INTERNAL_SERVER_ERROR, &path, &err.to_string()),
    };
    match answer {
        Ok(reloaded) => {
            let bytes = serde_json::to_vec(&reloaded).unwrap_or_default();
            let mut response = Response::new(full(Bytes::from(bytes)));
            response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            response
        }
        Err(err) => bad_request(StatusCode::UNPROCESSABLE_ENTITY, &path, &err.to_string()),
    }
}

/// `slidegate_store_states`: the (identity, limit) states held in this
/// process's memory — by the embedded store (`store="embedded"`), and by the
/// fallback that decides while Redis fails (`store="fallback"`): the gauge
/// that shows an identity rotation filling memory.
///
/// Redis's keys are not counted here, and deliberately: `DBSIZE` counts
/// every key of the database, slidegate's or another application's, and on a
/// Cluster only the node it reaches; slidegate's own keys (those under its
/// prefix) can only be counted by a `SCAN` of the whole keyspace, work in
/// proportion to the keys on the Redis that decides every request, and
/// heaviest exactly when a rotation has made it big. Redis reports its keys
/// itself (`INFO keyspace`, `redis_exporter`'s `redis_db_keys`), which is
/// slidegate's count when slidegate has a database of its own.
fn store_states(state: &State, body: &mut String) {
    use std::fmt::Write as _;
    let limiter = state.limiter();
    let embedded = match limiter.store() {
        crate::store::AnyStore::Memory(store) => Some(store.len()),
        crate::store::AnyStore::Redis(_) => None,
    };
    let fallback = limiter.fallback_store().map(slidegate::MemoryStore::len);
    if embedded.is_none() && fallback.is_none() {
        return;
    }
    // Worded without `"` or `\`, which an OpenMetrics HELP line must escape.
    body.push_str(
        "# HELP slidegate_store_states (identity, limit) states held in this process's memory, by store: \
         embedded (the embedded store) or fallback (the fallback deciding while Redis fails); \
         Redis's own keys are not counted (see its INFO keyspace).\n\
         # TYPE slidegate_store_states gauge\n",
    );
    for (store, held) in [("embedded", embedded), ("fallback", fallback)] {
        if let Some(held) = held {
            let _ = writeln!(body, "slidegate_store_states{{store=\"{store}\"}} {held}");
        }
    }
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<ServeBody> {
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

async fn check(state: &State, request: Request<Incoming>) -> Response<ServeBody> {
    let path = request.uri().path().to_owned();
    let body = match Limited::new(request.into_body(), MAX_CHECK_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(err) => {
            return bad_request(StatusCode::BAD_REQUEST, &path, &format!("cannot read the body: {err}"))
        }
    };
    let parsed: CheckRequest = match serde_json::from_slice(&body) {
        Ok(parsed) => parsed,
        Err(err) => {
            let detail = format!(
                "malformed check request: {err}; expected {{\"rule\": \"name\", \"key\": \"identity\", \"cost\": 1}}"
            );
            return bad_request(StatusCode::BAD_REQUEST, &path, &detail);
        }
    };
    let limiter = state.limiter();
    let verdict = match limiter.check_key(&parsed.rule, &parsed.key, parsed.cost, parsed.anonymous).await {
        Ok(verdict) => verdict,
        // The message names the caller's own input only: listing every
        // rule would map the configuration for whoever asks.
        Err(err) => return bad_request(StatusCode::BAD_REQUEST, &path, &err.to_string()),
    };
    let listed = match verdict.source {
        DecisionSource::AllowList(_) => Some("allow"),
        DecisionSource::DenyList(_) => Some("deny"),
        _ => None,
    };
    let answer = match verdict.decisive() {
        _ if listed.is_some() => CheckResponse {
            allowed: verdict.allowed(),
            limit: 0,
            remaining: 0,
            reset_after_ms: 0,
            retry_after_ms: None,
            policy: verdict.rule,
            degraded: None,
            listed,
        },
        Some(p) => CheckResponse {
            allowed: verdict.allowed(),
            limit: p.quota.permits(),
            remaining: p.decision.remaining,
            reset_after_ms: duration_ms(p.decision.reset_after),
            retry_after_ms: if verdict.allowed() { None } else { p.decision.retry_after.map(duration_ms) },
            policy: p.name,
            degraded: (verdict.source == DecisionSource::Fallback).then_some("fallback"),
            listed: None,
        },
        // The store failed and nobody decided: say what `on_error` chose.
        None => CheckResponse {
            allowed: verdict.allowed(),
            limit: 0,
            remaining: 0,
            reset_after_ms: 0,
            retry_after_ms: (!verdict.allowed()).then_some(1000),
            policy: verdict.rule,
            degraded: Some(if verdict.allowed() { "fail_open" } else { "fail_closed" }),
            listed: None,
        },
    };
    let bytes = serde_json::to_vec(&answer).unwrap_or_default();
    let mut response = Response::new(full(Bytes::from(bytes)));
    let legacy = limiter.legacy_headers();
    headers::apply(response.headers_mut(), &verdict, legacy);
    if !verdict.allowed() {
        // The caller relays the denial: it gets the wait as the 429 would carry it.
        if let Some(wait) = verdict.decisive().and_then(|p| p.decision.retry_after) {
            response.headers_mut().insert(http::header::RETRY_AFTER, HeaderValue::from(ceil_secs(wait)));
        }
    }
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn duration_ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_requests_borrow_plain_strings_and_unescape_the_others() {
        let plain: CheckRequest<'_> =
            serde_json::from_slice(br#"{"rule":"search","key":"user-42"}"#).unwrap();
        assert!(matches!((&plain.rule, &plain.key), (Cow::Borrowed("search"), Cow::Borrowed("user-42"))));
        assert_eq!((plain.cost, plain.anonymous), (1, false));
        // An escaped key is the same identity as the plain one.
        let escaped: CheckRequest<'_> =
            serde_json::from_slice(br#"{"rule":"se\u0061rch","key":"user-\u0034\u0032","cost":3}"#).unwrap();
        assert_eq!((&*escaped.rule, &*escaped.key, escaped.cost), ("search", "user-42", 3));
        let unknown = serde_json::from_slice::<CheckRequest<'_>>(br#"{"rule":"a","key":"b","extra":1}"#);
        assert!(unknown.unwrap_err().to_string().contains("unknown field `extra`"));
    }
}
