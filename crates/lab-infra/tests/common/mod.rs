//! Helpers shared by lab-infra's integration tests (copied from lab-cli's: tests of one crate
//! cannot use another crate's test helpers).

#![allow(dead_code)]

use std::path::Path;

/// A temporary directory the `postgres` user can enter (lab-infra runs PostgreSQL as that user
/// when the tests run as root), to use as `TMPDIR`.
pub fn shared_tempdir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// Live processes working inside `dir`: whose working directory is in it (the servers, initdb
/// and its helpers all run there) or whose command line names it.
pub fn processes_in(dir: &Path) -> Vec<String> {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let needle = dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| {
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            // A zombie has an empty command line and no working directory: it runs nothing.
            let in_dir = std::fs::read_link(e.path().join("cwd"))
                .map(|cwd| cwd.starts_with(&dir))
                .unwrap_or(false)
                || cmdline.contains(&needle);
            in_dir.then(|| format!("{} {cmdline}", e.file_name().to_string_lossy()))
        })
        .collect()
}

/// Entries left in a directory.
pub fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Asserts that nothing lab-infra started is left in `tmp`: no process, no temporary directory.
#[track_caller]
pub fn assert_nothing_left(tmp: &Path, when: &str) {
    assert_eq!(
        processes_in(tmp),
        Vec::<String>::new(),
        "{when}: processes left running"
    );
    assert_eq!(entries(tmp), Vec::<String>::new(), "{when}: temp dirs left");
}

/// True while `pid` runs (a zombie does not).
pub fn runs(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let (_, fields) = stat.rsplit_once(')')?;
            fields.split_whitespace().next().map(|s| s != "Z")
        })
        .unwrap_or(false)
}
