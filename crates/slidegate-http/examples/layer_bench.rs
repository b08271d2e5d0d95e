//! The bench server of `scripts/bench-layer.sh`: one axum 0.8 app, rate
//! limited by slidegate's `RateLimitLayer` (embedded `MemoryStore`) or by
//! `tower_governor` 0.8, each keyed by the `x-api-key` header and set up the
//! way their docs show a new user, on a single-threaded tokio runtime.
//!
//! ```text
//! cargo run --release -p slidegate-http --example layer_bench -- \
//!     --limiter slidegate|slidegate-map-request|slidegate-bare|slidegate-no-legacy|governor|governor-headers [--limit N] 127.0.0.1:PORT
//! ```
//!
//! - `slidegate`: the layer reading the peer from axum's `ConnectInfo`
//!   (`RateLimitLayer::peer_from`, as its docs show). Headers on.
//! - `slidegate-map-request`: the layer as `examples/axum.rs` sets it up,
//!   with the `map_request` that copies `ConnectInfo` into `PeerAddr`.
//! - `slidegate-bare`: the layer with no peer at all, to show what reading
//!   it costs (every request here carries an API key).
//! - `slidegate-no-legacy`: `slidegate` with `headers.legacy = false`: two
//!   header lines on an allowed response (`RateLimit-Policy`, `RateLimit`)
//!   instead of five, to show what the `X-RateLimit-*` trio costs.
//! - `governor`: `GovernorLayer` with a header key extractor, default
//!   configuration: no headers on allowed responses; a 429 carries
//!   `retry-after` and `x-ratelimit-after`.
//! - `governor-headers`: the same with `use_headers()` (`x-ratelimit-limit`
//!   and `x-ratelimit-remaining` on every response).
//!
//! `--limit N` allows N requests per identity per hour (default 1,000,000,000:
//! far above what a run sends). One route, `/`, answers a short body.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use axum::extract::{ConnectInfo, Request};
use axum::routing::get;
use axum::{middleware, Router};
use http::HeaderValue;
use slidegate::{Algorithm, Limit, MemoryStore, Quota};
use slidegate_http::config::{IdentityKind, LimitConfig, RuleConfig, RuleLimits};
use slidegate_http::{LimiterConfig, PeerAddr, RateLimitLayer, RateLimiter};
use tokio::net::TcpListener;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::KeyExtractor;
use tower_governor::{GovernorError, GovernorLayer};

/// Which limiter guards the app.
#[derive(Debug, Clone, Copy)]
enum Limiter {
    Slidegate,
    SlidegateMapRequest,
    SlidegateBare,
    SlidegateNoLegacy,
    Governor,
    GovernorHeaders,
}

impl Limiter {
    fn named(name: &str) -> Option<Self> {
        Some(match name {
            "slidegate" => Limiter::Slidegate,
            "slidegate-map-request" => Limiter::SlidegateMapRequest,
            "slidegate-bare" => Limiter::SlidegateBare,
            "slidegate-no-legacy" => Limiter::SlidegateNoLegacy,
            "governor" => Limiter::Governor,
            "governor-headers" => Limiter::GovernorHeaders,
            _ => return None,
        })
    }
}

/// The key tower_governor limits by: the `x-api-key` header, as its
/// `custom_key_bearer` example reads a bearer token.
#[derive(Debug, Clone, Copy)]
struct ApiKey;

impl KeyExtractor for ApiKey {
    type Key = String;

    fn extract<T>(&self, request: &http::Request<T>) -> Result<String, GovernorError> {
        request
            .headers()
            .get("x-api-key")
            .and_then(|value: &HeaderValue| value.to_str().ok())
            .map(str::to_owned)
            .ok_or(GovernorError::UnableToExtractKey)
    }
}

/// Copies axum's `ConnectInfo` to the `PeerAddr` slidegate's layer reads.
async fn peer_addr(ConnectInfo(addr): ConnectInfo<SocketAddr>, mut request: Request) -> Request {
    request.extensions_mut().insert(PeerAddr(addr));
    request
}

fn routes() -> Router {
    Router::new().route("/", get(|| async { "ok\n" }))
}

