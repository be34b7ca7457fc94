//! Exercise `worker` (lesson 6, §1, §9 and §10): the learner's `claim_task`, `complete_task`
//! and the worker that processes a task by calling the report service with a stable key. The
//! lab owns the report service and runs one or two copies of the learner's worker, each for one
//! task, as one-shot programs. The oracles are the `tasks` row and the service's `reports`,
//! read by the lab.
//!
//! | check                 | the schedule                                                                 | the invariant                                   |
//! |-----------------------|------------------------------------------------------------------------------|-------------------------------------------------|
//! | `complete`            | one worker, nothing in its way                                               | one report; the task completed, pointing at it  |
//! | `crash-after-commit`  | A killed once the service committed its report, before the answer; the lease runs out; B runs | one report, the task completed by B, pointing at it |
//! | `stale-completion`    | A held inside its call; its lease runs out; B claims, is held before its answer; A let go | A's completion refused while B holds the task (strict or not) |
//! | `expired-lease`       | A held inside its call; its lease runs out, nobody claims; A let go          | strict: refused; non-strict: accepted (the manifest says which) |
//! | `no-open-transaction` | A held inside its call                                                       | no transaction of A's open (`idle in transaction`) meanwhile |
//!
//! Each worker gets a door of its own to the report service (its `REPORTS_URL`: the same
//! service code on the same tables, with checkpoints of its own), so a hold meant for B holds
//! B's calls and nobody else's. A hold holds every call that comes through its door, so a
//! worker whose client gives up and retries with the same key has every retry held too: its
//! retries are part of the schedule, not a way around it.
//!
//! A lease "runs out" when the lab moves `lease_until` into the past, by the database's clock:
//! the same as waiting for it, without a sleep. The lab checks that its UPDATE matched the
//! task; when it did not (the claim was never committed), it says so rather than judge.

use std::time::Duration;

use lab_core::{Checkpoints, HoldAll, Msg};
use lab_services::reports;
use lab_services::spec::ServiceEnv;
use sqlx::PgPool;

use crate::database;
use crate::error::ExerciseError;
use crate::exercise::{Check, Checked, Checks, Exercise, Setup, Subject};
use crate::guest_env::GuestEnv;
use crate::judgement::{Judged, broke, fail, undecided, unknown};
use crate::report_api::read_rows;
use crate::rig::{Program, Rig, World, run_checks};
use crate::verdict::{Line, ReportRow, TaskRow};

pub static EXERCISE: Exercise = Exercise {
    name: "worker",
    lesson: "reports",
    needs: lab_infra::Needs::POSTGRES,
    langs: &["python", "rust"],
    rust_uses_idem: false,
    checks: &CHECKS,
    open: |setup| Box::pin(open(setup)),
};

static CHECKS: Checks<Worker> = Checks(&[
    Check::new("complete", |w| Box::pin(complete(w))),
    Check::new("crash-after-commit", |w| Box::pin(crash_after_commit(w)))
        .restarts()
        .starter_fails(),
    Check::new("stale-completion", |w| Box::pin(stale_completion(w)))
        .restarts()
        .starter_fails(),
    Check::new("expired-lease", |w| Box::pin(expired_lease(w)))
        .restarts()
        .starter_fails(),
    Check::new("no-open-transaction", |w| Box::pin(no_open_transaction(w))).restarts(),
]);

/// The lease a worker is given: long enough never to run out by itself during a check; the lab
/// ends it when a check needs it ended.
const LEASE_SECONDS: u64 = 30;
/// How long a worker may take to process one task, and to reach the report service.
const WORKER_LIMIT: Duration = Duration::from_secs(30);
const REACH_LIMIT: Duration = Duration::from_secs(30);
/// The workers a check runs, each with a door of its own to the report service.
const WORKERS: [&str; 2] = ["A", "B"];

