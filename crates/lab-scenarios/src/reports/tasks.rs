//! Our side of the reports lesson: background tasks reserved with a lease.
//!
//! Each function is one short transaction of its own (a single statement). No transaction stays
//! open across the HTTP call to the report service: a worker claims, commits, calls, and then
//! completes in a new transaction. The SQL is the lesson's, word for word where it matters.

use std::time::Duration;

use sqlx::PgPool;

/// How long a claim holds a task before another worker may take it over.
pub const LEASE: Duration = Duration::from_secs(30);

/// A task row, with the lease shown relative to the database's clock (`> clock_timestamp()` or `<= clock_timestamp()`, the clock the lease's WHERE uses),
/// so the narrative does not depend on when it runs.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct TaskRow {
    pub id: i64,
    pub status: String,
    pub attempts: i32,
    pub lease: Option<String>,
    pub report_id: Option<i64>,
}

/// Adds a pending task.
#[tracing::instrument(skip(pool))]
pub async fn create_task(pool: &PgPool, task_id: i64) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO tasks (id) VALUES ($1)")
        .bind(task_id)
        .execute(pool)
        .await?;
    Ok(())
}

/// Reserves a task that is pending, or processing with an expired lease. Returns the new
/// `attempts`: the worker's fencing token, which it must present to `complete_task`.
#[tracing::instrument(skip(pool, lease))]
pub async fn claim_task(
    pool: &PgPool,
    task_id: i64,
    lease: Duration,
) -> Result<Option<i32>, sqlx::Error> {
    let attempts: Option<i32> = sqlx::query_scalar(
        "UPDATE tasks
            SET status = 'processing',
                attempts = attempts + 1,
                lease_until = clock_timestamp() + make_interval(secs => $2)
          WHERE id = $1
            AND (status = 'pending'
                 OR (status = 'processing' AND lease_until <= clock_timestamp()))
      RETURNING attempts",
    )
    .bind(task_id)
    .bind(lease.as_secs_f64())
    .fetch_optional(pool)
    .await?;
    match attempts {
        Some(attempts) => tracing::info!(attempts, "task claimed"),
        None => tracing::info!("task not claimable: completed, or leased by another worker"),
    }
    Ok(attempts)
}

/// Records the result, but only for the attempt that holds the task now (`attempts` is the
/// fencing token) and, with `strict_lease`, only while its lease has not expired. Returns
/// whether the row was updated; a refused completion changes nothing.
#[tracing::instrument(skip(pool))]
pub async fn complete_task(
    pool: &PgPool,
    task_id: i64,
    attempts: i32,
    report_id: i64,
    strict_lease: bool,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE tasks
            SET status = 'completed', report_id = $3, lease_until = NULL
          WHERE id = $1
            AND status = 'processing'
            AND attempts = $2
            AND (NOT $4 OR lease_until > clock_timestamp())",
    )
    .bind(task_id)
    .bind(attempts)
    .bind(report_id)
    .bind(strict_lease)
    .execute(pool)
    .await?;
    let accepted = done.rows_affected() == 1;
    tracing::info!(accepted, "completion");
    Ok(accepted)
}

/// The broken design `lease-stale` runs beside the right one: a completion that checks the
/// lease and the status but not `attempts`. With `strict_lease` it accepts any worker while the
/// task's lease is live, and after a reclaim the lease is the new worker's, so a stale worker's
/// result is accepted; without it, whoever completes first wins. Never use it: it is here so
/// the class sees what the fencing token prevents.
#[tracing::instrument(skip(pool))]
pub async fn complete_task_without_fencing(
    pool: &PgPool,
    task_id: i64,
    report_id: i64,
    strict_lease: bool,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE tasks
            SET status = 'completed', report_id = $2, lease_until = NULL
          WHERE id = $1
            AND status = 'processing'
            AND (NOT $3 OR lease_until > clock_timestamp())",
    )
    .bind(task_id)
    .bind(report_id)
    .bind(strict_lease)
    .execute(pool)
    .await?;
    let accepted = done.rows_affected() == 1;
    tracing::info!(accepted, "completion without fencing");
    Ok(accepted)
}

/// Simulated time: moves the lease into the past instead of waiting 30 seconds. The narrative
/// says so whenever a scenario uses it.
#[tracing::instrument(skip(pool))]
pub async fn expire_lease(pool: &PgPool, task_id: i64) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE tasks SET lease_until = clock_timestamp() - interval '1 second' WHERE id = $1",
    )
    .bind(task_id)
    .execute(pool)
    .await?;
    Ok(())
}

/// Reads one task. The lab reads it to show it, which is not part of the story
/// (`--show-sql` leaves it out).
#[tracing::instrument(name = "lab.backstage", skip_all)]
pub async fn task(pool: &PgPool, task_id: i64) -> Result<TaskRow, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, status, attempts,
                CASE WHEN lease_until IS NULL THEN NULL
                     WHEN lease_until > clock_timestamp() THEN '> clock_timestamp()'
                     ELSE '<= clock_timestamp()' END AS lease,
                report_id
           FROM tasks WHERE id = $1",
    )
    .bind(task_id)
    .fetch_one(pool)
    .await
}
