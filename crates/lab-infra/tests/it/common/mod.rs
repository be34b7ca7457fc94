//! Helpers shared by lab-infra's integration tests: the lab's one copy, in `lab-testkit`.

#![allow(dead_code)]

#[allow(unused_imports)] // each test binary uses some of them
pub use lab_testkit::{assert_nothing_left, entries, processes_in, runs, shared_tempdir};
