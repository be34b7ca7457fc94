//! Exercise `worker` (lesson 6, §1, §9 and §10): the learner's `claim_task`, `complete_task`
//! and the worker that processes a task by calling the report service with a stable key. The
//! lab owns the report service and runs copies of the learner's worker (`A`, `B`), each for one
//! task, as one-shot programs. The oracles are the `tasks` row and the service's `reports`,
//! read by the lab, and what each worker's calls got at its door.
//!
//! | check                 | the schedule                                                                 | the invariant                                   |
//! |-----------------------|------------------------------------------------------------------------------|-------------------------------------------------|
//! | `complete`            | A runs for one task, then B for another, nothing in their way                | one report per task, the task completed, pointing at it; each task's key its own |
//! | `crash-after-commit`  | A's call held once the service committed its report; A killed; its lease ends; B runs | one report, the task completed by attempt 2, pointing at it |
//! | `stale-completion`    | A held at its door; its lease ends; B claims and is held at its door; A let go | nothing A does changes the task while B holds it (strict or not) |
//! | `expired-lease`       | A (a lease of 2 s) held at its door until its lease runs out by the clock; nobody claims; A let go | the lease is LEASE_SECONDS long; strict: A's result refused, nothing of it written; non-strict: accepted |
//! | `no-open-transaction` | A held at its door                                                           | no session of the worker's role `idle in transaction` meanwhile |
//! | `held-task`           | A held at its door, its lease running; B runs for the same task              | B does not claim it (attempts unchanged, no call from B) |
//! | `claim-race`          | the lab locks `tasks` against writes; A and B run for one task, their calls held at their doors; both wait at the lock; the lab lets go | one claim wins: attempts 1, one worker inside its call |
//!
//! `claim-race` needs no seeded rounds: under the lab's SHARE lock each worker reads what it
//! likes and waits at its first write, so both have read the task free before either writes; and
//! the winner stays held inside its call, so the loser's claim meets a task held under a running
//! lease however the two are scheduled afterwards.
//!
//! Every check starts with empty `tasks` and `reports` (the run's own tables), so no check sees
//! another's reports, and each replay line reproduces its verdict.
//!
//! **Doors.** Each worker gets a door of its own to the report service ([`door`]: its
//! `REPORTS_URL`, the same service code on the same tables, with checkpoints of its own and a
//! log of what every call got), so a hold meant for B holds B's calls and nobody else's. A hold
//! at the door holds every call that comes through it, so a worker whose client gives up and
//! retries with the same key has every retry held too: its retries are part of the schedule
//! (the release says how many calls waited), and each call's answer, or its client's going
//! away, is told. A worker that gives up while held (exits with no call answered) leaves the
//! moment unstaged: unknown, never a fail.
//!
//! **Staged states, checked.** While a worker is held inside its call, the lab reads the task:
//! it must show that worker's claim, committed (processing, its attempt, a lease), or the check
//! fails naming what it read (a claim left open across the call reads pending). A lease the lab
//! ends by hand (`crash-after-commit`, `stale-completion`: `lease_until` moved into the past,
//! by the database's clock) must be one row updated, or the check is unknown. In
//! `expired-lease` the lease runs out by itself (a fencing token made of `lease_until` is then
//! untouched, as in life): the lab polls the database's clock until it has.
//!
//! Layout: this file holds the world and the checks; [`door`] the doors; [`judge`] the
//! judgements (rows and door logs in, a verdict out), with their tests.

mod door;
mod judge;

use std::future::Future;
use std::time::{Duration, Instant};

use lab_core::Msg;
use lab_core::checkpoint::NotReached;
use lab_services::reports;
use sqlx::PgPool;

use crate::database;
use crate::error::ExerciseError;
use crate::exercise::{Check, Checked, Checks, Exercise, Setup, Subject};
use crate::guest_env::GuestEnv;
use crate::judgement::{Judged, broke, fail, undecided, unknown};
use crate::report_api::read_rows;
use crate::rig::{Program, Rig, World, run_checks};
use crate::verdict::{Line, ReportRow, TaskRow};
use door::{DOOR, Door};
use judge::{
    TaskState, exit_arg, judge_answered, judge_claim, judge_done, judge_expired, judge_held_task,
    judge_lease, judge_race, judge_refused, judge_stale, refused,
};

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
    Check::new("held-task", |w| Box::pin(held_task(w))).restarts(),
    Check::new("claim-race", |w| Box::pin(claim_race(w))).restarts(),
]);

