//! The messages and the service of Envoy's rate limit service API, written
//! by hand from the public definitions (`envoy/service/ratelimit/v3/rls.proto`,
//! `envoy/extensions/common/ratelimit/v3/ratelimit.proto`,
//! `envoy/config/core/v3/base.proto`): the same package, service, message
//! names and field numbers, so Envoy's client talks to it unchanged. Only the
//! fields slidegate reads or answers are written; prost skips the others on
//! the wire, as protobuf requires.

use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::codegen::{http, Body, StdError};

/// The full gRPC name of the service.
pub const SERVICE: &str = "envoy.service.ratelimit.v3.RateLimitService";
/// The path of `ShouldRateLimit`.
pub const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// `envoy.service.ratelimit.v3.RateLimitRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitRequest {
    /// The domain the descriptors are looked up in.
    #[prost(string, tag = "1")]
    pub domain: String,
    /// Each descriptor is decided; any over limit makes the request over limit.
    #[prost(message, repeated, tag = "2")]
    pub descriptors: Vec<RateLimitDescriptor>,
    /// Hits the request adds to every matched limit; 0 (unset) means 1.
    #[prost(uint32, tag = "3")]
    pub hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitDescriptor {
    /// The hierarchical entries.
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<Entry>,
    /// A limit the client asks for instead of the configured one (not honoured: see docs/envoy.md).
    #[prost(message, optional, tag = "2")]
    pub limit: Option<RateLimitOverride>,
    /// Hits for this descriptor, overriding the request's `hits_addend`
    /// (`google.protobuf.UInt64Value`).
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<u64>,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.Entry`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Entry {
    /// The descriptor key.
    #[prost(string, tag = "1")]
    pub key: String,
    /// The descriptor value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.RateLimitOverride`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitOverride {
    /// Requests per unit.
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    /// The unit (`envoy.type.v3.RateLimitUnit`, numbered as [`Unit`]).
    #[prost(enumeration = "Unit", tag = "2")]
    pub unit: i32,
}

/// `envoy.service.ratelimit.v3.RateLimitResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitResponse {
    /// Over limit when any descriptor is.
    #[prost(enumeration = "Code", tag = "1")]
    pub overall_code: i32,
    /// One status per descriptor of the request, in its order.
    #[prost(message, repeated, tag = "2")]
    pub statuses: Vec<DescriptorStatus>,
    /// Headers Envoy adds to its response (`RateLimit`, `RateLimit-Policy`).
    #[prost(message, repeated, tag = "3")]
    pub response_headers_to_add: Vec<HeaderValue>,
    /// Headers Envoy adds to the request it forwards.
    #[prost(message, repeated, tag = "4")]
    pub request_headers_to_add: Vec<HeaderValue>,
}

/// `envoy.service.ratelimit.v3.RateLimitResponse.Code`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Code {
    /// Not known.
    Unknown = 0,
    /// Under the limit.
    Ok = 1,
    /// Over the limit.
    OverLimit = 2,
}

/// `envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Unit {
    /// Not known.
    Unknown = 0,
    /// A second.
    Second = 1,
    /// A minute.
    Minute = 2,
    /// An hour.
    Hour = 3,
    /// A day.
    Day = 4,
    /// A month.
    Month = 5,
    /// A year.
    Year = 6,
    /// A week.
    Week = 7,
}

/// `envoy.service.ratelimit.v3.RateLimitResponse.RateLimit`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimit {
    /// Requests per unit.
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    /// The unit.
    #[prost(enumeration = "Unit", tag = "2")]
    pub unit: i32,
    /// A name of the limit.
    #[prost(string, tag = "3")]
    pub name: String,
}

/// `envoy.service.ratelimit.v3.RateLimitResponse.DescriptorStatus`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DescriptorStatus {
    /// This descriptor's answer.
    #[prost(enumeration = "Code", tag = "1")]
    pub code: i32,
    /// The limit that applied, if any.
    #[prost(message, optional, tag = "2")]
    pub current_limit: Option<RateLimit>,
    /// Permits left.
    #[prost(uint32, tag = "3")]
    pub limit_remaining: u32,
    /// Until the limit has all its permits again.
    #[prost(message, optional, tag = "4")]
    pub duration_until_reset: Option<prost_types::Duration>,
}

/// `envoy.config.core.v3.HeaderValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderValue {
    /// The header name.
    #[prost(string, tag = "1")]
    pub key: String,
    /// The header value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// What answers `ShouldRateLimit`.
pub trait RateLimitService: Send + Sync + 'static {
    /// Decides one request.
    fn should_rate_limit(
        &self,
        request: RateLimitRequest,
    ) -> impl std::future::Future<Output = Result<RateLimitResponse, tonic::Status>> + Send;
}

/// The gRPC server of a [`RateLimitService`]: answers `ShouldRateLimit`
/// calls ([`RateLimitServiceServer::should_rate_limit`]; `GrpcRoutes`
/// routes them here by path).
#[derive(Debug)]
pub struct RateLimitServiceServer<T> {
    inner: Arc<T>,
    max_message: usize,
}

impl<T> Clone for RateLimitServiceServer<T> {
    fn clone(&self) -> Self {
        Self { inner: Arc::clone(&self.inner), max_message: self.max_message }
    }
}

impl<T: RateLimitService> RateLimitServiceServer<T> {
    /// Serves `inner`, decoding messages of at most `max_message` bytes.
    pub fn new(inner: T, max_message: usize) -> Self {
        Self { inner: Arc::new(inner), max_message }
    }
}

