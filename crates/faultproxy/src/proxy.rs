//! One proxy: a listener, and for every accepted connection two pumps.
//!
//! The life of a connection:
//!
//! 1. [`accept_connections`] accepts it, registers it (so that `enabled=false` and
//!    [`Trigger::fire`](crate::Trigger::fire) can find it) and hands it the next
//!    fault armed with [`Proxy::arm`], if any.
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

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream, lookup_host};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, sleep_until};

use crate::error::Error;
use crate::fault::{ArmedFault, Arming, Fault, FaultState, PendingFault, Stage, Trigger};
use crate::toxic::{Chunk, Stream, Toxic, ToxicChain, ToxicUpdate, Verdict, later};

/// Bytes read at once from a socket: the unit that toxics delay, cut or slice.
const CHUNK_SIZE: usize = 16 * 1024;
/// Chunks queued between the reading and the writing side of one direction.
/// Bounded, so that a slow toxic pushes back on the sender like a slow network
/// does, instead of buffering without limit.
const CHUNKS_IN_FLIGHT: usize = 64;
/// How long a server may go on with a request whose client [`Fault::Reset`] cut
/// off, before we hang up on the server too.
const SERVER_GRACE: Duration = Duration::from_secs(10);
/// Pause after a failed accept (e.g. out of file descriptors), so the loop
/// does not spin on the same error.
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(50);
/// Where a proxy listens when no address is given: loopback only, any free port.
const DEFAULT_LISTEN: &str = "127.0.0.1:0";

/// Locks a mutex, ignoring poisoning: every value we guard is replaced whole
/// or changed by one operation, so a panic elsewhere cannot leave it half-changed.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A snapshot of a proxy, shaped like Toxiproxy's JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProxyInfo {
    pub name: String,
    /// The address really listened on (with the real port if port 0 was asked for).
    pub listen: String,
    pub upstream: String,
    pub enabled: bool,
    pub toxics: Vec<Toxic>,
}

/// A partial update of a proxy (`POST /proxies/{name}`): absent fields stay.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ProxyUpdate {
    #[serde(default)]
    pub listen: Option<String>,
    #[serde(default)]
    pub upstream: Option<String>,
    #[serde(default)]
    pub enabled: Option<bool>,
}

#[derive(Clone, Debug)]
struct Settings {
    /// The listen address as configured, e.g. `127.0.0.1:0`.
    listen: String,
    /// The address actually bound. Re-enabling binds it again, so a proxy created
    /// on port 0 keeps its port across `enabled=false` / `enabled=true`.
    listen_addr: SocketAddr,
    upstream: String,
    enabled: bool,
}

impl Settings {
    fn listens_on(&self, listen: &str) -> bool {
        listen == self.listen || listen == self.listen_addr.to_string()
    }
}

/// Everything about one proxy that its handles, tasks and connections share.
pub(crate) struct ProxyShared {
    name: String,
    settings: Mutex<Settings>,
    /// The accept loop while the proxy is enabled. A tokio mutex because stopping
    /// awaits the end of the loop: only then is the port really closed, so that new
    /// connections are refused and the port can be bound again.
    accept_loop: tokio::sync::Mutex<Option<JoinHandle<()>>>,
    /// The toxics, in the order they were added. Every open connection watches
    /// this, which is how a new toxic reaches connections that are already open.
    toxics: watch::Sender<Vec<Toxic>>,
    /// Faults armed on this proxy that may still strike.
    faults: Mutex<Vec<Arc<FaultState>>>,
    connections: Mutex<HashMap<u64, Arc<ConnectionShared>>>,
    next_connection_id: AtomicU64,
    /// How many chunks are held by a delaying toxic right now (observable, for tests and for
    /// anyone wondering where their bytes are).
    held: Arc<AtomicUsize>,
    /// Set (under the `accept_loop` lock) when the proxy is deleted or replaced: an update
    /// racing with the delete, holding an old handle, must not bring the listener back.
    removed: AtomicBool,
}

impl ProxyShared {
    fn settings(&self) -> Settings {
        lock(&self.settings).clone()
    }

    fn register_connection(&self) -> (u64, Arc<ConnectionShared>) {
        let id = self.next_connection_id.fetch_add(1, Ordering::Relaxed);
        let connection = Arc::new(ConnectionShared {
            pending_faults: Mutex::new(Vec::new()),
            cut: watch::Sender::new(None),
        });
        lock(&self.connections).insert(id, connection.clone());
        (id, connection)
    }

    fn cut_all_connections(&self) {
        for connection in lock(&self.connections).values() {
            connection.cut(Ending::close());
        }
    }

    /// Takes one use of the oldest fault armed for the next connections.
    fn claim_fault_for_new_connection(&self) -> Option<Arc<FaultState>> {
        let mut faults = lock(&self.faults);
        faults.retain(|fault| fault.uses_left() > 0);
        faults
            .iter()
            .find(|fault| fault.arming == Arming::NextConnections && fault.take_use())
            .cloned()
    }

