//! `redis-down`: the coordinator's Redis cannot be reached.
//!
//! The payment service reaches Redis through the fault proxy (the `redis` hop); the lab cuts that
//! link with a black hole (a `timeout` toxic of 0 on both streams: nothing gets through, nothing
//! answers, nothing closes). The real Redis keeps running for everyone else, the lab included.
//!
//! The coordinator's compatible policy (as idempotency-kit 0.4.1) fails open: when its
//! reservation gets no answer within its Redis timeout (idem's 250 ms, which this scenario sets
//! on the service: its default is more generous), it runs the charge without protection and
//! stores nothing. Two calls with one key charge twice at a provider without deduplication, once
//! at a provider that deduplicates by key. The hardened policy fails closed: 503 with
//! `Retry-After`, no charge. Every call gets an answer (the fact is the answer, not a duration).
//!
//! After the outage, Redis is reachable again and one more blip (the link's connections cut and
//! the link restored at once, as a Redis restart or a failover would) kills the service's
//! connection: the next payment is protected because the coordinator sends its first command
//! once more on the fresh connection (one charge under K4), and is not with a coordinator that
//! does not (`resend_on_dropped` off: two charges under K5).
//!
//! Last, Redis goes away *after* the provider charged (a call held at the service's
//! `payments.charged` checkpoint while the link is cut): the result cannot be stored, the
//! reservation stays pending, the retry gets 409 until its lease expires (simulated), and then
//! charges again. Neither failing open nor failing closed helps there; only the provider's key.
//!
//! Facts: `charges_fail_open` = 2, `charges_fail_open_provider_dedup` = 1,
//! `charges_fail_closed` = 0, `fail_closed_status` = 503, `every_call_answered` = true,
//! `charges_after_blip` = 1, `charges_after_blip_without_resend` = 2; after the charge:
//! `after_charge_first_status` = 200, `after_charge_retry_status` = 409,
//! `charges_after_charge_outage` = 2.

use lab_core::Msg;
use lab_services::faults::ToxicHandle;
use lab_services::payments::{self, CHARGED, PaymentChange, PolicyName};

use super::{
    AMOUNT, configure_payments, pay, pay_msg, provider_charges, provider_dedup, provider_key,
    record_key, send_pay, show_charges, show_records,
};
use crate::kit::Caller;
use crate::kit::redis::expire_now;
use crate::{Ctx, FaultUse, Hop, Requires, Scenario, ScenarioError, ScenarioResult};
use lab_services::stage::REDIS_HOP;

pub const SCENARIO: Scenario = Scenario {
    order: 3,
    requires: Requires {
        postgres: false,
        redis: true,
        services: &[&payments::SPEC],
        faults: FaultUse::Toxics(&[Hop::Redis]),
    },
    knobs: &[],
    run: |ctx| Box::pin(run(ctx)),
};

const K1: &str = "K1";
const K2: &str = "K2";
const K3: &str = "K3";
const K4: &str = "K4";
const K5: &str = "K5";
const K6: &str = "K6";
/// Pays twice with `key` while Redis is cut; returns whether each call got an answer (a status)
/// before the client's own timeout. The coordinator bounds each Redis command (250 ms), so a
/// dead Redis costs a call a moment, not a hang; how long exactly depends on the machine, so the
/// fact is the answer, not a duration.
async fn pay_twice(ctx: &Ctx, key: &str) -> Result<bool, ScenarioError> {
    let mut answered = true;
    for _ in 0..2 {
        answered &= pay(ctx, key, AMOUNT).await?.answer.status.is_some();
    }
    Ok(answered)
}

async fn run(ctx: &Ctx) -> ScenarioResult {
    let n = &ctx.narrator;

    // The bound this lesson is about: idem's own 250 ms (the service's default is generous, so
    // that a loaded machine never times out a healthy Redis in the other stories).
    let idem_bound = idem::Policy::compatible().command_timeout;
    let change = PaymentChange {
        command_timeout_ms: Some(u64::try_from(idem_bound.as_millis()).unwrap_or(u64::MAX)),
        ..PaymentChange::default()
    };
    configure_payments(ctx, change).await?;
    let black_hole = ctx.faults()?.black_hole(REDIS_HOP).await?;
    n.step("step.cut").await?;
    let pong: String = redis::cmd("PING").query_async(&mut ctx.redis()?).await?;
    n.note(Msg::new("note.redis_alive").arg("reply", pong));

    n.side("side.fail_open");
    n.predict("predict").await?;
    n.step(Msg::new("step.two_calls").arg("key", K1)).await?;
    let mut answered = pay_twice(ctx, K1).await?;
    show_records(ctx, &[K1]).await?;
    show_charges(ctx).await?;
    let fail_open = provider_charges(ctx, Some(&provider_key(K1))).await?.len();
    n.fact("charges_fail_open", fail_open);
    n.reveal(Msg::new("reveal").arg("charges", fail_open))
        .await?;

    provider_dedup(ctx, true).await?;
    n.step(Msg::new("step.dedup").arg("key", K2)).await?;
    answered &= pay_twice(ctx, K2).await?;
    let with_dedup = provider_charges(ctx, Some(&provider_key(K2))).await?.len();
    n.fact("charges_fail_open_provider_dedup", with_dedup);
    n.note(Msg::new("note.dedup").arg("charges", with_dedup));

    n.side("side.fail_closed");
    provider_dedup(ctx, false).await?;
    let hardened = PaymentChange {
        policy: Some(PolicyName::Hardened),
        ..PaymentChange::default()
    };
    configure_payments(ctx, hardened).await?;
    n.step(Msg::new("step.fail_closed").arg("key", K3)).await?;
    let closed = pay(ctx, K3, AMOUNT).await?;
    answered &= closed.answer.status.is_some();
    let fail_closed = provider_charges(ctx, Some(&provider_key(K3))).await?.len();
    show_charges(ctx).await?;
    n.fact("fail_closed_status", closed.answer.status_or_zero());
    n.fact("charges_fail_closed", fail_closed);

    n.fact("every_call_answered", answered);
    n.note(if answered {
        "note.answered"
    } else {
        "note.not_answered"
    });

    healed(ctx, black_hole).await?;
    after_the_charge(ctx).await?;
    n.explain();
    n.quiz();
    Ok(())
}

