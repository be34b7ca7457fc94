//! A check run as text for people, in the learner's language: a line per check with its
//! verdict, and under a check that did not pass the line that says why, its schedule (the
//! steps, the calls and their answers, the rows read back), the line that replays it, and what
//! the program printed meanwhile.

use lab_core::Msg;

use super::{Replay, Tally, Words};
use crate::exercise::{Exercise, Subject};
use crate::guest::NotReady;
use crate::verdict::{CheckReport, Line, Sent, Verdict};

/// The run's first line: what is checked.
pub fn heading(words: &Words, exercise: &Exercise, subject: &Subject) -> String {
    let shown = match subject {
        Subject::Program { dir, manifest } => words.common(
            Msg::new("check.subject_program")
                .arg("dir", dir.display().to_string())
                .arg("lang", manifest.lang.as_str()),
        ),
        Subject::Target { url } => {
            words.common(Msg::new("check.subject_target").arg("url", url.as_str()))
        }
    };
    words.common(
        Msg::new("check.heading")
            .arg("exercise", exercise.name)
            .arg("subject", shown),
    )
}

/// One check's lines.
pub fn check(
    words: &Words,
    exercise: &Exercise,
    report: &CheckReport,
    replay: &Replay,
) -> Vec<String> {
    let title = words.of(exercise, &Msg::new(format!("check.{}.title", report.name)));
    // One column for the check names, as wide as the exercise's longest.
    let width = exercise.checks().map(|c| c.name.len()).max().unwrap_or(0);
    let mut lines = vec![format!(
        "  {} {:<width$} {title}",
        words.verdict(report.verdict.kind()),
        report.name
    )];
    let Some(reason) = words.reason(exercise, &report.verdict) else {
        return lines;
    };
    let label = match report.verdict {
        Verdict::Fail(_) => words.common("check.broke"),
        _ => words.common("check.why"),
    };
    lines.push(format!("      {label} {reason}"));
    if matches!(report.verdict, Verdict::Skipped(_)) {
        return lines;
    }
    for line in schedule(words, exercise, report) {
        lines.push(format!("      {line}"));
    }
    if words.diagram {
        for line in lanes(words, exercise, report) {
            lines.push(format!("      {line}"));
        }
    }
    lines.push(format!(
        "      {} {}",
        words.common("check.replay"),
        replay.line(report)
    ));
    if let Some(output) = &report.output {
        lines.push(format!("      {}", words.common("check.output")));
        for line in output.lines() {
            lines.push(format!("        | {line}"));
        }
    }
    lines
}

/// The run's last line: how many checks ended each way.
pub fn summary(words: &Words, tally: &Tally) -> String {
    let mut line = words.common(
        Msg::new("check.summary")
            .arg("passed", tally.passed)
            .arg("failed", tally.failed)
            .arg("unknown", tally.unknown)
            .arg("skipped", tally.skipped)
            .arg("total", tally.total()),
    );
    if tally.not_run > 0 {
        line.push_str(&words.common(Msg::new("check.summary_not_run").arg("count", tally.not_run)));
    }
    line
}

/// Why nothing was checked: the program never answered.
pub fn not_ready_line(words: &Words, not_ready: &NotReady) -> String {
    match not_ready {
        NotReady::Exited { status, port, .. } => words.common(
            Msg::new("check.not_ready_exited")
                .arg("status", status.as_str())
                .arg("port", i64::from(*port)),
        ),
        NotReady::Silent { waited, port, .. } => words.common(
            Msg::new("check.not_ready_silent")
                .arg("port", i64::from(*port))
                .arg("seconds", waited.as_secs()),
        ),
        NotReady::PortTaken { port, .. } => {
            words.common(Msg::new("check.not_ready_port_taken").arg("port", i64::from(*port)))
        }
    }
}

/// The program never answered: why, and its output.
pub fn not_ready(words: &Words, not_ready: &NotReady) -> Vec<String> {
    let output = not_ready.output();
    let mut lines = vec![not_ready_line(words, not_ready)];
    if output.trim().is_empty() {
        lines.push(format!("  {}", words.common("check.no_output")));
    }
    lines.extend(output.lines().map(|line| format!("  | {line}")));
    lines
}

