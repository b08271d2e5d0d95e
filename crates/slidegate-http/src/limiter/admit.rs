//! One admission pipeline for every surface a whole HTTP request reaches:
//! the tower layer and `serve`'s proxy call [`RateLimiter::admit`] and add
//! only their own I/O around it. Every step that does not depend on how the
//! request arrived or where it goes is here, in this order:
//!
//! 1. header clean-up: other spellings of the headers that say who the
//!    client is (`x_api_key`, `x_forwarded_for`) are removed, so what is
//!    served is who was counted ([`crate::IdentityExtractor::strip_header_aliases`]);
//! 2. a path no rule may be matched against safely (an encoded NUL:
//!    [`crate::refused_path`]) is refused with a 400;
//! 3. an ambiguous API key (the header twice, or one value with a comma) is
//!    refused with a 400: which key the upstream would use is its choice;
//! 4. the check itself: lists, plans, breadth, the rules' limits, delay;
//! 5. a verdict that blocks becomes its denial (429, 403, 503).
//!
//! A refusal of a gRPC call ([`crate::grpc::is_grpc`]) is in gRPC's terms,
//! whichever step refused it.

use std::net::IpAddr;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use slidegate::Store;

use super::RateLimiter;
use crate::grpc::{self, GrpcDenialStatus};
use crate::headers;
use crate::verdict::Verdict;

/// What [`RateLimiter::admit`] made of a request.
#[derive(Debug)]
#[non_exhaustive]
pub struct Admission<'a> {
    /// The limiter's verdict: `None` when no rule matched, or when the
    /// request was refused before the check.
    pub verdict: Option<Verdict<'a>>,
    /// The answer to give instead of passing the request on: a refusal
    /// (400) or a denial, in gRPC's terms for a gRPC call.
    pub refusal: Option<Response<Full<Bytes>>>,
    /// Whether the request is a gRPC call: an answer the caller makes
    /// itself (an upstream failure) must be put in gRPC's terms too.
    pub grpc: bool,
}

impl<S: Store + 'static> RateLimiter<S> {
    /// Admits `request` from `peer` (the socket's address; the identity
    /// configuration's trusted proxy headers are read after it), or refuses
    /// it: see the module's docs for the steps. The request's headers are
    /// cleaned up in place; what reaches the inner service or the upstream
    /// is what was decided on.
    pub async fn admit<B>(
        &self,
        request: &mut Request<B>,
        peer: Option<IpAddr>,
        grpc_denial: GrpcDenialStatus,
    ) -> Admission<'_> {
        let grpc = grpc::is_grpc(request.method(), request.headers());
        let refuse = |response: Response<Full<Bytes>>| match grpc {
            true => grpc::answer(response, grpc_denial),
            false => response,
        };
        self.identity().strip_header_aliases(request.headers_mut());
        let path = request.uri().path();
        let refused = crate::refused_path(path).or_else(|| {
            self.identity().api_key_is_ambiguous(request.headers()).then_some(
                "the API key header must appear once, with one value (no comma): \
                 which of several keys the upstream uses is its choice, not slidegate's",
            )
        });
        if let Some(reason) = refused {
            let response =
                headers::problem(StatusCode::BAD_REQUEST, "about:blank", "Bad Request", reason, Some(path));
            return Admission { verdict: None, refusal: Some(refuse(response)), grpc };
        }
        let target = request.uri().path_and_query().map_or(path, |pq| pq.as_str());
        let verdict = self.check_request(request.method(), target, request.headers(), peer).await;
        let refusal = verdict
            .as_ref()
            .filter(|v| v.blocks())
            .map(|v| refuse(headers::blocked_response(v, self.legacy_headers(), path)));
        Admission { verdict, refusal, grpc }
    }
}
