//! The integration tests of `lab-infra`, in one test binary: one build and one link for all of
//! them (each file under `tests/` was a binary of its own, linked apart). One module per
//! former binary; run one with `cargo test -p lab-infra --test it MODULE::`.
//!
//! `cancel` and `template` point `TMPDIR` (and the cache) at private folders, which is
//! process-wide: each runs in a child process of its own ([`alone`]), beside the others.

mod alone;
mod common;

mod cancel;
mod parent_death;
mod pool;
mod servers;
mod template;