/// An answer as a schedule shows it: its status and body, or why none came.
fn answer(words: &Words, call: &Sent) -> String {
    match (call.status, call.no_answer) {
        (Some(status), _) => {
            // The two headers the contracts turn on are shown with the status: a replay must
            // say so, and a 409 tells the client when to come back.
            let mut headers = String::new();
            if call.replayed_header {
                headers.push_str("  Idempotent-Replayed: true");
            }
            if let Some(after) = &call.retry_after {
                headers.push_str(&format!("  Retry-After: {after}"));
            }
            format!("{status}{headers} {}", call.answer)
        }
        (None, Some(detail)) => words.common(Msg::new(detail).arg("ms", call.waited_ms)),
        (None, None) => words.common("call.no_answer"),
    }
}

fn outcome_word(words: &Words, outcome: crate::verdict::Outcome) -> String {
    words.common(Msg::new(format!("outcome.{}", outcome.word())))
}

/// The schedule of a check, as lines of text.
pub fn schedule(words: &Words, exercise: &Exercise, report: &CheckReport) -> Vec<String> {
    let mut lines = Vec::new();
    let mut step = 0;
    for line in &report.schedule {
        match line {
            Line::Step(msg) => {
                step += 1;
                lines.push(format!("{step}. {}", words.of(exercise, msg)));
            }
            Line::Call(call) => {
                let key = match &call.key {
                    Some(key) => format!("  Idempotency-Key: {}", shown_key(words, key)),
                    None => String::new(),
                };
                lines.push(format!(
                    "   {} → POST {}{key}  {}",
                    words.who(exercise, &call.who),
                    call.path,
                    call.body
                ));
                lines.push(format!(
                    "   ← {}  ({})",
                    answer(words, call),
                    outcome_word(words, call.outcome)
                ));
            }
            Line::Task(task) => {
                let report = task
                    .report_id
                    .map_or_else(|| "NULL".to_string(), |id| id.to_string());
                let lease = words.common(if task.leased {
                    "check.leased"
                } else {
                    "check.not_leased"
                });
                lines.push(format!(
                    "   {}",
                    words.common(
                        Msg::new("check.task")
                            .arg("task", task.id)
                            .arg("status", task.status.as_str())
                            .arg("attempts", i64::from(task.attempts))
                            .arg("report", report)
                            .arg("lease", lease)
                    )
                ));
            }
            Line::Charges { order, charges } => {
                let msg = if charges.is_empty() {
                    Msg::new("check.no_charges").arg("order", order.as_str())
                } else {
                    let shown: Vec<String> = charges
                        .iter()
                        .map(|c| {
                            let key = c
                                .key
                                .as_deref()
                                .map_or_else(|| words.common("check.no_key"), str::to_string);
                            format!(
                                "{} ({} {}, {key})",
                                c.charge_id,
                                money(c.amount),
                                c.currency
                            )
                        })
                        .collect();
                    Msg::new("check.charges")
                        .arg("order", order.as_str())
                        .arg("charges", shown.join(", "))
                };
                lines.push(format!("   {}", words.common(msg)));
            }
            Line::Rows { task_id, rows } => {
                let msg = if rows.is_empty() {
                    Msg::new("check.no_rows").arg("task", *task_id)
                } else {
                    let shown: Vec<String> = rows
                        .iter()
                        .map(|r| {
                            let key = r
                                .idempotency_key
                                .clone()
                                .unwrap_or_else(|| words.common("check.no_key"));
                            format!("#{} ({}, {key})", r.id, r.report_type)
                        })
                        .collect();
                    Msg::new("check.rows")
                        .arg("task", *task_id)
                        .arg("rows", shown.join(", "))
                };
                lines.push(format!("   {}", words.common(msg)));
            }
        }
    }
    lines
}

/// Minor units as major: 1990 → 19.90.
fn money(minor: i64) -> String {
    format!("{}.{:02}", minor / 100, minor % 100)
}

/// A key as a schedule shows it: quoted (an empty or blank key must be visible), and a long
/// one cut, with its length.
fn shown_key(words: &Words, key: &str) -> String {
    const SHOWN: usize = 40;
    if key.chars().count() <= SHOWN {
        return format!("{key:?}");
    }
    let start: String = key.chars().take(SHOWN).collect();
    let length = words.common(Msg::new("check.key_length").arg("n", key.chars().count()));
    format!("\"{start}…\" {length}")
}

