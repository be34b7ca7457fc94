//! The integration tests of `idem`, in one test binary: one build and one link for all of
//! them (each file under `tests/` was a binary of its own, linked apart). One module per
//! former binary; run one with `cargo test -p idem --test it MODULE::`.

mod support;

mod cluster;
mod python;
mod redis;
