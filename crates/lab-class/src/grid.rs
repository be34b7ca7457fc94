//! The board's view of the class, computed from the store's rows: the grid (learner × exercise
//! × check, the newest verdict of each cell and how long ago it came), per check how many
//! learners pass and the commonest broken invariant with one example schedule, and the exports
//! (CSV, JUnit). Pure functions of the rows, so what the page shows is tested without a server.

use std::collections::BTreeMap;

use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};
use serde_json::{Value, json};

use crate::model::Kind;
use crate::store::{Learner, Source, Stored};

/// How the page refers to a learner when names are hidden (projector mode, or no instructor
/// token): "#3", by the order they joined.
fn label(index: usize) -> String {
    format!("#{}", index + 1)
}

/// The exercises (in the catalogue's order) that have at least one cell, with all their checks.
fn exercises_seen(cells: &[Stored]) -> Vec<&'static lab_exercises::Exercise> {
    lab_exercises::EXERCISES
        .iter()
        .copied()
        .filter(|e| cells.iter().any(|c| c.exercise == e.name))
        .collect()
}

/// The commonest broken invariant of one check: its key, its words and one replay line (the
/// newest example), and how many learners' cells broke it. Ties go to the key that sorts first,
/// so two reads of one board say the same.
fn commonest_broken(failed: &[&Stored]) -> Option<Value> {
    let mut by_key: BTreeMap<&str, Vec<&Stored>> = BTreeMap::new();
    for cell in failed {
        let key = cell
            .reason_key
            .as_deref()
            .or(cell.reason.as_ref().map(|r| r.en.as_str()))
            .unwrap_or("");
        by_key.entry(key).or_default().push(cell);
    }
    let (key, cells) = by_key
        .into_iter()
        .max_by(|(ka, a), (kb, b)| a.len().cmp(&b.len()).then(kb.cmp(ka)))?;
    let example = cells
        .iter()
        .min_by(|a, b| a.age_s.total_cmp(&b.age_s))
        .expect("a group has a cell");
    Some(json!({
        "reason_key": key,
        "reason": example.reason,
        "replay": example.replay,
        "count": cells.len(),
        // The board adds its schedule (`Store::schedules`).
        "example": example.id,
    }))
}

