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
//! 200 ms, compare-and-set on its owner token), so after two leases the key is still held, the
//! second call gets 409, and the provider charges once.
//!
//! Facts: `charges_after_result_expiry` = 2, `ttl_3600_observed` = 3600, `ttl_90_observed` = 60,
//! `ttl_30_observed` = 60, `crashed_holder_status` = 409, `charges_after_lease_expiry` = 2,
//! `charges_hardened` = 1.

use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument as _;

use idem::{Coordinator, InFlight, Policy, Request};
use lab_core::{Msg, Table};
use lab_services::payments::{self, IN_ACTION};
use serde_json::json;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{
    AMOUNT, CURRENCY, ORDER, Paid, configure_payments, operation, patient_client, pay, pay_as,
    pay_msg, payment_service, provider_charges, provider_key, pttl_secs, record_key, redis,
    send_pay, show_charges, show_records, shown_key,
};
use crate::{
    Ctx, FaultUse, Knob, Requires, Scenario, ScenarioError, ScenarioFuture, ScenarioResult,
};

pub const SCENARIO: Scenario = Scenario {
    order: 4,
    requires: Requires {
        postgres: false,
        redis: true,
        services: &[&payments::SPEC],
        faults: FaultUse::None,
    },
    knobs: &[Knob::Millis {
        name: "short_lease_ms",
        default: SHORT_LEASE.as_millis() as u64,
    }],
    run: |ctx: &Ctx| -> ScenarioFuture<'_> { Box::pin(run(ctx)) },
};

/// The TTLs of part (b), in seconds.
const TTLS: [u64; 3] = [3600, 90, 30];
/// Part (d)'s lease: short, so that it really lapses (or is really renewed) while the lab waits
/// (knob `short_lease_ms`).
const SHORT_LEASE: Duration = Duration::from_millis(600);
/// A state the lab waits for that does not come within this is a broken script.
const LIMIT: Duration = Duration::from_secs(10);

async fn run(ctx: &Ctx) -> ScenarioResult {
    let n = &ctx.narrator;

    n.side("side.result");
    n.step(Msg::new("step.pay").arg("key", "K1")).await?;
    pay(ctx, "K1", AMOUNT).await?;
    show_records(ctx, &["K1"]).await?;
    n.step("step.result_expires").await?;
    expire_now(ctx, &record_key(ctx, "K1")).await?;
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

    n.side("side.slow");
    let short_lease = ctx.millis("short_lease_ms")?;
    configure_payments(ctx, json!({"lease_ms": short_lease.as_millis() as u64})).await?;
    let compatible = slow_first(ctx, "K4", false, short_lease).await?;
    n.fact("charges_after_lease_expiry", compatible);
    n.reveal(Msg::new("reveal").arg("charges", compatible))
        .await?;

    configure_payments(ctx, json!({"policy": "hardened"})).await?;
    n.step("step.hardened").await?;
    let hardened = slow_first(ctx, "K5", true, short_lease).await?;
    n.fact("charges_hardened", hardened);
    n.note(Msg::new("note.hardened").arg("charges", hardened));

    n.explain();
    n.quiz();
    Ok(())
}

/// Simulated time: cuts a key's remaining life to 1 ms, then waits (by watching Redis) until it
/// is gone, instead of waiting out its TTL or lease.
async fn expire_now(ctx: &Ctx, key: &str) -> Result<(), ScenarioError> {
    let mut conn = redis(ctx)?;
    let _: i64 = redis::cmd("PEXPIRE")
        .arg(key)
        .arg(1)
        .query_async(&mut conn)
        .await?;
    wait_until_gone(ctx, key).await
}

