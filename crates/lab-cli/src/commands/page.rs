//! A scenario's page in Markdown, made from a real run.
//!
//! One page serves three readers: `lab run NAME --export md` prints it (for slides), `--artifacts
//! DIR` saves it as `page.md` beside the event log, and `docs/scenarios/NAME.LANG.md` is a copy of
//! it for every scenario in both languages. The copies in `docs/` are not written by hand:
//! `tests/it/docs.rs` runs every scenario, builds its page and fails when the copy differs, and
//! `LAB_BLESS=1` makes the same test rewrite them. So the diagram a reader sees in the docs is the
//! one the lab draws today, from a run on real servers.
//!
//! Layout, so a page can be handed out before the run: the title and the summary, the story,
//! the predictions (each with its answer and the run's reveal folded away), the commands to run
//! it (with its knobs), then, folded as the answers are, what the run showed: the Mermaid
//! sequence diagram of its calls (the statements and Redis commands are in `sequence.mmd` of
//! `--artifacts`: their order and replies vary from run to run), why it happened (and the
//! lesson's checklist) and the facts it measured. Last, the questions, with their model answers
//! folded away.

use lab_core::render::mermaid_calls;
use lab_core::text::COMMON;
use lab_core::{Event, Facts, Lang, Msg, Texts};
use lab_scenarios::RunReport;
use lab_scenarios::kit::KnobKind;

/// The page of one run of one scenario, in `lang`.
pub fn page(texts: &Texts, lang: Lang, report: &RunReport) -> String {
    let sections = Sections {
        texts,
        lang,
        name: report.name,
    };
    let mut page = String::new();
    page.push_str(&sections.title());
    page.push_str(&sections.predictions(&report.events));
    page.push_str(&sections.run());
    page.push_str(&format!(
        "<details><summary>{}</summary>\n\n",
        sections.common("docs.what_the_run_showed")
    ));
    page.push_str(&sections.diagram(&report.events));
    page.push_str(&sections.explain());
    page.push_str(&sections.facts(&report.facts));
    page.push_str("\n</details>\n\n");
    page.push_str(&sections.quiz());
    page.trim_end().to_string() + "\n"
}

/// What every section of a page is written from: the catalogues, the language and the scenario.
struct Sections<'a> {
    texts: &'a Texts,
    lang: Lang,
    name: &'a str,
}

