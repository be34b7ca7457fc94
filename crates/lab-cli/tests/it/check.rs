//! `lab check`: passes on the repository, fails with a diff on drift, `--bless` rewrites.

use crate::common;

use common::{assert_code, copy_tree, lab, run, scenarios_dir, stderr, stdout};
use serde_json::Value;

#[test]
fn the_repository_checks_clean() {
    let out = run(&["check"]);
    assert_code(&out, 0);
    let text = stdout(&out);
    assert!(
        text.contains("duplicate") && text.contains("ok (facts, en, ru)"),
        "{text}"
    );
}

#[test]
fn an_edited_expected_narrative_or_fact_is_drift_with_a_diff() {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&scenarios_dir(), dir.path());
    let narrative = dir.path().join("duplicate/expected.en.txt");
    let text = std::fs::read_to_string(&narrative).unwrap();
    std::fs::write(
        &narrative,
        text.replace("Worker B claims", "Worker C claims"),
    )
    .unwrap();
    let facts = dir.path().join("idempotent/expected.json");
    let text = std::fs::read_to_string(&facts).unwrap();
    std::fs::write(
        &facts,
        text.replace("\"reports_total\": 1", "\"reports_total\": 3"),
    )
    .unwrap();

    // The two edited scenarios and one left alone (the repository's check runs them all).
    let out = lab(&[
        "check",
        "duplicate",
        "idempotent",
        "keys",
        "--color",
        "never",
    ])
    .env("LAB_SCENARIOS_DIR", dir.path())
    .output()
    .unwrap();
    assert_code(&out, 1);
    let report = stdout(&out);
    assert!(
        report
            .lines()
            .any(|l| l.starts_with("keys ") && l.ends_with("ok (facts, en, ru)")),
        "{report}"
    );
    assert!(
        report
            .lines()
            .any(|l| l.starts_with("duplicate ") && l.ends_with("DRIFT")),
        "{report}"
    );
    assert!(
        report.contains("-") && report.contains("Worker C claims"),
        "{report}"
    );
    assert!(report.contains("+ 6. Worker B claims"), "{report}");
    assert!(
        report.contains("fact reports_total: measured 1, expected 3"),
        "{report}"
    );
}

#[test]
fn bless_rewrites_the_expectations_it_checks() {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&scenarios_dir(), dir.path());
    for file in ["expected.json", "expected.en.txt", "expected.ru.txt"] {
        std::fs::write(dir.path().join("duplicate").join(file), "{\"facts\": {}}").unwrap();
    }
    let out = lab(&["check", "duplicate", "--bless"])
        .env("LAB_SCENARIOS_DIR", dir.path())
        .output()
        .unwrap();
    assert_code(&out, 0);
    for file in ["expected.json", "expected.en.txt", "expected.ru.txt"] {
        assert_eq!(
            std::fs::read_to_string(dir.path().join("duplicate").join(file)).unwrap(),
            std::fs::read_to_string(scenarios_dir().join("duplicate").join(file)).unwrap(),
            "{file} after --bless"
        );
    }
    let out = lab(&["check", "duplicate"])
        .env("LAB_SCENARIOS_DIR", dir.path())
        .output()
        .unwrap();
    assert_code(&out, 0);
}

/// Outside a checkout and without LAB_SCENARIOS_DIR, `lab` uses the copies built into it: a
/// scenario of each lesson checks clean with them. (That every copy is there and equals its
/// file is lab-scenarios' `the_embedded_copies_load_and_match_the_files`; the repository's
/// check runs every scenario.)
#[test]
fn outside_a_checkout_the_built_in_copies_check_clean() {
    let elsewhere = tempfile::tempdir().unwrap();
    let out = lab(&["check", "duplicate", "keys", "--color", "never"])
        .current_dir(elsewhere.path())
        .output()
        .unwrap();
    assert_code(&out, 0);
    let report = stdout(&out);
    for name in ["duplicate", "keys"] {
        assert!(
            report
                .lines()
                .any(|l| l.starts_with(&format!("{name} ")) && l.ends_with("ok (facts, en, ru)")),
            "{report}"
        );
    }
}

