//! `lab check [NAME...] [--bless]`: the course CI's command.
//!
//! Runs each scenario headless (no pauses, no live output), then compares what it measured with
//! `scenarios/<name>/expected.json` and what it would say, rendered without colour in English and
//! in Russian, with `expected.en.txt` and `expected.ru.txt`. Any difference is drift: a readable
//! diff and exit 1. `--bless` writes this run's facts and narratives as the new expectations.

use colored::Colorize;
use lab_core::facts::compare;
use lab_core::render::render_text;
use lab_core::{Event, Lang, Msg, Narrator};
use lab_scenarios::{Library, RunReport};
use similar::TextDiff;

use crate::exit::{self, Failure};
use crate::select;
use crate::session::{Format, Mode, Session, SessionOptions};
use crate::words::t;

/// The narratives of a run in both languages. When blessing, the summary is rendered as if the
/// measured facts were the expected ones, which is what they are about to become.
fn narratives(library: &Library, report: &RunReport, bless: bool) -> Vec<(Lang, String)> {
    let events: Vec<Event> = report
        .events
        .iter()
        .cloned()
        .map(|event| match event {
            Event::Summary {
                scenario,
                facts,
                settings,
                ..
            } if bless => Event::Summary {
                scenario,
                expected: facts.clone(),
                facts,
                passed: true,
                settings,
            },
            other => other,
        })
        .collect();
    Lang::ALL
        .iter()
        .map(|&lang| (lang, render_text(&library.texts, lang, &events)))
        .collect()
}

/// What one scenario's check found.
struct Verdict {
    /// The facts `expected.json` names.
    expected: lab_core::Facts,
    fact_problems: Vec<String>,
    /// (language, unified diff) for each narrative that differs.
    narrative_diffs: Vec<(Lang, String)>,
}

impl Verdict {
    fn ok(&self) -> bool {
        self.fact_problems.is_empty() && self.narrative_diffs.is_empty()
    }
}

fn judge(library: &Library, report: &RunReport, rendered: &[(Lang, String)]) -> Verdict {
    let expected = library.expected_facts(report.name);
    let fact_problems = compare(&report.facts, &expected)
        .into_iter()
        .filter(|c| !c.ok())
        .map(|c| {
            let show = |v: &Option<serde_json::Value>| {
                v.as_ref().map_or("(none)".to_string(), |v| v.to_string())
            };
            format!(
                "fact {}: measured {}, expected {}",
                c.name,
                show(&c.actual),
                show(&c.expected)
            )
        })
        .collect();
    let narrative_diffs = rendered
        .iter()
        .filter_map(|(lang, actual)| {
            let expected = library
                .expected_narrative(report.name, *lang)
                .unwrap_or_default();
            (expected != *actual).then(|| {
                let diff = TextDiff::from_lines(&expected, actual)
                    .unified_diff()
                    .context_radius(2)
                    .header(
                        &format!("scenarios/{}/expected.{}.txt", report.name, lang.code()),
                        "this run",
                    )
                    .to_string();
                (*lang, diff)
            })
        })
        .collect();
    Verdict {
        expected,
        fact_problems,
        narrative_diffs,
    }
}

fn print_text(name: &str, verdict: &Verdict, bless: bool, color: bool) {
    // One column for the names, as wide as the longest in the catalogue.
    let width = lab_scenarios::CATALOGUE
        .iter()
        .map(|s| s.name.len())
        .max()
        .unwrap_or(0);
    let paint = |s: &str, good: bool| match (color, good) {
        (false, _) => s.to_string(),
        (true, true) => s.green().bold().to_string(),
        (true, false) => s.red().bold().to_string(),
    };
    if bless {
        say!("{name:<width$} {}", paint("blessed", true));
        return;
    }
    if verdict.ok() {
        say!("{name:<width$} {}", paint("ok (facts, en, ru)", true));
        return;
    }
    say!("{name:<width$} {}", paint("DRIFT", false));
    for problem in &verdict.fact_problems {
        say!("  {problem}");
    }
    for (lang, diff) in &verdict.narrative_diffs {
        say!("  narrative ({lang}) differs:");
        for line in diff.lines() {
            let line = match line.chars().next() {
                Some('+') if color && !line.starts_with("+++") => line.green().to_string(),
                Some('-') if color && !line.starts_with("---") => line.red().to_string(),
                _ => line.to_string(),
            };
            say!("    {line}");
        }
    }
}

