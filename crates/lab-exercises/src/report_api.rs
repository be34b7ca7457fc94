//! Exercise `report-api` (lesson 6, §4 and §8): the learner's `POST /reports` with an
//! Idempotency-Key, attacked the way the lesson's scenarios attack the lab's own service. The
//! oracle is the `reports` table, read by the lab: never the service's own answers.
//!
//! | check         | the schedule                                                        | the invariant                          |
//! |---------------|---------------------------------------------------------------------|----------------------------------------|
//! | `replay`      | one key, the same content twice                                     | one report; 201, then 200 `replayed`   |
//! | `no-key`      | no key, twice                                                       | two reports                            |
//! | `conflict`    | one key, other content                                              | 409, and no second report              |
//! | `invalid-key` | an empty, a blank and a 256-character key                           | 400 with a JSON body; no report        |
//! | `lost-answer` | the answer dropped by the fault proxy after the service answered    | the retry finds the one report         |
//! | `timeout`     | the answer held 900 ms, the client gives up at 150 ms               | the retry finds the one report         |
//! | `race`        | two requests held at the database on one key, then let go together  | one report, no 5xx                     |
//! | `burst`       | seeded bursts of concurrent same-key requests, repeated             | one report per key, no 5xx             |
//! | `crash`       | the service SIGKILLed right after the COMMIT, started again         | the retry finds the one report         |
//! | `hostile`     | malformed bodies and headers                                        | never a 5xx; a 4xx has a JSON body     |
//!
//! Two of them need a moment the service does not show from outside, and take it from
//! PostgreSQL instead of a sleep:
//!
//! - `race` holds an uncommitted row with the key in the lab's own transaction, waits until both
//!   requests are seen waiting for that transaction in `pg_locks`, then rolls back: both are let
//!   go at the same instant, whatever the service checked before its INSERT.
//! - `crash` listens on a channel the lab's trigger on `reports` notifies (a notification is
//!   delivered only once its transaction has committed) and kills the service when it comes.

use std::time::{Duration, Instant};

use faultproxy::Fault;
use futures_util::future::join_all;
use lab_core::Msg;
use rand::rngs::ChaCha8Rng;
use rand::{RngExt as _, SeedableRng as _};

use crate::arena::{Arena, PATIENT, Via, read_rows, report_body, send};
use crate::catalogue::{CheckSpec, Exercise};
use crate::error::ExerciseError;
use crate::guest::{Guest, Mark};
use crate::verdict::{Exchange, Outcome, ReportRow, Verdict, who};
use crate::world::World;

pub static EXERCISE: Exercise = Exercise {
    name: "report-api",
    lesson: "reports",
    needs: lab_infra::Needs::POSTGRES,
    langs: &["python", "rust"],
    rust_uses_idem: false,
    checks: &[
        CheckSpec::new("replay"),
        CheckSpec::new("no-key"),
        CheckSpec::new("conflict"),
        CheckSpec::new("invalid-key"),
        CheckSpec::new("lost-answer"),
        CheckSpec::new("timeout"),
        CheckSpec::new("race"),
        CheckSpec::new("burst").seeded(),
        CheckSpec::new("crash").restarts(),
        CheckSpec::new("hostile").seeded(),
    ],
    starter_fails: &[
        "replay",
        "conflict",
        "invalid-key",
        "lost-answer",
        "timeout",
        "race",
        "burst",
        "crash",
    ],
};

/// How long the answer is held on its way back, and how long the client waits (the lesson's
/// numbers).
const HELD_ANSWER: Duration = Duration::from_millis(900);
const CLIENT_TIMEOUT: Duration = Duration::from_millis(150);
/// How long the lab waits for a moment it stages (a fault to fire, two requests to reach the
/// database, a commit): far longer than a working service needs, so reaching it is the only
/// way on, and missing it is an unknown, never a pass.
const STAGING_LIMIT: Duration = Duration::from_secs(30);
/// How often `pg_locks` is read while the race's requests gather.
const LOCK_POLL: Duration = Duration::from_millis(10);
/// Concurrent requests per burst, and the spread of their starts.
const BURST_SIZE: usize = 8;
const BURST_SPREAD_MS: u64 = 20;

type Checked = Result<Verdict, ExerciseError>;

