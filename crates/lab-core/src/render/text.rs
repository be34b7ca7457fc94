//! The text renderer: what a learner reads in a terminal or on a projector.
//!
//! Colour is a parameter, not a global decision: `lab check` renders without colour while the
//! live output may have it. Nothing here depends on time, ports or run ids, so two runs render
//! byte for byte the same.

use std::fmt::Write as _;
use std::sync::Arc;

use colored::Colorize;

use super::fold::{Fold, Folded};
use super::reflow;
use crate::facts::compare;
use crate::text::COMMON;
use crate::{Event, Executed, Lang, Msg, Outcome, Server, Table, Texts};

/// Renders events as text in one language.
pub struct TextRenderer {
    texts: Arc<Texts>,
    lang: Lang,
    color: bool,
    /// The scenario being rendered: its catalogue is consulted first.
    scope: String,
    /// What was rendered last ended with a blank line: a block that wants one before it (a side
    /// heading, a question, the explanation) does not add a second.
    ends_blank: bool,
    /// The prediction asked last (its key prefix), for grading at the reveal.
    prediction: Option<String>,
    /// What the learner answered to it, if anything.
    learner: Option<String>,
    /// Show the model answer under each quiz question (`--answers`).
    answers: bool,
    /// The last snapshot of each table (by title), to show what changed since.
    tables: std::collections::HashMap<String, Table>,
    /// Show the SQL statements (`--show-sql`) and Redis commands (`--show-commands`) that ran.
    show_sql: bool,
    show_commands: bool,
    /// Statements and commands not yet shown. A script acts first and then tells the step
    /// (with what it measured), so what ran just before a step is shown under it.
    executed: String,
    /// The services' lines that say why, folded until the reveal.
    fold: Fold,
}

/// Renders a whole recorded run without colour (what `lab check` compares).
pub fn render_text(texts: &Arc<Texts>, lang: Lang, events: &[Event]) -> String {
    let mut renderer = TextRenderer::new(texts.clone(), lang, false);
    events.iter().map(|e| renderer.render(e)).collect()
}

/// How many steps a rendered narrative has: the number of its last step line (` 7. …`, `12. …`,
/// as [`TextRenderer`] writes them), when the step lines count 1, 2, 3, … in order. The quiz's
/// numbered questions are indented further (`  1. `) and are not steps. `None` when there are
/// no steps or they do not count up in order (a file edited by hand): no number rather than a
/// wrong one.
pub fn count_steps(narrative: &str) -> Option<u32> {
    let mut last = 0;
    for line in narrative.lines() {
        // A step's number is right-aligned in two columns: " 7. " or "12. ".
        let head = line.get(..2).unwrap_or("");
        if !line.get(2..).is_some_and(|rest| rest.starts_with(". ")) {
            continue;
        }
        let Ok(number) = head.trim_start().parse::<u32>() else {
            continue;
        };
        if number != last + 1 {
            return None;
        }
        last = number;
    }
    (last > 0).then_some(last)
}

/// The words of a line for wrapping, with `=` and `→` glued to their neighbours: `attempts = 2`
/// never breaks across lines.
fn glued_words(line: &str) -> Vec<String> {
    let mut words: Vec<String> = Vec::new();
    let mut glue_next = false;
    for word in line.split_whitespace() {
        let joiner = matches!(word, "=" | "→");
        match words.last_mut() {
            Some(last) if joiner || glue_next => {
                last.push(' ');
                last.push_str(word);
            }
            _ => words.push(word.to_string()),
        }
        glue_next = joiner;
    }
    words
}

/// The width prose is wrapped to. Tables, requests and responses are not wrapped: their lines
/// are data, and a broken JSON body is harder to read than a long line.
const WIDTH: usize = 100;

enum Style {
    Title,
    Bold,
    Dim,
    Ok,
    Fail,
    Unknown,
    Question,
    Answer,
}

impl TextRenderer {
    pub fn new(texts: Arc<Texts>, lang: Lang, color: bool) -> TextRenderer {
        TextRenderer {
            texts,
            lang,
            color,
            scope: COMMON.to_string(),
            ends_blank: false,
            prediction: None,
            learner: None,
            answers: false,
            tables: std::collections::HashMap::new(),
            show_sql: false,
            show_commands: false,
            executed: String::new(),
            fold: Fold::new(),
        }
    }

