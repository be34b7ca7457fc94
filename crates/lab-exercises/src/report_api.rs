//! Exercise `report-api` (lesson 6, §4 and §8): the learner's `POST /reports` with an
//! Idempotency-Key, attacked the way the lesson's scenarios attack the lab's own service. The
//! oracle is the `reports` table, read by the lab: never the service's own answers.
//!
//! | check         | the schedule                                                        | the invariant                          |
//! |---------------|---------------------------------------------------------------------|----------------------------------------|
//! | `replay`      | one key, the same content twice                                     | one report; 201, then 200 `replayed`   |
//! | `no-key`      | no key, twice                                                       | two reports                            |
//! | `conflict`    | one key, then the same key with another report type, and with another task | 409 each time, and no second report |
//! | `invalid-key` | an empty, a blank and a 256-character key                           | 400 with a JSON body; no report        |
//! | `lost-answer` | the answer dropped by the fault proxy after the service answered    | the retry finds the one report         |
//! | `timeout`     | the answer held 900 ms, the client gives up at 150 ms               | the retry finds the one report         |
//! | `race`        | two requests with one key, held at the database until both wait, then let go together | one report, no 5xx |
//! | `burst`       | seeded bursts of concurrent same-key requests, repeated             | one report per key, no 5xx             |
//! | `crash`       | the service SIGKILLed right after the COMMIT, started again         | the retry finds the one report         |
//! | `hostile`     | malformed bodies and headers                                        | never a 5xx; a 4xx has a JSON body     |
//!
//! Two of them need a moment the service does not show from outside, and take it from
//! PostgreSQL instead of a sleep:
//!
//! - `race` locks `reports` against writes (`SHARE ROW EXCLUSIVE`: reads still pass) in a
//!   transaction of the lab's own, sends the two requests, and waits until each of them is
//!   blocked, directly or through the other, on the lab's transaction (`pg_blocking_pids`,
//!   followed link by link: a row, an advisory lock, a key table of the service's own, whatever
//!   the design waits on). Then it rolls back: both go on at the same instant, each having made
//!   whatever check it makes before its write. The requests that answered meanwhile (a design
//!   that refuses a request in progress) count as having reached their moment too.
//! - `crash` listens on a channel the lab's trigger on `reports` notifies (a notification is
//!   delivered only once its transaction has committed) and kills the service when it comes.

use std::time::{Duration, Instant};

use faultproxy::Fault;
use futures_util::future::join_all;
use lab_core::Msg;
use rand::rngs::ChaCha8Rng;
use rand::{RngExt as _, SeedableRng as _};
use sqlx::{AssertSqlSafe, PgPool};

use crate::call::{Call, send};
use crate::database;
use crate::error::ExerciseError;
use crate::exercise::{Check, Checked, Checks, Exercise, Setup, Subject};
use crate::judgement::{Judged, broke, fail, undecided, unknown};
use crate::lab_side::STAGING_LIMIT;
use crate::rig::{Program, Rig, World, run_checks};
use crate::verdict::{Line, Outcome, ReportRow, Sent, who};

pub static EXERCISE: Exercise = Exercise {
    name: "report-api",
    lesson: "reports",
    needs: lab_infra::Needs::POSTGRES,
    langs: &["python", "rust"],
    rust_uses_idem: false,
    checks: &CHECKS,
    open: |setup| Box::pin(open(setup)),
};

static CHECKS: Checks<ReportApi> = Checks(&[
    Check::new("replay", |w| Box::pin(replay(w))).starter_fails(),
    Check::new("no-key", |w| Box::pin(no_key(w))),
    Check::new("conflict", |w| Box::pin(conflict(w))).starter_fails(),
    Check::new("invalid-key", |w| Box::pin(invalid_key(w))).starter_fails(),
    Check::new("lost-answer", |w| Box::pin(lost_answer(w))).starter_fails(),
    Check::new("timeout", |w| Box::pin(timeout(w))).starter_fails(),
    Check::new("race", |w| Box::pin(race(w))).starter_fails(),
    Check::new("burst", |w| Box::pin(burst(w)))
        .seeded()
        .starter_fails(),
    Check::new("crash", |w| Box::pin(crash(w)))
        .restarts()
        .starter_fails(),
    Check::new("hostile", |w| Box::pin(hostile(w))).seeded(),
]);

