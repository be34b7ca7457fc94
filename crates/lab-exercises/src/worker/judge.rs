//! The worker's judgements: rows, and what the doors saw, in; a verdict out. Nothing here reads
//! the database or waits: the checks read, and these decide.

use lab_core::{Arg, Msg};

use super::door::{DoorCall, Got};
use crate::judgement::{Judged, broke, fail, undecided, unknown};
use crate::verdict::{ReportRow, TaskRow};

/// How far a lease may stray from `LEASE_SECONDS` before the lab calls it another length: the
/// worker's clock and the database's may differ a little (the same machine's, on a throwaway
/// server); a lease of its own length is off by seconds, not milliseconds.
pub(super) const LEASE_SLACK_SECONDS: f64 = 1.0;

/// A task as the lab reads it at a staged moment: its row, and its lease exactly.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct TaskState {
    pub row: TaskRow,
    /// `lease_until` as the database prints it: compared, never computed with.
    pub lease_until: Option<String>,
}

impl TaskState {
    /// What differs from `earlier` to this, column by column (`status processing → completed,
    /// report_id NULL → 7`); empty when nothing does.
    pub fn changes_since(&self, earlier: &TaskState) -> String {
        let mut changes = Vec::new();
        let mut differs = |column: &str, was: String, is: String| {
            if was != is {
                changes.push(format!("{column} {was} → {is}"));
            }
        };
        differs(
            "status",
            earlier.row.status.clone(),
            self.row.status.clone(),
        );
        differs(
            "attempts",
            earlier.row.attempts.to_string(),
            self.row.attempts.to_string(),
        );
        differs(
            "report_id",
            shown(earlier.row.report_id),
            shown(self.row.report_id),
        );
        differs(
            "lease_until",
            earlier.lease_until.clone().unwrap_or_else(|| "NULL".into()),
            self.lease_until.clone().unwrap_or_else(|| "NULL".into()),
        );
        changes.join(", ")
    }
}

fn shown(id: Option<i64>) -> String {
    id.map_or_else(|| "NULL".into(), |id| id.to_string())
}

/// An exit code as a message: the number, or the words for a signal.
pub(super) fn exit_arg(code: Option<i32>) -> Arg {
    match code {
        Some(code) => Arg::Int(i64::from(code)),
        None => Arg::Msg(Msg::new("exit.signal")),
    }
}

/// The end every task should reach: one report, the task completed by `attempts`, pointing at
/// that report. The ways it breaks are named by what the rows show.
pub(super) fn judge_done(task: &TaskRow, rows: &[ReportRow], attempts: i32) -> Judged {
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
                .arg("task", task.id)
                .arg("got", i64::from(task.attempts))
                .arg("expected", i64::from(attempts)),
        );
    }
    if task.report_id != Some(rows[0].id) {
        let got = match task.report_id {
            Some(id) => Arg::Int(id),
            None => Arg::Str("NULL".into()),
        };
        return fail(
            broke("points_elsewhere")
                .arg("task", task.id)
                .arg("got", got)
                .arg("id", rows[0].id),
        );
    }
    Ok(())
}

/// While worker `who` is inside its call, the task must show its claim, committed: processing,
/// attempt `attempts`, with a lease (running, when `running`).
pub(super) fn judge_claim(who: &str, task: &TaskState, attempts: i32, running: bool) -> Judged {
    let row = &task.row;
    if row.status != "processing" || row.attempts != attempts {
        return fail(
            broke("claim_uncommitted")
                .arg("who", who)
                .arg("task", row.id)
                .arg("status", row.status.as_str())
                .arg("attempts", i64::from(row.attempts))
                .arg("expected", i64::from(attempts)),
        );
    }
    if task.lease_until.is_none() || (running && !row.leased) {
        let lease = task.lease_until.clone().unwrap_or_else(|| "NULL".into());
        return fail(
            broke("no_lease")
                .arg("who", who)
                .arg("task", row.id)
                .arg("attempts", i64::from(row.attempts))
                .arg("lease", lease),
        );
    }
    Ok(())
}

