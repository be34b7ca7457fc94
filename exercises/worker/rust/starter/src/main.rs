//! A background worker of lesson 6 (§1, §9, §10): processes one task, once, whatever crashes.
//!
//! As it is, it works as long as nothing goes wrong: a worker that dies after the report
//! service made the report leaves the task stuck, a retry would make a second report, and a
//! stale worker can overwrite the result of the one that took its task over. The three TODOs
//! are the lesson. What it must do:
//!
//! - `claim_task`: pending (or processing with an expired lease) becomes processing; attempts + 1.
//! - the call: `POST /reports` with the stable key `report-task-<id>`: a retry of the same task,
//!   by whichever worker, finds the report instead of making another.
//! - `complete_task`: accepted only from the attempt that holds the task now (attempts is the
//!   fencing token), and, strict, only while its lease runs.
//!
//! Each step is a transaction of its own: the claim commits before the HTTP call, so no
//! transaction stays open while the network decides how long the call takes.
//!
//! The lab runs it once per attempt: `TASK_ID=42 LEASE_SECONDS=30 REPORTS_URL=http://…
//! DATABASE_URL=postgresql://… STRICT=true cargo run`. Exit codes: 0 completed, 2 nothing to
//! claim, 3 completion refused.

use std::process::ExitCode;

use sqlx::PgPool;

type Error = Box<dyn std::error::Error>;

/// Reserves the task: the attempt number it now holds, or `None` if someone else holds it.
async fn claim_task(pool: &PgPool, task_id: i64, lease_seconds: f64) -> Result<Option<i32>, Error> {
    Ok(sqlx::query_scalar(
        "UPDATE tasks SET status = 'processing', attempts = attempts + 1,
                lease_until = clock_timestamp() + make_interval(secs => $2)
          WHERE id = $1 AND status = 'pending'
         RETURNING attempts",
        // TODO(1): a task whose worker died is taken over once its lease has run out, and
        // never while it runs. As written, only a pending task can be claimed, so a task left
        // processing by a dead worker stays stuck.
        // Attacked by: crash-after-commit, stale-completion.
    )
    .bind(task_id)
    .bind(lease_seconds)
    .fetch_optional(pool)
    .await?)
}

/// `POST /reports` with the stable key: one key per task, the same on every attempt.
async fn create_report(reports_url: &str, task_id: i64) -> Result<i64, Error> {
    let answer: serde_json::Value = reqwest::Client::new()
        .post(format!("{reports_url}/reports"))
        // TODO(2): every attempt at this task, by whichever worker, must end with the same one
        // report: a retry after a crash finds the report the first attempt made. As written,
        // the service cannot tell a retry from a new report. Attacked by: crash-after-commit.
        .json(&serde_json::json!({"task_id": task_id, "report_type": "monthly"}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    answer["report_id"]
        .as_i64()
        .ok_or_else(|| "no report_id in the answer".into())
}

/// Records the result, only for the attempt that holds the task (and, strict, in time).
async fn complete_task(
    pool: &PgPool,
    task_id: i64,
    attempt: i32,
    report_id: i64,
    strict: bool,
) -> Result<bool, Error> {
    // TODO(3): only the attempt that holds the task now may complete it: a worker whose task
    // was taken over must not overwrite the new holder's result, and, strict, nobody completes
    // once the lease has run out. As written, any worker completes the task at any time.
    // Attacked by: stale-completion, expired-lease. (`lab exercise hint worker` when stuck.)
    let _ = (attempt, strict);
    let done = sqlx::query(
        "UPDATE tasks SET status = 'completed', report_id = $2, lease_until = NULL
          WHERE id = $1",
    )
    .bind(task_id)
    .bind(report_id)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

fn var(name: &str) -> Result<String, Error> {
    std::env::var(name).map_err(|_| format!("{name} is not set").into())
}

#[tokio::main]
async fn main() -> Result<ExitCode, Error> {
    let task_id: i64 = var("TASK_ID")?.parse()?;
    let lease_seconds: f64 = var("LEASE_SECONDS")
        .unwrap_or_else(|_| "30".into())
        .parse()?;
    let reports_url = var("REPORTS_URL")?;
    let strict = var("STRICT").map_or(true, |s| s == "true");
    let worker = var("WORKER").unwrap_or_else(|_| "worker".into());
    // The URL's `options` carry the run's search_path: the tables are the run's own.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&var("DATABASE_URL")?)
        .await?;

    let Some(attempt) = claim_task(&pool, task_id, lease_seconds).await? else {
        println!("{worker}: task {task_id} is not mine to take");
        return Ok(ExitCode::from(2));
    };
    let report_id = create_report(&reports_url, task_id).await?;
    if !complete_task(&pool, task_id, attempt, report_id, strict).await? {
        println!("{worker}: completion of task {task_id} (attempt {attempt}) refused");
        return Ok(ExitCode::from(3));
    }
    println!("{worker}: task {task_id} completed with report {report_id} (attempt {attempt})");
    Ok(ExitCode::SUCCESS)
}
