//! `idempotent`: the same crash and retry, with an Idempotency-Key.
//!
//! Both POSTs carry `Idempotency-Key: report-task-42`, a key that names the logical operation
//! (task 42's monthly report), not the attempt. The service inserts report 1 for the first call
//! (201) and answers the retry with the same report (200, `replayed: true`): one report. Then the
//! design mistake: a key built from the attempt number (`report-task-42-attempt-2`) is a new key
//! for every retry, so the service creates a second report again.
//!
//! Facts: `reports_total` = 1, `first_status` = 201, `retry_status` = 200,
//! `retry_replayed` = true, `same_report_id` = true, `task_status` = "completed",
//! `per_attempt_key_reports_total` = 2.

use lab_core::Msg;

use lab_services::reports;

use super::{
    REPORT_TYPE, STABLE_KEY, TASK_ID, claim, complete, count_reports, crash_after_post, created,
    post_report, report_service, reset_tables, show_reports, show_task,
};
use crate::kit::Caller;
use crate::{Ctx, FaultUse, Requires, Scenario, ScenarioError, ScenarioResult};

pub const SCENARIO: Scenario = Scenario {
    order: 2,
    requires: Requires {
        postgres: true,
        redis: false,
        services: &[&reports::SPEC],
        faults: FaultUse::None,
    },
    knobs: &[],
    run: |ctx| Box::pin(run(ctx)),
};

/// The key the mistaken design builds from the attempt number.
fn per_attempt_key(attempts: i32) -> String {
    format!("report-task-{TASK_ID}-attempt-{attempts}")
}

async fn run(ctx: &Ctx) -> ScenarioResult {
    let n = &ctx.narrator;
    let api = report_service(ctx)?;
    let client = Caller::new();

    n.side(Msg::new("side.stable").arg("key", STABLE_KEY));
    let (first, attempts_b) =
        crash_after_post(ctx, api, Some(STABLE_KEY), Msg::new("step.post_a")).await?;
    let first_created = created(&first)
        .ok_or_else(|| ScenarioError::Broken("worker A's POST created no report".into()))?;

    n.predict("predict").await?;
    n.step(Msg::new("step.post_b").arg("key", STABLE_KEY))
        .await?;
    let retry = post_report(ctx, &client, api, "b", Some(STABLE_KEY), REPORT_TYPE).await;
    let retry_created = created(&retry)
        .ok_or_else(|| ScenarioError::Broken("worker B's POST got no report".into()))?;

    n.step(Msg::new("step.complete_b").arg("report_id", retry_created.report_id))
        .await?;
    complete(ctx, "b", attempts_b, retry_created.report_id, true).await?;
    let task = super::tasks::task(ctx.pg()?, TASK_ID).await?;
    show_reports(ctx).await?;

    let reports = count_reports(ctx).await?;
    n.fact("reports_total", reports);
    n.fact("first_status", first.status_or_zero());
    n.fact("retry_status", retry.status_or_zero());
    n.fact("retry_replayed", retry_created.replayed);
    n.fact(
        "same_report_id",
        retry_created.report_id == first_created.report_id,
    );
    n.fact("task_status", task.status.clone());
    n.reveal(
        Msg::new("reveal")
            .arg("status", retry.status_or_zero())
            .arg("report_id", retry_created.report_id)
            .arg("reports", reports),
    )
    .await?;

    // The other side: the same story, told briefly, with a key that changes with every attempt.
    n.side("side.per_attempt");
    reset_tables(ctx).await?;
    super::tasks::create_task(ctx.pg()?, TASK_ID).await?;
    let attempts_a = claim(ctx).await?;
    let key_a = per_attempt_key(attempts_a);
    n.step(Msg::new("step.again_briefly").arg("key", &key_a))
        .await?;
    post_report(ctx, &client, api, "a", Some(&key_a), REPORT_TYPE).await;
    super::tasks::expire_lease(ctx.pg()?, TASK_ID).await?;
    let attempts_b = claim(ctx).await?;
    n.step(Msg::new("step.crash_and_reclaim").arg("attempts", attempts_b))
        .await?;
    show_task(ctx).await?;
    let key_b = per_attempt_key(attempts_b);
    n.predict("predict_attempt").await?;
    n.step(Msg::new("step.post_b_attempt").arg("key", &key_b))
        .await?;
    let retry = post_report(ctx, &client, api, "b", Some(&key_b), REPORT_TYPE).await;
    if let Some(created) = created(&retry) {
        super::tasks::complete_task(ctx.pg()?, TASK_ID, attempts_b, created.report_id, true)
            .await?;
    }
    show_reports(ctx).await?;
    let per_attempt_reports = count_reports(ctx).await?;
    n.fact("per_attempt_key_reports_total", per_attempt_reports);
    n.reveal(Msg::new("reveal_attempt").arg("reports", per_attempt_reports))
        .await?;

    n.explain();
    n.quiz();
    Ok(())
}
