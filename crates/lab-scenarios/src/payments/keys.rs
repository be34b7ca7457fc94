//! `keys`: one key per payment, and what the payment service does with each kind of retry.
//!
//! The client pays with a new key K1: one charge. The same request with K1 again replays the
//! stored Charge (`Idempotent-Replayed: true`) and the provider is not called. K1 with another
//! amount is refused with 422: the fingerprint over order, amount and currency differs. A second
//! payment with the same parameters is a new intent and gets a new key, K2: a second charge.
//! Three invalid keys (empty, with `:`, 256 characters) get 400 before the coordinator sees them.
//!
//! Then two calls with K3 overlap: the first is held inside the charge (at the payment service's
//! `payments.in_action` checkpoint, after it reserved the key) until the second has been answered:
//! 409 `payment_in_progress` with `Retry-After: 1`. The first then finishes, and a third call
//! replays its Charge.
//!
//! Then the same overlap under the two other in-flight modes, `wait` and `run`
//! ([`super::in_flight_modes`]).
//!
//! Broken side: without the 400 guard, the coordinator's compatible policy (as idempotency-kit
//! 0.4.1) runs the action unprotected for an invalid key and stores nothing, so each retry
//! charges again.
//!
//! Facts: `replay_same_charge` = true, `changed_amount_status` = 422, `new_key_new_charge` =
//! true, `invalid_key_statuses` = [400, 400, 400], `in_flight_status` = 409,
//! `in_flight_retry_after` = "1", `k3_replay_same_charge` = true, `provider_charges` = 3 (the
//! guarded side), `invalid_key_unguarded_charges` = 2; the modes' facts are in
//! [`super::in_flight_modes`].

use lab_core::Msg;
use lab_services::payments::{self, IN_ACTION, PaymentChange};

use super::{
    AMOUNT, Paid, configure_payments, pay, pay_msg, provider_charges, provider_key, send_pay,
    show_charges, show_records,
};
use crate::kit::payments::send_payment;
use crate::kit::{Caller, Knob};
use crate::{Ctx, FaultUse, Requires, Scenario, ScenarioError, ScenarioResult};

pub const SCENARIO: Scenario = Scenario {
    order: 1,
    requires: Requires {
        postgres: false,
        redis: true,
        services: &[&payments::SPEC],
        faults: FaultUse::None,
    },
    knobs: &[KEY_GUARD.spec],
    run: |ctx| Box::pin(run(ctx)),
};

/// The payment service answers 400 to an invalid key before the coordinator sees it.
const KEY_GUARD: Knob<bool> = Knob::switch("key_guard", true);
/// The guard off: the broken side, and what `--set key_guard=false` makes of the whole story.
fn unguarded() -> PaymentChange {
    PaymentChange {
        key_guard: Some(false),
        ..PaymentChange::default()
    }
}

const K1: &str = "K1";
const K2: &str = "K2";
const K3: &str = "K3";
/// The key of a payment whose amount is not positive.
const K_ZERO: &str = "K0";
/// The key a client loses before it saved it, and the one it mints after its restart.
const K_LOST: &str = "K8";
const K_MINTED: &str = "K9";
/// Another tenant of the same payment service.
const OTHER_TENANT: uuid::Uuid = uuid::uuid!("9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d");
/// The amount of the changed request.
const CHANGED_AMOUNT: i64 = 2490;
/// A key with a colon: the coordinator's record key is `<prefix><operation>:<key>`.
const COLON_KEY: &str = "order:1";

/// The three invalid keys, and how the narrative names each.
fn invalid_keys() -> [(String, Msg); 3] {
    [
        (String::new(), Msg::new("key.empty")),
        (
            COLON_KEY.to_string(),
            Msg::new("key.colon").arg("key", COLON_KEY),
        ),
        ("k".repeat(256), Msg::new("key.long").arg("length", 256i64)),
    ]
}

async fn run(ctx: &Ctx) -> ScenarioResult {
    if !ctx.knob(&KEY_GUARD)? {
        configure_payments(ctx, unguarded()).await?;
    }
    one_key_per_payment(ctx).await?;
    invalid_keys_refused(ctx).await?;
    in_flight(ctx).await?;
    super::in_flight_modes::side(ctx).await?;
    another_tenant(ctx).await?;
    lost_key(ctx).await?;
    unguarded_side(ctx).await?;
    ctx.narrator.explain();
    ctx.narrator.quiz();
    Ok(())
}

