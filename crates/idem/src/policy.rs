//! The settings of a coordinator, and the two presets the lab compares.
//!
//! * [`Policy::compatible`] behaves like idempotency-kit 0.4.1, the library the lesson uses,
//!   including the weaknesses the lesson demonstrates (no owner token, no renewal, fail-open,
//!   minute TTLs, invalid keys run unprotected). Only its latency and its key handling are
//!   fixed: Redis calls are bounded by [`Policy::command_timeout`], and keys are trimmed on every
//!   path.
//! * [`Policy::hardened`] closes those gaps: owner tokens with compare-and-set, lease renewal,
//!   fencing tokens, fail-closed, exact TTLs, invalid keys refused.
//!
//! Every field is public and has a builder-style setter of the same name, so a scenario can
//! start from a preset and change one thing:
//!
//! ```
//! use std::time::Duration;
//! use idem::{InFlight, Policy};
//!
//! // What the payments lesson configures: raise while in flight, 30 s lease.
//! let policy = Policy::compatible().in_flight(InFlight::Raise).lease(Duration::from_secs(30));
//! assert_eq!(policy.renew_every, None);
//! ```

use std::time::Duration;

/// What a call does when another call holds the key and its action is still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InFlight {
    /// Poll every [`Policy::poll_interval`] until the holder's result appears (replay it), its
    /// reservation goes away (reserve and run), or one lease has passed since we started waiting
    /// ([`Error::InProgress`](crate::Error::InProgress)). idempotency-kit's default.
    Wait,
    /// Fail at once with [`Error::InProgress`](crate::Error::InProgress); an HTTP API answers 409
    /// and the client retries later. What the payments lesson uses.
    Raise,
    /// Take no reservation at all: read, run, then store the result only if the key is still
    /// free. Concurrent duplicates all run the action; use it only where that is acceptable.
    Run,
}

/// How long a stored result is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TtlPolicy {
    /// idempotency-kit's rule: whole minutes rounded down, at least one
    /// (`max(1, ttl_secs // 60) * 60`), and if that falls outside `[min, max]` the result is
    /// **not stored at all**. 90 s keeps a result for 60 s; 30 s also for 60 s.
    WholeMinutes { min: Duration, max: Duration },
    /// Exactly the requested TTL, to the millisecond (Redis `PX`). A TTL under a millisecond
    /// cannot be stored.
    Exact,
}

impl TtlPolicy {
    /// idempotency-kit's bounds: one minute to thirty days.
    pub const WHOLE_MINUTES: TtlPolicy = TtlPolicy::WholeMinutes {
        min: Duration::from_secs(60),
        max: Duration::from_secs(30 * 24 * 3600),
    };

    /// The TTL a result requested with `requested` is stored with, or `None` if it is not stored.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::TtlPolicy;
    ///
    /// let minutes = |secs| TtlPolicy::WHOLE_MINUTES.resolve(Duration::from_secs(secs)).map(|d| d.as_secs());
    /// // The reference's table (section 10).
    /// assert_eq!(minutes(3600), Some(3600));
    /// assert_eq!(minutes(90), Some(60));
    /// assert_eq!(minutes(30), Some(60));
    /// assert_eq!(minutes(119), Some(60));
    /// assert_eq!(minutes(120), Some(120));
    /// assert_eq!(minutes(0), Some(60));
    /// assert_eq!(minutes(2_592_000), Some(2_592_000));
    /// assert_eq!(minutes(2_592_060), None); // over 30 days: not stored
    /// ```
    pub fn resolve(&self, requested: Duration) -> Option<Duration> {
        match *self {
            TtlPolicy::WholeMinutes { min, max } => {
                // Python's `ttl_seconds` is an int, and `//` floors: 119 s is one minute.
                let minutes = (requested.as_secs() / 60).max(1);
                let ttl = Duration::from_secs(minutes * 60);
                (min..=max).contains(&ttl).then_some(ttl)
            }
            TtlPolicy::Exact => {
                let ttl =
                    Duration::from_millis(requested.as_millis().try_into().unwrap_or(u64::MAX));
                (!ttl.is_zero()).then_some(ttl)
            }
        }
    }
}