/// `--bless` with nowhere to write says so at once, before any server starts.
#[test]
fn bless_outside_a_checkout_refuses_before_running_anything() {
    let elsewhere = tempfile::tempdir().unwrap();
    let out = lab(&["check", "--bless"])
        .current_dir(elsewhere.path())
        .output()
        .unwrap();
    assert_code(&out, 3);
    assert!(
        stderr(&out).contains("no scenarios/ directory to write to"),
        "{}",
        stderr(&out)
    );
    assert_eq!(stdout(&out), "", "nothing ran");
}

/// The checkout in the current directory is the one read, not the one `lab` was built in.
#[test]
fn the_current_directorys_checkout_is_the_one_checked() {
    let other = tempfile::tempdir().unwrap();
    copy_tree(&scenarios_dir(), &other.path().join("scenarios"));
    let marker = other.path().join("crates/lab-scenarios");
    std::fs::create_dir_all(&marker).unwrap();
    std::fs::write(marker.join("build.rs"), "").unwrap();
    let facts = other.path().join("scenarios/lease/expected.json");
    let text = std::fs::read_to_string(&facts).unwrap();
    std::fs::write(
        &facts,
        text.replace("\"task_attempts\": 1", "\"task_attempts\": 5"),
    )
    .unwrap();
    let out = lab(&["check", "lease", "--color", "never"])
        .current_dir(other.path())
        .output()
        .unwrap();
    assert_code(&out, 1);
    assert!(
        stdout(&out).contains("fact task_attempts: measured 1, expected 5"),
        "{}",
        stdout(&out)
    );
}

/// `lab check --format json` ends each scenario with the summary line `lab run` prints, in the
/// same shape; a narrative that differs comes first as a `drift` line with its diff.
#[test]
fn check_json_has_the_summary_shape_of_run() {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&scenarios_dir(), dir.path());
    let narrative = dir.path().join("lease/expected.ru.txt");
    let text = std::fs::read_to_string(&narrative).unwrap();
    std::fs::write(&narrative, format!("{text}\nextra line\n")).unwrap();
    let out = lab(&["check", "lease", "--format", "json"])
        .env("LAB_SCENARIOS_DIR", dir.path())
        .output()
        .unwrap();
    assert_code(&out, 1);
    let lines: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0]["event"], "drift");
    assert_eq!(lines[0]["lang"], "ru");
    assert!(lines[0]["diff"].as_str().unwrap().contains("extra line"));
    let summary = &lines[1];
    let keys: Vec<&String> = summary.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["event", "scenario", "facts", "expected", "passed"]);
    assert_eq!(summary["event"], "summary");
    assert_eq!(summary["passed"], false);
    assert_eq!(summary["facts"], summary["expected"]);
}

/// `lab check --format junit`: one test case per scenario and language, a failure (with the
/// diff) for a narrative that drifted, and nothing else on stdout.
#[test]
fn junit_has_a_case_per_scenario_and_language() {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&scenarios_dir(), dir.path());
    let narrative = dir.path().join("lease/expected.en.txt");
    let text = std::fs::read_to_string(&narrative).unwrap();
    std::fs::write(&narrative, format!("{text}extra line\n")).unwrap();
    let out = lab(&["check", "lease", "lease-stale", "--format", "junit"])
        .env("LAB_SCENARIOS_DIR", dir.path())
        .output()
        .unwrap();
    assert_code(&out, 1);
    let xml = stdout(&out);
    assert!(xml.starts_with("<?xml"), "{xml}");
    assert_eq!(xml.matches("<testcase ").count(), 4, "{xml}");
    assert!(xml.contains(r#"<testcase name="lease (en)""#), "{xml}");
    assert_eq!(
        xml.matches("<failure").count(),
        1,
        "only lease (en) drifted: {xml}"
    );
    assert!(
        xml.contains("extra line"),
        "the diff is in the failure: {xml}"
    );
    assert!(xml.trim_end().ends_with("</testsuites>"), "{xml}");

    let elsewhere = lab(&["run", "lease", "--format", "junit"])
        .output()
        .unwrap();
    assert_code(&elsewhere, 2);
}
