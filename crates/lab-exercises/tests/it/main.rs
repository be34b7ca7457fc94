//! The integration tests of `lab-exercises`, in one test binary: one build and one link for all of
//! them (each file under `tests/` was a binary of its own, linked apart). One module per
//! former binary; run one with `cargo test -p lab-exercises --test it MODULE::`.

mod readme;
mod texts;
mod vendor;