/// The lease a claim took, against `LEASE_SECONDS`: the claim ran after the lab launched the
/// worker and before its call arrived, so its length lies between `at_least` (the lease left
/// when the call arrived) and `at_most` (the lease's end less the launch), by the database's
/// clock.
pub(super) fn judge_lease(
    who: &str,
    task: i64,
    at_least: f64,
    at_most: f64,
    lease_seconds: u64,
) -> Judged {
    let asked = lease_seconds as f64;
    if at_least > asked + LEASE_SLACK_SECONDS {
        return fail(
            broke("lease_too_long")
                .arg("who", who)
                .arg("task", task)
                // Rounded down: a bound, said no higher than it is.
                .arg(
                    "seconds",
                    format!("{:.1}", (at_least * 10.0).floor() / 10.0),
                )
                .arg("lease", lease_seconds),
        );
    }
    if at_most < asked - LEASE_SLACK_SECONDS {
        return fail(
            broke("lease_too_short")
                .arg("who", who)
                .arg("task", task)
                .arg("seconds", format!("{:.1}", (at_most * 10.0).ceil() / 10.0))
                .arg("lease", lease_seconds),
        );
    }
    Ok(())
}

/// While worker B held the task, only stale worker A ran: whatever changed in the row is A's.
pub(super) fn judge_stale(before: &TaskState, after: &TaskState) -> Judged {
    let changes = after.changes_since(before);
    if changes.is_empty() {
        return Ok(());
    }
    fail(
        broke("stale_accepted")
            .arg("task", before.row.id)
            .arg("attempts", i64::from(before.row.attempts))
            .arg("changes", changes),
    )
}

/// After A's lease ran out and nobody claimed: strict refuses A's result (the completion and
/// any write of the report), non-strict accepts it.
pub(super) fn judge_expired(
    strict: bool,
    before: &TaskState,
    after: &TaskState,
    rows: &[ReportRow],
) -> Judged {
    let task = after.row.id;
    if strict {
        if after.row.status == "completed" {
            return fail(broke("strict_accepted").arg("task", task));
        }
        if let Some(id) = after.row.report_id
            && after.row.report_id != before.row.report_id
        {
            return fail(broke("strict_wrote").arg("task", task).arg("id", id));
        }
        return Ok(());
    }
    if after.row.status != "completed" {
        return fail(
            broke("lenient_refused")
                .arg("task", task)
                .arg("status", after.row.status.as_str()),
        );
    }
    judge_done(&after.row, rows, before.row.attempts)
}

/// B ran for a task A held under a running lease, and must not have taken it: the row as A's
/// claim left it (`held`), as it is after B (`after`), the calls B made, and whether A's lease
/// still ran when the lab looked (it ran when B claimed, then).
pub(super) fn judge_held_task(
    held: &TaskState,
    after: &TaskState,
    b_calls: usize,
    a_lease_ran: bool,
) -> Judged {
    let took = after.row.attempts != held.row.attempts
        || after.lease_until != held.lease_until
        || b_calls > 0;
    if !took {
        return Ok(());
    }
    if !a_lease_ran {
        return unknown(undecided("lease_ran_out").arg("task", held.row.id));
    }
    fail(
        broke("took_held_task")
            .arg("task", held.row.id)
            .arg("attempts", i64::from(after.row.attempts))
            .arg("held", i64::from(held.row.attempts))
            .arg("calls", b_calls),
    )
}

/// Two workers claimed one task at once: one claim must win. `callers`: the workers whose door
/// saw a call.
pub(super) fn judge_race(task: &TaskRow, callers: &[&str]) -> Judged {
    if task.attempts <= 1 && callers.len() <= 1 {
        return Ok(());
    }
    fail(
        broke("claimed_twice")
            .arg("task", task.id)
            .arg("attempts", i64::from(task.attempts))
            .arg("callers", callers.len()),
    )
}

/// A worker's call the service refused (a 4xx or 5xx answer): the first such, if any.
pub(super) fn refused(calls: &[DoorCall]) -> Option<&DoorCall> {
    calls
        .iter()
        .find(|c| matches!(c.got, Got::Answered { status, .. } if status >= 400))
}

/// A refused call of `who`'s for `task`, named: a 409 whose key holds another task's report
/// (`other`, as the lab read it) is a key that does not name the task; anything else is told
/// as answered.
pub(super) fn judge_refused(who: &str, task: i64, call: &DoorCall, other: Option<i64>) -> Judged {
    let Got::Answered { status, body, .. } = &call.got else {
        return Ok(());
    };
    if *status == 409
        && let (Some(key), Some(other)) = (&call.key, other)
        && other != task
    {
        return fail(
            broke("key_reused")
                .arg("who", who)
                .arg("task", task)
                .arg("key", key.as_str())
                .arg("other", other),
        );
    }
    fail(
        broke("call_refused")
            .arg("who", who)
            .arg("task", task)
            .arg("status", i64::from(*status))
            .arg("answer", crate::call::cut(body)),
    )
}

