//! `lease-stale`: a stale worker tries to complete a task someone else now holds.
//!
//! Worker A claims task 42; its lease expires (simulated); worker B claims it again
//! (attempts = 2). Then stale worker A tries to complete with attempts = 1: refused with and
//! without the strict lease check, because attempts no longer matches. Worker B completes. The
//! attempts counter works as a fencing token.
//!
//! The other side runs the design the lesson warns about: the same story with a completion that
//! checks the lease and the status but not `attempts`. Worker A's strict completion is accepted,
//! because the lease it checks is worker B's fresh one, and worker B's own completion is then
//! refused: the task ends with the stale result.
//!
//! Facts: `stale_strict_completed` = false, `stale_nonstrict_completed` = false,
//! `fresh_completed` = true, `task_attempts` = 2, `task_report_is_fresh` = true;
//! without fencing: `unfenced_stale_completed` = true, `unfenced_fresh_completed` = false,
//! `unfenced_task_report_is_stale` = true.

use lab_core::Msg;

use super::{TASK_ID, claim, complete, reset_tables, seed_and_claim_a, show_task};
use crate::{Ctx, FaultUse, Requires, Scenario, ScenarioError, ScenarioResult};

pub const SCENARIO: Scenario = Scenario {
    order: 6,
    requires: Requires {
        postgres: true,
        redis: false,
        services: &[],
        faults: FaultUse::None,
    },
    knobs: &[],
    run: |ctx| Box::pin(run(ctx)),
};

/// The workers' results (fixed numbers: this scenario is about our table, not about the call).
const RESULT_A: i64 = 1001;
const RESULT_B: i64 = 2002;

async fn run(ctx: &Ctx) -> ScenarioResult {
    let n = &ctx.narrator;
    n.side("side.fenced");
    let attempts_a = seed_and_claim_a(ctx).await?;

    super::tasks::expire_lease(ctx.pg()?, TASK_ID).await?;
    n.step(Msg::new("step.expire").arg("lease", super::tasks::LEASE.as_secs()))
        .await?;
    show_task(ctx).await?;

    let attempts_b = claim(ctx).await?;
    n.step(
        Msg::new("step.claim_b")
            .arg("attempts", attempts_b)
            .arg("report_id", RESULT_B),
    )
    .await?;
    show_task(ctx).await?;

    n.predict("predict").await?;
    n.step(
        Msg::new("step.stale")
            .arg("report_id", RESULT_A)
            .arg("attempts", attempts_a),
    )
    .await?;
    let stale_strict = complete(ctx, "a", attempts_a, RESULT_A, true).await?;
    let stale_nonstrict = complete(ctx, "a", attempts_a, RESULT_A, false).await?;
    n.step("step.fresh").await?;
    let fresh = complete(ctx, "b", attempts_b, RESULT_B, true).await?;

    let task = super::tasks::task(ctx.pg()?, TASK_ID).await?;
    n.fact("stale_strict_completed", stale_strict);
    n.fact("stale_nonstrict_completed", stale_nonstrict);
    n.fact("fresh_completed", fresh);
    n.fact("task_attempts", task.attempts);
    n.fact("task_report_is_fresh", task.report_id == Some(RESULT_B));
    n.reveal(
        Msg::new("reveal")
            .arg("attempts", task.attempts)
            .arg("report_id", task.report_id.unwrap_or_default()),
    )
    .await?;

    without_fencing(ctx).await?;
    n.explain();
    n.quiz();
    Ok(())
}

/// The same story with a completion that does not check `attempts`
/// (`tasks::complete_task_without_fencing`): the lease check alone lets stale worker A in.
async fn without_fencing(ctx: &Ctx) -> ScenarioResult {
    let n = &ctx.narrator;
    n.side("side.unfenced");
    reset_tables(ctx).await?;
    super::tasks::create_task(ctx.pg()?, TASK_ID).await?;
    let attempts_a = claim(ctx).await?;
    super::tasks::expire_lease(ctx.pg()?, TASK_ID).await?;
    let attempts_b = claim(ctx).await?;
    n.step(
        Msg::new("step.unfenced_again")
            .arg("attempts_a", attempts_a)
            .arg("attempts_b", attempts_b),
    )
    .await?;
    show_task(ctx).await?;

    n.predict("predict_unfenced").await?;
    n.step(Msg::new("step.unfenced_stale").arg("report_id", RESULT_A))
        .await?;
    let stale = complete_unfenced(ctx, "a", RESULT_A).await?;
    n.step(Msg::new("step.unfenced_fresh").arg("report_id", RESULT_B))
        .await?;
    let fresh = complete_unfenced(ctx, "b", RESULT_B).await?;

    let task = super::tasks::task(ctx.pg()?, TASK_ID).await?;
    n.fact("unfenced_stale_completed", stale);
    n.fact("unfenced_fresh_completed", fresh);
    n.fact(
        "unfenced_task_report_is_stale",
        task.report_id == Some(RESULT_A),
    );
    n.reveal(
        Msg::new("reveal_unfenced")
            .arg("attempts", task.attempts)
            .arg("report_id", task.report_id.unwrap_or_default()),
    )
    .await?;
    Ok(())
}

/// A strict completion without the attempts check, narrated like `complete`.
async fn complete_unfenced(ctx: &Ctx, who: &str, report_id: i64) -> Result<bool, ScenarioError> {
    let accepted =
        super::tasks::complete_task_without_fencing(ctx.pg()?, TASK_ID, report_id, true).await?;
    ctx.narrator.note(
        Msg::new(if accepted {
            "note.unfenced_accepted"
        } else {
            "note.unfenced_refused"
        })
        .arg("who", Msg::new(format!("worker.{who}")))
        .arg("task", TASK_ID)
        .arg("report_id", report_id),
    );
    show_task(ctx).await?;
    Ok(accepted)
}