/// K1 paid, replayed, and reused with another amount; K2 for a second payment.
async fn one_key_per_payment(ctx: &Ctx) -> ScenarioResult {
    let n = &ctx.narrator;
    n.step(Msg::new("step.pay").arg("key", K1)).await?;
    let first = pay(ctx, K1, AMOUNT).await?;
    show_records(ctx, &[K1]).await?;
    show_charges(ctx).await?;

    n.step(Msg::new("step.replay").arg("key", K1)).await?;
    let again = pay(ctx, K1, AMOUNT).await?;
    n.fact(
        "replay_same_charge",
        again.answer.replayed
            && again.charge_id().is_some()
            && again.charge_id() == first.charge_id(),
    );

    n.step(
        Msg::new("step.changed")
            .arg("key", K1)
            .arg("amount", CHANGED_AMOUNT),
    )
    .await?;
    let changed = pay(ctx, K1, CHANGED_AMOUNT).await?;
    n.fact("changed_amount_status", changed.answer.status_or_zero());

    n.step(Msg::new("step.new_key").arg("key", K2)).await?;
    let second = pay(ctx, K2, AMOUNT).await?;
    show_charges(ctx).await?;
    n.fact(
        "new_key_new_charge",
        second.charge_id().is_some() && second.charge_id() != first.charge_id(),
    );
    Ok(())
}

/// The three invalid keys, each refused; then an amount that is not positive, refused too.
async fn invalid_keys_refused(ctx: &Ctx) -> ScenarioResult {
    let n = &ctx.narrator;
    n.step("step.invalid").await?;
    let mut statuses = Vec::new();
    for (key, shown) in invalid_keys() {
        n.note(Msg::new("note.invalid_key").arg("key", shown));
        let paid = pay(ctx, &key, AMOUNT).await?;
        statuses.push(paid.answer.status_or_zero());
    }
    n.fact("invalid_key_statuses", statuses);

    n.step(Msg::new("step.zero_amount").arg("key", K_ZERO))
        .await?;
    let zero = pay(ctx, K_ZERO, 0).await?;
    let charged = provider_charges(ctx, Some(&provider_key(K_ZERO))).await?;
    n.fact("zero_amount_status", zero.answer.status_or_zero());
    n.fact("zero_amount_charges", charged.len());
    Ok(())
}

/// Another tenant whose client happens to use the same key, K1: the operation name carries the
/// tenant, so the two never meet.
async fn another_tenant(ctx: &Ctx) -> ScenarioResult {
    let n = &ctx.narrator;
    n.side("side.tenants");
    let url = ctx.service(&payments::SPEC)?.url.clone();
    n.step(Msg::new("step.other_tenant").arg("key", K1)).await?;
    let theirs = lab_services::payments::Payment {
        tenant_id: OTHER_TENANT.to_string(),
        ..crate::kit::payments::payment(AMOUNT)
    };
    n.call(
        "who.other_tenant",
        payments::NAME,
        pay_msg("other_tenant", K1, AMOUNT),
    );
    let paid = send_payment(&Caller::new(), &url, K1, &theirs).await;
    n.response(paid.view());
    let ours = provider_charges(ctx, Some(&provider_key(K1))).await?;
    let other_key = format!("payment.charge.{}.{K1}", OTHER_TENANT.simple());
    let theirs = provider_charges(ctx, Some(&other_key)).await?;
    show_charges(ctx).await?;
    n.fact(
        "other_tenant_new_charge",
        !paid.answer.replayed
            && theirs.len() == 1
            && paid.charge_id() == theirs.first().map(|c| c.charge_id.as_str())
            && ours
                .iter()
                .all(|c| Some(c.charge_id.as_str()) != paid.charge_id()),
    );
    n.note(Msg::new("note.other_tenant").arg("key", K1));
    Ok(())
}

/// A client that loses its key before it saved it, and mints a new one for the same payment.
async fn lost_key(ctx: &Ctx) -> ScenarioResult {
    let n = &ctx.narrator;
    n.side("side.lost_key");
    n.step(Msg::new("step.lost_key").arg("key", K_LOST)).await?;
    pay(ctx, K_LOST, AMOUNT).await?;
    n.step(
        Msg::new("step.new_key_after_crash")
            .arg("lost", K_LOST)
            .arg("key", K_MINTED),
    )
    .await?;
    pay(ctx, K_MINTED, AMOUNT).await?;
    let mut charges = provider_charges(ctx, Some(&provider_key(K_LOST)))
        .await?
        .len();
    charges += provider_charges(ctx, Some(&provider_key(K_MINTED)))
        .await?
        .len();
    show_charges(ctx).await?;
    n.fact("lost_key_charges", charges);
    n.note(Msg::new("note.lost_key").arg("charges", charges));
    Ok(())
}

