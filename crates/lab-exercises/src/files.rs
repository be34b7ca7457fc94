//! The exercises' files, embedded at build time (`build.rs`), and writing them out: a starter
//! into the learner's folder, a solution beside it, never over anything that is there.

use std::path::Path;

use crate::error::ExerciseError;
use crate::exercise::Exercise;

include!(concat!(env!("OUT_DIR"), "/files.rs"));

/// The lessons' tables, the one copy (the top-level `schema.sql`): every starter gets it, so a
/// learner can create them in a database of their own and run the service alone.
pub const SCHEMA_TEXT: &str = include_str!("../../../schema.sql");
const SCHEMA_SQL: &[u8] = SCHEMA_TEXT.as_bytes();

/// What a project's own tools and the lab leave beside the code, kept out of the learner's
/// repository: the venv, Python's caches, Cargo's builds, and the lab's state file, which holds
/// the learner's token for a `lab class` board (whoever has it can post as the learner).
const GITIGNORE: &[u8] =
    b"# Written by `lab exercise`: what the tools and the lab leave beside the code.\n\
.venv/\n__pycache__/\ntarget/\n.lab-exercise-state.json\n";

/// The embedded file at `path` (relative to `exercises/`), if any.
pub fn file(path: &str) -> Option<&'static [u8]> {
    FILES
        .iter()
        .find(|(p, _)| *p == path)
        .map(|(_, bytes)| *bytes)
}

/// The embedded file at `path` as text (the exercises' texts are UTF-8).
pub fn text(path: &str) -> Option<&'static str> {
    file(path).and_then(|bytes| std::str::from_utf8(bytes).ok())
}

/// The files under `prefix/`, with paths relative to it.
pub fn under(prefix: &str) -> Vec<(&'static str, &'static [u8])> {
    let prefix = format!("{prefix}/");
    FILES
        .iter()
        .filter_map(|(path, bytes)| {
            path.strip_prefix(prefix.as_str())
                .map(|rest| (rest, *bytes))
        })
        .collect()
}

/// True when `dir` is missing or an empty folder.
fn is_free(dir: &Path) -> bool {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => entries.next().is_none(),
        Err(_) => !dir.exists(),
    }
}

/// Writes the trees `sources` into `dir`, which must be missing or empty: each is a prefix of
/// embedded files and the folder (relative to `dir`) they go to; later ones add to earlier ones.
/// `schema.sql` goes beside them when `with_schema`, and a `.gitignore` ([`GITIGNORE`]) always.
/// Returns the paths written, relative to `dir`.
pub fn write_project(
    sources: &[(String, &str)],
    with_schema: bool,
    dir: &Path,
) -> Result<Vec<String>, ExerciseError> {
    if !is_free(dir) {
        return Err(ExerciseError::Exists(dir.to_path_buf()));
    }
    let mut written = Vec::new();
    let mut put = |relative: &str, bytes: &[u8]| -> Result<(), ExerciseError> {
        let path = dir.join(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(ExerciseError::io(parent))?;
        }
        std::fs::write(&path, bytes).map_err(ExerciseError::io(&path))?;
        written.push(relative.to_string());
        Ok(())
    };
    for (source, into) in sources {
        for (relative, bytes) in under(source) {
            let relative = if into.is_empty() {
                relative.to_string()
            } else {
                format!("{into}/{relative}")
            };
            put(&relative, bytes)?;
        }
    }
    if with_schema {
        put("schema.sql", SCHEMA_SQL)?;
    }
    put(".gitignore", GITIGNORE)?;
    written.sort();
    written.dedup();
    Ok(written)
}

/// Writes `side` (`starter` or `solution`) of `exercise` in `lang` into `dir`: the exercise's
/// common files (its READMEs), the side's own, `schema.sql` for an exercise on PostgreSQL, and
/// `idem` under `vendor/idem` for a Rust project of the payments lesson.
pub fn write_side(
    exercise: &Exercise,
    lang: &str,
    side: &str,
    dir: &Path,
) -> Result<Vec<String>, ExerciseError> {
    let name = exercise.name;
    let mut sources = vec![
        (format!("{name}/common"), ""),
        (format!("{name}/{lang}/{side}"), ""),
    ];
    if lang == "rust" && exercise.rust_uses_idem {
        sources.push(("vendor/idem".to_string(), "vendor/idem"));
    }
    write_project(&sources, exercise.needs.postgres, dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_side_keeps_the_lab_state_and_builds_out_of_git() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().join("report-api");
        let written = write_side(&crate::report_api::EXERCISE, "rust", "starter", &dir).unwrap();
        assert!(
            written.iter().any(|path| path == ".gitignore"),
            "{written:?}"
        );
        let ignored = std::fs::read_to_string(dir.join(".gitignore")).unwrap();
        for line in [crate::state::FILE, "target/", ".venv/", "__pycache__/"] {
            assert!(ignored.lines().any(|l| l == line), "{line} in {ignored}");
        }
    }
}
