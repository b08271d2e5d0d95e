//! One worker thread: serves the connections the acceptor deals it, and
//! routes each request to the admin endpoints or the proxy.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;

use super::body::ServeBody;
use super::{admin, proxy, State};
use crate::config::Delay;

/// A connection handed to a worker thread.
pub(super) type Accepted = (std::net::TcpStream, SocketAddr);

/// Serves the connections it is dealt until the acceptor closes the channel,
/// then waits up to `grace` for them to finish.
pub(super) async fn worker(
    mut connections: tokio::sync::mpsc::UnboundedReceiver<Accepted>,
    state: Arc<State>,
    grace: Delay,
) {
    let graceful = GracefulShutdown::new();
    // hyper arms a 30 s header-read timer per request (slowloris protection).
    // tokio wakes its driver through an eventfd whenever a new timer is due
    // before every other one — with no other timer, that is every request.
    // A timer that always fires within a second keeps the driver's next wake
    // early, so arming the 30 s timers costs no system call.
    let heartbeat = tokio::spawn(async {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tick.tick().await;
        }
    });
    while let Some((stream, peer)) = connections.recv().await {
        let stream = match tokio::net::TcpStream::from_std(stream) {
            Ok(stream) => stream,
            Err(err) => {
                tracing::warn!(%err, "cannot register a connection");
                continue;
            }
        };
        let state = Arc::clone(&state);
        let peer_value = proxy::forwarded_for_value(peer);
        let service = service_fn(move |request: Request<Incoming>| {
            let state = Arc::clone(&state);
            let peer_value = peer_value.clone();
            async move { Ok::<_, Infallible>(handle(&state, request, peer, &peer_value).await) }
        });
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(%err, %peer, "connection ended with an error");
            }
        });
    }
    heartbeat.abort();
    tokio::select! {
        () = graceful.shutdown() => tracing::debug!("all connections of this worker closed"),
        () = tokio::time::sleep(grace.get()) => tracing::warn!("grace period over: closing the remaining connections"),
    }
}

/// One request on the public listener: an admin endpoint when they are
/// served here, otherwise decided and forwarded.
async fn handle(
    state: &State,
    request: Request<Incoming>,
    peer: SocketAddr,
    peer_value: &http::HeaderValue,
) -> Response<ServeBody> {
    if state.admin_here {
        if let Some(endpoint) = admin::endpoint(state, request.uri().path()) {
            return admin::handle(state, endpoint, request).await;
        }
    }
    proxy::forward(state, request, peer, peer_value).await
}
