//! `hello`: what it shows. Facts: `task_attempts` = 1.
use super::{TASK_ID, seed_and_claim_a, tasks};
use crate::{Ctx, FaultUse, Requires, Scenario, ScenarioResult};

pub const SCENARIO: Scenario = Scenario {
    order: 10,
    requires: Requires {
        postgres: true,
        redis: false,
        services: &[],
        faults: FaultUse::None,
    },
    knobs: &[],
    run: |ctx| Box::pin(run(ctx)),
};

async fn run(ctx: &Ctx) -> ScenarioResult {
    seed_and_claim_a(ctx).await?;
    ctx.narrator.predict("predict").await?;
    let task = tasks::task(ctx.pg()?, TASK_ID).await?;
    ctx.narrator.fact("task_attempts", task.attempts);
    ctx.narrator.reveal("reveal").await?;
    ctx.narrator.explain();
    ctx.narrator.quiz();
    Ok(())
}
