//! Why an exercise could not be started, checked or written out, in two kinds the CLI turns into
//! its exit codes ([`ErrorKind`]): the learner's own mistake (usage, exit 2), or the environment
//! (a server, a file, the lab's own services: exit 3). A check that ran and failed is not an
//! error: it is a [`crate::Verdict`].
//!
//! Each variant says what went wrong and, where the learner can act, what to do, in one line.

use std::path::PathBuf;

/// Which exit code an error ends `lab exercise` with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The learner asked for something that cannot be (exit 2).
    Usage,
    /// Something the lab needs failed: a server, a file, one of its own services (exit 3).
    Environment,
}

#[derive(Debug, thiserror::Error)]
pub enum ExerciseError {
    // The learner's mistakes.
    #[error("no exercise named `{0}` (`lab exercise list` shows them)")]
    Unknown(String),
    #[error("exercise `{exercise}` has no `{lang}` version (it has: {has})")]
    NoLang {
        exercise: String,
        lang: String,
        has: String,
    },
    #[error("{exercise} has no check `{check}` (it has: {has})")]
    NoCheck {
        exercise: String,
        check: String,
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
    #[error("{} holds the exercise `{found}`, not `{wanted}`", dir.display())]
    OtherExercise {
        dir: PathBuf,
        found: String,
        wanted: String,
    },
    #[error(
        "--target needs --database-url: the database the service writes to, where the lab reads its reports"
    )]
    TargetNeedsDatabase,
    #[error("--target does not apply to {exercise}: the lab starts your program itself ({why})")]
    TargetNotApplicable {
        exercise: &'static str,
        why: &'static str,
    },
    #[error("--target {0} is not an http:// URL")]
    NotHttpUrl(String),

    // The environment.
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
    #[error("{0} is needed and was not started")]
    ServerMissing(&'static str),
    #[error("{what} reaches Redis through the fault proxy, so it needs Redis over TCP, not {url}")]
    RedisNotTcp { what: &'static str, url: String },
    #[error("the lab's {service}: {reason}")]
    Service {
        service: &'static str,
        reason: String,
    },
    #[error("the lab's {what}: {source}")]
    Http {
        what: &'static str,
        #[source]
        source: reqwest::Error,
    },
    #[error("Redis, read by the lab: {0}")]
    Redis(#[from] redis::RedisError),
    #[error(transparent)]
    Infra(#[from] lab_infra::InfraError),
    #[error("PostgreSQL error: {}", lab_infra::pg_message(.0))]
    Sql(#[from] sqlx::Error),
    #[error("the fault proxy: {0}")]
    Proxy(#[from] faultproxy::Error),
}

impl ExerciseError {
    /// Which exit code it ends with.
    pub fn kind(&self) -> ErrorKind {
        use ExerciseError as E;
        match self {
            E::Unknown(_)
            | E::NoLang { .. }
            | E::NoCheck { .. }
            | E::Exists(_)
            | E::NoManifest(_)
            | E::Manifest { .. }
            | E::OtherExercise { .. }
            | E::TargetNeedsDatabase
            | E::TargetNotApplicable { .. }
            | E::NotHttpUrl(_) => ErrorKind::Usage,
            E::Io { .. }
            | E::Spawn { .. }
            | E::Build { .. }
            | E::ServerMissing(_)
            | E::RedisNotTcp { .. }
            | E::Service { .. }
            | E::Http { .. }
            | E::Redis(_)
            | E::Infra(_)
            | E::Sql(_)
            | E::Proxy(_) => ErrorKind::Environment,
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> ExerciseError {
        let path = path.into();
        move |source| ExerciseError::Io { path, source }
    }

    /// A failed call to one of the lab's own services (`what`: "provider's charges", …).
    pub(crate) fn http(what: &'static str) -> impl FnOnce(reqwest::Error) -> ExerciseError {
        move |source| ExerciseError::Http { what, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_learners_mistakes_are_usage_and_the_labs_failures_environment() {
        assert_eq!(ExerciseError::TargetNeedsDatabase.kind(), ErrorKind::Usage);
        assert_eq!(
            ExerciseError::NoManifest(PathBuf::from("x")).kind(),
            ErrorKind::Usage
        );
        let redis = redis::RedisError::from(std::io::Error::other("gone"));
        assert_eq!(
            ExerciseError::Redis(redis).kind(),
            ErrorKind::Environment,
            "Redis failing under the lab's own reads is the environment, not usage"
        );
        assert_eq!(
            ExerciseError::Service {
                service: "provider",
                reason: "no port".into()
            }
            .kind(),
            ErrorKind::Environment
        );
    }
}
