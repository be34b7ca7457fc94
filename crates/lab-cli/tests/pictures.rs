//! Pictures of real runs: `--artifacts` writes, for every scenario, an event log, a Mermaid
//! sequence diagram that only uses what it declares, the facts and the table snapshots;
//! `--diagram` draws lanes; `--export md` prints a page with the diagram.

mod common;

use common::{assert_code, catalogue, run, stdout};

/// A structural check of a Mermaid sequence diagram: the header, then only participant
/// declarations, arrows and notes between declared participants, nothing that breaks a line.
fn check_mermaid(name: &str, text: &str, has_calls: bool) {
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("sequenceDiagram"), "{name}");
    let mut declared = Vec::new();
    let mut drawn = 0;
    for line in lines {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("participant ") {
            let (id, label) = rest.split_once(" as ").expect("participant pN as label");
            assert!(!label.is_empty(), "{name}: {line}");
            declared.push(id.to_string());
            continue;
        }
        let (head, label) = line
            .split_once(": ")
            .unwrap_or_else(|| panic!("{name}: {line}"));
        assert!(
            !label.contains(';'),
            "{name}: a ; ends a Mermaid statement: {line}"
        );
        let ids: Vec<&str> = if let Some(at) = head.strip_prefix("Note over ") {
            vec![at]
        } else {
            let arrow = ["--x", "-->>", "->>"]
                .into_iter()
                .find(|a| head.contains(a))
                .unwrap_or_else(|| panic!("{name}: not an arrow: {line}"));
            let (from, to) = head.split_once(arrow).unwrap();
            drawn += 1;
            vec![from, to]
        };
        for id in ids {
            assert!(
                declared.iter().any(|d| d == id),
                "{name}: {id} undeclared: {line}"
            );
        }
    }
    assert_eq!(drawn > 0, has_calls, "{name}: calls drawn: {drawn}");
}

#[test]
fn artifacts_for_every_scenario_are_complete_and_valid() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(&[
        "run",
        "all",
        "--lang",
        "en",
        "--artifacts",
        dir.path().to_str().unwrap(),
    ]);
    assert_code(&out, 0);
    for name in catalogue() {
        let at = dir.path().join(&name);
        let read = |file: &str| {
            std::fs::read_to_string(at.join(file)).unwrap_or_else(|e| panic!("{name}/{file}: {e}"))
        };
        let events: Vec<serde_json::Value> = read("events.jsonl")
            .lines()
            .map(|line| serde_json::from_str(line).expect("a JSON event"))
            .collect();
        // Calls between participants, and statements and commands into their stores.
        let has_calls = events
            .iter()
            .any(|e| e["event"] == "request" || e["event"] == "executed");
        check_mermaid(&name, &read("sequence.mmd"), has_calls);
        let facts: serde_json::Value = serde_json::from_str(&read("facts.json")).unwrap();
        assert!(!facts.as_object().unwrap().is_empty(), "{name}");
        assert!(
            read("states.jsonl").lines().count() > 0,
            "{name}: no table snapshot"
        );
    }
}

#[test]
fn the_timeout_lanes_show_the_call_lost_and_the_page_carries_the_diagram() {
    let lanes = stdout(&run(&[
        "run",
        "timeout",
        "--diagram",
        "--lang",
        "en",
        "--color",
        "never",
    ]));
    // The call, the INSERT and COMMIT inside the service (arrows into its database), then an
    // answer that never arrived: the order of the issue's picture. Only lane rows count (a step's
    // text, `  4. …`, may say the same words).
    let rows: Vec<&str> = lanes
        .lines()
        .skip_while(|l| !l.starts_with("  ┌ "))
        .filter(|l| l.starts_with("  │") || l.starts_with("  ●") || l.starts_with("  ◀"))
        .collect();
    let row_of = |from: usize, text: &str| {
        let at = (from..rows.len())
            .find(|&i| rows[i].contains(text))
            .unwrap_or_else(|| panic!("no lane row with {text:?} after row {from}:\n{lanes}"));
        (at, rows[at])
    };
    let (call, arrow) = row_of(0, "POST /reports");
    assert!(arrow.contains("●───▶"), "{arrow}");
    let (insert, arrow) = row_of(call, "INSERT INTO reports → INSERT 0 1");
    assert!(arrow.contains("▶"), "{arrow}");
    let (commit, _) = row_of(insert, "COMMIT");
    let (lost, arrow) = row_of(commit, "unknown");
    assert!(arrow.contains("◀┄┄┄✗"), "{arrow}");
    assert!(call < insert && insert < commit && commit < lost);

    let page = stdout(&run(&["run", "timeout", "--export", "md", "--lang", "en"]));
    assert!(page.starts_with("# timeout · "), "{page}");
    assert!(page.contains("```mermaid\nsequenceDiagram\n"), "{page}");
    assert!(
        page.contains("--x"),
        "the lost answer is drawn crossed: {page}"
    );
    assert!(
        !page.contains("Result: every fact is as expected."),
        "the page replaces the narrative"
    );
}
