//! Exercise `worker` (lesson 6, §1, §9 and §10): the learner's `claim_task`, `complete_task`
//! and the worker that processes a task by calling the report service with a stable key. The
//! lab owns the report service (its own, with its checkpoints) and runs one or two copies of
//! the learner's worker, each for one task, as one-shot programs. The oracles are the `tasks`
//! row and the service's `reports`, read by the lab.
//!
//! | check                 | the schedule                                                                 | the invariant                                   |
//! |-----------------------|------------------------------------------------------------------------------|-------------------------------------------------|
//! | `complete`            | one worker, nothing in its way                                               | one report; the task completed, pointing at it  |
//! | `crash-after-commit`  | A killed once the service committed its report, before the answer; the lease runs out; B runs | one report, attempts = 2, the task points at it |
//! | `stale-completion`    | A held inside its call; its lease runs out; B claims, is held before its answer; A let go | A's completion refused while B holds the task (strict or not) |
//! | `expired-lease`       | A held inside its call; its lease runs out, nobody claims; A let go          | strict: refused; non-strict: accepted (the manifest says which) |
//! | `no-open-transaction` | A held inside its call                                                       | no transaction of A's open (`idle in transaction`) meanwhile |
//!
//! A lease "runs out" when the lab moves `lease_until` into the past, by the database's clock:
//! the same as waiting for it, without a sleep.

use std::path::PathBuf;
use std::time::Duration;

use lab_core::{Checkpoints, Msg};
use lab_services::reports;
use lab_services::spec::{RunningService, ServiceEnv};
use sqlx::PgPool;

use crate::arena::read_rows;
use crate::catalogue::{CheckSpec, Exercise};
use crate::error::ExerciseError;
use crate::guest::{Guest, Mark};
use crate::manifest::Manifest;
use crate::verdict::{Line, ReportRow, TaskRow, Verdict};
use crate::world::World;

pub static EXERCISE: Exercise = Exercise {
    name: "worker",
    lesson: "reports",
    needs: lab_infra::Needs::POSTGRES,
    langs: &["python", "rust"],
    rust_uses_idem: false,
    checks: &[
        CheckSpec::new("complete"),
        CheckSpec::new("crash-after-commit").restarts(),
        CheckSpec::new("stale-completion").restarts(),
        CheckSpec::new("expired-lease").restarts(),
        CheckSpec::new("no-open-transaction").restarts(),
    ],
    starter_fails: &["crash-after-commit", "stale-completion", "expired-lease"],
};

/// The lease a worker is given: long enough never to run out by itself during a check; the lab
/// ends it when a check needs it ended.
const LEASE_SECONDS: u64 = 30;
/// How long a worker may take to process one task, and to reach the report service.
const WORKER_LIMIT: Duration = Duration::from_secs(30);
const REACH_LIMIT: Duration = Duration::from_secs(30);

type Checked = Result<Verdict, ExerciseError>;

/// What the worker's checks work with.
pub struct Yard {
    pub pool: PgPool,
    pub schema: String,
    pub run: String,
    pub database_url: String,
    pub service: RunningService,
    pub checkpoints: Checkpoints,
    pub dir: PathBuf,
    pub manifest: Manifest,
    pub extra_env: Vec<(String, String)>,
    pub schedule: Vec<Line>,
    /// The workers of the current check, kept for their output.
    pub workers: Vec<(String, Guest)>,
}

impl Yard {
    pub fn strict(&self) -> bool {
        self.manifest.strict.unwrap_or(true)
    }

    fn step(&mut self, msg: Msg) {
        self.schedule.push(Line::Step(msg));
    }

    /// A copy of the learner's worker, named `who`, for `task`.
    fn worker(&self, who: &str, task: i64) -> Result<Guest, ExerciseError> {
        let env = vec![
            ("TASK_ID".to_string(), task.to_string()),
            ("LEASE_SECONDS".to_string(), LEASE_SECONDS.to_string()),
            ("REPORTS_URL".to_string(), self.service.url()),
            ("DATABASE_URL".to_string(), self.database_url.clone()),
            ("WORKER".to_string(), who.to_string()),
            ("STRICT".to_string(), self.strict().to_string()),
            ("LAB_RUN".to_string(), self.run.clone()),
            ("PYTHONUNBUFFERED".to_string(), "1".to_string()),
        ];
        let env = env
            .into_iter()
            .chain(self.extra_env.iter().cloned())
            .collect();
        Guest::new(&self.dir, self.manifest.clone(), 0, env)
    }