/// What happens when Redis fails (refused, timed out, answered with an error, or holds a record
/// that cannot be read) before the action has run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnStorageError {
    /// Fail open: run the action without protection, as idempotency-kit does. A retry during the
    /// outage runs it again: two charges, unless the provider deduplicates.
    RunUnprotected,
    /// Fail closed: return [`Error::Storage`](crate::Error::Storage) and do not run the action.
    /// No duplicate is possible, and no progress either while Redis is away.
    Fail,
}

/// Who may complete, renew or release a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ownership {
    /// Anyone: completing is a plain `SET`, releasing a plain `DEL`, as in idempotency-kit. A
    /// holder whose lease lapsed overwrites (or deletes) the next holder's reservation.
    Unchecked,
    /// Only the holder: each reservation gets a random owner token, and completing, renewing and
    /// releasing are Lua scripts that compare it first. Each reservation also draws a fencing
    /// token from a per-key counter, handed to the action (see the crate docs, "Fencing").
    Fenced,
}

/// What happens to a call whose operation or key fails [`validate`](crate::validate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InvalidKey {
    /// Run the action without protection and store nothing, as idempotency-kit 0.4.1 does. Every
    /// retry runs it again. A service must refuse such keys itself (HTTP 400) before it calls.
    RunUnprotected,
    /// Return [`Error::Invalid`](crate::Error::Invalid) without running the action
    /// (idempotency-kit 0.5.0's behaviour).
    Reject,
}

/// Everything a [`Coordinator`](crate::Coordinator) does differently between the two presets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// A second caller's fate while the first one's action runs.
    pub in_flight: InFlight,
    /// How long a reservation holds without renewal. It must outlive the action (plus the
    /// action's own timeouts), or a second caller takes the key while the first still runs.
    /// Also how long a [`InFlight::Wait`] caller waits at most.
    pub lease: Duration,
    /// Renew the reservation this often while the action runs, or never (`None`). A third of
    /// the lease leaves two renewals' worth of slack for a slow Redis.
    pub renew_every: Option<Duration>,
    /// How long a result is kept, and whether it is kept at all.
    pub ttl: TtlPolicy,
    /// Fail open or closed when Redis fails before the action runs.
    pub on_storage_error: OnStorageError,
    /// Plain writes, or owner tokens, compare-and-set and fencing.
    pub ownership: Ownership,
    /// Run or refuse a call with an invalid key.
    pub invalid_key: InvalidKey,
    /// The most any one Redis command (or script) may take, connecting included. A dead Redis
    /// then costs a call about this much (once per command it sends), not the seconds a client's
    /// own retries take. See the crate docs, "Configuring the connection".
    pub command_timeout: Duration,
    /// How often an [`InFlight::Wait`] caller polls the key. idempotency-kit polls every 50 ms.
    pub poll_interval: Duration,
    /// [`Ownership::Fenced`] only: how much longer than its record the fence counter is kept.
    /// Fencing tokens are monotonic per key only while the counter exists; this must cover how
    /// long a stalled holder might still act with an old token after the record is gone.
    pub fence_retention: Duration,
    /// A command whose connection turned out to be dropped (a Redis restart, a failover, a
    /// network blip since the last command) is sent once more, on the fresh connection the
    /// client opens, within the same `command_timeout`. Without it, the first call after any
    /// blip fails: open under the compatible policy (an unprotected action), closed under the
    /// hardened one (a 503 although Redis is back). A reserve sent again may have landed the
    /// first time: the coordinator tells its own reservation apart (see `store.rs`).
    pub resend_on_dropped: bool,
}

/// idempotency-kit's default lease (`DEFAULT_IN_FLIGHT_LEASE_SECONDS`).
const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Short enough that a dead Redis costs well under a second per call, long enough for a healthy
/// Redis on a LAN (sub-millisecond) or a busy one (a few ms) with a wide margin.
const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_millis(250);
/// idempotency-kit's `IN_FLIGHT_POLL_INTERVAL_SECONDS`.
const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(50);
/// A day: far longer than any pause a holder survives, and a counter is a few dozen bytes.
const DEFAULT_FENCE_RETENTION: Duration = Duration::from_secs(24 * 3600);

