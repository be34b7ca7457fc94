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
#[cfg(test)]
mod hello_example;
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
///
/// With [`CheckOptions::restarts_beside`], a program's checks that restart it run in a world of
/// their own beside the others' (two runs at once, each with its own schema, keys, ports and
/// program), and each verdict is told as its check ends, whichever world it is in.
pub async fn check(
    exercise: &'static Exercise,
    subject: Subject,
    servers: &Servers,
    options: &CheckOptions,
    on_report: &mut dyn FnMut(&CheckReport),
) -> Result<Checked, ExerciseError> {
    exercise.known_checks(&options.only)?;
    let (restarting, staying): (Vec<&CheckSpec>, Vec<&CheckSpec>) = exercise
        .checks()
        .filter(|spec| options.selects(spec.name))
        .partition(|spec| spec.restarts);
    let is_program = matches!(subject, Subject::Program { .. });
    if !options.restarts_beside || !is_program || restarting.is_empty() || staying.is_empty() {
        return open(exercise, subject, servers, options, on_report).await;
    }
    let only = |specs: Vec<&CheckSpec>| CheckOptions {
        only: specs.iter().map(|spec| spec.name.to_string()).collect(),
        ..options.clone()
    };
    let (restarting, staying) = (only(restarting), only(staying));
    // Both worlds tell their verdicts through one caller, one at a time: the two runs are
    // futures of this task, and neither holds the borrow across an await.
    let told = std::cell::RefCell::new(on_report);
    let mut tell = |report: &CheckReport| (told.borrow_mut())(report);
    let mut tell_too = |report: &CheckReport| (told.borrow_mut())(report);
    let (beside, rest) = tokio::join!(
        open(exercise, subject.clone(), servers, &restarting, &mut tell),
        open(exercise, subject, servers, &staying, &mut tell_too),
    );
    Ok(match (rest?, beside?) {
        (Checked::Reports(mut reports), Checked::Reports(more)) => {
            reports.extend(more);
            Checked::Reports(reports)
        }
        (Checked::NotReady(not_ready), _) | (_, Checked::NotReady(not_ready)) => {
            Checked::NotReady(not_ready)
        }
    })
}

/// One world: `exercise` opened on `subject`, its selected checks run, and closed.
async fn open(
    exercise: &'static Exercise,
    subject: Subject,
    servers: &Servers,
    options: &CheckOptions,
    on_report: &mut dyn FnMut(&CheckReport),
) -> Result<Checked, ExerciseError> {
    (exercise.open)(exercise::Setup {
        subject,
        servers,
        options,
        on_report,
    })
    .await
}

#[cfg(test)]
mod tests {
    use lab_infra::{Needs, ServerOptions, Servers};

    use crate::{CheckOptions, Checked, Manifest, Subject, Verdict};

    /// The documentation's module is the one in `hello_example.rs`, line for line.
    #[test]
    fn the_documented_module_is_the_one_compiled_here() {
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/architecture.md"),
        )
        .expect("docs/architecture.md");
        let section = doc
            .split("## Adding an exercise")
            .nth(1)
            .expect("the section exists");
        let block = section
            .split("```rust\n")
            .nth(1)
            .and_then(|rest| rest.split("   ```").next())
            .expect("the section has a Rust block");
        let documented: Vec<&str> = block
            .lines()
            .map(|line| line.strip_prefix("   ").unwrap_or(line))
            .collect();
        let compiled: Vec<&str> = include_str!("hello_example.rs").lines().collect();
        assert_eq!(documented, compiled);
    }

    /// A learner's program for `hello`, in Python's standard library: it answers `POST /hello`
    /// with `status`.
    fn program(dir: &std::path::Path, status: u16) -> Subject {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(
            dir.join("app.py"),
            format!(
                "import os\n\
                 from http.server import BaseHTTPRequestHandler, HTTPServer\n\
                 class Handler(BaseHTTPRequestHandler):\n\
                 \x20   def do_GET(self):\n\
                 \x20       self.send_response(200)\n\
                 \x20       self.end_headers()\n\
                 \x20   def do_POST(self):\n\
                 \x20       body = b'{{\"hello\": \"world\"}}'\n\
                 \x20       self.send_response({status})\n\
                 \x20       self.send_header('content-length', str(len(body)))\n\
                 \x20       self.end_headers()\n\
                 \x20       self.wfile.write(body)\n\
                 HTTPServer(('127.0.0.1', int(os.environ['PORT'])), Handler).serve_forever()\n"
            ),
        )
        .unwrap();
        std::fs::write(
            dir.join("lab-exercise.toml"),
            "exercise = \"hello\"\nlang = \"python\"\ncommand = [\"python3\", \"app.py\"]\n",
        )
        .unwrap();
        Subject::Program {
            dir: dir.to_path_buf(),
            manifest: Manifest::read(dir).unwrap(),
        }
    }

    /// It runs, and judges the program by what it answered: step 2 of the documentation.
    #[tokio::test(flavor = "multi_thread")]
    async fn the_documented_exercise_passes_a_greeting_and_fails_its_absence() {
        let servers = Servers::start(&ServerOptions::default(), Needs::default())
            .await
            .expect("no servers to start");
        let tmp = tempfile::tempdir().unwrap();
        let options = CheckOptions {
            only: Vec::new(),
            seed: 1,
            repeat: CheckOptions::REPEAT,
            guest_env: Vec::new(),
            first: Vec::new(),
            restarts_beside: false,
        };
        let mut verdicts = Vec::new();
        for (name, status) in [("greets", 201), ("silent", 200)] {
            let subject = program(&tmp.path().join(name), status);
            let checked = crate::check(
                &super::hello_example::EXERCISE,
                subject,
                &servers,
                &options,
                &mut |_| {},
            )
            .await
            .expect("the check runs");
            let Checked::Reports(reports) = checked else {
                panic!("the program answered GET /health")
            };
            verdicts.push(reports[0].verdict.clone());
        }
        servers.shutdown().await;
        assert!(matches!(verdicts[0], Verdict::Pass), "{:?}", verdicts[0]);
        match &verdicts[1] {
            Verdict::Fail(msg) => assert_eq!(msg.key, "broke.no_greeting"),
            other => panic!("a 200 passed: {other:?}"),
        }
    }
}
