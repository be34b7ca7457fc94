//! The integration tests of `faultproxy`, in one test binary: one build and one link for all of
//! them (each file under `tests/` was a binary of its own, linked apart). One module per
//! former binary; run one with `cargo test -p faultproxy --test it MODULE::`.

mod common;

mod api;
mod client;
mod conformance_api;
mod conformance_proxy;
mod conformance_toxics;
mod faults;
mod faults_http;
mod races;
mod toxics;
mod toxiproxy_client;
