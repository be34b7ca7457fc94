//! Tests that need the process to themselves: they point `TMPDIR` (and the template's cache)
//! at private folders and then assert that nothing but their own servers' folders are there,
//! and the environment is process-wide. Each runs in a child process of its own: this same
//! test binary started again with the environment it wants, running only that test (an
//! `#[ignore]`d one, which does nothing unless [`CHILD`] is set). The other tests of the binary
//! go on beside it, and its failure is this test's, with the child's output.

use std::ffi::OsStr;
use std::process::Command;

/// Set in the child's environment: the ignored test runs only then.
pub const CHILD: &str = "LAB_INFRA_ALONE";

/// Runs the ignored test `name` (its full path, `template::in_a_process_of_its_own`) in a child
/// process with `env` added to the environment, and fails with its output if it fails.
#[track_caller]
pub fn run_alone<K, V>(name: &str, env: impl IntoIterator<Item = (K, V)>)
where
    K: AsRef<OsStr>,
    V: AsRef<OsStr>,
{
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            name,
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD, "1")
        .envs(env)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    // An exact name that matches nothing runs nothing, and passes: make sure it ran.
    assert!(
        stdout.contains("1 passed") || !out.status.success(),
        "{name} did not run in the child:\n{stdout}"
    );
    assert!(
        out.status.success(),
        "{name} failed in its own process ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether this process is the child of [`run_alone`].
pub fn is_child() -> bool {
    std::env::var_os(CHILD).is_some()
}
