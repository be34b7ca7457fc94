//! The integration tests of `lab-services`, in one test binary: one build and one link for all of
//! them (each file under `tests/` was a binary of its own, linked apart). One module per
//! former binary; run one with `cargo test -p lab-services --test it MODULE::`.

mod healed;
mod hostile;
mod http;
mod mailer;
mod payments;
mod provider;
mod relay;
mod reports;