/// How long the answer is held on its way back, and how long the client waits (the lesson's
/// numbers).
const HELD_ANSWER: Duration = Duration::from_millis(900);
const CLIENT_TIMEOUT: Duration = Duration::from_millis(150);
/// How long a patient call waits: far longer than any of the learner's handlers should take.
const PATIENT: Duration = Duration::from_secs(10);
/// How often PostgreSQL's locks are read while the race's requests gather: a poll for a state,
/// not a wait for an order.
const LOCK_POLL: Duration = Duration::from_millis(10);
/// How many requests race in `race`.
const RACERS: usize = 2;
/// Concurrent requests per burst, and the spread of their starts.
const BURST_SIZE: usize = 8;
const BURST_SPREAD_MS: u64 = 20;

/// What the report-api checks work with.
pub struct ReportApi {
    rig: Rig,
    /// The lab's own connections to the service's schema: the oracle, and the race's lock.
    pool: PgPool,
    /// The channel PostgreSQL notifies when a report is committed (payload: its task id);
    /// `None` with `--target`, where the lab installs nothing.
    commit_channel: Option<String>,
    /// The service, reached directly and through the fault proxy.
    direct: String,
    proxied: String,
    proxy: faultproxy::Proxy,
    /// Task ids are `task_base + n`: small and readable in a run's own schema, far from
    /// anything already there in a target's.
    task_base: i64,
}

/// Which way a call goes.
#[derive(Debug, Clone, Copy)]
enum Via {
    Direct,
    Proxy,
}

async fn open(setup: Setup<'_>) -> Result<Checked, ExerciseError> {
    let Setup {
        subject,
        servers,
        options,
        on_report,
    } = setup;
    match subject {
        Subject::Program { dir, manifest } => {
            let space = database::open_space(servers).await?;
            let result = async {
                let pool = space.pg.clone().expect("the run has PostgreSQL");
                let channel = format!("lab_{}_committed", space.run_id);
                install_commit_notice(&pool, &channel).await?;
                let mut rig = Rig::new(&space.run_id, options, Some(Program { dir, manifest }));
                rig.build().await?;
                let mut env = rig.env();
                env.database_url = Some(database::guest_database_url(servers, &space).await?);
                if let Err(not_ready) = rig.start_service(env).await? {
                    rig.close().await;
                    return Ok(Checked::NotReady(not_ready));
                }
                let direct = rig.service_url();
                let world = ReportApi::open(rig, pool, Some(channel), direct, 0).await?;
                Ok(Checked::Reports(
                    run_checks(&CHECKS, world, options, on_report).await?,
                ))
            }
            .await;
            database::release(servers, space).await?;
            result
        }
        Subject::Target { url } => {
            let postgres = servers
                .postgres
                .as_ref()
                .ok_or(ExerciseError::ServerMissing("PostgreSQL"))?;
            if postgres.origin != lab_infra::Origin::Given {
                return Err(ExerciseError::TargetNeedsDatabase);
            }
            let run = lab_infra::space::new_run_id();
            // Far from any task id already in the service's table.
            let task_base = 1_000_000_000
                + i64::from(u32::from_str_radix(&run, 16).unwrap_or(0) % 1_000_000) * 1000;
            let rig = Rig::new(&run, options, None);
            let world = ReportApi::open(
                rig,
                postgres.admin.clone(),
                None,
                url.trim_end_matches('/').to_string(),
                task_base,
            )
            .await?;
            Ok(Checked::Reports(
                run_checks(&CHECKS, world, options, on_report).await?,
            ))
        }
    }
}

/// The trigger that tells the lab when a report is committed: PostgreSQL delivers a
/// notification only once its transaction has committed, so the `crash` check can kill the
/// program right after the COMMIT. It changes nothing the program sees.
async fn install_commit_notice(pool: &PgPool, channel: &str) -> Result<(), ExerciseError> {
    // `channel` is made of the run id (hex digits) only.
    let sql = format!(
        "CREATE FUNCTION lab_report_committed() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN PERFORM pg_notify('{channel}', NEW.task_id::text); RETURN NEW; END $$;
         CREATE TRIGGER lab_report_committed AFTER INSERT ON reports
             FOR EACH ROW EXECUTE FUNCTION lab_report_committed();"
    );
    sqlx::raw_sql(AssertSqlSafe(sql)).execute(pool).await?;
    Ok(())
}

