//! One-shot faults: deterministic failures named by what the learner sees.
//!
//! Toxics are weather: they apply to every connection, with some probability.
//! A scenario needs the opposite: "break *this* request, exactly once, in exactly
//! this way, then let the retry through". That is a [`Fault`].
//!
//! A fault is armed on a proxy in one of two ways:
//!
//! * [`Proxy::arm`](crate::Proxy::arm): the next N connections accepted by the proxy get it;
//! * [`Proxy::arm_on_trigger`](crate::Proxy::arm_on_trigger): nothing happens until
//!   [`Trigger::fire`] is called, e.g. from a service checkpoint ("payments: charged,
//!   about to respond"); then the fault is aimed at the connections open at that
//!   moment, and the first of them to reach the fault's moment (for
//!   `ResponseLostAfterCommit`: the first bytes of the response) takes the hit.
//!   Each fire is one use. "Open" means every connection, idle ones too: an idle
//!   keep-alive connection of a pooling client is aimed at as well, and if it happens
//!   to carry the next reply it takes the hit. Scenarios that fire triggers therefore
//!   use clients without connection reuse, one connection per request.
//!
//! Either way the caller gets an [`ArmedFault`] handle, whose [`ArmedFault::fired`]
//! resolves once the learner-visible damage has happened (the RST was sent, the
//! request was swallowed, ...), so a scenario can narrate without sleeping.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;

/// A deterministic, one-shot network failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The request reaches the server; as soon as the server starts answering
    /// (proof that it finished its work, e.g. committed), the answer is swallowed
    /// and the client's connection is reset. The client cannot tell whether the
    /// work happened: the reason idempotency keys exist.
    ResponseLostAfterCommit,
    /// The client connects and sends, but nothing reaches the server; once the
    /// client has sent something, its connection is closed.
    RequestLost,
    /// The response is held back for this long from its first byte, then
    /// delivered in full (nothing is ever lost, including a close right after it).
    SlowResponse(Duration),
    /// The connection is cut at once (RST) before any byte reaches the server.
    ConnectionRefused,
    /// The request is forwarded to the server, then the client's connection is
    /// reset right away, while the server is still working on it. The server is
    /// left to finish; its answer is discarded.
    Reset,
}

/// The moment in a connection's life at which a fault strikes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// The proxy accepted the connection.
    Accepted,
    /// The client's first bytes arrived at the proxy.
    ClientSent,
    /// The server's first bytes (or its close) arrived at the proxy.
    ServerReplied,
}

impl Fault {
    pub(crate) fn stage(&self) -> Stage {
        match self {
            Fault::ConnectionRefused => Stage::Accepted,
            Fault::RequestLost | Fault::Reset => Stage::ClientSent,
            Fault::ResponseLostAfterCommit | Fault::SlowResponse(_) => Stage::ServerReplied,
        }
    }
}

/// How an armed fault picks its connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arming {
    NextConnections,
    OnTrigger,
}

/// The shared state behind an [`ArmedFault`] and its [`Trigger`].
#[derive(Debug)]
pub(crate) struct FaultState {
    fault: Fault,
    pub(crate) arming: Arming,
    /// Connections (for `arm`) or fires (for `arm_on_trigger`) still allowed.
    uses_left: Mutex<usize>,
    /// Set by [`ArmedFault::disarm`] and by `reset`: stops even uses already
    /// handed to a connection.
    disarmed: AtomicBool,
    /// How many times the damage was done; a watch so that callers can await it.
    fired: watch::Sender<usize>,
}

impl FaultState {
    pub(crate) fn new(fault: Fault, uses: usize, arming: Arming) -> Arc<FaultState> {
        Arc::new(FaultState {
            fault,
            arming,
            uses_left: Mutex::new(uses),
            disarmed: AtomicBool::new(false),
            fired: watch::Sender::new(0),
        })
    }

    pub(crate) fn fault(&self) -> &Fault {
        &self.fault
    }

    /// Takes one use, if any is left.
    pub(crate) fn take_use(&self) -> bool {
        if self.is_disarmed() {
            return false;
        }
        // Checked and taken under one lock: two connections (or two fires) racing
        // for the last use cannot both get it.
        let mut uses_left = self.uses_left.lock();
        if *uses_left == 0 {
            return false;
        }
        *uses_left -= 1;
        true
    }

    pub(crate) fn uses_left(&self) -> usize {
        if self.is_disarmed() {
            return 0;
        }
        *self.uses_left.lock()
    }