/// What the worker's checks work with.
pub struct Worker {
    rig: Rig,
    /// The lab's own connections to the run's schema (their application name is the schema's).
    pool: PgPool,
    schema: String,
    database_url: String,
    strict: bool,
    /// Each worker's door to the report service: its URL and the checkpoints behind it.
    doors: Vec<(&'static str, String, Checkpoints)>,
}

async fn open(setup: Setup<'_>) -> Result<Checked, ExerciseError> {
    let Setup {
        subject,
        servers,
        options,
        on_report,
    } = setup;
    let Subject::Program { dir, manifest } = subject else {
        return Err(ExerciseError::TargetNotApplicable {
            exercise: "worker",
            why: "it runs the worker for each task",
        });
    };
    let strict = manifest.strict.unwrap_or(true);
    let space = database::open_space(servers).await?;
    let result = async {
        let pool = space.pg.clone().expect("the run has PostgreSQL");
        let mut rig = Rig::new(&space.run_id, options, Some(Program { dir, manifest }));
        rig.build().await?;
        let mut doors = Vec::new();
        for who in WORKERS {
            let checkpoints = Checkpoints::new();
            let env = ServiceEnv::default()
                .with_pg(pool.clone())
                .with_checkpoints(checkpoints.clone());
            doors.push((who, rig.launch(&reports::SPEC, env)?, checkpoints));
        }
        let world = Worker {
            database_url: database::guest_database_url(servers, &space).await?,
            rig,
            pool,
            schema: space.schema.clone(),
            strict,
            doors,
        };
        Ok(Checked::Reports(
            run_checks(&CHECKS, world, options, on_report).await?,
        ))
    }
    .await;
    database::release(servers, space).await?;
    result
}

/// Where a worker started for a held call got to.
enum Reached {
    /// Its call (and any retry of it) is held at the point.
    Held(HoldAll),
    /// It exited without calling: its exit code.
    Exited(Option<i32>),
    /// It neither called nor exited within the bound.
    Never,
}

/// How the lab's ending of a lease went.
enum LeaseEnd {
    Ended,
    /// The UPDATE matched nothing: the task's committed row, as the lab saw it.
    NotVisible(TaskRow),
}

impl Worker {
    fn step(&mut self, msg: Msg) {
        self.rig.step(msg);
    }

    fn door(&self, who: &str) -> &(&'static str, String, Checkpoints) {
        self.doors
            .iter()
            .find(|(name, _, _)| *name == who)
            .expect("a worker of the check")
    }

    /// The environment of worker `who` on `task`.
    fn env(&self, who: &str, task: i64) -> GuestEnv {
        GuestEnv {
            task_id: Some(task),
            lease_seconds: Some(LEASE_SECONDS),
            reports_url: Some(self.door(who).1.clone()),
            database_url: Some(self.database_url.clone()),
            worker: Some(who.to_string()),
            strict: Some(self.strict),
            ..self.rig.env()
        }
    }

    /// Runs worker `who` on `task` to its end, told in the schedule.
    async fn run_worker(&mut self, who: &str, task: i64) -> Result<(), ExerciseError> {
        let env = self.env(who, task);
        self.rig.launch_job(who, env).await?;
        let ended = self.rig.finish_job(who, WORKER_LIMIT).await;
        self.told_exit(who, ended);
        Ok(())
    }

    /// Starts worker `who` on `task` and waits until its call is held at `point` behind its
    /// door, or until it exits without getting there.
    async fn held_at(
        &mut self,
        who: &str,
        task: i64,
        point: &str,
    ) -> Result<Reached, ExerciseError> {
        let hold = self.door(who).2.hold_all(point);
        let env = self.env(who, task);
        self.rig.launch_job(who, env).await?;
        let exited = tokio::select! {
            entered = hold.entered(REACH_LIMIT) => match entered {
                Ok(()) => return Ok(Reached::Held(hold)),
                Err(_) => Err(()),
            },
            ended = self.rig.finish_job(who, REACH_LIMIT) => ended,
        };
        self.rig.kill_job(who).await;
        self.told_exit(who, exited);
        Ok(match exited {
            Ok(code) => Reached::Exited(code),
            Err(()) => Reached::Never,
        })
    }

    /// Lets `who`'s held calls go on, and waits for `who` to finish.
    async fn let_go(&mut self, who: &str, hold: HoldAll) {
        self.step(Msg::new("step.release").arg("who", who));
        hold.release();
        let ended = self.rig.finish_job(who, WORKER_LIMIT).await;
        self.told_exit(who, ended);
    }

