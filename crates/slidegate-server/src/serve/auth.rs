//! The forward-auth endpoint (`[server] auth_listen`): a proxy's auth hook
//! — nginx `auth_request`, Traefik `forwardAuth`, Caddy `forward_auth` —
//! asks here whether a request may pass, and the request is decided as
//! `serve`'s proxy decides one (`RateLimiter::admit`: rules, identities,
//! lists, plans, the penalty box, breadth, delay), without its body.
//!
//! The hook's request carries the original request's headers and names
//! its method and target in headers of its own: `X-Forwarded-Method` and
//! `X-Forwarded-Uri` (Traefik, Caddy), or `X-Original-Method` and
//! `X-Original-URI` (nginx, set in its snippet). Only a trusted proxy
//! (`[identity] trusted_proxies`) may ask: from anyone else the same
//! headers would let a client name another client's address. The client's
//! address is then read from `X-Forwarded-For` as for any request through
//! a trusted proxy, so a spoofed entry the client sent is never believed.
//!
//! Answers, on `/`: 200 with the rate limit headers when the request may
//! pass (for the proxy to copy to the upstream and the client), the
//! refusal as `serve` would give it otherwise (429 with `Retry-After`, the
//! rate limit headers and the problem; 403; 400; 503). On `/nginx`, for
//! `auth_request`, which understands only 2xx, 401 and 403: a rate limit
//! denial is 401 and every other refusal 403, with the same headers and
//! `X-Slidegate-Status` naming the status it stands for (a malformed or
//! ambiguous hook request included: nginx would answer any other status
//! with a 500 of its own); the snippet in docs/forward-auth.md turns a 401
//! back into the client's 429. An untrusted peer's connection is closed
//! after its 403.

use std::net::SocketAddr;

use http::header::HeaderName;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri};
use hyper::body::Incoming;
use slidegate_http::grpc::GrpcDenialStatus;
use slidegate_http::headers::RateHeaders;

use super::body::{boxed, full};
use super::{bad_request, ServeBody, State};

/// The status a refusal stands for, on an `/nginx` answer.
pub(crate) static X_SLIDEGATE_STATUS: HeaderName = HeaderName::from_static("x-slidegate-status");

/// Where the hooks name the original method, and the original target.
const METHOD_HEADERS: [&str; 2] = ["x-forwarded-method", "x-original-method"];
const TARGET_HEADERS: [&str; 2] = ["x-forwarded-uri", "x-original-uri"];

/// Answers one hook request from `peer`.
pub(super) async fn handle(
    state: &State,
    request: Request<Incoming>,
    peer: SocketAddr,
) -> Response<ServeBody> {
    let path = request.uri().path().to_owned();
    let nginx = match path.as_str() {
        "/" => false,
        "/nginx" => true,
        _ => {
            return bad_request(
                StatusCode::NOT_FOUND,
                &path,
                "the forward-auth listener answers / (Traefik, Caddy) and /nginx (nginx auth_request)",
            )
        }
    };
    let response = decide(state, request, peer, &path).await;
    if nginx {
        for_nginx(response)
    } else {
        response
    }
}

/// The answer to a hook request on `path`, as `/` gives it.
async fn decide(
    state: &State,
    request: Request<Incoming>,
    peer: SocketAddr,
    path: &str,
) -> Response<ServeBody> {
    let limiter = state.limiter();
    if !limiter.identity().is_trusted(peer.ip()) {
        let mut refusal = bad_request(
            StatusCode::FORBIDDEN,
            path,
            &format!(
                "{} is not a trusted proxy: forward-auth requests are taken from [identity] trusted_proxies only",
                peer.ip().to_canonical()
            ),
        );
        // Nothing a stranger sends next will be answered otherwise: its
        // connection is not kept.
        refusal.headers_mut().insert(http::header::CONNECTION, HeaderValue::from_static("close"));
        return refusal;
    }
    let mut headers = request.into_parts().0.headers;
    let original = match original(&mut headers) {
        Ok(original) => original,
        Err(detail) => return bad_request(StatusCode::BAD_REQUEST, path, &detail),
    };
    let mut request = Request::new(());
    *request.method_mut() = original.0;
    *request.uri_mut() = original.1;
    *request.headers_mut() = headers;
    let admission = limiter.admit(&mut request, Some(peer.ip()), GrpcDenialStatus::default()).await;
    let target = request.uri().path();
    match admission.refusal(target) {
        Some(refusal) => boxed(refusal),
        None => {
            let mut response = Response::new(full(""));
            if let Some(verdict) = &admission.verdict {
                RateHeaders::of(verdict, limiter.legacy_headers()).insert_into(response.headers_mut());
            }
            response
        }
    }
}

/// `response` in the statuses nginx's `auth_request` understands: 2xx as
/// it is, a rate limit denial as 401 and every other refusal (a malformed
/// or ambiguous hook request, an untrusted peer, a failing store) as 403,
/// with `X-Slidegate-Status` naming the status it stands for. Any other
/// status would make nginx answer its client 500.
fn for_nginx(mut response: Response<ServeBody>) -> Response<ServeBody> {
    let stands_for = response.status();
    if stands_for.is_success() {
        return response;
    }
    *response.status_mut() = if stands_for == StatusCode::TOO_MANY_REQUESTS {
        StatusCode::UNAUTHORIZED
    } else {
        StatusCode::FORBIDDEN
    };
    response.headers_mut().insert(X_SLIDEGATE_STATUS.clone(), HeaderValue::from(stands_for.as_u16()));
    response
}

/// The original request's method and target, from the hook's headers
/// (removed from `headers`); or what is missing or wrong.
fn original(headers: &mut HeaderMap) -> Result<(Method, Uri), String> {
    let method = one_of(headers, &METHOD_HEADERS)?;
    let target = one_of(headers, &TARGET_HEADERS)?;
    for name in METHOD_HEADERS.iter().chain(&TARGET_HEADERS) {
        headers.remove(*name);
    }
    let (Some(method), Some(target)) = (method, target) else {
        return Err("the hook request must name the original request: X-Forwarded-Method and X-Forwarded-Uri \
                    (Traefik, Caddy), or X-Original-Method and X-Original-URI (nginx: see docs/forward-auth.md)"
            .to_owned());
    };
    let method = Method::from_bytes(method.as_bytes())
        .map_err(|_| format!("the original method {method:?} is not an HTTP method"))?;
    if !target.as_bytes().starts_with(b"/") {
        return Err(format!(
            "the original target {target:?} is not a path: expected one such as \"/api/x?y=1\""
        ));
    }
    let target = target
        .to_str()
        .ok()
        .and_then(|t| t.parse::<Uri>().ok())
        .ok_or_else(|| format!("the original target {target:?} is not a request target"))?;
    Ok((method, target))
}

/// The value of whichever of `names` the hook sent, once; an error when one
/// is sent twice, or two disagree.
fn one_of(headers: &HeaderMap, names: &[&str]) -> Result<Option<HeaderValue>, String> {
    let mut found: Option<&HeaderValue> = None;
    for name in names {
        let mut values = headers.get_all(*name).iter();
        let Some(value) = values.next() else { continue };
        if values.next().is_some() {
            return Err(format!("{name} is sent twice: which request to decide is ambiguous"));
        }
        match found {
            Some(other) if other != value => {
                return Err(format!("{} disagree: which request to decide is ambiguous", names.join(" and ")))
            }
            _ => found = Some(value),
        }
    }
    Ok(found.cloned())
}
