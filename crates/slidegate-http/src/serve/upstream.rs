//! The connections of one worker thread to the upstream: HTTP/1.1 keep-alive,
//! reused once a response body has been read to its end.
//!
//! Each worker thread has its own pool, so the lock below is never contended;
//! it is there because tasks must be `Send`. A connection goes back to the
//! pool when its response body ends; a body dropped half-read takes its
//! connection with it (HTTP/1.1 cannot reuse it).

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::uri::Authority;
use http::{Request, Response};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;

/// How long a new upstream connection may take.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Idle connections kept per worker thread.
const MAX_IDLE: usize = 256;

/// Why the upstream could not answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpstreamError {
    #[error("cannot connect to the upstream: {0}")]
    Connect(#[from] std::io::Error),
    #[error("upstream HTTP error: {0}")]
    Http(#[from] hyper::Error),
}

/// A pool of HTTP/1.1 connections to one upstream.
pub(crate) struct Upstream {
    authority: Authority,
    host: String,
    port: u16,
    idle: Mutex<Vec<SendRequest<Incoming>>>,
}

impl Upstream {
    pub(crate) fn new(authority: Authority) -> Arc<Self> {
        let host = authority.host().trim_start_matches('[').trim_end_matches(']').to_owned();
        let port = authority.port_u16().unwrap_or(80);
        Arc::new(Self { authority, host, port, idle: Mutex::new(Vec::new()) })
    }

    /// The upstream's `host:port`, for requests that came without `Host`.
    pub(crate) fn authority(&self) -> &Authority {
        &self.authority
    }

    /// Sends `request` (origin-form URI) on a pooled or new connection.
    pub(crate) async fn send(
        self: &Arc<Self>,
        request: Request<Incoming>,
    ) -> Result<Response<PooledBody>, UpstreamError> {
        let mut sender = self.checkout().await?;
        let response = sender.send_request(request).await?;
        let pool = Arc::clone(self);
        Ok(response.map(|body| PooledBody { body, sender: Some(sender), pool }))
    }

    async fn checkout(&self) -> Result<SendRequest<Incoming>, UpstreamError> {
        loop {
            let pooled = self.idle.lock().unwrap_or_else(PoisonError::into_inner).pop();
            let Some(mut sender) = pooled else { break };
            // A connection the upstream closed while idle fails here, and is dropped.
            if !sender.is_closed() && sender.ready().await.is_ok() {
                return Ok(sender);
            }
        }
        let connect = tokio::net::TcpStream::connect((self.host.as_str(), self.port));
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, connect).await.map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out connecting to the upstream")
        })??;
        stream.set_nodelay(true)?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(%err, "upstream connection ended with an error");
            }
        });
        Ok(sender)
    }

    fn release(&self, sender: SendRequest<Incoming>) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < MAX_IDLE {
            idle.push(sender);
        }
    }
}

/// A response body from the upstream that returns its connection to the pool at its end.
pub(crate) struct PooledBody {
    body: Incoming,
    sender: Option<SendRequest<Incoming>>,
    pool: Arc<Upstream>,
}

impl PooledBody {
    fn finish(&mut self) {
        if let Some(sender) = self.sender.take() {
            self.pool.release(sender);
        }
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let frame = Pin::new(&mut this.body).poll_frame(cx);
        match &frame {
            Poll::Ready(None) => this.finish(),
            Poll::Ready(Some(Ok(_))) if this.body.is_end_stream() => this.finish(),
            Poll::Ready(Some(Err(_))) => drop(this.sender.take()),
            _ => {}
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for PooledBody {
    fn drop(&mut self) {
        // Bodies known to be empty (204, 304, HEAD) are never polled.
        if self.body.is_end_stream() {
            self.finish();
        }
    }
}
