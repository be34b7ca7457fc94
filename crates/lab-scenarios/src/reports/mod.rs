//! Lesson A: a background task and an external report API, on PostgreSQL.
//!
//! Our side is the `tasks` table (the top-level `schema.sql`) with `claim_task` / `complete_task`
//! ([`tasks`]); the other side is the report service (`lab_services::reports`), a real HTTP server
//! on 127.0.0.1 with its own `reports` table. The helpers here are what every scenario of the
//! lesson does: have a worker POST to the service, and show the rows.
//!
//! Each scenario module here has a folder of the same name under `scenarios/` (its texts and
//! expectations); `build.rs` lists the declared ones in the catalogue.

pub mod tasks;

// The scenarios of this lesson, one module each (its folder under `scenarios/` has the same
// name, with `-` for `_`).
pub mod concurrent;
pub mod duplicate;
pub mod idempotent;
pub mod lease;
pub mod lease_stale;
pub mod timeout;

// The module "Adding a scenario" (docs/architecture.md) tells a newcomer to write, word for
// word: compiled and run by this crate's tests, so the documentation cannot drift from what
// works. It has no folder under `scenarios/`, so it is no scenario of the catalogue.
#[cfg(test)]
mod hello_example;

use lab_core::narrator::reread;
use lab_core::{Msg, Table};
use lab_services::reports::{self, ReportCreated};
use lab_services::stage::ServiceHandle;

use crate::kit::{Answer, Caller};
use crate::scenario::Lesson;
use crate::{Ctx, ScenarioError};

/// The lesson: the background-task side lives in our own `tasks` table.
pub const LESSON: Lesson = Lesson {
    id: "A",
    order: 1,
    // The top-level schema.sql, which the report service's spec runs too (a run runs it once).
    schema: reports::SCHEMA_SQL,
};

/// The lesson's task.
pub const TASK_ID: i64 = 42;
/// The lesson's report type.
pub const REPORT_TYPE: &str = "monthly";
/// The stable key: one per logical operation, whatever the attempt.
pub const STABLE_KEY: &str = "report-task-42";

/// The report service of a run, as its workers reach it.
pub fn report_service(ctx: &Ctx) -> Result<&ServiceHandle, ScenarioError> {
    ctx.service(&reports::SPEC)
}

/// The body every call of the lesson sends.
pub fn report_body(report_type: &str) -> serde_json::Value {
    serde_json::json!({"task_id": TASK_ID, "report_type": report_type})
}

/// How a call to `path` is told: who calls, with which body and key.
pub fn request_msg(who: &str, path: &str, key: Option<&str>, report_type: &str) -> Msg {
    match key {
        Some(key) => Msg::new("call.post_key").arg("key", key),
        None => Msg::new("call.post_no_key"),
    }
    .arg("who", Msg::new(format!("worker.{who}")))
    .arg("path", path)
    .arg("body", report_body(report_type).to_string())
}

/// Sends `POST path` to the report service (through its hop, when it has one) and judges the
/// answer, without narrating.
pub async fn send_post(
    caller: &Caller,
    api: &ServiceHandle,
    path: &str,
    key: Option<&str>,
    report_type: &str,
) -> Answer {
    caller
        .post(
            &format!("{}{path}", api.url),
            key,
            &report_body(report_type),
        )
        .await
}

/// The report in an answer, if it is one.
pub fn created(answer: &Answer) -> Option<ReportCreated> {
    answer.json()
}

/// A worker's `POST /reports` for task 42, narrated: the request, what happens inside the
/// service, and what the worker saw.
pub async fn post_report(
    ctx: &Ctx,
    caller: &Caller,
    api: &ServiceHandle,
    who: &str,
    key: Option<&str>,
    report_type: &str,
) -> Answer {
    ctx.narrator.call(
        &format!("worker.{who}"),
        reports::NAME,
        request_msg(who, "/reports", key, report_type),
    );
    let answer = send_post(caller, api, "/reports", key, report_type).await;
    ctx.narrator.response(answer.view());
    answer
}

/// The opening every scenario of the lesson shares: task 42 is created, worker A claims it.
/// Returns worker A's attempts.
pub async fn seed_and_claim_a(ctx: &Ctx) -> Result<i32, ScenarioError> {
    let n = &ctx.narrator;
    tasks::create_task(ctx.pg()?, TASK_ID).await?;
    n.step(Msg::new("step.seed").arg("task", TASK_ID)).await?;
    show_task(ctx).await?;
    let attempts = claim(ctx).await?;
    n.step(
        Msg::new("step.claim_a")
            .arg("task", TASK_ID)
            .arg("attempts", attempts),
    )
    .await?;
    show_task(ctx).await?;
    Ok(attempts)
}

