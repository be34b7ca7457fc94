//! `lab exercise`: the learner writes the fix, and the lab attacks it.
//!
//! The lab's scenarios show failures on code the lab wrote. An exercise turns the same attacks
//! on the learner's own program, in any language: the lab starts throwaway PostgreSQL (lesson 6)
//! or Redis (the payments lesson), gives the program a schema or a key prefix of its own, starts
//! it from its manifest, and runs checks whose oracle is real state (the rows the lab reads
//! back; the charges and emails its own provider and mailer counted), never the program's own
//! answers. Each check ends pass, fail (the invariant it broke, the cause seen in real state,
//! and the schedule that broke it, replayable by seed) or unknown (the lab could not stage its
//! moment, and says which).
//!
//! Any correct design passes: the checks stage their moments from outside the program (locks
//! held in PostgreSQL and followed through whatever the program waits on, calls held inside the
//! lab's own services behind a door of each actor's own, faults on the links) and judge the
//! invariant, never the shape of the lab's own solution.
//!
//! # Layout
//!
//! - [`exercise`]: what an exercise declares ([`Exercise`]: lesson, languages, servers, how it
//!   opens its world) and what a check is ([`Check`]: a typed value that carries its function).
//! - [`catalogue`]: the one list of exercises, in the course's order.
//! - One module per exercise, its world and its checks: [`report_api`] (the learner's service,
//!   attacked from outside), [`worker`] (the learner's worker, against the lab's report
//!   service); the payments lesson's [`charge_once`] (the learner's payment service, on Redis
//!   and the lab's provider), [`relay`] (the learner's hop between the lab's client and the
//!   lab's payment service) and [`invoice_consumer`] (the learner's consumer of a Redis Stream,
//!   against the lab's mailer). Each opens with a table: check, schedule, invariant.
//! - [`rig`]: what every world is built on (the schedule, the program started as a service or
//!   as named jobs, the proxies, the lab's services) and the one loop that runs the checks.
//! - [`judgement`]: how a check ends in code: `Ok(())`, or a [`judgement::Stop`] (a verdict, or
//!   the lab's own error), so judgements chain with `?`.
//! - [`verdict`]: pass / fail / unknown / skipped, and the schedule's lines.
//! - [`call`]: a call the lab makes and the record of its answer (judged by `lab_core::wire`,
//!   the classifier the scenarios use); [`lab_side`]: the lab's own services, calls held inside
//!   them, its reads of Redis; [`payment`]: the payment intents of the payments exercises;
//!   [`database`]: the run's schema and the role the program owns it with.
//! - [`guest`]: the learner's program as a guest (its process group, its output kept aside);
//!   [`guest_env`]: the environment it gets, the whole contract in one table.
//! - [`report`]: a check run told as text (in the learner's language), JSON lines or JUnit,
//!   whatever happened; [`verify`]: `lab exercise verify`, the maintainers' proof that starters,
//!   solutions and the designs under `exercises/<name>/designs/` get the verdicts they must.
//! - [`manifest`]: `lab-exercise.toml`; [`files`]: the exercises' files, embedded at build time;
//!   [`state`]: the learner's progress, kept beside their code; [`error`]: usage or
//!   environment.
//!
//! [`check`] is the whole of one `lab exercise check`: it takes servers the caller started
//! (and stops), and cleans up everything it started itself (the run's schema or key prefix and
//! role, the proxies, the lab's services, the program) on every way out; dropped halfway
//! (Ctrl-C), the program's process group is killed by [`guest::Guest`]'s drop and the schema by
//! the servers' list of live runs.

pub mod call;
pub mod catalogue;
pub mod charge_once;
pub mod database;
pub mod error;
pub mod exercise;
pub mod files;
pub mod guest;
pub mod guest_env;
pub mod invoice_consumer;
pub mod judgement;
pub mod lab_side;
pub mod manifest;
pub mod payment;
pub mod relay;
pub mod report;
pub mod report_api;
pub mod rig;
pub mod state;
pub mod verdict;
pub mod verify;
pub mod worker;

use lab_core::{Lang, Texts};
use lab_infra::Servers;

pub use catalogue::{EXERCISES, find};
pub use error::{ErrorKind, ExerciseError};
pub use exercise::{Check, CheckOptions, CheckSpec, Checked, Exercise, Subject};
pub use guest::NotReady;
pub use manifest::Manifest;
pub use verdict::{CheckReport, Line, Outcome, Verdict, VerdictKind};

/// Every exercise's texts, in both languages: each exercise's own under its name, and the words
/// they share (`exercises/common/*.toml`) where every exercise's lookups fall back to.
pub fn texts() -> Result<Texts, lab_core::text::TextError> {
    let mut texts = Texts::new();
    for lang in Lang::ALL {
        if let Some(source) = files::text(&format!("common/{}.toml", lang.code())) {
            texts.add(lab_core::text::COMMON, lang, source)?;
        }
        for exercise in EXERCISES {
            if let Some(source) = files::text(&format!("{}/{}.toml", exercise.name, lang.code())) {
                texts.add(exercise.name, lang, source)?;
            }
        }
    }
    Ok(texts)
}

/// Runs the selected checks of `exercise` against `subject`, on `servers` (started or given by
/// the caller), calling `on_report` as each check ends.
pub async fn check(
    exercise: &'static Exercise,
    subject: Subject,
    servers: &Servers,
    options: &CheckOptions,
    on_report: &mut dyn FnMut(&CheckReport),
) -> Result<Checked, ExerciseError> {
    exercise.known_checks(&options.only)?;
    (exercise.open)(exercise::Setup {
        subject,
        servers,
        options,
        on_report,
    })
    .await
}
