//! The admin token: `Authorization: Bearer <token>` compared in constant
//! time, and the 401 an endpoint that requires it answers without it.

use http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use http::{HeaderValue, Request, Response, StatusCode};

use super::{bad_request, ServeBody, State};

/// The 401 for a request to `name` without the configured token (`None`:
/// the token matches, or none is configured).
pub(super) fn refused<B>(state: &State, request: &Request<B>, name: &str) -> Option<Response<ServeBody>> {
    let token = state.check_token.as_ref()?;
    if bearer_matches(request.headers(), token) {
        return None;
    }
    let mut response = bad_request(
        StatusCode::UNAUTHORIZED,
        request.uri().path(),
        &format!("{name} requires the bearer token: expected Authorization: Bearer <token>"),
    );
    response.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    Some(response)
}

fn bearer_matches(headers: &http::HeaderMap, token: &str) -> bool {
    let Some(given) = headers.get(AUTHORIZATION).map(HeaderValue::as_bytes) else { return false };
    let given = match given.get(..7) {
        Some(scheme) if scheme.eq_ignore_ascii_case(b"bearer ") => given[7..].trim_ascii(),
        _ => return false,
    };
    constant_time_eq(given, token.as_bytes())
}

/// Compares in time that depends on the lengths only, never on where the
/// bytes first differ: a caller timing the 401s learns nothing of the token
/// byte by byte.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_bearer_token_matches() {
        let with = |value: &'static str| {
            let mut h = http::HeaderMap::new();
            h.insert(AUTHORIZATION, HeaderValue::from_static(value));
            h
        };
        assert!(bearer_matches(&with("Bearer s3cret"), "s3cret"));
        assert!(bearer_matches(&with("bearer s3cret"), "s3cret"));
        for wrong in ["Bearer s3cre", "Bearer s3cret2", "Bearer S3cret", "Basic s3cret", "s3cret", "Bearer "]
        {
            assert!(!bearer_matches(&with(wrong), "s3cret"), "{wrong}");
        }
        assert!(!bearer_matches(&http::HeaderMap::new(), "s3cret"));
    }
}
