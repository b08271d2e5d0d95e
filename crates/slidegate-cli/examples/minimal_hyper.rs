//! The least a hyper 1 server does, for `scripts/bench-http.sh`: measured in
//! the same run as `slidegate serve`, it shows what the machine, tokio and
//! hyper cost by themselves, so what is left is slidegate's own.
//!
//! ```text
//! cargo run --release -p slidegate-cli --example minimal_hyper -- 127.0.0.1:8080 [threads]
//! ```
//!
//! Every request gets `200` with a fixed JSON body the size of a `/v1/check`
//! answer, after its own body is read. With a thread count it runs that many
//! single-threaded runtimes accepting from one listener (like `slidegate
//! serve`'s workers); without, one multi-threaded runtime (like `serve`'s
//! admin listener).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

const ANSWER: &str = r#"{"allowed":true,"limit":1000000000,"remaining":999999999,"reset_after_ms":1000,"retry_after_ms":null,"policy":"check-1s"}"#;

async fn answer(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    // Read the body like a decision service would, then answer.
    let _ = request.into_body().collect().await;
    let mut response = Response::new(Full::new(Bytes::from_static(ANSWER.as_bytes())));
    response
        .headers_mut()
        .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    Ok(response)
}

async fn accept(listener: Arc<TcpListener>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service_fn(answer))
                .await;
        });
    }
}

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let addr: SocketAddr = args
        .next()
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| std::io::Error::other("expected an address, e.g. 127.0.0.1:8080"))?;
    let threads: Option<usize> = args.next().and_then(|t| t.parse().ok());
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    match threads {
        None => tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(async {
            accept(Arc::new(TcpListener::from_std(listener)?)).await;
            Ok(())
        }),
        Some(threads) => {
            // Single-threaded runtimes accepting from one shared listener.
            let handles: Vec<_> = (0..threads.max(1))
                .map(|_| {
                    let listener = listener.try_clone();
                    std::thread::spawn(move || -> std::io::Result<()> {
                        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                        runtime.block_on(async {
                            accept(Arc::new(TcpListener::from_std(listener?)?)).await;
                            Ok(())
                        })
                    })
                })
                .collect();
            for handle in handles {
                let _ = handle.join();
            }
            Ok(())
        }
    }
}
