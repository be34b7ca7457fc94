//! Why an exercise could not be started, checked or written out. Each message is one line that
//! says what to do; the CLI maps them to its exit codes (usage, environment).

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ExerciseError {
    #[error("no exercise named `{0}` (`lab exercise list` shows them)")]
    Unknown(String),
    #[error("exercise `{exercise}` has no `{lang}` version (it has: {has})")]
    NoLang {
        exercise: String,
        lang: String,
        has: String,
    },
    #[error(
        "{} already holds files; `lab exercise` never writes over them (give another folder)",
        .0.display()
    )]
    Exists(PathBuf),
    #[error("no exercise in {}: it has no lab-exercise.toml (`lab exercise start NAME` writes one)", .0.display())]
    NoManifest(PathBuf),
    #[error("{}: {reason}", path.display())]
    Manifest { path: PathBuf, reason: String },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start `{program}` in {}: {reason}", dir.display())]
    Spawn {
        program: String,
        dir: PathBuf,
        reason: String,
    },
    #[error("the build step `{command}` failed ({status}); its output:\n{output}")]
    Build {
        command: String,
        status: String,
        output: String,
    },
    #[error("{0}")]
    Target(String),
    #[error(transparent)]
    Infra(#[from] lab_infra::InfraError),
    #[error("PostgreSQL error: {}", lab_infra::pg_message(.0))]
    Sql(#[from] sqlx::Error),
    #[error("the fault proxy: {0}")]
    Proxy(#[from] faultproxy::Error),
}

impl ExerciseError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> ExerciseError {
        let path = path.into();
        move |source| ExerciseError::Io { path, source }
    }
}
