//! Exercise `report-api` (lesson 6, §4 and §8): the learner's `POST /reports` with an
//! Idempotency-Key, attacked the way the lesson's scenarios attack the lab's own service. The
//! oracle is the `reports` table, read by the lab: never the service's own answers.
//!
//! | check         | the schedule                                                        | the invariant                          |
//! |---------------|---------------------------------------------------------------------|----------------------------------------|
//! | `replay`      | one key, the same content twice                                     | one report; 201 `replayed: false` naming it, then 200 `replayed: true` naming it |
//! | `no-key`      | no key, twice                                                       | two reports                            |
//! | `conflict`    | one key, then the same key with another report type, with another task, then the first content again | 409 with JSON each time, no second report; then a replay of the one report |
//! | `invalid-key` | an empty, a blank and a 256-character key; then a 255-character key | 400 with JSON and no report; the 255-character key makes its report (201) |
//! | `lost-answer` | the answer dropped by the fault proxy after the service answered   | the retry finds the one report         |
//! | `timeout`     | the answer held 900 ms, the client gives up at 150 ms (tried again: 600 ms, 2.4 s) | the retry finds the one report |
//! | `race`        | two requests with one key held at the database, let go together; then two with one key and different report types | one report, no 5xx; the same content replays it, other content gets 409 |
//! | `burst`       | seeded bursts of 8 same-key requests (starts spread over 20 ms), writes held until a seeded number of them (2 to 8) wait, repeated | one report, one 201, replays; no 5xx |
//! | `crash`       | the service SIGKILLed right after the COMMIT, started again         | the retry finds the one report (not a second: the key outlives the process) |
//! | `hostile`     | malformed bodies and keys (the README's bounds, and junk)           | a 4xx with a JSON body, no report; never a 5xx |
//!
//! Three of them need a moment the service does not show from outside, and take it from
//! PostgreSQL instead of a sleep:
//!
//! - `race` locks `reports` against writes (`SHARE ROW EXCLUSIVE`: reads still pass) in a
//!   transaction of the lab's own, sends the requests, and watches the service's sessions until
//!   each request waits, directly or behind another, on the lab's transaction (any lock: a row,
//!   an advisory lock, a key table of the service's own), or until the service has held the
//!   rest back itself for a quiet while (one thread, a lock in memory). Then it rolls back: the
//!   waiting go on at the same instant, each having made whatever check it makes before its
//!   write. The watching is [`staging`]'s.
//! - `burst` does the same with its seeded spread of starts, and lets go once a seeded number
//!   of its requests (two at least) wait, the others coming as they come: however loaded the
//!   machine, at least two meet, so load makes a burst slower, never a race missed.
//! - `crash` listens on a channel the lab's trigger on `reports` notifies (a notification is
//!   delivered only once its transaction has committed) and kills the service when it comes.
//!
//! Layout: the checks and their judgements here (the judgements are pure functions of the
//! answers and the rows: `judge_*`, `creates`, `replays`, tested in `tests` without a
//! database); the race's staging in [`staging`]; `hostile`'s sample in [`hostile`].

mod hostile;
mod staging;

use std::time::Duration;

use faultproxy::Fault;
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
use hostile::{Hostile, hostile_sample};
use staging::{Release, Staged};

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
/// What the two rounds of `race` send under one key, client by client: the same content twice
/// (one creates the report, the other must replay it), then two contents (one creates, the
/// other must be refused, whichever comes first).
const RACE_SAME: [&str; 2] = ["monthly", "monthly"];
const RACE_OTHER: [&str; 2] = ["monthly", "yearly"];
/// The longest key the contract accepts.
const MAX_KEY: usize = 255;
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
    /// The role the service logs in as, when the lab started it: how `race` and `burst` tell
    /// the service's sessions from others. `None` (`--target`): every session but the lab's.
    role: Option<String>,
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
                let database_url = database::guest_database_url(servers, &space).await?;
                // The login the service's sessions carry, whichever server this is.
                let role = reqwest::Url::parse(&database_url)
                    .ok()
                    .map(|url| url.username().to_string())
                    .filter(|user| !user.is_empty());
                env.database_url = Some(database_url);
                if let Err(not_ready) = rig.start_service(env).await? {
                    rig.close().await;
                    return Ok(Checked::NotReady(not_ready));
                }
                let direct = rig.service_url();
                let world = ReportApi::open(rig, pool, Some(channel), direct, 0, role).await?;
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
                None,
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
        role: Option<String>,
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
            role,
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

