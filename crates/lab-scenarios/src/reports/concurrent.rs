//! `concurrent`: two POSTs with one key at the same moment.
//!
//! Two clients, on two connections, send `POST /reports` with `Idempotency-Key: report-task-42`.
//! A checkpoint inside the service's transaction, just before the INSERT, holds each request
//! until both have arrived, so they really overlap. Then they are let through in a fixed order:
//! the first INSERTs and, before it commits, waits until PostgreSQL shows the second INSERT
//! blocked on its uncommitted row. So PostgreSQL's UNIQUE constraint, not luck, decides, and it
//! decides the same way every run: one INSERT returns the new id (201), the other waits for the
//! first to commit, inserts nothing and replays the same report (200). (The order also keeps the
//! report id stable: the losing INSERT still draws a number from the id sequence, and without
//! an order which request drew first would vary.) Then the same key with another `report_type`:
//! 409.
//! The naive design (SELECT, then INSERT, no UNIQUE), under the same forced overlap after its
//! SELECT, creates two reports.
//!
//! Facts: `statuses` = [200, 201], `same_report_id` = true, `reports_total` = 1,
//! `mismatch_status` = 409, `naive_reports_total` = 2, and `second_insert_waited` = true (the
//! second INSERT was seen blocked on the first's uncommitted row).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lab_core::Msg;
use lab_services::reports::{self, AFTER_INSERT, BEFORE_INSERT, NAIVE_AFTER_CHECK};
use sqlx::PgPool;
use tokio::sync::{Barrier, Notify};

use super::{
    REPORT_TYPE, STABLE_KEY, count_reports, created, post_report, report_service, request_msg,
    send_post, show_naive_reports, show_reports,
};
use crate::kit::{Answer, Caller};
use crate::{Ctx, FaultUse, Requires, Scenario, ScenarioError, ScenarioResult};
use lab_services::stage::ServiceHandle;

pub const SCENARIO: Scenario = Scenario {
    order: 4,
    requires: Requires {
        postgres: true,
        redis: false,
        services: &[&reports::SPEC],
        faults: FaultUse::None,
    },
    knobs: &[],
    run: |ctx| Box::pin(run(ctx)),
};

/// How long the first transaction waits to see the second INSERT blocked behind it before it
/// gives up and commits anyway (then the run's facts will show that the overlap was lost).
const LOCK_WAIT_LIMIT: Duration = Duration::from_secs(10);

/// Waits until one of this run's PostgreSQL sessions is blocked by another (a lock wait), by
/// watching pg_stat_activity. The run's sessions carry the run's schema as application_name, so
/// other runs on the same server are not counted. Returns whether it was seen.
#[tracing::instrument(name = "lab.backstage", skip_all)]
async fn await_lock_wait(pg: &PgPool, application_name: &str) -> bool {
    let deadline = Instant::now() + LOCK_WAIT_LIMIT;
    while Instant::now() < deadline {
        let blocked: Result<i64, _> = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
              WHERE application_name = $1 AND cardinality(pg_blocking_pids(pid)) > 0",
        )
        .bind(application_name)
        .fetch_one(pg)
        .await;
        if matches!(blocked, Ok(n) if n > 0) {
            return true;
        }
        // Polling PostgreSQL's own view of the lock, not guessing how long it takes.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    false
}

/// The choreography of the UNIQUE race: both requests meet before the INSERT; the first goes on
/// and inserts; the second INSERTs only after that, and the first commits only once PostgreSQL
/// shows the second waiting for it. Returns a flag set when that wait was seen.
fn choreograph_unique_race(ctx: &Ctx) -> Result<Arc<AtomicBool>, ScenarioError> {
    let both_inside = Arc::new(Barrier::new(2));
    let arrivals = Arc::new(AtomicUsize::new(0));
    let first_inserted = Arc::new(Notify::new());
    ctx.checkpoints.install(
        BEFORE_INSERT,
        Arc::new({
            let (both_inside, first_inserted) = (both_inside.clone(), first_inserted.clone());
            move || {
                let (both_inside, arrivals, first_inserted) = (
                    both_inside.clone(),
                    arrivals.clone(),
                    first_inserted.clone(),
                );
                Box::pin(async move {
                    both_inside.wait().await;
                    if arrivals.fetch_add(1, Ordering::SeqCst) == 1 {
                        // The second request INSERTs only after the first has.
                        first_inserted.notified().await;
                    }
                })
            }
        }),
    );
    let waited = Arc::new(AtomicBool::new(false));
    let pg = ctx.pg()?.clone();
    let application_name = ctx.space.schema.clone();
    ctx.checkpoints.install(
        AFTER_INSERT,
        Arc::new({
            let waited = waited.clone();
            move || {
                let (first_inserted, waited, pg, application_name) = (
                    first_inserted.clone(),
                    waited.clone(),
                    pg.clone(),
                    application_name.clone(),
                );
                Box::pin(async move {
                    first_inserted.notify_one();
                    // Hold the commit until the second INSERT is blocked on our row.
                    let seen = await_lock_wait(&pg, &application_name).await;
                    waited.store(seen, Ordering::SeqCst);
                })
            }
        }),
    );
    Ok(waited)
}

