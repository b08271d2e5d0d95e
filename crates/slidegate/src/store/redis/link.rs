//! The connection a [`super::RedisStore`] decides on, and how it comes back.
//!
//! The `redis` crate's `ConnectionManager` reconnects by itself, but every
//! caller awaits the reconnect in progress, retries included: with Redis
//! dead, each call waited ~9.5 s of growing back-off. Here the state is
//! explicit instead: while the connection is known to be down a call fails
//! at once with [`Unavailable::NotConnected`](crate::Unavailable::NotConnected) (nothing was sent, so nothing
//! was charged), and one background task reconnects with a short, capped
//! back-off, so the first call after Redis returns finds a connection.
//!
//! A thread that drives its own tokio runtime (each of `serve`'s workers)
//! may ask for connections of its own ([`drive_connections_here`]): its
//! calls then go out on a *lane*, a connection whose reads and writes run
//! on that thread, so that a reply wakes its caller without waking another
//! thread, and the replies read in one go finish their calls in one go (an
//! HTTP/2 connection then writes all their answers in one write). A lane
//! is opened in the background under the shared connection's generation,
//! on the server that connection reached, and used only while that
//! generation is live. A lane whose connection fails is closed alone (the
//! thread's next calls take the shared connection, whose own failure, if
//! Redis is gone, marks the link down: calls then fail at once as before);
//! after a reconnect each lane opens again. Until its lane is open, a
//! thread uses the shared connection. A lane of a dropped store, or of a
//! generation gone, is closed at the thread's next call, or when the
//! thread ends.

use crate::Unavailable;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ErrorKind, RedisError, ServerErrorKind};
use tokio::sync::oneshot::error::TryRecvError;

use super::target::Source;
use super::RedisOptions;
use crate::store::StoreError;

/// A shared, reconnecting connection. Clones share it.
#[derive(Clone)]
pub(super) struct Link {
    shared: Arc<Shared>,
}

struct Shared {
    /// Where to connect: asked again at each reconnect, so that a Sentinel
    /// target follows its master through a failover.
    source: Source,
    options: RedisOptions,
    /// The live connection and its generation, or `None` while down.
    conn: RwLock<Option<(u64, MultiplexedConnection)>>,
    /// Generations number connections, so a failure seen on an old one does
    /// not take down its replacement.
    generation: AtomicU64,
    /// Whether the reconnect task runs (at most one at a time).
    reconnecting: AtomicBool,
    /// The address of the live connection (`host:port`), for a Sentinel
    /// target's watch to see that the sentinels name another master.
    addr: RwLock<String>,
}

/// How often a Sentinel target asks the sentinels whether the master moved.
/// A manual or forced failover can leave the old master writable for
/// seconds before it is demoted (and answers `READONLY`); asking keeps the
/// store off a master its sentinels have given up.
const SENTINEL_POLL: Duration = Duration::from_millis(250);

