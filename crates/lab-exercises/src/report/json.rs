//! A check run as JSON lines, one object per line, for a program to read: an object per check
//! as it ends, then one object that ends the run, whatever ended it. A check that did not run
//! (the program never answered, the lab failed, a signal) still gets its line, with the verdict
//! `unknown` and the reason.

use lab_core::Msg;
use serde_json::{Value, json};

use super::{Ending, Replay, Tally, Words};
use crate::exercise::Exercise;
use crate::verdict::{CheckReport, Line};

/// One check's object.
pub fn check(words: &Words, exercise: &Exercise, report: &CheckReport, replay: &Replay) -> Value {
    let schedule: Vec<Value> = report
        .schedule
        .iter()
        .map(|line| match line {
            Line::Step(msg) => json!({"step": words.of(exercise, msg)}),
            Line::Call(call) => json!({"call": call}),
            Line::Rows { task_id, rows } => {
                json!({"rows": {"task_id": task_id, "reports": rows}})
            }
            Line::Task(task) => json!({"task": task}),
            Line::Charges { order, charges } => {
                json!({"charges": {"order_id": order, "charges": charges}})
            }
        })
        .collect();
    json!({
        "exercise": exercise.name,
        "check": report.name,
        "verdict": report.verdict.word(),
        "reason": words.reason(exercise, &report.verdict),
        "reason_key": report.verdict.reason().map(|m| m.key.clone()),
        "schedule": schedule,
        "seed": report.seed,
        "replay": replay.line(report),
        "output": report.output,
    })
}

/// The lines that end a run: one per selected check that did not run, then the run's own.
pub fn ending(
    words: &Words,
    exercise: &Exercise,
    not_run: &[&str],
    tally: &Tally,
    ending: &Ending,
) -> Vec<Value> {
    let why = ending.why_not_run(words);
    let mut lines: Vec<Value> = not_run
        .iter()
        .map(|name| {
            json!({
                "exercise": exercise.name,
                "check": name,
                "verdict": "unknown",
                "reason": why,
                "reason_key": Msg::new(format!("not_run.{}", ending.word())).key,
                "schedule": [],
                "seed": null,
                "replay": null,
                "output": null,
            })
        })
        .collect();
    let (message, output) = match ending {
        Ending::Done | Ending::Interrupted => (None, None),
        Ending::NotReady(not_ready) => (
            Some(super::text::not_ready_line(words, not_ready)),
            Some(not_ready.output().to_string()),
        ),
        Ending::Error { message, .. } => (Some(message.clone()), None),
    };
    lines.push(json!({
        "exercise": exercise.name,
        "ended": ending.word(),
        "message": message,
        "output": output,
        "summary": tally,
    }));
    lines
}
