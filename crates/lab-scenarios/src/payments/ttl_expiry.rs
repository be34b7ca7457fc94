//! `ttl-expiry`: records and leases end, and what runs again when they do.
//!
//! (a) A stored result expires (simulated: its PTTL is cut to 1 ms instead of waiting an hour):
//! the same key runs the charge again. (b) The compatible coordinator keeps TTLs in whole minutes,
//! rounded down, at least one: asked for 3600, 90 and 30 seconds, Redis's PTTL shows 3600, 60 and
//! 60. (c) A holder crashes inside the charge without releasing its reservation (the lab abandons
//! a coordinator call after it reserved the key): retries get 409 until the lease lapses
//! (simulated), then one charges. (d) A slow first charge outlives its lease, in real time with a
//! 600 ms lease: with the compatible coordinator a second call reserves the lapsed key and charges
//! alongside (two charges); the hardened coordinator renews the lease while the charge runs (every
//! third of its lease, compare-and-set on its owner token), so after two leases the key is still held, the
//! second call gets 409, and the provider charges once. That half runs with a longer lease
//! (2 s), so that only a stall of over a second could end the renewal on a loaded machine.
//!
//! (c) again with a holder that crashes *after* the provider charged: once the lease expires
//! the retry charges a second time, unless the provider removes duplicates by the provider key.
//!
//! Facts: `charges_after_result_expiry` = 2, `ttl_3600_observed` = 3600, `ttl_90_observed` = 60,
//! `ttl_30_observed` = 60, `crashed_holder_status` = 409, `charges_after_crash_after_charge` = 2,
//! `charges_after_crash_after_charge_provider_dedup` = 1, `charges_after_lease_expiry` = 2,
//! `charges_hardened` = 1.

use std::sync::Arc;
use std::time::Duration;

use idem::{Coordinator, InFlight, Policy, Request};
use lab_core::{Msg, Table};
use lab_services::payments::{self, IN_ACTION, PaymentChange, PolicyName};
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::Instrument as _;

use super::{
    AMOUNT, CURRENCY, ORDER, configure_payments, operation, pay, pay_as, pay_msg, provider_charges,
    provider_key, record_key, send_pay, show_charges, show_records, shown_key,
};
use crate::kit::redis::{self, expire_now, ttl_secs, wait_until_gone};
use crate::kit::{Caller, Knob};
use crate::{Ctx, FaultUse, Requires, Scenario, ScenarioError, ScenarioResult};

pub const SCENARIO: Scenario = Scenario {
    order: 4,
    requires: Requires {
        postgres: false,
        redis: true,
        services: &[&payments::SPEC],
        faults: FaultUse::None,
    },
    knobs: &[SHORT_LEASE.spec, HARDENED_LEASE.spec],
    run: |ctx| Box::pin(run(ctx)),
};

/// The TTLs of part (b), in seconds.
const TTLS: [u64; 3] = [3600, 90, 30];
/// Part (d)'s lease: short, so that it really lapses (or is really renewed) while the lab waits.
const SHORT_LEASE: Knob<Duration> = Knob::millis("short_lease_ms", 600, 1..=600_000);
/// The hardened half of part (d): renewed every third of it, on the coordinator's own timer.
const HARDENED_LEASE: Knob<Duration> = Knob::millis("hardened_lease_ms", 2_000, 30..=600_000);
/// A state the lab waits for that does not come within this is a broken script.
const LIMIT: Duration = Duration::from_secs(10);

