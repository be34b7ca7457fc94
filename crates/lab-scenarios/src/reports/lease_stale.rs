//! `lease-stale`: a stale worker tries to complete a task someone else now holds.
//!
//! Worker A claims task 42; its lease expires (simulated); worker B claims it again
//! (attempts = 2). Then stale worker A tries to complete with attempts = 1: refused with and
//! without the strict lease check, because attempts no longer matches. Worker B completes. The
//! attempts counter works as a fencing token.
//!
//! Facts: `stale_strict_completed` = false, `stale_nonstrict_completed` = false,
//! `fresh_completed` = true, `task_attempts` = 2, `task_report_is_fresh` = true.

use lab_core::Msg;

use super::{TASK_ID, claim, complete, seed_and_claim_a, show_task};
use crate::{Ctx, FaultUse, Requires, Scenario, ScenarioResult};

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
    n.explain();
    n.quiz();
    Ok(())
}