    pub(crate) fn disarm(&self) {
        self.disarmed.store(true, Ordering::SeqCst);
    }

    pub(crate) fn is_disarmed(&self) -> bool {
        self.disarmed.load(Ordering::SeqCst)
    }

    /// Called once the damage is done (never before: callers of `fired()` narrate it).
    pub(crate) fn record_fired(&self) {
        self.fired.send_modify(|count| *count += 1);
    }
}

/// A fault waiting on one connection for its [`Stage`].
pub(crate) struct PendingFault {
    pub(crate) state: Arc<FaultState>,
    /// Shared by all connections that one fire aimed at: the first connection to
    /// flip it takes the hit, the others pass untouched.
    claim: Arc<AtomicBool>,
}

impl PendingFault {
    /// A use already taken (at accept, or by a fire), aimed at one connection.
    pub(crate) fn new(state: Arc<FaultState>) -> PendingFault {
        PendingFault {
            state,
            claim: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The same use, aimed at one more connection.
    pub(crate) fn also_for_another_connection(&self) -> PendingFault {
        PendingFault {
            state: self.state.clone(),
            claim: self.claim.clone(),
        }
    }

    pub(crate) fn is_spent(&self) -> bool {
        self.state.is_disarmed() || self.claim.load(Ordering::SeqCst)
    }

    pub(crate) fn try_claim(&self) -> bool {
        !self.state.is_disarmed()
            && self
                .claim
                .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
    }
}

/// Handle to an armed fault: watch it fire, or disarm it.
#[derive(Clone, Debug)]
pub struct ArmedFault {
    pub(crate) state: Arc<FaultState>,
}

impl ArmedFault {
    pub fn fault(&self) -> &Fault {
        self.state.fault()
    }

    /// How many connections the fault has damaged so far (one per connection
    /// for every fault; a fired `ConnectionRefused` cuts all open connections).
    pub fn fired_count(&self) -> usize {
        *self.state.fired.borrow()
    }

    /// Connections (for `arm`) or fires (for `arm_on_trigger`) still to come.
    pub fn uses_left(&self) -> usize {
        self.state.uses_left()
    }

    /// Resolves once the fault has done its damage at least once (immediately if
    /// it already has). Wrap it in `tokio::time::timeout` if it might never fire.
    pub async fn fired(&self) {
        self.fired_times(1).await;
    }

    /// Resolves once the fault has done its damage at least `times` times.
    pub async fn fired_times(&self, times: usize) {
        let mut fired = self.state.fired.subscribe();
        // Cannot fail: the sender lives in `self.state`, which we hold.
        let _ = fired.wait_for(|count| *count >= times).await;
    }

    /// Stops the fault, including uses already handed to open connections.
    pub fn disarm(&self) {
        self.state.disarm();
    }
}

/// What a [`Trigger`] fires at: the connections open through the proxy the fault
/// was armed on.
///
/// Implemented by the proxy's registry of open connections, which owns them and
/// knows how to reach them. A trait so that this module needs nothing from the
/// proxy or its connections: they use faults, faults do not use them back.
pub(crate) trait FaultTarget: Send + Sync {
    /// Takes one use of `fault` and aims it at every open connection; returns how
    /// many that is. Returns 0 and uses nothing if none is open or no use is left.
    fn aim_at_open_connections(&self, fault: &Arc<FaultState>) -> usize;
}

/// Fires an [`ArmedFault`] created by [`Proxy::arm_on_trigger`](crate::Proxy::arm_on_trigger).
/// Cheap to clone; hand it to the code that knows when to break things.
#[derive(Clone)]
pub struct Trigger {
    state: Arc<FaultState>,
    target: Arc<dyn FaultTarget>,
}

impl std::fmt::Debug for Trigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trigger")
            .field("fault", self.state.fault())
            .field("uses_left", &self.state.uses_left())
            .finish()
    }
}

impl Trigger {
    pub(crate) fn new(state: Arc<FaultState>, target: Arc<dyn FaultTarget>) -> Trigger {
        Trigger { state, target }
    }

    /// Aims the fault at every connection open through the proxy right now, and
    /// returns how many that is. The first of them to reach the fault's stage takes
    /// the hit (for `ConnectionRefused`: all of them are cut at once). Returns 0 and
    /// uses nothing if no connection is open or no use is left.
    pub fn fire(&self) -> usize {
        self.target.aim_at_open_connections(&self.state)
    }
}