/// Worker `who` was held and then let go, and wrote nothing: if none of its calls was answered
/// (its client gave up on each), the lab never saw what it would have done with an answer, and
/// says so.
pub(super) fn judge_answered(who: &str, calls: &[DoorCall], code: Option<i32>) -> Judged {
    if calls.is_empty() || calls.iter().any(DoorCall::answered) {
        return Ok(());
    }
    let first = calls.iter().map(|c| c.arrived).min().expect("not empty");
    let last = calls.iter().filter_map(|c| c.ended).max().unwrap_or(first);
    unknown(
        undecided("gave_up")
            .arg("who", who)
            .arg("calls", calls.len())
            .arg("seconds", format!("{:.1}", (last - first).as_secs_f64()))
            .arg("code", exit_arg(code)),
    )
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

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

    fn state(
        status: &str,
        attempts: i32,
        report_id: Option<i64>,
        lease: Option<&str>,
    ) -> TaskState {
        TaskState {
            row: TaskRow {
                leased: lease.is_some(),
                ..task(status, attempts, report_id)
            },
            lease_until: lease.map(str::to_string),
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

    fn call(got: Got) -> DoorCall {
        let arrived = Instant::now();
        DoorCall {
            path: "/reports".into(),
            key: Some("monthly-report".into()),
            body: "{}".into(),
            arrived,
            ended: Some(arrived + Duration::from_millis(500)),
            got,
        }
    }

    fn answered(status: u16, body: &str) -> Got {
        Got::Answered {
            status,
            body: body.into(),
            replayed: false,
        }
    }

    fn key_of(judged: Judged) -> Option<String> {
        match verdict_of(judged).unwrap() {
            Verdict::Pass => None,
            other => Some(other.reason().unwrap().key.clone()),
        }
    }

    fn arg(judged: Judged, name: &str) -> Arg {
        let verdict = verdict_of(judged).unwrap();
        let msg = verdict.reason().expect("not a pass");
        msg.args
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("{name} in {msg:?}"))
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
        assert_eq!(arg(judged, "keys"), Arg::Str("t2-1, t2-2".into()));
        let same = [report(1, Some("k")), report(2, Some("k"))];
        assert_eq!(
            key_of(judge_done(&task("completed", 2, Some(2)), &same, 2)).as_deref(),
            Some("broke.reports")
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

    #[test]
    fn a_worker_inside_its_call_must_hold_a_committed_claim_with_a_lease() {
        let lease = Some("2026-12-03 17:21:32+00");
        assert_eq!(
            key_of(judge_claim(
                "A",
                &state("processing", 1, None, lease),
                1,
                true
            )),
            None
        );
        // What the lab saw of a claim left open across the call: the task still pending.
        let uncommitted = judge_claim("A", &state("pending", 0, None, None), 1, true);
        assert_eq!(arg(uncommitted, "status"), Arg::Str("pending".into()));
        assert_eq!(
            key_of(judge_claim(
                "B",
                &state("processing", 1, None, lease),
                2,
                true
            ))
            .as_deref(),
            Some("broke.claim_uncommitted")
        );
        assert_eq!(
            key_of(judge_claim(
                "A",
                &state("processing", 1, None, None),
                1,
                false
            ))
            .as_deref(),
            Some("broke.no_lease")
        );
        // A lease that ran out already: wrong where it must run, right where it may not.
        let ran_out = TaskState {
            row: task("processing", 1, None),
            lease_until: lease.map(str::to_string),
        };
        assert_eq!(
            key_of(judge_claim("A", &ran_out, 1, true)).as_deref(),
            Some("broke.no_lease")
        );
        assert_eq!(key_of(judge_claim("A", &ran_out, 1, false)), None);
    }

    #[test]
    fn a_lease_is_judged_by_the_bounds_the_lab_saw() {
        assert_eq!(key_of(judge_lease("A", 5, 1.7, 2.4, 2)), None);
        assert_eq!(
            key_of(judge_lease("A", 5, 59.5, 60.3, 2)).as_deref(),
            Some("broke.lease_too_long")
        );
        assert_eq!(
            key_of(judge_lease("A", 5, 0.1, 0.4, 2)).as_deref(),
            Some("broke.lease_too_short")
        );
        // A slow start widens the bounds; it never makes a right lease wrong.
        assert_eq!(key_of(judge_lease("A", 5, 0.2, 2.0, 2)), None);
    }

    #[test]
    fn any_change_while_b_holds_the_task_is_the_stale_workers() {
        let before = state("processing", 2, None, Some("t1"));
        assert_eq!(key_of(judge_stale(&before, &before.clone())), None);
        let completed = state("completed", 2, Some(7), None);
        let judged = judge_stale(&before, &completed);
        assert_eq!(
            arg(judged, "changes"),
            Arg::Str(
                "status processing → completed, report_id NULL → 7, lease_until t1 → NULL".into()
            )
        );
        let pointed = state("processing", 2, Some(7), Some("t1"));
        assert_eq!(
            key_of(judge_stale(&before, &pointed)).as_deref(),
            Some("broke.stale_accepted")
        );
    }

    #[test]
    fn an_expired_lease_is_refused_strict_and_accepted_otherwise() {
        let before = state("processing", 1, None, Some("t1"));
        let rows = [report(4, Some("report-task-2"))];
        let refused = before.clone();
        let completed = state("completed", 1, Some(4), None);
        let wrote = state("processing", 1, Some(4), Some("t1"));
        assert_eq!(key_of(judge_expired(true, &before, &refused, &rows)), None);
        assert_eq!(
            key_of(judge_expired(true, &before, &completed, &rows)).as_deref(),
            Some("broke.strict_accepted")
        );
        assert_eq!(
            key_of(judge_expired(true, &before, &wrote, &rows)).as_deref(),
            Some("broke.strict_wrote")
        );
        assert_eq!(
            key_of(judge_expired(false, &before, &completed, &rows)),
            None
        );
        assert_eq!(
            key_of(judge_expired(false, &before, &refused, &rows)).as_deref(),
            Some("broke.lenient_refused")
        );
    }

    #[test]
    fn a_task_held_under_a_running_lease_is_not_taken() {
        let held = state("processing", 1, None, Some("t1"));
        assert_eq!(key_of(judge_held_task(&held, &held.clone(), 0, true)), None);
        let taken = state("processing", 2, None, Some("t2"));
        assert_eq!(
            key_of(judge_held_task(&held, &taken, 1, true)).as_deref(),
            Some("broke.took_held_task")
        );
        // A call alone tells it too: B called for a task it did not hold.
        assert_eq!(
            key_of(judge_held_task(&held, &held.clone(), 1, true)).as_deref(),
            Some("broke.took_held_task")
        );
        // A's lease had run out when the lab looked: B may have taken it rightly.
        assert_eq!(
            key_of(judge_held_task(&held, &taken, 1, false)).as_deref(),
            Some("unknown.lease_ran_out")
        );
    }

    #[test]
    fn of_two_claims_at_once_one_wins() {
        assert_eq!(
            key_of(judge_race(&task("completed", 1, Some(1)), &["A"])),
            None
        );
        assert_eq!(key_of(judge_race(&task("pending", 0, None), &[])), None);
        assert_eq!(
            key_of(judge_race(&task("completed", 2, Some(1)), &["A", "B"])).as_deref(),
            Some("broke.claimed_twice")
        );
        // Both wrote attempts = 1 over each other: the calls tell it.
        assert_eq!(
            key_of(judge_race(&task("completed", 1, Some(1)), &["A", "B"])).as_deref(),
            Some("broke.claimed_twice")
        );
    }

    #[test]
    fn a_refused_call_is_named_by_its_answer_and_the_keys_owner() {
        let conflict = call(answered(409, r#"{"error":"idempotency_key_reused"}"#));
        assert_eq!(
            key_of(judge_refused("B", 2, &conflict, Some(1))).as_deref(),
            Some("broke.key_reused")
        );
        // The key's report is the task's own, or none: told as answered, not guessed at.
        assert_eq!(
            key_of(judge_refused("B", 2, &conflict, Some(2))).as_deref(),
            Some("broke.call_refused")
        );
        assert_eq!(
            key_of(judge_refused("B", 2, &conflict, None)).as_deref(),
            Some("broke.call_refused")
        );
        let created = call(answered(201, r#"{"report_id":1}"#));
        let calls = [created.clone(), conflict.clone()];
        assert_eq!(refused(&calls).map(|c| c.got.clone()), Some(conflict.got));
        assert!(refused(&[created, call(Got::Gone)]).is_none());
    }

    #[test]
    fn a_worker_that_gave_up_while_held_is_an_unknown_not_a_verdict() {
        let gone = [call(Got::Gone), call(Got::Gone)];
        let judged = judge_answered("A", &gone, Some(1));
        assert_eq!(arg(judged, "calls"), Arg::Int(2));
        assert_eq!(
            key_of(judge_answered("A", &gone, None)).as_deref(),
            Some("unknown.gave_up")
        );
        let later = [call(Got::Gone), call(answered(200, "{}"))];
        assert_eq!(key_of(judge_answered("A", &later, Some(3))), None);
        assert_eq!(key_of(judge_answered("A", &[], Some(3))), None);
    }
}
