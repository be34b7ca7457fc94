//! `docs/course-ci.yml`, the workflow a course repository copies, is valid YAML and runs a `lab
//! check` that this lab accepts, writing the JUnit report the later steps upload.

use crate::common;

use common::{assert_code, repo, run, stdout};
use yaml_rust2::{Yaml, YamlLoader};

#[test]
fn the_course_workflow_runs_a_check_this_lab_accepts() {
    let text = std::fs::read_to_string(repo().join("docs/course-ci.yml")).unwrap();
    let docs = YamlLoader::load_from_str(&text).expect("docs/course-ci.yml is valid YAML");
    let workflow = &docs[0];
    let steps = workflow["jobs"]["lab-check"]["steps"]
        .as_vec()
        .expect("a lab-check job with steps");
    let runs: Vec<&str> = steps.iter().filter_map(|s| s["run"].as_str()).collect();
    let check = runs
        .iter()
        .find(|r| r.contains(" check "))
        .expect("a step that runs lab check");

    // `target/release/lab check … > REPORT`: the arguments, and where the report goes.
    let (command, report) = check
        .split_once('>')
        .expect("the report is redirected to a file");
    let report = report.trim();
    let args: Vec<&str> = command.split_whitespace().skip(1).collect();
    assert_eq!(args[0], "check", "{check}");
    assert!(
        args.windows(2).any(|w| w == ["--format", "junit"]),
        "{check}"
    );
    for step in steps {
        let uses = step["uses"].as_str().unwrap_or_default();
        if uses.starts_with("actions/upload-artifact")
            && let Some(path) = step["with"]["path"].as_str()
        {
            assert_eq!(path, report, "the upload takes the report lab wrote");
        }
        if let Some(path) = step["with"]["report_paths"].as_str() {
            assert_eq!(path, report, "the JUnit step reads the report lab wrote");
        }
    }
    assert!(
        runs.iter()
            .any(|r| r.contains("postgresql") && r.contains("redis-server")),
        "the server programs are installed: {runs:?}"
    );

    // The same flags on one scenario here: accepted, and a JUnit report comes out.
    let mut one = args.clone();
    one.push("lease");
    let out = run(&one);
    assert_code(&out, 0);
    let xml = stdout(&out);
    assert!(xml.starts_with("<?xml"), "{xml}");
    assert!(xml.contains("<testsuite"), "{xml}");
    assert!(matches!(workflow["on"], Yaml::Hash(_)), "triggers are set");
}