/// One JUnit test case per scenario and language: it fails when a fact or that language's
/// narrative drifted, with the problems as its message and the diff as its description.
fn junit_cases(suite: &mut quick_junit::TestSuite, name: &str, verdict: &Verdict, bless: bool) {
    use quick_junit::{NonSuccessKind, TestCase, TestCaseStatus};
    for lang in Lang::ALL {
        let diff = verdict
            .narrative_diffs
            .iter()
            .find(|(l, _)| *l == lang)
            .map(|(_, d)| d.as_str());
        let status = if bless || (verdict.fact_problems.is_empty() && diff.is_none()) {
            TestCaseStatus::success()
        } else {
            let mut failure = TestCaseStatus::non_success(NonSuccessKind::Failure);
            let mut message = verdict.fact_problems.clone();
            if diff.is_some() {
                message.push(format!("the {} narrative differs", lang.code()));
            }
            failure.set_message(message.join("; "));
            if let Some(diff) = diff {
                failure.set_description(diff);
            }
            failure
        };
        let mut case = TestCase::new(format!("{name} ({})", lang.code()), status);
        case.set_classname(format!("lab.{name}"));
        suite.add_test_case(case);
    }
}

/// One JSON line per narrative that differs (`"event": "drift"`), then the summary in the same
/// shape as `lab run`'s: `passed` covers the facts and both narratives.
fn print_json(name: &str, report: &RunReport, verdict: &Verdict, bless: bool) {
    for (lang, diff) in &verdict.narrative_diffs {
        say!(
            "{}",
            serde_json::json!({
                "event": "drift",
                "scenario": name,
                "lang": lang.code(),
                "diff": diff,
            })
        );
    }
    let expected = if bless {
        report.facts.clone()
    } else {
        verdict.expected.clone()
    };
    say!(
        "{}",
        serde_json::json!({
            "event": "summary",
            "scenario": name,
            "facts": report.facts,
            "expected": expected,
            "passed": bless || verdict.ok(),
        })
    );
}

pub async fn check(
    options: SessionOptions,
    library: Library,
    names: &[String],
    bless: bool,
    junit: bool,
) -> Result<u8, Failure> {
    let scenarios = select::scenarios(names)?;
    if bless {
        // Find out before running anything that there is nowhere to write.
        library.writable_dir().map_err(Failure::environment)?;
    }
    // Headless: no pauses, whatever --step says, and nothing kept.
    let session = Session::open(options, library, Mode::Headless);
    let output = match (junit, session.format()) {
        (true, _) => Output::Junit,
        (false, Format::Json) => Output::Json,
        (false, Format::Text) => Output::Text,
    };
    let drift = session
        .run_with_servers(select::needs(&scenarios), async |servers| {
            let mut drift = false;
            let mut suite = quick_junit::TestSuite::new("scenarios");
            for &scenario in &scenarios {
                let verdict =
                    check_one(&session, servers, scenario, bless, output, &mut suite).await?;
                drift |= !bless && !verdict;
            }
            if output == Output::Junit {
                let mut report = quick_junit::Report::new("lab check");
                report.add_test_suite(suite);
                let xml = report.to_string().map_err(|e| {
                    Failure::environment(anyhow::anyhow!(t(
                        Msg::new("junit_failed").arg("error", e.to_string())
                    )))
                })?;
                say!("{xml}");
            }
            Ok(drift)
        })
        .await?;
    Ok(if drift { exit::DRIFT } else { exit::OK })
}

/// How `check` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Output {
    Text,
    Json,
    Junit,
}

/// Runs one scenario headless, judges it (or blesses it) and reports it; whether it held.
async fn check_one(
    session: &Session,
    servers: &lab_infra::Servers,
    scenario: lab_scenarios::Entry,
    bless: bool,
    output: Output,
    suite: &mut quick_junit::TestSuite,
) -> Result<bool, Failure> {
    let library = &session.library;
    let report = lab_scenarios::run(
        scenario,
        servers,
        Narrator::recording(),
        library,
        &session.config,
    )
    .await?;
    let rendered = narratives(library, &report, bless);
    let verdict = judge(library, &report, &rendered);
    if bless {
        library
            .bless(scenario.name, &report.facts, &rendered)
            .map_err(Failure::environment)?;
    }
    match output {
        Output::Text => print_text(scenario.name, &verdict, bless, session.color()),
        Output::Json => print_json(scenario.name, &report, &verdict, bless),
        Output::Junit => junit_cases(suite, scenario.name, &verdict, bless),
    }
    Ok(verdict.ok())
}
