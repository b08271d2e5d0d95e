//! gRPC passthrough: what `serve` says to a gRPC client itself.
//!
//! A gRPC request is decided by its path, `/package.Service/Method`, as any
//! other; rules match it as written (`path = "/shop.Cart/*"`). Its bodies
//! and trailers stream through untouched, and its `te: trailers` survives
//! the hop-by-hop stripping (gRPC requires it, and the proxy does relay
//! trailers). Which requests are gRPC calls, and how an answer `serve` makes
//! itself is put in gRPC's terms, is [`slidegate_http::grpc`]'s, shared with
//! the tower layer: the same call gets the same answer from both.

use http::header::{self, HeaderValue};
use http::{HeaderMap, Response};
pub(crate) use slidegate_http::grpc::is_grpc;
use slidegate_http::grpc::{ready_bytes, trailers_only, GrpcAnswer};

use super::{full, ServeBody};

/// `response`, an answer `serve` made itself with a problem+json body, as a
/// trailers-only gRPC answer (see [`slidegate_http::grpc`]).
pub(crate) fn answer(response: Response<ServeBody>, how: &GrpcAnswer) -> Response<ServeBody> {
    let (mut parts, body) = response.into_parts();
    trailers_only(&mut parts, &ready_bytes(body).unwrap_or_default(), how);
    Response::from_parts(parts, full(bytes::Bytes::new()))
}

/// Keeps `te: trailers` on a gRPC request whose hop-by-hop headers were
/// stripped: gRPC servers may refuse a call without it.
pub(crate) fn keep_te_trailers(headers: &mut HeaderMap) {
    headers.insert(header::TE, HeaderValue::from_static("trailers"));
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;
    use slidegate_http::grpc::GrpcDenialStatus;

    #[test]
    fn a_boxed_answer_is_put_in_grpc_terms_as_the_layer_puts_its_own() {
        let problem = || {
            slidegate_http::headers::problem(
                StatusCode::TOO_MANY_REQUESTS,
                "about:blank",
                "Too Many Requests",
                "retry in 7 s — 100% sure",
                Some("/shop.Cart/Add"),
            )
        };
        let how = GrpcAnswer::plain(GrpcDenialStatus::Unavailable);
        let ours = answer(super::super::boxed(problem()), &how);
        let layer = slidegate_http::grpc::answer(problem(), &how);
        assert_eq!(ours.status(), StatusCode::OK);
        assert_eq!(ours.headers(), layer.headers());
        assert_eq!(ours.headers()["grpc-status"], "14");
        assert_eq!(ours.headers()["grpc-message"], "retry in 7 s %E2%80%94 100%25 sure");
    }
}
