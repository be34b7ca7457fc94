//! `timeout`: a timeout says nothing about the outcome.
//!
//! The hop from the worker to the report service goes through the fault proxy, which holds
//! every response 900 ms on its way back (a downstream latency toxic). Worker A's HTTP client
//! gives up after 150 ms: the outcome is `unknown`. Right after the timeout we read the report
//! service's table: the report is there, committed. Retrying at once, while the service is still
//! slow, times out again (`unknown`, though the service replayed the report). Once the proxy
//! stops delaying, the retry with the same key gets 200 and the same report; the task is
//! completed. The other side: the same timeout, and a retry without a key: two reports.
//!
//! The order is fixed by a checkpoint, not by the clock: the service finishes its work in a task
//! of its own (this server does not cancel work when the client leaves; whether a server does is
//! up to the server, and the client cannot tell), and the scenario tells what the client saw
//! only once the service has reached its `answered` checkpoint.
//!
//! The third side puts the delay before the COMMIT: the service holds the request inside its
//! transaction (the INSERT done, not committed) while the client gives up. What is left depends
//! on the server, and the client cannot tell which it got: a handler cancelled with its request
//! (as axum's is) rolls back, and the retry creates the report; a handler that finishes in a
//! task of its own commits after the client left, and the retry gets that report. With the
//! first side, those are the three outcomes an `unknown` can hide.
//!
//! Facts: `first_outcome` = "unknown", `reports_after_timeout` = 1, `retry_while_slow_outcome` =
//! "unknown", `retry_status` = 200, `same_report_id` = true, `reports_total` = 1, `task_status`
//! = "completed", `keyless_retry_reports_total` = 2; before the COMMIT:
//! `cancelled_outcome` = "unknown", `cancelled_reports_after_timeout` = 0,
//! `cancelled_retry_status` = 201, `cancelled_reports_total` = 1, `finishing_outcome` =
//! "unknown", `finishing_reports_after_timeout` = 0, `finishing_reports_after_commit` = 1,
//! `finishing_retry_status` = 200, `finishing_retry_same_report` = true.

use std::time::Duration;

use lab_core::Msg;
use lab_services::reports::{self, AFTER_INSERT, ANSWERED, COMMITTED, ReportChange};
use lab_services::stage::ServiceHandle;

use super::{
    REPORT_TYPE, STABLE_KEY, TASK_ID, complete, count_reports, created, post_report,
    report_service, request_msg, reset_tables, seed_and_claim_a, send_post, show_reports,
};
use crate::kit::call::{Wire, classify};
use crate::kit::hold::StillHeld;
use crate::kit::{Answer, Caller, Knob};
use crate::{Ctx, FaultUse, Hop, Requires, Scenario, ScenarioError, ScenarioResult};

pub const SCENARIO: Scenario = Scenario {
    order: 3,
    requires: Requires {
        postgres: true,
        redis: false,
        services: &[&reports::SPEC],
        faults: FaultUse::Toxics(&[Hop::Service(&reports::SPEC)]),
    },
    knobs: &[CLIENT_TIMEOUT.spec, SLOW_RESPONSE.spec],
    run: |ctx| Box::pin(run(ctx)),
};

/// How long worker A's HTTP client waits for an answer.
const CLIENT_TIMEOUT: Knob<Duration> = Knob::millis("client_timeout_ms", 150, 1..=600_000);
/// How long the fault proxy holds each response on its way back.
const SLOW_RESPONSE: Knob<Duration> = Knob::millis("slow_response_ms", 900, 1..=600_000);
/// The retry's client waits longer: it must not time out on a busy machine, or the run would
/// tell another story than the one it shows.
const RETRY_TIMEOUT: Duration = Duration::from_secs(10);

/// A call through the slow hop with a client that gives up early: the request, what the
/// service does, and then (only once the service has its answer ready, so the order never
/// depends on the machine's speed) what the client saw.
async fn call_through_slow_hop(
    ctx: &Ctx,
    api: &ServiceHandle,
    key: Option<&str>,
    client_timeout: Duration,
) -> Result<Answer, ScenarioError> {
    let answered = ctx.notice(ANSWERED);
    ctx.narrator.call_waiting(
        "worker.a",
        reports::NAME,
        request_msg("a", "/reports", key, REPORT_TYPE),
        client_timeout,
    );
    let caller = Caller::waiting(client_timeout);
    let answer = send_post(&caller, api, "/reports", key, REPORT_TYPE).await;
    answered.passed().await?;
    drop(answered);
    ctx.narrator.response(answer.view());
    Ok(answer)
}

