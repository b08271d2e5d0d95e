//! A gRPC call's answer when slidegate answers it itself: the tower layer
//! and `serve` alike.
//!
//! A gRPC call is a `POST` (gRPC's only method) with a gRPC content type
//! (`application/grpc`, `application/grpc+proto`, `application/grpc-web`,
//! …, in any case). A `GET` claiming one is not: a 200 answer to it could
//! be stored by a cache and its denial served to others as a success, so it
//! gets the plain HTTP answer.
//!
//! An answer slidegate makes itself — a denial, a refusal, an upstream
//! failure — is a problem+json body that a gRPC client cannot read (tonic
//! reports `INTERNAL`, others `UNKNOWN`, with no word of the wait). For a
//! gRPC call it is a trailers-only answer instead, in the call's own content
//! type (a gRPC-Web client reads `application/grpc-web…`): HTTP 200, no body,
//! `grpc-status`, `grpc-message` (the problem's detail, which names the
//! wait, percent-encoded as gRPC wants), and every header the HTTP answer
//! had — `RateLimit`, `RateLimit-Policy`, `Retry-After` — as metadata.
//!
//! The status: a rate limit denial (429) is `RESOURCE_EXHAUSTED` (8) by
//! default, or `UNAVAILABLE` (14) with [`GrpcDenialStatus::Unavailable`],
//! for clients whose retry policy retries only that; a store failing
//! closed, a saturated or unreachable upstream (502, 503) is `UNAVAILABLE`;
//! a deny list (403) is `PERMISSION_DENIED` (7); a malformed request (400)
//! `INVALID_ARGUMENT` (3); a body that stopped arriving (408)
//! `DEADLINE_EXCEEDED` (4); 401 `UNAUTHENTICATED` (16).

use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{response, HeaderMap, Method, Response, StatusCode};
use http_body::Body;
use http_body_util::Full;

/// The gRPC status of a rate limit denial of a gRPC call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum GrpcDenialStatus {
    /// `RESOURCE_EXHAUSTED` (8), what gRPC names a quota exhausted (the default).
    #[default]
    ResourceExhausted,
    /// `UNAVAILABLE` (14), for clients whose retry policy retries only that.
    Unavailable,
}

/// Whether a request is a gRPC call: see the module's docs.
pub fn is_grpc(method: &Method, headers: &HeaderMap) -> bool {
    grpc_content_type(method, headers).is_some()
}

/// The content type of a gRPC call (`application/grpc+proto`,
/// `application/grpc-web`, ...), which slidegate's own answer to it
/// carries, so that a gRPC-Web client reads it as one; `None` for a request
/// that is no gRPC call.
pub fn grpc_content_type<'h>(method: &Method, headers: &'h HeaderMap) -> Option<&'h HeaderValue> {
    const GRPC: &[u8] = b"application/grpc";
    let value = headers.get(header::CONTENT_TYPE)?;
    let prefix = value.as_bytes().get(..GRPC.len())?;
    (method == Method::POST && prefix.eq_ignore_ascii_case(GRPC)).then_some(value)
}

/// The gRPC status code of an answer slidegate made with HTTP `status`.
fn code(status: StatusCode, denial: GrpcDenialStatus) -> u8 {
    match status {
        StatusCode::TOO_MANY_REQUESTS => match denial {
            GrpcDenialStatus::ResourceExhausted => 8,
            GrpcDenialStatus::Unavailable => 14,
        },
        StatusCode::BAD_REQUEST => 3,
        StatusCode::REQUEST_TIMEOUT => 4,
        StatusCode::FORBIDDEN => 7,
        StatusCode::UNAUTHORIZED => 16,
        // 502, 503, 504 and anything else slidegate answers: the call did
        // not reach a server that could answer it.
        _ => 14,
    }
}

/// How slidegate answers one gRPC call itself: the status of a denial, and
/// the call's content type, which the answer carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcAnswer {
    /// The gRPC status of a rate limit denial.
    pub denial: GrpcDenialStatus,
    /// The call's content type (`application/grpc`, `+proto`, `-web`, ...).
    pub content_type: HeaderValue,
}

impl GrpcAnswer {
    /// `application/grpc`, denials as `denial` says.
    pub fn plain(denial: GrpcDenialStatus) -> Self {
        Self { denial, content_type: HeaderValue::from_static("application/grpc") }
    }
}

/// `response`, an answer slidegate made itself with a problem+json body, as
/// a trailers-only gRPC answer.
pub fn answer(response: Response<Full<Bytes>>, how: &GrpcAnswer) -> Response<Full<Bytes>> {
    let (mut parts, body) = response.into_parts();
    trailers_only(&mut parts, &ready_bytes(body).unwrap_or_default(), how);
    Response::from_parts(parts, Full::new(Bytes::new()))
}

/// Turns the head of an answer slidegate made, whose problem+json body was
/// `problem`, into the head of a trailers-only gRPC answer (whose body the
/// caller leaves empty).
pub fn trailers_only(parts: &mut response::Parts, problem: &[u8], how: &GrpcAnswer) {
    let detail = detail(problem).unwrap_or_else(|| parts.status.canonical_reason().unwrap_or("").to_owned());
    let status = code(parts.status, how.denial);
    let headers = &mut parts.headers;
    headers.remove(header::CONTENT_LENGTH);
    headers.insert(header::CONTENT_TYPE, how.content_type.clone());
    headers.insert(GRPC_STATUS, HeaderValue::from(u16::from(status)));
    if let Ok(message) = HeaderValue::from_str(&percent_encode(&detail)) {
        headers.insert(GRPC_MESSAGE, message);
    }
    parts.status = StatusCode::OK;
}