    /// Shows the SQL statements and the Redis commands each step executed.
    pub fn with_executed(mut self, sql: bool, commands: bool) -> TextRenderer {
        self.show_sql = sql;
        self.show_commands = commands;
        self
    }

    /// Shows the model answer under each quiz question.
    pub fn with_answers(mut self, answers: bool) -> TextRenderer {
        self.answers = answers;
        self
    }

    /// The look `s` of step mode: the rows (and the Redis keys, with their TTL) that the run
    /// has shown, in the order it first showed them. A table in `now` was just read again: it
    /// is shown as it is now, with what changed since the class last saw it marked as the
    /// narrative marks it (`old→new`, `+`). Any other is shown as last read, with its step.
    pub fn state_so_far(&mut self, events: &[Event], now: &[Table]) -> String {
        let mut order: Vec<String> = Vec::new();
        let mut latest: std::collections::HashMap<String, (u32, Table)> = Default::default();
        let mut step = 0;
        for event in events {
            match event {
                Event::Start { scenario } => self.scope = scenario.clone(),
                Event::Step { number, .. } => step = *number,
                Event::State { table } => {
                    if !latest.contains_key(&table.title.key) {
                        order.push(table.title.key.clone());
                    }
                    latest.insert(table.title.key.clone(), (step, table.clone()));
                }
                _ => {}
            }
        }
        let heading = self.paint(
            &format!("── {} ──", self.key("gate.look.state")),
            Style::Bold,
        );
        let mut out = format!("\n{heading}\n");
        if order.is_empty() {
            out.push_str(&Self::wrap(&self.key("gate.look.no_state"), "    ", "    "));
        }
        for key in &order {
            let (step, shown) = &latest[key];
            let (table, read) = match now.iter().find(|t| t.title.key == *key) {
                Some(fresh) => (
                    self.table(fresh, Some(shown)),
                    self.key("gate.look.read_now"),
                ),
                None => (
                    self.table(shown, None),
                    self.t(&Msg::new("gate.look.read_at").arg("step", *step)),
                ),
            };
            out.push_str(&table);
            let _ = writeln!(out, "    └ {}", self.paint(&read, Style::Dim));
        }
        out
    }

    /// The look `b` of step mode: the `back`-th last step as the narrative showed it (1: the
    /// last one), with everything after it up to the next step: its calls, what the services
    /// did, its tables. Further back than the first step is the title and the story.
    pub fn step_again(&mut self, events: &[Event], back: usize) -> String {
        // Rendered from the start, as the live renderer did, so each table's marks of what
        // changed come out the same.
        let mut text = String::new();
        let mut starts = vec![0];
        for event in events {
            if matches!(event, Event::Step { .. }) {
                starts.push(text.len());
            }
            text.push_str(&self.render(event));
        }
        let from = starts.len().saturating_sub(back.max(1));
        let start = starts[from];
        let end = starts.get(from + 1).copied().unwrap_or(text.len());
        let heading = self.paint(
            &format!("── {} ──", self.key("gate.look.again")),
            Style::Bold,
        );
        format!("\n{heading}\n{}", &text[start..end])
    }

    fn t(&self, msg: &Msg) -> String {
        self.texts.render(&self.scope, self.lang, msg)
    }

    fn key(&self, key: &str) -> String {
        self.t(&Msg::new(key))
    }

    fn paint(&self, s: &str, style: Style) -> String {
        if !self.color {
            return s.to_string();
        }
        match style {
            Style::Title => s.bold().cyan().to_string(),
            Style::Bold => s.bold().to_string(),
            Style::Dim => s.dimmed().to_string(),
            Style::Ok => s.green().bold().to_string(),
            Style::Fail => s.red().bold().to_string(),
            Style::Unknown => s.yellow().bold().to_string(),
            Style::Question => s.magenta().bold().to_string(),
            Style::Answer => s.blue().bold().to_string(),
        }
    }

