//! [`ServeBody`], the one body type of every response `serve` sends.

use bytes::Bytes;
use http::Response;
use http_body_util::combinators::BoxBody;
use http_body_util::BodyExt;

/// The body of every response `serve` sends.
pub type ServeBody = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// A boxed body holding `bytes`.
pub(crate) fn full(bytes: impl Into<Bytes>) -> ServeBody {
    http_body_util::Full::new(bytes.into()).map_err(|never| match never {}).boxed()
}

/// Boxes a full-body response.
pub(crate) fn boxed(response: Response<http_body_util::Full<Bytes>>) -> Response<ServeBody> {
    response.map(|body| body.map_err(|never| match never {}).boxed())
}