impl Link {
    /// Connects now, within the options' connect timeout.
    pub(super) async fn connect(source: Source, options: RedisOptions) -> Result<Self, StoreError> {
        let (conn, addr) = open(&source, &options).await?;
        let link = Self {
            shared: Arc::new(Shared {
                source,
                options,
                conn: RwLock::new(Some((0, conn))),
                generation: AtomicU64::new(0),
                reconnecting: AtomicBool::new(false),
                addr: RwLock::new(addr),
            }),
        };
        if link.shared.source.follows_failover() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(watch(Arc::downgrade(&link.shared)));
            }
        }
        Ok(link)
    }

    /// The live connection (this thread's lane, when it has one open), or
    /// an error at once while it is down (a reconnect is then under way in
    /// the background).
    pub(super) fn get(&self) -> Result<(u64, MultiplexedConnection), StoreError> {
        let current = match self.shared.conn.read() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        match &*current {
            // The shared connection is cloned only for a call that uses it.
            Some((generation, shared)) => match self.lane(*generation) {
                Some(own) => Ok((*generation, own)),
                None => Ok((*generation, shared.clone())),
            },
            None => {
                drop(current);
                // The task normally runs already; this starts it again should
                // a runtime have gone away under the previous one.
                self.spawn_reconnect();
                Err(StoreError::Unavailable(Unavailable::NotConnected(
                    "Redis is down; reconnecting in the background".to_owned(),
                )))
            }
        }
    }

    /// Reports that a call on connection `generation` failed with `err`;
    /// when the error means the connection is gone, marks it down and starts
    /// reconnecting. Timeouts do not: a slow Redis is still connected. A
    /// `READONLY` reply on a Sentinel target does: the server was demoted to
    /// a replica, and the reconnect asks the sentinels for the new master.
    pub(super) fn failed(&self, generation: u64, err: &RedisError) {
        let demoted = self.shared.source.follows_failover()
            && err.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly);
        if !(demoted
            || err.is_connection_dropped()
            || err.is_connection_refusal()
            || err.is_unrecoverable_error())
        {
            return;
        }
        // A lane lost is this thread's alone (a demoted master is everybody's).
        if !demoted && self.close_lane(generation) {
            return;
        }
        self.drop_connection(generation);
    }

    /// Marks connection `generation` down, unless it was replaced already,
    /// and starts reconnecting.
    fn drop_connection(&self, generation: u64) {
        {
            let mut conn = match self.shared.conn.write() {
                Ok(guard) => guard,
                Err(poisoned) => poisoned.into_inner(),
            };
            match &*conn {
                Some((live, _)) if *live == generation => *conn = None,
                // Already down, or already replaced by a newer connection.
                _ => return,
            }
        }
        self.spawn_reconnect();
    }

    /// This thread's connection under `generation`, if the thread drives
    /// lanes and it is open; opens it in the background when it is not and
    /// is not being opened.
    fn lane(&self, generation: u64) -> Option<MultiplexedConnection> {
        let runtime = lane_runtime()?;
        LANES.with_borrow_mut(|lanes| {
            if lanes.len() > 1 {
                // Lanes of dropped stores go (their connections with them).
                lanes.retain(|lane| lane.link.strong_count() > 0);
            }
            let lane = self.lane_in(lanes);
            if let LaneState::Opening(opened) = &mut lane.state {
                lane.state = match opened.try_recv() {
                    Err(TryRecvError::Empty) => return None,
                    Ok(Opened::Open(opened, conn)) => LaneState::Open(opened, conn),
                    Ok(Opened::Stale) => LaneState::Closed(None),
                    Ok(Opened::Failed) | Err(TryRecvError::Closed) => LaneState::Closed(Some(Instant::now())),
                };
            }
            match &lane.state {
                LaneState::Open(opened, conn) if *opened == generation => return Some(conn.clone()),
                LaneState::Closed(Some(failed)) if failed.elapsed() < self.shared.options.reconnect_max => {
                    return None;
                }
                _ => {}
            }
            // Closed, or open under a generation that is gone: open anew, on
            // this thread's runtime, which then drives the connection.
            let (done, opened) = tokio::sync::oneshot::channel();
            lane.state = LaneState::Opening(opened);
            let shared = Arc::clone(&self.shared);
            runtime.spawn(async move {
                let opened = match open(&shared.source, &shared.options).await {
                    // Kept only on the server the shared connection reached,
                    // while that connection lives (a Sentinel may name
                    // another master by now: its watch then reconnects all).
                    Ok((conn, addr)) if shared.live_at(generation, &addr) => Opened::Open(generation, conn),
                    Ok(_) => Opened::Stale,
                    Err(_) => Opened::Failed,
                };
                let _ = done.send(opened);
            });
            None
        })
    }

    /// This link's entry among a thread's lanes, made if missing.
    fn lane_in<'l>(&self, lanes: &'l mut Vec<Lane>) -> &'l mut Lane {
        let ours = Arc::as_ptr(&self.shared);
        let i = match lanes.iter().position(|lane| lane.link.as_ptr() == ours) {
            Some(i) => i,
            None => {
                lanes.push(Lane { link: Arc::downgrade(&self.shared), state: LaneState::Closed(None) });
                lanes.len() - 1
            }
        };
        &mut lanes[i]
    }

    /// Closes this thread's lane if it is open under `generation` (a call on
    /// it failed): whether it was.
    fn close_lane(&self, generation: u64) -> bool {
        if lane_runtime().is_none() {
            return false;
        }
        LANES.with_borrow_mut(|lanes| {
            let lane = self.lane_in(lanes);
            let open = matches!(lane.state, LaneState::Open(opened, _) if opened == generation);
            if open {
                lane.state = LaneState::Closed(Some(Instant::now()));
            }
            open
        })
    }

    fn spawn_reconnect(&self) {
        if self.shared.reconnecting.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.shared.reconnecting.store(false, Ordering::Release);
            return;
        };
        runtime.spawn(reconnect(Arc::downgrade(&self.shared)));
    }
}

impl Shared {
    /// Whether connection `generation` is the live one, on `addr`.
    fn live_at(&self, generation: u64, addr: &str) -> bool {
        let live = match self.conn.read() {
            Ok(guard) => guard.as_ref().map(|(g, _)| *g),
            Err(poisoned) => poisoned.into_inner().as_ref().map(|(g, _)| *g),
        };
        let same = match self.addr.read() {
            Ok(current) => *current == addr,
            Err(poisoned) => *poisoned.into_inner() == addr,
        };
        live == Some(generation) && same
    }
}