async fn run(ctx: &Ctx) -> ScenarioResult {
    let n = &ctx.narrator;

    n.side("side.result");
    n.step(Msg::new("step.pay").arg("key", "K1")).await?;
    pay(ctx, "K1", AMOUNT).await?;
    show_records(ctx, &["K1"]).await?;
    n.step("step.result_expires").await?;
    expire_now(&mut ctx.redis()?, &record_key(ctx, "K1")).await?;
    show_records(ctx, &["K1"]).await?;
    n.step(Msg::new("step.same_key").arg("key", "K1")).await?;
    pay(ctx, "K1", AMOUNT).await?;
    let after_expiry = provider_charges(ctx, Some(&provider_key("K1"))).await?;
    n.fact("charges_after_result_expiry", after_expiry.len());
    n.note(Msg::new("note.after_expiry").arg("charges", after_expiry.len()));

    n.side("side.ttl");
    ttl_rounding(ctx).await?;

    n.side("side.crash");
    crashed_holder(ctx).await?;
    crashed_after_charge(ctx).await?;

    n.side("side.slow");
    let short_lease = ctx.knob(&SHORT_LEASE)?;
    let change = PaymentChange {
        lease_ms: Some(millis(short_lease)),
        ..PaymentChange::default()
    };
    configure_payments(ctx, change).await?;
    let compatible = slow_first(ctx, "K4", false, short_lease).await?;
    n.fact("charges_after_lease_expiry", compatible);
    n.reveal(Msg::new("reveal").arg("charges", compatible))
        .await?;

    // The hardened half renews every third of its lease on its own timer, so a machine that
    // stalls for two thirds of a lease would end the renewal and change the story: a longer
    // lease here makes a stall of over a second the only way, and the wait is two leases.
    let hardened_lease = ctx.knob(&HARDENED_LEASE)?;
    let hardened = PaymentChange {
        policy: Some(PolicyName::Hardened),
        lease_ms: Some(millis(hardened_lease)),
        ..PaymentChange::default()
    };
    configure_payments(ctx, hardened).await?;
    n.step("step.hardened").await?;
    let hardened = slow_first(ctx, "K5", true, hardened_lease).await?;
    n.fact("charges_hardened", hardened);
    n.note(Msg::new("note.hardened").arg("charges", hardened));

    n.explain();
    n.quiz();
    Ok(())
}

/// A duration in whole milliseconds, as narratives and the service's switches take it.
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// A coordinator as the payment service builds it, for the parts that drive the coordinator
/// directly: the same prefix, so both see the same records.
fn coordinator(ctx: &Ctx, policy: Policy) -> Result<Coordinator<redis::Conn>, ScenarioError> {
    // The service's generous bound: no outage in this story.
    let policy = policy.command_timeout(payments::DEFAULT_COMMAND_TIMEOUT);
    Ok(Coordinator::new(ctx.redis()?, policy).with_prefix(payments::key_prefix(&ctx.space.prefix)))
}

/// (b) The compatible coordinator's TTLs, read back with PTTL.
async fn ttl_rounding(ctx: &Ctx) -> Result<(), ScenarioError> {
    let n = &ctx.narrator;
    n.step("step.ttl").await?;
    let coordinator = coordinator(ctx, Policy::compatible())?;
    let mut conn = ctx.redis()?;
    let mut rows = Vec::new();
    // Each key with its Redis key and the TTL it was stored with, to read its PTTL again.
    let mut keys = Vec::new();
    for ttl in TTLS {
        let key = format!("ttl-{ttl}");
        let stored = serde_json::json!({"stored": true});
        coordinator
            .coordinate(
                Request::new("ttl.demo", &key, Duration::from_secs(ttl)),
                |_| async { Ok::<_, std::convert::Infallible>(stored) },
            )
            .await
            .map_err(|e| ScenarioError::Broken(format!("the TTL demo call failed: {e}")))?;
        let redis_key = coordinator.record_key("ttl.demo", &key);
        let observed = ttl_secs(&mut conn, &redis_key).await?;
        n.fact(&format!("ttl_{ttl}_observed"), observed);
        let shown = shown_key(ctx, &redis_key);
        rows.push(ttl_row(&shown, ttl, observed));
        keys.push((redis_key, shown, ttl));
    }
    // In step mode, `s` reads the PTTLs again: the class sees them go down.
    let again = lab_core::narrator::reread(move || {
        let (conn, keys) = (conn.clone(), keys.clone());
        async move { ttls_table(conn, &keys).await.ok() }
    });
    n.state_view(ttls_of(rows), again);
    n.note("note.ttl");
    Ok(())
}

