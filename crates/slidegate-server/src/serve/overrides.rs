//! Plans set per API key at run time: `PUT /v1/overrides/{key}` with
//! `{"plan": "pro", "expires_in": "1h"}` and `DELETE /v1/overrides/{key}` on
//! the admin endpoints (behind `check_token_env`), kept in the store's
//! shared table `plan-overrides` so every instance on it sees them.
//!
//! The table's field is the key's identity digest, never the key; its value
//! is the plan's name; its expiry is the override's. Each instance reads the
//! whole table about once a second in a task of its own ([`spawn_poller`])
//! into the limiter's [`PlanOverrides`](slidegate_http::PlanOverrides), and
//! the instance that took a write reads it at once; requests only look in
//! that local copy. So an override reaches every other instance within
//! about a second plus one store call; while the store cannot be read, the
//! last table read stays in force, each entry ending at its own expiry.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

use http::header::{ALLOW, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::Deserialize;
use slidegate::store::table::MAX_TABLE_TTL;
use slidegate::store::{SharedTables, TableName};
use slidegate::{Digest, Store, StoreError};
use slidegate_http::{PlanOverride, RateLimiter};

use super::bad_request;
use super::{full, ServeBody, State};
use crate::store::AnyStore;

/// The admin path overrides live under (then the key).
pub(crate) const PATH: &str = "/v1/overrides/";
/// The shared table holding them.
const TABLE: &str = "plan-overrides";
/// The largest body read.
const MAX_BODY: usize = 4 * 1024;
/// The longest key taken in the path (as a keys file line takes).
const MAX_KEY_BYTES: usize = 1024;
/// How often each instance reads the table.
pub(crate) const POLL: Duration = Duration::from_secs(1);
/// The deadline of one store call made for overrides.
const STORE_DEADLINE: Duration = Duration::from_secs(1);

/// A `PUT` body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Put {
    plan: String,
    expires_in: Option<String>,
}

fn table() -> TableName {
    // A constant valid name: `TableName::new` accepts it.
    TableName::new(TABLE).unwrap_or_else(|_| unreachable!("{TABLE} is a valid table name"))
}

/// `PUT` or `DELETE` `<admin_prefix>/v1/overrides/{key}`.
pub(crate) async fn handle(state: &State, request: Request<Incoming>, key: &str) -> Response<ServeBody> {
    let path = request.uri().path().to_owned();
    if let Some(refused) = super::token::refused(state, &request, "/v1/overrides") {
        return refused;
    }
    let method = request.method().clone();
    if method != Method::PUT && method != Method::DELETE {
        let mut response =
            bad_request(StatusCode::METHOD_NOT_ALLOWED, &path, "/v1/overrides/{key} expects PUT or DELETE");
        response.headers_mut().insert(ALLOW, HeaderValue::from_static("PUT, DELETE"));
        return response;
    }
    let limiter = state.limiter();
    let digest = match key_digest(&limiter, key) {
        Ok(digest) => digest,
        Err(detail) => return bad_request(StatusCode::BAD_REQUEST, &path, &detail),
    };
    if method == Method::DELETE {
        return delete(&limiter, digest, &path).await;
    }
    let body = match Limited::new(request.into_body(), MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(err) => {
            return bad_request(StatusCode::BAD_REQUEST, &path, &format!("cannot read the body: {err}"))
        }
    };
    let put: Put = match serde_json::from_slice(&body) {
        Ok(put) => put,
        Err(err) => {
            let detail = format!(
                "malformed override: {err}; expected {{\"plan\": \"name\", \"expires_in\": \"1h\"}} (expires_in optional)"
            );
            return bad_request(StatusCode::BAD_REQUEST, &path, &detail);
        }
    };
    put_override(&limiter, digest, put, &path).await
}

/// The digest of the key in the path: the key hashed as the limiter hashes
/// API keys, or `hash:<32 hex digits>` as given.
fn key_digest(limiter: &RateLimiter<AnyStore>, key: &str) -> Result<Digest, String> {
    if let Some(hex) = key.strip_prefix("hash:").or_else(|| key.strip_prefix("k:")) {
        let value = (hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| u128::from_str_radix(hex, 16).ok())
            .flatten();
        return value.map(|v| Digest(v.to_be_bytes())).ok_or_else(|| {
            "invalid key hash: expected hash:<32 hex digits> (`slidegate identity hash --full`)".to_owned()
        });
    }
    let why = if key.is_empty() {
        "no key: expected /v1/overrides/{key}"
    } else if key.len() > MAX_KEY_BYTES {
        "the key is longer than 1024 bytes"
    } else if key.contains('%') {
        "percent-escapes are not decoded: give a key of URL-safe characters, or its hash:<32 hex digits>"
    } else if key.contains([',', '/']) {
        "a key with ',' or '/' cannot be overridden by name: give its hash:<32 hex digits>"
    } else {
        return Ok(limiter.identity().key_digest(key.as_bytes()));
    };
    Err(why.to_owned())
}

