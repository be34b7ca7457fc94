//! One proxy: its settings, its listener, and the handle that changes them.
//!
//! A [`Proxy`] is a cheap handle to a `ProxyShared`, the state that the handle's
//! clones, the accept loop and every connection's task share. Changing a proxy
//! (`enabled`, listen address, upstream) may restart its listener and cut its
//! open connections; toxics and faults are only recorded here, and take effect in
//! the connections.
//!
//! Layout of this file:
//!
//! * [`ProxyInfo`] and `ProxyUpdate`: a proxy as the JSON API shows and changes it;
//! * `Settings` and `ProxyShared`, which implements
//!   [`ProxyContext`]: what a connection may ask of its proxy;
//! * [`Proxy`], the handle: enable, update, shut down; toxics; faults;
//! * the listener: `resolve`, `bind` (with `ensure_nobody_listens`), `stop_accepting`, `park`,
//!   and the accept loop,
//!   [`accept_connections`], which registers every connection, hands it the next
//!   armed fault and spawns [`serve_connection`] for it.
//!
//! What happens to a connection once accepted is in `connection.rs`. Imports go
//! one way: this module uses `connection`, `fault` and `toxic`; none of them uses it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, TcpSocket, lookup_host};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::sleep;

use crate::connection::{OpenConnections, ProxyContext, serve_connection};
use crate::error::Error;
use crate::fault::{ArmedFault, Arming, Fault, FaultInfo, FaultState, PendingFault, Trigger};
use crate::toxic::{Stream, Toxic, ToxicUpdate};

/// Pause after a failed accept (e.g. out of file descriptors), so the loop
/// does not spin on the same error.
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(50);
/// Where a proxy listens when no address is given: loopback only, any free port.
const DEFAULT_LISTEN: &str = "127.0.0.1:0";
/// How many spent faults a proxy keeps for its fault listing (the oldest go first). Faults
/// that may still strike are always kept.
const SPENT_FAULTS_KEPT: usize = 16;
/// The listen backlog when a disabled proxy listens again on the socket that kept its port (the
/// one `TcpListener::bind` uses).
const LISTEN_BACKLOG: u32 = 1024;

/// A snapshot of a proxy, shaped like Toxiproxy's JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProxyInfo {
    pub name: String,
    /// Once the proxy has listened: the address really listened on (with the real port if port
    /// 0 was asked for). Before that (created disabled, or moved while disabled): the address
    /// as given, e.g. `localhost:3310`, as Toxiproxy shows it.
    pub listen: String,
    pub upstream: String,
    pub enabled: bool,
    pub toxics: Vec<Toxic>,
}

/// A partial update of a proxy (`POST /proxies/{name}`): absent (or `null`) fields stay.
/// Other fields are ignored: the Go client sends the whole proxy, `name` and `toxics` too.
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
    /// The listen address as configured, e.g. `127.0.0.1:0` or `localhost:3310`.
    listen: String,
    /// The address actually bound (before the first bind: `listen` resolved). Re-enabling
    /// binds it again, so a proxy created on port 0 keeps its port across `enabled=false` /
    /// `enabled=true`.
    listen_addr: SocketAddr,
    /// Whether `listen_addr` was bound since `listen` was last set. Until then the proxy shows
    /// `listen` as given, as Toxiproxy does (it replaces the given text by the bound address
    /// when it starts listening).
    bound: bool,
    upstream: String,
    enabled: bool,
}

impl Settings {
    /// Whether `listen` (resolved: `resolved`) names the address this proxy listens on, as
    /// Toxiproxy decides whether an update or populate changes it: the text it shows, or
    /// another name of the same address (`localhost:3310` for `127.0.0.1:3310`). Port 0 is
    /// never the same: it asks for a new port.
    fn is_same_listen(&self, listen: &str, resolved: SocketAddr) -> bool {
        listen == self.shown_listen() || (resolved.port() != 0 && resolved == self.listen_addr)
    }

    fn shown_listen(&self) -> String {
        if self.bound {
            self.listen_addr.to_string()
        } else {
            self.listen.clone()
        }
    }
}