    /// See [`Trigger::fire`].
    pub(crate) fn aim_at_open_connections(&self, fault: &Arc<FaultState>) -> usize {
        let open: Vec<Arc<ConnectionShared>> = lock(&self.connections).values().cloned().collect();
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

    fn disarm_all_faults(&self) {
        for fault in lock(&self.faults).drain(..) {
            fault.disarm();
        }
        for connection in lock(&self.connections).values() {
            lock(&connection.pending_faults).clear();
        }
    }
}

/// A handle to one named proxy. Cheap to clone.
#[derive(Clone)]
pub struct Proxy {
    shared: Arc<ProxyShared>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let settings = self.shared.settings();
        f.debug_struct("Proxy")
            .field("name", &self.shared.name)
            .field("listen", &settings.listen_addr)
            .field("upstream", &settings.upstream)
            .field("enabled", &settings.enabled)
            .finish()
    }
}

impl Proxy {
    /// Creates a proxy and, if `enabled`, starts listening.
    pub(crate) async fn start(
        name: &str,
        listen: &str,
        upstream: &str,
        enabled: bool,
    ) -> Result<Proxy, Error> {
        if name.is_empty() {
            return Err(Error::MissingField("name".into()));
        }
        if upstream.is_empty() {
            return Err(Error::MissingField("upstream".into()));
        }
        let listen = if listen.is_empty() {
            DEFAULT_LISTEN
        } else {
            listen
        };
        let listen_addr = resolve(listen).await?;
        // Fail now on a typo, rather than on every connection later.
        resolve(upstream).await?;
        let proxy = Proxy {
            shared: Arc::new(ProxyShared {
                name: name.to_owned(),
                settings: Mutex::new(Settings {
                    listen: listen.to_owned(),
                    listen_addr,
                    upstream: upstream.to_owned(),
                    enabled: false,
                }),
                accept_loop: tokio::sync::Mutex::new(None),
                toxics: watch::Sender::new(Vec::new()),
                faults: Mutex::new(Vec::new()),
                connections: Mutex::new(HashMap::new()),
                next_connection_id: AtomicU64::new(0),
                held: Arc::new(AtomicUsize::new(0)),
                removed: AtomicBool::new(false),
            }),
        };
        if enabled {
            proxy.set_enabled(true).await?;
        }
        Ok(proxy)
    }

    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The address the proxy listens on (the real port, also when `:0` was asked for).
    pub fn listen_addr(&self) -> SocketAddr {
        self.shared.settings().listen_addr
    }

    pub fn upstream(&self) -> String {
        self.shared.settings().upstream
    }

    pub fn is_enabled(&self) -> bool {
        self.shared.settings().enabled
    }

    /// Whether this proxy was configured with (or listens on) `listen`.
    pub(crate) fn listens_on(&self, listen: &str) -> bool {
        self.shared.settings().listens_on(listen)
    }

    pub fn info(&self) -> ProxyInfo {
        let settings = self.shared.settings();
        ProxyInfo {
            name: self.shared.name.clone(),
            listen: settings.listen_addr.to_string(),
            upstream: settings.upstream,
            enabled: settings.enabled,
            toxics: self.toxics(),
        }
    }

    /// `false`: close the listener (new connections are refused) and cut every open
    /// connection. `true`: listen again, on the same address and port.
    pub async fn set_enabled(&self, enabled: bool) -> Result<(), Error> {
        self.update(ProxyUpdate {
            enabled: Some(enabled),
            ..ProxyUpdate::default()
        })
        .await
    }

    /// Changes listen address, upstream and/or enabled, as Toxiproxy does: a new
    /// listen address or upstream cuts the open connections (they lead to the old
    /// upstream).
    pub(crate) async fn update(&self, change: ProxyUpdate) -> Result<(), Error> {
        let new_listen = match change.listen.as_deref().filter(|listen| !listen.is_empty()) {
            Some(listen) => Some((listen.to_owned(), resolve(listen).await?)),
            None => None,
        };
        if let Some(upstream) = &change.upstream {
            resolve(upstream).await?;
        }

        let mut accept_loop = self.shared.accept_loop.lock().await;
        if self.shared.removed.load(Ordering::SeqCst) {
            return Err(Error::ProxyNotFound(self.shared.name.clone()));
        }
        let current = self.shared.settings();
        let new_listen = new_listen
            .filter(|(listen, addr)| !current.listens_on(listen) && *addr != current.listen_addr);
        let upstream_changed = change
            .upstream
            .as_ref()
            .is_some_and(|u| *u != current.upstream);
        let enabled = change.enabled.unwrap_or(current.enabled);

        // Bind before tearing anything down: if the address is unusable, the proxy
        // stays exactly as it was.
        let listener = if enabled && (new_listen.is_some() || accept_loop.is_none()) {
            let address = new_listen.as_ref().map_or(current.listen_addr, |(_, a)| *a);
            Some(bind(address).await?)
        } else {
            None
        };
        if !enabled || listener.is_some() {
            stop_accepting(&mut accept_loop).await;
        }
        if !enabled || new_listen.is_some() || upstream_changed {
            self.shared.cut_all_connections();
        }

        let mut settings = lock(&self.shared.settings);
        if let Some((listen, address)) = new_listen {
            // Also while disabled: enabling later must bind the new address.
            settings.listen = listen;
            settings.listen_addr = address;
        }
        if let Some(upstream) = change.upstream {
            settings.upstream = upstream;
        }
        settings.enabled = enabled;
        if let Some(listener) = listener {
            if let Ok(bound) = listener.local_addr() {
                settings.listen_addr = bound;
            }
            let accepting = accept_connections(listener, self.shared.clone());
            *accept_loop = Some(tokio::spawn(accepting));
        }
        Ok(())
    }