/// The lease a worker is given: long enough never to run out by itself during a check; the lab
/// ends it by hand where a check needs it ended.
const LEASE_SECONDS: u64 = 30;
/// The lease of `expired-lease`'s worker, which runs out by the clock while the worker is held:
/// short, so the check costs about that much, and long enough for a loaded machine to get the
/// worker from its claim to its door first (the lab checks it did: the lease it reads then).
const SHORT_LEASE_SECONDS: u64 = 2;
/// How long a worker may take to process one task, and to reach the report service.
const WORKER_LIMIT: Duration = Duration::from_secs(30);
const REACH_LIMIT: Duration = Duration::from_secs(30);
/// How long the lab waits, beyond what the lease it read says, for that lease to run out by
/// the database's clock.
const EXPIRY_SLACK: Duration = Duration::from_secs(10);
/// How often the lab reads the state it waits for (a lease's end, sessions waiting for its
/// lock): a poll of real state, bounded.
const STATE_POLL: Duration = Duration::from_millis(50);
/// How long a check waits for the service to finish what the check before it handed off.
const SETTLE_LIMIT: Duration = Duration::from_secs(5);
/// The workers a check runs, each with a door of its own to the report service.
const WORKERS: [&str; 2] = ["A", "B"];

/// How a worker run ended.
#[derive(Debug, Clone, Copy)]
enum Exit {
    /// It exited: its code (`None`: a signal ended it).
    Exited(Option<i32>),
    /// It still ran at the bound, and was killed.
    Hung,
}

impl Exit {
    fn of(finished: Result<Option<i32>, ()>) -> Exit {
        finished.map_or(Exit::Hung, Exit::Exited)
    }

    /// Its exit code, if it exited with one.
    fn code(self) -> Option<i32> {
        match self {
            Exit::Exited(code) => code,
            Exit::Hung => None,
        }
    }
}

/// What the worker's checks work with.
pub struct Worker {
    rig: Rig,
    /// The lab's own connections to the run's schema (their application name is the schema's).
    pool: PgPool,
    schema: String,
    /// The role the worker logs in as (on a throwaway server, the run's own): its sessions are
    /// the ones the lab looks at.
    role: String,
    database_url: String,
    strict: bool,
    doors: Vec<Door>,
    /// How each worker run of the current check ended, once the lab saw it.
    exits: Vec<(&'static str, Exit)>,
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
        let rig = Rig::new(&space.run_id, options, Some(Program { dir, manifest }));
        rig.build().await?;
        let mut doors = Vec::new();
        for who in WORKERS {
            doors.push(Door::open(who, pool.clone()).await?);
        }
        let database_url = database::guest_database_url(servers, &space).await?;
        let role = guest_role(&database_url, &pool).await?;
        let world = Worker {
            database_url,
            rig,
            pool,
            schema: space.schema.clone(),
            role,
            strict,
            doors,
            exits: Vec::new(),
        };
        Ok(Checked::Reports(
            run_checks(&CHECKS, world, options, on_report).await?,
        ))
    }
    .await;
    database::release(servers, space).await?;
    result
}

/// The role the worker's sessions log in as: its URL's user, or (a URL without one, on a
/// server the learner gave) the one the lab's own connections get from the same server.
async fn guest_role(url: &str, pool: &PgPool) -> Result<String, ExerciseError> {
    let user = reqwest::Url::parse(url)
        .map(|u| u.username().to_string())
        .unwrap_or_default();
    if !user.is_empty() {
        return Ok(user);
    }
    Ok(sqlx::query_scalar("SELECT current_user::text")
        .fetch_one(pool)
        .await?)
}

/// Where a worker started for a held call got to.
enum Reached {
    /// Its call (and any retry of it) is held.
    Held,
    /// It exited first: its exit code.
    Exited(Option<i32>),
    /// It neither got there nor exited within the bound (it is killed): whether one of the
    /// worker's sessions was waiting for a lock then.
    Never { blocked: bool },
}

impl Worker {
    fn step(&mut self, msg: Msg) {
        self.rig.step(msg);
    }

