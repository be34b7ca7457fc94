//! One connection through a proxy: its two pumps, the faults aimed at it, and
//! how it ends.
//!
//! The life of a connection:
//!
//! 1. The proxy's accept loop registers it in the proxy's [`OpenConnections`] (so
//!    that `enabled=false` and [`Trigger::fire`](crate::Trigger::fire) can find it),
//!    hands it the next fault armed with [`Proxy::arm`](crate::Proxy::arm), if any,
//!    and spawns [`serve_connection`].
//! 2. [`serve_connection`] connects to the upstream and runs both directions at once:
//!
//!    ```text
//!    upstream:   client --read_chunks--> queue --Direction::run--> server
//!    downstream: server --read_chunks--> queue --Direction::run--> client
//!    ```
//!
//!    Reading and writing are decoupled by a queue so that time spent in a toxic
//!    never stops the reading, and every chunk keeps its arrival time (a latency
//!    toxic delays each chunk from its arrival, not one after the other). A close
//!    travels through the same queue, after the data, so it can never overtake
//!    bytes that are still being delayed: nothing is lost when a server writes its
//!    answer and hangs up at once.
//! 3. [`end_connection`] closes the sockets the way the toxic or fault asked:
//!    a normal close (FIN) or an abortive one (RST).
//!
//! A direction that reads end-of-stream passes it on as a half-close
//! (`shutdown(Write)`) and stops; the other direction carries on until it ends too.
//!
//! Layout of this file, top-down:
//!
//! * [`ProxyContext`]: what a connection needs from its proxy;
//! * [`OpenConnections`]: the registry of a proxy's open connections, which is
//!   also what a fired [`Trigger`](crate::Trigger) aims at;
//! * [`ConnectionShared`]: one connection as seen from outside (its pending faults,
//!   the request to cut it), and [`Ending`]: how it hangs up;
//! * [`serve_connection`] and [`end_connection`];
//! * the pumps: [`pump`], [`read_chunks`], and [`Direction`], the writing side,
//!   where toxics and faults strike.
//!
//! This module knows nothing of the proxy's listener or settings, and `fault.rs`
//! and `toxic.rs` know nothing of this module: imports go one way,
//! `proxy` → `connection` → `fault`, `toxic`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, sleep, sleep_until};

use crate::fault::{Fault, FaultState, FaultTarget, PendingFault, Stage};
use crate::toxic::{Chunk, Stream, Toxic, ToxicChain, Verdict, later};

/// Bytes read at once from a socket: the unit that toxics delay, cut or slice.
const CHUNK_SIZE: usize = 16 * 1024;
/// Chunks queued between the reading and the writing side of one direction.
/// Bounded, so that a slow toxic pushes back on the sender like a slow network
/// does, instead of buffering without limit.
const CHUNKS_IN_FLIGHT: usize = 64;
/// How long a server may go on with a request whose client [`Fault::Reset`] cut
/// off, before we hang up on the server too.
const SERVER_GRACE: Duration = Duration::from_secs(10);

/// What a connection needs from the proxy that accepted it.
///
/// A trait, implemented by the proxy, so that this module does not depend on
/// `proxy.rs` (which depends on this one). Each value is asked for at the moment
/// the connection needs it, never copied at accept: a connection always starts
/// with the proxy's current upstream and toxics.
pub(crate) trait ProxyContext: Send + Sync + 'static {
    /// The `host:port` to connect to.
    fn upstream(&self) -> String;
    /// The proxy's toxics, watched: a toxic added later reaches open connections.
    fn watch_toxics(&self) -> watch::Receiver<Vec<Toxic>>;
    /// The proxy's count of chunks held back by a delaying toxic.
    fn held_chunks(&self) -> Arc<AtomicUsize>;
    /// The proxy's running total of chunks swallowed by a timeout toxic.
    fn swallowed_chunks(&self) -> Arc<AtomicUsize>;
    /// The registry this connection leaves when it ends.
    fn open_connections(&self) -> &OpenConnections;
}

/// The connections open through one proxy, so that they can be reached from
/// outside: cut by `enabled=false` or a changed upstream, aimed at by a fired
/// [`Trigger`](crate::Trigger).
#[derive(Default)]
pub(crate) struct OpenConnections {
    by_id: Mutex<HashMap<u64, Arc<ConnectionShared>>>,
    next_id: AtomicU64,
}

impl OpenConnections {
    /// Adds a connection that has just been accepted. It leaves the registry when
    /// its [`serve_connection`] ends.
    pub(crate) fn register(&self) -> (u64, Arc<ConnectionShared>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let connection = Arc::new(ConnectionShared {
            pending_faults: Mutex::new(Vec::new()),
            cut: watch::Sender::new(None),
        });
        self.by_id.lock().insert(id, connection.clone());
        (id, connection)
    }