/// Claims the task for a worker, or fails the scenario if the claim found nothing to claim.
pub async fn claim(ctx: &Ctx) -> Result<i32, ScenarioError> {
    tasks::claim_task(ctx.pg()?, TASK_ID, tasks::LEASE)
        .await?
        .ok_or_else(|| ScenarioError::Broken(format!("task {TASK_ID} could not be claimed")))
}

/// Shows task 42 as it is in the database now. In step mode, `s` reads it again.
#[tracing::instrument(name = "lab.backstage", skip_all)]
pub async fn show_task(ctx: &Ctx) -> Result<tasks::TaskRow, ScenarioError> {
    let pool = ctx.pg()?.clone();
    let row = tasks::task(&pool, TASK_ID).await?;
    let again = reread(move || {
        let pool = pool.clone();
        async move { Some(task_table(&tasks::task(&pool, TASK_ID).await.ok()?)) }
    });
    ctx.narrator.state_view(task_table(&row), again);
    Ok(row)
}

/// Shows the report service's table as it is now; returns the rows. In step mode, `s` reads
/// it again.
#[tracing::instrument(name = "lab.backstage", skip_all)]
pub async fn show_reports(ctx: &Ctx) -> Result<Vec<reports::ReportRow>, ScenarioError> {
    let pool = ctx.pg()?.clone();
    let rows = reports::all_reports(&pool).await?;
    let again = reread(move || {
        let pool = pool.clone();
        async move {
            let rows = reports::all_reports(&pool).await.ok()?;
            Some(reports_table("table.reports", &rows))
        }
    });
    ctx.narrator
        .state_view(reports_table("table.reports", &rows), again);
    Ok(rows)
}

/// The naive endpoint's table (no UNIQUE constraint).
async fn naive_reports(pool: &sqlx::PgPool) -> Result<Vec<reports::ReportRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, task_id, report_type, idempotency_key, payload_hash FROM naive_reports ORDER BY id",
    )
    .fetch_all(pool)
    .await
}

/// Shows the naive endpoint's table as it is now. In step mode, `s` reads it again.
#[tracing::instrument(name = "lab.backstage", skip_all)]
pub async fn show_naive_reports(ctx: &Ctx) -> Result<Vec<reports::ReportRow>, ScenarioError> {
    let pool = ctx.pg()?.clone();
    let rows = naive_reports(&pool).await?;
    let again = reread(move || {
        let pool = pool.clone();
        async move {
            let rows = naive_reports(&pool).await.ok()?;
            Some(reports_table("table.naive_reports", &rows))
        }
    });
    ctx.narrator
        .state_view(reports_table("table.naive_reports", &rows), again);
    Ok(rows)
}

fn reports_table(title: &str, rows: &[reports::ReportRow]) -> Table {
    Table {
        title: Msg::new(title),
        columns: [
            "id",
            "task_id",
            "report_type",
            "idempotency_key",
            "payload_hash",
        ]
        .map(String::from)
        .to_vec(),
        rows: rows
            .iter()
            .map(|r| {
                vec![
                    r.id.to_string(),
                    r.task_id.to_string(),
                    r.report_type.clone(),
                    r.idempotency_key.clone().unwrap_or_else(|| "NULL".into()),
                    // The first bytes are enough to see whether two payloads match.
                    format!("{}…", &r.payload_hash[..8]),
                ]
            })
            .collect(),
    }
}

/// The number of reports in the report service's table, read now.
#[tracing::instrument(name = "lab.backstage", skip_all)]
pub async fn count_reports(ctx: &Ctx) -> Result<i64, ScenarioError> {
    Ok(sqlx::query_scalar("SELECT count(*) FROM reports")
        .fetch_one(ctx.pg()?)
        .await?)
}

/// Empties the run's own tables between the two sides of a scenario, so each side starts from
/// the same state and numbers its reports from 1. Only this run's schema is named.
#[tracing::instrument(name = "lab.backstage", skip_all)]
pub async fn reset_tables(ctx: &Ctx) -> Result<(), ScenarioError> {
    let schema = &ctx.space.schema;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "TRUNCATE {schema}.tasks, {schema}.reports, {schema}.naive_reports, \
         {schema}.report_notifications RESTART IDENTITY"
    )))
    .execute(ctx.pg()?)
    .await?;
    Ok(())
}

