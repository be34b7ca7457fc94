//! What an exercise is, as its module declares it: its lesson, its languages, the servers it
//! needs, how it opens its world, and its checks, each one typed value that carries its own
//! function. The list of exercises is [`crate::catalogue`]; nothing else names them.
//!
//! ```ignore
//! pub static EXERCISE: Exercise = Exercise {
//!     name: "report-api",
//!     lesson: "reports",
//!     needs: Needs::POSTGRES,
//!     langs: &["python", "rust"],
//!     rust_uses_idem: false,
//!     checks: &CHECKS,
//!     open: |setup| Box::pin(open(setup)),
//! };
//!
//! static CHECKS: Checks<ReportApi> = Checks(&[
//!     Check::new("replay", |w| Box::pin(replay(w))).starter_fails(),
//!     Check::new("crash", |w| Box::pin(crash(w))).restarts().starter_fails(),
//!     …
//! ]);
//! ```

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;

use lab_infra::{Needs, Servers};

use crate::error::ExerciseError;
use crate::guest::NotReady;
use crate::judgement::Judged;
use crate::manifest::Manifest;
use crate::verdict::CheckReport;

/// A boxed check future.
pub type CheckFuture<'a> = Pin<Box<dyn Future<Output = Judged> + 'a>>;
/// A boxed future of a whole check run.
pub type OpenFuture<'a> = Pin<Box<dyn Future<Output = Result<Checked, ExerciseError>> + 'a>>;

/// What one check is, apart from its function: what the CLI lists and selects, and what
/// `verify` holds the starters to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckSpec {
    pub name: &'static str,
    /// It starts or kills the learner's program: skipped with `--target`.
    pub restarts: bool,
    /// It explores timings or inputs from the seed: `--seed` replays it.
    pub seeded: bool,
    /// Every starter fails it as written: it is what the starter's TODOs are about.
    pub starter_fails: bool,
}

/// One check of an exercise whose world is `W`.
pub struct Check<W: 'static> {
    pub spec: CheckSpec,
    pub run: for<'a> fn(&'a mut W) -> CheckFuture<'a>,
}

impl<W> Check<W> {
    pub const fn new(name: &'static str, run: for<'a> fn(&'a mut W) -> CheckFuture<'a>) -> Self {
        Check {
            spec: CheckSpec {
                name,
                restarts: false,
                seeded: false,
                starter_fails: false,
            },
            run,
        }
    }

    pub const fn restarts(mut self) -> Self {
        self.spec.restarts = true;
        self
    }

    pub const fn seeded(mut self) -> Self {
        self.spec.seeded = true;
        self
    }

    pub const fn starter_fails(mut self) -> Self {
        self.spec.starter_fails = true;
        self
    }
}

/// The checks of one exercise, in the exercise's order: the one `lab exercise check` runs them in
/// (`--first`, `watch` and `verify` change it; see [`CheckOptions::ordered`]).
pub struct Checks<W: 'static>(pub &'static [Check<W>]);

/// The checks of an exercise as the catalogue sees them, whatever its world.
pub trait CheckList: Sync {
    fn spec(&self, index: usize) -> Option<&CheckSpec>;
}

impl<W> CheckList for Checks<W> {
    fn spec(&self, index: usize) -> Option<&CheckSpec> {
        self.0.get(index).map(|check| &check.spec)
    }
}

/// One exercise.
pub struct Exercise {
    pub name: &'static str,
    /// The lesson it belongs to, as the texts name it (`lesson.<id>`): `reports` is lesson 6
    /// (PostgreSQL and background tasks), `payments` the Redis lesson (API and background jobs).
    pub lesson: &'static str,
    /// The servers its checks need (the lab starts throwaway ones unless the learner gives URLs).
    pub needs: Needs,
    pub langs: &'static [&'static str],
    /// Its Rust projects use `idem`, written into them under `vendor/idem` (it is not on
    /// crates.io).
    pub rust_uses_idem: bool,
    pub checks: &'static dyn CheckList,
    /// Opens its world on the servers, runs the selected checks in it, and closes it.
    pub open: for<'a> fn(Setup<'a>) -> OpenFuture<'a>,
}

impl std::fmt::Debug for Exercise {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exercise")
            .field("name", &self.name)
            .finish()
    }
}

impl Exercise {
    /// Its checks, in the exercise's order.
    pub fn checks(&self) -> impl Iterator<Item = &CheckSpec> {
        (0..).map_while(|i| self.checks.spec(i))
    }