    fn told_exit(&mut self, who: &str, ended: Result<Option<i32>, ()>) {
        let msg = match ended {
            Ok(Some(code)) => Msg::new("step.exited").arg("code", i64::from(code)),
            Ok(None) => Msg::new("step.signalled"),
            Err(()) => Msg::new("step.hung").arg("seconds", WORKER_LIMIT.as_secs()),
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

    /// The lease of `task` runs out now, by the database's clock, if the lab can see a claim.
    async fn end_lease(&mut self, task: i64) -> Result<LeaseEnd, ExerciseError> {
        self.step(Msg::new("step.lease_ends"));
        let ended = sqlx::query(
            "UPDATE tasks SET lease_until = now() - interval '1 second'
              WHERE id = $1 AND status = 'processing'",
        )
        .bind(task)
        .execute(&self.pool)
        .await?
        .rows_affected();
        if ended == 1 {
            return Ok(LeaseEnd::Ended);
        }
        let row = self.task_row(task).await?;
        Ok(LeaseEnd::NotVisible(row))
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
        self.rig.record(Line::Task(row.clone()));
        Ok(row)
    }

    async fn reports(&mut self, task: i64) -> Result<Vec<ReportRow>, ExerciseError> {
        let rows = read_rows(&self.pool, task).await?;
        self.rig.record(Line::Rows {
            task_id: task,
            rows: rows.clone(),
        });
        Ok(rows)
    }

    /// The worker's sessions that sit inside an open transaction (the lab's own and the
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

    /// The workers' sessions waiting for a lock another session holds.
    async fn blocked_sessions(&self) -> Result<i64, ExerciseError> {
        Ok(sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND application_name <> $1
                AND cardinality(pg_blocking_pids(pid)) > 0",
        )
        .bind(&self.schema)
        .fetch_one(&self.pool)
        .await?)
    }

    /// Why worker `who` did not get its call held: the verdict that says what the lab saw.
    async fn not_held(&mut self, who: &str, task: i64, reached: Reached) -> Judged {
        match reached {
            Reached::Held(_) => Ok(()),
            Reached::Exited(code) => {
                let row = self.task_row(task).await?;
                let code = code.map_or_else(|| lab_core::Arg::Str("-".into()), |c| c.into());
                fail(
                    broke("no_call")
                        .arg("who", who)
                        .arg("task", task)
                        .arg("code", code)
                        .arg("status", row.status.as_str())
                        .arg("attempts", i64::from(row.attempts)),
                )
            }
            Reached::Never => {
                if self.blocked_sessions().await? > 0 {
                    return unknown(
                        undecided("blocked")
                            .arg("who", who)
                            .arg("seconds", REACH_LIMIT.as_secs()),
                    );
                }
                unknown(
                    undecided("never_reached")
                        .arg("who", who)
                        .arg("seconds", REACH_LIMIT.as_secs()),
                )
            }
        }
    }

    /// Ends the lease of `task` while `who` is held; the unknown that says why it could not be.
    async fn lease_runs_out(&mut self, who: &str, task: i64) -> Judged {
        match self.end_lease(task).await? {
            LeaseEnd::Ended => Ok(()),
            LeaseEnd::NotVisible(row) if row.status == "pending" => {
                unknown(undecided("claim_not_committed").arg("who", who))
            }
            LeaseEnd::NotVisible(row) => unknown(
                undecided("lease_not_ended")
                    .arg("who", who)
                    .arg("status", row.status.as_str()),
            ),
        }
    }
}

impl World for Worker {
    fn rig(&mut self) -> &mut Rig {
        &mut self.rig
    }