impl ReportApi {
    async fn open(
        rig: Rig,
        pool: PgPool,
        commit_channel: Option<String>,
        direct: String,
        task_base: i64,
    ) -> Result<ReportApi, ExerciseError> {
        let upstream = reqwest::Url::parse(&direct)
            .ok()
            .filter(|u| u.scheme() == "http")
            .and_then(|u| Some(format!("{}:{}", u.host_str()?, u.port_or_known_default()?)))
            .ok_or_else(|| ExerciseError::NotHttpUrl(direct.clone()))?;
        let proxy = rig.proxy("service", &upstream).await?;
        Ok(ReportApi {
            proxied: format!("http://{}", proxy.listen_addr()),
            rig,
            pool,
            commit_channel,
            direct,
            proxy,
            task_base,
        })
    }

    fn task(&self, n: i64) -> i64 {
        self.task_base + n
    }

    fn key(&self, task: i64) -> String {
        format!("report-{}-{task}", self.rig.run)
    }

    fn step(&mut self, msg: Msg) {
        self.rig.step(msg);
    }

    /// A call of the lesson's request for `task` as `who`, `via` a way, with `key`.
    fn call(&self, who: &str, via: Via, key: Option<&str>, body: String) -> Call {
        let base = match via {
            Via::Direct => &self.direct,
            Via::Proxy => &self.proxied,
        };
        Call::post(who, format!("{base}/reports"), key, body, PATIENT)
    }

    async fn send(&mut self, call: Call) -> Sent {
        self.rig.send(call).await
    }

    /// The lesson's request for `task` (a monthly report), sent by the client.
    async fn send_monthly(&mut self, via: Via, key: Option<&str>, task: i64) -> Sent {
        let call = self.call("client", via, key, report_body(task, "monthly"));
        self.send(call).await
    }

    /// Reads back the reports of `task`, and records them.
    async fn rows(&mut self, task: i64) -> Result<Vec<ReportRow>, ExerciseError> {
        let rows = read_rows(&self.pool, task).await?;
        self.rig.record(Line::Rows {
            task_id: task,
            rows: rows.clone(),
        });
        Ok(rows)
    }
}

impl World for ReportApi {
    fn rig(&mut self) -> &mut Rig {
        &mut self.rig
    }

    async fn after(&mut self) {
        self.proxy.disarm_all_faults();
    }

    async fn close(self) {
        self.rig.close().await;
    }
}

/// The lesson's request body.
pub fn report_body(task: i64, report_type: &str) -> String {
    serde_json::json!({"task_id": task, "report_type": report_type}).to_string()
}

/// The reports of `task`, oldest first.
pub async fn read_rows(pool: &PgPool, task: i64) -> Result<Vec<ReportRow>, ExerciseError> {
    let rows: Vec<(i64, i64, String, Option<String>)> = sqlx::query_as(
        "SELECT id, task_id, report_type, idempotency_key FROM reports WHERE task_id = $1 ORDER BY id",
    )
    .bind(task)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, task_id, report_type, idempotency_key)| ReportRow {
            id,
            task_id,
            report_type,
            idempotency_key,
        })
        .collect())
}

// The judgements: pure functions of what came back and what the table holds.

/// A 5xx among `calls`: the service failed where it should have answered.
fn no_server_error(calls: &[&Sent]) -> Judged {
    match calls.iter().find(|c| c.status.is_some_and(|s| s >= 500)) {
        Some(c) => fail(
            broke("server_error")
                .arg("who", who(&c.who))
                .arg("status", c.status_arg()),
        ),
        None => Ok(()),
    }
}

/// The one report the invariant allows.
fn one_report(rows: &[ReportRow], task: i64) -> Judged<&ReportRow> {
    match rows {
        [row] => Ok(row),
        _ => fail(broke("reports").arg("task", task).arg("count", rows.len())),
    }
}

fn status_is(call: &Sent, expected: u16) -> Judged {
    if call.status == Some(expected) {
        return Ok(());
    }
    fail(
        broke("status")
            .arg("who", who(&call.who))
            .arg("expected", i64::from(expected))
            .arg("got", call.status_arg()),
    )
}

