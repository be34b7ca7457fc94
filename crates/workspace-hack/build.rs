//! Empty: Cargo reads a package's build-dependencies only when it has a build script, and this
//! crate's one build-dependency (syn, see Cargo.toml) is there for its features.

fn main() {}
