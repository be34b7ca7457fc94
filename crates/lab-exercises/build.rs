//! Embeds the exercises' files (`exercises/<name>/…`: texts, starters, solutions) in the
//! binary, so `lab exercise start` works without a checkout. Writes `OUT_DIR/files.rs`: one
//! `(path, bytes)` pair per file, paths relative to `exercises/`, sorted.
//!
//! The payments exercises' Rust projects use `idem`, which is not on crates.io: its sources
//! (`crates/idem/src`) are embedded too, as `vendor/idem/src/…`, and written into those
//! projects beside the standalone manifest `exercises/vendor/idem/Cargo.toml`. The copy is
//! made from the crate the lab itself is built with, so it can never drift.
//!
//! Left out: what a learner's tools leave in a folder (a virtual environment, bytecode, a
//! build's `target/`), should a maintainer have run an exercise in place.

use std::path::{Path, PathBuf};

const SKIPPED: &[&str] = &[".venv", "__pycache__", "target", ".lab-exercise-state.json"];

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let root = manifest.join("../../exercises");
    println!("cargo:rerun-if-changed={}", root.display());
    let mut files = Vec::new();
    walk(&root, &root, &mut files);
    let idem = manifest.join("../idem/src");
    println!("cargo:rerun-if-changed={}", idem.display());
    let mut idem_files = Vec::new();
    walk(&idem, &idem, &mut idem_files);
    files.extend(
        idem_files
            .into_iter()
            .map(|(relative, absolute)| (format!("vendor/idem/src/{relative}"), absolute)),
    );
    files.sort();
    let mut out = String::from("pub(crate) static FILES: &[(&str, &[u8])] = &[\n");
    for (relative, absolute) in &files {
        out.push_str(&format!(
            "    ({relative:?}, include_bytes!({:?})),\n",
            absolute.display().to_string()
        ));
    }
    out.push_str("];\n");
    let path = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo")).join("files.rs");
    if std::fs::read_to_string(&path).ok().as_deref() != Some(out.as_str()) {
        std::fs::write(&path, out).expect("cannot write files.rs");
    }
}

fn walk(root: &Path, dir: &Path, files: &mut Vec<(String, PathBuf)>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().to_string();
        if SKIPPED.contains(&name.as_str()) {
            continue;
        }
        if path.is_dir() {
            walk(root, &path, files);
        } else {
            let relative = path.strip_prefix(root).expect("under root");
            let absolute = path.canonicalize().expect("a file that exists");
            files.push((relative.to_string_lossy().replace('\\', "/"), absolute));
        }
    }
}
