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
//!
//! Faults have an HTTP form too, a lab extension beside the Toxiproxy API (see `api.rs`):
//! a fault is named there by [`Fault::name`] (`"response_lost_after_commit"`, ...), and
//! an armed one is shown as a [`FaultInfo`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::error::Error;

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
    /// Every fault's name, as [`Fault::name`] gives it.
    pub const NAMES: [&'static str; 5] = [
        "response_lost_after_commit",
        "request_lost",
        "slow_response",
        "connection_refused",
        "reset",
    ];

    /// The fault's name in the HTTP API, e.g. `"response_lost_after_commit"`.
    pub fn name(&self) -> &'static str {
        match self {
            Fault::ResponseLostAfterCommit => "response_lost_after_commit",
            Fault::RequestLost => "request_lost",
            Fault::SlowResponse(_) => "slow_response",
            Fault::ConnectionRefused => "connection_refused",
            Fault::Reset => "reset",
        }
    }

    /// The fault named `name` (as [`Fault::name`] gives it). `delay_ms` is `slow_response`'s
    /// delay, required there and refused elsewhere: a delay given to another fault is a
    /// mistake better reported than ignored.
    pub fn from_name(name: &str, delay_ms: Option<u64>) -> Result<Fault, Error> {
        let fault = match name {
            "response_lost_after_commit" => Fault::ResponseLostAfterCommit,
            "request_lost" => Fault::RequestLost,
            "connection_refused" => Fault::ConnectionRefused,
            "reset" => Fault::Reset,
            "slow_response" => {
                let delay_ms = delay_ms.ok_or_else(|| Error::MissingField("delay_ms".into()))?;
                return Ok(Fault::SlowResponse(Duration::from_millis(delay_ms)));
            }
            other => {
                return Err(Error::BadRequestBody(format!(
                    "unknown fault {other:?}, expected one of {}",
                    Fault::NAMES.join(", ")
                )));
            }
        };
        if delay_ms.is_some() {
            return Err(Error::BadRequestBody(format!(
                "delay_ms applies to slow_response only, not to {name}"
            )));
        }
        Ok(fault)
    }

    /// `slow_response`'s delay in milliseconds; `None` for the other faults.
    pub fn delay_ms(&self) -> Option<u64> {
        match self {
            Fault::SlowResponse(delay) => {
                Some(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX))
            }
            _ => None,
        }
    }

    pub(crate) fn stage(&self) -> Stage {
        match self {
            Fault::ConnectionRefused => Stage::Accepted,
            Fault::RequestLost | Fault::Reset => Stage::ClientSent,
            Fault::ResponseLostAfterCommit | Fault::SlowResponse(_) => Stage::ServerReplied,
        }
    }
}

/// How an armed fault picks its connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arming {
    /// [`Proxy::arm`](crate::Proxy::arm) (and the HTTP API): the next N connections.
    NextConnections,
    /// [`Proxy::arm_on_trigger`](crate::Proxy::arm_on_trigger): when its trigger fires.
    OnTrigger,
}

/// An armed fault as the HTTP API shows it (`GET /lab/proxies/{proxy}/faults`):
///
/// ```json
/// {"id": 1, "fault": "slow_response", "delay_ms": 900, "arming": "next_connections",
///  "uses_left": 1, "fired": 0}
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "FaultInfoJson", into = "FaultInfoJson")]
pub struct FaultInfo {
    /// Unique within its proxy.
    pub id: u64,
    pub fault: Fault,
    pub arming: Arming,
    /// Connections (or fires, for a trigger) still to come.
    pub uses_left: usize,
    /// How many connections it has damaged so far.
    pub fired: usize,
}

/// [`FaultInfo`]'s wire form: the fault flattened into a name and an optional delay.
#[derive(Serialize, Deserialize)]
struct FaultInfoJson {
    id: u64,
    fault: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    delay_ms: Option<u64>,
    arming: Arming,
    uses_left: usize,
    fired: usize,
}

impl TryFrom<FaultInfoJson> for FaultInfo {
    type Error = Error;

    fn try_from(json: FaultInfoJson) -> Result<FaultInfo, Error> {
        Ok(FaultInfo {
            id: json.id,
            fault: Fault::from_name(&json.fault, json.delay_ms)?,
            arming: json.arming,
            uses_left: json.uses_left,
            fired: json.fired,
        })
    }
}

impl From<FaultInfo> for FaultInfoJson {
    fn from(info: FaultInfo) -> FaultInfoJson {
        FaultInfoJson {
            id: info.id,
            fault: info.fault.name().to_owned(),
            delay_ms: info.fault.delay_ms(),
            arming: info.arming,
            uses_left: info.uses_left,
            fired: info.fired,
        }
    }
}

/// The shared state behind an [`ArmedFault`] and its [`Trigger`].
#[derive(Debug)]
pub(crate) struct FaultState {
    /// Given by the proxy, unique within it: how the HTTP API names this fault.
    pub(crate) id: u64,
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
    pub(crate) fn new(id: u64, fault: Fault, uses: usize, arming: Arming) -> Arc<FaultState> {
        Arc::new(FaultState {
            id,
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

    pub(crate) fn fired_count(&self) -> usize {
        *self.fired.borrow()
    }

    pub(crate) fn info(&self) -> FaultInfo {
        FaultInfo {
            id: self.id,
            fault: self.fault.clone(),
            arming: self.arming,
            uses_left: self.uses_left(),
            fired: self.fired_count(),
        }
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
        self.state.fired_count()
    }

    /// The fault as the HTTP API shows it (its id, uses left and fired count).
    pub fn info(&self) -> FaultInfo {
        self.state.info()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for name in Fault::NAMES {
            let delay = (name == "slow_response").then_some(900);
            let fault = Fault::from_name(name, delay).unwrap();
            assert_eq!((fault.name(), fault.delay_ms()), (name, delay));
        }
        assert!(matches!(
            Fault::from_name("slow_response", None),
            Err(Error::MissingField(_))
        ));
        assert!(matches!(
            Fault::from_name("reset", Some(5)),
            Err(Error::BadRequestBody(_))
        ));
        assert!(matches!(
            Fault::from_name("explode", None),
            Err(Error::BadRequestBody(_))
        ));
    }

    #[test]
    fn info_json_flattens_the_fault() {
        let info = FaultInfo {
            id: 3,
            fault: Fault::SlowResponse(Duration::from_millis(900)),
            arming: Arming::NextConnections,
            uses_left: 1,
            fired: 0,
        };
        let json = serde_json::to_value(&info).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"id": 3, "fault": "slow_response", "delay_ms": 900,
                "arming": "next_connections", "uses_left": 1, "fired": 0})
        );
        assert_eq!(serde_json::from_value::<FaultInfo>(json).unwrap(), info);
    }
}