/// Runs the check `name`.
pub async fn run(name: &str, arena: &mut Arena) -> Checked {
    match name {
        "replay" => replay(arena).await,
        "no-key" => no_key(arena).await,
        "conflict" => conflict(arena).await,
        "invalid-key" => invalid_key(arena).await,
        "lost-answer" => lost_answer(arena).await,
        "timeout" => timeout(arena).await,
        "race" => race(arena).await,
        "burst" => burst(arena).await,
        "crash" => crash(arena).await,
        "hostile" => hostile(arena).await,
        other => unreachable!("report-api has no check {other}"),
    }
}

fn fail(key: &str) -> Msg {
    Msg::new(format!("broke.{key}"))
}

/// A 5xx among `calls`: the service failed where it should have answered.
fn server_error(calls: &[&Exchange]) -> Option<Verdict> {
    calls
        .iter()
        .find(|c| c.status.is_some_and(|s| s >= 500))
        .map(|c| {
            Verdict::Fail(
                fail("server_error")
                    .arg("who", who(&c.who))
                    .arg("status", i64::from(c.status.unwrap_or(0))),
            )
        })
}

/// The report count the invariant allows, else the verdict that says how it broke.
fn one_report(rows: &[ReportRow], task: i64) -> Result<&ReportRow, Verdict> {
    match rows {
        [row] => Ok(row),
        _ => Err(Verdict::Fail(
            fail("reports").arg("task", task).arg("count", rows.len()),
        )),
    }
}

fn status_is(call: &Exchange, expected: u16) -> Result<(), Verdict> {
    if call.status == Some(expected) {
        return Ok(());
    }
    Err(Verdict::Fail(
        fail("status")
            .arg("who", who(&call.who))
            .arg("expected", i64::from(expected))
            .arg("got", shown_status(call)),
    ))
}

fn shown_status(call: &Exchange) -> String {
    match call.status {
        Some(status) => status.to_string(),
        None => call.answer.clone(),
    }
}

/// An answer that names `row`'s report, else the verdict that says which it named.
fn names_the_report(call: &Exchange, row: &ReportRow) -> Result<(), Verdict> {
    if call.report_id == Some(row.id) {
        return Ok(());
    }
    Err(Verdict::Fail(
        fail("other_id")
            .arg("who", who(&call.who))
            .arg(
                "got",
                call.report_id.map_or("-".to_string(), |id| id.to_string()),
            )
            .arg("id", row.id),
    ))
}

/// A replay that names the stored report: 200, `replayed: true`, and the row's id.
fn replays(call: &Exchange, row: &ReportRow) -> Result<(), Verdict> {
    status_is(call, 200)?;
    names_the_report(call, row)?;
    if call.replayed != Some(true) {
        return Err(Verdict::Fail(
            fail("not_replayed").arg("who", who(&call.who)),
        ));
    }
    Ok(())
}

fn verdict(judged: Result<(), Verdict>) -> Checked {
    Ok(judged.err().unwrap_or(Verdict::Pass))
}

async fn replay(a: &mut Arena) -> Checked {
    let task = a.task(1);
    let key = a.key(task);
    a.step(Msg::new("step.replay"));
    let first = send_monthly(a, Via::Direct, Some(&key), task).await;
    let second = send_monthly(a, Via::Direct, Some(&key), task).await;
    let rows = a.rows(task).await?;
    if let Some(v) = server_error(&[&first, &second]) {
        return Ok(v);
    }
    verdict((|| {
        let row = one_report(&rows, task)?;
        status_is(&first, 201)?;
        replays(&second, row)
    })())
}

async fn no_key(a: &mut Arena) -> Checked {
    let task = a.task(2);
    a.step(Msg::new("step.no_key"));
    let first = send_monthly(a, Via::Direct, None, task).await;
    let second = send_monthly(a, Via::Direct, None, task).await;
    let rows = a.rows(task).await?;
    if let Some(v) = server_error(&[&first, &second]) {
        return Ok(v);
    }
    verdict((|| {
        status_is(&first, 201)?;
        status_is(&second, 201)?;
        if rows.len() != 2 {
            return Err(Verdict::Fail(
                fail("keyless").arg("task", task).arg("count", rows.len()),
            ));
        }
        Ok(())
    })())
}

