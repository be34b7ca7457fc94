//! What can stop a bench.
//!
//! The lab speaks Russian and English, and the sentences live in the CLI's texts
//! (`cli.bench.*`), so an error of the bench's own carries the [`Msg`] to say (the text's key
//! and its arguments) and the CLI renders it. Errors of the servers and the system keep their
//! own words. Which of the CLI's exit codes an error ends with follows from its variant:
//! [`BenchError::Drift`] is a protection that misbehaved (1), a [`BenchError::BadUrl`] a wrong
//! address (2), everything else the environment (3).

use lab_core::{Arg, Msg};

/// Why a bench stopped.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A server, the service or a program the bench runs failed, or is not there: said in the
    /// lab's words (`bench.redis_failed`, `bench.service_failed`, …).
    #[error("{}", said(.0))]
    Environment(Msg),
    /// What was measured did not behave as the protection must: a new key that did not run its
    /// action, a replay that ran it, an answer the service must not give.
    #[error("{}", said(.0))]
    Drift(Msg),
    /// A URL the bench was given cannot be parsed.
    #[error(transparent)]
    BadUrl(#[from] url::ParseError),
    /// PostgreSQL failed: its own message and SQLSTATE, as [`lab_infra::pg_message`] gives them.
    /// Not a `#[source]`: the message already says what sqlx's error says (see
    /// `lab_infra::InfraError::Sql`), and a chain printed in full would repeat it.
    #[error("{}", lab_infra::pg_message(.0))]
    Postgres(sqlx::Error),
    /// Redis failed outside the measured calls (the cleanup). Inside them a Redis error is an
    /// [`BenchError::Environment`] with `bench.redis_failed`, so that it says it came from Redis.
    #[error(transparent)]
    Redis(redis::RedisError),
    /// The run's schema could not be made, or its URL built.
    #[error(transparent)]
    Infra(#[from] lab_infra::InfraError),
    /// A file of pgbench's (its script, its logs) or the program itself.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

// By hand rather than `#[from]`, for the reason on the variant: the error is kept, not exposed
// as the source.
impl From<sqlx::Error> for BenchError {
    fn from(error: sqlx::Error) -> BenchError {
        BenchError::Postgres(error)
    }
}

/// A [`Msg`] for a reader without the CLI's texts (a test, a log): its key and arguments.
fn said(msg: &Msg) -> String {
    let args: Vec<String> = msg
        .args
        .iter()
        .map(|(name, value)| match value {
            Arg::Str(text) => format!("{name}={text}"),
            Arg::Int(number) => format!("{name}={number}"),
            Arg::Msg(inner) => format!("{name}=({})", said(inner)),
        })
        .collect();
    if args.is_empty() {
        msg.key.clone()
    } else {
        format!("{} ({})", msg.key, args.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_without_the_clis_texts_says_its_key_and_arguments() {
        let error = BenchError::Drift(Msg::new("bench.raw_not_stored").arg("key", "k"));
        assert_eq!(error.to_string(), "bench.raw_not_stored (key=k)");
    }
}
