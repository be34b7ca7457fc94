//! Lesson C: one identity for an action, across a chain of services and across redeliveries.
//!
//! Two settings, one rule. In the chain, a client pays through the gateway and the orders
//! service, which pass its Idempotency-Key unchanged to the payment service on every retry
//! (`lab_services::gateway`, `lab_services::orders`, `lab_services::relay`). In the background,
//! an invoice worker reads jobs from an at-least-once queue on Redis Streams ([`queue`]) and sends
//! each invoice once through the coordinator, whatever the redeliveries ([`invoices`]).
//!
//! Each scenario module here has a folder of the same name under `scenarios/` (its texts and
//! expectations); `build.rs` lists the declared ones in the catalogue.

pub mod invoices;
pub mod queue;

// The scenarios of this lesson, one module each (its folder under `scenarios/` has the same
// name, with `-` for `_`).
// The lesson's first scenario shares its name.
#[allow(clippy::module_inception)]
pub mod chain;
pub mod worker;

use crate::scenario::Lesson;

/// The lesson: its state is in Redis and in the services, and the invoice worker's own database
/// (`invoice_ledger`, `processed_jobs`) is in the top-level schema.sql, as every lesson's tables.
pub const LESSON: Lesson = Lesson {
    id: "C",
    order: 3,
    schema: lab_services::reports::SCHEMA_SQL,
};
