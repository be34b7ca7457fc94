//! No code: this crate's dependencies ask for the features `cargo test` turns on, so that
//! `cargo build -p lab-cli` (the wheel's build) reuses every dependency the tests built instead
//! of building 34 crates again. Cargo.toml says which features and why.
