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
use crate::extractor::AmbiguousKey;
use crate::grpc::{self, GrpcAnswer, GrpcDenialStatus};
use crate::headers;
use crate::verdict::Verdict;

/// What [`RateLimiter::admit`] made of a request. The answer to a refused
/// request is made when asked for ([`Admission::refusal`]): an admitted
/// request, the common one, carries no response around.
#[derive(Debug)]
#[non_exhaustive]
pub struct Admission<'a> {
    /// The limiter's verdict: `None` when no rule matched, or when the
    /// request was refused before the check.
    pub verdict: Option<Verdict<'a>>,
    /// Why the request was refused before the check (a 400), if it was.
    refused: Option<&'static str>,
    /// How a gRPC call is answered; `None` for any other request.
    grpc: Option<GrpcAnswer>,
    /// Whether denials carry the `X-RateLimit-*` headers.
    legacy: bool,
    /// The client's address, after the trusted proxies (`None` without a
    /// peer): worked out once here, for everything after the admission
    /// (`serve`'s upstream share per client).
    pub client: Option<IpAddr>,
}

impl Admission<'_> {
    /// Why the request was refused before the check (its answer is a 400),
    /// if it was: a refused path or an ambiguous API key. `None` for a
    /// request that was checked, whatever the verdict.
    pub fn refused(&self) -> Option<&'static str> {
        self.refused
    }

    /// How the request is answered in gRPC's terms, if it is a gRPC call:
    /// an answer the caller makes itself (an upstream failure) must be put
    /// in them too ([`grpc::answer`]).
    pub fn grpc(&self) -> Option<&GrpcAnswer> {
        self.grpc.as_ref()
    }

    /// The answer to give instead of passing the request on, if it is not
    /// to be passed on: a refusal (400) or a denial (429, 403, 503), in
    /// gRPC's terms for a gRPC call. `path` is the request's path, the
    /// problem's `instance`.
    #[inline]
    pub fn refusal(&self, path: &str) -> Option<Response<Full<Bytes>>> {
        if self.refused.is_none() && !self.verdict.as_ref().is_some_and(Verdict::blocks) {
            return None;
        }
        self.refusal_of(path)
    }

    /// [`Admission::refusal`] of a request that is refused.
    fn refusal_of(&self, path: &str) -> Option<Response<Full<Bytes>>> {
        let response = match (self.refused, &self.verdict) {
            (Some(reason), _) => {
                headers::problem(StatusCode::BAD_REQUEST, "about:blank", "Bad Request", reason, Some(path))
            }
            (None, Some(verdict)) if verdict.blocks() => {
                headers::blocked_response(verdict, self.legacy, path)
            }
            (None, _) => return None,
        };
        Some(match &self.grpc {
            Some(how) => grpc::answer(response, how),
            None => response,
        })
    }
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
        let grpc = grpc::grpc_content_type(request.method(), request.headers())
            .map(|content_type| GrpcAnswer { denial: grpc_denial, content_type: content_type.clone() });
        let legacy = self.legacy_headers();
        self.identity().strip_header_aliases(request.headers_mut());
        let client = peer.map(|peer| self.identity().client_ip(peer, request.headers()));
        let refused = |reason, grpc| Admission { verdict: None, refused: Some(reason), grpc, legacy, client };
        let path = request.uri().path();
        if let Some(reason) = crate::refused_path(path) {
            return refused(reason, grpc);
        }
        let api_key = match self.identity().sole_api_key(request.headers()) {
            Ok(key) => key,
            Err(AmbiguousKey) => return refused(AmbiguousKey::DETAIL, grpc),
        };
        let target = request.uri().path_and_query().map_or(path, |pq| pq.as_str());
        let verdict = self.check_head(request.method(), target, client, api_key).await;
        Admission { verdict, refused: None, grpc, legacy, client }
    }
}
