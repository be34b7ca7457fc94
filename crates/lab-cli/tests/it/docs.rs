//! The scenario pages in `docs/scenarios/` are what the lab produces today.
//!
//! Each page (`docs/scenarios/NAME.LANG.md`) is the `page.md` that `lab run all --artifacts DIR`
//! writes for that scenario: its story, its commands, the Mermaid diagram of a real run, why it
//! happened, the questions and the measured facts. This test runs every scenario in both
//! languages on throwaway servers and fails when a page differs from its copy in `docs/`, or when
//! a scenario has no page, or a page has no scenario. After an intended change, rewrite the pages
//! with `LAB_BLESS=1 cargo test -p lab-cli --test it docs::` and review the diff.

use crate::common;

use std::path::Path;
use std::sync::OnceLock;

use common::{assert_code, catalogue, lab, outputs_at_once, repo, stderr};

/// `lab run all --artifacts DIR --lang LANG` for both languages, once for every test of this
/// file, the two runs at once (each mostly waits on real leases).
fn artifacts(lang: &str) -> &'static Path {
    static BOTH: OnceLock<[(&str, tempfile::TempDir); 2]> = OnceLock::new();
    let both = BOTH.get_or_init(|| {
        let dirs = ["en", "ru"].map(|lang| (lang, tempfile::tempdir().unwrap()));
        let commands = dirs
            .iter()
            .map(|(lang, dir)| {
                let dir = dir.path().to_str().unwrap();
                lab(&["run", "all", "--lang", lang, "--artifacts", dir])
            })
            .collect();
        for (out, (_, dir)) in outputs_at_once(commands).iter().zip(&dirs) {
            assert_code(out, 0);
            assert!(
                dir.path().read_dir().unwrap().next().is_some(),
                "no artifacts: {}",
                stderr(out)
            );
        }
        dirs
    });
    both.iter()
        .find(|(l, _)| *l == lang)
        .map(|(_, dir)| dir.path())
        .unwrap()
}

#[test]
fn every_scenario_page_in_docs_is_what_the_lab_draws_today() {
    let docs = repo().join("docs/scenarios");
    let bless = std::env::var_os("LAB_BLESS").is_some_and(|v| v == "1");
    let mut drifted = Vec::new();
    let mut expected_files = Vec::new();
    for lang in ["en", "ru"] {
        let dir = artifacts(lang);
        for name in catalogue() {
            let page = std::fs::read_to_string(dir.join(&name).join("page.md"))
                .unwrap_or_else(|e| panic!("{name}/page.md: {e}"));
            let file = format!("{name}.{lang}.md");
            let copy = docs.join(&file);
            if bless {
                std::fs::create_dir_all(&docs).unwrap();
                std::fs::write(&copy, &page).unwrap();
            } else if std::fs::read_to_string(&copy).ok().as_deref() != Some(page.as_str()) {
                drifted.push(describe(&copy, &page));
            }
            expected_files.push(file);
        }
    }
    check_index(&catalogue(), bless);
    let mut stray: Vec<String> = std::fs::read_dir(&docs)
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|f| f.ends_with(".md") && !expected_files.contains(f))
                .collect()
        })
        .unwrap_or_default();
    stray.sort();
    assert!(
        stray.is_empty(),
        "pages in docs/scenarios/ with no scenario: {stray:?}"
    );
    assert!(
        drifted.is_empty(),
        "{} page(s) in docs/scenarios/ differ from what the lab produces; if the change is \
         intended, run `LAB_BLESS=1 cargo test -p lab-cli --test it docs::`:\n{}",
        drifted.len(),
        drifted.join("\n")
    );
}

