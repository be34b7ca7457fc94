//! `lease`: a lease that expired while nobody took the task over.
//!
//! Worker A claims task 42 and works too long: its lease expires (simulated). Nobody reclaims the
//! task. A strict completion (`lease_until > clock_timestamp()` required) is refused and changes
//! nothing; a non-strict one is accepted, because attempts is still 1: the row still belongs to
//! worker A's attempt.
//!
//! Then what a strict refusal leads to when the lease is the only rule: the task is free again,
//! worker B reclaims it (attempts = 2) and makes the external call again. With the stable key the
//! report service answers with the report it has: one report.
//!
//! Facts: `strict_completed` = false, `nonstrict_completed` = true, `task_attempts` = 1,
//! `task_status` = "completed", `reclaimed_attempts` = 2, `reclaim_call_replayed` = true,
//! `reports_after_reclaim` = 1.

use lab_core::Msg;

use lab_services::reports;

use super::{
    REPORT_TYPE, STABLE_KEY, TASK_ID, claim, complete, count_reports, created, post_report,
    report_service, reset_tables, seed_and_claim_a, show_reports, show_task,
};
use crate::kit::Caller;
use crate::{Ctx, FaultUse, Requires, Scenario, ScenarioError, ScenarioResult};

pub const SCENARIO: Scenario = Scenario {
    order: 5,
    requires: Requires {
        postgres: true,
        redis: false,
        services: &[&reports::SPEC],
        faults: FaultUse::None,
    },
    knobs: &[],
    run: |ctx| Box::pin(run(ctx)),
};

/// Worker A's result: the report id it got from the service (a fixed number: this scenario is
/// about our table, not about the call).
const RESULT_A: i64 = 1001;

async fn run(ctx: &Ctx) -> ScenarioResult {
    let n = &ctx.narrator;
    let attempts = seed_and_claim_a(ctx).await?;

    super::tasks::expire_lease(ctx.pg()?, TASK_ID).await?;
    n.step(
        Msg::new("step.slow")
            .arg("report_id", RESULT_A)
            .arg("lease", super::tasks::LEASE.as_secs()),
    )
    .await?;
    show_task(ctx).await?;

    n.predict("predict").await?;
    n.step("step.strict").await?;
    let strict = complete(ctx, "a", attempts, RESULT_A, true).await?;
    n.step("step.nonstrict").await?;
    let nonstrict = complete(ctx, "a", attempts, RESULT_A, false).await?;

    let task = super::tasks::task(ctx.pg()?, TASK_ID).await?;
    n.fact("strict_completed", strict);
    n.fact("nonstrict_completed", nonstrict);
    n.fact("task_attempts", task.attempts);
    n.fact("task_status", task.status.clone());
    n.reveal(
        Msg::new("reveal")
            .arg("strict", strict.to_string())
            .arg("nonstrict", nonstrict.to_string())
            .arg("attempts", task.attempts),
    )
    .await?;

    strict_only(ctx).await?;
    n.explain();
    n.quiz();
    Ok(())
}

/// What a strict refusal leads to: the task is reclaimed, and the external call is made again.
/// Only a stable key keeps that second call from being a second report.
async fn strict_only(ctx: &Ctx) -> ScenarioResult {
    let n = &ctx.narrator;
    let api = report_service(ctx)?;
    let client = Caller::new();
    n.side("side.strict_only");
    reset_tables(ctx).await?;
    n.note("note.reset");
    let attempts_a = seed_and_claim_a(ctx).await?;
    n.step(Msg::new("step.a_calls").arg("key", STABLE_KEY))
        .await?;
    let first = post_report(ctx, &client, api, "a", Some(STABLE_KEY), REPORT_TYPE).await;
    let first_id = created(&first)
        .map(|c| c.report_id)
        .ok_or_else(|| ScenarioError::Broken("worker A's call created no report".into()))?;
    super::tasks::expire_lease(ctx.pg()?, TASK_ID).await?;
    n.step(Msg::new("step.a_too_late").arg("lease", super::tasks::LEASE.as_secs()))
        .await?;
    complete(ctx, "a", attempts_a, first_id, true).await?;

    n.predict("predict_reclaim").await?;
    let attempts_b = claim(ctx).await?;
    n.step(Msg::new("step.b_reclaims").arg("attempts", attempts_b))
        .await?;
    show_task(ctx).await?;
    n.step(Msg::new("step.b_calls").arg("key", STABLE_KEY))
        .await?;
    let again = post_report(ctx, &client, api, "b", Some(STABLE_KEY), REPORT_TYPE).await;
    let again_created = created(&again);
    let again_id = again_created.as_ref().map(|c| c.report_id);
    if let Some(report_id) = again_id {
        complete(ctx, "b", attempts_b, report_id, true).await?;
    }
    show_reports(ctx).await?;
    let reports = count_reports(ctx).await?;
    n.fact("reclaimed_attempts", attempts_b);
    n.fact(
        "reclaim_call_replayed",
        again_created.is_some_and(|c| c.replayed) && again_id == Some(first_id),
    );
    n.fact("reports_after_reclaim", reports);
    n.reveal(Msg::new("reveal_reclaim").arg("reports", reports))
        .await?;
    Ok(())
}