async fn conflict(a: &mut Arena) -> Checked {
    let task = a.task(3);
    let key = a.key(task);
    a.step(Msg::new("step.conflict"));
    let first = send_monthly(a, Via::Direct, Some(&key), task).await;
    let other = a
        .send(a.call(
            "client",
            Via::Direct,
            Some(&key),
            report_body(task, "yearly"),
        ))
        .await;
    let rows = a.rows(task).await?;
    if let Some(v) = server_error(&[&first, &other]) {
        return Ok(v);
    }
    verdict((|| {
        one_report(&rows, task)?;
        status_is(&first, 201)?;
        status_is(&other, 409)?;
        if !other.json_body {
            return Err(Verdict::Fail(fail("not_json").arg("who", who(&other.who))));
        }
        Ok(())
    })())
}

async fn invalid_key(a: &mut Arena) -> Checked {
    let task = a.task(4);
    a.step(Msg::new("step.invalid_key"));
    let long = "k".repeat(256);
    let mut calls = Vec::new();
    for key in ["", "   ", long.as_str()] {
        calls.push(
            a.send(a.call(
                "client",
                Via::Direct,
                Some(key),
                report_body(task, "monthly"),
            ))
            .await,
        );
    }
    let rows = a.rows(task).await?;
    if let Some(v) = server_error(&calls.iter().collect::<Vec<_>>()) {
        return Ok(v);
    }
    verdict((|| {
        for call in &calls {
            status_is(call, 400)?;
            if !call.json_body {
                return Err(Verdict::Fail(fail("not_json").arg("who", who(&call.who))));
            }
        }
        if !rows.is_empty() {
            return Err(Verdict::Fail(
                fail("invalid_stored")
                    .arg("task", task)
                    .arg("count", rows.len()),
            ));
        }
        Ok(())
    })())
}

/// The lesson's request for `task`, sent by the client `via` a way, with `key`.
async fn send_monthly(a: &mut Arena, via: Via, key: Option<&str>, task: i64) -> Exchange {
    a.send(a.call("client", via, key, report_body(task, "monthly")))
        .await
}

/// After a first call whose answer never came: the retry with the same key and content must
/// find the one report.
async fn retry_finds_the_report(a: &mut Arena, task: i64, key: &str) -> Checked {
    a.rows(task).await?;
    a.step(Msg::new("step.retry"));
    let retry = send_monthly(a, Via::Direct, Some(key), task).await;
    let rows = a.rows(task).await?;
    if let Some(v) = server_error(&[&retry]) {
        return Ok(v);
    }
    verdict((|| replays(&retry, one_report(&rows, task)?))())
}

/// Waits for an armed fault to have fired; an unknown when it never did.
async fn fired(armed: &faultproxy::ArmedFault) -> bool {
    tokio::time::timeout(STAGING_LIMIT, armed.fired())
        .await
        .is_ok()
}

async fn lost_answer(a: &mut Arena) -> Checked {
    let task = a.task(5);
    let key = a.key(task);
    a.step(Msg::new("step.lost_armed"));
    let armed = a.proxy.arm(Fault::ResponseLostAfterCommit, 1);
    let first = send_monthly(a, Via::Proxy, Some(&key), task).await;
    if !fired(&armed).await || first.outcome != Outcome::Unknown {
        a.proxy.disarm_all_faults();
        return Ok(Verdict::Unknown(Msg::new("unknown.fault_not_fired")));
    }
    retry_finds_the_report(a, task, &key).await
}

async fn timeout(a: &mut Arena) -> Checked {
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
        a.proxy.disarm_all_faults();
        return Ok(Verdict::Unknown(Msg::new("unknown.not_held")));
    }
    retry_finds_the_report(a, task, &key).await
}

/// How many backends wait for the transaction `xid` (a lock not granted).
async fn waiting_for(pool: &sqlx::PgPool, xid: &str) -> Result<i64, ExerciseError> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks
          WHERE locktype = 'transactionid' AND transactionid::text = $1 AND NOT granted",
    )
    .bind(xid)
    .fetch_one(pool)
    .await?)
}