/// The answer of the request that made `row`: 201, the row's id, `replayed: false`.
fn creates(call: &Sent, row: &ReportRow) -> Judged {
    status_is(call, 201)?;
    names_the_report(call, row)?;
    if call.replayed != Some(false) {
        return fail(broke("not_fresh").arg("who", who(&call.who)));
    }
    Ok(())
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

/// The report type a call of the lab's sent (its body is the lab's own JSON).
fn sent_type(call: &Sent) -> Option<String> {
    let body: serde_json::Value = serde_json::from_str(&call.body).ok()?;
    Some(body.get("report_type")?.as_str()?.to_string())
}

/// What an error's body said, for a line: its JSON `error`, `detail` or `message`, else the
/// body as it came (cut to a line).
fn said(call: &Sent) -> Msg {
    let text = match serde_json::from_str::<serde_json::Value>(&call.answer) {
        Ok(body) => ["error", "detail", "message"]
            .iter()
            .find_map(|field| body.get(field))
            .map_or_else(
                || call.answer.clone(),
                |v| v.as_str().map_or_else(|| v.to_string(), str::to_string),
            ),
        Err(_) => call.answer.clone(),
    };
    if text.trim().is_empty() {
        return Msg::new("said.nothing");
    }
    Msg::new("said.text").arg("text", crate::call::cut(text.trim()))
}

/// Requests that raced on one key, judged: one report; of the requests with its content,
/// exactly one 201 naming it and replays naming it; of the others, 409. A 5xx, a second
/// report, a missing answer and a wrong status are each named as what was seen.
fn judge_race(calls: &[Sent], rows: &[ReportRow], task: i64) -> Judged {
    if let Some(loser) = calls.iter().find(|c| c.status.is_some_and(|s| s >= 500)) {
        return fail(
            broke("race_loser")
                .arg("who", who(&loser.who))
                .arg("status", loser.status_arg())
                .arg("said", said(loser)),
        );
    }
    if rows.len() > 1 {
        return fail(
            broke("race_reports")
                .arg("task", task)
                .arg("count", rows.len()),
        );
    }
    if let Some(silent) = calls.iter().find(|c| c.status.is_none()) {
        return fail(
            broke("race_no_answer")
                .arg("who", who(&silent.who))
                .arg("seconds", silent.waited_ms / 1000),
        );
    }
    let row = one_report(rows, task)?;
    let (same, other): (Vec<&Sent>, Vec<&Sent>) = calls
        .iter()
        .partition(|c| sent_type(c).as_deref() == Some(row.report_type.as_str()));
    for call in &other {
        if call.status != Some(409) {
            return fail(
                broke("race_other_content")
                    .arg("who", who(&call.who))
                    .arg("sent", sent_type(call).unwrap_or_default())
                    .arg("id", row.id)
                    .arg("stored", row.report_type.as_str())
                    .arg("got", call.status_arg()),
            );
        }
        json_refusal(call, 409)?;
    }
    let created = same.iter().filter(|c| c.status == Some(201)).count();
    if created != 1 {
        return fail(
            broke("created")
                .arg("count", created)
                .arg("total", same.len()),
        );
    }
    for call in same {
        if call.status == Some(201) {
            names_the_report(call, row)?;
        } else {
            replays(call, row)?;
        }
    }
    Ok(())
}

/// A retry with the first request's key and content, after its answer was lost: it must replay
/// the one report. A second report is named for when it came: after a restart, the key was not
/// where the restarted service looks.
fn judge_retry(
    retry: &Sent,
    before: &[ReportRow],
    after: &[ReportRow],
    task: i64,
    restarted: bool,
) -> Judged {
    no_server_error(&[retry])?;
    if after.len() > 1
        && let (Some(old), Some(new)) = (before.first(), after.iter().find(|r| !before.contains(r)))
    {
        let cause = if restarted {
            "crash_forgot"
        } else {
            "retry_made"
        };
        return fail(
            broke(cause)
                .arg("got", retry.status_arg())
                .arg("new", new.id)
                .arg("old", old.id),
        );
    }
    replays(retry, one_report(after, task)?)
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
    creates(&first, row)?;
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

/// What `conflict` sent under one key, in order: the first request, the same key with another
/// report type, with another task, and the first request again.
struct Conflicted {
    first: Sent,
    other_type: Sent,
    other_task: Sent,
    again: Sent,
}

/// `conflict` judged: one report of the task, made by the first request; each changed field
/// refused with 409 and JSON, and no report of the other task; the first content, sent again
/// after the refusals, still replays the one report.
fn judge_conflict(
    sent: &Conflicted,
    rows: &[ReportRow],
    task: i64,
    other_rows: &[ReportRow],
    other_task: i64,
) -> Judged {
    no_server_error(&[&sent.first, &sent.other_type, &sent.other_task, &sent.again])?;
    let row = one_report(rows, task)?;
    status_is(&sent.first, 201)?;
    for (refused, field) in [
        (&sent.other_type, "report_type"),
        (&sent.other_task, "task_id"),
    ] {
        if refused.status != Some(409) {
            return fail(
                broke("not_conflict")
                    .arg("field", field)
                    .arg("got", refused.status_arg()),
            );
        }
        json_refusal(refused, 409)?;
    }
    if !other_rows.is_empty() {
        return fail(
            broke("conflict_stored")
                .arg("task", other_task)
                .arg("count", other_rows.len()),
        );
    }
    replays(&sent.again, row)
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
    // A refusal changes nothing the key stands for.
    a.step(Msg::new("step.conflict_again"));
    let again = a.send_monthly(Via::Direct, Some(&key), task).await;
    let rows = a.rows(task).await?;
    let other_rows = a.rows(other_task).await?;
    let sent = Conflicted {
        first,
        other_type,
        other_task: other_task_sent,
        again,
    };
    judge_conflict(&sent, &rows, task, &other_rows, other_task)
}

/// The invalid keys, judged: each refused with 400 and JSON, and no report of their task; then
/// the longest valid key: 201, and its one report (its body is `replay`'s to judge).
fn judge_keys(
    invalid: &[Sent],
    invalid_rows: &[ReportRow],
    invalid_task: i64,
    longest: &Sent,
    longest_rows: &[ReportRow],
    longest_task: i64,
) -> Judged {
    no_server_error(&invalid.iter().chain([longest]).collect::<Vec<_>>())?;
    for call in invalid {
        json_refusal(call, 400)?;
    }
    if !invalid_rows.is_empty() {
        return fail(
            broke("invalid_stored")
                .arg("task", invalid_task)
                .arg("count", invalid_rows.len()),
        );
    }
    if longest.status != Some(201) {
        return fail(
            broke("longest_key")
                .arg("length", MAX_KEY)
                .arg("got", longest.status_arg()),
        );
    }
    one_report(longest_rows, longest_task)?;
    Ok(())
}

async fn invalid_key(a: &mut ReportApi) -> Judged {
    let task = a.task(4);
    let longest_task = a.task(14);
    a.step(Msg::new("step.invalid_key"));
    let too_long = "k".repeat(MAX_KEY + 1);
    let mut invalid = Vec::new();
    for key in ["", "   ", too_long.as_str()] {
        let call = a.call(
            "client",
            Via::Direct,
            Some(key),
            report_body(task, "monthly"),
        );
        invalid.push(a.send(call).await);
    }
    // The longest valid key, made of the run's own key so no other run's report answers it.
    let mut longest_key = a.key(longest_task);
    let pad = MAX_KEY.saturating_sub(longest_key.len());
    longest_key.push_str(&"k".repeat(pad));
    a.step(
        Msg::new("step.longest_key")
            .arg("length", MAX_KEY)
            .arg("task", longest_task),
    );
    let longest = a
        .send_monthly(Via::Direct, Some(&longest_key), longest_task)
        .await;
    let rows = a.rows(task).await?;
    let longest_rows = a.rows(longest_task).await?;
    judge_keys(&invalid, &rows, task, &longest, &longest_rows, longest_task)
}

/// After a first call whose answer never came: the retry with the same key and content must
/// find the one report (`restarted`: the service was started again in between).
async fn retry_finds_the_report(
    a: &mut ReportApi,
    task: i64,
    key: &str,
    restarted: bool,
) -> Judged {
    let before = a.rows(task).await?;
    retry_meets(a, task, key, restarted, &before).await
}

/// The retry of [`retry_finds_the_report`], the task's reports read already (`before`).
async fn retry_meets(
    a: &mut ReportApi,
    task: i64,
    key: &str,
    restarted: bool,
    before: &[ReportRow],
) -> Judged {
    a.step(Msg::new("step.retry"));
    let retry = a.send_monthly(Via::Direct, Some(key), task).await;
    let after = a.rows(task).await?;
    judge_retry(&retry, before, &after, task, restarted)
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
    retry_finds_the_report(a, task, &key, false).await
}

/// How many tasks `timeout` stages its moment on before it says it could not. On a loaded
/// machine the client may give up before the service has done its work; a service may then end
/// the request with the client's connection, before its COMMIT, and there is no finished first
/// request for the retry to meet. That is no fault of the service's: the moment is staged
/// again, on a fresh task, with a client four times as patient ([`timeout_patience`]).
const TIMEOUT_TRIES: i64 = 3;

/// How long the client waits, and how long the answer is held, on try `attempt` (from 0) of
/// `timeout`: the lesson's 150 ms and 900 ms first; then a client four times as patient each
/// try (600 ms, 2.4 s), the answer held as much longer, so that a service slowed by a loaded
/// machine still finishes its work before the client gives up (in CI three tries at 150 ms
/// did not, and the check could not decide on a correct design).
fn timeout_patience(attempt: i64) -> (Duration, Duration) {
    let patience = CLIENT_TIMEOUT * 4u32.pow(attempt as u32);
    (patience, HELD_ANSWER + (patience - CLIENT_TIMEOUT))
}

async fn timeout(a: &mut ReportApi) -> Judged {
    for attempt in 0..TIMEOUT_TRIES {
        let task = if attempt == 0 {
            a.task(6)
        } else {
            a.task(60 + attempt)
        };
        let key = a.key(task);
        let (patience, held) = timeout_patience(attempt);
        a.step(
            Msg::new("step.timeout_armed")
                .arg("held", held)
                .arg("patience", patience),
        );
        let armed = a.proxy.arm(Fault::SlowResponse(held), 1);
        let mut call = a.call(
            "client",
            Via::Proxy,
            Some(&key),
            report_body(task, "monthly"),
        );
        call.timeout = patience;
        let first = a.send(call).await;
        // The service answered (the proxy holds that answer), or closed the connection: its
        // work on the request is over.
        if !fired(&armed).await || first.outcome != Outcome::Unknown {
            return unknown(undecided("not_held"));
        }
        // The retry must meet a finished first request, as in the lesson: its report made.
        let before = a.rows(task).await?;
        if before.is_empty() {
            if attempt + 1 < TIMEOUT_TRIES {
                a.step(Msg::new("step.timeout_again"));
                continue;
            }
            return unknown(undecided("timeout_unfinished").arg("tries", TIMEOUT_TRIES));
        }
        return retry_meets(a, task, &key, false, &before).await;
    }
    unreachable!("the last try returns")
}

async fn race(a: &mut ReportApi) -> Judged {
    let task = a.task(7);
    a.step(Msg::new("step.race_hold").arg("what", Msg::new("race.same")));
    race_round(a, task, &RACE_SAME).await?;
    let task = a.task(8);
    a.step(Msg::new("step.race_hold").arg("what", Msg::new("race.other").arg("task", task)));
    race_round(a, task, &RACE_OTHER).await
}

/// One round of `race`: `types.len()` clients send `task`'s request with one key at once, one
/// report type each, while the lab holds `reports` against writes; let go together once the
/// moment is there (see [`staging`]), and judged by the answers and the rows.
async fn race_round(a: &mut ReportApi, task: i64, types: &[&str]) -> Judged {
    let key = a.key(task);
    let calls = types
        .iter()
        .enumerate()
        .map(|(n, report_type)| {
            let mut call = a.call(
                &format!("client.{}", n + 1),
                Via::Direct,
                Some(&key),
                report_body(task, report_type),
            );
            // The lab may hold for the whole staging limit: the calls wait that long and the
            // usual patience after it, so only the service, never the lab's hold, ends them.
            call.timeout = STAGING_LIMIT + PATIENT;
            (call, Duration::ZERO)
        })
        .collect();
    let staged =
        staging::stage(&a.pool, a.role.as_deref(), &a.rig.http, calls, types.len()).await?;
    judge_staged(a, staged, task).await
}

/// How the lab let a staged moment go, in words: the step that says so, or, when the moment
/// was not staged, the unknown that says why.
fn release_told(staged: &Staged) -> Result<Msg, Msg> {
    match staged.release {
        _ if !staged.ever_waited => Err(undecided("no_race")
            .arg("ms", staged.held_for)
            .arg("answered", staged.answered)
            .arg("count", staged.answers.len())),
        Release::GaveUp { call } => {
            let (sent, after) = &staged.answers[call];
            Err(undecided("race_gave_up")
                .arg("who", who(&sent.who))
                .arg("status", sent.status_arg())
                .arg("ms", *after))
        }
        Release::Met | Release::AllEnded => Ok(Msg::new("step.race_release")
            .arg("waiting", staged.waiting)
            .arg("answered", staged.answered)),
        Release::HeldBack { quiet } => Ok(Msg::new("step.race_release_held")
            .arg("waiting", staged.waiting)
            .arg("absent", staged.absent)
            .arg("quiet", quiet)
            .arg("answered", staged.answered)),
        Release::Limit => Ok(Msg::new("step.race_release_limit")
            .arg("seconds", STAGING_LIMIT.as_secs())
            .arg("waiting", staged.waiting)
            .arg("absent", staged.absent)
            .arg("answered", staged.answered)),
    }
}

/// A staged moment told, its calls recorded, and judged by their answers and `task`'s rows.
async fn judge_staged(a: &mut ReportApi, staged: Staged, task: i64) -> Judged {
    let told = release_told(&staged);
    if let Ok(step) = &told {
        a.step(step.clone());
    }
    let answers: Vec<Sent> = staged.answers.into_iter().map(|(sent, _)| sent).collect();
    for sent in &answers {
        a.rig.record(Line::Call(sent.clone()));
    }
    if let Err(why) = told {
        return unknown(why);
    }
    if answers.iter().any(|s| s.status.is_none()) {
        // A call the service never answered: its request may still be at work. The rows are
        // read once none of the service's sessions is.
        staging::settle(&a.pool, a.role.as_deref(), PATIENT).await?;
    }
    let rows = a.rows(task).await?;
    judge_race(&answers, &rows, task)
}

async fn burst(a: &mut ReportApi) -> Judged {
    let mut rng = ChaCha8Rng::seed_from_u64(a.rig.seed);
    for round in 0..a.rig.repeat.max(1) {
        let task = a.task(100 + i64::from(round));
        let key = a.key(task);
        let starts: Vec<u64> = (0..BURST_SIZE)
            .map(|_| rng.random_range(0..=BURST_SPREAD_MS))
            .collect();
        // How many meet at the lab's lock before it lets go, from the seed: at least two (a
        // race, whatever the machine's load), at most all; the others come as they come.
        let meet = rng.random_range(2..=BURST_SIZE);
        let before = a.rig.schedule.len();
        a.step(
            Msg::new("step.burst")
                .arg("round", i64::from(round) + 1)
                .arg("size", BURST_SIZE)
                .arg("spread", BURST_SPREAD_MS)
                .arg("meet", meet),
        );
        let calls = starts
            .iter()
            .enumerate()
            .map(|(n, start)| {
                let mut call = a.call(
                    &format!("client.{}", n + 1),
                    Via::Direct,
                    Some(&key),
                    report_body(task, "monthly"),
                );
                // As in `race`: only the service, never the lab's hold, ends a call.
                call.timeout = STAGING_LIMIT + PATIENT;
                (call, Duration::from_millis(*start))
            })
            .collect();
        let staged = staging::stage(&a.pool, a.role.as_deref(), &a.rig.http, calls, meet).await?;
        judge_staged(a, staged, task).await?;
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
    retry_finds_the_report(a, task, &key, true).await
}

/// One hostile request's answer judged, with the report its task got meanwhile (if any): a
/// refused one must get a 4xx with a JSON body and make no report; none may get a 5xx.
fn judge_hostile(request: &Hostile, sent: &Sent, made: Option<&ReportRow>) -> Judged {
    let label = who(&sent.who);
    let Some(status) = sent.status else {
        return fail(broke("no_answer").arg("who", label));
    };
    if status >= 500 {
        return fail(
            broke("server_error")
                .arg("who", label)
                .arg("status", i64::from(status)),
        );
    }
    if request.refused
        && let Some(row) = made
    {
        return fail(
            broke("malformed_stored")
                .arg("who", label)
                .arg("status", i64::from(status))
                .arg("id", row.id),
        );
    }
    let refusal = (400..500).contains(&status);
    if request.refused && !refusal {
        return fail(
            broke("accepted_malformed")
                .arg("who", label)
                .arg("status", i64::from(status)),
        );
    }
    if refusal && !sent.json_body {
        return fail(broke("not_json").arg("who", label));
    }
    Ok(())
}

async fn hostile(a: &mut ReportApi) -> Judged {
    let first_task = a.task(30);
    let mut rng = ChaCha8Rng::seed_from_u64(a.rig.seed ^ 0x686f_7374);
    let sample = hostile_sample(first_task, &mut rng);
    a.step(Msg::new("step.hostile").arg("count", sample.len()));
    // Reports made from now on are the sample's (task 0 and -1 are shared with a target's
    // other runs: only the newer rows count).
    let mark: i64 = sqlx::query_scalar("SELECT coalesce(max(id), 0) FROM reports")
        .fetch_one(&a.pool)
        .await?;
    let mut answers = Vec::new();
    for request in &sample {
        let call = a.call(
            request.label,
            Via::Direct,
            request.key.as_deref(),
            request.body.clone(),
        );
        answers.push(send(&a.rig.http, call).await);
    }
    let tasks: Vec<i64> = sample.iter().filter_map(|r| r.task).collect();
    let made: Vec<ReportRow> = read_rows_since(&a.pool, &tasks, mark).await?;
    // Still standing after all that.
    let health = a
        .rig
        .http
        .get(format!("{}/health", a.direct))
        .timeout(PATIENT)
        .send()
        .await;
    // Every request that broke the rule is shown; the first names the verdict.
    let mut first_broken = None;
    for (request, sent) in sample.iter().zip(answers) {
        let row = made.iter().find(|row| Some(row.task_id) == request.task);
        if let Err(stop) = judge_hostile(request, &sent, row) {
            a.rig.record(Line::Call(sent));
            if let Some(row) = row {
                a.rig.record(Line::Rows {
                    task_id: row.task_id,
                    rows: vec![row.clone()],
                });
            }
            first_broken.get_or_insert(stop);
        }
    }
    if let Some(stop) = first_broken {
        return Err(stop);
    }
    if health.is_err() {
        return fail(broke("down"));
    }
    Ok(())
}

/// The reports of `tasks` with an id above `mark`, oldest first.
async fn read_rows_since(
    pool: &PgPool,
    tasks: &[i64],
    mark: i64,
) -> Result<Vec<ReportRow>, ExerciseError> {
    let rows: Vec<(i64, i64, String, Option<String>)> = sqlx::query_as(
        "SELECT id, task_id, report_type, idempotency_key FROM reports
          WHERE task_id = ANY($1) AND id > $2 ORDER BY id",
    )
    .bind(tasks)
    .bind(mark)
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

#[cfg(test)]
mod tests;