    fn door(&self, who: &str) -> &Door {
        self.doors
            .iter()
            .find(|door| door.who == who)
            .expect("a worker of the check")
    }

    fn door_mut(&mut self, who: &str) -> &mut Door {
        self.doors
            .iter_mut()
            .find(|door| door.who == who)
            .expect("a worker of the check")
    }

    /// A fresh start for a check: the work the check before handed to the service finished
    /// (its workers are stopped already), the doors' logs and the run's tables emptied.
    async fn begin(&mut self) -> Result<(), ExerciseError> {
        for door in &mut self.doors {
            door.settle(SETTLE_LIMIT).await;
            door.clear();
        }
        self.exits.clear();
        sqlx::query("DELETE FROM reports")
            .execute(&self.pool)
            .await?;
        sqlx::query("DELETE FROM tasks").execute(&self.pool).await?;
        Ok(())
    }

    /// The environment of worker `who` on `task`, taking a lease of `lease` seconds.
    fn env(&self, who: &str, task: i64, lease: u64) -> GuestEnv {
        GuestEnv {
            task_id: Some(task),
            lease_seconds: Some(lease),
            reports_url: Some(self.door(who).url.clone()),
            database_url: Some(self.database_url.clone()),
            worker: Some(who.to_string()),
            strict: Some(self.strict),
            ..self.rig.env()
        }
    }

    async fn launch(&mut self, who: &str, task: i64, lease: u64) -> Result<(), ExerciseError> {
        let env = self.env(who, task, lease);
        self.rig.launch_job(who, env).await
    }

    /// Waits, at most `limit`, for worker `who` to end (at once if the lab saw it end already).
    async fn finish(&mut self, who: &'static str, limit: Duration) -> Exit {
        if let Some((_, exit)) = self.exits.iter().find(|(name, _)| *name == who) {
            return *exit;
        }
        let exit = Exit::of(self.rig.finish_job(who, limit).await);
        self.exits.push((who, exit));
        exit
    }

    /// Runs worker `who` on `task` to its end, told in the schedule.
    async fn run_worker(&mut self, who: &'static str, task: i64) -> Result<(), ExerciseError> {
        self.step(Msg::new("step.run").arg("who", who).arg("task", task));
        self.launch(who, task, LEASE_SECONDS).await?;
        let exit = self.finish(who, WORKER_LIMIT).await;
        self.told_exit(who, exit);
        Ok(())
    }

    /// Waits until `held` (a hold's `entered`) says a call of `who` is held, or `who` exits
    /// first, or the bound passes (`who` is killed then).
    async fn reach(
        &mut self,
        who: &'static str,
        held: impl Future<Output = Result<(), NotReached>>,
    ) -> Reached {
        // The hold's bound ends the wait; the job's is only a backstop, so a worker still
        // running is looked at before it is killed.
        let exit = tokio::select! {
            entered = held => match entered {
                Ok(()) => return Reached::Held,
                Err(_) => Err(()),
            },
            exit = self.rig.finish_job(who, REACH_LIMIT * 2) => exit,
        };
        let blocked = exit.is_err() && self.blocked_sessions().await.unwrap_or(0) > 0;
        self.rig.kill_job(who).await;
        let exit = Exit::of(exit);
        self.exits.push((who, exit));
        match exit {
            Exit::Exited(code) => {
                self.told_exit(who, exit);
                Reached::Exited(code)
            }
            Exit::Hung => {
                self.show_calls(who);
                self.step(
                    Msg::new("step.stopped")
                        .arg("who", who)
                        .arg("seconds", REACH_LIMIT.as_secs()),
                );
                Reached::Never { blocked }
            }
        }
    }