/// Everything about one proxy that its handles, tasks and connections share.
struct ProxyShared {
    name: String,
    /// Locked only to copy or change the settings, never across an `.await`.
    settings: Mutex<Settings>,
    /// The accept loop while the proxy is enabled. A tokio mutex because stopping
    /// awaits the end of the loop: only then is the port really closed, so that new
    /// connections are refused and the port can be bound again.
    accept_loop: tokio::sync::Mutex<Option<JoinHandle<()>>>,
    /// Which proxy this is, in [`KeptPorts`] (a name may be given to a new proxy once this one
    /// is removed).
    id: u64,
    /// The ports the registry's disabled proxies keep, this one's among them: while it is
    /// disabled, a socket bound to its port without listening, changed only under the
    /// `accept_loop` lock. It refuses connections as a closed port does, and it keeps the port
    /// ours: a port from the ephemeral range (`:0`) given up for a moment is soon some other
    /// program's, and enabling again would fail with "address in use". Enabling listens on this
    /// very socket.
    kept: Arc<KeptPorts>,
    /// The toxics, in the order they were added. Every open connection watches
    /// this, which is how a new toxic reaches connections that are already open.
    toxics: watch::Sender<Vec<Toxic>>,
    /// Faults armed on this proxy, in the order they were armed: those that may still strike,
    /// and the last few spent ones (so that `GET /lab/proxies/{proxy}/faults` can still show
    /// how often they fired). Disarming forgets them.
    faults: Mutex<Vec<Arc<FaultState>>>,
    /// The id of the next fault armed here.
    next_fault_id: AtomicU64,
    /// An `Arc` because every [`Trigger`] of this proxy holds it too: it is what
    /// a trigger fires at.
    connections: Arc<OpenConnections>,
    /// How many chunks are held by a delaying toxic right now (observable, for tests and for
    /// anyone wondering where their bytes are).
    held: Arc<AtomicUsize>,
    /// How many chunks a timeout toxic has swallowed so far: a running total, observable like
    /// `held` (a test can see that data was dropped, instead of waiting to see nothing arrive).
    swallowed: Arc<AtomicUsize>,
    /// Set (under the `accept_loop` lock) when the proxy is deleted or replaced: an update
    /// racing with the delete, holding an old handle, must not bring the listener back.
    removed: AtomicBool,
}

impl ProxyShared {
    fn settings(&self) -> Settings {
        self.settings.lock().clone()
    }

    /// Takes one use of the oldest fault armed for the next connections.
    fn claim_fault_for_new_connection(&self) -> Option<Arc<FaultState>> {
        let faults = self.faults.lock();
        faults
            .iter()
            .find(|fault| fault.arming == Arming::NextConnections && fault.take_use())
            .cloned()
    }

    /// Records a newly armed fault, forgetting disarmed ones and all but the last
    /// [`SPENT_FAULTS_KEPT`] spent ones.
    fn add_fault(&self, fault: Fault, uses: usize, arming: Arming) -> Arc<FaultState> {
        let id = self.next_fault_id.fetch_add(1, Ordering::Relaxed) + 1;
        let state = FaultState::new(id, fault, uses, arming);
        let mut faults = self.faults.lock();
        faults.retain(|fault| !fault.is_disarmed());
        let spent = faults.iter().filter(|fault| fault.uses_left() == 0).count();
        let mut to_forget = spent.saturating_sub(SPENT_FAULTS_KEPT);
        faults.retain(|fault| {
            let forget = to_forget > 0 && fault.uses_left() == 0;
            to_forget -= usize::from(forget);
            !forget
        });
        faults.push(state.clone());
        state
    }

    fn disarm_all_faults(&self) {
        for fault in self.faults.lock().drain(..) {
            fault.disarm();
        }
        self.connections.forget_pending_faults();
    }
}

impl ProxyContext for ProxyShared {
    fn upstream(&self) -> String {
        self.settings().upstream
    }

    fn watch_toxics(&self) -> watch::Receiver<Vec<Toxic>> {
        self.toxics.subscribe()
    }

    fn held_chunks(&self) -> Arc<AtomicUsize> {
        self.held.clone()
    }

    fn swallowed_chunks(&self) -> Arc<AtomicUsize> {
        self.swallowed.clone()
    }

