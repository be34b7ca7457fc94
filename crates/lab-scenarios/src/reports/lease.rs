//! `lease`: a lease that expired while nobody took the task over.
//!
//! Worker A claims task 42 and works too long: its lease expires (simulated). Nobody reclaims the
//! task. A strict completion (`lease_until > clock_timestamp()` required) is refused and changes
//! nothing; a non-strict one is accepted, because attempts is still 1: the row still belongs to
//! worker A's attempt.
//!
//! Facts: `strict_completed` = false, `nonstrict_completed` = true, `task_attempts` = 1,
//! `task_status` = "completed".

use lab_core::Msg;

use super::{TASK_ID, complete, seed_and_claim_a, show_task};
use crate::{Ctx, FaultUse, Requires, Scenario, ScenarioFuture, ScenarioResult};

pub const SCENARIO: Scenario = Scenario {
    order: 5,
    requires: Requires {
        postgres: true,
        redis: false,
        services: &[],
        faults: FaultUse::None,
    },
    knobs: &[],
    run: |ctx: &Ctx| -> ScenarioFuture<'_> { Box::pin(run(ctx)) },
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
            .arg("lease", super::tasks::LEASE.as_secs() as i64),
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
    n.explain();
    n.quiz();
    Ok(())
}