/// Waits until `key` no longer exists in Redis (it expired), watching Redis itself.
#[tracing::instrument(name = "lab.backstage", skip_all)]
async fn wait_until_gone(ctx: &Ctx, key: &str) -> Result<(), ScenarioError> {
    let mut conn = redis(ctx)?;
    let deadline = Instant::now() + LIMIT;
    loop {
        let exists: i64 = redis::cmd("EXISTS").arg(key).query_async(&mut conn).await?;
        if exists == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(ScenarioError::Broken(format!("{key} never expired")));
        }
        // Polling Redis for an expiry that is due within milliseconds.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A coordinator as the payment service builds it, for the parts that drive the coordinator
/// directly: the same prefix, so both see the same records.
fn coordinator(
    ctx: &Ctx,
    policy: Policy,
) -> Result<Coordinator<lab_core::trace::Traced<redis::aio::MultiplexedConnection>>, ScenarioError>
{
    // The service's generous bound: no outage in this story.
    let policy = policy.command_timeout(payments::DEFAULT_COMMAND_TIMEOUT);
    Ok(Coordinator::new(redis(ctx)?, policy).with_prefix(payments::key_prefix(&ctx.space.prefix)))
}

/// (b) The compatible coordinator's TTLs, read back with PTTL.
async fn ttl_rounding(ctx: &Ctx) -> Result<(), ScenarioError> {
    let n = &ctx.narrator;
    n.step("step.ttl").await?;
    let coordinator = coordinator(ctx, Policy::compatible())?;
    let mut conn = redis(ctx)?;
    let mut rows = Vec::new();
    // Each key with its Redis key and the TTL it was stored with, to read its PTTL again.
    let mut keys = Vec::new();
    for ttl in TTLS {
        let key = format!("ttl-{ttl}");
        coordinator
            .coordinate(
                Request::new("ttl.demo", &key, Duration::from_secs(ttl)),
                |_| async { Ok::<_, std::convert::Infallible>(json!({"stored": true})) },
            )
            .await
            .map_err(|e| ScenarioError::Broken(format!("the TTL demo call failed: {e}")))?;
        let redis_key = coordinator.record_key("ttl.demo", &key);
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&redis_key)
            .query_async(&mut conn)
            .await?;
        let observed = pttl_secs(pttl);
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
    mut conn: lab_core::trace::Traced<redis::aio::MultiplexedConnection>,
    keys: &[(String, String, u64)],
) -> Result<Table, ScenarioError> {
    let mut rows = Vec::new();
    for (redis_key, shown, ttl) in keys {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(redis_key)
            .query_async(&mut conn)
            .await?;
        rows.push(ttl_row(shown, *ttl, pttl_secs(pttl)));
    }
    Ok(ttls_of(rows))
}

/// A row of the TTL table: the key, the TTL it was stored with, its PTTL in whole seconds.
fn ttl_row(shown: &str, ttl: u64, observed: i64) -> Vec<String> {
    vec![shown.to_string(), ttl.to_string(), format!("{observed} s")]
}

/// The TTL table.
fn ttls_of(rows: Vec<Vec<String>>) -> Table {
    Table {
        title: Msg::new("table.ttls"),
        columns: ["key", "ttl_seconds", "pttl"].map(String::from).to_vec(),
        rows,
    }
}

/// (c) A holder that crashes inside the action: its reservation stays until the lease lapses.
async fn crashed_holder(ctx: &Ctx) -> Result<(), ScenarioError> {
    let n = &ctx.narrator;
    const K3: &str = "K3";
    let order = uuid::Uuid::parse_str(ORDER).expect("a UUID");
    let fingerprint = payments::fingerprint(&order, AMOUNT, CURRENCY);
    let coordinator = coordinator(ctx, Policy::compatible().in_flight(InFlight::Raise))?;
    let operation = operation();
    let inside = Arc::new(Notify::new());
    let holder = tokio::spawn({
        let inside = inside.clone();
        async move {
            let request =
                Request::new(&operation, K3, payments::RESULT_TTL).fingerprint(&fingerprint);
            let _ = coordinator
                .coordinate(request, |_| async move {
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
        .map_err(|_| ScenarioError::Broken("the holder never reserved K3".into()))?;
    holder.abort();
    let _ = holder.await;
    n.step(Msg::new("step.crash").arg("key", K3)).await?;
    show_records(ctx, &[K3]).await?;

    n.step(Msg::new("step.retry_crashed").arg("key", K3))
        .await?;
    let refused = pay(ctx, K3, AMOUNT).await?;
    n.fact("crashed_holder_status", refused.status.unwrap_or_default());

    n.step("step.lease_lapses").await?;
    expire_now(ctx, &record_key(ctx, K3)).await?;
    pay(ctx, K3, AMOUNT).await?;
    show_records(ctx, &[K3]).await?;
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
    let service = payment_service(ctx)?;
    let entered = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    ctx.checkpoints.install(IN_ACTION, {
        let (entered, release) = (entered.clone(), release.clone());
        Arc::new(move || {
            let (entered, release) = (entered.clone(), release.clone());
            Box::pin(async move {
                entered.notify_one();
                release.notified().await;
            })
        })
    });

    n.step(
        Msg::new("step.slow_first")
            .arg("key", key)
            .arg("lease", lease.as_millis() as i64),
    )
    .await?;
    n.call("who.first", payments::NAME, pay_msg("first", key, AMOUNT));
    let first_client = patient_client()?;
    let first = send_pay(&first_client, service, key, AMOUNT);
    tokio::pin!(first);
    tokio::select! {
        held = tokio::time::timeout(LIMIT, entered.notified()) => {
            held.map_err(|_| ScenarioError::Broken(format!("the first {key} call never reached the charge")))?;
        }
        done = &mut first => {
            return Err(ScenarioError::Broken(format!(
                "the first {key} call ended before the charge: {:?}",
                done.map(|p| p.status)
            )));
        }
    }
    let entered_at = Instant::now();
    ctx.checkpoints.clear(IN_ACTION);

    if hardened {
        // Real time is the lesson here: two whole leases pass while the holder renews.
        let two_leases_later = entered_at + 2 * lease;
        tokio::select! {
            _ = tokio::time::sleep_until(two_leases_later) => {}
            _ = &mut first => return Err(ScenarioError::Broken("the first call was released early".into())),
        }
        n.step(Msg::new("step.renewed").arg("lease", lease.as_millis() as i64))
            .await?;
    } else {
        let record = record_key(ctx, key);
        tokio::select! {
            gone = wait_until_gone(ctx, &record) => gone?,
            _ = &mut first => return Err(ScenarioError::Broken("the first call was released early".into())),
        }
        n.step(Msg::new("step.lapsed").arg("lease", lease.as_millis() as i64))
            .await?;
    }
    show_records(ctx, &[key]).await?;

    if !hardened {
        n.predict("predict").await?;
    }
    n.step(Msg::new("step.second").arg("key", key)).await?;
    let second: Paid = tokio::select! {
        second = pay_as(ctx, "second", key, AMOUNT) => second?,
        _ = &mut first => return Err(ScenarioError::Broken("the first call was released early".into())),
    };
    let _ = second;
    n.step("step.first_finishes").await?;
    release.notify_one();
    let first = first.await?;
    n.response(first.view());
    show_records(ctx, &[key]).await?;
    show_charges(ctx).await?;
    Ok(provider_charges(ctx, Some(&provider_key(key))).await?.len())
}
