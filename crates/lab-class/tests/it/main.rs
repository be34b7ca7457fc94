//! lab-class's integration tests, one binary (run one module with `cargo test -p lab-class
//! --test it board::`).

mod board;
