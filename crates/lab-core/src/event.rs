//! The events a scenario emits. They carry message keys, not sentences, so one recorded run
//! renders in every language.

use serde::Serialize;
use serde_json::Value;

use crate::{Facts, Msg};

/// What the caller of a network operation saw. Three words, never more: a timeout is `Unknown`,
/// not a failure, because the caller cannot tell whether the effect happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The caller got a success answer.
    Ok,
    /// The caller got a definite error answer (a 4xx/5xx, a refused connection).
    Fail,
    /// No answer: a timeout or a dropped connection. The effect may or may not have happened.
    Unknown,
}

impl Outcome {
    pub fn word(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Fail => "fail",
            Outcome::Unknown => "unknown",
        }
    }
}

/// What a fault on a hop does, as a picture marks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// Every answer is held this long on its way back (a downstream latency toxic).
    Held { millis: u64 },
    /// The next answer is dropped after the work was done (a one-shot fault).
    Dropped,
    /// Nothing gets through: a black hole, or the hop taken off the network.
    Cut,
    /// The fault is taken off: the hop is healthy again.
    Healed,
}

impl Fault {
    /// The word used in JSON and in message keys (`fault.held`, …).
    pub fn word(self) -> &'static str {
        match self {
            Fault::Held { .. } => "held",
            Fault::Dropped => "dropped",
            Fault::Cut => "cut",
            Fault::Healed => "healed",
        }
    }
}

/// A snapshot of the rows or keys that matter at a moment of the story.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    /// What is shown, e.g. "table tasks".
    pub title: Msg,
    /// Column names as they are in the database (not translated: learners type them in psql).
    pub columns: Vec<String>,
    /// Cell values already formatted; `NULL` for SQL nulls.
    pub rows: Vec<Vec<String>>,
}

/// The server a statement or command ran on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Server {
    Postgres,
    Redis,
}

/// Where in the lab's code something ran: the function (the span it was instrumented with) and
/// where it is written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CodePlace {
    pub function: String,
    /// Relative to the workspace, e.g. `crates/lab-services/src/reports.rs`.
    pub file: String,
    pub line: u32,
}

/// A SQL statement or a Redis command that ran, as the server answered it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Executed {
    pub server: Server,
    /// The bundled service that ran it; `None` for the scenario's own actors (a worker, a
    /// client).
    pub by: Option<String>,
    pub code: Option<CodePlace>,
    /// The statement on one line (parameters as `$1`), or the command as redis-cli shows it.
    pub text: String,
    /// psql's command tag (`INSERT 0 1`, `SELECT 2`), or the reply as redis-cli shows it.
    pub result: String,
}

/// One thing that happened in a scenario.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A scenario begins: its title and story come from its catalogue.
    Start { scenario: String },
    /// A heading for one side of a two-sided scenario (the broken design, the fixed one).
    Side { text: Msg },
    /// A step of the story. Step mode pauses after each.
    Step { number: u32, text: Msg },
    /// A network call is sent by one of our actors. Events inside the service that handles it
    /// follow, then its [`Event::Response`]. `from` names the caller (a label such as
    /// `worker.a`) and `to` the service it calls, for diagrams; the text is what is told.
    Request {
        text: Msg,
        from: Option<String>,
        to: Option<String>,
        /// How long the caller waits for the answer, when its client has a timeout the story
        /// is about (drawn beside the call; the text says it in words already).
        timeout_ms: Option<u64>,
    },
    /// What the caller of the last request saw.
    Response {
        outcome: Outcome,
        status: Option<u16>,
        /// The response body as received (JSON), if any.
        body: Option<String>,
        /// Why the outcome is what it is, when there was no response (timeout, reset).
        detail: Option<Msg>,
    },
    /// Something that happened inside a bundled service. Step mode pauses here too.
    Service { service: String, text: Msg },
    /// A SQL statement or Redis command a step executed (see [`crate::trace`]). Shown with
    /// `--show-sql` / `--show-commands`, always in JSON.
    Executed(Executed),
    /// The rows or keys that matter, read from the real servers.
    State { table: Table },
    /// A fault put on the hop in front of the service `hop` (or taken off it). Drawn in
    /// pictures and the web view, not told: the step that breaks the hop says it in words.
    Fault { hop: String, fault: Fault },
    /// A service reached a checkpoint where the scenario holds or orders requests (one with a
    /// hook installed; points nobody holds are not reported). Drawn, not told.
    Checkpoint { point: String },
    /// A remark in the story.
    Note { text: Msg },
    /// A question asked before the decisive step; `prefix.question` and `prefix.options`.
    Predict { prefix: String },
    /// What the learner typed in step mode in answer to a prediction.
    LearnerAnswer { answer: String },
    /// The answer to the prediction, with measured values. Step mode pauses before it.
    Reveal { answer: Msg },
    /// A measured fact, read from real state.
    Fact { name: String, value: Value },
    /// Why it happened: the `explain` text of the scenario.
    Explain,
    /// "Check your understanding": the `quiz` list of the scenario.
    Quiz,
    /// The last event of a scenario: every fact, what was expected, and whether they agree.
    Summary {
        scenario: String,
        facts: Facts,
        expected: Facts,
        passed: bool,
        /// The knobs set away from their defaults (`--set name=value`), in order. With any set,
        /// the expected facts are the default run's, and a difference is the knob's doing.
        settings: Vec<(String, String)>,
    },
}