/// An answer that names `row`'s report.
fn names_the_report(call: &Sent, row: &ReportRow) -> Judged {
    if call.report_id == Some(row.id) {
        return Ok(());
    }
    let got = match call.report_id {
        Some(id) => lab_core::Arg::Int(id),
        None => lab_core::Arg::Msg(Msg::new("check.no_report_id")),
    };
    fail(
        broke("other_id")
            .arg("who", who(&call.who))
            .arg("got", got)
            .arg("id", row.id),
    )
}

/// A replay that names the stored report: 200, `replayed: true`, and the row's id.
fn replays(call: &Sent, row: &ReportRow) -> Judged {
    status_is(call, 200)?;
    names_the_report(call, row)?;
    if call.replayed != Some(true) {
        return fail(broke("not_replayed").arg("who", who(&call.who)));
    }
    Ok(())
}

/// A 4xx refusal must carry a JSON body.
fn json_refusal(call: &Sent, expected: u16) -> Judged {
    status_is(call, expected)?;
    if !call.json_body {
        return fail(broke("not_json").arg("who", who(&call.who)));
    }
    Ok(())
}

/// Requests that raced on one key, judged: one report, one 201, and replays naming it. The two
/// ways a check before the write breaks are named as such: both requests inserted (nothing
/// excluded the other), or the loser hit the guard and was answered with an error.
fn judge_race(calls: &[Sent], rows: &[ReportRow], task: i64) -> Judged {
    if let Some(loser) = calls.iter().find(|c| c.status.is_some_and(|s| s >= 500)) {
        return fail(
            broke("race_loser")
                .arg("who", who(&loser.who))
                .arg("status", loser.status_arg()),
        );
    }
    if rows.len() > 1 {
        return fail(
            broke("race_reports")
                .arg("task", task)
                .arg("count", rows.len()),
        );
    }
    let row = one_report(rows, task)?;
    let created = calls.iter().filter(|c| c.status == Some(201)).count();
    if created != 1 {
        return fail(broke("created").arg("count", created));
    }
    for call in calls.iter().filter(|c| c.status != Some(201)) {
        replays(call, row)?;
    }
    for call in calls.iter().filter(|c| c.status == Some(201)) {
        names_the_report(call, row)?;
    }
    Ok(())
}

// The checks.

async fn replay(a: &mut ReportApi) -> Judged {
    let task = a.task(1);
    let key = a.key(task);
    a.step(Msg::new("step.replay"));
    let first = a.send_monthly(Via::Direct, Some(&key), task).await;
    let second = a.send_monthly(Via::Direct, Some(&key), task).await;
    let rows = a.rows(task).await?;
    no_server_error(&[&first, &second])?;
    let row = one_report(&rows, task)?;
    status_is(&first, 201)?;
    replays(&second, row)
}

async fn no_key(a: &mut ReportApi) -> Judged {
    let task = a.task(2);
    a.step(Msg::new("step.no_key"));
    let first = a.send_monthly(Via::Direct, None, task).await;
    let second = a.send_monthly(Via::Direct, None, task).await;
    let rows = a.rows(task).await?;
    no_server_error(&[&first, &second])?;
    status_is(&first, 201)?;
    status_is(&second, 201)?;
    if rows.len() != 2 {
        return fail(broke("keyless").arg("task", task).arg("count", rows.len()));
    }
    Ok(())
}

async fn conflict(a: &mut ReportApi) -> Judged {
    let task = a.task(3);
    let other_task = a.task(13);
    let key = a.key(task);
    a.step(Msg::new("step.conflict"));
    let first = a.send_monthly(Via::Direct, Some(&key), task).await;
    // Each part of the content changed on its own, under the one key.
    let call = a.call(
        "client",
        Via::Direct,
        Some(&key),
        report_body(task, "yearly"),
    );
    let other_type = a.send(call).await;
    a.step(Msg::new("step.conflict_task").arg("task", other_task));
    let call = a.call(
        "client",
        Via::Direct,
        Some(&key),
        report_body(other_task, "monthly"),
    );
    let other_task_sent = a.send(call).await;
    let rows = a.rows(task).await?;
    let other_rows = a.rows(other_task).await?;
    no_server_error(&[&first, &other_type, &other_task_sent])?;
    one_report(&rows, task)?;
    status_is(&first, 201)?;
    for (sent, field) in [(&other_type, "report_type"), (&other_task_sent, "task_id")] {
        if sent.status != Some(409) {
            return fail(
                broke("not_conflict")
                    .arg("field", field)
                    .arg("got", sent.status_arg()),
            );
        }
        json_refusal(sent, 409)?;
    }
    if !other_rows.is_empty() {
        return fail(
            broke("conflict_stored")
                .arg("task", other_task)
                .arg("count", other_rows.len()),
        );
    }
    Ok(())
}

