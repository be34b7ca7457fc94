//! `chain`: a payment through four real services, two answers lost on the way back.
//!
//! Client → gateway → orders → payments → provider, every hop through the fault proxy. Two
//! one-shot faults lose two answers after the work was done: the payment service's answer to
//! orders (payments had charged and stored its result), and the orders service's answer to the
//! gateway (orders had got that result). Each relay retries with its bounded policy and the
//! client's key unchanged, so the payment service replays instead of charging again: orders is
//! called twice, payments three times, the provider charges once, and the client gets one
//! Charge. Broken side: the orders service mints a new key for every attempt; one lost answer
//! and the provider charges twice.
//!
//! Facts: `orders_calls` = 2, `payments_calls` = 3, `provider_charges` = 1, `client_status` =
//! 200, `new_key_per_hop_charges` = 2, and `faults_fired` = 2.

use std::time::Duration;

use faultproxy::ArmedFault;
use lab_core::Msg;
use lab_services::relay::RelayConfig;
use lab_services::{gateway, orders, payments, provider};

use crate::kit::Caller;
use crate::kit::payments::{
    AMOUNT, checkout, checkout_amount, pay_msg, provider_charges, requests_received, send_pay,
    show_charges, show_requests,
};
use crate::{Ctx, FaultUse, Hop, Requires, Scenario, ScenarioError, ScenarioResult};

pub const SCENARIO: Scenario = Scenario {
    order: 1,
    requires: Requires {
        postgres: false,
        redis: true,
        services: &[&gateway::SPEC],
        faults: FaultUse::OneShot(&[
            Hop::Service(&gateway::SPEC),
            Hop::Service(&orders::SPEC),
            Hop::Service(&payments::SPEC),
            Hop::Service(&provider::SPEC),
        ]),
    },
    knobs: &[],
    run: |ctx| Box::pin(run(ctx)),
};

/// A fault armed for a call that never comes is a broken script, not a slow machine.
const FIRE_LIMIT: Duration = Duration::from_secs(10);

/// Arms "the answer is lost after the work was done" for the next connection to `hop`.
fn lose_next_answer(ctx: &Ctx, hop: &str) -> Result<ArmedFault, ScenarioError> {
    ctx.faults()?
        .drop_next_answer(hop)
        .ok_or_else(|| ScenarioError::Broken(format!("no embedded proxy on the {hop} hop")))
}

async fn fired(fault: &ArmedFault) -> bool {
    tokio::time::timeout(FIRE_LIMIT, fault.fired())
        .await
        .is_ok()
}

async fn run(ctx: &Ctx) -> ScenarioResult {
    let n = &ctx.narrator;

    n.side("side.same_key");
    let lost_by_payments = lose_next_answer(ctx, payments::NAME)?;
    let lost_by_orders = lose_next_answer(ctx, orders::NAME)?;
    n.step("step.setup").await?;
    n.predict("predict").await?;
    n.step(Msg::new("step.pay").arg("key", "C1")).await?;
    let paid = checkout(ctx, "C1").await?;
    let both_fired = fired(&lost_by_payments).await && fired(&lost_by_orders).await;
    n.fact("faults_fired", 2 * u32::from(both_fired));

    n.step("step.count").await?;
    let counts = show_requests(ctx, &[&gateway::SPEC, &orders::SPEC, &payments::SPEC]).await?;
    let charges = show_charges(ctx).await?;
    n.fact("orders_calls", counts[1]);
    n.fact("payments_calls", counts[2]);
    n.fact("provider_charges", charges.len());
    n.fact("client_status", paid.answer.status_or_zero());
    n.reveal(
        Msg::new("reveal")
            .arg("orders", counts[1] as i64)
            .arg("payments", counts[2] as i64)
            .arg("charges", charges.len()),
    )
    .await?;

    refusals_pass_up(ctx).await?;

    n.side("side.new_key");
    ctx.configure(&orders::SPEC, &RelayConfig { mint_keys: true })
        .await?;
    let before = provider_charges(ctx, None).await?.len();
    let lost = lose_next_answer(ctx, payments::NAME)?;
    n.step(Msg::new("step.mint").arg("key", "C2")).await?;
    checkout(ctx, "C2").await?;
    if !fired(&lost).await {
        return Err(ScenarioError::Broken(
            "the payment service's answer was not lost".into(),
        ));
    }
    let after = show_charges(ctx).await?.len();
    n.fact("new_key_per_hop_charges", after - before);
    n.note(Msg::new("note.mint").arg("charges", after - before));

    n.explain();
    n.quiz();
    Ok(())
}

/// A refusal is an answer, not a lost one: 422 (the key reused for another amount) and 409 (the
/// first call still charging) come back to the client unchanged, and no relay retries them.
async fn refusals_pass_up(ctx: &Ctx) -> ScenarioResult {
    let n = &ctx.narrator;
    n.side("side.refusals");
    let specs = [&gateway::SPEC, &orders::SPEC, &payments::SPEC];
    let mut before = Vec::new();
    for spec in specs {
        before.push(requests_received(ctx, spec).await?);
    }

    n.step(
        Msg::new("step.changed_amount")
            .arg("key", "C1")
            .arg("amount", CHANGED_AMOUNT),
    )
    .await?;
    let changed = checkout_amount(ctx, "C1", CHANGED_AMOUNT).await?;

    n.step(Msg::new("step.in_progress").arg("key", "C3"))
        .await?;
    let url = ctx.service(&payments::SPEC)?.url.clone();
    n.call("who.first", payments::NAME, pay_msg("first", "C3", AMOUNT));
    // Patient: it waits inside the charge for as long as the learner reads.
    let first_caller = Caller::patient();
    let mut first = ctx
        .hold(payments::IN_ACTION)
        .call(send_pay(&first_caller, &url, "C3", AMOUNT))
        .await?;
    let in_progress = first.meanwhile(checkout(ctx, "C3")).await??;
    let first = first.release().await;
    n.response(first.view());

    let after = show_requests(ctx, &specs).await?;
    let received: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    n.fact(
        "chain_changed_amount_status",
        changed.answer.status_or_zero(),
    );
    n.fact(
        "chain_in_progress_status",
        in_progress.answer.status_or_zero(),
    );
    // Two client calls: each reached every hop once (the payment service also got the first
    // C3 call, sent to it directly): nothing was retried.
    n.fact("refusals_requests_received", received.clone());
    n.note(
        Msg::new("note.refusals")
            .arg("changed", changed.answer.status_or_zero())
            .arg("in_progress", in_progress.answer.status_or_zero()),
    );
    Ok(())
}

/// The amount of the changed request.
const CHANGED_AMOUNT: i64 = 2490;
