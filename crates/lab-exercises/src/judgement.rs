//! How a check ends, as code writes it: a check is an `async fn(&mut World) -> Judged`, and it
//! ends with `Ok(())` for a pass, or with a [`Stop`]: a verdict (fail, unknown, skipped) or an
//! error of the lab's own. Judgement functions return `Result<T, Stop>` too, so a check reads as
//! a list of `?`s:
//!
//! ```ignore
//! let rows = world.rows(task).await?;          // the lab's own read failing: an error
//! let row = one_report(&rows, task)?;          // the invariant broken: a fail, and how
//! replays(&second, row)?;
//! Ok(())                                       // it held: a pass
//! ```
//!
//! A fail names the invariant the code broke and the cause seen in real state
//! (`broke.<key>` in the exercise's texts); an unknown names what the lab could not stage
//! (`unknown.<key>`).

use lab_core::Msg;

use crate::error::ExerciseError;
use crate::verdict::Verdict;

/// Why a check stopped before its end: a verdict that is not a pass, or an error of the lab's.
#[derive(Debug)]
pub enum Stop {
    Verdict(Verdict),
    Error(ExerciseError),
}

/// A check's end, or a judgement's: `Ok` to go on (a pass at the end), `Err` to stop.
pub type Judged<T = ()> = Result<T, Stop>;

/// The line of a failed check: `broke.<key>` in the exercise's texts.
pub fn broke(key: &str) -> Msg {
    Msg::new(format!("broke.{key}"))
}

/// The line of a check that could not decide: `unknown.<key>` in the exercise's texts.
pub fn undecided(key: &str) -> Msg {
    Msg::new(format!("unknown.{key}"))
}

/// Stops the check with a fail that says `msg`.
pub fn fail<T>(msg: Msg) -> Judged<T> {
    Err(Stop::Verdict(Verdict::Fail(msg)))
}

/// Stops the check with an unknown that says `msg`.
pub fn unknown<T>(msg: Msg) -> Judged<T> {
    Err(Stop::Verdict(Verdict::Unknown(msg)))
}

/// Stops the check as skipped, saying why.
pub fn skipped<T>(msg: Msg) -> Judged<T> {
    Err(Stop::Verdict(Verdict::Skipped(msg)))
}

/// The verdict of a finished check.
pub fn verdict_of(judged: Judged) -> Result<Verdict, ExerciseError> {
    match judged {
        Ok(()) => Ok(Verdict::Pass),
        Err(Stop::Verdict(verdict)) => Ok(verdict),
        Err(Stop::Error(error)) => Err(error),
    }
}

impl Stop {
    /// The verdict it carries, if it is one.
    pub fn verdict(&self) -> Option<&Verdict> {
        match self {
            Stop::Verdict(verdict) => Some(verdict),
            Stop::Error(_) => None,
        }
    }
}

impl<E> From<E> for Stop
where
    E: Into<ExerciseError>,
{
    fn from(error: E) -> Stop {
        Stop::Error(error.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judged(rows: usize) -> Judged {
        if rows > 1 {
            return fail(broke("reports").arg("count", rows));
        }
        if rows == 0 {
            return unknown(undecided("not_reached"));
        }
        Ok(())
    }

    #[test]
    fn a_check_ends_in_a_pass_a_verdict_or_an_error() {
        assert!(matches!(verdict_of(judged(1)), Ok(Verdict::Pass)));
        match verdict_of(judged(2)) {
            Ok(Verdict::Fail(msg)) => assert_eq!(msg.key, "broke.reports"),
            other => panic!("{other:?}"),
        }
        match verdict_of(judged(0)) {
            Ok(Verdict::Unknown(msg)) => assert_eq!(msg.key, "unknown.not_reached"),
            other => panic!("{other:?}"),
        }
        let error: Judged = Err(sqlx::Error::PoolClosed.into());
        assert!(matches!(verdict_of(error), Err(ExerciseError::Sql(_))));
    }
}