    pub fn check(&self, name: &str) -> Option<&CheckSpec> {
        self.checks().find(|c| c.name == name)
    }

    /// Every name of `only` is one of its checks; else the usage error that says which is not.
    pub fn known_checks(&self, only: &[String]) -> Result<(), ExerciseError> {
        for check in only {
            if self.check(check).is_none() {
                let has: Vec<&str> = self.checks().map(|c| c.name).collect();
                return Err(ExerciseError::NoCheck {
                    exercise: self.name.to_string(),
                    check: check.clone(),
                    has: has.join(", "),
                });
            }
        }
        Ok(())
    }

    /// Whether it has a version in `lang`; else the usage error that says which it has.
    pub fn has_lang(&self, lang: &str) -> Result<(), ExerciseError> {
        if self.langs.contains(&lang) {
            return Ok(());
        }
        Err(ExerciseError::NoLang {
            exercise: self.name.to_string(),
            lang: lang.to_string(),
            has: self.langs.join(", "),
        })
    }
}

/// What is checked: a program the lab starts from its folder, or a service already running.
#[derive(Debug, Clone)]
pub enum Subject {
    Program {
        dir: PathBuf,
        manifest: Manifest,
    },
    /// A service at this base URL, writing to the database given with `--database-url`.
    Target {
        url: String,
    },
}

/// How a check run is tuned.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// Only these checks (all when empty).
    pub only: Vec<String>,
    /// The seed of the checks that explore timings and inputs.
    pub seed: u64,
    /// How many times those checks repeat their exploration (the bursts).
    pub repeat: u32,
    /// More environment for the learner's program (`verify` shares one Cargo target folder
    /// between the projects of one side).
    pub guest_env: Vec<(String, String)>,
    /// These checks run first, in this order; the rest follow in the exercise's order. `watch`
    /// puts the checks that failed last time here, so the verdict the learner is working on
    /// comes first; `verify` gives whole shuffled orders, to hold every verdict to being the
    /// same whatever ran before it.
    pub first: Vec<String>,
    /// The checks that restart the learner's program run beside the others, in a world of
    /// their own (another run: its own schema, key prefix, ports and start of the program), so
    /// that their restarts cost no time of the rest's. `watch` asks for it; their verdicts then
    /// come in the order the checks end.
    pub restarts_beside: bool,
}

impl CheckOptions {
    /// The default of `--repeat`.
    pub const REPEAT: u32 = 3;

    pub fn selects(&self, name: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| o == name)
    }

    /// The order the selected ones of `names` (the exercise's order) run in: `first`, then the
    /// rest as they come.
    pub fn ordered<'n>(&self, names: &[&'n str]) -> Vec<&'n str> {
        let chosen = self
            .first
            .iter()
            .filter_map(|f| names.iter().find(|n| **n == f.as_str()).copied());
        let mut order: Vec<&str> = Vec::new();
        for name in chosen.chain(names.iter().copied()) {
            if self.selects(name) && !order.contains(&name) {
                order.push(name);
            }
        }
        order
    }
}

/// How a check run ended.
#[derive(Debug)]
pub enum Checked {
    /// Every selected check ran.
    Reports(Vec<CheckReport>),
    /// The program never answered: nothing could be checked.
    NotReady(NotReady),
}

/// What an exercise's `open` gets: what to check, on which servers, how, and whom to tell as
/// each check ends.
pub struct Setup<'a> {
    pub subject: Subject,
    pub servers: &'a Servers,
    pub options: &'a CheckOptions,
    pub on_report: &'a mut dyn FnMut(&CheckReport),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(only: &[&str], first: &[&str]) -> CheckOptions {
        CheckOptions {
            only: only.iter().map(|s| s.to_string()).collect(),
            seed: 1,
            repeat: CheckOptions::REPEAT,
            guest_env: Vec::new(),
            first: first.iter().map(|s| s.to_string()).collect(),
            restarts_beside: false,
        }
    }

    /// `first` leads in its own order, the rest follow in the exercise's; what `only` leaves
    /// out stays out, and a name that is not a check is passed over.
    #[test]
    fn the_checks_named_first_run_first() {
        let names = ["replay", "conflict", "race", "crash"];
        assert_eq!(options(&[], &[]).ordered(&names), names);
        assert_eq!(
            options(&[], &["crash", "race"]).ordered(&names),
            ["crash", "race", "replay", "conflict"]
        );
        assert_eq!(
            options(&["replay", "race"], &["crash", "race", "nonesuch"]).ordered(&names),
            ["race", "replay"]
        );
    }
}
