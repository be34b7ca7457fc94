//! Pictures of real runs: `--diagram` draws lanes; `--export md` prints a page with the diagram.
//! (What `--artifacts` writes for every scenario is checked in `docs.rs`, on the runs the pages
//! come from.)

use crate::common;

use common::{run, stdout};

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
