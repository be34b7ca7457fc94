//! A scenario's page in Markdown, made from a real run.
//!
//! One page serves three readers: `lab run NAME --export md` prints it (for slides), `--artifacts
//! DIR` saves it as `page.md` beside the event log, and `docs/scenarios/NAME.LANG.md` is a copy of
//! it for every scenario in both languages. The copies in `docs/` are not written by hand:
//! `tests/docs.rs` runs every scenario, builds its page and fails when the copy differs, and
//! `LAB_BLESS=1` makes the same test rewrite them. So the diagram a reader sees in the docs is the
//! one the lab draws today, from a run on real servers.
//!
//! Layout: the title and the summary, the story, the commands to run it (with its knobs), the
//! Mermaid sequence diagram of the run's calls (the statements and Redis commands are in
//! `sequence.mmd` of `--artifacts`: their order and replies vary from run to run), why it happened (and the lesson's checklist), the
//! questions with their model answers folded away, and the facts the run measured.

use lab_core::render::mermaid_calls;
use lab_core::text::COMMON;
use lab_core::{Lang, Msg, Texts};
use lab_scenarios::RunReport;

/// The page of one run of one scenario, in `lang`.
pub fn page(texts: &Texts, lang: Lang, report: &RunReport) -> String {
    let name = report.name;
    let own = |key: &str| texts.render(name, lang, &Msg::new(key));
    let common = |key: &str| texts.render(COMMON, lang, &Msg::new(key));
    let mut page = String::new();

    page.push_str(&format!("# {name} · {}\n\n", own("title")));
    page.push_str(&format!("*{}*\n\n", one_line(&own("summary"))));
    page.push_str(&format!("{}\n\n", own("story").trim()));

    page.push_str(&format!("## {}\n\n```sh\n", common("docs.run")));
    for flags in [
        "",
        " --step",
        " --diagram --show-sql --show-commands",
        " --quiz --answers",
    ] {
        page.push_str(&format!("lab run {name}{flags}\n"));
    }
    page.push_str(&format!("lab explain {name}\n```\n\n"));
    let knobs = lab_scenarios::catalogue::find(name)
        .map(|entry| entry.scenario.knobs)
        .unwrap_or_default();
    if !knobs.is_empty() {
        page.push_str(&format!("{}\n\n", common("docs.knobs")));
        for knob in knobs {
            let about = texts
                .get(name, lang, &format!("knobs.{}", knob.name))
                .unwrap_or_default();
            page.push_str(&format!(
                "- `--set {}={}`: {}\n",
                knob.name,
                knob.default_value(),
                one_line(about)
            ));
        }
        page.push('\n');
    }

    page.push_str(&format!(
        "## {}\n\n{}\n\n```mermaid\n{}```\n\n",
        common("docs.diagram"),
        texts.render(
            COMMON,
            lang,
            &Msg::new("docs.diagram_note").arg("name", name)
        ),
        mermaid_calls(texts, lang, &report.events),
    ));

    page.push_str(&format!(
        "## {}\n\n{}\n\n",
        common("label.explain"),
        own("explain").trim()
    ));
    let checklist = texts.list(name, lang, "checklist");
    if !checklist.is_empty() {
        page.push_str(&format!("### {}\n\n", common("label.checklist")));
        for item in checklist {
            page.push_str(&format!("- {}\n", one_line(&item)));
        }
        page.push('\n');
    }

    let answers = texts.list(name, lang, "quiz_answers");
    let questions = texts.list(name, lang, "quiz");
    if !questions.is_empty() {
        page.push_str(&format!("## {}\n\n", common("label.quiz")));
        for (i, question) in questions.iter().enumerate() {
            page.push_str(&format!("{}. {}\n", i + 1, one_line(question)));
            if let Some(answer) = answers.get(i) {
                page.push_str(&format!(
                    "   <details><summary>{}</summary>\n\n   {}\n\n   </details>\n",
                    common("label.model_answer"),
                    one_line(answer)
                ));
            }
        }
        page.push('\n');
    }

    page.push_str(&format!(
        "## {}\n\n| {} | {} |\n|---|---|\n",
        common("label.facts"),
        common("label.fact"),
        common("label.measured"),
    ));
    for (fact, value) in &report.facts {
        page.push_str(&format!("| `{fact}` | `{value}` |\n"));
    }
    page
}

/// A text written over several lines in the TOML files, as one Markdown line (a list item or a
/// table cell ends at a newline).
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
