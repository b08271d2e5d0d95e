//! The least a hyper 1 reverse proxy does, for BENCHMARKS.md's profile of
//! `slidegate serve` ("Where a proxied request's CPU goes"): what proxying
//! with hyper costs before anything `serve` adds, and whether driving the
//! upstream connection in the client connection's own task saves anything.
//!
//! ```text
//! cargo run --release -p slidegate-cli --example minimal_hyper_proxy -- spawn|inline LISTEN UPSTREAM
//! ```
//!
//! One thread, one current-thread runtime (like `serve` with `threads = 1`).
//! Each client connection gets one upstream HTTP/1.1 connection of its own,
//! opened at its first request and kept alive; requests are forwarded with
//! `Connection` dropped and nothing else touched. With `spawn` the upstream
//! connection runs as a task of its own (as `serve`'s pool does); with
//! `inline` it is polled in the client connection's task, each of the two
//! connections polled only when its own waker fired.

use std::cell::RefCell;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use hyper::body::Incoming;
use hyper::client::conn::http1 as client;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

type Upstream = client::Connection<TokioIo<TcpStream>, Incoming>;

/// One client connection's upstream connection.
#[derive(Default)]
struct Pinned {
    sender: Option<client::SendRequest<Incoming>>,
    /// With `inline`: the connection, polled by the client connection's task.
    connection: Option<Pin<Box<Upstream>>>,
}

/// A wake-up of one of the futures a task polls: noted, then passed on.
struct Child {
    woken: AtomicBool,
    task: Mutex<Option<Waker>>,
}

impl Wake for Child {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        if let Some(task) = self.task.lock().unwrap_or_else(std::sync::PoisonError::into_inner).as_ref() {
            task.wake_by_ref();
        }
    }
}

fn child() -> (Arc<Child>, Waker) {
    let child = Arc::new(Child { woken: AtomicBool::new(true), task: Mutex::new(None) });
    let waker = Waker::from(Arc::clone(&child));
    (child, waker)
}

/// The client connection and its upstream connection, in one task.
struct Both<S> {
    server: Pin<Box<S>>,
    pinned: Rc<RefCell<Pinned>>,
    /// The server's, the upstream's.
    children: [(Arc<Child>, Waker); 2],
}

impl<S: Future> Future for Both<S> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        for (child, _) in &this.children {
            let mut task = child.task.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if !task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
                *task = Some(cx.waker().clone());
            }
        }
        // Whether the upstream connection there is has been polled: one
        // opened by a poll of the server is polled at once, unasked.
        let mut seen = this.pinned.borrow().connection.is_some();
        loop {
            let mut polled = false;
            let upstream = &this.children[1];
            let opened = !seen && this.pinned.borrow().connection.is_some();
            if upstream.0.woken.swap(false, Ordering::AcqRel) || opened {
                polled = true;
                let mut pinned = this.pinned.borrow_mut();
                if let Some(connection) = pinned.connection.as_mut() {
                    if connection.as_mut().poll(&mut Context::from_waker(&upstream.1)).is_ready() {
                        *pinned = Pinned::default();
                    }
                }
                seen = pinned.connection.is_some();
            }
            let server = &this.children[0];
            if server.0.woken.swap(false, Ordering::AcqRel) {
                polled = true;
                if this.server.as_mut().poll(&mut Context::from_waker(&server.1)).is_ready() {
                    return Poll::Ready(());
                }
            }
            if !polled {
                return Poll::Pending;
            }
        }
    }
}

async fn forward(
    pinned: Rc<RefCell<Pinned>>,
    upstream: SocketAddr,
    inline: bool,
    request: Request<Incoming>,
) -> Result<Response<Incoming>, Box<dyn std::error::Error + Send + Sync>> {
    let kept = pinned.borrow_mut().sender.take();
    let mut sender = match kept {
        Some(sender) => sender,
        None => {
            let stream = TcpStream::connect(upstream).await?;
            stream.set_nodelay(true)?;
            let (sender, connection) = client::handshake(TokioIo::new(stream)).await?;
            if inline {
                pinned.borrow_mut().connection = Some(Box::pin(connection));
            } else {
                tokio::task::spawn_local(async move {
                    let _ = connection.await;
                });
            }
            sender
        }
    };
    sender.ready().await?;
    let (mut parts, body) = request.into_parts();
    parts.headers.remove(http::header::CONNECTION);
    let response = sender.send_request(Request::from_parts(parts, body)).await;
    pinned.borrow_mut().sender = Some(sender);
    Ok(response?)
}

async fn proxy(listener: TcpListener, upstream: SocketAddr, inline: bool) {
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let _ = stream.set_nodelay(true);
        let pinned = Rc::new(RefCell::new(Pinned::default()));
        let for_requests = Rc::clone(&pinned);
        let service = service_fn(move |request| forward(Rc::clone(&for_requests), upstream, inline, request));
        let server =
            hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
        if inline {
            tokio::task::spawn_local(Both { server: Box::pin(server), pinned, children: [child(), child()] });
        } else {
            tokio::task::spawn_local(async move {
                let _ = server.await;
            });
        }
    }
}

fn main() -> std::io::Result<()> {
    let usage = || std::io::Error::other("usage: minimal_hyper_proxy spawn|inline LISTEN UPSTREAM");
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [mode, listen, upstream] = args.as_slice() else { return Err(usage()) };
    let inline = match mode.as_str() {
        "spawn" => false,
        "inline" => true,
        _ => return Err(usage()),
    };
    let listen: SocketAddr = listen.parse().map_err(|_| usage())?;
    let upstream: SocketAddr = upstream.parse().map_err(|_| usage())?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async {
        let listener = TcpListener::bind(listen).await?;
        proxy(listener, upstream, inline).await;
        Ok(())
    })
}