/// After the outage: Redis reachable again, and the service's connection to it killed by one
/// more blip. The next payment is protected when the coordinator sends its first command again
/// on the fresh connection; it is not when the coordinator does not.
async fn healed(ctx: &Ctx, black_hole: [ToxicHandle; 2]) -> ScenarioResult {
    let n = &ctx.narrator;
    n.side("side.healed");
    let faults = ctx.faults()?;
    for toxic in black_hole {
        faults.remove(toxic).await?;
    }
    let compatible = PaymentChange {
        policy: Some(PolicyName::Compatible),
        ..PaymentChange::default()
    };
    configure_payments(ctx, compatible).await?;
    blip(ctx).await?;
    n.step("step.heal").await?;
    n.step(Msg::new("step.healed_pay").arg("key", K4)).await?;
    pay_twice(ctx, K4).await?;
    let protected = provider_charges(ctx, Some(&provider_key(K4))).await?.len();
    n.fact("charges_after_blip", protected);
    n.note(Msg::new("note.healed").arg("charges", protected));

    let no_resend = PaymentChange {
        resend_on_dropped: Some(false),
        ..PaymentChange::default()
    };
    configure_payments(ctx, no_resend).await?;
    blip(ctx).await?;
    n.step(Msg::new("step.no_resend").arg("key", K5)).await?;
    pay_twice(ctx, K5).await?;
    let unprotected = provider_charges(ctx, Some(&provider_key(K5))).await?.len();
    show_charges(ctx).await?;
    n.fact("charges_after_blip_without_resend", unprotected);
    n.note(Msg::new("note.no_resend").arg("charges", unprotected));
    Ok(())
}

/// Redis goes away after the provider charged and before the result is stored.
async fn after_the_charge(ctx: &Ctx) -> ScenarioResult {
    let n = &ctx.narrator;
    n.side("side.after_charge");
    let resend = PaymentChange {
        resend_on_dropped: Some(true),
        ..PaymentChange::default()
    };
    configure_payments(ctx, resend).await?;
    let url = ctx.service(&payments::SPEC)?.url.clone();
    n.step(Msg::new("step.after_charge").arg("key", K6)).await?;
    n.call("who.client", payments::NAME, pay_msg("client", K6, AMOUNT));
    // Patient: it waits at the checkpoint for as long as the learner reads.
    let caller = Caller::patient();
    let held = ctx
        .hold(CHARGED)
        .call(send_pay(&caller, &url, K6, AMOUNT))
        .await?;
    let black_hole = ctx.faults()?.black_hole(REDIS_HOP).await?;
    n.step("step.cut_after_charge").await?;
    let first = held.release().await;
    n.response(first.view());
    for toxic in black_hole {
        ctx.faults()?.remove(toxic).await?;
    }
    n.step("step.link_back_after_charge").await?;
    show_records(ctx, &[K6]).await?;
    n.predict("predict_after_charge").await?;
    n.step(Msg::new("step.retry_after_charge").arg("key", K6))
        .await?;
    let retry = pay(ctx, K6, AMOUNT).await?;
    n.step("step.lease_expires_after_charge").await?;
    expire_now(&mut ctx.redis()?, &record_key(ctx, K6)).await?;
    pay(ctx, K6, AMOUNT).await?;
    show_charges(ctx).await?;
    let charges = provider_charges(ctx, Some(&provider_key(K6))).await?.len();
    n.fact("after_charge_first_status", first.answer.status_or_zero());
    n.fact("after_charge_retry_status", retry.answer.status_or_zero());
    n.fact("charges_after_charge_outage", charges);
    n.reveal(
        Msg::new("reveal_after_charge")
            .arg("status", retry.answer.status_or_zero())
            .arg("charges", charges),
    )
    .await?;
    Ok(())
}

/// Cuts the services' link to Redis (every open connection) and puts it back at once.
async fn blip(ctx: &Ctx) -> ScenarioResult {
    let faults = ctx.faults()?;
    faults.set_enabled(REDIS_HOP, false).await?;
    faults.set_enabled(REDIS_HOP, true).await?;
    Ok(())
}
