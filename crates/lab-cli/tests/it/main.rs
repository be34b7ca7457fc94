//! The integration tests of `lab-cli`, in one test binary: one build and one link for all of
//! them (each file under `tests/` was a binary of its own, linked apart). One module per
//! former binary; run one with `cargo test -p lab-cli --test it MODULE::`.

mod common;
mod webdriver;
// idem's own throwaway servers, a three-node cluster among them: one copy of that set-up.
#[path = "../../../idem/tests/it/support/mod.rs"]
mod idem_support;

mod bench;
mod check;
mod class;
mod class_web;
mod cli;
mod course_ci;
mod docs;
mod exercise;
mod exercise_payments;
mod external;
mod interrupts;
mod lifecycle;
mod pictures;
mod proxy;
mod serve;
mod soak;
mod step;
mod toxiproxy;
mod web;
mod what_ran;