async fn put_override(
    limiter: &RateLimiter<AnyStore>,
    digest: Digest,
    put: Put,
    path: &str,
) -> Response<ServeBody> {
    let plans = limiter.plan_names();
    if !plans.contains(&put.plan.as_str()) {
        let known = plans.iter().map(|p| format!("{p:?}")).collect::<Vec<_>>().join(", ");
        let detail = format!(
            "unknown plan {:?}: the configuration's plans are {}",
            put.plan,
            if known.is_empty() { "none".to_owned() } else { known }
        );
        return bad_request(StatusCode::UNPROCESSABLE_ENTITY, path, &detail);
    }
    let ttl = match put.expires_in.as_deref().map(slidegate_http::parse_duration) {
        None => MAX_TABLE_TTL,
        Some(Ok(ttl)) if !ttl.is_zero() && ttl <= MAX_TABLE_TTL => ttl,
        Some(Ok(_)) => {
            return bad_request(StatusCode::BAD_REQUEST, path, "expires_in must be from 1ms to ten years")
        }
        Some(Err(err)) => {
            return bad_request(StatusCode::BAD_REQUEST, path, &format!("invalid expires_in: {err}"))
        }
    };
    let Some(tables) = limiter.store().tables() else {
        return unavailable(path, &"the store keeps no shared tables");
    };
    let deadline = Some(Instant::now() + STORE_DEADLINE);
    if let Err(err) = tables.put_entry(&table(), &digest.0, put.plan.as_bytes(), ttl, deadline).await {
        return unavailable(path, &err);
    }
    // This instance applies it at once; the others at their next read.
    let _ = refresh(limiter).await;
    let expires_in_ms = put.expires_in.is_some().then_some(ttl.as_millis() as u64);
    let body = serde_json::json!({ "plan": put.plan, "expires_in_ms": expires_in_ms }).to_string();
    json(StatusCode::OK, body)
}

async fn delete(limiter: &RateLimiter<AnyStore>, digest: Digest, path: &str) -> Response<ServeBody> {
    let Some(tables) = limiter.store().tables() else {
        return unavailable(path, &"the store keeps no shared tables");
    };
    let deadline = Some(Instant::now() + STORE_DEADLINE);
    match tables.delete_entry(&table(), &digest.0, deadline).await {
        Ok(was_there) => {
            let _ = refresh(limiter).await;
            if was_there {
                json(StatusCode::OK, r#"{"deleted":true}"#.to_owned())
            } else {
                bad_request(StatusCode::NOT_FOUND, path, "no override is set for this key")
            }
        }
        Err(err) => unavailable(path, &err),
    }
}

fn unavailable(path: &str, err: &dyn std::fmt::Display) -> Response<ServeBody> {
    let detail = format!("the store did not take the change: {err}; nothing changed, try again");
    bad_request(StatusCode::SERVICE_UNAVAILABLE, path, &detail)
}

fn json(status: StatusCode, body: String) -> Response<ServeBody> {
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// Reads the table into the limiter's overrides: how many there are.
///
/// # Errors
/// The store's, when it could not be read (the overrides held stay).
pub(crate) async fn refresh(limiter: &RateLimiter<AnyStore>) -> Result<usize, StoreError> {
    let Some(tables) = limiter.store().tables() else { return Ok(0) };
    let entries = tables.read_table(&table(), Some(Instant::now() + STORE_DEADLINE)).await?;
    let now = SystemTime::now();
    let mut table = HashMap::with_capacity(entries.len());
    for entry in entries {
        // Entries this version cannot read (a field that is no digest, a
        // value that is no name) are skipped, never fatal.
        let (Ok(digest), Ok(plan)) = (<[u8; 16]>::try_from(entry.field), String::from_utf8(entry.value))
        else {
            continue;
        };
        let expires_at = (entry.expires_in < MAX_TABLE_TTL / 2).then(|| now + entry.expires_in);
        table.insert(Digest(digest), PlanOverride { plan: plan.into(), expires_at });
    }
    let count = table.len();
    limiter.plan_overrides().replace(table);
    Ok(count)
}

/// Reads the table every [`POLL`], off the request path, until aborted.
/// A failed read keeps what was read last and is logged once per outage.
pub(crate) fn spawn_poller(limiter: RateLimiter<AnyStore>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut failing = false;
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match refresh(&limiter).await {
                Ok(_) if failing => {
                    failing = false;
                    tracing::info!("plan overrides read from the store again");
                }
                Ok(_) => {}
                Err(err) if !failing => {
                    failing = true;
                    tracing::warn!(%err, "cannot read the plan overrides: the last ones read stay in force");
                }
                Err(_) => {}
            }
        }
    })
}
