//! `provider-lost`: the provider charged, but its answer was lost.
//!
//! The fault proxy sits on the hop from the payment service to the provider. A one-shot fault,
//! "response lost after commit", lets the charge request through and swallows the provider's
//! answer (the connection is reset as soon as the provider starts answering, after it recorded
//! the charge). Inside the coordinator the action failed, so the reservation is released and the
//! client gets 502. A status query (`GET /charges?key=…`) shows that the money moved anyway. The
//! client retries with the same key: the coordinator has nothing stored, the action runs again,
//! and a provider without deduplication charges a second time. With deduplication by the provider
//! key (`payment.charge.<tenant>.<key>`), the provider answers the retry with the first charge.
//!
//! Last, the other way out for a provider that does not remove duplicates: the payment service
//! asks the provider for the charge's status (`GET /charges?key=…`) before charging again
//! (`ask_provider_first`), finds the first charge, and answers with it.
//!
//! Facts: `charges_without_provider_dedup` = 2, `charges_with_provider_dedup` = 1,
//! `charges_with_status_query` = 1, `retry_status` = 200, and `lost_call_status` = 502.

use std::time::Duration;

use lab_core::Msg;
use lab_services::{payments, provider};

use lab_services::payments::PaymentChange;

use super::{
    AMOUNT, configure_payments, pay, pay_msg, provider_charges, provider_dedup, provider_key,
    send_pay, show_charges,
};
use crate::kit::Caller;
use crate::{Ctx, FaultUse, Hop, Requires, Scenario, ScenarioError, ScenarioResult};

pub const SCENARIO: Scenario = Scenario {
    order: 2,
    requires: Requires {
        postgres: false,
        redis: true,
        services: &[&payments::SPEC],
        faults: FaultUse::OneShot(&[Hop::Service(&provider::SPEC)]),
    },
    knobs: &[],
    run: |ctx| Box::pin(run(ctx)),
};

const K1: &str = "K1";
const K2: &str = "K2";
const K3: &str = "K3";
/// A fault armed for a call that never comes is a broken script, not a slow machine.
const FIRE_LIMIT: Duration = Duration::from_secs(10);

/// Arms "the provider's answer is lost" for the next connection to the provider.
fn lose_next_answer(ctx: &Ctx) -> Result<faultproxy::ArmedFault, ScenarioError> {
    ctx.faults()?
        .drop_next_answer(provider::NAME)
        .ok_or_else(|| ScenarioError::Broken("no embedded proxy on the provider's hop".into()))
}

/// One payment whose first answer from the provider is lost, then the client's retry (after the
/// prediction, when `predict`). Returns the statuses the client saw.
async fn lost_then_retried(
    ctx: &Ctx,
    key: &str,
    predict: bool,
) -> Result<(u16, u16), ScenarioError> {
    let n = &ctx.narrator;
    n.step(Msg::new("step.pay").arg("key", key)).await?;
    // Armed once the service is about to charge: with `ask_provider_first` its status query
    // goes first, on a connection of its own, and must not be the one that loses its answer.
    let url = ctx.service(&payments::SPEC)?.url.clone();
    n.call("who.client", payments::NAME, pay_msg("client", key, AMOUNT));
    let caller = Caller::patient();
    let held = ctx
        .hold(payments::IN_ACTION)
        .call(send_pay(&caller, &url, key, AMOUNT))
        .await?;
    let lost = lose_next_answer(ctx)?;
    let first = held.release().await;
    n.response(first.view());
    tokio::time::timeout(FIRE_LIMIT, lost.fired())
        .await
        .map_err(|_| ScenarioError::Broken("the provider's answer was not lost".into()))?;

    n.step(Msg::new("step.status").arg("key", provider_key(key)))
        .await?;
    let known = provider_charges(ctx, Some(&provider_key(key))).await?;
    n.note(Msg::new("note.status").arg("charges", known.len()));
    if predict {
        n.predict("predict").await?;
    }
    n.step(Msg::new("step.retry").arg("key", key)).await?;
    let retry = pay(ctx, key, AMOUNT).await?;
    Ok((first.answer.status_or_zero(), retry.answer.status_or_zero()))
}

async fn run(ctx: &Ctx) -> ScenarioResult {
    let n = &ctx.narrator;

    n.side("side.no_dedup");
    n.step("step.setup").await?;
    let (lost_status, retry_status) = lost_then_retried(ctx, K1, true).await?;
    show_charges(ctx).await?;
    let without = provider_charges(ctx, Some(&provider_key(K1))).await?.len();
    n.fact("lost_call_status", lost_status);
    n.fact("retry_status", retry_status);
    n.fact("charges_without_provider_dedup", without);
    n.reveal(Msg::new("reveal").arg("charges", without)).await?;

    n.side("side.dedup");
    provider_dedup(ctx, true).await?;
    n.step("step.dedup").await?;
    lost_then_retried(ctx, K2, false).await?;
    show_charges(ctx).await?;
    let with = provider_charges(ctx, Some(&provider_key(K2))).await?.len();
    n.fact("charges_with_provider_dedup", with);
    n.note(Msg::new("note.dedup").arg("charges", with));

    // The other way out, for a provider that does not remove duplicates: the service itself
    // asks for the charge's status before charging again.
    n.side("side.ask_first");
    provider_dedup(ctx, false).await?;
    let ask = PaymentChange {
        ask_provider_first: Some(true),
        ..PaymentChange::default()
    };
    configure_payments(ctx, ask).await?;
    n.step("step.ask_first").await?;
    lost_then_retried(ctx, K3, false).await?;
    show_charges(ctx).await?;
    let asked = provider_charges(ctx, Some(&provider_key(K3))).await?.len();
    n.fact("charges_with_status_query", asked);
    n.note(Msg::new("note.ask_first").arg("charges", asked));

    n.explain();
    n.quiz();
    Ok(())
}