impl Policy {
    /// idempotency-kit 0.4.1's behaviour, with bounded Redis calls and consistent key trimming.
    pub fn compatible() -> Policy {
        Policy {
            in_flight: InFlight::Wait,
            lease: DEFAULT_LEASE,
            renew_every: None,
            ttl: TtlPolicy::WHOLE_MINUTES,
            on_storage_error: OnStorageError::RunUnprotected,
            ownership: Ownership::Unchecked,
            invalid_key: InvalidKey::RunUnprotected,
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            poll_interval: DEFAULT_POLL_INTERVAL,
            fence_retention: DEFAULT_FENCE_RETENTION,
            resend_on_dropped: true,
        }
    }

    /// The lab's fixed side: owner tokens with compare-and-set, renewal every lease/3, fencing,
    /// fail-closed, exact TTLs, invalid keys refused.
    pub fn hardened() -> Policy {
        Policy {
            in_flight: InFlight::Wait,
            lease: DEFAULT_LEASE,
            renew_every: Some(DEFAULT_LEASE / 3),
            ttl: TtlPolicy::Exact,
            on_storage_error: OnStorageError::Fail,
            ownership: Ownership::Fenced,
            invalid_key: InvalidKey::Reject,
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            poll_interval: DEFAULT_POLL_INTERVAL,
            fence_retention: DEFAULT_FENCE_RETENTION,
            resend_on_dropped: true,
        }
    }

    /// Sets [`Policy::in_flight`].
    pub fn in_flight(mut self, in_flight: InFlight) -> Policy {
        self.in_flight = in_flight;
        self
    }

    /// Sets [`Policy::lease`]. If the policy renews, the renewal interval becomes a third of the
    /// new lease; call [`Policy::renew_every`] afterwards to choose another.
    pub fn lease(mut self, lease: Duration) -> Policy {
        self.lease = lease;
        if self.renew_every.is_some() {
            self.renew_every = Some(lease / 3);
        }
        self
    }

    /// Sets [`Policy::renew_every`].
    pub fn renew_every(mut self, every: Option<Duration>) -> Policy {
        self.renew_every = every;
        self
    }

    /// Sets [`Policy::ttl`].
    pub fn ttl(mut self, ttl: TtlPolicy) -> Policy {
        self.ttl = ttl;
        self
    }

    /// Sets [`Policy::on_storage_error`].
    pub fn on_storage_error(mut self, on_storage_error: OnStorageError) -> Policy {
        self.on_storage_error = on_storage_error;
        self
    }

    /// Sets [`Policy::ownership`].
    pub fn ownership(mut self, ownership: Ownership) -> Policy {
        self.ownership = ownership;
        self
    }

    /// Sets [`Policy::invalid_key`].
    pub fn invalid_key(mut self, invalid_key: InvalidKey) -> Policy {
        self.invalid_key = invalid_key;
        self
    }

    /// Sets [`Policy::command_timeout`].
    pub fn command_timeout(mut self, timeout: Duration) -> Policy {
        self.command_timeout = timeout;
        self
    }

    /// Sets [`Policy::resend_on_dropped`] (`false`: the first command after a blip fails, as
    /// with a client that does not reconnect and retry).
    pub fn resend_on_dropped(mut self, resend: bool) -> Policy {
        self.resend_on_dropped = resend;
        self
    }

    /// Sets [`Policy::poll_interval`].
    pub fn poll_interval(mut self, interval: Duration) -> Policy {
        self.poll_interval = interval;
        self
    }

    /// Sets [`Policy::fence_retention`].
    pub fn fence_retention(mut self, retention: Duration) -> Policy {
        self.fence_retention = retention;
        self
    }

    /// Panics on settings that cannot work, with the reason (see [`Coordinator::new`](crate::Coordinator::new)).
    pub(crate) fn assert_usable(&self) {
        assert!(
            self.lease >= Duration::from_millis(1),
            "Policy::lease must be at least 1 ms (Redis PX counts milliseconds)"
        );
        if let Some(every) = self.renew_every {
            assert!(!every.is_zero(), "Policy::renew_every must not be zero");
        }
        assert!(
            !self.command_timeout.is_zero(),
            "Policy::command_timeout must not be zero"
        );
        assert!(
            !self.poll_interval.is_zero(),
            "Policy::poll_interval must not be zero"
        );
    }
}

impl Default for Policy {
    /// The compatible policy, as idempotency-kit's defaults.
    fn default() -> Policy {
        Policy::compatible()
    }
}
