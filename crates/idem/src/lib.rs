//! A Redis idempotency coordinator: run an action once per idempotency key, and give every retry
//! the stored result instead of a second side effect.
//!
//! Networks lose responses, users press the button twice, brokers redeliver. A payment service
//! that charges on every request charges twice. The client therefore sends an *idempotency key*
//! with each intent (the same key on every retry of it), and the service runs the charge through
//! a coordinator:
//!
//! 1. **Reserve** the key in Redis, atomically: of all the concurrent calls with this key, one
//!    wins and the others see its reservation (a *pending* record) or its result.
//! 2. The winner runs the **action**; the others get [`Error::InProgress`] (HTTP 409) or wait.
//! 3. The winner **stores** the result under the key; every later call **replays** it.
//! 4. If the action fails, the reservation is **released** and the next attempt runs again.
//!
//! ```no_run
//! use std::time::Duration;
//! use idem::{Coordinator, Error, InFlight, Policy, Request, Source, fingerprint_of};
//!
//! # #[derive(serde::Serialize, serde::Deserialize)] struct Charge { id: u64 }
//! # async fn provider_charge(_key: &str) -> Result<Charge, std::io::Error> { Ok(Charge { id: 1 }) }
//! # async fn demo(conn: redis::aio::ConnectionManager) {
//! let coordinator = Coordinator::new(conn, Policy::compatible().in_flight(InFlight::Raise));
//!
//! let fingerprint = fingerprint_of(&serde_json::json!({"order_id": "o-1", "amount": 1990}));
//! let request = Request::new("payment.charge", "client-key-1", Duration::from_secs(3600))
//!     .fingerprint(&fingerprint);
//! match coordinator.coordinate(request, |_fence| provider_charge("payment.charge.client-key-1")).await {
//!     Ok(charged) if matches!(charged.source, Source::Replayed) => { /* 200, Idempotent-Replayed */ }
//!     Ok(charged) => { /* 200 (or 201) with charged.value */ }
//!     Err(Error::InProgress { .. }) => { /* 409, Retry-After: 1 */ }
//!     Err(Error::KeyReused { .. }) => { /* 422: same key, other parameters */ }
//!     Err(Error::Invalid(_)) => { /* 400 */ }
//!     Err(Error::Storage(_)) => { /* 503 (fail-closed policy only) */ }
//!     Err(Error::Action(_)) => { /* the charge failed; the retry may run it again */ }
//! }
//! # }
//! ```
//!
//! # Two policies
//!
//! [`Policy::compatible`] is the Python library idempotency-kit 0.4.1, which the lab's payments
//! lesson uses, weaknesses included, so the lab can show them. [`Policy::hardened`] is the fix.
//! Each row is a field of [`Policy`]; mix them as needed.
//!
//! | | compatible (idempotency-kit 0.4.1) | hardened |
//! |---|---|---|
//! | complete / release | plain `SET` / `DEL`: a holder whose lease lapsed overwrites or deletes the next holder's reservation | Lua compare-and-set / compare-and-delete on an owner token |
//! | lease renewal | none: an action longer than the lease runs twice | every lease/3, compare-and-set |
//! | fencing token | none | monotonic per key, handed to the action |
//! | Redis fails before the action | fail open: run unprotected | fail closed: [`Error::Storage`], no action |
//! | result TTL | whole minutes rounded down, min 1 min; outside 1 min–30 days not stored | exact (ms) |
//! | invalid key | run unprotected, store nothing | [`Error::Invalid`], no action |
//! | Redis timeouts | bounded by [`Policy::command_timeout`] (250 ms) | same |
//! | padded keys (`" k1 "`) | trimmed on every path | same |
//! | a connection dropped since the last command | sent once more on a fresh one ([`Policy::resend_on_dropped`]) | same |
//!
//! The last three rows are deliberate departures from 0.4.1 even in the compatible policy: 0.4.1
//! pays seconds per call for a dead Redis (its client's retries), it trims keys on write but
//! not on read, so a padded key spins for a whole lease (see [`key`]), and the first call after
//! a Redis restart or a network blip fails on the stale connection: open (an unprotected
//! action, whose retry runs it again) under the compatible policy, closed (a refusal although
//! Redis is back) under the hardened one.
//!
//! # Round trips
//!
//! One Redis command (or one script) is one round trip; the reservation and the read of whatever
//! holds the key are a single command, so a replay costs **one** round trip (idempotency-kit
//! pays two: a failed `SET NX`, then a `GET`).
//!
//! | path | compatible (`Wait`/`Raise`) | hardened (`Wait`/`Raise`) |
//! |---|---|---|
//! | new key, action succeeds | `SET NX GET` → nil; action; `SET PX ttl` (**2**) | `reserve.lua`; action; `complete.lua` (**2**), plus `renew.lua` every lease/3 while the action runs |
//! | replay (completed record) | `SET NX GET` → record (**1**) | `reserve.lua` → record (**1**) |
//! | pending record, `Raise` | `SET NX GET` → pending → [`Error::InProgress`] (**1**) | `reserve.lua` → pending (**1**) |
//! | pending record, `Wait` | 1 per [`Policy::poll_interval`] until replay, reservation, or a lease has passed | same, with `reserve.lua` |
//! | action fails | `SET NX GET`; action; `DEL` (**2**) | `reserve.lua`; action; `release.lua` (**2**) |
//! | result not storable (TTL) | `SET NX GET`; action; `DEL` (**2**) | `reserve.lua`; action; `release.lua` (**2**) |
//! | storage down | 1 failed command (≤ command timeout), then the action unprotected, nothing written | 1 failed command, [`Error::Storage`] |
//! | a command on a dropped connection | that command once more, on the fresh connection, inside the same timeout (+**1**); a reserve that landed the first time is recognised as ours (its own pending record, byte for byte) | the same; ours by its owner token, with its fence (see `store.rs`) |
//! | invalid key | 0, action unprotected | 0, [`Error::Invalid`] |
//!
//! [`InFlight::Run`] (no reservation, either policy): replay `GET` (**1**); new key `GET`; action;
//! `SET NX GET PX ttl` (**2**), which either stores the result or returns the record that beat
//! us, in the same trip (idempotency-kit needs a third, a `GET`, for that).
//!
//! The first use of a script on a Redis that has not seen it costs two extra trips once
//! (`NOSCRIPT`, `SCRIPT LOAD`); after that it is a single `EVALSHA`.
//! `SET … NX GET` needs **Redis 7.0** or newer (or Valkey).
//!
//! # Wire compatibility with idempotency-kit
//!
//! Records are stored exactly as idempotency-kit 0.4.x stores them (see [`Record`]): key
//! `<prefix><operation>:<key>` with the default prefix `idempotency:`, value the same compact
//! JSON, expiring at `expires_at`. A Python service and a Rust service sharing one Redis (and one
//! prefix) replay each other's results and honour each other's reservations. The hardened
//! policy's records carry two extra fields (`owner`, `fence`) that Python ignores. Fencing only
//! protects among fenced callers: a compatible (or Python) caller still completes with a plain
//! `SET`. The test `tests/it/python.rs` drives the Python library itself against this crate.
//!
//! # Fencing
//!
//! A lease is a promise that expires. A holder that pauses (a GC stall, a slow provider, a
//! partition) past its lease still believes it holds the key, while a second caller has reserved
//! it and runs too. Owner tokens stop the stale holder's *Redis* writes (its complete and release
//! find a different owner and do nothing). They cannot stop what its action does elsewhere. For
//! that, each fenced reservation draws a token from a per-key counter (`INCR`, in the same script
//! as the reservation) and the action gets it as [`Fence`]; the resource the action writes keeps
//! the largest token it has seen and refuses smaller ones. The counter lives in its own key,
//! beside the record and in the same cluster slot (see [`key::fence_key`]), and outlives the
//! record by [`Policy::fence_retention`], so tokens keep growing when a result expires and the
//! key is used again.
//!
//! # Configuring the connection
//!
//! The coordinator bounds every command with [`Policy::command_timeout`], so a dead Redis costs a
//! call about that much per command it sends (one, in the fail-open and fail-closed paths).
//! Configure the connection so it does not spend that budget on retries of its own, and so it
//! recovers on its own once Redis is back. A `ConnectionManager` (redis feature
//! `connection-manager`) does both:
//!
//! ```no_run
//! use std::time::Duration;
//! use redis::aio::{ConnectionManager, ConnectionManagerConfig};
//!
//! # async fn demo() -> redis::RedisResult<()> {
//! let client = redis::Client::open("redis://127.0.0.1:6379/")?;
//! let config = ConnectionManagerConfig::new()
//!     // Give up on a connection attempt quickly; the coordinator's timeout is the real bound.
//!     .set_connection_timeout(Some(Duration::from_millis(250)))
//!     .set_response_timeout(Some(Duration::from_millis(250)))
//!     // Reconnect in the background a few times, quickly, instead of stalling commands.
//!     .set_number_of_retries(2)
//!     .set_min_delay(Duration::from_millis(10))
//!     .set_max_delay(Duration::from_millis(100));
//! // `new_lazy_with_config` does not wait for Redis: a service starts even while Redis is down.
//! let conn = ConnectionManager::new_lazy_with_config(client, config)?;
//! let coordinator = idem::Coordinator::new(conn, idem::Policy::hardened());
//! # let _ = coordinator; Ok(()) }
//! ```
//!
//! For a cluster, `redis::cluster::ClusterClient::builder(nodes)` takes `.connection_timeout()`,
//! `.response_timeout()` and `.retries()`; its `get_async_connection()` is a coordinator
//! connection too. A `MultiplexedConnection` works, but does not reconnect by itself.
//!
//! # Cancellation and crashes
//!
//! Dropping a [`Coordinator::coordinate`] future while the action runs leaves the pending record
//! in place until its lease runs out; retries wait or get [`Error::InProgress`] until then. A
//! crashed process cannot clean up either, so this is the behaviour to design for: keep the lease
//! just above the action's worst case (plus its own timeouts), and renew it for long actions.
//!
//! # Clocks
//!
//! Redis expiry (`PX`, set from the same durations as `expires_at`) is the only thing that ends a
//! reservation or a stored result here. idempotency-kit also compares `expires_at` with its own
//! clock, and *deletes* a record it believes expired, so a Python reader whose clock runs ahead
//! can delete a live reservation; we never delete on a clock reading. This is also why renewals
//! rewrite `expires_at`: a Python reader must not think a renewed reservation is abandoned.
//!
//! # Layout
//!
//! - [`coordinator`]: [`Coordinator`] and the flow of a call, [`Request`], [`Coordinated`],
//!   [`Source`], [`Fence`].
//! - [`policy`]: [`Policy`] and its parts, with the two presets.
//! - `store.rs`: every Redis command, bounded by the command timeout; `lua/*.lua`: the hardened
//!   policy's scripts (reserve, renew, complete, release), also public as [`lua`].
//! - [`record`]: the stored record, the wire format shared with idempotency-kit.
//! - [`key`]: validation and trimming of operations and keys; record and fence-counter keys.
//! - [`fingerprint`]: [`fingerprint_of`], Python's `fingerprint_of` in Rust.
//! - [`error`]: [`Error`], [`StorageError`], [`Unprotected`].
//! - [`observe`]: the observer hook and its [`Event`]s.