    /// Word-wraps prose to [`WIDTH`] columns (a projector shows about a hundred). Each line the
    /// author wrote is wrapped on its own, keeping its indentation, so deliberate line breaks
    /// and indented SQL stay as written. The first output line gets `first` in front, every
    /// other line `rest`; blank lines stay blank. Returns complete lines.
    fn wrap(text: &str, first: &str, rest: &str) -> String {
        let mut lines: Vec<String> = Vec::new();
        for source in text.trim_end().lines() {
            if source.trim().is_empty() {
                lines.push(String::new());
                continue;
            }
            let lead: String = source.chars().take_while(|c| *c == ' ').collect();
            let mut line = lead.clone();
            let mut has_word = false;
            for word in glued_words(source) {
                let prefix = if lines.is_empty() { first } else { rest };
                let width =
                    prefix.chars().count() + line.chars().count() + 1 + word.chars().count();
                if has_word && width > WIDTH {
                    lines.push(std::mem::replace(&mut line, lead.clone()));
                    has_word = false;
                }
                if has_word {
                    line.push(' ');
                }
                line.push_str(&word);
                has_word = true;
            }
            lines.push(line);
        }
        lines
            .iter()
            .enumerate()
            .map(|(i, l)| match (i, l.is_empty()) {
                (_, true) => "\n".to_string(),
                (0, false) => format!("{first}{l}\n"),
                (_, false) => format!("{rest}{l}\n"),
            })
            .collect()
    }

    /// Renders one event as zero or more complete lines.
    pub fn render(&mut self, event: &Event) -> String {
        self.fold.see(event);
        let unfolded = self.fold.unfold(event);
        let out = match event {
            Event::Executed(executed) => {
                let line = self.executed(executed);
                self.executed.push_str(&line);
                return String::new();
            }
            Event::Step { .. } => {
                let step = self.render_event(event);
                step + &std::mem::take(&mut self.executed)
            }
            // The lines folded until a reveal come under it; those of a part that revealed
            // nothing, at its end.
            Event::Reveal { .. } => {
                let reveal = self.render_event(event);
                let block = self.unfolded(&unfolded);
                let reveal = match block.is_empty() {
                    true => reveal,
                    false => reveal.trim_end_matches('\n').to_string() + "\n" + &block + "\n",
                };
                std::mem::take(&mut self.executed) + &reveal
            }
            _ => {
                let block = self.unfolded(&unfolded);
                std::mem::take(&mut self.executed) + &block + &self.render_event(event)
            }
        };
        if !out.is_empty() {
            self.ends_blank = out.ends_with("\n\n");
        }
        out
    }