    /// Stops listening and cuts every connection (for delete and replace).
    pub(crate) async fn shutdown(&self) {
        let mut accept_loop = self.shared.accept_loop.lock().await;
        self.shared.removed.store(true, Ordering::SeqCst);
        stop_accepting(&mut accept_loop).await;
        self.shared.cut_all_connections();
    }

    /// Like [`Self::shutdown`], without waiting (for `Drop`).
    pub(crate) fn shutdown_now(&self) {
        self.shared.removed.store(true, Ordering::SeqCst);
        if let Ok(mut accept_loop) = self.shared.accept_loop.try_lock()
            && let Some(task) = accept_loop.take()
        {
            task.abort();
        }
        self.shared.cut_all_connections();
    }

    pub fn toxics(&self) -> Vec<Toxic> {
        self.shared.toxics.borrow().clone()
    }

    /// How many chunks a latency or reset_peer toxic is holding back right now.
    pub fn held_chunks(&self) -> usize {
        self.shared.held.load(Ordering::SeqCst)
    }

    pub fn toxic(&self, name: &str) -> Option<Toxic> {
        self.shared
            .toxics
            .borrow()
            .iter()
            .find(|t| t.name == name)
            .cloned()
    }

    /// Adds a toxic; it applies to new connections and to the open ones.
    pub fn add_toxic(&self, toxic: Toxic) -> Result<(), Error> {
        toxic.validate()?;
        let mut result = Ok(());
        self.shared.toxics.send_if_modified(|toxics| {
            if toxics.iter().any(|existing| existing.name == toxic.name) {
                result = Err(Error::ToxicAlreadyExists(toxic.name.clone()));
                return false;
            }
            toxics.push(toxic);
            true
        });
        result
    }

    pub(crate) fn update_toxic(&self, name: &str, update: ToxicUpdate) -> Result<Toxic, Error> {
        let mut result = Err(Error::ToxicNotFound(name.to_owned()));
        self.shared.toxics.send_if_modified(|toxics| {
            let Some(toxic) = toxics.iter_mut().find(|t| t.name == name) else {
                return false;
            };
            result = toxic.updated(update);
            if let Ok(updated) = &result {
                *toxic = updated.clone();
            }
            result.is_ok()
        });
        result
    }

    pub fn remove_toxic(&self, name: &str) -> Result<(), Error> {
        let removed = self.shared.toxics.send_if_modified(|toxics| {
            let before = toxics.len();
            toxics.retain(|toxic| toxic.name != name);
            toxics.len() != before
        });
        if removed {
            Ok(())
        } else {
            Err(Error::ToxicNotFound(name.to_owned()))
        }
    }

    pub fn remove_all_toxics(&self) {
        self.shared.toxics.send_if_modified(|toxics| {
            let had_toxics = !toxics.is_empty();
            toxics.clear();
            had_toxics
        });
    }

    /// Arms `fault` for the next `connections` connections this proxy accepts.
    /// (A connection opened before, e.g. one kept alive in a client's pool, is not
    /// affected: use [`Self::arm_on_trigger`] to break whatever connection carries
    /// a request.)
    pub fn arm(&self, fault: Fault, connections: usize) -> ArmedFault {
        let state = FaultState::new(fault, connections, Arming::NextConnections);
        lock(&self.shared.faults).push(state.clone());
        ArmedFault { state }
    }

    /// Arms `fault` to strike when the returned [`Trigger`] fires, at most `times` times.
    pub fn arm_on_trigger(&self, fault: Fault, times: usize) -> (ArmedFault, Trigger) {
        let state = FaultState::new(fault, times, Arming::OnTrigger);
        lock(&self.shared.faults).push(state.clone());
        let trigger = Trigger {
            state: state.clone(),
            proxy: self.shared.clone(),
        };
        (ArmedFault { state }, trigger)
    }

