//! Generates the catalogue from what is on disk, so adding a scenario touches its module and its
//! folder and nothing else.
//!
//! A scenario is a folder `scenarios/<name>/` (its texts and expectations) plus a module
//! `src/<topic>/<name with _ for ->.rs` in one of this crate's topic folders (a folder with a
//! `mod.rs`, one per lesson). This script writes into `OUT_DIR`:
//!
//! - `catalogue.rs`: every scenario with its name and lesson, included by `catalogue.rs`;
//! - `embedded.rs`: the scenario files as `include_str!` copies, for a `lab` binary that runs
//!   without a checkout. Expected files that do not exist yet (a new scenario before its first
//!   `lab check NAME --bless`) are embedded as `None`, so the crate builds before them.
//!
//! The scenario modules themselves are ordinary modules, declared by hand in their topic's
//! `mod.rs` (`pub mod hello;`), so rustfmt, clippy and every tool that reads the module tree
//! sees them. A folder without a module, or with a module its topic does not declare, is
//! reported as a warning and left out; a module without a folder is not a scenario (a topic may
//! keep helper modules of its own).

use std::path::{Path, PathBuf};

#[path = "build/catalogue.rs"]
mod catalogue;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo"));
    let scenarios_dir = manifest.join("../../scenarios");
    let src = manifest.join("src");
    // A new folder, file or module reruns this script (cargo watches directories recursively).
    println!("cargo:rerun-if-changed={}", scenarios_dir.display());
    println!("cargo:rerun-if-changed={}", src.display());

    let generated = catalogue::generate(&scenarios_dir, &src);
    for warning in &generated.warnings {
        println!("cargo:warning={warning}");
    }
    write(&out.join("catalogue.rs"), &generated.catalogue);
    write(&out.join("embedded.rs"), &generated.embedded);
}

/// Writes a generated file only when it changes, so an unchanged catalogue rebuilds nothing.
fn write(path: &Path, text: &str) {
    if std::fs::read_to_string(path).ok().as_deref() != Some(text) {
        std::fs::write(path, text)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    }
}
