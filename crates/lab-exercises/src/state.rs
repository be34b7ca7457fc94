//! The learner's progress, kept beside their code (`.lab-exercise-state.json`): the verdict of
//! each check at the last `lab exercise check`, so `lab exercise list` can say "failing 3 of
//! 10" without running anything. A state file that cannot be read is as if there were none.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::verdict::VerdictKind;

pub const FILE: &str = ".lab-exercise-state.json";

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct State {
    /// Check name → its verdict at the last check run that ran it.
    pub checks: BTreeMap<String, VerdictKind>,
    /// The class board this folder's verdicts go to (`--class`), as joining it gave: asked
    /// once, then remembered here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<ClassMembership>,
}

/// A learner's place on a class board (`lab class`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassMembership {
    /// The board's URL, as given to `--class`.
    pub board: String,
    /// The name the board shows.
    pub name: String,
    /// The learner's own token: only it posts to this learner's cells.
    pub token: String,
}

/// Where a learner stands on one exercise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    NotStarted,
    /// Started, never checked.
    Started,
    /// Checked: how many of the checks did not pass, of how many.
    Failing {
        failing: usize,
        of: usize,
    },
    Passed,
}

impl State {
    pub fn read(dir: &Path) -> Option<State> {
        let text = std::fs::read_to_string(dir.join(FILE)).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Records what a check run found (checks not run this time keep their last verdict).
    pub fn record(dir: &Path, verdicts: &[(&str, VerdictKind)]) -> std::io::Result<()> {
        let mut state = State::read(dir).unwrap_or_default();
        for (check, verdict) in verdicts {
            state.checks.insert((*check).to_string(), *verdict);
        }
        state.write(dir)
    }

    /// Remembers the class board this folder's verdicts go to.
    pub fn remember_class(dir: &Path, membership: ClassMembership) -> std::io::Result<()> {
        let mut state = State::read(dir).unwrap_or_default();
        state.class = Some(membership);
        state.write(dir)
    }

    fn write(&self, dir: &Path) -> std::io::Result<()> {
        let text = serde_json::to_string_pretty(self).expect("a map of verdicts serialises");
        std::fs::write(dir.join(FILE), text + "\n")
    }
}

/// The progress of the exercise in `dir`, whose checks are `checks`.
pub fn progress(dir: &Path, checks: &[&str]) -> Progress {
    if !dir.join(crate::manifest::FILE).exists() {
        return Progress::NotStarted;
    }
    let Some(state) = State::read(dir) else {
        return Progress::Started;
    };
    let failing = checks
        .iter()
        .filter(|c| state.checks.get(**c) != Some(&VerdictKind::Pass))
        .count();
    if failing == 0 {
        Progress::Passed
    } else {
        Progress::Failing {
            failing,
            of: checks.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_counts_what_did_not_pass_and_reads_older_files() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(progress(dir.path(), &["a", "b"]), Progress::NotStarted);
        std::fs::write(dir.path().join(crate::manifest::FILE), "").unwrap();
        assert_eq!(progress(dir.path(), &["a", "b"]), Progress::Started);
        State::record(
            dir.path(),
            &[("a", VerdictKind::Pass), ("b", VerdictKind::Unknown)],
        )
        .unwrap();
        assert_eq!(
            progress(dir.path(), &["a", "b"]),
            Progress::Failing { failing: 1, of: 2 }
        );
        // A file written before verdicts were typed: the same words.
        std::fs::write(
            dir.path().join(FILE),
            r#"{"checks": {"a": "pass", "b": "pass"}}"#,
        )
        .unwrap();
        assert_eq!(progress(dir.path(), &["a", "b"]), Progress::Passed);
    }
}
