//! The learner's progress, kept beside their code (`.lab-exercise-state.json`): the verdict of
//! each check at the last `lab exercise check`, so `lab exercise list` can say "failing 3 of
//! 10" without running anything. A state file that cannot be read is as if there were none.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

pub const FILE: &str = ".lab-exercise-state.json";

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct State {
    /// Check name → "pass", "fail", "unknown" or "skipped".
    pub checks: BTreeMap<String, String>,
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
    pub fn record(dir: &Path, verdicts: &[(&str, &str)]) -> std::io::Result<()> {
        let mut state = State::read(dir).unwrap_or_default();
        for (check, verdict) in verdicts {
            state
                .checks
                .insert((*check).to_string(), (*verdict).to_string());
        }
        let text = serde_json::to_string_pretty(&state).expect("a map of strings serialises");
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
        .filter(|c| state.checks.get(**c).map(String::as_str) != Some("pass"))
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
