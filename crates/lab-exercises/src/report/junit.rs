//! A check run as one JUnit document, for a course's CI: a test case per selected check. A
//! pass is a success, a fail a failure (with the schedule and the replay line in its
//! description), an unknown an error, a skipped check skipped; a check that did not run is an
//! error whose message says why (the program never answered, the lab failed, a signal).

use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};

use super::{Ending, Replay, Words};
use crate::exercise::Exercise;
use crate::verdict::{CheckReport, Verdict};

/// The whole document.
pub fn document(
    words: &Words,
    exercise: &Exercise,
    reports: &[CheckReport],
    not_run: &[&str],
    ending: &Ending,
    replay: &Replay,
) -> String {
    let mut suite = TestSuite::new(format!("exercise {}", exercise.name));
    for report in reports {
        let status = match &report.verdict {
            Verdict::Pass => TestCaseStatus::success(),
            Verdict::Skipped(reason) => {
                let mut skipped = TestCaseStatus::skipped();
                skipped.set_message(words.of(exercise, reason));
                skipped
            }
            Verdict::Fail(reason) | Verdict::Unknown(reason) => {
                let kind = if matches!(report.verdict, Verdict::Fail(_)) {
                    NonSuccessKind::Failure
                } else {
                    NonSuccessKind::Error
                };
                let mut failed = TestCaseStatus::non_success(kind);
                failed.set_message(words.of(exercise, reason));
                let mut description = super::text::schedule(words, exercise, report).join("\n");
                description.push_str(&format!("\nreplay: {}", replay.line(report)));
                failed.set_description(description);
                failed
            }
        };
        suite.add_test_case(case(exercise, report.name, status));
    }
    let why = ending.why_not_run(words).unwrap_or_default();
    for name in not_run {
        let mut status = TestCaseStatus::non_success(NonSuccessKind::Error);
        status.set_message(why.clone());
        if let Ending::NotReady(not_ready) = ending {
            status.set_description(not_ready.output().to_string());
        }
        suite.add_test_case(case(exercise, name, status));
    }
    let mut junit = Report::new(format!("lab exercise check {}", exercise.name));
    junit.add_test_suite(suite);
    junit
        .to_string()
        .unwrap_or_else(|e| format!("<!-- JUnit could not be written: {e} -->"))
}

fn case(exercise: &Exercise, name: &str, status: TestCaseStatus) -> TestCase {
    let mut case = TestCase::new(name.to_string(), status);
    case.set_classname(format!("lab.exercise.{}", exercise.name));
    case
}