    /// Disarms every fault armed on this proxy, including those aimed at open connections.
    pub fn disarm_all_faults(&self) {
        self.shared.disarm_all_faults();
    }
}

/// Resolves `host:port`, preferring IPv4: `localhost` often resolves to `::1`
/// first, while the lab's clients and servers all use 127.0.0.1.
async fn resolve(address: &str) -> Result<SocketAddr, Error> {
    let invalid = |reason: String| Error::InvalidAddress {
        address: address.to_owned(),
        reason,
    };
    let candidates: Vec<SocketAddr> = lookup_host(address)
        .await
        .map_err(|error| invalid(error.to_string()))?
        .collect();
    candidates
        .iter()
        .find(|candidate| candidate.is_ipv4())
        .or(candidates.first())
        .copied()
        .ok_or_else(|| invalid("resolves to no address".into()))
}

async fn bind(address: SocketAddr) -> Result<TcpListener, Error> {
    TcpListener::bind(address)
        .await
        .map_err(|source| Error::Listen {
            address: address.to_string(),
            source,
        })
}

async fn stop_accepting(accept_loop: &mut Option<JoinHandle<()>>) {
    if let Some(task) = accept_loop.take() {
        task.abort();
        // Waiting for the aborted task drops its listener: the port is closed
        // when this returns, not at some later poll.
        let _ = task.await;
    }
}

async fn accept_connections(listener: TcpListener, proxy: Arc<ProxyShared>) {
    loop {
        let client = match listener.accept().await {
            Ok((client, _peer)) => client,
            Err(_) => {
                sleep(ACCEPT_RETRY_DELAY).await;
                continue;
            }
        };
        // Registered before it is spawned: from now on, disabling the proxy or
        // firing a trigger reaches this connection.
        let (id, connection) = proxy.register_connection();
        if let Some(fault) = proxy.claim_fault_for_new_connection() {
            connection.aim(PendingFault::new(fault));
        }
        tokio::spawn(serve_connection(client, proxy.clone(), id, connection));
    }
}

// ---------------------------------------------------------------------------
// One connection
// ---------------------------------------------------------------------------

/// What one connection shares with the rest of its proxy.
struct ConnectionShared {
    /// Faults aimed at this connection, waiting for their [`Stage`].
    pending_faults: Mutex<Vec<PendingFault>>,
    /// Set once, to end the connection from outside (disable, a fired trigger).
    cut: watch::Sender<Option<Ending>>,
}

impl ConnectionShared {
    fn aim(&self, fault: PendingFault) {
        lock(&self.pending_faults).push(fault);
    }

    /// Takes the first pending fault of `stage` that this connection wins.
    fn claim_fault(&self, stage: Stage) -> Option<Arc<FaultState>> {
        let mut pending = lock(&self.pending_faults);
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
    /// Close both sockets normally (FIN): timeout, limit_data, `enabled=false`.
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
    proxy: &'a ProxyShared,
    id: u64,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        lock(&self.proxy.connections).remove(&self.id);
    }
}

async fn serve_connection(
    mut client: TcpStream,
    proxy: Arc<ProxyShared>,
    id: u64,
    connection: Arc<ConnectionShared>,
) {
    let _registration = Registration { proxy: &proxy, id };
    if let Some(fault) = connection.claim_fault(Stage::Accepted) {
        end_connection(client, None, Ending::reset_both().caused_by(fault)).await;
        return;
    }
    let upstream_address = proxy.settings().upstream;
    let connected = tokio::select! {
        connected = TcpStream::connect(upstream_address.as_str()) => connected,
        ending = connection.cut_requested() => {
            end_connection(client, None, ending).await;
            return;
        }
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
            &proxy,
            &connection,
        );
        let toward_client = pump(
            Stream::Downstream,
            upstream_read,
            client_write,
            &proxy,
            &connection,
        );
        tokio::select! {
            // `Ok`: both directions have closed normally, nothing is left to do.
            finished = async { tokio::try_join!(toward_server, toward_client) } => finished.err(),
            ending = connection.cut_requested() => Some(ending),
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
    proxy: &ProxyShared,
    connection: &ConnectionShared,
) -> Result<(), Ending> {
    let (queue, queued) = mpsc::channel(CHUNKS_IN_FLIGHT);
    let direction = Direction {
        stream,
        toxics: ToxicChain::new(stream, proxy.toxics.subscribe(), proxy.held.clone()),
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
                // A timeout toxic closes the connection at its deadline, even while
                // no byte moves.
                () = sleep_until_if_some(close_deadline) => return Err(Ending::close()),
                proxy_alive = self.toxics.changed() => {
                    if !proxy_alive {
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
        match self.toxics.process(chunk).await {
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
