//! What a coordinated call can end with besides a result.
//!
//! [`Error`] is what the caller must handle (map it to 409, 422, 400, 503 or the action's own
//! error). [`Unprotected`] is not an error: the call returned the action's value, but a retry
//! would not be protected from running the action again, and the caller may want to know why.

use std::fmt;
use std::time::Duration;

use crate::key::ValidationError;

/// The ways a coordinated call fails. `E` is the action's own error type.
#[derive(Debug, thiserror::Error)]
pub enum Error<E> {
    /// The action ran and returned an error. The reservation was released (the next attempt
    /// runs the action again), and nothing was stored: failures are never replayed.
    #[error("the action failed: {0}")]
    Action(E),
    /// Another call holds the key and its action has not finished: at once with
    /// [`InFlight::Raise`](crate::InFlight::Raise), or after a whole lease of waiting with
    /// [`InFlight::Wait`](crate::InFlight::Wait). An HTTP API answers 409 with `Retry-After`.
    #[error("operation {operation:?} with idempotency key {key:?} is still in progress")]
    InProgress { operation: String, key: String },
    /// The key is stored (or reserved) for a request with a different fingerprint: the client
    /// reused its key for another request. An HTTP API answers 422.
    #[error("idempotency key {key:?} of operation {operation:?} was used for a different request")]
    KeyReused { operation: String, key: String },
    /// The operation or key is invalid and the policy refuses such calls
    /// ([`InvalidKey::Reject`](crate::InvalidKey::Reject)). The action did not run.
    #[error("invalid idempotency identifiers: {0}")]
    Invalid(ValidationError),
    /// Redis failed before the action could run and the policy fails closed
    /// ([`OnStorageError::Fail`](crate::OnStorageError::Fail)). The action did not run; an HTTP
    /// API answers 503.
    #[error(transparent)]
    Storage(StorageError),
}

/// The step of a call at which Redis was used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Reserving the key, or reading the record that holds it (one command).
    Reserve,
    /// Reading a record without reserving ([`InFlight::Run`](crate::InFlight::Run),
    /// [`Coordinator::read`](crate::Coordinator::read)).
    Read,
    /// Storing the result.
    Complete,
    /// Deleting the reservation after the action failed, or when its result cannot be stored.
    Release,
    /// Extending the reservation while the action runs.
    Renew,
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stage::Reserve => "reserving the key",
            Stage::Read => "reading the record",
            Stage::Complete => "storing the result",
            Stage::Release => "releasing the reservation",
            Stage::Renew => "renewing the reservation",
        })
    }
}

/// Redis failed, or answered with something that is not a record.
#[derive(Debug, Clone, thiserror::Error)]
#[error("idempotency storage failed while {stage}: {cause}")]
pub struct StorageError {
    /// What the coordinator was doing.
    pub stage: Stage,
    /// What went wrong.
    pub cause: StorageCause,
}

/// Why a Redis command failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StorageCause {
    /// No answer within [`Policy::command_timeout`](crate::Policy::command_timeout): Redis is
    /// unreachable, black-holed or overloaded. The command may still have been executed.
    #[error("no answer from Redis within {0:?}")]
    Timeout(Duration),
    /// The client reported an error: connection refused or reset, or an error reply.
    #[error("{0}")]
    Redis(redis::RedisError),
    /// The key holds something that is not a record this crate can read (not UTF-8, not a
    /// record, or a result the caller's type cannot be decoded from).
    #[error("unreadable record: {0}")]
    Corrupt(String),
}

impl StorageError {
    pub(crate) fn new(stage: Stage, cause: StorageCause) -> StorageError {
        StorageError { stage, cause }
    }
}

/// Why a call that returned the action's value is not protected against a rerun: a retry with
/// the same key would run the action again (or may already have).
#[derive(Debug, Clone)]
pub enum Unprotected {
    /// The operation or key is invalid and the policy runs such calls anyway
    /// ([`InvalidKey::RunUnprotected`](crate::InvalidKey::RunUnprotected)). Nothing was stored.
    InvalidKey(ValidationError),
    /// Redis failed and the policy fails open. If it failed before the action (stage
    /// [`Stage::Reserve`] or [`Stage::Read`]), the action ran without a reservation and nothing
    /// was stored; if it failed at [`Stage::Complete`], the action ran under a reservation but its
    /// result was not stored, and the reservation stays until its lease runs out.
    Storage(StorageError),
    /// The key held a record that could not be used (corrupt, or a result the caller's type
    /// cannot decode), and the policy fails open. The action ran without a reservation; in
    /// `Wait`/`Raise` mode its result then replaced that record (as idempotency-kit does), so
    /// later retries replay it.
    UnusableRecord(String),
    /// The action's result has no JSON form (serde_json refused it, e.g. a map with non-string
    /// keys). It was returned but not stored, and the reservation was released.
    UnstorableResult(String),
    /// The action ran under a reservation, but the TTL policy does not store a result for the
    /// requested TTL (e.g. more than 30 days with [`TtlPolicy::WholeMinutes`](crate::TtlPolicy)).
    /// The reservation was released.
    TtlOutOfRange { requested: Duration },
    /// [`Ownership::Fenced`](crate::Ownership::Fenced): the reservation was no longer ours when
    /// the result was to be stored (the lease lapsed and someone else reserved the key, or it
    /// expired). The result was not stored; the new holder's record was left alone.
    LeaseLost,
    /// [`InFlight::Run`](crate::InFlight::Run): another caller's record took the key while our
    /// action ran, and it could not be adopted (still pending, another fingerprint, or
    /// unreadable). Our own result is returned and was not stored.
    KeyTaken,
}

impl fmt::Display for Unprotected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unprotected::InvalidKey(invalid) => write!(f, "invalid key ({invalid})"),
            Unprotected::Storage(error) => write!(f, "{error}"),
            Unprotected::UnusableRecord(reason) => write!(f, "unusable record ({reason})"),
            Unprotected::UnstorableResult(reason) => write!(f, "unstorable result ({reason})"),
            Unprotected::TtlOutOfRange { requested } => {
                write!(f, "a TTL of {requested:?} is not stored by the TTL policy")
            }
            Unprotected::LeaseLost => {
                f.write_str("the lease was lost before the result was stored")
            }
            Unprotected::KeyTaken => f.write_str("another caller's record took the key"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_std_error<T: std::error::Error + Send + Sync + 'static>() {}

    #[test]
    fn errors_compose_with_the_usual_error_handling() {
        // `?` into `anyhow::Error` or `Box<dyn Error>` needs these, for any action error that is
        // Debug + Display (a String, an io::Error, an anyhow::Error).
        is_std_error::<Error<std::io::Error>>();
        is_std_error::<Error<String>>();
        is_std_error::<StorageError>();
        is_std_error::<ValidationError>();

        let timeout = StorageError::new(
            Stage::Reserve,
            StorageCause::Timeout(Duration::from_millis(250)),
        );
        assert_eq!(
            timeout.to_string(),
            "idempotency storage failed while reserving the key: no answer from Redis within 250ms"
        );
        let action: Error<String> = Error::Action("card declined".to_owned());
        assert_eq!(action.to_string(), "the action failed: card declined");
    }
}
