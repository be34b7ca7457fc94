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

use lab_core::{Msg, Table};
use serde_json::Value;

use crate::payments::client;
use crate::scenario::Lesson;
use crate::{Ctx, ScenarioError};

/// The lesson: its state is in Redis and in the services, so no tables of its own.
pub const LESSON: Lesson = Lesson {
    id: "C",
    order: 3,
    schema: "",
};

/// How many requests a relay (or the payment service) received, from its own `GET /stats`.
pub async fn requests_received(
    ctx: &Ctx,
    spec: &lab_services::ServiceSpec,
) -> Result<u64, ScenarioError> {
    let direct = ctx.service(spec)?.direct;
    let body: Value = client()?
        .get(format!("http://{direct}/stats"))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    body["requests"]
        .as_u64()
        .ok_or_else(|| ScenarioError::Broken(format!("{}: no request count", spec.name)))
}

/// Shows how many requests each service of `specs` received, read from each one.
pub async fn show_requests(
    ctx: &Ctx,
    specs: &[&lab_services::ServiceSpec],
) -> Result<Vec<u64>, ScenarioError> {
    let mut counts = Vec::new();
    for spec in specs {
        counts.push(requests_received(ctx, spec).await?);
    }
    ctx.narrator.state(Table {
        title: Msg::new("table.requests"),
        columns: ["service", "requests"].map(String::from).to_vec(),
        rows: specs
            .iter()
            .zip(&counts)
            .map(|(spec, count)| vec![spec.name.to_string(), count.to_string()])
            .collect(),
    });
    Ok(counts)
}