/// Worker A's retry once the story no longer turns on its timeout: narrated, with a client that
/// waits long enough for a busy machine (`RETRY_TIMEOUT`).
async fn retry_patiently(ctx: &Ctx, api: &ServiceHandle, key: Option<&str>) -> Answer {
    post_report(
        ctx,
        &Caller::waiting(RETRY_TIMEOUT),
        api,
        "a",
        key,
        REPORT_TYPE,
    )
    .await
}

/// An answer's outcome as the narrative's language labels it (`outcome.unknown`: «неизвестно»).
fn outcome_label(answer: &Answer) -> Msg {
    Msg::new(format!("outcome.{}", answer.outcome.word()))
}

/// The two timings of the story: how long the proxy holds each answer, how long the client
/// waits.
#[derive(Clone, Copy)]
struct Timing {
    slow_response: Duration,
    client_timeout: Duration,
}

async fn run(ctx: &Ctx) -> ScenarioResult {
    let timing = Timing {
        client_timeout: ctx.knob(&CLIENT_TIMEOUT)?,
        slow_response: ctx.knob(&SLOW_RESPONSE)?,
    };
    ctx.narrator.side("side.keyed");
    keyed(ctx, timing).await?;
    ctx.narrator.side("side.keyless");
    keyless(ctx, timing).await?;
    ctx.narrator.side("side.before_commit");
    before_commit(ctx, timing).await?;
    ctx.narrator.explain();
    ctx.narrator.quiz();
    Ok(())
}

/// The timeout, a retry while the answers are still held, and one once they are not: all with
/// the stable key.
async fn keyed(ctx: &Ctx, timing: Timing) -> ScenarioResult {
    let n = &ctx.narrator;
    // Every call of this scenario goes through the proxy on the service's hop.
    let api = report_service(ctx)?;
    let attempts = seed_and_claim_a(ctx).await?;
    let slow = ctx
        .faults()?
        .slow_responses(reports::NAME, timing.slow_response)
        .await?;
    n.step(
        Msg::new("step.slow_hop")
            .arg("delay", timing.slow_response)
            .arg("timeout", timing.client_timeout),
    )
    .await?;
    n.predict("predict").await?;

    // Worker A's call: the service commits, the proxy holds the answer, the client gives up.
    n.step(Msg::new("step.post_a").arg("key", STABLE_KEY))
        .await?;
    let first = call_through_slow_hop(ctx, api, Some(STABLE_KEY), timing.client_timeout).await?;

    n.step("step.look").await?;
    let reports_after_timeout = count_reports(ctx).await?;
    let rows = show_reports(ctx).await?;
    let created_id = rows.first().map(|r| r.id);
    n.fact("first_outcome", first.outcome.word());
    n.fact("reports_after_timeout", reports_after_timeout);
    n.reveal(
        Msg::new("reveal")
            .arg("outcome", outcome_label(&first))
            .arg("reports", reports_after_timeout),
    )
    .await?;

    // Retrying at once, against a service that is still slow, times out again.
    n.step(Msg::new("step.retry_at_once").arg("key", STABLE_KEY))
        .await?;
    let at_once = call_through_slow_hop(ctx, api, Some(STABLE_KEY), timing.client_timeout).await?;
    n.fact("retry_while_slow_outcome", at_once.outcome.word());
    n.note(Msg::new("note.retry_at_once").arg("outcome", outcome_label(&at_once)));

    ctx.faults()?.remove(slow).await?;
    n.step(Msg::new("step.retry").arg("key", STABLE_KEY))
        .await?;
    let retry = retry_patiently(ctx, api, Some(STABLE_KEY)).await;
    let retry_id = created(&retry).map(|c| c.report_id);
    if let Some(report_id) = retry_id {
        n.step(Msg::new("step.complete").arg("report_id", report_id))
            .await?;
        complete(ctx, "a", attempts, report_id, true).await?;
    }
    let task = super::tasks::task(ctx.pg()?, TASK_ID).await?;
    show_reports(ctx).await?;

    n.fact("retry_status", retry.status_or_zero());
    n.fact(
        "same_report_id",
        retry_id.is_some() && retry_id == created_id,
    );
    n.fact("reports_total", count_reports(ctx).await?);
    n.fact("task_status", task.status);
    Ok(())
}

/// The other side: the same timeout, and a retry without a key.
async fn keyless(ctx: &Ctx, timing: Timing) -> ScenarioResult {
    let n = &ctx.narrator;
    let api = report_service(ctx)?;
    reset_tables(ctx).await?;
    n.note("note.reset");
    seed_and_claim_a(ctx).await?;
    let slow = ctx
        .faults()?
        .slow_responses(reports::NAME, timing.slow_response)
        .await?;
    n.step("step.post_keyless").await?;
    call_through_slow_hop(ctx, api, None, timing.client_timeout).await?;
    ctx.faults()?.remove(slow).await?;
    n.predict("predict_keyless").await?;
    n.step("step.retry_keyless").await?;
    retry_patiently(ctx, api, None).await;
    show_reports(ctx).await?;
    let keyless = count_reports(ctx).await?;
    n.fact("keyless_retry_reports_total", keyless);
    n.reveal(Msg::new("reveal_keyless").arg("reports", keyless))
        .await?;
    Ok(())
}

