//! The HTTP services the lab starts on 127.0.0.1.
//!
//! These are real axum servers talking to real PostgreSQL (and, for the later lessons, Redis):
//! only their business is made up. Learners are meant to read them; the report service's handler
//! is the lesson's answer to "how does a server make POST safe to retry?".
//!
//! # Layout
//!
//! - [`spec`]: a service as a [`ServiceSpec`] (name, needs, tables, checkpoints, router) and
//!   [`launch`], the one way a scenario run and `lab serve` start it; [`Observer`], through which
//!   a service reports what it does (the lab narrates it; nothing here renders); the
//!   [`ServiceEnv`] a service gets (a builder for tests).
//! - [`reports`]: the external report service of Lesson A (`POST /reports` with an optional
//!   `Idempotency-Key`, deduplicated by a UNIQUE constraint); its tables are the top-level
//!   `schema.sql` ([`reports::SCHEMA_SQL`]).
//! - [`http`]: the accept loop every bundled port uses (axum's, plus a header-read timeout, so
//!   idle connections are closed).
//! - [`payments`]: the payment service of the payments lesson: one charge per Idempotency-Key,
//!   through the Redis coordinator `idem`, in front of the provider.
//! - [`provider`]: the mock payment provider of the payments lesson (counts its charges,
//!   deduplicates by key when switched to, answers status queries).
//! - [`orders`] and [`gateway`]: the chain in front of the payment service, both a [`relay`]:
//!   the client's key passed down unchanged, answers passed up unchanged, retries bounded by a
//!   [`retry`] policy with seeded jitter.
//! - [`mailer`]: the mock mailer of the worker lesson (every request is a new email).
//! - [`client`]: a call as the lab's callers make it, told as a `lab_core::Wire` for the one
//!   judgement of ok, fail or unknown (`lab_core::classify`).
//! - [`api`]: the JSON error type and body extractor every service shares, so a malformed
//!   request gets a 4xx with a JSON body, never a 500; and [`api::ConfigRequest`], the typed
//!   body of a service's `PUT /config`.
//! - [`stage`]: starting a list of services from their specs, callees first, each behind a
//!   fault-proxy hop when the run breaks that link (a scenario run and `lab serve` alike), and
//!   [`faults`]: the proxies of those hops (the embedded `faultproxy`, or a real Toxiproxy).
//! - [`ALL`]: every bundled service, in the order `lab serve` gives them ports.

pub mod admin;
pub mod api;
pub mod client;
pub mod faults;
pub mod gateway;
pub mod http;
pub mod mailer;
pub mod orders;
pub mod payments;
pub mod provider;
pub mod relay;
pub mod reports;
pub mod retry;
pub mod spec;
pub mod stage;

pub use spec::{
    Checkpoint, Observer, RunningService, ServiceEnv, ServiceError, ServiceSpec, Voice, launch,
};

/// Every bundled service, in the order `lab serve` numbers their ports (so a new service goes at
/// the end and no port of an existing one moves).
pub static ALL: &[&ServiceSpec] = &[
    &reports::SPEC,
    &provider::SPEC,
    &payments::SPEC,
    &orders::SPEC,
    &gateway::SPEC,
    &mailer::SPEC,
];
