//! `lab check`: passes on the repository, fails with a diff on drift, `--bless` rewrites.

mod common;

use common::{assert_code, copy_tree, lab, run, scenarios_dir, stdout};

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

    let out = lab(&["check", "--color", "never"])
        .env("LAB_SCENARIOS_DIR", dir.path())
        .output()
        .unwrap();
    assert_code(&out, 1);
    let report = stdout(&out);
    assert!(report.contains("duplicate    DRIFT"), "{report}");
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
