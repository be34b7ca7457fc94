//! What ran, shown three ways: `--show-sql` / `--show-commands` under each step (and always in
//! JSON), `--log` lines on stderr, and `lab explain NAME` by function and file.

use crate::common;

use common::{assert_code, repo, run, stderr, stdout};

#[test]
fn show_sql_puts_each_statement_under_its_step_and_json_always_has_them() {
    let out = run(&["run", "duplicate", "--lang", "en", "--show-sql"]);
    assert_code(&out, 0);
    let text = stdout(&out);
    // Worker A's claim is told under step 2, which it belongs to (the script acts, then tells).
    let step2 = text.find("\n 2. Worker A claims").expect(&text);
    let claim = text[step2..]
        .find("sql> UPDATE tasks SET status = 'processing'")
        .expect(&text);
    let step3 = text[step2..].find("\n 3. ").expect(&text);
    assert!(
        claim < step3,
        "the claim's UPDATE is shown under step 2:\n{text}"
    );
    // The service's INSERT, with psql's command tag and the service that ran it.
    assert!(
        text.contains(
            "sql> INSERT INTO reports (task_id, report_type, payload_hash) VALUES ($1, $2, $3) RETURNING id;  -- INSERT 0 1 · report service"
        ),
        "{text}"
    );
    // Reading the rows to show them is the lab's own work, not the story.
    assert!(!text.contains("sql> SELECT id, status, attempts"), "{text}");
    // Redis commands are another flag.
    assert!(!text.contains("redis>"), "{text}");

    let plain = stdout(&run(&["run", "duplicate", "--lang", "en"]));
    assert!(!plain.contains("sql>"), "no statements without the flag");

    let json = stdout(&run(&["run", "keys", "--format", "json"]));
    let executed: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["event"] == "executed")
        .collect();
    assert!(
        executed.iter().any(|e| e["server"] == "redis"
            && e["by"] == "payments"
            && e["text"].as_str().unwrap().starts_with("SET ")
            && e["text"].as_str().unwrap().contains(" NX GET PX ")
            && e["result"] == "(nil)"),
        "the first reservation is a SET NX GET answered with nil: {executed:?}"
    );
}

#[test]
fn show_commands_shows_the_coordinators_round_trips() {
    let out = run(&["run", "keys", "--lang", "en", "--show-commands"]);
    assert_code(&out, 0);
    let text = stdout(&out);
    assert!(text.contains("redis> SET "), "{text}");
    assert!(text.contains("  -- OK · payment service"), "{text}");
    assert!(!text.contains("sql>"), "{text}");
}

#[test]
fn log_prints_structured_lines_that_tie_ids_together() {
    let out = run(&[
        "run",
        "duplicate",
        "--lang",
        "en",
        "--log",
        "--color",
        "never",
    ]);
    assert_code(&out, 0);
    let log = stderr(&out);
    assert!(
        log.contains("claim_task{task_id=42}") && log.contains("task claimed attempts=2"),
        "{log}"
    );
    assert!(
        log.contains("create_report{task_id=42}") && log.contains("report_id=2"),
        "{log}"
    );
    assert!(
        !stdout(&out).contains("task claimed"),
        "the log is on stderr only"
    );
    // Without --log, nothing of it.
    let quiet = run(&["run", "duplicate", "--lang", "en"]);
    assert!(
        !stderr(&quiet).contains("task claimed"),
        "{}",
        stderr(&quiet)
    );
}

#[test]
fn explain_points_from_each_statement_to_the_function_that_runs_it() {
    let out = run(&["explain", "timeout", "--lang", "en"]);
    assert_code(&out, 0);
    let text = stdout(&out);
    assert!(
        text.contains("The scenario's script: crates/lab-scenarios/src/reports/timeout.rs"),
        "{text}"
    );
    // Each place is `function  file:line`, and the line is where that function is written.
    let places: Vec<(String, String, usize)> = text
        .lines()
        .filter_map(|line| {
            let (_, place) = line.split_once(" · ")?;
            let (function, at) = place.trim().split_once("  ")?;
            let (file, number) = at.rsplit_once(':')?;
            Some((function.to_string(), file.to_string(), number.parse().ok()?))
        })
        .collect();
    for expected in ["claim_task", "complete_task", "create_report"] {
        assert!(
            places.iter().any(|(f, _, _)| f == expected),
            "{expected}: {text}"
        );
    }
    for (function, file, line) in &places {
        let source = std::fs::read_to_string(repo().join(file)).unwrap();
        // The line is the function's own, or its `#[tracing::instrument]` just above it.
        let written: Vec<&str> = source.lines().skip(line - 1).take(3).collect();
        assert!(
            written.iter().any(|l| l.contains("fn ")),
            "{file}:{line} is not where a function is written ({function}): {written:?}"
        );
    }
    assert!(text.contains("sql> INSERT INTO reports"), "{text}");
    assert!(text.contains("-- INSERT 0 1 | INSERT 0 0"), "{text}");
}
