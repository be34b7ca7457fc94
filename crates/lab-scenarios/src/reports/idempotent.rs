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
//!
//! Last, the guarantee's boundary: the service keeps a key only for a while. Its retention job
//! forgets the key (simulated: the key is cleared from the report's row, as a cleanup would),
//! and a retry that comes later than that creates a second report with the same stable key.
//! Fact: `forgotten_key_reports_total` = 2.
//!
//! And a side effect outside the service's transaction: a "report ready" notification written
//! before the key is checked is written again by the retry (one report, two notifications);
//! written in the report's own transaction (an outbox), there is one. Facts:
//! `outside_tx_reports_total` = 1, `outside_tx_notifications` = 2, `outbox_notifications` = 1.

use lab_core::Msg;

use lab_services::reports::{self, Notify, ReportChange};
use lab_services::stage::ServiceHandle;

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
        complete(ctx, "b", attempts_b, created.report_id, true).await?;
    }
    show_reports(ctx).await?;
    let per_attempt_reports = count_reports(ctx).await?;
    n.fact("per_attempt_key_reports_total", per_attempt_reports);
    n.reveal(Msg::new("reveal_attempt").arg("reports", per_attempt_reports))
        .await?;

    forgotten_key(ctx, api, &client).await?;
    side_effect_outside(ctx, api, &client).await?;
    n.explain();
    n.quiz();
    Ok(())
}

/// The stable key once the service has forgotten it: a late retry is a new operation again.
async fn forgotten_key(ctx: &Ctx, api: &ServiceHandle, client: &Caller) -> ScenarioResult {
    let n = &ctx.narrator;
    n.side("side.forgotten");
    reset_tables(ctx).await?;
    super::tasks::create_task(ctx.pg()?, TASK_ID).await?;
    claim(ctx).await?;
    n.step(Msg::new("step.forgotten_first").arg("key", STABLE_KEY))
        .await?;
    post_report(ctx, client, api, "a", Some(STABLE_KEY), REPORT_TYPE).await;
    forget_key(ctx, STABLE_KEY).await?;
    n.step(Msg::new("step.key_forgotten").arg("key", STABLE_KEY))
        .await?;
    show_reports(ctx).await?;
    n.step(Msg::new("step.late_retry").arg("key", STABLE_KEY))
        .await?;
    post_report(ctx, client, api, "b", Some(STABLE_KEY), REPORT_TYPE).await;
    show_reports(ctx).await?;
    let reports = count_reports(ctx).await?;
    n.fact("forgotten_key_reports_total", reports);
    n.note(Msg::new("note.forgotten").arg("reports", reports));
    Ok(())
}

/// Simulated time: the report service's retention job clears an old key from its report's row
/// (the report stays; the promise "one report per key" ends with the key).
async fn forget_key(ctx: &Ctx, key: &str) -> ScenarioResult {
    sqlx::query("UPDATE reports SET idempotency_key = NULL WHERE idempotency_key = $1")
        .bind(key)
        .execute(ctx.pg()?)
        .await?;
    Ok(())
}

/// The same retry with a side effect: the service's "report ready" notification, written
/// outside its transaction (before the key is checked), then in it (an outbox).
async fn side_effect_outside(ctx: &Ctx, api: &ServiceHandle, client: &Caller) -> ScenarioResult {
    let n = &ctx.narrator;
    n.side("side.outside_tx");
    for notify in [Notify::Outside, Notify::Outbox] {
        reset_tables(ctx).await?;
        let change = ReportChange {
            notify: Some(notify),
            ..ReportChange::default()
        };
        ctx.configure(&reports::SPEC, &change).await?;
        let outside = notify == Notify::Outside;
        n.step(
            Msg::new(if outside {
                "step.notify_outside"
            } else {
                "step.notify_outbox"
            })
            .arg("key", STABLE_KEY),
        )
        .await?;
        post_report(ctx, client, api, "a", Some(STABLE_KEY), REPORT_TYPE).await;
        if outside {
            n.predict("predict_notify").await?;
        }
        n.step(Msg::new("step.notify_retry").arg("key", STABLE_KEY))
            .await?;
        post_report(ctx, client, api, "b", Some(STABLE_KEY), REPORT_TYPE).await;
        show_reports(ctx).await?;
        let notifications = show_notifications(ctx, notify).await?;
        if outside {
            n.fact("outside_tx_reports_total", count_reports(ctx).await?);
            n.fact("outside_tx_notifications", notifications);
            n.reveal(Msg::new("reveal_notify").arg("notifications", notifications))
                .await?;
        } else {
            n.fact("outbox_notifications", notifications);
            n.note(Msg::new("note.outbox").arg("notifications", notifications));
        }
    }
    let off = ReportChange {
        notify: Some(Notify::Off),
        ..ReportChange::default()
    };
    ctx.configure(&reports::SPEC, &off).await?;
    Ok(())
}

/// Shows the service's notifications table, titled by where they were written (the two designs'
/// tables are not one table changing); returns how many rows it has.
#[tracing::instrument(name = "lab.backstage", skip_all)]
async fn show_notifications(ctx: &Ctx, written: Notify) -> Result<usize, ScenarioError> {
    let rows: Vec<(i64, i64, Option<i64>)> =
        sqlx::query_as("SELECT id, task_id, report_id FROM report_notifications ORDER BY id")
            .fetch_all(ctx.pg()?)
            .await?;
    ctx.narrator.state(lab_core::Table {
        title: Msg::new(if written == Notify::Outbox {
            "table.notifications_outbox"
        } else {
            "table.notifications_outside"
        }),
        columns: ["id", "task_id", "report_id"].map(String::from).to_vec(),
        rows: rows
            .iter()
            .map(|(id, task, report)| {
                vec![
                    id.to_string(),
                    task.to_string(),
                    report.map_or_else(|| "NULL".to_string(), |r| r.to_string()),
                ]
            })
            .collect(),
    });
    Ok(rows.len())
}
