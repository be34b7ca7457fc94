//! A check run, told: as text in the learner's language ([`text`]), as JSON lines ([`json`]) or
//! as a JUnit document ([`junit`]) for a course's CI. The CLI only chooses one and prints what
//! it returns.
//!
//! Every way a run can end is told in every form ([`Ending`]): all the selected checks ran, the
//! program never answered, the environment failed, or the run was interrupted. A JSON reader
//! and a JUnit reader always get a whole document, with every selected check in it.

pub mod json;
pub mod junit;
pub mod text;

use colored::Colorize;
use lab_core::{Lang, Msg, Texts};

use crate::error::ErrorKind;
use crate::exercise::{CheckOptions, Exercise, Subject};
use crate::guest::NotReady;
use crate::verdict::{CheckReport, Verdict, VerdictKind, who};

/// The words of the exercises, rendered in one language.
pub struct Words {
    pub texts: Texts,
    pub lang: Lang,
    pub color: bool,
    /// Draw a failed check's calls as lanes (`--diagram`).
    pub diagram: bool,
}

impl Words {
    pub fn new(lang: Lang, color: bool) -> Result<Words, lab_core::text::TextError> {
        Ok(Words {
            texts: crate::texts()?,
            lang,
            color,
            diagram: false,
        })
    }

    /// A word every exercise shares (`exercises/common/*.toml`).
    pub fn common(&self, msg: impl Into<Msg>) -> String {
        self.texts
            .render(lab_core::text::COMMON, self.lang, &msg.into())
    }

    /// A word of one exercise (its own, else a shared one).
    pub fn of(&self, exercise: &Exercise, msg: &Msg) -> String {
        self.texts.render(exercise.name, self.lang, msg)
    }

    /// Who made a call, in words.
    pub fn who(&self, exercise: &Exercise, raw: &str) -> String {
        self.of(exercise, &who(raw))
    }

    /// A verdict's word, padded to the longest of the four in this language (before colour,
    /// which would count as width).
    pub fn verdict(&self, verdict: VerdictKind) -> String {
        let width = VerdictKind::ALL
            .iter()
            .map(|v| self.common(verdict_key(*v)).chars().count())
            .max()
            .unwrap_or(0);
        let word = format!("{:<width$}", self.common(verdict_key(verdict)));
        if !self.color {
            return word;
        }
        match verdict {
            VerdictKind::Pass => word.green().bold().to_string(),
            VerdictKind::Fail => word.red().bold().to_string(),
            VerdictKind::Unknown => word.yellow().bold().to_string(),
            VerdictKind::Skipped => word.dimmed().to_string(),
        }
    }

    /// The line of a check's verdict: its reason, in words.
    pub fn reason(&self, exercise: &Exercise, verdict: &Verdict) -> Option<String> {
        verdict.reason().map(|msg| self.of(exercise, msg))
    }
}

fn verdict_key(verdict: VerdictKind) -> Msg {
    Msg::new(format!("verdict.{}", verdict.word()))
}

/// How a check run ended, for the reports that must say it whatever happened.
#[derive(Debug)]
pub enum Ending<'a> {
    /// Every selected check ran.
    Done,
    /// The program never answered: nothing could be checked.
    NotReady(&'a NotReady),
    /// The lab could not go on: usage or environment, and what it said.
    Error { kind: ErrorKind, message: String },
    /// A signal stopped the run (everything was cleaned up).
    Interrupted,
}

impl Ending<'_> {
    /// The reason every check that did not run is given, in words.
    pub fn why_not_run(&self, words: &Words) -> Option<String> {
        match self {
            Ending::Done => None,
            Ending::NotReady(not_ready) => Some(text::not_ready_line(words, not_ready)),
            Ending::Error { message, .. } => {
                Some(words.common(Msg::new("check.not_run_error").arg("error", message.as_str())))
            }
            Ending::Interrupted => Some(words.common("check.not_run_interrupted")),
        }
    }

    pub fn word(&self) -> &'static str {
        match self {
            Ending::Done => "done",
            Ending::NotReady(_) => "not_ready",
            Ending::Error {
                kind: ErrorKind::Usage,
                ..
            } => "usage_error",
            Ending::Error {
                kind: ErrorKind::Environment,
                ..
            } => "environment_error",
            Ending::Interrupted => "interrupted",
        }
    }
}

/// The checks a run selected that have no report: they did not run (the run ended first).
pub fn not_run<'e>(
    exercise: &'e Exercise,
    options: &CheckOptions,
    reports: &[CheckReport],
) -> Vec<&'e str> {
    exercise
        .checks()
        .map(|c| c.name)
        .filter(|name| options.selects(name) && !reports.iter().any(|r| r.name == *name))
        .collect()
}