/// The third side: the client gives up while the service is still inside its transaction.
/// First with a handler cancelled with its request, then with one that finishes on its own.
async fn before_commit(ctx: &Ctx, timing: Timing) -> ScenarioResult {
    let n = &ctx.narrator;
    let api = report_service(ctx)?;
    reset_tables(ctx).await?;
    n.note("note.reset_tables");
    let finishes = |on| ReportChange {
        finish_after_disconnect: Some(on),
        ..ReportChange::default()
    };

    ctx.configure(&reports::SPEC, &finishes(false)).await?;
    n.step(Msg::new("step.cancelling_handler").arg("timeout", timing.client_timeout))
        .await?;
    n.predict("predict_before_commit").await?;
    n.step(Msg::new("step.post_before_commit").arg("key", STABLE_KEY))
        .await?;
    let (gave_up, held) = give_up_inside_the_transaction(ctx, api, timing.client_timeout).await?;
    held.cancelled().await?;
    drop(held);
    n.note("note.handler_cancelled");
    let after_timeout = count_reports(ctx).await?;
    show_reports(ctx).await?;
    n.step(Msg::new("step.retry_same_key").arg("key", STABLE_KEY))
        .await?;
    let retry = retry_patiently(ctx, api, Some(STABLE_KEY)).await;
    show_reports(ctx).await?;
    let total = count_reports(ctx).await?;
    n.fact("cancelled_outcome", gave_up.outcome.word());
    n.fact("cancelled_reports_after_timeout", after_timeout);
    n.fact("cancelled_retry_status", retry.status_or_zero());
    n.fact("cancelled_reports_total", total);
    n.reveal(
        Msg::new("reveal_before_commit")
            .arg("after_timeout", after_timeout)
            .arg("status", retry.status_or_zero())
            .arg("reports", total),
    )
    .await?;

    reset_tables(ctx).await?;
    ctx.configure(&reports::SPEC, &finishes(true)).await?;
    n.step("step.finishing_handler").await?;
    n.step(Msg::new("step.post_before_commit").arg("key", STABLE_KEY))
        .await?;
    let (gave_up, held) = give_up_inside_the_transaction(ctx, api, timing.client_timeout).await?;
    let after_timeout = count_reports(ctx).await?;
    n.note(Msg::new("note.not_committed_yet").arg("reports", after_timeout));
    show_reports(ctx).await?;
    let committed = ctx.notice(COMMITTED);
    n.step("step.handler_finishes").await?;
    held.release();
    committed.passed().await?;
    drop(committed);
    let after_commit = count_reports(ctx).await?;
    let rows = show_reports(ctx).await?;
    n.step(Msg::new("step.retry_same_key").arg("key", STABLE_KEY))
        .await?;
    let retry = retry_patiently(ctx, api, Some(STABLE_KEY)).await;
    let same = created(&retry).map(|c| c.report_id) == rows.first().map(|r| r.id);
    n.fact("finishing_outcome", gave_up.outcome.word());
    n.fact("finishing_reports_after_timeout", after_timeout);
    n.fact("finishing_reports_after_commit", after_commit);
    n.fact("finishing_retry_status", retry.status_or_zero());
    n.fact("finishing_retry_same_report", same);
    n.note(
        Msg::new("note.finishing")
            .arg("after_commit", after_commit)
            .arg("status", retry.status_or_zero()),
    );
    Ok(())
}

/// Worker A's POST, held by the service after its INSERT and before its COMMIT while the
/// client waits `patience` and gives up. Returns what the client saw (no answer) and the
/// handler, still held.
async fn give_up_inside_the_transaction(
    ctx: &Ctx,
    api: &ServiceHandle,
    patience: Duration,
) -> Result<(Answer, StillHeld), ScenarioError> {
    ctx.narrator.call_waiting(
        "worker.a",
        reports::NAME,
        request_msg("a", "/reports", Some(STABLE_KEY), REPORT_TYPE),
        patience,
    );
    let caller = Caller::new();
    let held = ctx
        .hold(AFTER_INSERT)
        .call(send_post(
            &caller,
            api,
            "/reports",
            Some(STABLE_KEY),
            REPORT_TYPE,
        ))
        .await?;
    let still_held = held.give_up_after(patience).await?;
    // The client's own timer fired: to it, this is a timeout like any other.
    let gave_up = classify(Wire::TimedOut);
    ctx.narrator.response(gave_up.view());
    Ok((gave_up, still_held))
}