/// The crash-and-retry story both `duplicate` and `idempotent` tell, up to worker B's claim:
/// task 42 is created, worker A claims it and POSTs with `key_a` (the step told as `post_a`),
/// crashes before completing, the lease expires (simulated), and worker B claims it again.
/// Returns worker A's result and worker B's attempts.
pub async fn crash_after_post(
    ctx: &Ctx,
    api: &ServiceHandle,
    key_a: Option<&str>,
    post_a: Msg,
) -> Result<(Answer, i32), ScenarioError> {
    let n = &ctx.narrator;
    let _attempts_a = seed_and_claim_a(ctx).await?;

    n.step(post_a).await?;
    let first = post_report(ctx, &Caller::new(), api, "a", key_a, REPORT_TYPE).await;
    let reports = count_reports(ctx).await?;
    let task = show_task(ctx).await?;
    show_reports(ctx).await?;
    n.note(
        Msg::new("note.after_a")
            .arg("reports", reports)
            .arg("status", task.status)
            .arg(
                "report_id",
                task.report_id.map_or("NULL".to_string(), |r| r.to_string()),
            ),
    );

    n.step("step.crash").await?;
    tasks::expire_lease(ctx.pg()?, TASK_ID).await?;
    n.step(Msg::new("step.expire").arg("lease", tasks::LEASE.as_secs()))
        .await?;
    show_task(ctx).await?;

    let attempts_b = claim(ctx).await?;
    n.step(Msg::new("step.claim_b").arg("attempts", attempts_b))
        .await?;
    show_task(ctx).await?;
    Ok((first, attempts_b))
}

/// Calls `complete_task` for a worker and tells what it returned, with the row after it.
pub async fn complete(
    ctx: &Ctx,
    who: &str,
    attempts: i32,
    report_id: i64,
    strict_lease: bool,
) -> Result<bool, ScenarioError> {
    let accepted =
        tasks::complete_task(ctx.pg()?, TASK_ID, attempts, report_id, strict_lease).await?;
    ctx.narrator.note(
        Msg::new(if accepted {
            "note.complete_accepted"
        } else {
            "note.complete_refused"
        })
        .arg("who", Msg::new(format!("worker.{who}")))
        .arg("task", TASK_ID)
        .arg("attempts", attempts)
        .arg("report_id", report_id)
        .arg("strict", strict_lease.to_string()),
    );
    show_task(ctx).await?;
    Ok(accepted)
}

fn cell<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "NULL".to_string(), |v| v.to_string())
}

/// A snapshot of one task as a table for the narrative.
pub fn task_table(row: &tasks::TaskRow) -> Table {
    Table {
        title: Msg::new("table.tasks"),
        columns: ["id", "status", "attempts", "lease_until", "report_id"]
            .map(String::from)
            .to_vec(),
        rows: vec![vec![
            row.id.to_string(),
            row.status.clone(),
            row.attempts.to_string(),
            cell(row.lease.clone()),
            cell(row.report_id),
        ]],
    }
}

#[cfg(test)]
mod tests {
    use lab_infra::{Needs, ServerOptions, Servers};

    use crate::catalogue::Entry;

    /// The documentation's module is the one in `hello_example.rs`, line for line.
    #[test]
    fn the_documented_module_is_the_one_compiled_here() {
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/architecture.md"),
        )
        .expect("docs/architecture.md");
        let section = doc
            .split("## Adding a scenario")
            .nth(1)
            .expect("the section exists");
        let block = section
            .split("```rust\n")
            .nth(1)
            .and_then(|rest| rest.split("   ```").next())
            .expect("the section has a Rust block");
        let documented: Vec<&str> = block
            .lines()
            .map(|line| line.strip_prefix("   ").unwrap_or(line))
            .collect();
        let compiled: Vec<&str> = include_str!("hello_example.rs").lines().collect();
        assert_eq!(documented, compiled);
    }

    /// It runs, and measures its fact from real state: what step 2 of the documentation says
    /// `cargo run -- run hello` shows.
    #[tokio::test(flavor = "multi_thread")]
    async fn the_documented_module_runs_and_measures_its_fact() {
        let servers = Servers::start(&ServerOptions::default(), Needs::POSTGRES)
            .await
            .expect("a throwaway PostgreSQL");
        let entry = Entry {
            name: "hello",
            source: "crates/lab-scenarios/src/reports/hello.rs",
            lesson: &super::LESSON,
            scenario: &super::hello_example::SCENARIO,
        };
        let library = crate::Library::load().expect("the scenario files");
        let narrator = lab_core::Narrator::recording();
        let report = crate::run(entry, &servers, narrator, &library, &Default::default()).await;
        servers.shutdown().await;
        let report = report.expect("the documented module runs");
        assert_eq!(
            report.facts.get("task_attempts"),
            Some(&serde_json::json!(1))
        );
        assert!(
            !report.passed,
            "nothing is expected of it before its first --bless"
        );
    }
}
