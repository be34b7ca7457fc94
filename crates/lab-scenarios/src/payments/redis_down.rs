//! `redis-down`: the coordinator's Redis cannot be reached.
//!
//! The payment service reaches Redis through the fault proxy (the `redis` hop); the lab cuts that
//! link with a black hole (a `timeout` toxic of 0 on both streams: nothing gets through, nothing
//! answers, nothing closes). The real Redis keeps running for everyone else, the lab included.
//!
//! The compatible coordinator (idempotency-kit 0.4.1) fails open: when its reservation gets no
//! answer within its Redis timeout (250 ms), it runs the charge without protection and stores
//! nothing. Two calls with one key charge twice at a provider without deduplication, once at a
//! provider that deduplicates by key. The hardened coordinator fails closed: 503, no charge.
//! Every call returns within the coordinator's bound; the reference pays 6–9.5 s per call in
//! its Redis client's retries.
//!
//! Facts: `charges_fail_open` = 2, `charges_fail_open_provider_dedup` = 1,
//! `charges_fail_closed` = 0, `fail_closed_status` = 503, and `every_call_under_a_second` = true.

use std::time::{Duration, Instant};

use lab_core::Msg;
use lab_services::payments;
use serde_json::json;

use super::{
    AMOUNT, configure_payments, pay, provider_charges, provider_dedup, provider_key, redis,
    show_charges, show_records,
};
use crate::scenario::REDIS_HOP;
use crate::{Ctx, FaultUse, Hop, Requires, Scenario, ScenarioError, ScenarioFuture, ScenarioResult};

pub const SCENARIO: Scenario = Scenario {
    order: 3,
    requires: Requires {
        postgres: false,
        redis: true,
        services: &[&payments::SPEC],
        faults: FaultUse::Toxics(&[Hop::Redis]),
    },
    knobs: &[],
    run: |ctx: &Ctx| -> ScenarioFuture<'_> { Box::pin(run(ctx)) },
};

const K1: &str = "K1";
const K2: &str = "K2";
const K3: &str = "K3";
/// What "bounded" means here: well under idempotency-kit's 6 s, with room for a busy machine.
const BOUND: Duration = Duration::from_secs(1);

/// Pays twice with `key` while Redis is cut; returns whether each call returned within [`BOUND`].
async fn pay_twice(ctx: &Ctx, key: &str) -> Result<bool, ScenarioError> {
    let mut bounded = true;
    for _ in 0..2 {
        let started = Instant::now();
        pay(ctx, key, AMOUNT).await?;
        bounded &= started.elapsed() < BOUND;
    }
    Ok(bounded)
}

async fn run(ctx: &Ctx) -> ScenarioResult {
    let n = &ctx.narrator;

    ctx.faults()?.black_hole(REDIS_HOP).await?;
    n.step("step.cut").await?;
    let pong: String = redis::cmd("PING").query_async(&mut redis(ctx)?).await?;
    n.note(Msg::new("note.redis_alive").arg("reply", pong));

    n.side("side.fail_open");
    n.predict("predict").await?;
    n.step(Msg::new("step.two_calls").arg("key", K1)).await?;
    let mut bounded = pay_twice(ctx, K1).await?;
    show_records(ctx, &[K1]).await?;
    show_charges(ctx).await?;
    let fail_open = provider_charges(ctx, Some(&provider_key(K1))).await?.len();
    n.fact("charges_fail_open", fail_open);
    n.reveal(Msg::new("reveal").arg("charges", fail_open)).await?;

    provider_dedup(ctx, true).await?;
    n.step(Msg::new("step.dedup").arg("key", K2)).await?;
    bounded &= pay_twice(ctx, K2).await?;
    let with_dedup = provider_charges(ctx, Some(&provider_key(K2))).await?.len();
    n.fact("charges_fail_open_provider_dedup", with_dedup);
    n.note(Msg::new("note.dedup").arg("charges", with_dedup));

    n.side("side.fail_closed");
    provider_dedup(ctx, false).await?;
    configure_payments(ctx, json!({"policy": "hardened"})).await?;
    n.step(Msg::new("step.fail_closed").arg("key", K3)).await?;
    let started = Instant::now();
    let closed = pay(ctx, K3, AMOUNT).await?;
    bounded &= started.elapsed() < BOUND;
    let fail_closed = provider_charges(ctx, Some(&provider_key(K3))).await?.len();
    show_charges(ctx).await?;
    n.fact("fail_closed_status", closed.status.unwrap_or_default());
    n.fact("charges_fail_closed", fail_closed);

    n.fact("every_call_under_a_second", bounded);
    n.note(if bounded {
        "note.bounded"
    } else {
        "note.not_bounded"
    });
    n.explain();
    n.quiz();
    Ok(())
}