    pub(crate) fn cut_all(&self) {
        for connection in self.by_id.lock().values() {
            connection.cut(Ending::close());
        }
    }

    /// Drops every fault aimed at an open connection (they are disarmed already).
    pub(crate) fn forget_pending_faults(&self) {
        for connection in self.by_id.lock().values() {
            connection.pending_faults.lock().clear();
        }
    }
}

/// The aiming logic lives here, with the connections it aims at; `fault.rs`
/// only sees the [`FaultTarget`] trait.
impl FaultTarget for OpenConnections {
    fn aim_at_open_connections(&self, fault: &Arc<FaultState>) -> usize {
        let open: Vec<Arc<ConnectionShared>> = self.by_id.lock().values().cloned().collect();
        if open.is_empty() || !fault.take_use() {
            return 0;
        }
        let pending = PendingFault::new(fault.clone());
        for connection in &open {
            if fault.fault().stage() == Stage::Accepted {
                // ConnectionRefused has no later moment to wait for: cut them all now.
                connection.cut(Ending::reset_both().caused_by(fault.clone()));
            } else {
                connection.aim(pending.also_for_another_connection());
            }
        }
        open.len()
    }
}

/// What one connection shares with the rest of its proxy.
pub(crate) struct ConnectionShared {
    /// Faults aimed at this connection, waiting for their [`Stage`].
    pending_faults: Mutex<Vec<PendingFault>>,
    /// Set once, to end the connection from outside (disable, a fired trigger).
    cut: watch::Sender<Option<Ending>>,
}

impl ConnectionShared {
    /// Hands the connection a fault, to strike when the connection reaches its [`Stage`].
    pub(crate) fn aim(&self, fault: PendingFault) {
        self.pending_faults.lock().push(fault);
    }

    /// Takes the first pending fault of `stage` that this connection wins.
    fn claim_fault(&self, stage: Stage) -> Option<Arc<FaultState>> {
        let mut pending = self.pending_faults.lock();
        pending.retain(|fault| !fault.is_spent());
        for index in 0..pending.len() {
            if pending[index].state.fault().stage() == stage && pending[index].try_claim() {
                return Some(pending.remove(index).state);
            }
        }
        None
    }

    fn cut(&self, ending: Ending) {
        // The first reason to end the connection wins.
        self.cut.send_if_modified(|current| {
            let first = current.is_none();
            if first {
                *current = Some(ending);
            }
            first
        });
    }

    async fn cut_requested(&self) -> Ending {
        let mut cut = self.cut.subscribe();
        match cut.wait_for(Option::is_some).await {
            Ok(ending) => ending.clone().unwrap_or_else(Ending::close),
            // Unreachable (the sender lives in `self`); closing is the safe answer.
            Err(_) => Ending::close(),
        }
    }
}

/// How to hang up, and which fault (if any) asked for it.
#[derive(Clone, Debug)]
struct Ending {
    how: HowToEnd,
    caused_by: Option<Arc<FaultState>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HowToEnd {
    /// Close both sockets normally (FIN): timeout (also when one is removed), limit_data,
    /// `enabled=false`.
    Close,
    /// Abort both sockets (RST): reset_peer, ConnectionRefused.
    ResetBoth,
    /// Abort the client's socket, close the server's: ResponseLostAfterCommit.
    ResetClient,
    /// Abort the client's socket, let the server finish its request: Reset.
    ResetClientLetServerFinish,
}

impl Ending {
    fn new(how: HowToEnd) -> Ending {
        Ending {
            how,
            caused_by: None,
        }
    }

    fn close() -> Ending {
        Ending::new(HowToEnd::Close)
    }

    fn reset_both() -> Ending {
        Ending::new(HowToEnd::ResetBoth)
    }

    fn caused_by(mut self, fault: Arc<FaultState>) -> Ending {
        self.caused_by = Some(fault);
        self
    }
}

/// Removes the connection from its proxy's registry however `serve_connection` ends.
struct Registration<'a> {
    connections: &'a OpenConnections,
    id: u64,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.connections.by_id.lock().remove(&self.id);
    }
}

