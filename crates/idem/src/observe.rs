//! The observability hook: what a coordinator reports while it works.
//!
//! The crate logs nothing and counts nothing itself; instead it calls an optional observer with
//! an [`Event`] at each step that matters. The lab narrates these events ("reserved with fence 7",
//! "Redis did not answer while reserving: ran the action unprotected"); a service wires them to
//! its logger and its metrics (idempotency-kit's hit/miss/collision counters map onto
//! [`EventKind::Replayed`], [`EventKind::Reserved`] and [`EventKind::InFlight`]).
//!
//! The observer runs inline, on the task making the call, so it must be quick and must not
//! block: push to a channel, bump an atomic, write a log line.
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use idem::{Event, EventKind};
//!
//! let replays = Arc::new(AtomicUsize::new(0));
//! let counter = Arc::clone(&replays);
//! let observer = move |event: &Event<'_>| {
//!     if let EventKind::Replayed = event.kind {
//!         counter.fetch_add(1, Ordering::Relaxed);
//!     }
//! };
//! // Coordinator::new(conn, policy).with_observer(observer)
//! # let _ = observer;
//! ```

use std::sync::Arc;

use crate::error::{Stage, StorageError, Unprotected};

/// A shared observer, as stored by [`Coordinator::with_observer`](crate::Coordinator::with_observer).
pub type Observer = Arc<dyn Fn(&Event<'_>) + Send + Sync>;

/// One thing that happened during a coordinated call.
#[derive(Debug, Clone, Copy)]
pub struct Event<'a> {
    /// The operation, trimmed (as given, if it was invalid).
    pub operation: &'a str,
    /// The idempotency key, trimmed (as given, if it was invalid).
    pub key: &'a str,
    /// What happened.
    pub kind: EventKind<'a>,
}

/// What happened. `fence` is the reservation's fencing token ([`Ownership::Fenced`] only).
///
/// [`Ownership::Fenced`]: crate::Ownership::Fenced
#[derive(Debug, Clone, Copy)]
pub enum EventKind<'a> {
    /// We hold the key now; the action is about to run.
    Reserved { fence: Option<u64> },
    /// A completed record was found and its result returned; the action did not run.
    Replayed,
    /// Another call's reservation holds the key (reported once per call, however long it waits).
    InFlight,
    /// A waiting call gave up after a whole lease; it returns [`Error::InProgress`](crate::Error).
    WaitTimedOut,
    /// The stored or reserved request has another fingerprint.
    KeyReused,
    /// The reservation was extended while the action runs.
    Renewed { fence: Option<u64> },
    /// The result was stored.
    Completed { fence: Option<u64> },
    /// The reservation was deleted (the action failed, or its result is not to be stored).
    Released { fence: Option<u64> },
    /// The reservation was no longer ours at `stage`, and the key was left alone. With
    /// [`Ownership::Fenced`](crate::Ownership::Fenced): a compare-and-set found another owner (or
    /// no record) when renewing, completing or releasing. Unfenced, only a renewal can tell: its
    /// `SET … XX` found the key gone.
    LeaseLost { stage: Stage, fence: Option<u64> },
    /// [`InFlight::Run`](crate::InFlight::Run): our action ran, but another caller stored its
    /// result first; that result is returned instead of ours.
    Superseded,
    /// The command of `stage` was sent again, once, because its connection had been dropped
    /// (see `store.rs`); what follows is the second sending's outcome.
    Resent { stage: Stage },
    /// A Redis command failed; `error.stage` says where.
    StorageError { error: &'a StorageError },
    /// The action is about to run (or ran) without protection against a rerun, for this reason.
    RanUnprotected { why: &'a Unprotected },
}