/// The board as the page reads it (`GET /api/board`). Names only when `names` (the instructor's
/// token, projector mode off); otherwise every learner is a number.
pub fn board(learners: &[Learner], cells: &[Stored], names: bool) -> Value {
    let index_of: BTreeMap<i64, usize> = learners
        .iter()
        .enumerate()
        .map(|(i, l)| (l.id, i))
        .collect();
    let learners_json: Vec<Value> = learners
        .iter()
        .enumerate()
        .map(|(i, l)| {
            json!({
                "id": l.id,
                "label": label(i),
                "name": names.then_some(l.name.as_str()),
            })
        })
        .collect();
    let cells_json: Vec<Value> = cells
        .iter()
        .filter(|c| index_of.contains_key(&c.learner))
        .map(|c| {
            json!({
                "learner": c.learner,
                "exercise": c.exercise,
                "check": c.check,
                "verdict": c.verdict,
                "source": c.source,
                "age_s": c.age_s,
                "reason_key": c.reason_key,
                "reason": c.reason,
                "replay": c.replay,
            })
        })
        .collect();
    let exercises = exercises_seen(cells);
    let mut checks = Vec::new();
    for exercise in &exercises {
        for check in exercise.checks() {
            let of_check: Vec<&Stored> = cells
                .iter()
                .filter(|c| c.exercise == exercise.name && c.check == check.name)
                .collect();
            let failed: Vec<&Stored> = of_check
                .iter()
                .copied()
                .filter(|c| c.verdict == Kind::Fail)
                .collect();
            checks.push(json!({
                "exercise": exercise.name,
                "check": check.name,
                "passing": of_check.iter().filter(|c| c.verdict == Kind::Pass).count(),
                "reported": of_check.len(),
                "commonest_broken": commonest_broken(&failed),
            }));
        }
    }
    json!({
        "names": names,
        "learners": learners_json,
        "exercises": exercises.iter().map(|e| json!({
            "name": e.name,
            "checks": e.checks().map(|c| c.name).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "cells": cells_json,
        "checks": checks,
    })
}

fn name_of(learners: &[Learner], id: i64) -> &str {
    learners
        .iter()
        .find(|l| l.id == id)
        .map_or("?", |l| l.name.as_str())
}

fn source_word(source: Source) -> &'static str {
    match source {
        Source::SelfReported => "self-reported",
        Source::Verified => "verified",
    }
}

/// Every cell as CSV, one row per learner, exercise and check, with a header.
pub fn csv(learners: &[Learner], cells: &[Stored]) -> String {
    let mut out = csv::Writer::from_writer(Vec::new());
    let header = [
        "learner",
        "exercise",
        "check",
        "verdict",
        "source",
        "reason_key",
        "reason_en",
        "reason_ru",
        "replay",
        "received_at",
    ];
    // Writing into a Vec cannot fail.
    let _ = out.write_record(header);
    for cell in cells {
        let _ = out.write_record([
            name_of(learners, cell.learner),
            &cell.exercise,
            &cell.check,
            cell.verdict.word(),
            source_word(cell.source),
            cell.reason_key.as_deref().unwrap_or(""),
            cell.reason.as_ref().map_or("", |r| r.en.as_str()),
            cell.reason.as_ref().map_or("", |r| r.ru.as_str()),
            cell.replay.as_deref().unwrap_or(""),
            &cell.received_at,
        ]);
    }
    String::from_utf8(out.into_inner().unwrap_or_default()).unwrap_or_default()
}

/// Every cell as one JUnit document: a suite per learner, a case per exercise and check (a fail
/// a failure, an unknown an error, its message in `lang`), the source in the case's system-out.
pub fn junit(learners: &[Learner], cells: &[Stored], lang: &str) -> String {
    let mut report = Report::new("lab class");
    for learner in learners {
        let mut suite = TestSuite::new(learner.name.clone());
        for cell in cells.iter().filter(|c| c.learner == learner.id) {
            let mut status = match cell.verdict {
                Kind::Pass => TestCaseStatus::success(),
                Kind::Fail => TestCaseStatus::non_success(NonSuccessKind::Failure),
                Kind::Unknown => TestCaseStatus::non_success(NonSuccessKind::Error),
            };
            if cell.verdict != Kind::Pass {
                if let Some(reason) = &cell.reason {
                    status.set_message(reason.of(lang).to_string());
                }
                if let Some(replay) = &cell.replay {
                    status.set_description(format!("replay: {replay}"));
                }
            }
            let mut case = TestCase::new(cell.check.clone(), status);
            case.set_classname(format!("lab.exercise.{}", cell.exercise));
            case.set_system_out(format!(
                "{} at {}",
                source_word(cell.source),
                cell.received_at
            ));
            suite.add_test_case(case);
        }
        report.add_test_suite(suite);
    }
    report
        .to_string()
        .unwrap_or_else(|e| format!("<!-- JUnit could not be written: {e} -->"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Reason;

    fn cell(learner: i64, check: &str, verdict: Kind, key: Option<&str>, age_s: f64) -> Stored {
        Stored {
            id: learner * 100 + age_s as i64,
            learner,
            exercise: "report-api".into(),
            check: check.into(),
            verdict,
            source: Source::SelfReported,
            reason_key: key.map(str::to_string),
            reason: key.map(|k| Reason {
                en: format!("words of {k}"),
                ru: format!("слова {k}"),
            }),
            replay: key.map(|k| format!("replay of {k} by {learner}")),
            age_s,
            received_at: "2026-12-04T10:00:00Z".into(),
        }
    }

    fn learners() -> Vec<Learner> {
        ["Ann", "Bob", "<b>Eve</b>"]
            .iter()
            .enumerate()
            .map(|(i, n)| Learner {
                id: i as i64 + 10,
                name: n.to_string(),
            })
            .collect()
    }

    #[test]
    fn a_check_counts_who_passes_and_names_the_commonest_broken_invariant() {
        let cells = vec![
            cell(10, "race", Kind::Pass, None, 5.0),
            cell(11, "race", Kind::Fail, Some("fail.race.two"), 9.0),
            cell(12, "race", Kind::Fail, Some("fail.race.two"), 3.0),
            cell(12, "replay", Kind::Fail, Some("fail.replay.other"), 3.0),
            cell(11, "replay", Kind::Unknown, Some("unknown.x"), 3.0),
        ];
        let board = board(&learners(), &cells, false);
        let race = board["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["check"] == "race")
            .unwrap();
        assert_eq!(race["passing"], 1);
        assert_eq!(race["reported"], 3);
        assert_eq!(race["commonest_broken"]["reason_key"], "fail.race.two");
        assert_eq!(race["commonest_broken"]["count"], 2);
        // The newest example: learner 12's, 3 s old.
        assert_eq!(
            race["commonest_broken"]["replay"],
            "replay of fail.race.two by 12"
        );
        let replay = board["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["check"] == "replay")
            .unwrap();
        assert_eq!(replay["passing"], 0);
        assert_eq!(replay["commonest_broken"]["count"], 1);
        // Names hidden: numbers only.
        assert!(
            board["learners"]
                .as_array()
                .unwrap()
                .iter()
                .all(|l| l["name"].is_null())
        );
        assert_eq!(board["learners"][2]["label"], "#3");
        let named = super::board(&learners(), &cells, true);
        assert_eq!(named["learners"][2]["name"], "<b>Eve</b>");
    }

    #[test]
    fn the_exports_quote_what_they_must() {
        let cells = vec![
            cell(10, "race", Kind::Pass, None, 5.0),
            cell(12, "race", Kind::Fail, Some("fail.race.two"), 3.0),
        ];
        let text = csv(&learners(), &cells);
        let mut lines = text.lines();
        assert_eq!(
            lines.next(),
            Some(
                "learner,exercise,check,verdict,source,reason_key,reason_en,reason_ru,replay,received_at"
            )
        );
        assert_eq!(
            lines.next(),
            Some("Ann,report-api,race,pass,self-reported,,,,,2026-12-04T10:00:00Z")
        );
        assert!(
            lines
                .next()
                .unwrap()
                .starts_with("<b>Eve</b>,report-api,race,fail,")
        );
        let xml = junit(&learners(), &cells, "ru");
        assert!(xml.contains("&lt;b&gt;Eve&lt;/b&gt;"), "{xml}");
        assert!(xml.contains("слова fail.race.two"), "{xml}");
        assert!(xml.contains("<failure"), "{xml}");
    }
}
