//! What the lab's tests share, in one copy: a temporary directory a throwaway server can use,
//! the check that nothing a test started is left behind (no process, no directory), and signals
//! to a child. A dev-dependency of the crates whose tests start servers (`lab-infra`,
//! `lab-cli`); nothing here is part of the lab itself.
//!
//! - [`shared_tempdir`]: a `TMPDIR` the `postgres` user can enter (servers run as that user
//!   when the tests run as root).
//! - [`processes_in`], [`entries`], [`assert_nothing_left`]: what is still there.
//! - [`runs`]: whether a pid still runs (a zombie does not).
//! - [`signal`], [`interrupt`]: a signal to a child process.
//! - [`copy_tree`]: a copy of a directory tree, for tests that edit files.

use std::path::Path;

/// A temporary directory the `postgres` user can enter (the lab runs PostgreSQL as that user
/// when the tests run as root), to use as `TMPDIR`.
pub fn shared_tempdir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("a temporary directory others can enter");
    dir
}

/// Live processes working inside `dir`: whose working directory is in it (the servers, `initdb`
/// and its helpers all run there) or whose command line names it. A zombie has an empty command
/// line and no working directory: it runs nothing, and is not counted.
pub fn processes_in(dir: &Path) -> Vec<String> {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let needle = dir.to_string_lossy().into_owned();
    let Ok(proc) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    proc.flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| {
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            let inside = std::fs::read_link(e.path().join("cwd"))
                .map(|cwd| cwd.starts_with(&dir))
                .unwrap_or(false)
                || (!cmdline.is_empty() && cmdline.contains(&needle));
            inside.then(|| format!("{} {cmdline}", e.file_name().to_string_lossy()))
        })
        .collect()
}

/// The names of the entries left in a directory (none, if it is gone).
pub fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Asserts that nothing is left in `tmp` (a test's `TMPDIR`): no process working there, no
/// temporary directory. `when` says at which point of the test, in the failure.
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

/// Sends a signal to a child process (not yet reaped, so its pid is still its own).
pub fn signal(child: &std::process::Child, signal: nix::sys::signal::Signal) {
    let Ok(pid) = i32::try_from(child.id()) else {
        return;
    };
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
}

/// Sends SIGINT (a Ctrl-C) to a child process.
pub fn interrupt(child: &std::process::Child) {
    signal(child, nix::sys::signal::Signal::SIGINT);
}

/// Copies a directory tree.
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("the copy's directory");
    for entry in std::fs::read_dir(from).expect("the tree to copy") {
        let entry = entry.expect("a directory entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("a file type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).expect("a copied file");
        }
    }
}