/// Makes every [`super::RedisStore`] this thread calls from the runtime it
/// runs now decide on a connection of its own, driven by that runtime (see
/// the module's docs). For a thread that runs a current-thread tokio runtime
/// (as each of `serve`'s workers does), called from inside it. Called
/// without a runtime, or on a work-stealing one (whose tasks move between
/// threads), it turns this thread's lanes off: the thread shares the
/// store's connection.
pub fn drive_connections_here() {
    let runtime = tokio::runtime::Handle::try_current()
        .ok()
        .filter(|runtime| runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread);
    LANE_RUNTIME.set(runtime.map(|runtime| runtime.id()));
}

/// The runtime this thread's lanes belong to, when the call runs on it.
fn lane_runtime() -> Option<tokio::runtime::Handle> {
    let id = LANE_RUNTIME.get()?;
    tokio::runtime::Handle::try_current().ok().filter(|runtime| runtime.id() == id)
}

thread_local! {
    /// The runtime whose calls on this thread use lanes ([`drive_connections_here`]).
    static LANE_RUNTIME: Cell<Option<tokio::runtime::Id>> = const { Cell::new(None) };
    /// This thread's lanes, one per link it has called.
    static LANES: RefCell<Vec<Lane>> = const { RefCell::new(Vec::new()) };
}

/// One thread's connection to one link's server.
struct Lane {
    link: Weak<Shared>,
    state: LaneState,
}

enum LaneState {
    /// None open; since when opening one last failed, if it did.
    Closed(Option<Instant>),
    /// Being opened in the background.
    Opening(tokio::sync::oneshot::Receiver<Opened>),
    /// Open under the shared connection's generation.
    Open(u64, MultiplexedConnection),
}

/// How opening a lane ended.
enum Opened {
    /// Open under the shared connection's generation.
    Open(u64, MultiplexedConnection),
    /// Open, but that generation is gone (or another server is named): closed.
    Stale,
    /// Not open: the next try waits.
    Failed,
}

/// Reconnects until it succeeds or the store is dropped. Holds the store
/// only weakly, so a dropped store stops the task.
async fn reconnect(shared: Weak<Shared>) {
    let mut delay = match shared.upgrade() {
        Some(s) => s.options.reconnect_min,
        None => return,
    };
    loop {
        let Some(s) = shared.upgrade() else { return };
        if let Ok((conn, addr)) = open(&s.source, &s.options).await {
            let mut slot = match s.conn.write() {
                Ok(guard) => guard,
                Err(poisoned) => poisoned.into_inner(),
            };
            // Another reconnect may have finished first (a call saw the link
            // down just before): its connection stays, and so do the lanes.
            if slot.is_none() {
                let generation = s.generation.fetch_add(1, Ordering::AcqRel) + 1;
                match s.addr.write() {
                    Ok(mut guard) => *guard = addr,
                    Err(poisoned) => *poisoned.into_inner() = addr,
                }
                *slot = Some((generation, conn));
            }
            drop(slot);
            s.reconnecting.store(false, Ordering::Release);
            return;
        }
        let max = s.options.reconnect_max;
        drop(s);
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(max);
    }
}

/// For a Sentinel target: asks the sentinels now and then which master they
/// name, and reconnects when it is not the one connected to. Holds the store
/// only weakly, so a dropped store stops the task.
async fn watch(shared: Weak<Shared>) {
    loop {
        tokio::time::sleep(SENTINEL_POLL).await;
        let Some(s) = shared.upgrade() else { return };
        let Ok(client) = s.source.client(&s.options).await else { continue };
        let named = client.get_connection_info().addr().to_string();
        let moved = match s.addr.read() {
            Ok(current) => *current != named,
            Err(poisoned) => *poisoned.into_inner() != named,
        };
        let live = match s.conn.read() {
            Ok(guard) => guard.as_ref().map(|(generation, _)| *generation),
            Err(poisoned) => poisoned.into_inner().as_ref().map(|(generation, _)| *generation),
        };
        if let (true, Some(generation)) = (moved, live) {
            Link { shared: s }.drop_connection(generation);
        }
    }
}

/// One connection attempt, bounded by the connect timeout as a whole (TCP
/// connect and the handshake commands alike), after finding the server (for
/// Sentinel, each sentinel asked within the connect timeout).
async fn open(
    source: &Source,
    options: &RedisOptions,
) -> Result<(MultiplexedConnection, String), StoreError> {
    let client = source.client(options).await?;
    let addr = client.get_connection_info().addr().to_string();
    // No response timeout on the connection itself: every call runs under
    // the store's deadline, which a caller may set above the crate's 500 ms.
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(options.connect_timeout))
        .set_response_timeout(None);
    match tokio::time::timeout(
        options.connect_timeout,
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await
    {
        Ok(conn) => Ok((conn?, addr)),
        Err(_) => Err(StoreError::Unavailable(Unavailable::TimedOut(options.connect_timeout))),
    }
}