/// The first data frame of a body that is ready at once (every answer
/// slidegate makes is one full frame in memory: no waiting here).
pub fn ready_bytes<B: Body<Data = Bytes> + Unpin>(mut body: B) -> Option<Bytes> {
    let mut cx = Context::from_waker(Waker::noop());
    let Poll::Ready(Some(Ok(frame))) = Pin::new(&mut body).poll_frame(&mut cx) else { return None };
    frame.into_data().ok()
}

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// The `detail` of a problem+json body.
fn detail(problem: &[u8]) -> Option<String> {
    let problem: serde_json::Value = serde_json::from_slice(problem).ok()?;
    problem.get("detail")?.as_str().map(str::to_owned)
}

/// `text` as `grpc-message` carries it: bytes outside printable ASCII, and
/// `%`, as `%XX` (the gRPC over HTTP/2 spec).
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for &b in text.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            crate::rules::push_escape(&mut out, b);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn problem(status: StatusCode, detail: &str) -> Response<Full<Bytes>> {
        let mut response = crate::headers::problem(
            status,
            "about:blank",
            "Too Many Requests",
            detail,
            Some("/shop.Cart/Add"),
        );
        let headers = response.headers_mut();
        headers.insert("ratelimit", HeaderValue::from_static("\"anon\";r=0;t=7"));
        headers.insert(header::RETRY_AFTER, HeaderValue::from_static("7"));
        response
    }

    #[test]
    fn only_a_post_with_a_grpc_content_type_is_a_grpc_call() {
        for (value, grpc) in [
            ("application/grpc", true),
            ("application/grpc+proto", true),
            ("Application/GRPC-web", true),
            ("application/json", false),
            ("application/grp", false),
            ("text/application/grpc", false),
        ] {
            let mut headers = HeaderMap::new();
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(value));
            assert_eq!(is_grpc(&Method::POST, &headers), grpc, "{value}");
            assert!(!is_grpc(&Method::GET, &headers), "{value}");
            let echoed = grpc_content_type(&Method::POST, &headers).map(|v| v.to_str().unwrap());
            assert_eq!(echoed, grpc.then_some(value), "{value}");
        }
        assert!(!is_grpc(&Method::POST, &HeaderMap::new()));
    }

    #[tokio::test]
    async fn a_denial_is_a_trailers_only_answer_with_the_wait_and_the_rate_limit_metadata() {
        let detail = "policy \"anon\" allows 2 requests per 60 s; retry in 7 s — 100% sure";
        let response = answer(
            problem(StatusCode::TOO_MANY_REQUESTS, detail),
            &GrpcAnswer::plain(GrpcDenialStatus::ResourceExhausted),
        );
        assert_eq!(response.status(), StatusCode::OK);
        let h = response.headers();
        assert_eq!(h["grpc-status"], "8");
        assert_eq!(
            h["grpc-message"],
            "policy \"anon\" allows 2 requests per 60 s; retry in 7 s %E2%80%94 100%25 sure"
        );
        assert_eq!(h["content-type"], "application/grpc");
        assert_eq!(
            (&h["ratelimit"], &h["retry-after"]),
            (&HeaderValue::from_static("\"anon\";r=0;t=7"), &HeaderValue::from_static("7"))
        );
        assert!(h.get(header::CONTENT_LENGTH).is_none());
        let body = response.into_body();
        assert!(body.is_end_stream());
        assert!(body.collect().await.unwrap().to_bytes().is_empty());
    }

    #[test]
    fn the_status_follows_the_config_for_denials_and_the_answer_otherwise() {
        let status = |http, denial| {
            let response = answer(problem(http, "x"), &GrpcAnswer::plain(denial));
            response.headers()["grpc-status"].to_str().unwrap().to_owned()
        };
        assert_eq!(status(StatusCode::TOO_MANY_REQUESTS, GrpcDenialStatus::Unavailable), "14");
        assert_eq!(status(StatusCode::TOO_MANY_REQUESTS, GrpcDenialStatus::ResourceExhausted), "8");
        assert_eq!(status(StatusCode::SERVICE_UNAVAILABLE, GrpcDenialStatus::ResourceExhausted), "14");
        assert_eq!(status(StatusCode::BAD_GATEWAY, GrpcDenialStatus::ResourceExhausted), "14");
        assert_eq!(status(StatusCode::FORBIDDEN, GrpcDenialStatus::ResourceExhausted), "7");
        assert_eq!(status(StatusCode::BAD_REQUEST, GrpcDenialStatus::ResourceExhausted), "3");
        assert_eq!(status(StatusCode::REQUEST_TIMEOUT, GrpcDenialStatus::ResourceExhausted), "4");
        assert_eq!(status(StatusCode::UNAUTHORIZED, GrpcDenialStatus::ResourceExhausted), "16");
    }

    #[test]
    fn the_answer_carries_the_calls_content_type() {
        let how = GrpcAnswer {
            denial: GrpcDenialStatus::Unavailable,
            content_type: HeaderValue::from_static("application/grpc-web+proto"),
        };
        let response = answer(problem(StatusCode::TOO_MANY_REQUESTS, "x"), &how);
        assert_eq!(response.headers()["content-type"], "application/grpc-web+proto");
        assert_eq!(response.headers()["grpc-status"], "14");
    }

    #[test]
    fn a_body_that_is_not_a_problem_gives_the_reason_phrase() {
        let response = Response::builder()
            .status(StatusCode::SERVICE_UNAVAILABLE)
            .body(Full::new(Bytes::from_static(b"not json")))
            .unwrap();
        let response = answer(response, &GrpcAnswer::plain(GrpcDenialStatus::ResourceExhausted));
        assert_eq!(response.headers()["grpc-message"], "Service Unavailable");
        assert_eq!(response.headers()["grpc-status"], "14");
    }
}