impl<T> tonic::server::NamedService for RateLimitServiceServer<T> {
    const NAME: &'static str = SERVICE;
}

/// The 5 bytes before a gRPC message: whether it is compressed, its length.
const PREFIX: usize = 5;

impl<T: RateLimitService> RateLimitServiceServer<T> {
    /// Answers a call of `ShouldRateLimit` (routed here by its path): the
    /// unary call written out — the request's one message read whole,
    /// decoded, decided, and answered as one message and `grpc-status: 0`
    /// in the trailers, or as a trailers-only error — rather than through
    /// tonic's `Grpc::unary`, whose streaming decoder and encoder cost
    /// more per call than the decision itself.
    pub async fn should_rate_limit<B>(&self, request: http::Request<B>) -> http::Response<tonic::body::Body>
    where
        B: Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<StdError> + Send + 'static,
    {
        match self.answer(request).await {
            Ok(message) => unary_answer(message),
            Err(status) => status.into_http(),
        }
    }

    async fn answer<B>(&self, request: http::Request<B>) -> Result<bytes::Bytes, tonic::Status>
    where
        B: Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<StdError> + Send + 'static,
    {
        use http_body_util::BodyExt;
        use prost::Message;

        if let Some(encoding) = request.headers().get("grpc-encoding").filter(|e| e.as_bytes() != b"identity")
        {
            return Err(tonic::Status::unimplemented(format!(
                "messages compressed with {encoding:?} are not supported: send them uncompressed (identity)"
            )));
        }
        let body = http_body_util::Limited::new(request.into_body(), self.max_message + PREFIX);
        let bytes = match body.collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(err) if err.is::<http_body_util::LengthLimitError>() => {
                return Err(tonic::Status::out_of_range(format!(
                    "the request message is larger than {} bytes",
                    self.max_message
                )))
            }
            Err(err) => return Err(tonic::Status::cancelled(format!("reading the request failed: {err}"))),
        };
        let message = one_message(&bytes)?;
        let request = RateLimitRequest::decode(message)
            .map_err(|e| tonic::Status::internal(format!("the request message does not decode: {e}")))?;
        let response = self.inner.should_rate_limit(request).await?;
        let length = response.encoded_len();
        let mut framed = bytes::BytesMut::with_capacity(PREFIX + length);
        framed.extend_from_slice(&[0]);
        framed.extend_from_slice(&u32::try_from(length).unwrap_or(u32::MAX).to_be_bytes());
        response
            .encode(&mut framed)
            .map_err(|e| tonic::Status::internal(format!("encoding the answer: {e}")))?;
        Ok(framed.freeze())
    }
}

/// The one message of a unary call's body: uncompressed, and exactly as
/// long as its prefix says.
fn one_message(body: &[u8]) -> Result<&[u8], tonic::Status> {
    let Some((prefix, message)) = body.split_first_chunk::<PREFIX>() else {
        return Err(tonic::Status::internal(if body.is_empty() {
            "the call carries no request message"
        } else {
            "the request message is cut short"
        }));
    };
    if prefix[0] != 0 {
        return Err(tonic::Status::unimplemented(
            "compressed messages are not supported: send them uncompressed",
        ));
    }
    let length = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    match message.len().cmp(&length) {
        std::cmp::Ordering::Equal => Ok(message),
        std::cmp::Ordering::Less => Err(tonic::Status::internal("the request message is cut short")),
        std::cmp::Ordering::Greater => {
            Err(tonic::Status::internal("a unary call carries one request message"))
        }
    }
}

/// A unary call's answer: `message` (framed), then `grpc-status: 0`.
fn unary_answer(message: bytes::Bytes) -> http::Response<tonic::body::Body> {
    let mut trailers = http::HeaderMap::with_capacity(1);
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    let body = Unary { message: Some(message), trailers: Some(trailers) };
    let mut response = http::Response::new(tonic::body::Body::new(body));
    response
        .headers_mut()
        .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/grpc"));
    response
}

/// The body of a unary answer: one data frame, then the trailers.
struct Unary {
    message: Option<bytes::Bytes>,
    trailers: Option<http::HeaderMap>,
}

impl Body for Unary {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Some(message) = this.message.take() {
            return Poll::Ready(Some(Ok(http_body::Frame::data(message))));
        }
        Poll::Ready(this.trailers.take().map(|trailers| Ok(http_body::Frame::trailers(trailers))))
    }

    fn is_end_stream(&self) -> bool {
        self.message.is_none() && self.trailers.is_none()
    }
}

/// A client of the service (for tests, benches and tools).
#[derive(Debug, Clone)]
pub struct RateLimitServiceClient {
    inner: tonic::client::Grpc<tonic::transport::Channel>,
}

impl RateLimitServiceClient {
    /// A client over `channel`.
    pub fn new(channel: tonic::transport::Channel) -> Self {
        Self { inner: tonic::client::Grpc::new(channel) }
    }

    /// Calls `ShouldRateLimit`.
    ///
    /// # Errors
    /// The call's [`tonic::Status`].
    pub async fn should_rate_limit(
        &mut self,
        request: RateLimitRequest,
    ) -> Result<RateLimitResponse, tonic::Status> {
        self.inner.ready().await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let codec = tonic_prost::ProstCodec::<RateLimitRequest, RateLimitResponse>::default();
        let path = http::uri::PathAndQuery::from_static(SHOULD_RATE_LIMIT);
        Ok(self.inner.unary(tonic::Request::new(request), path, codec).await?.into_inner())
    }
}