/// The TTL demo's keys as Redis has them now: each key, the TTL it was stored with, its PTTL.
async fn ttls_table(
    mut conn: redis::Conn,
    keys: &[(String, String, u64)],
) -> Result<Table, ScenarioError> {
    let mut rows = Vec::new();
    for (redis_key, shown, ttl) in keys {
        rows.push(ttl_row(shown, *ttl, ttl_secs(&mut conn, redis_key).await?));
    }
    Ok(ttls_of(rows))
}

/// A row of the TTL table: the key, the TTL asked for, the TTL Redis has (PTTL, in whole
/// seconds).
fn ttl_row(shown: &str, ttl: u64, observed: i64) -> Vec<String> {
    vec![
        shown.to_string(),
        format!("{ttl} s"),
        format!("{observed} s"),
    ]
}

/// The TTL table.
fn ttls_of(rows: Vec<Vec<String>>) -> Table {
    Table {
        title: Msg::new("table.ttls"),
        columns: ["key", "asked", "set (PTTL)"].map(String::from).to_vec(),
        rows,
    }
}

/// (c) A holder that crashes inside the action: its reservation stays until the lease expires.
/// The holder is the lab's own coordinator call, abandoned (its task aborted) once it is inside.
async fn crashed_holder(ctx: &Ctx) -> Result<(), ScenarioError> {
    let n = &ctx.narrator;
    const K3: &str = "K3";
    // The crash comes right after the reservation, before the provider is called.
    holder_that_crashes(ctx, K3, async {}).await?;
    n.step(Msg::new("step.crash").arg("key", K3)).await?;
    show_records(ctx, &[K3]).await?;

    n.step(Msg::new("step.retry_crashed").arg("key", K3))
        .await?;
    let refused = pay(ctx, K3, AMOUNT).await?;
    n.fact("crashed_holder_status", refused.answer.status_or_zero());

    n.step("step.lease_lapses").await?;
    expire_now(&mut ctx.redis()?, &record_key(ctx, K3)).await?;
    pay(ctx, K3, AMOUNT).await?;
    show_records(ctx, &[K3]).await?;
    Ok(())
}

/// (c) again, the dangerous way round: the holder crashes *after* the provider charged and
/// before the result was stored. The holder is again the lab's own coordinator call, whose
/// action charges the provider with the payment service's provider key and is aborted right
/// after the provider's answer. Once the lease expires (simulated) the retry charges again; a
/// provider that removes duplicates by that key answers it with the first charge instead.
async fn crashed_after_charge(ctx: &Ctx) -> Result<(), ScenarioError> {
    let n = &ctx.narrator;
    let mut charges = Vec::new();
    for (key, dedup) in [("K6", false), ("K7", true)] {
        super::provider_dedup(ctx, dedup).await?;
        n.step(
            Msg::new(if dedup {
                "step.crash_after_charge_dedup"
            } else {
                "step.crash_after_charge"
            })
            .arg("key", key),
        )
        .await?;
        hold_and_crash_after_charge(ctx, key).await?;
        show_records(ctx, &[key]).await?;
        show_charges(ctx).await?;
        n.step(Msg::new("step.lease_expires_after_charge").arg("key", key))
            .await?;
        expire_now(&mut ctx.redis()?, &record_key(ctx, key)).await?;
        pay(ctx, key, AMOUNT).await?;
        charges.push(provider_charges(ctx, Some(&provider_key(key))).await?.len());
    }
    super::provider_dedup(ctx, false).await?;
    n.fact("charges_after_crash_after_charge", charges[0]);
    n.fact(
        "charges_after_crash_after_charge_provider_dedup",
        charges[1],
    );
    n.note(
        Msg::new("note.crash_after_charge")
            .arg("charges", charges[0])
            .arg("dedup", charges[1]),
    );
    Ok(())
}

