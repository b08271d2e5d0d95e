//! `DELETE /v1/penalty/{id}[?rule=NAME]`: lifts an identity's penalty block
//! on every instance sharing the store (`slidegate_http::lift`). `{id}` is
//! the full form the offenders page and `slidegate identity hash --full`
//! show, `k:<32 hex>` or `ip:<32 hex>`; without `rule`, every rule with a
//! penalty. 204 when a block was lifted, 404 when there was none, 400 for a
//! malformed id or query, an unknown rule or one without a penalty, 503 when
//! the store fails (nothing may have been lifted: retry).

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use slidegate_http::lift::LiftError;
use slidegate_http::offenders::IdentityHash;

use super::bad_request;
use super::{full, ServeBody, State};

/// The longest rule name a query may carry: longer is no rule's.
const MAX_RULE: usize = 256;

/// Handles the lift; the method and the token were checked.
pub(super) async fn lift(state: &State, request: Request<Incoming>, prefix: &str) -> Response<ServeBody> {
    use hyper::body::Body as _;
    let path = request.uri().path();
    let shown: String = path.chars().take(120).collect();
    if !request.body().is_end_stream() {
        return bad_request(StatusCode::BAD_REQUEST, &shown, "DELETE /v1/penalty/{id} takes no body");
    }
    let id = path.strip_prefix(prefix).and_then(|p| p.strip_prefix("/v1/penalty")).unwrap_or_default();
    let Some(id) = id.strip_prefix('/').filter(|id| !id.is_empty()) else {
        return bad_request(
            StatusCode::BAD_REQUEST,
            &shown,
            "expected /v1/penalty/{id}, {id} as the offenders page shows it: k:<32 hex digits> or ip:<32 hex digits>",
        );
    };
    let id = id.replace("%3A", ":").replace("%3a", ":");
    let hash: IdentityHash = match id.parse() {
        Ok(hash) => hash,
        Err(err) => return bad_request(StatusCode::BAD_REQUEST, &shown, &err.to_string()),
    };
    let rule = match rule_of(request.uri().query()) {
        Ok(rule) => rule,
        Err(detail) => return bad_request(StatusCode::BAD_REQUEST, &shown, &detail),
    };
    let limiter = state.limiter();
    match limiter.lift_penalty(hash, rule.as_deref()).await {
        Ok(lifted) if lifted.is_empty() => {
            let under = rule.map_or_else(|| "under any rule".to_owned(), |r| format!("under rule {r:?}"));
            bad_request(StatusCode::NOT_FOUND, &shown, &format!("{} is not blocked {under}", hash.id()))
        }
        Ok(lifted) => {
            for l in &lifted {
                tracing::info!(
                    identity = %hash.id(),
                    rule = %l.rule,
                    blocked_for_ms = l.blocked_for.as_millis() as u64,
                    "penalty block lifted"
                );
            }
            let mut response = Response::new(full(String::new()));
            *response.status_mut() = StatusCode::NO_CONTENT;
            response
        }
        Err(err @ (LiftError::Store(_) | LiftError::NoTables)) => {
            bad_request(StatusCode::SERVICE_UNAVAILABLE, &shown, &format!("{err}; retry"))
        }
        Err(err) => bad_request(StatusCode::BAD_REQUEST, &shown, &err.to_string()),
    }
}

/// The `rule` of the query, if any; any other parameter is refused.
fn rule_of(query: Option<&str>) -> Result<Option<String>, String> {
    let Some(query) = query.filter(|q| !q.is_empty()) else { return Ok(None) };
    let mut rule = None;
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("rule", name)) if rule.is_none() && !name.is_empty() && name.len() <= MAX_RULE => {
                let decoded = percent_decode(name).ok_or("rule=: malformed percent-encoding")?;
                rule = Some(decoded);
            }
            _ => {
                let shown: String = pair.chars().take(60).collect();
                return Err(format!(
                    "query {shown:?}: DELETE /v1/penalty/{{id}} takes only ?rule=NAME (once, 1 to {MAX_RULE} bytes)"
                ));
            }
        }
    }
    Ok(rule)
}

/// `text` with `%XX` escapes and `+` decoded, if it is valid UTF-8 after.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = text.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_names_one_rule_or_none() {
        assert_eq!(rule_of(None), Ok(None));
        assert_eq!(rule_of(Some("")), Ok(None));
        assert_eq!(rule_of(Some("rule=login")), Ok(Some("login".into())));
        assert_eq!(rule_of(Some("rule=a%20b")), Ok(Some("a b".into())));
        for bad in ["rule=", "rule=a&rule=b", "x=1", "rule", "rule=%zz", "rule=%ff"] {
            assert!(rule_of(Some(bad)).is_err(), "{bad}");
        }
        assert!(rule_of(Some(&format!("rule={}", "r".repeat(257)))).is_err());
    }
}