    /// Runs worker `who` on `task` to its end; its exit code, told in the schedule.
    async fn run_worker(&mut self, who: &str, task: i64) -> Result<Option<i32>, ExerciseError> {
        let mut worker = self.worker(who, task)?;
        worker.launch().await?;
        let ended = worker.finish(WORKER_LIMIT).await;
        self.workers.push((who.to_string(), worker));
        self.told_exit(who, ended);
        Ok(ended.ok().flatten())
    }

    /// Lets `who`'s held call go on, and waits for `who` to finish.
    async fn let_go(&mut self, who: &str, mut worker: Guest, hold: lab_core::checkpoint::Hold) {
        hold.release();
        let ended = worker.finish(WORKER_LIMIT).await;
        self.workers.push((who.to_string(), worker));
        self.told_exit(who, ended);
    }

    fn told_exit(&mut self, who: &str, ended: Result<Option<i32>, ()>) {
        let msg = match ended {
            Ok(Some(code)) => Msg::new("step.exited").arg("code", i64::from(code)),
            Ok(None) => Msg::new("step.signalled"),
            Err(()) => Msg::new("step.hung").arg("seconds", WORKER_LIMIT.as_secs() as i64),
        };
        self.step(msg.arg("who", who));
    }

    async fn new_task(&mut self, task: i64) -> Result<(), ExerciseError> {
        sqlx::query("INSERT INTO tasks (id) VALUES ($1)")
            .bind(task)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The lease of `task` runs out now, by the database's clock.
    async fn end_lease(&mut self, task: i64) -> Result<(), ExerciseError> {
        self.step(Msg::new("step.lease_ends"));
        sqlx::query(
            "UPDATE tasks SET lease_until = now() - interval '1 second'
              WHERE id = $1 AND status = 'processing'",
        )
        .bind(task)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn task_row(&mut self, task: i64) -> Result<TaskRow, ExerciseError> {
        let (id, status, attempts, report_id, leased): (i64, String, i32, Option<i64>, bool) =
            sqlx::query_as(
                "SELECT id, status, attempts, report_id, coalesce(lease_until > now(), false)
                   FROM tasks WHERE id = $1",
            )
            .bind(task)
            .fetch_one(&self.pool)
            .await?;
        let row = TaskRow {
            id,
            status,
            attempts,
            report_id,
            leased,
        };
        self.schedule.push(Line::Task(row.clone()));
        Ok(row)
    }

    async fn reports(&mut self, task: i64) -> Result<Vec<ReportRow>, ExerciseError> {
        let rows = read_rows(&self.pool, task).await?;
        self.schedule.push(Line::Rows {
            task_id: task,
            rows: rows.clone(),
        });
        Ok(rows)
    }

    /// The learner's sessions that sit inside an open transaction (the lab's own and the
    /// service's carry the run's schema as their application name).
    async fn open_transactions(&self) -> Result<i64, ExerciseError> {
        Ok(sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND state LIKE 'idle in transaction%'
                AND application_name <> $1",
        )
        .bind(&self.schema)
        .fetch_one(&self.pool)
        .await?)
    }

    /// The output of the check's workers, for a check that did not pass.
    async fn workers_output(&self) -> Option<String> {
        let mut said = Vec::new();
        for (who, worker) in &self.workers {
            let output = worker.output().await;
            if !output.trim().is_empty() {
                said.push(format!("[worker {who}]\n{output}"));
            }
        }
        (!said.is_empty()).then(|| said.join("\n"))
    }
}

fn fail(key: &str) -> Msg {
    Msg::new(format!("broke.{key}"))
}

/// The end every check's task should reach: one report, the task completed by `attempts`,
/// pointing at that report. The ways it breaks are named.
fn judge_done(task: &TaskRow, rows: &[ReportRow], attempts: i32) -> Result<(), Verdict> {
    match rows {
        [] => return Err(Verdict::Fail(fail("no_report").arg("task", task.id))),
        [_] => {}
        [..] => {
            let keys: Vec<String> = rows
                .iter()
                .map(|r| r.idempotency_key.clone().unwrap_or_else(|| "-".into()))
                .collect();
            let key = if rows.iter().all(|r| r.idempotency_key.is_none()) {
                "no_key"
            } else if rows
                .windows(2)
                .any(|w| w[0].idempotency_key != w[1].idempotency_key)
            {
                "keys_differ"
            } else {
                "reports"
            };
            return Err(Verdict::Fail(
                fail(key)
                    .arg("task", task.id)
                    .arg("count", rows.len())
                    .arg("keys", keys.join(", ")),
            ));
        }
    }
    if task.status != "completed" {
        return Err(Verdict::Fail(
            fail("not_completed")
                .arg("task", task.id)
                .arg("status", task.status.as_str())
                .arg("attempts", i64::from(task.attempts)),
        ));
    }
    if task.attempts != attempts {
        return Err(Verdict::Fail(
            fail("attempts")
                .arg("got", i64::from(task.attempts))
                .arg("expected", i64::from(attempts)),
        ));
    }
    if task.report_id != Some(rows[0].id) {
        return Err(Verdict::Fail(
            fail("points_elsewhere")
                .arg(
                    "got",
                    task.report_id.map_or("-".to_string(), |id| id.to_string()),
                )
                .arg("id", rows[0].id),
        ));
    }
    Ok(())
}

fn verdict(judged: Result<(), Verdict>) -> Checked {
    Ok(judged.err().unwrap_or(Verdict::Pass))
}

/// Runs the check `name`.
pub async fn run(name: &str, y: &mut Yard) -> Checked {
    match name {
        "complete" => complete(y).await,
        "crash-after-commit" => crash_after_commit(y).await,
        "stale-completion" => stale_completion(y).await,
        "expired-lease" => expired_lease(y).await,
        "no-open-transaction" => no_open_transaction(y).await,
        other => unreachable!("worker has no check {other}"),
    }
}

async fn complete(y: &mut Yard) -> Checked {
    let task = 1;
    y.new_task(task).await?;
    y.step(Msg::new("step.run").arg("who", "A").arg("task", task));
    y.run_worker("A", task).await?;
    let rows = y.reports(task).await?;
    let row = y.task_row(task).await?;
    verdict(judge_done(&row, &rows, 1))
}

/// Where a worker started for a held call got to.
enum Reached {
    /// Its call is held at the point.
    Held(Box<Guest>, lab_core::checkpoint::Hold),
    /// It did not get there: the verdict that says so (it exited without calling, or never
    /// came within the bound).
    Not(Verdict),
}

/// Starts worker `who` on `task` and waits until its call is held at `point` in the report
/// service, or until it exits without getting there.
async fn held_at(
    y: &mut Yard,
    who: &str,
    task: i64,
    point: &str,
) -> Result<Reached, ExerciseError> {
    let hold = y.checkpoints.hold(point);
    let mut worker = y.worker(who, task)?;
    worker.launch().await?;
    let exited = tokio::select! {
        entered = hold.entered(REACH_LIMIT) => match entered {
            Ok(()) => None,
            Err(_) => Some(Err(())),
        },
        ended = worker.finish(REACH_LIMIT) => Some(ended),
    };
    let Some(exited) = exited else {
        return Ok(Reached::Held(Box::new(worker), hold));
    };
    worker.kill().await;
    y.workers.push((who.to_string(), worker));
    y.told_exit(who, exited);
    let verdict = match exited {
        Ok(code) => Verdict::Fail(
            fail("no_call")
                .arg("who", who)
                .arg("task", task)
                .arg("code", code.map_or("-".to_string(), |c| c.to_string())),
        ),
        Err(()) => Verdict::Unknown(
            Msg::new("unknown.never_reached")
                .arg("who", who)
                .arg("seconds", REACH_LIMIT.as_secs() as i64),
        ),
    };
    Ok(Reached::Not(verdict))
}

async fn crash_after_commit(y: &mut Yard) -> Checked {
    let task = 2;
    y.new_task(task).await?;
    y.step(
        Msg::new("step.run_held_commit")
            .arg("who", "A")
            .arg("task", task),
    );
    let (mut a, hold) = match held_at(y, "A", task, reports::COMMITTED).await? {
        Reached::Held(worker, hold) => (*worker, hold),
        Reached::Not(verdict) => return Ok(verdict),
    };
    y.step(Msg::new("step.kill").arg("who", "A"));
    a.kill().await;
    y.workers.push(("A".into(), a));
    // The service goes on: its answer reaches no one.
    hold.release();
    y.reports(task).await?;
    y.task_row(task).await?;
    y.end_lease(task).await?;
    y.step(Msg::new("step.run").arg("who", "B").arg("task", task));
    y.run_worker("B", task).await?;
    let rows = y.reports(task).await?;
    let row = y.task_row(task).await?;
    verdict(judge_done(&row, &rows, 2))
}

async fn stale_completion(y: &mut Yard) -> Checked {
    let task = 3;
    y.new_task(task).await?;
    y.step(
        Msg::new("step.run_held_insert")
            .arg("who", "A")
            .arg("task", task),
    );
    let (mut a, held_a) = match held_at(y, "A", task, reports::BEFORE_INSERT).await? {
        Reached::Held(worker, hold) => (*worker, hold),
        Reached::Not(verdict) => return Ok(verdict),
    };
    y.end_lease(task).await?;
    // B takes the task over and makes its report; it is held before its answer, so B holds
    // the task, with a lease that runs, when A comes back.
    y.step(
        Msg::new("step.run_held_commit")
            .arg("who", "B")
            .arg("task", task),
    );
    let (b, held_b) = match held_at(y, "B", task, reports::COMMITTED).await? {
        Reached::Held(worker, hold) => (*worker, hold),
        Reached::Not(verdict) => {
            a.kill().await;
            y.workers.push(("A".into(), a));
            return Ok(verdict);
        }
    };
    y.task_row(task).await?;
    y.step(Msg::new("step.release").arg("who", "A"));
    y.let_go("A", a, held_a).await;
    let after_a = y.task_row(task).await?;
    y.step(Msg::new("step.release").arg("who", "B"));
    y.let_go("B", b, held_b).await;
    let rows = y.reports(task).await?;
    let row = y.task_row(task).await?;
    // A's attempt no longer held the task: whatever it wrote is the stale write.
    if after_a.status == "completed" || after_a.report_id.is_some() {
        return Ok(Verdict::Fail(fail("stale_accepted").arg("task", task)));
    }
    verdict(judge_done(&row, &rows, 2))
}

async fn expired_lease(y: &mut Yard) -> Checked {
    let task = 4;
    y.new_task(task).await?;
    let strict = y.strict();
    y.step(Msg::new(if strict {
        "step.mode_strict"
    } else {
        "step.mode_lenient"
    }));
    y.step(
        Msg::new("step.run_held_insert")
            .arg("who", "A")
            .arg("task", task),
    );
    let (a, hold) = match held_at(y, "A", task, reports::BEFORE_INSERT).await? {
        Reached::Held(worker, hold) => (*worker, hold),
        Reached::Not(verdict) => return Ok(verdict),
    };
    y.end_lease(task).await?;
    y.step(Msg::new("step.release").arg("who", "A"));
    y.let_go("A", a, hold).await;
    let rows = y.reports(task).await?;
    let row = y.task_row(task).await?;
    if strict {
        if row.status == "completed" {
            return Ok(Verdict::Fail(fail("strict_accepted").arg("task", task)));
        }
        if row.attempts != 1 || row.report_id.is_some() {
            return Ok(Verdict::Fail(
                fail("attempts")
                    .arg("got", i64::from(row.attempts))
                    .arg("expected", 1),
            ));
        }
        return Ok(Verdict::Pass);
    }
    if row.status != "completed" {
        return Ok(Verdict::Fail(fail("lenient_refused").arg("task", task)));
    }
    verdict(judge_done(&row, &rows, 1))
}

async fn no_open_transaction(y: &mut Yard) -> Checked {
    let task = 5;
    y.new_task(task).await?;
    y.step(
        Msg::new("step.run_held_insert")
            .arg("who", "A")
            .arg("task", task),
    );
    let (a, hold) = match held_at(y, "A", task, reports::BEFORE_INSERT).await? {
        Reached::Held(worker, hold) => (*worker, hold),
        Reached::Not(verdict) => return Ok(verdict),
    };
    let open = y.open_transactions().await?;
    y.step(Msg::new("step.open_transactions").arg("count", open));
    y.let_go("A", a, hold).await;
    if open > 0 {
        return Ok(Verdict::Fail(fail("open_transaction").arg("count", open)));
    }
    let rows = y.reports(task).await?;
    let row = y.task_row(task).await?;
    verdict(judge_done(&row, &rows, 1))
}

/// Starts the lab's report service on the run's schema, with checkpoints the checks hold.
pub fn report_service(
    pool: PgPool,
    checkpoints: Checkpoints,
) -> Result<RunningService, ExerciseError> {
    let env = ServiceEnv::default()
        .with_pg(pool)
        .with_checkpoints(checkpoints);
    crate::payment_world::launch(&reports::SPEC, env)
}

impl World for Yard {
    fn schedule(&mut self) -> &mut Vec<Line> {
        &mut self.schedule
    }

    async fn check(&mut self, name: &str) -> Checked {
        // Each check's workers are its own (started for it), and so is their output.
        self.workers.clear();
        run(name, self).await
    }

    async fn output(&self, _mark: &Mark) -> Option<String> {
        self.workers_output().await
    }

    async fn close(self) {
        self.service.stop().await;
    }
}
