//! The payment every lesson after the first makes, and the two places its truth is read from.
//!
//! The payments lesson pays the payment service directly, the chain lesson through the gateway,
//! and the soak pays through the chain again and again: one tenant, one order, one amount, one
//! way to pay and tell what the client saw ([`Paid`]). What happened is read where it happened:
//! the provider's own list of charges ([`provider_charges`]), and the requests each service
//! counted ([`requests_received`]).

use lab_core::{Msg, Table};
use lab_services::admin::Admin;
use lab_services::payments::{self, Payment};
use lab_services::provider::{self, Charge};
use lab_services::{ServiceSpec, gateway};
use serde::Serialize;

use super::call::{Answer, Caller};
use crate::{Ctx, ScenarioError};

/// The tenant every payment belongs to.
pub const TENANT: uuid::Uuid = uuid::uuid!("6f1c2d3e-4a5b-4c6d-8e7f-0a1b2c3d4e5f");
/// The order being paid.
pub const ORDER: uuid::Uuid = uuid::uuid!("0b7e4c1a-2d3f-4e5a-9b6c-7d8e9f0a1b2c");
/// 19.90 roubles, in kopecks.
pub const AMOUNT: i64 = 1990;
pub const CURRENCY: &str = "RUB";

/// The payment command a client sends.
pub fn payment(amount: i64) -> Payment {
    Payment {
        tenant_id: TENANT.to_string(),
        order_id: ORDER.to_string(),
        amount,
        currency: CURRENCY.to_string(),
    }
}

/// The coordinator's operation for the tenant.
pub fn operation() -> String {
    payments::operation(&TENANT)
}

/// The provider key the payment service derives from a client key.
pub fn provider_key(key: &str) -> String {
    format!("{}.{}", operation(), idem::normalise_key(key))
}

/// The payment service's coordinator record for a client key, in this run's Redis.
pub fn record_key(ctx: &Ctx, key: &str) -> String {
    let operation = operation();
    idem::key::record_key(
        &payments::key_prefix(&ctx.space.prefix),
        idem::Identifiers {
            operation: &operation,
            key: idem::normalise_key(key),
        },
    )
}

/// What a client learned from paying: the answer, and the Charge it carries, if any.
#[derive(Debug, Clone)]
pub struct Paid {
    pub answer: Answer,
    pub charge: Option<Charge>,
}

/// The part of a Charge the narrative shows, in a stable order.
#[derive(Serialize)]
struct ShownCharge<'a> {
    charge_id: &'a str,
    amount: i64,
    currency: &'a str,
}

impl Paid {
    fn from(answer: Answer) -> Paid {
        let charge = answer
            .json()
            .filter(|_| answer.outcome == lab_core::Outcome::Ok);
        Paid { answer, charge }
    }

    pub fn charge_id(&self) -> Option<&str> {
        self.charge.as_ref().map(|c| c.charge_id.as_str())
    }

    /// How the narrator shows it: the headers that matter, then the Charge's id, amount and
    /// currency (or the refusal's code).
    pub fn view(&self) -> lab_core::narrator::CallView {
        let shown = self.charge.as_ref().map(|c| {
            serde_json::to_string(&ShownCharge {
                charge_id: &c.charge_id,
                amount: c.amount,
                currency: &c.currency,
            })
            .expect("a charge serialises")
        });
        self.answer.view_with_headers(shown)
    }
}

/// `POST /payments` with `key`, judged, without narrating.
pub async fn send_pay(caller: &Caller, url: &str, key: &str, amount: i64) -> Paid {
    send_payment(caller, url, key, &payment(amount)).await
}

/// `POST /payments` of any payment command (another tenant's, say) with `key`, judged, without
/// narrating.
pub async fn send_payment(caller: &Caller, url: &str, key: &str, payment: &Payment) -> Paid {
    let answer = caller
        .post(&format!("{url}/payments"), Some(key), payment)
        .await;
    Paid::from(answer)
}

/// How a payment is told; `who` names the caller (`who.client`, `who.first`, …).
pub fn pay_msg(who: &str, key: &str, amount: i64) -> Msg {
    Msg::new("call.pay")
        .arg("who", Msg::new(format!("who.{who}")))
        .arg("key", payments::shown_key(key))
        .arg("amount", amount)
        .arg("currency", CURRENCY)
}

/// `who` pays the payment service with `key`, narrated: the request, what happens inside the
/// services, and what the client saw.
pub async fn pay_as(ctx: &Ctx, who: &str, key: &str, amount: i64) -> Result<Paid, ScenarioError> {
    let url = ctx.service(&payments::SPEC)?.url.clone();
    ctx.narrator.call(
        &format!("who.{who}"),
        payments::NAME,
        pay_msg(who, key, amount),
    );
    let paid = send_pay(&Caller::new(), &url, key, amount).await;
    ctx.narrator.response(paid.view());
    Ok(paid)
}

/// The client pays with `key`: [`pay_as`] by `who.client`.
pub async fn pay(ctx: &Ctx, key: &str, amount: i64) -> Result<Paid, ScenarioError> {
    pay_as(ctx, "client", key, amount).await
}

/// The client pays once through the gateway (`POST /checkout`), narrated.
pub async fn checkout(ctx: &Ctx, key: &str) -> Result<Paid, ScenarioError> {
    checkout_amount(ctx, key, AMOUNT).await
}

/// [`checkout`] of another amount.
pub async fn checkout_amount(ctx: &Ctx, key: &str, amount: i64) -> Result<Paid, ScenarioError> {
    let url = ctx.service(&gateway::SPEC)?.url.clone();
    ctx.narrator.call(
        "who.client",
        gateway::NAME,
        Msg::new("call.checkout")
            .arg("who", Msg::new("who.client"))
            .arg("key", key)
            .arg("amount", amount)
            .arg("currency", CURRENCY),
    );
    let answer = Caller::new()
        .post(&format!("{url}/checkout"), Some(key), &payment(amount))
        .await;
    let paid = Paid::from(answer);
    ctx.narrator.response(paid.view());
    Ok(paid)
}

/// The provider's own list of charges (all, or those under one provider key), over HTTP.
pub async fn provider_charges(ctx: &Ctx, key: Option<&str>) -> Result<Vec<Charge>, ScenarioError> {
    let base = ctx.direct_url(&provider::SPEC)?;
    Ok(Admin::new(Caller::new().http(), &base).charges(key).await?)
}

/// Shows the provider's charges (all of them); returns them.
pub async fn show_charges(ctx: &Ctx) -> Result<Vec<Charge>, ScenarioError> {
    let charges = provider_charges(ctx, None).await?;
    ctx.narrator.state(Table {
        title: Msg::new("table.charges"),
        columns: ["charge_id", "key", "amount"].map(String::from).to_vec(),
        rows: charges
            .iter()
            .map(|c| {
                vec![
                    c.charge_id.clone(),
                    c.key.clone().unwrap_or_else(|| "NULL".into()),
                    c.amount.to_string(),
                ]
            })
            .collect(),
    });
    Ok(charges)
}

/// How many requests a relay (or the payment service) received, from its own `GET /stats`.
pub async fn requests_received(ctx: &Ctx, spec: &ServiceSpec) -> Result<u64, ScenarioError> {
    let base = ctx.direct_url(spec)?;
    Ok(Admin::new(Caller::new().http(), &base)
        .requests_received()
        .await?)
}

/// Shows how many requests each service of `specs` received, read from each one.
pub async fn show_requests(ctx: &Ctx, specs: &[&ServiceSpec]) -> Result<Vec<u64>, ScenarioError> {
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