    fn open_connections(&self) -> &OpenConnections {
        &self.connections
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
        kept: Arc<KeptPorts>,
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
                    bound: false,
                    upstream: upstream.to_owned(),
                    enabled: false,
                }),
                accept_loop: tokio::sync::Mutex::new(None),
                id: NEXT_PROXY_ID.fetch_add(1, Ordering::Relaxed),
                kept,
                toxics: watch::Sender::new(Vec::new()),
                faults: Mutex::new(Vec::new()),
                next_fault_id: AtomicU64::new(0),
                connections: Arc::new(OpenConnections::default()),
                held: Arc::new(AtomicUsize::new(0)),
                swallowed: Arc::new(AtomicUsize::new(0)),
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

    /// Whether `listen` names the address this proxy listens on (see `Settings::is_same_listen`).
    pub(crate) async fn listens_on(&self, listen: &str) -> bool {
        match resolve(listen).await {
            Ok(resolved) => self.shared.settings().is_same_listen(listen, resolved),
            Err(_) => false,
        }
    }

    pub fn info(&self) -> ProxyInfo {
        let settings = self.shared.settings();
        ProxyInfo {
            name: self.shared.name.clone(),
            listen: settings.shown_listen(),
            upstream: settings.upstream,
            enabled: settings.enabled,
            toxics: self.toxics(),
        }
    }

    /// `false`: close the listener (new connections are refused) and cut every open
    /// connection; the port stays held, by a socket that does not listen. `true`: listen again,
    /// on the same address and port.
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
        let new_listen = new_listen.filter(|(listen, addr)| !current.is_same_listen(listen, *addr));
        let upstream_changed = change
            .upstream
            .as_ref()
            .is_some_and(|u| *u != current.upstream);
        let enabled = change.enabled.unwrap_or(current.enabled);

        // Bind before tearing anything down: if the address is unusable, the proxy
        // stays exactly as it was.
        let listener = if enabled && (new_listen.is_some() || accept_loop.is_none()) {
            match new_listen.as_ref() {
                Some((_, address)) => Some(bind(*address, &self.shared.kept)?),
                None => Some(self.listen_again(current.listen_addr)?),
            }
        } else {
            None
        };
        if !enabled || listener.is_some() {
            // Disabling in place: the socket that keeps the port binds it while the listener
            // still holds it, so the port is never free for a moment (in such a moment any
            // program's outgoing connection could take it, and enabling again would fail).
            let keeper = if !enabled && new_listen.is_none() && accept_loop.is_some() {
                park(current.listen_addr)
            } else {
                None
            };
            stop_accepting(&mut accept_loop).await;
            if new_listen.is_some() {
                // The port held for the old address is of no more use.
                self.shared.kept.let_go(self.shared.id);
            } else if let Some(keeper) = keeper {
                self.shared
                    .kept
                    .keep(self.shared.id, current.listen_addr, keeper);
            }
        }
        if !enabled || new_listen.is_some() || upstream_changed {
            self.shared.connections.cut_all();
        }

        let mut settings = self.shared.settings.lock();
        if let Some((listen, address)) = new_listen {
            // Also while disabled: enabling later must bind the new address.
            settings.listen = listen;
            settings.listen_addr = address;
            settings.bound = false;
        }
        if let Some(upstream) = change.upstream {
            settings.upstream = upstream;
        }
        settings.enabled = enabled;
        if let Some(listener) = listener {
            if let Ok(bound) = listener.local_addr() {
                settings.listen_addr = bound;
            }
            settings.bound = true;
            let accepting = accept_connections(listener, self.shared.clone());
            *accept_loop = Some(tokio::spawn(accepting));
        }
        Ok(())
    }

    /// Listens on `address` again after the proxy was disabled: on the socket that kept its port
    /// if there is one, else on a new one.
    fn listen_again(&self, address: SocketAddr) -> Result<TcpListener, Error> {
        let kept = &self.shared.kept;
        let Some(parked) = kept.take_back(self.shared.id, address) else {
            // Not kept (another proxy took the port over, or it could not be held): bound anew,
            // which says "address in use" if another proxy listens there now, as Toxiproxy does.
            return bind(address, kept);
        };
        match parked.listen(LISTEN_BACKLOG) {
            Ok(listener) => Ok(listener),
            // Listening on the parked socket failed: try a new one, which reports the error.
            Err(_) => bind(address, kept),
        }
    }

    /// Stops listening and cuts every connection (for delete and replace).
    pub(crate) async fn shutdown(&self) {
        let mut accept_loop = self.shared.accept_loop.lock().await;
        self.shared.removed.store(true, Ordering::SeqCst);
        stop_accepting(&mut accept_loop).await;
        self.shared.kept.let_go(self.shared.id);
        self.shared.connections.cut_all();
    }

    /// Like [`Self::shutdown`], without waiting (for `Drop`).
    pub(crate) fn shutdown_now(&self) {
        self.shared.removed.store(true, Ordering::SeqCst);
        if let Ok(mut accept_loop) = self.shared.accept_loop.try_lock()
            && let Some(task) = accept_loop.take()
        {
            task.abort();
        }
        self.shared.kept.let_go(self.shared.id);
        self.shared.connections.cut_all();
    }

    /// The toxics in Toxiproxy's order: the upstream ones, then the downstream ones, each in
    /// the order they were added (Toxiproxy keeps one chain per stream and lists them so).
    pub fn toxics(&self) -> Vec<Toxic> {
        let mut toxics = self.shared.toxics.borrow().clone();
        // Stable: the order within a stream is kept.
        toxics.sort_by_key(|toxic| toxic.stream != Stream::Upstream);
        toxics
    }

    /// How many chunks a latency or reset_peer toxic is holding back right now.
    pub fn held_chunks(&self) -> usize {
        self.shared.held.load(Ordering::SeqCst)
    }

    /// How many chunks a timeout toxic has swallowed on this proxy so far (a running total,
    /// over all connections and both streams).
    pub fn swallowed_chunks(&self) -> usize {
        self.shared.swallowed.load(Ordering::SeqCst)
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
        let state = self
            .shared
            .add_fault(fault, connections, Arming::NextConnections);
        ArmedFault { state }
    }

    /// Arms `fault` to strike when the returned [`Trigger`] fires, at most `times` times.
    pub fn arm_on_trigger(&self, fault: Fault, times: usize) -> (ArmedFault, Trigger) {
        let state = self.shared.add_fault(fault, times, Arming::OnTrigger);
        let trigger = Trigger::new(state.clone(), self.shared.connections.clone());
        (ArmedFault { state }, trigger)
    }

    /// Disarms every fault armed on this proxy, including those aimed at open connections.
    pub fn disarm_all_faults(&self) {
        self.shared.disarm_all_faults();
    }

    /// The faults armed on this proxy (oldest first): those that may still strike, and the
    /// last few spent ones, with their fired counts. Disarmed faults are not listed.
    pub fn faults(&self) -> Vec<FaultInfo> {
        self.shared
            .faults
            .lock()
            .iter()
            .filter(|fault| !fault.is_disarmed())
            .map(|fault| fault.info())
            .collect()
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

/// Listens on `address`, with `SO_REUSEPORT` so that disabling can [`park`] the port before the
/// listener closes. A disabled proxy of the registry that keeps the port gives it up first. A
/// port that another socket listens on, or that something else holds, is then refused, as a
/// plain listener would be (two `SO_REUSEPORT` sockets would otherwise share the port); port 0
/// needs no such check, as the kernel never hands it out to share.
fn bind(address: SocketAddr, kept: &KeptPorts) -> Result<TcpListener, Error> {
    let listen = || {
        if address.port() != 0 {
            kept.hand_over(address);
            ensure_nobody_listens(address)?;
        }
        let socket = new_socket(address)?;
        // `SO_REUSEADDR` as every listener has: the connections it accepted may linger in
        // `TIME_WAIT` on this port, and must not keep it from listening again.
        socket.set_reuseaddr(true)?;
        socket.set_reuseport(true)?;
        socket.bind(address)?;
        socket.listen(LISTEN_BACKLOG)
    };
    listen().map_err(|source| listen_error(address, source))
}

fn listen_error(address: SocketAddr, source: std::io::Error) -> Error {
    Error::Listen {
        address: address.to_string(),
        source,
    }
}

fn new_socket(address: SocketAddr) -> std::io::Result<TcpSocket> {
    if address.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
}

/// Fails with "address in use" if a socket listens on `address` or holds it without
/// `SO_REUSEADDR` (as a disabled proxy of another registry does): a socket with `SO_REUSEADDR`
/// only (bound, then dropped) is refused by both, and not by the connections that linger on the
/// port in `TIME_WAIT`.
fn ensure_nobody_listens(address: SocketAddr) -> std::io::Result<()> {
    let probe = new_socket(address)?;
    probe.set_reuseaddr(true)?;
    probe.bind(address)
}

/// Stops the accept loop, if one runs; says whether one did.
async fn stop_accepting(accept_loop: &mut Option<JoinHandle<()>>) -> bool {
    let Some(task) = accept_loop.take() else {
        return false;
    };
    task.abort();
    // Waiting for the aborted task drops its listener: the port is closed
    // when this returns, not at some later poll.
    let _ = task.await;
    true
}

/// Where the ids of [`KeptPorts`]' keepers come from.
static NEXT_PROXY_ID: AtomicU64 = AtomicU64::new(1);

/// The ports that one registry's disabled proxies keep (see [`park`]), by address. A disabled
/// proxy keeps its port from every other program, and not from the registry's other proxies: one
/// that asks for that address takes it over ([`bind`]), as in Toxiproxy, where a disabled proxy
/// has given its port up. Enabling the first one then binds anew, and fails with "address in
/// use" while the other one listens, as Toxiproxy's does.
#[derive(Default)]
pub(crate) struct KeptPorts {
    sockets: Mutex<HashMap<SocketAddr, KeptPort>>,
}

struct KeptPort {
    /// The id of the proxy that keeps the port.
    keeper: u64,
    socket: TcpSocket,
}

impl KeptPorts {
    fn keep(&self, keeper: u64, address: SocketAddr, socket: TcpSocket) {
        self.sockets
            .lock()
            .insert(address, KeptPort { keeper, socket });
    }

    /// The socket `keeper` keeps for `address`, to listen on again; `None` if another proxy
    /// took the port over meanwhile.
    fn take_back(&self, keeper: u64, address: SocketAddr) -> Option<TcpSocket> {
        let mut sockets = self.sockets.lock();
        match sockets.get(&address) {
            Some(kept) if kept.keeper == keeper => sockets.remove(&address).map(|kept| kept.socket),
            _ => None,
        }
    }

    /// Gives `address` up, whoever keeps it: a proxy asks for it.
    fn hand_over(&self, address: SocketAddr) {
        self.sockets.lock().remove(&address);
    }

    /// Gives up the port `keeper` keeps, if any (it was moved or removed).
    fn let_go(&self, keeper: u64) {
        self.sockets.lock().retain(|_, kept| kept.keeper != keeper);
    }
}

/// A socket bound to `address` that does not listen: the kernel refuses connections to it (no
/// listener), and gives its port to no one else, neither to a `bind` to port 0 nor to an
/// outgoing connection. It binds while the listener still listens on the port, which
/// `SO_REUSEPORT` (on both) allows. Without `SO_REUSEADDR` it is exclusive: a server that binds
/// the port by number with `SO_REUSEADDR`, as servers do, is refused (with it, both sockets
/// would have it, and the server could listen on the disabled proxy's port). Only a socket that
/// also asks for `SO_REUSEPORT` could share the port: [`bind`] checks first, and takes the port
/// over from a disabled proxy of its own registry. `None` if the port cannot be held: enabling
/// then binds anew, as Toxiproxy does.
fn park(address: SocketAddr) -> Option<TcpSocket> {
    let socket = new_socket(address).ok()?;
    socket.set_reuseport(true).ok()?;
    socket.bind(address).ok()?;
    Some(socket)
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
        let (id, connection) = proxy.connections.register();
        if let Some(fault) = proxy.claim_fault_for_new_connection() {
            connection.aim(PendingFault::new(fault));
        }
        tokio::spawn(serve_connection(client, proxy.clone(), id, connection));
    }
}
