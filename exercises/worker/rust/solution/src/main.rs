//! A background worker of lesson 6 (§1, §9, §10): processes one task, once, whatever crashes.
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
///
/// `clock_timestamp()`, as the lesson writes it: the clock when the statement runs. `now()` is
/// the start of the transaction, the same for every statement in it; here each step is one
/// statement in a transaction of its own, so the two agree, but a lease is a time on the clock,
/// and `clock_timestamp()` stays right if a step ever grows a second statement.
async fn claim_task(pool: &PgPool, task_id: i64, lease_seconds: f64) -> Result<Option<i32>, Error> {
    Ok(sqlx::query_scalar(
        "UPDATE tasks SET status = 'processing', attempts = attempts + 1,
                lease_until = clock_timestamp() + make_interval(secs => $2)
          WHERE id = $1
            AND (status = 'pending' OR (status = 'processing' AND lease_until < clock_timestamp()))
         RETURNING attempts",
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
        .header("Idempotency-Key", format!("report-task-{task_id}"))
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
    let done = sqlx::query(
        "UPDATE tasks SET status = 'completed', report_id = $3, lease_until = NULL
          WHERE id = $1 AND status = 'processing' AND attempts = $2
            AND (NOT $4 OR lease_until > clock_timestamp())",
    )
    .bind(task_id)
    .bind(attempt)
    .bind(report_id)
    .bind(strict)
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