/// K3 twice at once, then once more: 409 while the first charges, then the first's Charge.
async fn in_flight(ctx: &Ctx) -> ScenarioResult {
    let n = &ctx.narrator;
    let (in_flight, third) = overlap_k3(ctx).await?;
    let status = in_flight.answer.status_or_zero();
    let retry_after = in_flight.answer.retry_after.clone().unwrap_or_default();
    n.fact("in_flight_status", status);
    n.fact("in_flight_retry_after", retry_after.as_str());

    n.step(Msg::new("step.k3_again").arg("key", K3)).await?;
    let replay = pay(ctx, K3, AMOUNT).await?;
    n.fact(
        "k3_replay_same_charge",
        replay.answer.replayed
            && replay.charge_id().is_some()
            && replay.charge_id() == third.charge_id(),
    );
    show_records(ctx, &[K1, K2, K3]).await?;
    let charges = show_charges(ctx).await?;
    n.fact("provider_charges", charges.len());
    n.reveal(
        Msg::new("reveal")
            .arg("status", status)
            .arg("retry_after", retry_after)
            .arg("charges", charges.len()),
    )
    .await?;
    Ok(())
}

/// The broken side: without the 400 guard, an invalid key runs the charge unprotected.
async fn unguarded_side(ctx: &Ctx) -> ScenarioResult {
    let n = &ctx.narrator;
    n.side("side.unguarded");
    configure_payments(ctx, unguarded()).await?;
    n.step(Msg::new("step.unguarded").arg("key", COLON_KEY))
        .await?;
    for _ in 0..2 {
        pay(ctx, COLON_KEY, AMOUNT).await?;
    }
    show_records(ctx, &[COLON_KEY]).await?;
    let unguarded = provider_charges(ctx, Some(&provider_key(COLON_KEY))).await?;
    show_charges(ctx).await?;
    n.fact("invalid_key_unguarded_charges", unguarded.len());
    n.note(Msg::new("note.unguarded").arg("charges", unguarded.len()));
    Ok(())
}

/// Two calls with K3 at once: the first is held inside the charge until the second has its
/// answer. Returns the second's answer and the first's.
async fn overlap_k3(ctx: &Ctx) -> Result<(Paid, Paid), ScenarioError> {
    let n = &ctx.narrator;
    let url = ctx.service(&payments::SPEC)?.url.clone();

    n.step(Msg::new("step.k3_first").arg("key", K3)).await?;
    n.call("who.first", payments::NAME, pay_msg("first", K3, AMOUNT));
    // Patient: it waits inside the charge for as long as the learner reads.
    let first_caller = Caller::patient();
    let mut first = ctx
        .hold(IN_ACTION)
        .call(send_pay(&first_caller, &url, K3, AMOUNT))
        .await?;
    show_records(ctx, &[K3]).await?;

    n.predict("predict").await?;
    n.step(Msg::new("step.k3_second").arg("key", K3)).await?;
    n.call("who.second", payments::NAME, pay_msg("second", K3, AMOUNT));
    let second = first
        .meanwhile(send_pay(&Caller::new(), &url, K3, AMOUNT))
        .await?;
    n.response(second.view());
    // The same key with another amount while the first still charges: the fingerprint is
    // compared before the in-flight mode answers.
    n.step(
        Msg::new("step.k3_other_amount")
            .arg("key", K3)
            .arg("amount", CHANGED_AMOUNT),
    )
    .await?;
    n.call(
        "who.third",
        payments::NAME,
        pay_msg("third", K3, CHANGED_AMOUNT),
    );
    let other_amount = first
        .meanwhile(send_pay(&Caller::new(), &url, K3, CHANGED_AMOUNT))
        .await?;
    n.response(other_amount.view());
    n.fact(
        "in_flight_other_amount_status",
        other_amount.answer.status_or_zero(),
    );
    n.step("step.k3_release").await?;
    let first = first.release().await;
    n.response(first.view());
    Ok((second, first))
}