impl Sections<'_> {
    /// A text of the scenario's own catalogue.
    fn own(&self, key: &str) -> String {
        self.texts.render(self.name, self.lang, &Msg::new(key))
    }

    /// A text of the common catalogue (headings, labels).
    fn common(&self, key: &str) -> String {
        self.texts.render(COMMON, self.lang, &Msg::new(key))
    }

    /// The title, the summary in italics and the story.
    fn title(&self) -> String {
        let name = self.name;
        let mut out = format!("# {name} · {}\n\n", self.own("title"));
        out.push_str(&format!("*{}*\n\n", one_line(&self.own("summary"))));
        out.push_str(&format!("{}\n\n", self.own("story").trim()));
        out
    }

    /// Every prediction of the run, in order: the question and its options, then, folded away,
    /// the right option and what the run revealed after it.
    fn predictions(&self, events: &[Event]) -> String {
        let mut out = String::new();
        let mut asked = 0;
        for (i, event) in events.iter().enumerate() {
            let Event::Predict { prefix } = event else {
                continue;
            };
            asked += 1;
            if asked == 1 {
                out.push_str(&format!("## {}\n\n", self.common("label.predict")));
            }
            let question = self.own(&format!("{prefix}.question"));
            // The step just before the question is its setup in the run; a handout has no run.
            let setup = events[..i].iter().rev().find_map(|e| match e {
                Event::Step { text, .. } => Some(self.texts.render(self.name, self.lang, text)),
                _ => None,
            });
            // The setup first, then the question (written to follow "Predict: " in the
            // terminal; here it opens a line).
            let setup = setup.map_or_else(String::new, |s| format!("*{}* ", one_line(&s)));
            out.push_str(&format!(
                "{asked}. {setup}{}\n\n",
                capitalised(&one_line(&question))
            ));
            let options = self
                .texts
                .list(self.name, self.lang, &format!("{prefix}.options"));
            for (letter, option) in ('a'..='z').zip(&options) {
                out.push_str(&format!("   - {letter}) {}\n", one_line(option)));
            }
            let right = self
                .texts
                .get(self.name, self.lang, &format!("{prefix}.answer"))
                .unwrap_or_default();
            let right_option = right
                .chars()
                .next()
                .and_then(|c| options.get((c as usize).wrapping_sub('a' as usize)))
                .map(|o| one_line(o))
                .unwrap_or_default();
            let reveal = events[i..].iter().find_map(|e| match e {
                Event::Reveal { answer } => Some(self.texts.render(self.name, self.lang, answer)),
                _ => None,
            });
            out.push_str(&format!(
                "\n   <details><summary>{}</summary>\n\n   {right}) {right_option}\n\n",
                self.common("label.answer")
            ));
            if let Some(reveal) = reveal {
                out.push_str(&format!("   {}\n\n", one_line(&reveal)));
            }
            out.push_str("   </details>\n\n");
        }
        out
    }

    /// How to run it: the commands, then the knobs with their defaults, if it has any.
    fn run(&self) -> String {
        let name = self.name;
        let mut out = format!("## {}\n\n```sh\n", self.common("docs.run"));
        for flags in [
            "",
            " --step",
            " --diagram --show-sql --show-commands",
            " --quiz --answers",
        ] {
            out.push_str(&format!("lab run {name}{flags}\n"));
        }
        out.push_str(&format!("lab explain {name}\n```\n\n"));
        let knobs = lab_scenarios::catalogue::find(name)
            .map(|entry| entry.scenario.knobs)
            .unwrap_or_default();
        if !knobs.is_empty() {
            out.push_str(&format!("{}\n\n", self.common("docs.knobs")));
            for knob in knobs {
                let about = self
                    .texts
                    .get(name, self.lang, &format!("knobs.{}", knob.name))
                    .unwrap_or_default();
                let line = match knob.kind {
                    KnobKind::Switch { default } => {
                        Msg::new("docs.knob_switch").arg("other", (!default).to_string())
                    }
                    KnobKind::Millis { min, max, .. } => Msg::new("docs.knob_millis")
                        .arg("min", min as i64)
                        .arg("max", max as i64),
                }
                .arg("name", knob.name)
                .arg("value", knob.default_value().to_string())
                .arg("about", one_line(about));
                out.push_str(&format!(
                    "- {}\n",
                    self.texts.render(COMMON, self.lang, &line)
                ));
            }
            out.push('\n');
        }
        out
    }

    /// The Mermaid sequence diagram of the run's calls, with a note on what it leaves out;
    /// nothing when there is nothing to draw (lease-stale works on our table alone).
    fn diagram(&self, events: &[Event]) -> String {
        let mermaid = mermaid_calls(self.texts, self.lang, events);
        if mermaid.lines().count() < 2 {
            return String::new();
        }
        format!(
            "## {}\n\n{}\n\n```mermaid\n{}```\n\n",
            self.common("docs.diagram"),
            self.texts.render(
                COMMON,
                self.lang,
                &Msg::new("docs.diagram_note").arg("name", self.name)
            ),
            mermaid,
        )
    }

    /// Why it happened, and the lesson's checklist where the scenario has one.
    fn explain(&self) -> String {
        let mut out = format!(
            "## {}\n\n{}\n\n",
            self.common("label.explain"),
            self.own("explain").trim()
        );
        let checklist = self.texts.list(self.name, self.lang, "checklist");
        if !checklist.is_empty() {
            out.push_str(&format!("### {}\n\n", self.common("label.checklist")));
            for item in checklist {
                out.push_str(&format!("- {}\n", one_line(&item)));
            }
            out.push('\n');
        }
        out
    }

    /// The numbered questions, each model answer folded away under its question (nothing when
    /// the scenario has no quiz).
    fn quiz(&self) -> String {
        let answers = self.texts.list(self.name, self.lang, "quiz_answers");
        let questions = self.texts.list(self.name, self.lang, "quiz");
        if questions.is_empty() {
            return String::new();
        }
        let mut out = format!("## {}\n\n", self.common("label.quiz"));
        for (i, question) in questions.iter().enumerate() {
            out.push_str(&format!("{}. {}\n", i + 1, one_line(question)));
            if let Some(answer) = answers.get(i) {
                out.push_str(&format!(
                    "   <details><summary>{}</summary>\n\n   {}\n\n   </details>\n",
                    self.common("label.model_answer"),
                    one_line(answer)
                ));
            }
        }
        out.push('\n');
        out
    }

    /// The table of the facts the run measured.
    fn facts(&self, facts: &Facts) -> String {
        let mut out = format!(
            "## {}\n\n| {} | {} |\n|---|---|\n",
            self.common("label.facts"),
            self.common("label.fact"),
            self.common("label.measured"),
        );
        for (fact, value) in facts {
            out.push_str(&format!("| `{fact}` | `{value}` |\n"));
        }
        out
    }
}

/// `text` with its first letter in upper case, unless it opens with a name from code
/// (`complete_task()`, `lease_until`), which keeps its case.
fn capitalised(text: &str) -> String {
    let first_word = text.split_whitespace().next().unwrap_or_default();
    if first_word.contains(['_', '(']) {
        return text.to_string();
    }
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// A text written over several lines in the TOML files, as one Markdown line (a list item or a
/// table cell ends at a newline).
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