    /// The workers of the check still running, each looked at without waiting (one poll of its
    /// wait); an exit seen is kept.
    fn running(&mut self) -> Vec<&'static str> {
        let mut running = Vec::new();
        for who in WORKERS {
            if self.exits.iter().any(|(name, _)| *name == who) {
                continue;
            }
            let Some(job) = self.rig.job(who) else {
                continue;
            };
            match futures_util::FutureExt::now_or_never(job.finish(WORKER_LIMIT)) {
                Some(exit) => self.exits.push((who, Exit::of(exit))),
                None => running.push(who),
            }
        }
        running
    }

    /// Puts the calls `who`'s door saw, since the schedule last told them, in the schedule.
    fn show_calls(&mut self, who: &str) {
        let calls = self.door_mut(who).unshown();
        for call in calls {
            self.rig.record(Line::Call(call.sent(who)));
        }
    }

    /// Lets every held call of `who`'s go on (saying how many waited), and waits for `who` to
    /// end.
    async fn let_go(&mut self, who: &'static str, hold: lab_core::HoldAll) -> Exit {
        self.step(
            Msg::new("step.release")
                .arg("who", who)
                .arg("calls", hold.arrivals()),
        );
        hold.release();
        let exit = self.finish(who, WORKER_LIMIT).await;
        self.told_exit(who, exit);
        exit
    }

    /// Tells how `who` ended, after what its calls got.
    fn told_exit(&mut self, who: &str, exit: Exit) {
        self.show_calls(who);
        let msg = match exit {
            Exit::Exited(Some(code)) => Msg::new("step.exited").arg("code", i64::from(code)),
            Exit::Exited(None) => Msg::new("step.signalled"),
            Exit::Hung => Msg::new("step.hung").arg("seconds", WORKER_LIMIT.as_secs()),
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

    /// The task as it is now, recorded in the schedule.
    async fn task_state(&mut self, task: i64) -> Result<TaskState, ExerciseError> {
        let (id, status, attempts, report_id, leased, lease_until): (
            i64,
            String,
            i32,
            Option<i64>,
            bool,
            Option<String>,
        ) = sqlx::query_as(
            "SELECT id, status, attempts, report_id,
                    coalesce(lease_until > clock_timestamp(), false), lease_until::text
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
        Ok(TaskState { row, lease_until })
    }

    async fn reports(&mut self, task: i64) -> Result<Vec<ReportRow>, ExerciseError> {
        let rows = read_rows(&self.pool, task).await?;
        self.rig.record(Line::Rows {
            task_id: task,
            rows: rows.clone(),
        });
        Ok(rows)
    }

    /// The database's clock now, as it prints it.
    async fn db_now(&self) -> Result<String, ExerciseError> {
        Ok(sqlx::query_scalar("SELECT clock_timestamp()::text")
            .fetch_one(&self.pool)
            .await?)
    }

    /// The length of the lease on `task`, bounded by what the lab saw: at least what is left of
    /// it now, at most its end less `launched` (the claim ran between the two).
    async fn lease_bounds(
        &self,
        task: i64,
        launched: &str,
    ) -> Result<Option<(f64, f64)>, ExerciseError> {
        let bounds: Option<(Option<f64>, Option<f64>)> = sqlx::query_as(
            "SELECT extract(epoch FROM lease_until - clock_timestamp())::float8,
                    extract(epoch FROM lease_until - $2::timestamptz)::float8
               FROM tasks WHERE id = $1",
        )
        .bind(task)
        .bind(launched)
        .fetch_optional(&self.pool)
        .await?;
        Ok(match bounds {
            Some((Some(at_least), Some(at_most))) => Some((at_least, at_most)),
            _ => None,
        })
    }

    /// Waits, at most `limit`, until the lease on `task` has run out by the database's clock.
    async fn lease_ran_out(&self, task: i64, limit: Duration) -> Result<bool, ExerciseError> {
        let started = Instant::now();
        loop {
            let out: bool = sqlx::query_scalar(
                "SELECT coalesce(lease_until <= clock_timestamp(), false) FROM tasks WHERE id = $1",
            )
            .bind(task)
            .fetch_one(&self.pool)
            .await?;
            if out {
                return Ok(true);
            }
            if started.elapsed() > limit {
                return Ok(false);
            }
            tokio::time::sleep(STATE_POLL).await;
        }
    }

    /// Whether a lease that ended at `lease_until` (as the database printed it) still runs.
    async fn still_runs(&self, lease_until: Option<&str>) -> Result<bool, ExerciseError> {
        let Some(lease_until) = lease_until else {
            return Ok(false);
        };
        Ok(
            sqlx::query_scalar("SELECT $1::timestamptz > clock_timestamp()")
                .bind(lease_until)
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// The lab ends the lease of `task` by hand (the claim's row, moved into the past by the
    /// database's clock); an unknown naming the row if its UPDATE matched none.
    async fn lease_runs_out(&mut self, who: &str, task: i64) -> Judged {
        self.step(Msg::new("step.lease_ends"));
        let ended = sqlx::query(
            "UPDATE tasks SET lease_until = clock_timestamp() - interval '1 second'
              WHERE id = $1 AND status = 'processing'",
        )
        .bind(task)
        .execute(&self.pool)
        .await?
        .rows_affected();
        if ended == 1 {
            return Ok(());
        }
        let row = self.task_state(task).await?.row;
        unknown(
            undecided("lease_not_ended")
                .arg("who", who)
                .arg("task", task)
                .arg("status", row.status.as_str())
                .arg("attempts", i64::from(row.attempts)),
        )
    }

    /// The queries of the worker's sessions that sit inside an open transaction (sessions of
    /// the worker's role; the lab's own and the service's carry the run's schema as their
    /// application name).
    async fn open_transactions(&self) -> Result<Vec<String>, ExerciseError> {
        Ok(sqlx::query_scalar(
            "SELECT coalesce(query, '') FROM pg_stat_activity
              WHERE datname = current_database() AND usename = $1 AND application_name <> $2
                AND state LIKE 'idle in transaction%'
              ORDER BY pid",
        )
        .bind(&self.role)
        .bind(&self.schema)
        .fetch_all(&self.pool)
        .await?)
    }

    /// How many of the worker's sessions wait for a lock another session holds.
    async fn blocked_sessions(&self) -> Result<i64, ExerciseError> {
        Ok(sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND usename = $1 AND application_name <> $2
                AND cardinality(pg_blocking_pids(pid)) > 0",
        )
        .bind(&self.role)
        .bind(&self.schema)
        .fetch_one(&self.pool)
        .await?)
    }

    /// How many of the worker's sessions wait behind the lab's session `lab`: for a lock it
    /// holds, or behind a session that does (any lock type, followed through the chain).
    async fn behind(&self, lab: i32) -> Result<i64, ExerciseError> {
        Ok(sqlx::query_scalar(
            "WITH RECURSIVE behind(pid) AS (
                 SELECT $1::int
               UNION
                 SELECT a.pid FROM pg_stat_activity a JOIN behind b
                     ON b.pid = ANY (pg_blocking_pids(a.pid))
             )
             SELECT count(*) FROM pg_stat_activity a JOIN behind USING (pid)
              WHERE a.pid <> $1 AND a.usename = $2 AND a.application_name <> $3",
        )
        .bind(lab)
        .bind(&self.role)
        .bind(&self.schema)
        .fetch_one(&self.pool)
        .await?)
    }

    /// The first call of `who`'s for `task` the service refused, named (the key's owner read
    /// back for a 409); a pass when none was.
    async fn judge_calls(&mut self, who: &str, task: i64) -> Judged {
        let calls = self.door(who).calls();
        let Some(call) = refused(&calls) else {
            return Ok(());
        };
        let other: Option<i64> = match &call.key {
            Some(key) => {
                sqlx::query_scalar("SELECT task_id FROM reports WHERE idempotency_key = $1")
                    .bind(key)
                    .fetch_optional(&self.pool)
                    .await?
            }
            None => None,
        };
        judge_refused(who, task, call, other)
    }

    /// Why worker `who` was not held: the verdict that says what the lab saw. `taking_over`:
    /// the lab had ended the lease of the task before `who` started.
    async fn not_held(
        &mut self,
        who: &str,
        task: i64,
        reached: Reached,
        taking_over: bool,
    ) -> Judged {
        match reached {
            Reached::Held => Ok(()),
            Reached::Exited(code) => {
                self.judge_calls(who, task).await?;
                let row = self.task_state(task).await?.row;
                let calls = self.door(who).calls().len();
                let said = if calls == 0 && taking_over {
                    broke("not_taken_over")
                } else if calls == 0 {
                    broke("no_call")
                } else {
                    undecided("not_held").arg("calls", calls)
                };
                let said = said
                    .arg("who", who)
                    .arg("task", task)
                    .arg("code", exit_arg(code))
                    .arg("status", row.status.as_str())
                    .arg("attempts", i64::from(row.attempts));
                if calls == 0 {
                    fail(said)
                } else {
                    unknown(said)
                }
            }
            Reached::Never { blocked } => {
                let key = if blocked { "blocked" } else { "never_reached" };
                unknown(
                    undecided(key)
                        .arg("who", who)
                        .arg("seconds", REACH_LIMIT.as_secs()),
                )
            }
        }
    }

    /// Starts worker `who` on `task` with its calls held at its door, and checks, once one is,
    /// that the task shows its claim (attempt `attempts`, a lease, running if `running`).
    async fn held_at_door(
        &mut self,
        who: &'static str,
        task: i64,
        attempts: i32,
        lease: u64,
        running: bool,
    ) -> Judged<(lab_core::HoldAll, TaskState)> {
        let hold = self.door(who).checkpoints.hold_all(DOOR);
        self.launch(who, task, lease).await?;
        let reached = self.reach(who, hold.entered(REACH_LIMIT)).await;
        // Every way but held ends the check here.
        self.not_held(who, task, reached, attempts > 1).await?;
        self.step(Msg::new("step.held").arg("who", who));
        let state = self.task_state(task).await?;
        judge_claim(who, &state, attempts, running)?;
        Ok((hold, state))
    }
}

impl World for Worker {
    fn rig(&mut self) -> &mut Rig {
        &mut self.rig
    }

    /// The calls the check's workers made that the schedule has not told yet.
    async fn after(&mut self) {
        for who in WORKERS {
            self.show_calls(who);
        }
    }

    async fn close(self) {
        for door in self.doors {
            door.close().await;
        }
        self.rig.close().await;
    }
}

/// A statement on one line, its runs of whitespace made one space.
fn one_line(sql: &str) -> String {
    sql.split_whitespace().collect::<Vec<_>>().join(" ")
}

async fn complete(w: &mut Worker) -> Judged {
    w.begin().await?;
    // Two tasks, one worker each: a key that names the kind of report, not the task, makes
    // the second task's call a reuse of the first's key.
    for (who, task) in [("A", 1), ("B", 2)] {
        w.new_task(task).await?;
        w.run_worker(who, task).await?;
        let rows = w.reports(task).await?;
        let row = w.task_state(task).await?.row;
        w.judge_calls(who, task).await?;
        judge_done(&row, &rows, 1)?;
    }
    Ok(())
}

async fn crash_after_commit(w: &mut Worker) -> Judged {
    w.begin().await?;
    let task = 3;
    w.new_task(task).await?;
    w.step(
        Msg::new("step.run_held_commit")
            .arg("who", "A")
            .arg("task", task),
    );
    // Every answer A's calls would get is held: the first once its report is committed, and a
    // retry (a replay of that report) before it goes out.
    let checkpoints = w.door("A").checkpoints.clone();
    let committed = checkpoints.hold_all(reports::COMMITTED);
    let answered = checkpoints.hold_all(reports::ANSWERED);
    w.launch("A", task, LEASE_SECONDS).await?;
    let reached = w.reach("A", committed.entered(REACH_LIMIT)).await;
    w.not_held("A", task, reached, false).await?;
    let held = w.task_state(task).await?;
    judge_claim("A", &held, 1, true)?;
    w.step(Msg::new("step.kill").arg("who", "A"));
    w.rig.kill_job("A").await;
    // The service goes on: its answer reaches no one.
    drop((committed, answered));
    w.reports(task).await?;
    w.lease_runs_out("A", task).await?;
    w.run_worker("B", task).await?;
    let rows = w.reports(task).await?;
    let row = w.task_state(task).await?.row;
    w.judge_calls("B", task).await?;
    judge_done(&row, &rows, 2)
}

async fn stale_completion(w: &mut Worker) -> Judged {
    w.begin().await?;
    let task = 4;
    w.new_task(task).await?;
    w.step(Msg::new("step.run_held").arg("who", "A").arg("task", task));
    let (held_a, _) = w.held_at_door("A", task, 1, LEASE_SECONDS, true).await?;
    w.lease_runs_out("A", task).await?;
    // B takes the task over and is held inside its call too: B holds the task, with a lease
    // that runs, when A comes back.
    w.step(Msg::new("step.run_held").arg("who", "B").arg("task", task));
    let (held_b, taken_over) = w.held_at_door("B", task, 2, LEASE_SECONDS, true).await?;
    let exit = w.let_go("A", held_a).await;
    let after_a = w.task_state(task).await?;
    // Only A ran since the lab read the row: whatever changed is A's write.
    judge_stale(&taken_over, &after_a)?;
    judge_answered("A", &w.door("A").calls(), exit.code())?;
    w.let_go("B", held_b).await;
    let rows = w.reports(task).await?;
    let row = w.task_state(task).await?.row;
    w.judge_calls("B", task).await?;
    judge_done(&row, &rows, taken_over.row.attempts)
}

async fn expired_lease(w: &mut Worker) -> Judged {
    w.begin().await?;
    let task = 5;
    w.new_task(task).await?;
    let strict = w.strict;
    w.step(Msg::new(if strict {
        "step.mode_strict"
    } else {
        "step.mode_lenient"
    }));
    w.step(
        Msg::new("step.run_short_lease")
            .arg("who", "A")
            .arg("task", task)
            .arg("lease", SHORT_LEASE_SECONDS),
    );
    let launched = w.db_now().await?;
    let (hold, _) = w
        .held_at_door("A", task, 1, SHORT_LEASE_SECONDS, false)
        .await?;
    if let Some((at_least, at_most)) = w.lease_bounds(task, &launched).await? {
        judge_lease("A", task, at_least, at_most, SHORT_LEASE_SECONDS)?;
    }
    w.step(Msg::new("step.lease_waits").arg("who", "A"));
    let limit = Duration::from_secs(SHORT_LEASE_SECONDS) + EXPIRY_SLACK;
    if !w.lease_ran_out(task, limit).await? {
        return unknown(
            undecided("lease_not_out")
                .arg("who", "A")
                .arg("task", task)
                .arg("seconds", limit.as_secs()),
        );
    }
    let before = w.task_state(task).await?;
    let exit = w.let_go("A", hold).await;
    let rows = w.reports(task).await?;
    let after = w.task_state(task).await?;
    if after.changes_since(&before).is_empty() {
        judge_answered("A", &w.door("A").calls(), exit.code())?;
    }
    w.judge_calls("A", task).await?;
    judge_expired(strict, &before, &after, &rows)
}

async fn no_open_transaction(w: &mut Worker) -> Judged {
    w.begin().await?;
    let task = 6;
    w.new_task(task).await?;
    w.step(Msg::new("step.run_held").arg("who", "A").arg("task", task));
    let hold = w.door("A").checkpoints.hold_all(DOOR);
    w.launch("A", task, LEASE_SECONDS).await?;
    let reached = w.reach("A", hold.entered(REACH_LIMIT)).await;
    w.not_held("A", task, reached, false).await?;
    w.step(Msg::new("step.held").arg("who", "A"));
    let open = w.open_transactions().await?;
    w.step(Msg::new("step.open_transactions").arg("count", open.len()));
    if let Some(query) = open.first() {
        w.let_go("A", hold).await;
        return fail(
            broke("open_transaction")
                .arg("count", open.len())
                .arg("query", crate::call::cut(&one_line(query))),
        );
    }
    let held = w.task_state(task).await?;
    judge_claim("A", &held, 1, true)?;
    w.let_go("A", hold).await;
    let rows = w.reports(task).await?;
    let row = w.task_state(task).await?.row;
    w.judge_calls("A", task).await?;
    judge_done(&row, &rows, 1)
}

async fn held_task(w: &mut Worker) -> Judged {
    w.begin().await?;
    let task = 7;
    w.new_task(task).await?;
    w.step(Msg::new("step.run_held").arg("who", "A").arg("task", task));
    let (held_a, held) = w.held_at_door("A", task, 1, LEASE_SECONDS, true).await?;
    // B runs while A holds the task under a running lease. B's calls are held too: a call from
    // B means B took the task, and the lab reads the row while B is still inside it.
    w.step(
        Msg::new("step.run_beside")
            .arg("who", "B")
            .arg("task", task),
    );
    let hold_b = w.door("B").checkpoints.hold_all(DOOR);
    w.launch("B", task, LEASE_SECONDS).await?;
    let reached = w.reach("B", hold_b.entered(REACH_LIMIT)).await;
    if matches!(reached, Reached::Never { .. }) {
        return w.not_held("B", task, reached, false).await;
    }
    if matches!(reached, Reached::Held) {
        w.step(Msg::new("step.held").arg("who", "B"));
    }
    let after_b = w.task_state(task).await?;
    let a_lease_ran = w.still_runs(held.lease_until.as_deref()).await?;
    judge_held_task(&held, &after_b, w.door("B").calls().len(), a_lease_ran)?;
    let exit = w.let_go("A", held_a).await;
    let rows = w.reports(task).await?;
    let row = w.task_state(task).await?;
    if row.changes_since(&held).is_empty() {
        judge_answered("A", &w.door("A").calls(), exit.code())?;
    }
    w.judge_calls("A", task).await?;
    judge_done(&row.row, &rows, 1)
}

async fn claim_race(w: &mut Worker) -> Judged {
    w.begin().await?;
    let task = 8;
    w.new_task(task).await?;
    // SHARE: every worker may read tasks, none may write it, so each gets as far as its first
    // write (or the lock its claim takes first) and waits there, whatever it read.
    let mut lock = w.pool.begin().await?;
    sqlx::query("LOCK TABLE tasks IN SHARE MODE")
        .execute(&mut *lock)
        .await?;
    let lab: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *lock)
        .await?;
    w.step(Msg::new("step.race_lock"));
    // Every call is held at its door: a worker that won its claim stays inside its call, so
    // the other's claim is decided while the winner holds the task, however the two are
    // scheduled once they go on.
    let holds = [
        w.door("A").checkpoints.hold_all(DOOR),
        w.door("B").checkpoints.hold_all(DOOR),
    ];
    w.step(Msg::new("step.race_run").arg("task", task));
    for who in WORKERS {
        w.launch(who, task, LEASE_SECONDS).await?;
    }
    let started = Instant::now();
    let (waiting, running) = loop {
        let waiting = w.behind(lab).await?;
        let running = w.running().len() as i64;
        if waiting >= running {
            break (waiting, running);
        }
        if started.elapsed() > REACH_LIMIT {
            lock.rollback().await?;
            return unknown(
                undecided("race_not_staged")
                    .arg("seconds", REACH_LIMIT.as_secs())
                    .arg("waiting", waiting)
                    .arg("running", running),
            );
        }
        tokio::time::sleep(STATE_POLL).await;
    };
    w.step(
        Msg::new("step.race_waiting")
            .arg("sessions", waiting)
            .arg("exited", WORKERS.len() as i64 - running),
    );
    lock.commit().await?;
    w.step(Msg::new("step.race_release"));
    // Each claim is decided: its worker is inside its call, or gone.
    let started = Instant::now();
    let mut first_seen = false;
    let held = loop {
        let running = w.running();
        let held: Vec<&str> = WORKERS
            .into_iter()
            .zip(&holds)
            .filter(|(_, hold)| hold.arrivals() > 0)
            .map(|(who, _)| who)
            .collect();
        // The first worker inside its call must have its claim there for the other to see
        // (a claim left open across the call would keep the other waiting on its lock).
        if let Some(first) = held.first()
            && !first_seen
        {
            first_seen = true;
            w.step(Msg::new("step.held").arg("who", *first));
            let state = w.task_state(task).await?;
            if state.row.status == "pending" {
                judge_claim(first, &state, 1, true)?;
            }
        }
        if running.iter().all(|who| held.contains(who)) {
            break held;
        }
        if started.elapsed() > REACH_LIMIT {
            let who = running.into_iter().find(|who| !held.contains(who));
            let who = who.expect("a worker neither held nor gone");
            let blocked = w.blocked_sessions().await? > 0;
            w.rig.kill_job(who).await;
            return w
                .not_held(who, task, Reached::Never { blocked }, false)
                .await;
        }
        tokio::time::sleep(STATE_POLL).await;
    };
    for who in WORKERS {
        if !held.contains(&who) {
            let exit = w.finish(who, WORKER_LIMIT).await;
            w.told_exit(who, exit);
        }
    }
    w.step(Msg::new("step.race_held").arg("held", held.len()));
    let claimed = w.task_state(task).await?.row;
    judge_race(&claimed, &held)?;
    for (who, hold) in WORKERS.into_iter().zip(holds) {
        if held.contains(&who) {
            w.let_go(who, hold).await;
        }
    }
    let rows = w.reports(task).await?;
    let row = w.task_state(task).await?.row;
    for who in held {
        w.judge_calls(who, task).await?;
    }
    judge_done(&row, &rows, 1)
}
