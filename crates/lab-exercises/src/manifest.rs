//! `lab-exercise.toml`, the learner's manifest: which exercise the folder holds, in which
//! language, and how to build and start the program. `lab exercise start` writes it; the learner
//! may change the commands (another interpreter, another entry point), never the contract.
//!
//! ```toml
//! exercise = "report-api"
//! lang = "python"
//! command = [".venv/bin/python", "app.py"]   # run in the folder, with PORT and DATABASE_URL
//! build = []                                  # run once before, e.g. ["cargo", "build", "-q"]
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::error::ExerciseError;

pub const FILE: &str = "lab-exercise.toml";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub exercise: String,
    pub lang: String,
    /// The program and its arguments, run in the exercise's folder.
    pub command: Vec<String>,
    /// Run once before the checks, in the folder (a compiler); empty for none.
    #[serde(default)]
    pub build: Vec<String>,
    /// A worker's completion (exercise `worker`): strict (only within the lease) or not (any
    /// time, as long as no later attempt holds the task). Given to the program as `STRICT`.
    #[serde(default)]
    pub strict: Option<bool>,
    /// The payments exercises: whether the provider removes duplicates by the key it is given
    /// (the integration contract, as the lesson says; on unless the manifest says otherwise).
    /// The checks about a lost answer, a Redis outage and a slow provider run against such a
    /// provider, or against one that charges every request when this is `false`.
    #[serde(default)]
    pub provider_dedup: Option<bool>,
    /// The payments exercises: the longest window in which a client retries one payment, in
    /// seconds (an hour in the lesson). A stored result must live at least that long.
    #[serde(default)]
    pub retry_window_secs: Option<u64>,
    /// The relay exercise: the one deadline, in milliseconds, within which the relay answers
    /// however many attempts it makes (6 s, the lab's own relay's, when not given).
    #[serde(default)]
    pub deadline_ms: Option<u64>,
    /// How long the program may take to answer `GET /health` after it starts.
    #[serde(default = "default_start_timeout")]
    pub start_timeout_secs: u64,
}

fn default_start_timeout() -> u64 {
    30
}

impl Manifest {
    /// Reads `dir/lab-exercise.toml`.
    pub fn read(dir: &Path) -> Result<Manifest, ExerciseError> {
        let path = dir.join(FILE);
        let source = match std::fs::read_to_string(&path) {
            Ok(source) => source,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ExerciseError::NoManifest(dir.to_path_buf()));
            }
            Err(e) => return Err(ExerciseError::io(&path)(e)),
        };
        let manifest: Manifest = toml::from_str(&source).map_err(|e| ExerciseError::Manifest {
            path: path.clone(),
            reason: e.message().to_string(),
        })?;
        if manifest.command.is_empty() {
            return Err(ExerciseError::Manifest {
                path,
                reason: "`command` is empty: say how to start your program".into(),
            });
        }
        Ok(manifest)
    }

    pub fn start_timeout(&self) -> Duration {
        Duration::from_secs(self.start_timeout_secs.max(1))
    }
}

/// The program of a command, resolved against `dir` when it is a relative path with a folder in
/// it (`.venv/bin/python`), else looked up on PATH as given (`python3`).
pub(crate) fn resolve(dir: &Path, program: &str) -> PathBuf {
    let path = Path::new(program);
    if path.is_relative() && path.components().count() > 1 {
        dir.join(path)
    } else {
        path.to_path_buf()
    }
}
