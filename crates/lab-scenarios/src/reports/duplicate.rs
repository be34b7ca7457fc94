//! `duplicate`: a worker crash duplicates a report.
//!
//! Worker A claims task 42 and POSTs to the report service without an Idempotency-Key; the
//! service creates report 1, but worker A crashes before `complete_task`. The lease expires,
//! worker B claims the task (attempts = 2) and POSTs again: the service cannot tell it is the
//! same operation and creates report 2. The lease recovered the task; nothing protected the
//! external effect.
//!
//! Facts: `reports_total` = 2, `task_status` = "completed", `task_attempts` = 2,
//! `task_report_is_second` = true.
//!
//! Knob `idempotency_key` (off by default): both workers send the stable key `report-task-42`,
//! the fix the `idempotent` scenario tells in full. Worker B's call is then answered with report
//! 1, and the run ends with one report.

use lab_core::Msg;
use lab_services::reports;

use super::{
    REPORT_TYPE, STABLE_KEY, TASK_ID, complete, count_reports, crash_after_post, created,
    post_report, report_service, show_reports,
};
use crate::kit::{Caller, Knob};
use crate::{Ctx, FaultUse, Requires, Scenario, ScenarioError, ScenarioResult};

pub const SCENARIO: Scenario = Scenario {
    order: 1,
    requires: Requires {
        postgres: true,
        redis: false,
        services: &[&reports::SPEC],
        faults: FaultUse::None,
    },
    knobs: &[IDEMPOTENCY_KEY.spec],
    run: |ctx| Box::pin(run(ctx)),
};

/// Both workers send the stable key: the fix, told in full by `idempotent`.
const IDEMPOTENCY_KEY: Knob<bool> = Knob::switch("idempotency_key", false);

async fn run(ctx: &Ctx) -> ScenarioResult {
    let n = &ctx.narrator;
    let api = report_service(ctx)?;
    // The broken design sends no key; the knob sends the stable one, and the texts say so.
    let key = ctx.knob(&IDEMPOTENCY_KEY)?.then_some(STABLE_KEY);
    let told = |step: &str| match key {
        Some(key) => Msg::new(format!("{step}_key")).arg("key", key),
        None => Msg::new(step),
    };
    let (first, attempts_b) = crash_after_post(ctx, api, key, told("step.post_a")).await?;
    let first_id = created(&first)
        .ok_or_else(|| ScenarioError::Broken("worker A's POST created no report".into()))?
        .report_id;

    n.predict(if key.is_some() {
        "predict_key"
    } else {
        "predict"
    })
    .await?;
    n.step(told("step.post_b")).await?;
    let second = post_report(ctx, &Caller::new(), api, "b", key, REPORT_TYPE).await;
    let second_id = created(&second)
        .ok_or_else(|| ScenarioError::Broken("worker B's POST created no report".into()))?
        .report_id;

    n.step(Msg::new("step.complete_b").arg("report_id", second_id))
        .await?;
    complete(ctx, "b", attempts_b, second_id, true).await?;
    let task = super::tasks::task(ctx.pg()?, TASK_ID).await?;
    show_reports(ctx).await?;

    let reports = count_reports(ctx).await?;
    n.fact("reports_total", reports);
    n.fact("task_status", task.status.clone());
    n.fact("task_attempts", task.attempts);
    n.fact(
        "task_report_is_second",
        task.report_id == Some(second_id) && second_id != first_id,
    );
    n.reveal(
        Msg::new(if key.is_some() {
            "reveal_key"
        } else {
            "reveal"
        })
        .arg("reports", reports)
        .arg("report_id", task.report_id.unwrap_or_default())
        .arg("orphan", first_id),
    )
    .await?;
    n.explain();
    n.quiz();
    Ok(())
}