fn app(limiter: Limiter, limit: u64) -> Result<Router, String> {
    match limiter {
        Limiter::Slidegate
        | Limiter::SlidegateMapRequest
        | Limiter::SlidegateBare
        | Limiter::SlidegateNoLegacy => {
            // One rule, "api": `limit` an hour per API key (else per client address).
            let quota = Quota::new(limit, Duration::from_secs(3600)).map_err(|e| e.to_string())?;
            let limit = Limit::new(Algorithm::SlidingWindowCounter, quota);
            let limits = vec![LimitConfig::new("api", limit, 1).map_err(|e| e.to_string())?];
            let mut config = LimiterConfig::default();
            config.identity.api_key_header = Some(http::HeaderName::from_static("x-api-key"));
            config.headers.legacy = !matches!(limiter, Limiter::SlidegateNoLegacy);
            let path = "/*".parse().map_err(|e: slidegate_http::PathPatternError| e.to_string())?;
            config.rules.push(RuleConfig::new(
                "api",
                path,
                RuleLimits::Shared { identity: IdentityKind::ApiKey, limits },
            ));
            let rate_limiter =
                RateLimiter::from_config(&config, MemoryStore::new()).map_err(|e| e.to_string())?;
            let layer = RateLimitLayer::new(rate_limiter);
            Ok(match limiter {
                Limiter::Slidegate | Limiter::SlidegateNoLegacy => routes()
                    .layer(layer.peer_from(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|info| info.0))),
                Limiter::SlidegateMapRequest => {
                    routes().layer(layer).layer(middleware::map_request(peer_addr))
                }
                _ => routes().layer(layer),
            })
        }
        Limiter::Governor | Limiter::GovernorHeaders => {
            // `limit` per hour: a burst of `limit`, refilled one per hour / limit.
            let burst = u32::try_from(limit)
                .map_err(|_| format!("--limit {limit}: governor takes at most {}", u32::MAX))?;
            let period = Duration::from_secs(3600) / burst.max(1);
            let mut builder = GovernorConfigBuilder::default().key_extractor(ApiKey);
            builder.period(period.max(Duration::from_nanos(1))).burst_size(burst);
            Ok(match limiter {
                Limiter::Governor => {
                    let config = builder.finish().ok_or("governor: a zero limit")?;
                    routes().layer(GovernorLayer::new(config))
                }
                _ => {
                    let config = builder.use_headers().finish().ok_or("governor: a zero limit")?;
                    routes().layer(GovernorLayer::new(config))
                }
            })
        }
    }
}

struct Args {
    limiter: Limiter,
    limit: u64,
    addr: String,
}

fn parse_args() -> Result<Args, String> {
    let mut limiter = None;
    let mut limit = 1_000_000_000;
    let mut addr = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--limiter" => {
                let name = args.next().unwrap_or_default();
                limiter = Some(Limiter::named(&name).ok_or_else(|| {
                    format!("--limiter {name:?}: expected slidegate, slidegate-map-request, slidegate-bare, slidegate-no-legacy, governor or governor-headers")
                })?);
            }
            "--limit" => {
                let value = args.next().unwrap_or_default();
                limit =
                    value.parse().map_err(|_| format!("--limit {value:?}: expected a positive integer"))?;
            }
            _ if addr.is_none() => addr = Some(arg),
            _ => return Err(format!("unexpected argument {arg:?}")),
        }
    }
    Ok(Args {
        limiter: limiter.ok_or("--limiter is required")?,
        limit,
        addr: addr.ok_or("the address to listen on is required")?,
    })
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("layer_bench: {message}\nusage: layer_bench --limiter slidegate|slidegate-map-request|slidegate-bare|slidegate-no-legacy|governor|governor-headers [--limit N] ADDR");
            return ExitCode::from(64);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("layer_bench: no runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let served = runtime.block_on(async {
        let app = app(args.limiter, args.limit)?;
        let listener = TcpListener::bind(&args.addr).await.map_err(|e| format!("{}: {e}", args.addr))?;
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
            .await
            .map_err(|e| e.to_string())
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("layer_bench: {message}");
            ExitCode::FAILURE
        }
    }
}