/// The calls of a schedule as lanes, one per caller and one for the service, time going down:
/// `●──▶` a call, `◀──●` an answer, `◀┄┄✗` an answer that never arrived (as `lab run
/// --diagram` draws a scenario).
pub fn lanes(words: &Words, exercise: &Exercise, report: &CheckReport) -> Vec<String> {
    const LANE: usize = 4;
    let mut callers: Vec<&str> = Vec::new();
    for line in &report.schedule {
        if let Line::Call(call) = line
            && !callers.contains(&call.who.as_str())
        {
            callers.push(&call.who);
        }
    }
    if callers.is_empty() {
        return Vec::new();
    }
    let service = callers.len();
    let mut out = Vec::new();
    let mut names: Vec<String> = callers.iter().map(|who| words.who(exercise, who)).collect();
    names.push(words.common("diagram.service"));
    for (i, name) in names.iter().enumerate() {
        out.push(format!("{}┌ {name}", "│   ".repeat(i)));
    }
    let blank = || -> Vec<char> {
        (0..=service * LANE)
            .map(|i| if i % LANE == 0 { '│' } else { ' ' })
            .collect()
    };
    let mut step = 0;
    for line in &report.schedule {
        match line {
            Line::Step(_) => {
                step += 1;
                out.push(format!("{}  {step}.", blank().iter().collect::<String>()));
            }
            Line::Call(call) => {
                let at = callers.iter().position(|c| *c == call.who).unwrap_or(0);
                let mut cells = blank();
                cells[at * LANE] = '●';
                for cell in &mut cells[at * LANE + 1..service * LANE - 1] {
                    *cell = '─';
                }
                cells[service * LANE - 1] = '▶';
                let key = call
                    .key
                    .as_deref()
                    .map(|k| format!(" {}", shown_key(words, k)));
                out.push(format!(
                    "{}  POST {}{}",
                    cells.iter().collect::<String>(),
                    call.path,
                    key.unwrap_or_default()
                ));
                let mut cells = blank();
                cells[at * LANE + 1] = '◀';
                let (fill, end) = match call.status {
                    Some(_) => ('─', '●'),
                    None => ('┄', '✗'),
                };
                for cell in &mut cells[at * LANE + 2..service * LANE] {
                    *cell = fill;
                }
                cells[service * LANE] = end;
                let shown = call
                    .status
                    .map_or_else(|| answer(words, call), |s| s.to_string());
                out.push(format!(
                    "{}  {shown} ({})",
                    cells.iter().collect::<String>(),
                    outcome_word(words, call.outcome)
                ));
            }
            Line::Rows { .. } | Line::Task(_) | Line::Charges { .. } => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::Outcome;
    use lab_core::Lang;

    fn sent(status: Option<u16>) -> Sent {
        Sent {
            who: "client".into(),
            path: "/payments".into(),
            key: Some("pay-1".into()),
            body: "{}".into(),
            status,
            answer: "{\"error\":\"payment_in_progress\"}".into(),
            no_answer: None,
            waited_ms: 1000,
            json_body: true,
            report_id: None,
            replayed: None,
            charge_id: None,
            replayed_header: false,
            retry_after: None,
            outcome: Outcome::Fail,
        }
    }

    #[test]
    fn an_answer_shows_the_headers_the_contracts_turn_on() {
        let words = Words::new(Lang::En, false).unwrap();
        assert_eq!(
            answer(&words, &sent(Some(409))),
            "409 {\"error\":\"payment_in_progress\"}"
        );
        let busy = Sent {
            retry_after: Some("1".into()),
            ..sent(Some(409))
        };
        assert_eq!(
            answer(&words, &busy),
            "409  Retry-After: 1 {\"error\":\"payment_in_progress\"}"
        );
        let replay = Sent {
            replayed_header: true,
            answer: "{\"charge_id\":\"ch_1\"}".into(),
            ..sent(Some(200))
        };
        assert_eq!(
            answer(&words, &replay),
            "200  Idempotent-Replayed: true {\"charge_id\":\"ch_1\"}"
        );
        assert_eq!(answer(&words, &sent(None)), "no answer");
    }
}
