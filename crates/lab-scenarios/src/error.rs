//! Why a scenario could not run to its end.

use lab_core::Quit;
use lab_infra::InfraError;
use lab_services::ServiceError;

/// Why a scenario could not run to its end.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error(transparent)]
    Quit(#[from] Quit),
    #[error(transparent)]
    Infra(#[from] InfraError),
    #[error("PostgreSQL error: {}", lab_infra::pg_message(.0))]
    Sql(sqlx::Error),
    #[error("Redis error: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("HTTP client error: {0}")]
    Http(#[from] reqwest::Error),
    #[error("cannot start a service: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Service(#[from] ServiceError),
    #[error("fault proxy: {0}")]
    Faults(#[from] faultproxy::client::ClientError),
    #[error(transparent)]
    Stage(#[from] lab_services::stage::StageError),
    /// The scenario used something its [`Requires`] does not declare: a bug in the scenario.
    #[error("scenario `{scenario}` uses {what} but does not declare it in its `requires`")]
    Undeclared {
        scenario: &'static str,
        what: String,
    },
    /// The world did not behave as the scenario's script needs (a claim that found no task).
    #[error("{0}")]
    Broken(String),
}

/// What a scenario function returns.
pub type ScenarioResult = Result<(), ScenarioError>;

// By hand rather than `#[from]`: the message above already says what sqlx's error says, so it is
// not also exposed as the source (an error chain printed in full would repeat it, with the
// PostgreSQL source line sqlx appends).
impl From<sqlx::Error> for ScenarioError {
    fn from(e: sqlx::Error) -> ScenarioError {
        ScenarioError::Sql(e)
    }
}