/// Serves one accepted connection until it ends, for whatever reason.
pub(crate) async fn serve_connection<P: ProxyContext>(
    mut client: TcpStream,
    proxy: Arc<P>,
    id: u64,
    connection: Arc<ConnectionShared>,
) {
    let _registration = Registration {
        connections: proxy.open_connections(),
        id,
    };
    if let Some(fault) = connection.claim_fault(Stage::Accepted) {
        end_connection(client, None, Ending::reset_both().caused_by(fault)).await;
        return;
    }
    let upstream_address = proxy.upstream();
    let connected = tokio::select! {
        biased;
        ending = connection.cut_requested() => {
            end_connection(client, None, ending).await;
            return;
        }
        connected = TcpStream::connect(upstream_address.as_str()) => connected,
    };
    // Like Toxiproxy: when the server cannot be reached, the client is just closed.
    let Ok(mut upstream) = connected else { return };
    // Chunks are forwarded the moment they are ready; Nagle's algorithm would hold
    // small writes back for up to 40 ms and blur the delays the lab measures.
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);

    let ending = {
        let (client_read, client_write) = client.split();
        let (upstream_read, upstream_write) = upstream.split();
        let toward_server = pump(
            Stream::Upstream,
            client_read,
            upstream_write,
            &*proxy,
            &connection,
        );
        let toward_client = pump(
            Stream::Downstream,
            upstream_read,
            client_write,
            &*proxy,
            &connection,
        );
        tokio::select! {
            // A cut, once asked for, wins over any data ready at the same poll: bytes a client
            // writes after the proxy was disabled must never reach the server.
            biased;
            ending = connection.cut_requested() => Some(ending),
            // `Ok`: both directions have closed normally, nothing is left to do.
            finished = async { tokio::try_join!(toward_server, toward_client) } => finished.err(),
        }
    };
    if let Some(ending) = ending {
        end_connection(client, Some(upstream), ending).await;
    }
}

async fn end_connection(client: TcpStream, upstream: Option<TcpStream>, ending: Ending) {
    match ending.how {
        HowToEnd::Close => {}
        HowToEnd::ResetBoth => {
            abort_on_close(&client);
            upstream.iter().for_each(abort_on_close);
        }
        HowToEnd::ResetClient | HowToEnd::ResetClientLetServerFinish => abort_on_close(&client),
    }
    drop(client);
    // The damage is done (the FIN or RST has left with the close): tell the caller.
    if let Some(fault) = &ending.caused_by {
        fault.record_fired();
    }
    if let (HowToEnd::ResetClientLetServerFinish, Some(mut upstream)) = (ending.how, upstream) {
        // One read returns as soon as the server answers or hangs up: either way
        // it is done with the request. Bounded, in case it never does either.
        let mut answer = [0; 1024];
        let _ = tokio::time::timeout(SERVER_GRACE, upstream.read(&mut answer)).await;
    }
}

/// Makes the next close of `socket` abortive: with `SO_LINGER` set to zero the
/// kernel sends RST instead of FIN, and the peer's next read or write fails with
/// ECONNRESET, "connection reset by peer".
fn abort_on_close(socket: &TcpStream) {
    let _ = socket.set_zero_linger();
}

/// A byte stream item: data, or how the stream ended.
enum Incoming {
    Data(Chunk),
    Closed,
    Failed,
}

/// Moves one direction of a connection from `source` to `dest`. `Ok` when the
/// direction ended normally; `Err` when the whole connection must end.
async fn pump(
    stream: Stream,
    mut source: ReadHalf<'_>,
    mut dest: WriteHalf<'_>,
    proxy: &impl ProxyContext,
    connection: &ConnectionShared,
) -> Result<(), Ending> {
    let (queue, queued) = mpsc::channel(CHUNKS_IN_FLIGHT);
    let direction = Direction {
        stream,
        toxics: ToxicChain::new(
            stream,
            proxy.watch_toxics(),
            proxy.held_chunks(),
            proxy.swallowed_chunks(),
        ),
        connection,
        hold_until: None,
    };
    tokio::try_join!(
        read_chunks(&mut source, queue),
        direction.run(queued, &mut dest)
    )?;
    Ok(())
}

async fn read_chunks(
    source: &mut ReadHalf<'_>,
    queue: mpsc::Sender<Incoming>,
) -> Result<(), Ending> {
    loop {
        let mut buffer = vec![0; CHUNK_SIZE];
        let incoming = match source.read(&mut buffer).await {
            Ok(0) => Incoming::Closed,
            Ok(read) => {
                buffer.truncate(read);
                Incoming::Data(Chunk {
                    bytes: buffer,
                    arrived: Instant::now(),
                })
            }
            Err(_) => Incoming::Failed,
        };
        let was_last = !matches!(incoming, Incoming::Data(_));
        // Sending fails only when the writing side has stopped: nobody wants more.
        if queue.send(incoming).await.is_err() || was_last {
            return Ok(());
        }
    }
}

/// The writing side of one direction: toxics and faults happen here.
struct Direction<'a> {
    stream: Stream,
    toxics: ToxicChain,
    connection: &'a ConnectionShared,
    /// Set by [`Fault::SlowResponse`]: nothing is delivered before this instant.
    hold_until: Option<Instant>,
}

