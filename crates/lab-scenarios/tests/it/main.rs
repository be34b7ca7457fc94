//! The integration tests of `lab-scenarios`, in one test binary: one build and one link for all of
//! them (each file under `tests/` was a binary of its own, linked apart). One module per
//! former binary; run one with `cargo test -p lab-scenarios --test it MODULE::`.

mod catalogue;
mod giveaway;
mod glossary;
mod library;
mod queue;
mod schema;
mod tasks;