pub mod coordinator;
pub mod error;
pub mod fingerprint;
pub mod key;
pub mod observe;
pub mod lua {
    //! The hardened policy's Lua scripts, exactly as the coordinator sends them (as `EVALSHA`).
    //!
    //! Public for tools that must send the same commands without the coordinator around them:
    //! the lab's `lab bench coordinator` runs them from a bare Redis client to measure what the
    //! round trips alone cost. Each script's header documents its keys, arguments and reply.

    /// Reserve-or-read with a fencing token: `KEYS` record, counter; `ARGV` pending record,
    /// lease ms, counter lifetime ms. Replies the fence (integer) or the stored record.
    pub const RESERVE: &str = include_str!("lua/reserve.lua");
    /// Compare-and-set of the result: `KEYS` record, counter; `ARGV` owner, record, TTL ms,
    /// counter lifetime ms. Replies 1 if stored.
    pub const COMPLETE: &str = include_str!("lua/complete.lua");
    /// Compare-and-set renewal of the reservation.
    pub const RENEW: &str = include_str!("lua/renew.lua");
    /// Compare-and-delete of the reservation.
    pub const RELEASE: &str = include_str!("lua/release.lua");
}
pub mod policy;
pub mod record;
mod store;

pub use coordinator::{Coordinated, Coordinator, Fence, Request, Source};
pub use error::{Error, Stage, StorageCause, StorageError, Unprotected};
pub use fingerprint::{canonical_json, fingerprint_of};
pub use key::{DEFAULT_PREFIX, Identifiers, ValidationError, normalise_key, validate};
pub use observe::{Event, EventKind, Observer};
pub use policy::{InFlight, InvalidKey, OnStorageError, Ownership, Policy, TtlPolicy};
pub use record::{Record, Status};