/// A holder of `key` that charges the provider (with the payment service's provider key) and
/// dies before its coordinator stores the result.
async fn hold_and_crash_after_charge(ctx: &Ctx, key: &str) -> Result<(), ScenarioError> {
    let provider = ctx.service(&lab_services::provider::SPEC)?.url.clone();
    let provider_key = provider_key(key);
    holder_that_crashes(ctx, key, async move {
        let body = lab_services::provider::ChargeRequest {
            order_id: ORDER.to_string(),
            amount: AMOUNT,
            currency: CURRENCY.to_string(),
        };
        // Whatever the provider answers, the holder dies right after: nothing is stored.
        let _ = Caller::new()
            .http()
            .post(format!("{provider}/charges"))
            .header("Idempotency-Key", provider_key)
            .json(&body)
            .send()
            .await;
    })
    .await
}

/// A coordinator call for `key` (the lab's own, built as the payment service builds it) whose
/// action runs `before_crash` and then never ends; once it has got that far, its task is aborted:
/// a process that crashes inside the action, leaving its reservation to the lease.
async fn holder_that_crashes(
    ctx: &Ctx,
    key: &str,
    before_crash: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ScenarioError> {
    let fingerprint = payments::fingerprint(&ORDER, AMOUNT, CURRENCY);
    let coordinator = coordinator(ctx, Policy::compatible().in_flight(InFlight::Raise))?;
    let (operation, key) = (operation(), key.to_string());
    let inside = Arc::new(Notify::new());
    let holder = tokio::spawn({
        let (inside, key) = (inside.clone(), key.clone());
        async move {
            let request =
                Request::new(&operation, &key, payments::RESULT_TTL).fingerprint(&fingerprint);
            let _ = coordinator
                .coordinate(request, |_| async move {
                    before_crash.await;
                    inside.notify_one();
                    // The crash comes while the holder is here.
                    std::future::pending::<Result<serde_json::Value, std::convert::Infallible>>()
                        .await
                })
                .await;
        }
        .in_current_span()
    });
    tokio::time::timeout(LIMIT, inside.notified())
        .await
        .map_err(|_| ScenarioError::Broken(format!("the holder of {key} never got inside")))?;
    holder.abort();
    let _ = holder.await;
    Ok(())
}

/// (d) A first call held inside its charge for longer than the lease, then a second call with
/// the same key. Returns the provider's charges under that key in the end.
async fn slow_first(
    ctx: &Ctx,
    key: &str,
    hardened: bool,
    lease: Duration,
) -> Result<usize, ScenarioError> {
    let n = &ctx.narrator;
    let url = ctx.service(&payments::SPEC)?.url.clone();
    n.step(
        Msg::new("step.slow_first")
            .arg("key", key)
            .arg("lease", lease),
    )
    .await?;
    n.call("who.first", payments::NAME, pay_msg("first", key, AMOUNT));
    let first_caller = Caller::patient();
    let mut first = ctx
        .hold(IN_ACTION)
        .call(send_pay(&first_caller, &url, key, AMOUNT))
        .await?;
    let entered_at = Instant::now();

    if hardened {
        // Real time is the lesson here: two whole leases pass while the holder renews.
        first
            .meanwhile(tokio::time::sleep_until(entered_at + 2 * lease))
            .await?;
        n.step(Msg::new("step.renewed").arg("lease", lease)).await?;
    } else {
        let record = record_key(ctx, key);
        let mut conn = ctx.redis()?;
        first
            .meanwhile(wait_until_gone(&mut conn, &record))
            .await??;
        n.step(Msg::new("step.lapsed").arg("lease", lease)).await?;
    }
    show_records(ctx, &[key]).await?;

    if !hardened {
        n.predict("predict").await?;
    }
    n.step(Msg::new("step.second").arg("key", key)).await?;
    first
        .meanwhile(pay_as(ctx, "second", key, AMOUNT))
        .await??;
    n.step("step.first_finishes").await?;
    let first = first.release().await;
    n.response(first.view());
    show_records(ctx, &[key]).await?;
    show_charges(ctx).await?;
    Ok(provider_charges(ctx, Some(&provider_key(key))).await?.len())
}