async fn invalid_key(a: &mut ReportApi) -> Judged {
    let task = a.task(4);
    a.step(Msg::new("step.invalid_key"));
    let long = "k".repeat(256);
    let mut calls = Vec::new();
    for key in ["", "   ", long.as_str()] {
        let call = a.call(
            "client",
            Via::Direct,
            Some(key),
            report_body(task, "monthly"),
        );
        calls.push(a.send(call).await);
    }
    let rows = a.rows(task).await?;
    no_server_error(&calls.iter().collect::<Vec<_>>())?;
    for call in &calls {
        json_refusal(call, 400)?;
    }
    if !rows.is_empty() {
        return fail(
            broke("invalid_stored")
                .arg("task", task)
                .arg("count", rows.len()),
        );
    }
    Ok(())
}

/// After a first call whose answer never came: the retry with the same key and content must
/// find the one report.
async fn retry_finds_the_report(a: &mut ReportApi, task: i64, key: &str) -> Judged {
    a.rows(task).await?;
    a.step(Msg::new("step.retry"));
    let retry = a.send_monthly(Via::Direct, Some(key), task).await;
    let rows = a.rows(task).await?;
    no_server_error(&[&retry])?;
    replays(&retry, one_report(&rows, task)?)
}

/// Whether an armed fault fired within the staging limit.
async fn fired(armed: &faultproxy::ArmedFault) -> bool {
    tokio::time::timeout(STAGING_LIMIT, armed.fired())
        .await
        .is_ok()
}

async fn lost_answer(a: &mut ReportApi) -> Judged {
    let task = a.task(5);
    let key = a.key(task);
    a.step(Msg::new("step.lost_armed"));
    let armed = a.proxy.arm(Fault::ResponseLostAfterCommit, 1);
    let first = a.send_monthly(Via::Proxy, Some(&key), task).await;
    if !fired(&armed).await || first.outcome != Outcome::Unknown {
        return unknown(undecided("fault_not_fired"));
    }
    retry_finds_the_report(a, task, &key).await
}

async fn timeout(a: &mut ReportApi) -> Judged {
    let task = a.task(6);
    let key = a.key(task);
    a.step(
        Msg::new("step.timeout_armed")
            .arg("held", HELD_ANSWER)
            .arg("patience", CLIENT_TIMEOUT),
    );
    let armed = a.proxy.arm(Fault::SlowResponse(HELD_ANSWER), 1);
    let mut call = a.call(
        "client",
        Via::Proxy,
        Some(&key),
        report_body(task, "monthly"),
    );
    call.timeout = CLIENT_TIMEOUT;
    let first = a.send(call).await;
    // The service answered (the proxy holds that answer): its work is over, so the retry
    // meets a finished first request, as in the lesson.
    if !fired(&armed).await || first.outcome != Outcome::Unknown {
        return unknown(undecided("not_held"));
    }
    retry_finds_the_report(a, task, &key).await
}

/// How many backends wait, directly or through one another, for the backend `lab`: the
/// closure of `pg_blocking_pids` (any lock: a transaction id, a row, an advisory lock, a
/// relation), without `lab` itself.
async fn blocked_on(pool: &PgPool, lab: i32) -> Result<i64, ExerciseError> {
    Ok(sqlx::query_scalar(
        "WITH RECURSIVE waits(pid, blocker) AS (
             SELECT pid, unnest(pg_blocking_pids(pid)) FROM pg_stat_activity
              WHERE datname = current_database()
         ), reach(pid) AS (
             SELECT pid FROM waits WHERE blocker = $1
             UNION
             SELECT w.pid FROM waits w JOIN reach r ON w.blocker = r.pid
         )
         SELECT count(*) FROM reach WHERE pid <> $1",
    )
    .bind(lab)
    .fetch_one(pool)
    .await?)
}