/// The command that runs one check again, as the learner can paste it.
#[derive(Debug, Clone)]
pub struct Replay {
    base: String,
    repeat: u32,
}

impl Replay {
    /// The replay of a run of `exercise` on `subject`; `database_url` is the one the run was
    /// given (a target's database, where the lab reads its rows), `repeat` its `--repeat`.
    pub fn new(
        exercise: &Exercise,
        subject: &Subject,
        database_url: Option<&str>,
        repeat: u32,
    ) -> Replay {
        let mut base = format!("lab exercise check {}", exercise.name);
        match subject {
            Subject::Program { dir, .. } => {
                base.push(' ');
                base.push_str(&shell_word(&dir.display().to_string()));
            }
            Subject::Target { url } => {
                base.push_str(&format!(" --target {}", shell_word(url)));
            }
        }
        if let Some(url) = database_url {
            base.push_str(&format!(" --database-url {}", shell_word(url)));
        }
        Replay { base, repeat }
    }

    /// The replay as a class board shows it: no folder and no database URL (a learner's path
    /// can name them, a URL can hold a password), only the exercise, the check and its seed.
    pub fn portable(exercise: &Exercise, repeat: u32) -> Replay {
        Replay {
            base: format!("lab exercise check {}", exercise.name),
            repeat,
        }
    }

    /// The line that replays `report`'s check: its name, and for a seeded check its seed (and
    /// the run's `--repeat` when it was not the default).
    pub fn line(&self, report: &CheckReport) -> String {
        let mut line = format!("{} --only {}", self.base, report.name);
        if let Some(seed) = report.seed {
            line.push_str(&format!(" --seed {seed}"));
            if self.repeat != CheckOptions::REPEAT {
                line.push_str(&format!(" --repeat {}", self.repeat));
            }
        }
        line
    }
}

/// `word` as a POSIX shell reads it back: as it is when it holds nothing special, else in
/// single quotes.
pub fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// How many checks ended each way.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Tally {
    pub passed: usize,
    pub failed: usize,
    pub unknown: usize,
    pub skipped: usize,
    /// Selected, and never run (the run ended first).
    pub not_run: usize,
}

impl Tally {
    pub fn of(reports: &[CheckReport], not_run: usize) -> Tally {
        let count = |kind| reports.iter().filter(|r| r.verdict.kind() == kind).count();
        Tally {
            passed: count(VerdictKind::Pass),
            failed: count(VerdictKind::Fail),
            unknown: count(VerdictKind::Unknown),
            skipped: count(VerdictKind::Skipped),
            not_run,
        }
    }

    pub fn total(&self) -> usize {
        self.passed + self.failed + self.unknown + self.skipped + self.not_run
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_word_for_the_shell_is_quoted_only_when_it_must_be() {
        assert_eq!(
            shell_word("lab-exercises/report-api"),
            "lab-exercises/report-api"
        );
        assert_eq!(
            shell_word("postgresql://u:p@127.0.0.1:5432/db?sslmode=disable"),
            "'postgresql://u:p@127.0.0.1:5432/db?sslmode=disable'"
        );
        assert_eq!(shell_word("my dir"), "'my dir'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
        assert_eq!(shell_word(""), "''");
    }

    fn report(name: &'static str, seed: Option<u64>) -> CheckReport {
        CheckReport {
            name,
            verdict: Verdict::Pass,
            schedule: Vec::new(),
            seed,
            output: None,
        }
    }

    #[test]
    fn a_replay_line_carries_what_the_run_needs() {
        let exercise = crate::find("report-api").unwrap();
        let target = Subject::Target {
            url: "http://127.0.0.1:8000".into(),
        };
        let replay = Replay::new(
            exercise,
            &target,
            Some("postgresql://lab@127.0.0.1/lab"),
            CheckOptions::REPEAT,
        );
        assert_eq!(
            replay.line(&report("race", None)),
            "lab exercise check report-api --target http://127.0.0.1:8000 \
             --database-url postgresql://lab@127.0.0.1/lab --only race"
        );
        let program = Subject::Program {
            dir: "my dir".into(),
            manifest: toml::from_str(
                "exercise = \"report-api\"\nlang = \"python\"\ncommand = [\"x\"]",
            )
            .unwrap(),
        };
        let replay = Replay::new(exercise, &program, None, 5);
        assert_eq!(
            replay.line(&report("burst", Some(7))),
            "lab exercise check report-api 'my dir' --only burst --seed 7 --repeat 5"
        );
    }
}