/// The table of pages in `docs/scenarios.md` lists every scenario, in the catalogue's order.
fn check_index(names: &[String], bless: bool) {
    const START: &str = "<!-- the table below is written by LAB_BLESS=1 cargo test -p lab-cli --test it docs:: -->\n";
    const END: &str = "<!-- end of the generated table -->\n";
    let path = repo().join("docs/scenarios.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let (Some(start), Some(end)) = (text.find(START), text.find(END)) else {
        panic!("{} has no generated table of pages", path.display());
    };
    let mut table = String::from("| scenario | English | Russian |\n|---|---|---|\n");
    for name in names {
        table.push_str(&format!(
            "| `{name}` | [en](scenarios/{name}.en.md) | [ru](scenarios/{name}.ru.md) |\n"
        ));
    }
    let now = &text[start + START.len()..end];
    if bless {
        let text = format!("{}{table}{}", &text[..start + START.len()], &text[end..]);
        std::fs::write(&path, text).unwrap();
    } else {
        assert_eq!(
            now, table,
            "the table of pages in docs/scenarios.md is not the catalogue's; \
             run `LAB_BLESS=1 cargo test -p lab-cli --test it docs::`"
        );
    }
}

/// The first line where a page and its copy differ.
fn describe(copy: &Path, page: &str) -> String {
    let Ok(old) = std::fs::read_to_string(copy) else {
        return format!("  {}: missing", copy.display());
    };
    let line = old
        .lines()
        .zip(page.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| old.lines().count().min(page.lines().count()));
    format!(
        "  {}: line {}\n    in docs: {:?}\n    the lab: {:?}",
        copy.display(),
        line + 1,
        old.lines().nth(line).unwrap_or(""),
        page.lines().nth(line).unwrap_or("")
    )
}

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
            at.split(',').collect()
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

/// `--artifacts` writes, for every scenario, an event log, a Mermaid sequence diagram that
/// only uses what it declares, the facts and the table snapshots.
#[test]
fn artifacts_for_every_scenario_are_complete_and_valid() {
    let dir = artifacts("en");
    for name in catalogue() {
        let at = dir.join(&name);
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

/// The sample at the top of the README is what `lab run duplicate --lang en` prints today: the
/// first `text` block must be a piece of the scenario's expected narrative, byte for byte.
#[test]
fn the_readme_sample_is_a_piece_of_a_real_narrative() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let start = readme
        .find("```text\n")
        .expect("a ```text block in the README")
        + 8;
    let sample = &readme[start..start + readme[start..].find("```").unwrap()];
    let narrative =
        std::fs::read_to_string(root.join("scenarios/duplicate/expected.en.txt")).unwrap();
    assert!(
        sample.lines().count() > 5 && narrative.contains(sample),
        "README's sample is not in scenarios/duplicate/expected.en.txt; paste it from there:\n{sample}"
    );
}

/// The README is a front page and the rest is one link away: every link from the README and the
/// pages in `docs/` to a file of this repository (and to a heading of it, after `#`) resolves.
#[test]
fn every_link_between_the_readme_and_the_docs_resolves() {
    let root = repo();
    let mut pages = vec![root.join("README.md"), root.join("CHANGELOG.md")];
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    let mut broken = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        // [text](target): the targets that are not URLs.
        for (_, rest) in text.match_indices("](").map(|(i, _)| ((), &text[i + 2..])) {
            let Some(end) = rest.find(')') else { continue };
            let target = &rest[..end];
            if target.contains("://") || target.starts_with("mailto:") || target.contains(' ') {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
            let file = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            if !file.exists() {
                broken.push(format!("{}: {target} (no such file)", page.display()));
                continue;
            }
            if !anchor.is_empty() && !anchors_of(&file).contains(&anchor.to_string()) {
                broken.push(format!("{}: {target} (no such heading)", page.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The anchors GitHub gives a Markdown file's headings: lower case, spaces to `-`, and nothing
/// but letters, digits, `-` and `_` kept.
fn anchors_of(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            line.trim_start_matches('#')
                .strip_prefix(' ')
                .filter(|_| line.starts_with('#'))
        })
        .map(|heading| {
            heading
                .to_lowercase()
                .chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                    _ => None,
                })
                .collect()
        })
        .collect()
}
