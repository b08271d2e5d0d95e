//! The gRPC listener of `[server] grpc_listen`: the rate limit service and
//! the standard health service (`grpc.health.v1.Health`), over HTTP/2.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::transport::server::TcpIncoming;

use super::proto::RateLimitServiceServer;
use super::service::{Current, EnvoyService};

/// The largest request message decoded (a request carries at most
/// `MAX_DESCRIPTORS` descriptors; Envoy's are a few hundred bytes).
const MAX_MESSAGE: usize = 1 << 20;

/// The bound gRPC listener, not yet serving.
#[derive(Debug)]
pub struct GrpcListener {
    listener: TcpListener,
}

/// The running gRPC server.
#[derive(Debug)]
pub struct GrpcHandle {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl GrpcListener {
    /// Binds `addr`.
    ///
    /// # Errors
    /// What the system says when the address cannot be bound.
    pub async fn bind(addr: SocketAddr) -> std::io::Result<Self> {
        Ok(Self { listener: TcpListener::bind(addr).await? })
    }

    /// The address bound (useful with port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serves `ShouldRateLimit` and health checks, deciding by `current`,
    /// on the calling runtime until [`GrpcHandle::stop`].
    pub fn spawn(self, current: Arc<Current>) -> GrpcHandle {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let (reporter, health) = tonic_health::server::health_reporter();
            reporter.set_serving::<RateLimitServiceServer<EnvoyService>>().await;
            let service = RateLimitServiceServer::new(EnvoyService::new(current), MAX_MESSAGE);
            let incoming = TcpIncoming::from(self.listener).with_nodelay(Some(true));
            let served = tonic::transport::Server::builder()
                .add_service(health)
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(err) = served {
                tracing::error!(%err, "the gRPC listener stopped");
            }
        });
        GrpcHandle { stop, task }
    }
}

impl GrpcHandle {
    /// Stops accepting, and gives open calls up to `grace` to finish.
    pub async fn stop(self, grace: Duration) {
        let _ = self.stop.send(());
        let mut task = self.task;
        if tokio::time::timeout(grace, &mut task).await.is_err() {
            task.abort();
        }
    }
}
