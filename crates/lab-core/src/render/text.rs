//! The text renderer: what a learner reads in a terminal or on a projector.
//!
//! Colour is a parameter, not a global decision: `lab check` renders without colour while the
//! live output may have it. Nothing here depends on time, ports or run ids, so two runs render
//! byte for byte the same.

use std::fmt::Write as _;
use std::sync::Arc;

use colored::Colorize;

use crate::facts::compare;
use crate::text::COMMON;
use crate::{Event, Lang, Msg, Outcome, Table, Texts};

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
}

/// Renders a whole recorded run without colour (what `lab check` compares).
pub fn render_text(texts: &Arc<Texts>, lang: Lang, events: &[Event]) -> String {
    let mut renderer = TextRenderer::new(texts.clone(), lang, false);
    events.iter().map(|e| renderer.render(e)).collect()
}

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
        }
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

    /// Indents every line of a multi-line text.
    fn indent(text: &str, by: &str) -> String {
        text.trim_end()
            .lines()
            .map(|l| {
                if l.is_empty() {
                    "\n".to_string()
                } else {
                    format!("{by}{l}\n")
                }
            })
            .collect()
    }

    /// Renders one event as zero or more complete lines.
    pub fn render(&mut self, event: &Event) -> String {
        let out = self.render_event(event);
        if !out.is_empty() {
            self.ends_blank = out.ends_with("\n\n");
        }
        out
    }

    /// A blank line before a block, unless there is one already.
    fn gap(&self) -> &'static str {
        if self.ends_blank { "" } else { "\n" }
    }

    fn render_event(&mut self, event: &Event) -> String {
        match event {
            Event::Start { scenario } => {
                self.scope = scenario.clone();
                let title = format!("━━ {scenario} · {} ━━", self.key("title"));
                format!(
                    "\n{}\n\n{}\n",
                    self.paint(&title, Style::Title),
                    Self::indent(&self.key("story"), "")
                )
            }
            Event::Side { text } => {
                let line = format!("── {} ──", self.t(text));
                format!("{}{}\n\n", self.gap(), self.paint(&line, Style::Bold))
            }
            Event::Step { number, text } => {
                let text = self.t(text);
                let mut lines = text.lines();
                let first = format!("{number:>2}. {}", lines.next().unwrap_or_default());
                let mut out = format!("{}\n", self.paint(&first, Style::Bold));
                for line in lines {
                    let _ = writeln!(out, "    {line}");
                }
                out
            }
            Event::Request { text } => format!("    → {}\n", self.t(text)),
            Event::Response {
                outcome,
                status,
                body,
                detail,
            } => {
                let style = match outcome {
                    Outcome::Ok => Style::Ok,
                    Outcome::Fail => Style::Fail,
                    Outcome::Unknown => Style::Unknown,
                };
                let mut parts =
                    vec![self.paint(&self.key(&format!("outcome.{}", outcome.word())), style)];
                if let Some(status) = status {
                    parts.push(status.to_string());
                }
                if let Some(body) = body {
                    parts.push(body.clone());
                }
                if let Some(detail) = detail {
                    parts.push(self.t(detail));
                }
                format!("      {}\n", parts.join(" · "))
            }
            Event::Service { service, text } => {
                let line = format!(
                    "⚙ {}: {}",
                    self.key(&format!("service.{service}")),
                    self.t(text)
                );
                format!("      {}\n", self.paint(&line, Style::Dim))
            }
            Event::State { table } => self.table(table),
            Event::Note { text } => Self::indent(&self.t(text), "    "),
            Event::Predict { prefix } => {
                let mut out = format!(
                    "\n {} {}\n",
                    self.paint(
                        &format!("? {}:", self.key("label.predict")),
                        Style::Question
                    ),
                    self.key(&format!("{prefix}.question"))
                );
                let options = self
                    .texts
                    .list(&self.scope, self.lang, &format!("{prefix}.options"));
                for (letter, option) in ('a'..='z').zip(options) {
                    let _ = writeln!(out, "     {letter}) {option}");
                }
                out.push('\n');
                out
            }
            Event::LearnerAnswer { answer } => {
                format!("    {}: {answer}\n", self.key("label.your_answer"))
            }
            Event::Reveal { answer } => {
                let answer = self.t(answer);
                let mut lines = answer.lines();
                let mut out = format!(
                    "{} {} {}\n",
                    self.gap(),
                    self.paint(&format!("! {}:", self.key("label.answer")), Style::Answer),
                    lines.next().unwrap_or_default()
                );
                for line in lines {
                    let _ = writeln!(out, "   {line}");
                }
                out.push('\n');
                out
            }
            // Facts are shown together in the summary table.
            Event::Fact { .. } => String::new(),
            Event::Explain => format!(
                "{}{}\n{}",
                self.gap(),
                self.paint(&self.key("label.explain"), Style::Title),
                Self::indent(&self.key("explain"), "  ")
            ),
            Event::Quiz => {
                let mut out = format!(
                    "{}{}\n",
                    self.gap(),
                    self.paint(&self.key("label.quiz"), Style::Title)
                );
                for (i, q) in self
                    .texts
                    .list(&self.scope, self.lang, "quiz")
                    .iter()
                    .enumerate()
                {
                    let _ = writeln!(out, "  {}. {q}", i + 1);
                }
                out
            }
            Event::Summary {
                facts,
                expected,
                passed,
                ..
            } => self.summary(facts, expected, *passed),
        }
    }

    fn table(&self, table: &Table) -> String {
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
        let _ = writeln!(out, "    │ {}", self.paint(&header, Style::Dim));
        if table.rows.is_empty() {
            let _ = writeln!(out, "    │ {}", self.key("label.no_rows"));
        }
        for row in &table.rows {
            let _ = writeln!(out, "    │ {}", line(row));
        }
        out
    }

    fn summary(&self, facts: &crate::Facts, expected: &crate::Facts, passed: bool) -> String {
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
            self.key("label.expected"),
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
        let verdict = if passed {
            self.paint(&self.key("label.passed"), Style::Ok)
        } else {
            self.paint(&self.key("label.failed"), Style::Fail)
        };
        let _ = writeln!(out, "\n{verdict}");
        out
    }
}