    async fn close(self) {
        self.rig.close().await;
    }
}

/// The end every check's task should reach: one report, the task completed by `attempts`,
/// pointing at that report. The ways it breaks are named by what the rows show.
fn judge_done(task: &TaskRow, rows: &[ReportRow], attempts: i32) -> Judged {
    match rows {
        [] => return fail(broke("no_report").arg("task", task.id)),
        [_] => {}
        [..] => {
            let keys: Vec<String> = rows
                .iter()
                .map(|r| r.idempotency_key.clone().unwrap_or_else(|| "-".into()))
                .collect();
            let why = if rows.iter().all(|r| r.idempotency_key.is_none()) {
                "no_key"
            } else if rows
                .windows(2)
                .any(|w| w[0].idempotency_key != w[1].idempotency_key)
            {
                "keys_differ"
            } else {
                "reports"
            };
            return fail(
                broke(why)
                    .arg("task", task.id)
                    .arg("count", rows.len())
                    .arg("keys", keys.join(", ")),
            );
        }
    }
    if task.status != "completed" {
        return fail(
            broke("not_completed")
                .arg("task", task.id)
                .arg("status", task.status.as_str())
                .arg("attempts", i64::from(task.attempts)),
        );
    }
    if task.attempts != attempts {
        return fail(
            broke("attempts")
                .arg("got", i64::from(task.attempts))
                .arg("expected", i64::from(attempts)),
        );
    }
    if task.report_id != Some(rows[0].id) {
        let got = match task.report_id {
            Some(id) => lab_core::Arg::Int(id),
            None => lab_core::Arg::Str("NULL".into()),
        };
        return fail(
            broke("points_elsewhere")
                .arg("got", got)
                .arg("id", rows[0].id),
        );
    }
    Ok(())
}

async fn complete(w: &mut Worker) -> Judged {
    let task = 1;
    w.new_task(task).await?;
    w.step(Msg::new("step.run").arg("who", "A").arg("task", task));
    w.run_worker("A", task).await?;
    let rows = w.reports(task).await?;
    let row = w.task_row(task).await?;
    judge_done(&row, &rows, 1)
}

async fn crash_after_commit(w: &mut Worker) -> Judged {
    let task = 2;
    w.new_task(task).await?;
    w.step(
        Msg::new("step.run_held_commit")
            .arg("who", "A")
            .arg("task", task),
    );
    let hold = match w.held_at("A", task, reports::COMMITTED).await? {
        Reached::Held(hold) => hold,
        other => return w.not_held("A", task, other).await,
    };
    w.step(Msg::new("step.kill").arg("who", "A"));
    w.rig.kill_job("A").await;
    // The service goes on: its answer reaches no one.
    hold.release();
    w.reports(task).await?;
    w.task_row(task).await?;
    // A claim that was committed is taken over after its lease; one that died with A (its
    // transaction was open) left the task pending, and B's is then the only attempt.
    let attempts = match w.end_lease(task).await? {
        LeaseEnd::Ended => 2,
        LeaseEnd::NotVisible(row) if row.status == "pending" => row.attempts + 1,
        LeaseEnd::NotVisible(row) => {
            return unknown(
                undecided("lease_not_ended")
                    .arg("who", "A")
                    .arg("status", row.status.as_str()),
            );
        }
    };
    w.step(Msg::new("step.run").arg("who", "B").arg("task", task));
    w.run_worker("B", task).await?;
    let rows = w.reports(task).await?;
    let row = w.task_row(task).await?;
    judge_done(&row, &rows, attempts)
}

async fn stale_completion(w: &mut Worker) -> Judged {
    let task = 3;
    w.new_task(task).await?;
    w.step(
        Msg::new("step.run_held_insert")
            .arg("who", "A")
            .arg("task", task),
    );
    let held_a = match w.held_at("A", task, reports::BEFORE_INSERT).await? {
        Reached::Held(hold) => hold,
        other => return w.not_held("A", task, other).await,
    };
    w.lease_runs_out("A", task).await?;
    // B takes the task over and makes its report; it is held before its answer, so B holds
    // the task, with a lease that runs, when A comes back.
    w.step(
        Msg::new("step.run_held_commit")
            .arg("who", "B")
            .arg("task", task),
    );
    let held_b = match w.held_at("B", task, reports::COMMITTED).await? {
        Reached::Held(hold) => hold,
        other => {
            w.rig.kill_job("A").await;
            drop(held_a);
            return w.not_held("B", task, other).await;
        }
    };
    let taken_over = w.task_row(task).await?;
    w.let_go("A", held_a).await;
    let after_a = w.task_row(task).await?;
    w.let_go("B", held_b).await;
    let rows = w.reports(task).await?;
    let row = w.task_row(task).await?;
    // A's attempt no longer held the task: whatever it wrote over B's is the stale write.
    if after_a.status == "completed" || after_a.report_id != taken_over.report_id {
        return fail(
            broke("stale_accepted")
                .arg("task", task)
                .arg("attempts", i64::from(taken_over.attempts)),
        );
    }
    judge_done(&row, &rows, taken_over.attempts)
}

async fn expired_lease(w: &mut Worker) -> Judged {
    let task = 4;
    w.new_task(task).await?;
    let strict = w.strict;
    w.step(Msg::new(if strict {
        "step.mode_strict"
    } else {
        "step.mode_lenient"
    }));
    w.step(
        Msg::new("step.run_held_insert")
            .arg("who", "A")
            .arg("task", task),
    );
    let hold = match w.held_at("A", task, reports::BEFORE_INSERT).await? {
        Reached::Held(hold) => hold,
        other => return w.not_held("A", task, other).await,
    };
    w.lease_runs_out("A", task).await?;
    w.let_go("A", hold).await;
    let rows = w.reports(task).await?;
    let row = w.task_row(task).await?;
    if strict {
        if row.status == "completed" {
            return fail(broke("strict_accepted").arg("task", task));
        }
        return Ok(());
    }
    if row.status != "completed" {
        return fail(
            broke("lenient_refused")
                .arg("task", task)
                .arg("status", row.status.as_str()),
        );
    }
    judge_done(&row, &rows, 1)
}

async fn no_open_transaction(w: &mut Worker) -> Judged {
    let task = 5;
    w.new_task(task).await?;
    w.step(
        Msg::new("step.run_held_insert")
            .arg("who", "A")
            .arg("task", task),
    );
    let hold = match w.held_at("A", task, reports::BEFORE_INSERT).await? {
        Reached::Held(hold) => hold,
        other => return w.not_held("A", task, other).await,
    };
    let open = w.open_transactions().await?;
    w.step(Msg::new("step.open_transactions").arg("count", open));
    w.let_go("A", hold).await;
    if open > 0 {
        return fail(broke("open_transaction").arg("count", open));
    }
    let rows = w.reports(task).await?;
    let row = w.task_row(task).await?;
    judge_done(&row, &rows, 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judgement::verdict_of;
    use crate::verdict::Verdict;

    fn task(status: &str, attempts: i32, report_id: Option<i64>) -> TaskRow {
        TaskRow {
            id: 2,
            status: status.into(),
            attempts,
            report_id,
            leased: false,
        }
    }

    fn report(id: i64, key: Option<&str>) -> ReportRow {
        ReportRow {
            id,
            task_id: 2,
            report_type: "monthly".into(),
            idempotency_key: key.map(str::to_string),
        }
    }

    fn key_of(judged: Judged) -> Option<String> {
        match verdict_of(judged).unwrap() {
            Verdict::Pass => None,
            other => Some(other.reason().unwrap().key.clone()),
        }
    }

    #[test]
    fn a_task_done_once_passes() {
        let rows = [report(1, Some("report-task-2"))];
        assert_eq!(
            key_of(judge_done(&task("completed", 2, Some(1)), &rows, 2)),
            None
        );
    }

    #[test]
    fn two_reports_are_named_by_what_their_keys_show() {
        let none = [report(1, None), report(2, None)];
        assert_eq!(
            key_of(judge_done(&task("completed", 2, Some(2)), &none, 2)).as_deref(),
            Some("broke.no_key")
        );
        let differ = [report(1, Some("t2-1")), report(2, Some("t2-2"))];
        let judged = judge_done(&task("completed", 2, Some(2)), &differ, 2);
        let Err(crate::judgement::Stop::Verdict(Verdict::Fail(msg))) = judged else {
            panic!("two keys passed")
        };
        assert_eq!(msg.key, "broke.keys_differ");
        assert!(
            msg.args
                .iter()
                .any(|(n, v)| n == "keys" && *v == lab_core::Arg::Str("t2-1, t2-2".into())),
            "the keys are shown as they are, not guessed at: {msg:?}"
        );
    }

    #[test]
    fn an_unfinished_or_misfenced_task_is_named() {
        let rows = [report(1, Some("k"))];
        assert_eq!(
            key_of(judge_done(&task("processing", 2, None), &rows, 2)).as_deref(),
            Some("broke.not_completed")
        );
        assert_eq!(
            key_of(judge_done(&task("completed", 3, Some(1)), &rows, 2)).as_deref(),
            Some("broke.attempts")
        );
        assert_eq!(
            key_of(judge_done(&task("completed", 2, None), &rows, 2)).as_deref(),
            Some("broke.points_elsewhere")
        );
        assert_eq!(
            key_of(judge_done(&task("completed", 2, None), &[], 2)).as_deref(),
            Some("broke.no_report")
        );
    }
}