async fn race(a: &mut ReportApi) -> Judged {
    let task = a.task(7);
    let key = a.key(task);
    a.step(Msg::new("step.race_hold").arg("count", RACERS));
    // Writes to `reports` wait for the lab from now on; reads do not, so each request makes
    // whatever check it makes before its write, and stops at the write (or earlier, behind the
    // other request's lock).
    let mut held = a.pool.begin().await?;
    sqlx::query("LOCK TABLE reports IN SHARE ROW EXCLUSIVE MODE")
        .execute(&mut *held)
        .await?;
    let lab: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *held)
        .await?;
    let calls: Vec<_> = (1..=RACERS)
        .map(|n| {
            let call = a.call(
                &format!("client.{n}"),
                Via::Direct,
                Some(&key),
                report_body(task, "monthly"),
            );
            let client = a.rig.http.clone();
            tokio::spawn(async move { send(&client, call).await })
        })
        .collect();
    // Every request either answered or waits (through any chain of locks) for the lab.
    let started = Instant::now();
    let (mut blocked, mut answered);
    loop {
        answered = calls.iter().filter(|c| c.is_finished()).count();
        blocked = blocked_on(&a.pool, lab).await?;
        let waiting_for_all = usize::try_from(blocked).unwrap_or(0) >= RACERS - answered;
        if waiting_for_all || started.elapsed() > STAGING_LIMIT {
            break;
        }
        tokio::time::sleep(LOCK_POLL).await;
    }
    a.step(
        Msg::new("step.race_release")
            .arg("waiting", blocked)
            .arg("answered", answered),
    );
    held.rollback().await?;
    let mut answers = Vec::new();
    for call in calls {
        let sent = call.await.expect("a call does not panic");
        a.rig.record(Line::Call(sent.clone()));
        answers.push(sent);
    }
    let rows = a.rows(task).await?;
    judge_race(&answers, &rows, task)?;
    if usize::try_from(blocked).unwrap_or(0) + answered < RACERS {
        // Nothing broke, and the race was not run: the requests never met at the database.
        return unknown(
            undecided("no_race")
                .arg("waiting", blocked)
                .arg("answered", answered)
                .arg("count", RACERS)
                .arg("seconds", STAGING_LIMIT.as_secs()),
        );
    }
    Ok(())
}

async fn burst(a: &mut ReportApi) -> Judged {
    let mut rng = ChaCha8Rng::seed_from_u64(a.rig.seed);
    for round in 0..a.rig.repeat.max(1) {
        let task = a.task(100 + i64::from(round));
        let key = a.key(task);
        let starts: Vec<u64> = (0..BURST_SIZE)
            .map(|_| rng.random_range(0..=BURST_SPREAD_MS))
            .collect();
        let before = a.rig.schedule.len();
        a.step(
            Msg::new("step.burst")
                .arg("round", i64::from(round) + 1)
                .arg("size", BURST_SIZE)
                .arg("spread", BURST_SPREAD_MS),
        );
        let calls: Vec<_> = starts
            .iter()
            .enumerate()
            .map(|(n, start)| {
                let call = a.call(
                    &format!("client.{}", n + 1),
                    Via::Direct,
                    Some(&key),
                    report_body(task, "monthly"),
                );
                let client = a.rig.http.clone();
                let start = Duration::from_millis(*start);
                async move {
                    // A seeded spread of start times: what this check explores, not an order.
                    tokio::time::sleep(start).await;
                    send(&client, call).await
                }
            })
            .collect();
        let answers = join_all(calls).await;
        for sent in &answers {
            a.rig.record(Line::Call(sent.clone()));
        }
        let rows = a.rows(task).await?;
        judge_race(&answers, &rows, task)?;
        // A round that held: told in one line, not call by call.
        a.rig.schedule.truncate(before);
        a.step(
            Msg::new("step.burst_held")
                .arg("round", i64::from(round) + 1)
                .arg("size", BURST_SIZE),
        );
    }
    Ok(())
}