/// Sends the same POST from two clients at once (the checkpoints installed by the caller force
/// the overlap inside the service), and narrates the two answers, the winner's (201) first:
/// which client wins varies from run to run, what the two answers are does not.
async fn race(ctx: &Ctx, api: &ServiceHandle, path: &str) -> Vec<Answer> {
    // Two clients, no connection reuse: two connections, two handler invocations.
    let (one, two) = (Caller::new(), Caller::new());
    for who in ["one", "two"] {
        ctx.narrator.call(
            &format!("worker.{who}"),
            reports::NAME,
            request_msg(who, path, Some(STABLE_KEY), REPORT_TYPE),
        );
    }
    let (a, b) = tokio::join!(
        send_post(&one, api, path, Some(STABLE_KEY), REPORT_TYPE),
        send_post(&two, api, path, Some(STABLE_KEY), REPORT_TYPE),
    );
    let mut results = vec![a, b];
    // The insert that won first, then by status and body: two 201s of the naive endpoint are
    // listed by report id.
    results.sort_by_key(|r| (r.status != Some(201), r.status, r.body.clone()));
    for result in &results {
        ctx.narrator.response(result.view());
    }
    results
}

fn report_id(answer: &Answer) -> Option<i64> {
    created(answer).map(|c| c.report_id)
}

async fn run(ctx: &Ctx) -> ScenarioResult {
    let n = &ctx.narrator;
    let api = report_service(ctx)?;
    // The race's interleaving is not determined: the service stays silent.
    api.voice().mute(true);

    n.side("side.unique");
    n.step(Msg::new("step.overlap").arg("key", STABLE_KEY))
        .await?;
    n.predict("predict").await?;
    n.step("step.send").await?;
    let waited = choreograph_unique_race(ctx)?;
    let results = race(ctx, api, "/reports").await;
    ctx.checkpoints.clear(BEFORE_INSERT);
    ctx.checkpoints.clear(AFTER_INSERT);
    let second_insert_waited = waited.load(Ordering::SeqCst);
    n.note(if second_insert_waited {
        "note.waited"
    } else {
        "note.not_waited"
    });
    n.note("note.order");
    show_reports(ctx).await?;

    let statuses: Vec<u16> = results.iter().filter_map(|r| r.status).collect();
    let ids: Vec<Option<i64>> = results.iter().map(report_id).collect();
    let reports = count_reports(ctx).await?;
    n.fact("statuses", statuses.clone());
    n.fact(
        "same_report_id",
        ids.len() == 2 && ids[0].is_some() && ids[0] == ids[1],
    );
    n.fact("reports_total", reports);
    n.fact("second_insert_waited", second_insert_waited);
    let status = |i: usize| statuses.get(i).copied().unwrap_or_default();
    n.reveal(
        Msg::new("reveal")
            .arg("first", status(0))
            .arg("second", status(1))
            .arg("reports", reports),
    )
    .await?;

    // One request, no race: the service tells what it does again.
    api.voice().mute(false);
    n.step(Msg::new("step.mismatch").arg("key", STABLE_KEY))
        .await?;
    let mismatch = post_report(ctx, &Caller::new(), api, "one", Some(STABLE_KEY), "weekly").await;
    n.fact("mismatch_status", mismatch.status_or_zero());
    show_reports(ctx).await?;
    api.voice().mute(true);

    n.side("side.naive");
    n.step("step.naive").await?;
    n.predict("predict_naive").await?;
    n.step("step.naive_send").await?;
    ctx.checkpoints.barrier(NAIVE_AFTER_CHECK, 2);
    race(ctx, api, "/naive/reports").await;
    ctx.checkpoints.clear(NAIVE_AFTER_CHECK);
    let naive = show_naive_reports(ctx).await?;
    n.fact("naive_reports_total", naive.len());
    n.reveal(Msg::new("reveal_naive").arg("reports", naive.len()))
        .await?;

    n.explain();
    n.quiz();
    Ok(())
}