    /// A blank line before a block, unless there is one already.
    fn gap(&self) -> &'static str {
        if self.ends_blank { "" } else { "\n" }
    }

    /// Renders one event, as [`render`](Self::render) shows it: one arm per event, each kind of
    /// block in a helper of its own below.
    fn render_event(&mut self, event: &Event) -> String {
        match event {
            Event::Start { scenario } => self.start(scenario),
            Event::Side { text } => self.side(text),
            Event::Step { number, text } => self.step(*number, text),
            Event::Request { text, .. } => format!("    → {}\n", self.t(text)),
            Event::Response {
                outcome,
                status,
                body,
                detail,
            } => self.response(*outcome, *status, body.as_deref(), detail.as_ref()),
            Event::Service { service, text } => {
                let shown = self
                    .fold
                    .service(&self.texts, &self.scope, self.lang, service, text);
                self.service(service, &shown)
            }
            // Held back by `render` and shown with the next event.
            Event::Executed(_) => String::new(),
            Event::State { table } => {
                let previous = self.tables.insert(table.title.key.clone(), table.clone());
                self.table(table, previous.as_ref())
            }
            Event::Note { text } => Self::wrap(&reflow(&self.t(text)), "    ", "    "),
            Event::Predict { prefix } => self.predict(prefix),
            Event::LearnerAnswer { answer } => {
                self.learner = Some(answer.clone());
                format!("    {}: {answer}\n", self.key("label.your_answer"))
            }
            Event::Reveal { answer } => self.reveal(answer),
            // Facts are shown together in the summary table.
            Event::Fact { .. } => String::new(),
            // Drawn, not told: the step that breaks a hop or holds a request says so in words.
            Event::Fault { .. } | Event::Checkpoint { .. } => String::new(),
            Event::Explain => self.explanation(),
            Event::Quiz => self.quiz(),
            Event::Summary {
                facts,
                expected,
                passed,
                settings,
                ..
            } => self.summary(facts, expected, *passed, settings),
        }
    }

    /// The start of a scenario: its title and its story. Forgets what the previous scenario
    /// asked and showed.
    fn start(&mut self, scenario: &str) -> String {
        self.scope = scenario.to_string();
        self.prediction = None;
        self.learner = None;
        self.tables.clear();
        let title = format!("━━ {scenario} · {} ━━", self.key("title"));
        format!(
            "\n{}\n\n{}\n",
            self.paint(&title, Style::Title),
            Self::wrap(&reflow(&self.key("story")), "", "")
        )
    }

    /// The heading of one side of a two-sided scenario: `── the fixed design ──`.
    fn side(&mut self, text: &Msg) -> String {
        // A side starts a story of its own (often on emptied tables): nothing to compare.
        self.tables.clear();
        let line = format!("── {} ──", self.t(text));
        format!("{}{}\n\n", self.gap(), self.paint(&line, Style::Bold))
    }

    /// A numbered step of the story: ` 7. …`, wrapped under its number.
    fn step(&self, number: u32, text: &Msg) -> String {
        let text = Self::wrap(&reflow(&self.t(text)), &format!("{number:>2}. "), "    ");
        // The step's first line stands out; its continuation does not.
        let (first, rest) = text.split_once('\n').unwrap_or((&text, ""));
        format!("{}\n{rest}", self.paint(first, Style::Bold))
    }

    /// What the caller saw: `ok · 201 · {"report_id":2}`, the outcome in its colour, then the
    /// status, the body and why, whichever there are.
    fn response(
        &self,
        outcome: Outcome,
        status: Option<u16>,
        body: Option<&str>,
        detail: Option<&Msg>,
    ) -> String {
        let style = match outcome {
            Outcome::Ok => Style::Ok,
            Outcome::Fail => Style::Fail,
            Outcome::Unknown => Style::Unknown,
        };
        let mut parts = vec![self.paint(&self.key(&format!("outcome.{}", outcome.word())), style)];
        if let Some(status) = status {
            parts.push(status.to_string());
        }
        if let Some(body) = body {
            parts.push(body.to_string());
        }
        if let Some(detail) = detail {
            parts.push(self.t(detail));
        }
        format!("      {}\n", parts.join(" · "))
    }

    /// Something a bundled service did, dimmed under the call it handles: `⚙ report service: …`.
    fn service(&self, service: &str, text: &Msg) -> String {
        let line = format!(
            "⚙ {}: {}",
            self.key(&format!("service.{service}")),
            self.t(text)
        );
        format!("      {}\n", self.paint(&line, Style::Dim))
    }

    /// The services' lines folded until now, in full: `⚙ report service (step 3): …` under a
    /// label, or nothing.
    fn unfolded(&self, lines: &[Folded]) -> String {
        if lines.is_empty() {
            return String::new();
        }
        let mut out = Self::wrap(&self.key("label.unfolded"), "   ", "   ");
        for line in lines {
            let head = self.t(&Msg::new("label.unfolded_line")
                .arg("service", Msg::new(format!("service.{}", line.service)))
                .arg("step", line.step));
            let text = format!("⚙ {head}: {}", self.t(&line.text));
            out.push_str(&format!("     {}\n", self.paint(&text, Style::Dim)));
        }
        out
    }

    /// The prediction asked before the decisive step: `? Predict: …` and its lettered options.
    /// Remembers the question, for grading at the reveal.
    fn predict(&mut self, prefix: &str) -> String {
        self.prediction = Some(prefix.to_string());
        self.learner = None;
        let label = format!("? {}: ", self.key("label.predict"));
        let question = Self::wrap(
            &self.key(&format!("{prefix}.question")),
            &format!(" {label}"),
            "   ",
        );
        let question = question.replacen(
            &label,
            &format!("{} ", self.paint(label.trim_end(), Style::Question)),
            1,
        );
        let mut out = format!("{}{question}", self.gap());
        let options = self
            .texts
            .list(&self.scope, self.lang, &format!("{prefix}.options"));
        for (letter, option) in ('a'..='z').zip(options) {
            out.push_str(&Self::wrap(
                &option,
                &format!("     {letter}) "),
                "        ",
            ));
        }
        out.push('\n');
        out
    }

    /// Why it happened: the scenario's `explain` text, then the lesson's production checklist.
    fn explanation(&self) -> String {
        let mut out = format!(
            "{}{}\n{}",
            self.gap(),
            self.paint(&self.key("label.explain"), Style::Title),
            Self::wrap(&reflow(&self.key("explain")), "  ", "  ")
        );
        // A lesson's production checklist, where the scenario has one.
        let checklist = self.texts.list(&self.scope, self.lang, "checklist");
        if !checklist.is_empty() {
            out.push('\n');
            out.push_str(&format!(
                "{}\n",
                self.paint(&self.key("label.checklist"), Style::Title)
            ));
            for item in checklist {
                out.push_str(&Self::wrap(&item, "  • ", "    "));
            }
        }
        out
    }

    /// "Check your understanding": the numbered questions, each with its model answer under it
    /// when `--answers` asks for them.
    fn quiz(&self) -> String {
        let mut out = format!(
            "{}{}\n",
            self.gap(),
            self.paint(&self.key("label.quiz"), Style::Title)
        );
        let models = self.texts.list(&self.scope, self.lang, "quiz_answers");
        for (i, q) in self
            .texts
            .list(&self.scope, self.lang, "quiz")
            .iter()
            .enumerate()
        {
            out.push_str(&Self::wrap(q, &format!("  {}. ", i + 1), "     "));
            if self.answers
                && let Some(model) = models.get(i)
            {
                let label = format!("{}: ", self.key("label.model_answer"));
                out.push_str(&Self::wrap(
                    model,
                    &format!("     {}", self.paint(&label, Style::Answer)),
                    "     ",
                ));
            }
        }
        out
    }

    /// One statement or command, as its client's prompt would show it, with the server's
    /// answer as a comment: `sql> UPDATE tasks SET … WHERE id = $1;  -- UPDATE 1 · worker`.
    fn executed(&self, executed: &Executed) -> String {
        let (prompt, shown) = match executed.server {
            Server::Postgres => ("sql>", self.show_sql),
            Server::Redis => ("redis>", self.show_commands),
        };
        if !shown {
            return String::new();
        }
        let terminator = if executed.server == Server::Postgres {
            ";"
        } else {
            ""
        };
        let mut comment = executed.result.clone();
        if let Some(service) = &executed.by {
            comment = format!("{comment} · {}", self.key(&format!("service.{service}")));
        }
        let line = format!("{prompt} {}{terminator}  -- {comment}", executed.text);
        format!("      {}\n", self.paint(&line, Style::Dim))
    }

    /// The answer to the prediction: the right option (from the scenario's answer key), the
    /// explanation built from measured values, and, when the learner answered, whether they were
    /// right.
    fn reveal(&mut self, answer: &Msg) -> String {
        let label = format!("! {}: ", self.key("label.answer"));
        let prefix = self.prediction.clone().unwrap_or_else(|| "predict".into());
        let right = self.texts.prediction(&self.scope, self.lang, &prefix);
        let mut out = self.gap().to_string();
        let painted = format!("{} ", self.paint(label.trim_end(), Style::Answer));
        match &right {
            Some((letter, option)) => {
                let line = Self::wrap(&format!("{letter}) {option}"), &format!(" {label}"), "   ");
                out.push_str(&line.replacen(&label, &painted, 1));
                out.push_str(&Self::wrap(&reflow(&self.t(answer)), "   ", "   "));
            }
            None => {
                let text = Self::wrap(&reflow(&self.t(answer)), &format!(" {label}"), "   ");
                out.push_str(&text.replacen(&label, &painted, 1));
            }
        }
        if let Some(given) = self.learner.take()
            && let Some(right) = self.texts.grade(&self.scope, self.lang, &prefix, &given)
        {
            let (key, style) = if right {
                ("label.learner_right", Style::Ok)
            } else {
                ("label.learner_wrong", Style::Fail)
            };
            let verdict = self.t(&Msg::new(key).arg("answer", given.as_str()));
            out.push_str(&format!("   {}\n", self.paint(&verdict, style)));
        }
        out.push('\n');
        out
    }

    /// A table, with what changed since the previous snapshot of the same table: a changed cell
    /// shows `old→new`, a row that was not there before is marked `+`. Rows are matched by their
    /// first column (an id, a key).
    fn table(&self, table: &Table, previous: Option<&Table>) -> String {
        let previous = previous.filter(|p| p.columns == table.columns);
        let mut marks = vec![" "; table.rows.len()];
        let mut rows = table.rows.clone();
        if let Some(previous) = previous {
            for (i, row) in rows.iter_mut().enumerate() {
                let before = previous
                    .rows
                    .iter()
                    .find(|p| !p.is_empty() && p.first() == row.first());
                match before {
                    None => marks[i] = "+",
                    Some(before) => {
                        for (cell, old) in row.iter_mut().zip(before) {
                            if cell != old {
                                *cell = format!("{old}→{cell}");
                            }
                        }
                    }
                }
            }
        }
        let changed = previous.is_some() && rows != table.rows || marks.contains(&"+");
        let table = Table {
            title: table.title.clone(),
            columns: table.columns.clone(),
            rows,
        };
        let gutter = |mark: &str| {
            if changed {
                format!("{mark} ")
            } else {
                String::new()
            }
        };
        let mut widths: Vec<usize> = table.columns.iter().map(|c| c.chars().count()).collect();
        for row in &table.rows {
            for (i, cell) in row.iter().enumerate() {
                if i < widths.len() {
                    widths[i] = widths[i].max(cell.chars().count());
                }
            }
        }
        let line = |cells: &[String]| -> String {
            let padded: Vec<String> = cells
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect();
            padded.join("  ").trim_end().to_string()
        };
        let mut out = format!("    ┌ {}\n", self.t(&table.title));
        let header = line(&table.columns);
        let _ = writeln!(
            out,
            "    │ {}{}",
            gutter(" "),
            self.paint(&header, Style::Dim)
        );
        if table.rows.is_empty() {
            let _ = writeln!(out, "    │ {}{}", gutter(" "), self.key("label.no_rows"));
        }
        for (row, mark) in table.rows.iter().zip(&marks) {
            let _ = writeln!(out, "    │ {}{}", gutter(mark), line(row));
        }
        out
    }

    fn summary(
        &self,
        facts: &crate::Facts,
        expected: &crate::Facts,
        passed: bool,
        settings: &[(String, String)],
    ) -> String {
        let checks = compare(facts, expected);
        let show = |v: &Option<serde_json::Value>| match v {
            Some(v) => v.to_string(),
            None => "—".to_string(),
        };
        let rows: Vec<[String; 3]> = checks
            .iter()
            .map(|c| [c.name.clone(), show(&c.actual), show(&c.expected)])
            .collect();
        let heads = [
            self.key("label.fact"),
            self.key("label.measured"),
            self.key(if settings.is_empty() {
                "label.expected"
            } else {
                "label.default_run"
            }),
        ];
        let mut widths = heads.clone().map(|h| h.chars().count());
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: &[String; 3]| {
            format!(
                "{:<w0$}  {:<w1$}  {:<w2$}",
                cells[0],
                cells[1],
                cells[2],
                w0 = widths[0],
                w1 = widths[1],
                w2 = widths[2]
            )
        };
        let mut out = format!(
            "{}{}\n",
            self.gap(),
            self.paint(&self.key("label.facts"), Style::Title)
        );
        let _ = writeln!(out, "  {}", self.paint(line(&heads).trim_end(), Style::Dim));
        for (row, check) in rows.iter().zip(&checks) {
            let mark = if check.ok() {
                self.paint("✓", Style::Ok)
            } else {
                self.paint("✗", Style::Fail)
            };
            let _ = writeln!(out, "  {}  {mark}", line(row));
        }
        if !settings.is_empty() {
            // Knobs set: a difference from the default run is what the knob does, not drift.
            let _ = writeln!(out);
            for (name, value) in settings {
                let about = self.key(&format!("knobs.{name}"));
                let line = self.t(&Msg::new("label.knob")
                    .arg("name", name.as_str())
                    .arg("value", value.as_str())
                    .arg("about", about));
                out.push_str(&Self::wrap(&line, "  ", "  "));
            }
            let differ = checks.iter().filter(|c| !c.ok()).count();
            let verdict = self.t(&Msg::new("label.knobs_differ").arg("count", differ));
            let _ = writeln!(out, "\n{}", self.paint(&verdict, Style::Bold));
            return out;
        }
        let verdict = if passed {
            self.paint(&self.key("label.passed"), Style::Ok)
        } else {
            self.paint(&self.key("label.failed"), Style::Fail)
        };
        let _ = writeln!(out, "\n{verdict}");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prose_wraps_at_the_width_and_keeps_authored_breaks() {
        let long = "word ".repeat(60);
        let text = format!("{long}\n  indented line\n\nnext paragraph");
        let out = TextRenderer::wrap(&text, " 1. ", "    ");
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines.iter().all(|l| l.chars().count() <= WIDTH), "{out}");
        assert!(lines[0].starts_with(" 1. word"));
        assert!(lines[1].starts_with("    word"));
        assert!(lines.contains(&"      indented line"), "{out}");
        assert!(lines.contains(&""), "the blank line stays: {out}");
    }

    #[test]
    fn reflow_joins_paragraph_lines_but_keeps_breaks_and_indented_lines() {
        let text = "one\ntwo\n\nthree\n  WHERE x\n  AND y\nfour\nfive";
        assert_eq!(
            reflow(text),
            "one two\n\nthree\n  WHERE x\n  AND y\nfour five"
        );
    }

    /// A catalogue with what the looks need, and a run: the story, two steps, a table shown
    /// after each.
    fn run_so_far() -> (Arc<Texts>, Vec<Event>) {
        let mut texts = Texts::new();
        texts
            .add(
                COMMON,
                Lang::En,
                "title = \"T\"\nstory = \"The story.\"\n[step]\none = \"One.\"\ntwo = \"Two.\"\n\
                 [table]\ntasks = \"tasks\"\n[gate.look]\nstate = \"State\"\n\
                 no_state = \"Nothing yet.\"\nread_at = \"as read at step {step}\"\n\
                 read_now = \"read again just now\"\nagain = \"Again\"\n",
            )
            .unwrap();
        let tasks = |status: &str| Table {
            title: Msg::new("table.tasks"),
            columns: vec!["id".into(), "status".into()],
            rows: vec![vec!["42".into(), status.into()]],
        };
        let events = vec![
            Event::Start {
                scenario: "x".into(),
            },
            Event::Step {
                number: 1,
                text: Msg::new("step.one"),
            },
            Event::State {
                table: tasks("pending"),
            },
            Event::Step {
                number: 2,
                text: Msg::new("step.two"),
            },
        ];
        (Arc::new(texts), events)
    }

    #[test]
    fn the_state_look_shows_tables_as_last_read_or_read_again_with_what_changed() {
        let (texts, events) = run_so_far();
        let last = TextRenderer::new(texts.clone(), Lang::En, false).state_so_far(&events, &[]);
        assert!(last.contains("│ 42  pending"), "{last}");
        assert!(last.contains("└ as read at step 1"), "{last}");

        let now = Table {
            title: Msg::new("table.tasks"),
            columns: vec!["id".into(), "status".into()],
            rows: vec![vec!["42".into(), "processing".into()]],
        };
        let fresh = TextRenderer::new(texts.clone(), Lang::En, false).state_so_far(&events, &[now]);
        assert!(fresh.contains("42  pending→processing"), "{fresh}");
        assert!(fresh.contains("└ read again just now"), "{fresh}");

        let none = TextRenderer::new(texts, Lang::En, false).state_so_far(&events[..2], &[]);
        assert!(none.contains("Nothing yet."), "{none}");
    }

    #[test]
    fn back_shows_the_last_step_then_the_one_before_then_the_story() {
        let (texts, events) = run_so_far();
        let again =
            |back| TextRenderer::new(texts.clone(), Lang::En, false).step_again(&events, back);
        assert_eq!(again(1), "\n── Again ──\n 2. Two.\n");
        assert_eq!(
            again(2),
            "\n── Again ──\n 1. One.\n    ┌ tasks\n    │ id  status\n    │ 42  pending\n"
        );
        assert!(again(3).contains("The story."), "{}", again(3));
        assert_eq!(again(9), again(3), "no further back than the story");
    }

    #[test]
    fn steps_are_counted_by_their_lines_not_the_quiz() {
        let narrative = "story\n 1. one\n    more\n 2. two\n\nquiz\n  1. why?\n  2. how?\n";
        assert_eq!(count_steps(narrative), Some(2));
        let ten: String = (1..=12).map(|n| format!("{n:>2}. step\n")).collect();
        assert_eq!(count_steps(&ten), Some(12));
        assert_eq!(count_steps("no steps\n  1. a question\n"), None);
        assert_eq!(count_steps(" 1. one\n 3. three\n"), None, "not in order");
    }

    #[test]
    fn an_assignment_is_never_split() {
        let text = format!("{} attempts = 2 and more", "x".repeat(88));
        let out = TextRenderer::wrap(&text, "", "");
        assert!(out.contains("attempts = 2"), "{out}");
    }
}