/// The answers of requests that raced on one key judged: one report, one 201, and replays
/// naming it. The two ways a check before the INSERT breaks are named as such: both requests
/// inserted (no UNIQUE guard), or the loser hit the guard and was answered with an error.
fn judge_race(calls: &[Exchange], rows: &[ReportRow], task: i64) -> Result<(), Verdict> {
    if let Some(loser) = calls.iter().find(|c| c.status.is_some_and(|s| s >= 500)) {
        return Err(Verdict::Fail(
            fail("race_loser")
                .arg("who", who(&loser.who))
                .arg("status", i64::from(loser.status.unwrap_or(0))),
        ));
    }
    if rows.len() > 1 {
        return Err(Verdict::Fail(
            fail("race_reports")
                .arg("task", task)
                .arg("count", rows.len()),
        ));
    }
    let row = one_report(rows, task)?;
    let created = calls.iter().filter(|c| c.status == Some(201)).count();
    if created != 1 {
        return Err(Verdict::Fail(fail("created").arg("count", created)));
    }
    for call in calls.iter().filter(|c| c.status != Some(201)) {
        replays(call, row)?;
    }
    for call in calls.iter().filter(|c| c.status == Some(201)) {
        names_the_report(call, row)?;
    }
    Ok(())
}

async fn race(a: &mut Arena) -> Checked {
    let task = a.task(7);
    let key = a.key(task);
    a.step(Msg::new("step.race_hold"));
    // The lab's row with the key, uncommitted: an INSERT with the same key waits for it.
    let mut held = a.pool.begin().await?;
    sqlx::query(
        "INSERT INTO reports (task_id, report_type, idempotency_key, payload_hash)
         VALUES ($1, 'held by the lab', $2, 'lab')",
    )
    .bind(task)
    .bind(&key)
    .execute(&mut *held)
    .await?;
    let xid: String = sqlx::query_scalar(
        "SELECT backend_xid::text FROM pg_stat_activity WHERE pid = pg_backend_pid()",
    )
    .fetch_one(&mut *held)
    .await?;

    let calls: Vec<_> = ["client.1", "client.2"]
        .iter()
        .map(|who| {
            let call = a.call(who, Via::Direct, Some(&key), report_body(task, "monthly"));
            let client = a.client.clone();
            tokio::spawn(async move { send(&client, call).await })
        })
        .collect();
    let deadline = Instant::now() + STAGING_LIMIT;
    let mut waiting = 0;
    while Instant::now() < deadline && !calls.iter().all(|c| c.is_finished()) {
        waiting = waiting_for(&a.pool, &xid).await?;
        if waiting >= 2 {
            break;
        }
        tokio::time::sleep(LOCK_POLL).await;
    }
    a.step(Msg::new("step.race_release").arg("waiting", waiting));
    held.rollback().await?;
    let mut answers = Vec::new();
    for call in calls {
        let exchange = call.await.expect("a call does not panic");
        a.schedule
            .push(crate::verdict::Line::Call(exchange.clone()));
        answers.push(exchange);
    }
    let rows = a.rows(task).await?;
    if let Err(v) = judge_race(&answers, &rows, task) {
        return Ok(v);
    }
    if waiting < 2 {
        // Nothing broke, and the race was not run: the requests never met at the database.
        return Ok(Verdict::Unknown(
            Msg::new("unknown.no_race").arg("waiting", waiting),
        ));
    }
    Ok(Verdict::Pass)
}

async fn burst(a: &mut Arena) -> Checked {
    let mut rng = ChaCha8Rng::seed_from_u64(a.seed);
    for round in 0..a.repeat.max(1) {
        let task = a.task(100 + i64::from(round));
        let key = a.key(task);
        let starts: Vec<u64> = (0..BURST_SIZE)
            .map(|_| rng.random_range(0..=BURST_SPREAD_MS))
            .collect();
        let before = a.schedule.len();
        a.step(
            Msg::new("step.burst")
                .arg("round", i64::from(round) + 1)
                .arg("size", BURST_SIZE)
                .arg("spread", BURST_SPREAD_MS as i64),
        );
        let client = a.client.clone();
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
                let client = client.clone();
                let start = Duration::from_millis(*start);
                async move {
                    // A seeded spread of start times: what this check explores, not an order.
                    tokio::time::sleep(start).await;
                    send(&client, call).await
                }
            })
            .collect();
        let answers = join_all(calls).await;
        for exchange in &answers {
            a.schedule
                .push(crate::verdict::Line::Call(exchange.clone()));
        }
        let rows = a.rows(task).await?;
        if let Err(v) = judge_race(&answers, &rows, task) {
            return Ok(v);
        }
        // A round that held: told in one line, not call by call.
        a.schedule.truncate(before);
        a.step(
            Msg::new("step.burst_held")
                .arg("round", i64::from(round) + 1)
                .arg("size", BURST_SIZE),
        );
    }
    Ok(Verdict::Pass)
}