async fn crash(a: &mut ReportApi) -> Judged {
    let Some(channel) = a.commit_channel.clone() else {
        return crate::judgement::skipped(Msg::new("skipped.target"));
    };
    let task = a.task(9);
    let key = a.key(task);
    let mut listener = sqlx::postgres::PgListener::connect_with(&a.pool).await?;
    listener.listen(&channel).await?;
    a.step(Msg::new("step.crash_armed"));
    let armed = a.proxy.arm(Fault::ResponseLostAfterCommit, 1);
    let call = a.call(
        "client",
        Via::Proxy,
        Some(&key),
        report_body(task, "monthly"),
    );
    let client = a.rig.http.clone();
    let first = tokio::spawn(async move { send(&client, call).await });
    let committed = tokio::time::timeout(STAGING_LIMIT, async {
        loop {
            match listener.recv().await {
                Ok(notice) if notice.payload() == task.to_string() => return true,
                Ok(_) => continue,
                Err(_) => return false,
            }
        }
    })
    .await
    .unwrap_or(false);
    if !committed {
        first.abort();
        return unknown(undecided("no_commit").arg("seconds", STAGING_LIMIT.as_secs()));
    }
    // Right after the COMMIT: whatever the service meant to do next (answer, remember the key
    // in memory) does not happen. Its answer, if it had begun one, is dropped by the proxy.
    a.rig.kill_service().await;
    let first = first.await.expect("a call does not panic");
    a.rig.record(Line::Call(first));
    fired(&armed).await;
    a.proxy.disarm_all_faults();
    a.step(Msg::new("step.restart"));
    if a.rig.restart_service().await?.is_err() {
        return unknown(undecided("no_restart"));
    }
    retry_finds_the_report(a, task, &key).await
}

/// The hostile sample: what a careless or malicious client sends. (label, body, key)
fn hostile_sample(task: i64, rng: &mut ChaCha8Rng) -> Vec<(&'static str, String, Option<String>)> {
    let mut sample = vec![
        ("not_json", "{\"task_id\": ".to_string(), None),
        ("json_array", "[1, 2, 3]".to_string(), None),
        ("null", "null".to_string(), None),
        ("field_missing", format!("{{\"task_id\": {task}}}"), None),
        (
            "task_id_text",
            format!("{{\"task_id\": \"{task}x\", \"report_type\": \"monthly\"}}"),
            None,
        ),
        (
            "task_id_huge",
            "{\"task_id\": 99999999999999999999999, \"report_type\": \"monthly\"}".to_string(),
            None,
        ),
        (
            "task_id_negative",
            "{\"task_id\": -1, \"report_type\": \"monthly\"}".to_string(),
            None,
        ),
        (
            "nul_byte",
            format!("{{\"task_id\": {task}, \"report_type\": \"a\\u0000b\"}}"),
            None,
        ),
        (
            "long_report_type",
            format!(
                "{{\"task_id\": {task}, \"report_type\": \"{}\"}}",
                "x".repeat(10_000)
            ),
            None,
        ),
        (
            "long_key",
            report_body(task, "monthly"),
            Some("k".repeat(10_000)),
        ),
        (
            "unknown_field",
            format!("{{\"task_id\": {task}, \"report_type\": \"monthly\", \"admin\": true}}"),
            None,
        ),
    ];
    // A few seeded byte soups: printable junk of random lengths.
    for _ in 0..3 {
        let len = rng.random_range(1..200);
        let junk: String = (0..len)
            .map(|_| char::from(rng.random_range(0x20u8..0x7f)))
            .collect();
        sample.push(("random_bytes", junk, None));
    }
    sample
}

/// One hostile request's answer judged: a 4xx with a JSON body, or a 2xx.
fn judge_hostile(sent: &Sent) -> Judged {
    let label = who(&sent.who);
    match sent.status {
        Some(status) if status >= 500 => fail(
            broke("server_error")
                .arg("who", label)
                .arg("status", i64::from(status)),
        ),
        Some(status) if status >= 400 && !sent.json_body => {
            fail(broke("not_json").arg("who", label))
        }
        Some(_) => Ok(()),
        None => fail(broke("no_answer").arg("who", label)),
    }
}

