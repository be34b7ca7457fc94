//! Every exercise, in the course's order, and what each one declares: its lesson, the
//! languages it has a starter and a solution in, its checks, and the checks its starters fail
//! (their TODOs), which `lab exercise verify` holds them to.

/// One check of an exercise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckSpec {
    pub name: &'static str,
    /// It starts or kills the learner's program: skipped with `--target`.
    pub restarts: bool,
    /// It explores timings or inputs from the seed: `--seed` replays it.
    pub seeded: bool,
}

impl CheckSpec {
    pub const fn new(name: &'static str) -> CheckSpec {
        CheckSpec {
            name,
            restarts: false,
            seeded: false,
        }
    }

    pub const fn restarts(mut self) -> CheckSpec {
        self.restarts = true;
        self
    }

    pub const fn seeded(mut self) -> CheckSpec {
        self.seeded = true;
        self
    }
}

/// One exercise.
#[derive(Debug)]
pub struct Exercise {
    pub name: &'static str,
    /// The lesson it belongs to, as the texts name it (`lesson.<id>`): `reports` is lesson 6
    /// (PostgreSQL and background tasks), `payments` the Redis lesson (API and background jobs).
    pub lesson: &'static str,
    /// The servers its checks need (the lab starts throwaway ones unless the learner gives URLs).
    pub needs: lab_infra::Needs,
    pub langs: &'static [&'static str],
    pub checks: &'static [CheckSpec],
    /// Its Rust projects use `idem`, written into them under `vendor/idem` (it is not on
    /// crates.io).
    pub rust_uses_idem: bool,
    /// The checks every starter fails, as it is written: exactly the ones its TODOs are about.
    pub starter_fails: &'static [&'static str],
}

impl Exercise {
    pub fn check(&self, name: &str) -> Option<&CheckSpec> {
        self.checks.iter().find(|c| c.name == name)
    }
}

/// The exercises, in the course's order.
pub static EXERCISES: &[&Exercise] = &[
    &crate::report_api::EXERCISE,
    &crate::worker::EXERCISE,
    &crate::charge_once::EXERCISE,
    &crate::relay::EXERCISE,
    &crate::invoice_consumer::EXERCISE,
];

pub fn find(name: &str) -> Option<&'static Exercise> {
    EXERCISES.iter().copied().find(|e| e.name == name)
}