async fn crash(a: &mut Arena) -> Checked {
    let Some(channel) = a.commit_channel.clone() else {
        return Ok(Verdict::Skipped(Msg::new("skipped.target")));
    };
    if a.guest.is_none() {
        return Ok(Verdict::Skipped(Msg::new("skipped.target")));
    }
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
    let client = a.client.clone();
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
        a.proxy.disarm_all_faults();
        return Ok(Verdict::Unknown(
            Msg::new("unknown.no_commit").arg("seconds", STAGING_LIMIT.as_secs() as i64),
        ));
    }
    // Right after the COMMIT: whatever the service meant to do next (answer, remember the key
    // in memory) does not happen. Its answer, if it had begun one, is dropped by the proxy.
    a.guest.as_mut().expect("checked above").kill().await;
    let first = first.await.expect("a call does not panic");
    a.schedule.push(crate::verdict::Line::Call(first));
    fired(&armed).await;
    a.proxy.disarm_all_faults();
    a.step(Msg::new("step.restart"));
    let restarted = a.guest.as_mut().expect("checked above").start().await?;
    if restarted.is_err() {
        return Ok(Verdict::Unknown(Msg::new("unknown.no_restart")));
    }
    retry_finds_the_report(a, task, &key).await
}

/// The hostile sample: what a careless or malicious client sends. (label, content type,
/// body, key)
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

async fn hostile(a: &mut Arena) -> Checked {
    let task = a.task(10);
    let mut rng = ChaCha8Rng::seed_from_u64(a.seed ^ 0x686f_7374);
    let sample = hostile_sample(task, &mut rng);
    a.step(Msg::new("step.hostile").arg("count", sample.len()));
    let mut broke = None;
    for (label, body, key) in sample {
        let mut call = a.call(label, Via::Direct, key.as_deref(), body);
        call.who = label.to_string();
        let exchange = send(&a.client, call).await;
        let bad = match exchange.status {
            Some(status) if status >= 500 => Some(
                fail("server_error")
                    .arg("who", who(label))
                    .arg("status", i64::from(status)),
            ),
            Some(status) if status >= 400 && !exchange.json_body => {
                Some(fail("not_json").arg("who", who(label)))
            }
            Some(_) => None,
            None => Some(fail("no_answer").arg("who", who(label))),
        };
        if let Some(msg) = bad {
            a.schedule.push(crate::verdict::Line::Call(exchange));
            broke.get_or_insert(msg);
        }
    }
    // Still standing after all that.
    let health = a
        .client
        .get(format!("{}/health", a.direct))
        .timeout(PATIENT)
        .send()
        .await;
    if health.is_err() {
        broke.get_or_insert(fail("down"));
    }
    let _ = read_rows(&a.pool, task).await?;
    Ok(broke.map_or(Verdict::Pass, Verdict::Fail))
}

impl World for Arena {
    fn schedule(&mut self) -> &mut Vec<crate::verdict::Line> {
        &mut self.schedule
    }

    /// With `--target` the lab cannot kill and start the service again.
    fn skipped(&self, spec: &CheckSpec) -> Option<Verdict> {
        (spec.restarts && self.guest.is_none())
            .then(|| Verdict::Skipped(Msg::new("skipped.target")))
    }

    fn mark(&self) -> Mark {
        self.guest.as_ref().map(Guest::mark).unwrap_or_default()
    }

    async fn check(&mut self, name: &str) -> Result<Verdict, ExerciseError> {
        run(name, self).await
    }

    async fn after(&mut self) {
        self.proxy.disarm_all_faults();
    }

    async fn output(&self, mark: &Mark) -> Option<String> {
        self.guest.as_ref()?.said_since(mark).await
    }

    async fn close(mut self) {
        if let Some(mut guest) = self.guest.take() {
            guest.stop().await;
        }
    }
}