async fn hostile(a: &mut ReportApi) -> Judged {
    let task = a.task(10);
    let mut rng = ChaCha8Rng::seed_from_u64(a.rig.seed ^ 0x686f_7374);
    let sample = hostile_sample(task, &mut rng);
    a.step(Msg::new("step.hostile").arg("count", sample.len()));
    let mut first_broken = None;
    for (label, body, key) in sample {
        let call = a.call(label, Via::Direct, key.as_deref(), body);
        let sent = send(&a.rig.http, call).await;
        if let Err(stop) = judge_hostile(&sent) {
            a.rig.record(Line::Call(sent));
            first_broken.get_or_insert(stop);
        }
    }
    // Still standing after all that.
    let health = a
        .rig
        .http
        .get(format!("{}/health", a.direct))
        .timeout(PATIENT)
        .send()
        .await;
    if let Some(stop) = first_broken {
        return Err(stop);
    }
    if health.is_err() {
        return fail(broke("down"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judgement::{Stop, verdict_of};
    use crate::verdict::Verdict;

    fn sent(who: &str, status: Option<u16>, report_id: Option<i64>, replayed: bool) -> Sent {
        Sent {
            who: who.into(),
            path: "/reports".into(),
            key: Some("k".into()),
            body: "{}".into(),
            status,
            answer: String::new(),
            no_answer: status.is_none().then_some("call.timed_out"),
            waited_ms: 10_000,
            json_body: status.is_some(),
            report_id,
            replayed: Some(replayed),
            charge_id: None,
            replayed_header: false,
            retry_after: None,
            outcome: Outcome::Ok,
        }
    }

    fn row(id: i64) -> ReportRow {
        ReportRow {
            id,
            task_id: 7,
            report_type: "monthly".into(),
            idempotency_key: Some("k".into()),
        }
    }

    fn key_of(judged: Judged) -> Option<String> {
        match verdict_of(judged).unwrap() {
            Verdict::Pass => None,
            other => Some(other.reason().unwrap().key.clone()),
        }
    }

    #[test]
    fn a_race_that_held_is_one_report_one_201_and_a_replay() {
        let calls = [
            sent("client.1", Some(201), Some(1), false),
            sent("client.2", Some(200), Some(1), true),
        ];
        assert_eq!(key_of(judge_race(&calls, &[row(1)], 7)), None);
    }

    #[test]
    fn a_race_names_how_it_broke() {
        let both = [
            sent("client.1", Some(201), Some(1), false),
            sent("client.2", Some(201), Some(2), false),
        ];
        assert_eq!(
            key_of(judge_race(&both, &[row(1), row(2)], 7)).as_deref(),
            Some("broke.race_reports")
        );
        let loser = [
            sent("client.1", Some(201), Some(1), false),
            sent("client.2", Some(500), None, false),
        ];
        assert_eq!(
            key_of(judge_race(&loser, &[row(1)], 7)).as_deref(),
            Some("broke.race_loser")
        );
        let two_created = [
            sent("client.1", Some(201), Some(1), false),
            sent("client.2", Some(201), Some(1), false),
        ];
        assert_eq!(
            key_of(judge_race(&two_created, &[row(1)], 7)).as_deref(),
            Some("broke.created")
        );
        let none = [
            sent("client.1", Some(409), None, false),
            sent("client.2", Some(409), None, false),
        ];
        assert_eq!(
            key_of(judge_race(&none, &[], 7)).as_deref(),
            Some("broke.reports")
        );
        let wrong_id = [
            sent("client.1", Some(201), Some(1), false),
            sent("client.2", Some(200), Some(9), true),
        ];
        assert_eq!(
            key_of(judge_race(&wrong_id, &[row(1)], 7)).as_deref(),
            Some("broke.other_id")
        );
    }

    #[test]
    fn a_replay_must_say_so_and_name_the_stored_report() {
        assert!(replays(&sent("client", Some(200), Some(1), true), &row(1)).is_ok());
        let Err(Stop::Verdict(Verdict::Fail(msg))) =
            replays(&sent("client", Some(200), Some(1), false), &row(1))
        else {
            panic!("a replay without `replayed` passed")
        };
        assert_eq!(msg.key, "broke.not_replayed");
        let Err(Stop::Verdict(Verdict::Fail(msg))) =
            replays(&sent("client", None, None, false), &row(1))
        else {
            panic!("no answer passed")
        };
        assert_eq!(msg.key, "broke.status");
        assert_eq!(
            msg.args[2].1,
            lab_core::Arg::Msg(Msg::new("call.no_answer")),
            "no answer is said in words"
        );
    }

    #[test]
    fn a_hostile_request_may_be_refused_with_json_never_a_5xx() {
        let mut refused = sent("null", Some(422), None, false);
        assert!(judge_hostile(&refused).is_ok());
        refused.json_body = false;
        assert_eq!(
            key_of(judge_hostile(&refused)).as_deref(),
            Some("broke.not_json")
        );
        assert_eq!(
            key_of(judge_hostile(&sent("null", Some(500), None, false))).as_deref(),
            Some("broke.server_error")
        );
        assert_eq!(
            key_of(judge_hostile(&sent("null", None, None, false))).as_deref(),
            Some("broke.no_answer")
        );
    }
}
