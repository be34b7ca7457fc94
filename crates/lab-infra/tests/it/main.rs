//! The integration tests of `lab-infra`, in one test binary: one build and one link for all of
//! them (each file under `tests/` was a binary of its own, linked apart). One module per
//! former binary; run one with `cargo test -p lab-infra --test it MODULE::`.
//!
//! Two tests keep a binary of their own, `tests/cancel.rs` and `tests/template.rs`: each points
//! `TMPDIR` (and the cache) at a private folder, which is process-wide, and then asserts that
//! nothing but its own servers' folders are there.

mod common;

mod parent_death;
mod pool;
mod servers;