/// Whether a direction goes on after a chunk.
enum Flow {
    Continue,
    /// Writing failed: the peer is gone, this direction is over. The other
    /// direction is left to finish what it carries.
    Stop,
}

impl Direction<'_> {
    async fn run(
        mut self,
        mut queued: mpsc::Receiver<Incoming>,
        dest: &mut WriteHalf<'_>,
    ) -> Result<(), Ending> {
        loop {
            let close_deadline = self.toxics.close_deadline();
            let incoming = tokio::select! {
                // In this order: a toxic added or removed is applied before the next chunk
                // moves, so a chunk read after the change can never pass the old chain.
                biased;
                // A timeout toxic closes the connection at its deadline, even while
                // no byte moves.
                () = sleep_until_if_some(close_deadline) => return Err(Ending::close()),
                proxy_alive = self.toxics.changed() => {
                    // Gone proxy, or a removed timeout toxic (Toxiproxy closes then too).
                    if !proxy_alive || self.toxics.must_close() {
                        return Err(Ending::close());
                    }
                    continue;
                }
                incoming = queued.recv() => incoming,
            };
            match incoming {
                Some(Incoming::Data(chunk)) => {
                    if let Flow::Stop = self.forward(chunk, dest).await? {
                        return Ok(());
                    }
                }
                Some(Incoming::Closed) | None => return self.forward_close(dest).await,
                Some(Incoming::Failed) => return Err(Ending::close()),
            }
        }
    }

    async fn forward(&mut self, chunk: Chunk, dest: &mut WriteHalf<'_>) -> Result<Flow, Ending> {
        match self.stream {
            Stream::Upstream => {
                if let Some(fault) = self.connection.claim_fault(Stage::ClientSent) {
                    return Err(strike_on_request(fault, &chunk, dest).await);
                }
            }
            Stream::Downstream => self.strike_on_reply(chunk.arrived)?,
        }
        if let Some(hold_until) = self.hold_until {
            sleep_until(hold_until).await;
        }
        let verdict = self.toxics.process(chunk).await;
        if self.toxics.must_close() {
            // A timeout toxic was removed while this chunk was held by another toxic.
            return Err(Ending::close());
        }
        match verdict {
            Verdict::Swallow => Ok(Flow::Continue),
            Verdict::Reset => Err(Ending::reset_both()),
            Verdict::Write { bytes, then_close } => {
                if self.toxics.write_shaped(&bytes, dest).await.is_err() {
                    return Ok(Flow::Stop);
                }
                if then_close {
                    return Err(Ending::close());
                }
                Ok(Flow::Continue)
            }
        }
    }

    /// Passes on end-of-stream, after everything queued before it.
    async fn forward_close(&mut self, dest: &mut WriteHalf<'_>) -> Result<(), Ending> {
        if self.stream == Stream::Downstream {
            // A server hanging up without a word is its reply too.
            self.strike_on_reply(Instant::now())?;
        }
        if let Some(hold_until) = self.hold_until {
            sleep_until(hold_until).await;
        }
        sleep(self.toxics.close_delay()).await;
        // A half-close: the peer reads end-of-stream in this direction only, the
        // other direction keeps flowing (a client may stop sending and still wait
        // for its answer).
        let _ = dest.shutdown().await;
        Ok(())
    }

    /// The server's first bytes (or its close) met a pending reply-stage fault.
    fn strike_on_reply(&mut self, arrived: Instant) -> Result<(), Ending> {
        let Some(fault) = self.connection.claim_fault(Stage::ServerReplied) else {
            return Ok(());
        };
        if let Fault::SlowResponse(hold) = *fault.fault() {
            self.hold_until = Some(later(arrived, hold));
            fault.record_fired();
            return Ok(());
        }
        // ResponseLostAfterCommit, the other reply-stage fault: the server has
        // started to answer, so its work is done; the client must never see it.
        Err(Ending::new(HowToEnd::ResetClient).caused_by(fault))
    }
}

/// The client's first bytes met a pending request-stage fault.
async fn strike_on_request(
    fault: Arc<FaultState>,
    chunk: &Chunk,
    dest: &mut WriteHalf<'_>,
) -> Ending {
    if *fault.fault() == Fault::Reset {
        // The point of this fault is that the server did get the request
        // (its first chunk, which is all of it for the lab's small requests).
        let _ = dest.write_all(&chunk.bytes).await;
        return Ending::new(HowToEnd::ResetClientLetServerFinish).caused_by(fault);
    }
    // RequestLost, the other request-stage fault: the bytes go nowhere.
    Ending::close().caused_by(fault)
}

async fn sleep_until_if_some(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
