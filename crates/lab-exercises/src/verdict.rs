//! What a check says: its verdict, and the schedule that led to it, told as a scenario is
//! (steps, requests, answers with ok / fail / unknown, the rows read back).
//!
//! A verdict is one of four:
//!
//! - **pass**: the invariant held on this schedule;
//! - **fail**: it broke; [`Verdict::Fail`] names the invariant and the cause seen in real state,
//!   in one line;
//! - **unknown**: the check could not decide: the service did not answer, a fault it armed
//!   never fired, a moment it needed was not reached; the line says which;
//! - **skipped**: the check cannot run here (with `--target` the lab cannot kill and restart the
//!   service), with the reason.

use lab_core::Msg;
use serde::{Deserialize, Serialize};

/// How a call ended, as the caller sees it: the lessons' three outcomes (ok, fail, unknown),
/// decided by the one classifier the scenarios use too (`lab_core::wire::classify`).
pub use lab_core::event::Outcome;

/// How one check ended.
#[derive(Debug, Clone)]
pub enum Verdict {
    Pass,
    Fail(Msg),
    Unknown(Msg),
    Skipped(Msg),
}

/// A verdict without its reason: what progress keeps, and what `verify` compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictKind {
    Pass,
    Fail,
    Unknown,
    Skipped,
}

impl VerdictKind {
    pub const ALL: [VerdictKind; 4] = [
        VerdictKind::Pass,
        VerdictKind::Fail,
        VerdictKind::Unknown,
        VerdictKind::Skipped,
    ];

    pub fn word(self) -> &'static str {
        match self {
            VerdictKind::Pass => "pass",
            VerdictKind::Fail => "fail",
            VerdictKind::Unknown => "unknown",
            VerdictKind::Skipped => "skipped",
        }
    }
}

impl Verdict {
    pub fn kind(&self) -> VerdictKind {
        match self {
            Verdict::Pass => VerdictKind::Pass,
            Verdict::Fail(_) => VerdictKind::Fail,
            Verdict::Unknown(_) => VerdictKind::Unknown,
            Verdict::Skipped(_) => VerdictKind::Skipped,
        }
    }

    pub fn word(&self) -> &'static str {
        self.kind().word()
    }

    /// The one line that says why (none for a pass).
    pub fn reason(&self) -> Option<&Msg> {
        match self {
            Verdict::Pass => None,
            Verdict::Fail(msg) | Verdict::Unknown(msg) | Verdict::Skipped(msg) => Some(msg),
        }
    }
}

/// Who made a call, as a message: `client`, `client.2`, or a label of the check's
/// (`who.<label>` in the exercise's texts).
pub fn who(raw: &str) -> Msg {
    match raw.strip_prefix("client.") {
        Some(n) => Msg::new("who.client_n").arg("n", n),
        None => Msg::new(format!("who.{raw}")),
    }
}

/// One call as the lab made it, and what came back.
#[derive(Debug, Clone, Serialize)]
pub struct Sent {
    /// Who sent it: "client", "client.3", or a label of the check's.
    pub who: String,
    /// The path it was sent to (`/reports`, `/payments`).
    pub path: String,
    pub key: Option<String>,
    pub body: String,
    /// The HTTP status, if a whole answer came.
    pub status: Option<u16>,
    /// The answer's body, cut to a line (empty when no answer came).
    pub answer: String,
    /// Why no answer came: a key of the shared texts (`call.timed_out`, `call.dropped`,
    /// `call.refused`, `call.connect_timed_out`).
    pub no_answer: Option<&'static str>,
    /// How long the caller waited at most, in milliseconds.
    pub waited_ms: u64,
    /// Whether the whole answer's body is JSON.
    pub json_body: bool,
    /// The answer's `report_id` and `replayed`, when it has them.
    pub report_id: Option<i64>,
    pub replayed: Option<bool>,
    /// The answer's `charge_id`, when it has one (a payment's Charge).
    pub charge_id: Option<String>,
    /// The answer's `Idempotent-Replayed: true` header.
    pub replayed_header: bool,
    /// The answer's `Retry-After` header.
    pub retry_after: Option<String>,
    pub outcome: Outcome,
}

impl Sent {
    /// The answer's status for a message: the number, or the words "no answer".
    pub fn status_arg(&self) -> lab_core::Arg {
        match self.status {
            Some(status) => lab_core::Arg::Int(i64::from(status)),
            None => lab_core::Arg::Msg(Msg::new("call.no_answer")),
        }
    }

    /// A 2xx answer.
    pub fn succeeded(&self) -> bool {
        self.status.is_some_and(|s| (200..300).contains(&s))
    }
}

/// A charge as the lab's payment provider lists it (the oracle of the payments exercises).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ChargeRow {
    pub charge_id: String,
    pub amount: i64,
    pub currency: String,
    /// The key the learner's service gave the provider, if any.
    pub key: Option<String>,
}

/// A report as the lab reads it back from the table (the oracle).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ReportRow {
    pub id: i64,
    pub task_id: i64,
    pub report_type: String,
    pub idempotency_key: Option<String>,
}

/// A task as the lab reads it back from `tasks` (exercise `worker`).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TaskRow {
    pub id: i64,
    pub status: String,
    pub attempts: i32,
    pub report_id: Option<i64>,
    /// Whether its lease is still running, by the database's clock.
    pub leased: bool,
}

/// One line of a check's schedule.
#[derive(Debug, Clone)]
pub enum Line {
    /// What the lab does next, in the check's words.
    Step(Msg),
    /// A call and its answer.
    Call(Sent),
    /// The rows of `reports` for the check's task, read back.
    Rows { task_id: i64, rows: Vec<ReportRow> },
    /// The check's task, read back.
    Task(TaskRow),
    /// The charges the provider made for one order, read back.
    Charges {
        order: String,
        charges: Vec<ChargeRow>,
    },
}

/// A check's result: its verdict, its schedule, and what replays it.
#[derive(Debug, Clone)]
pub struct CheckReport {
    pub name: &'static str,
    pub verdict: Verdict,
    pub schedule: Vec<Line>,
    /// The seed of a check that explores timings (replayed with `--seed`).
    pub seed: Option<u64>,
    /// The tail of the program's output, for a check that failed or could not decide.
    pub output: Option<String>,
}
