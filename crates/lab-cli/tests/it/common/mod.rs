//! Helpers shared by the CLI's integration tests: run the real `lab` binary with a clean
//! environment (no URLs, language or colour settings leaking in from the developer's shell).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `lab` binary built for these tests.
pub fn lab_path() -> &'static str {
    env!("CARGO_BIN_EXE_lab")
}

/// A `lab` command with an environment that cannot change its output, run from the top of
/// this checkout (so it reads this checkout's `scenarios/`, as a developer's `lab` does).
pub fn lab(args: &[&str]) -> Command {
    let mut command = command(Path::new(lab_path()), args);
    command.current_dir(repo());
    command
}

/// The top of this checkout.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A command for a `lab` binary (this one, or one built elsewhere) with an environment that
/// cannot change its output: no URLs, language or colour settings from the developer's shell.
pub fn command(program: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(program);
    command.args(args);
    for var in [
        "DATABASE_URL",
        "REDIS_URL",
        "LAB_LANG",
        "LANG",
        "LC_ALL",
        "LC_MESSAGES",
        "NO_COLOR",
        "CLICOLOR",
        "CLICOLOR_FORCE",
        "LAB_SCENARIOS_DIR",
        "LAB_PG_BINDIR",
        "LAB_REDIS_SERVER",
        "LAB_CLASS_CODE",
        "LAB_CLASS_NAME",
        "LAB_CLASS_BOARD",
        "LAB_CLASS_TOKEN",
    ] {
        command.env_remove(var);
    }
    command
}

/// Runs `lab` and returns its output.
pub fn run(args: &[&str]) -> Output {
    lab(args).output().expect("lab runs")
}

/// Runs the commands at the same time, each in a process of its own, and returns their outputs
/// in order. Each child's output is read on a thread of its own, so no pipe ever fills.
pub fn outputs_at_once(commands: Vec<Command>) -> Vec<Output> {
    let children: Vec<_> = commands
        .into_iter()
        .map(|mut command| {
            command
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let readers: Vec<_> = children
        .into_iter()
        .map(|child| std::thread::spawn(move || child.wait_with_output().unwrap()))
        .collect();
    readers.into_iter().map(|r| r.join().unwrap()).collect()
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Asserts the exit code, showing both streams when it differs: first stderr and the lines of
/// stdout that tell what went wrong (a scenario's title, a fact marked ✗, a result line), then
/// the whole of stdout. A long narrative is cut in the middle by CI logs; the cause must come
/// before it.
#[track_caller]
pub fn assert_code(output: &Output, code: i32) {
    if output.status.code() == Some(code) {
        return;
    }
    let out = stdout(output);
    let telling: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("━━ ") || l.contains('✗') || l.starts_with("Result:"))
        .collect();
    panic!(
        "expected exit {code}, got {:?}\n--- stderr\n{}\n--- what stdout tells\n{}\n--- stdout\n{out}",
        output.status.code(),
        stderr(output),
        telling.join("\n"),
    );
}

/// The names of every scenario, in catalogue order, as `lab list --format json` gives them: tests
/// read the catalogue instead of repeating it.
pub fn catalogue() -> Vec<String> {
    let out = run(&["list", "--format", "json"]);
    assert_code(&out, 0);
    stdout(&out)
        .lines()
        .map(|line| {
            let entry: serde_json::Value = serde_json::from_str(line).expect("JSON lines");
            entry["scenario"].as_str().expect("a name").to_string()
        })
        .collect()
}

/// The repository's `scenarios/` directory.
pub fn scenarios_dir() -> PathBuf {
    repo().join("scenarios")
}

#[allow(unused_imports)] // each test binary uses some of them
pub use lab_testkit::{copy_tree, entries, interrupt, processes_in, shared_tempdir, signal};

/// Asserts that nothing a `lab` call started is left in its `TMPDIR`: no server process, no
/// temporary directory.
#[track_caller]
pub fn assert_nothing_left(tmp: &Path) {
    lab_testkit::assert_nothing_left(tmp, "after lab");
}

/// A port base for `lab serve` whose ports (base+4 to base+29) look free right now. They are
/// released before `lab serve` binds them, so another process may take one in between: the
/// tests that start `lab serve` retry with another base when that happens.
///
/// The bases are drawn below the kernel's ephemeral range (Linux starts it at 32768), where no
/// outgoing connection of the many a test run makes can land on them; a base found from an
/// ephemeral port often failed on a busy machine, whose connections fill that range.
pub fn free_port_base() -> u16 {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
        ^ std::process::id().wrapping_mul(2_654_435_761);
    for attempt in 0..200u32 {
        // 10 000 to 31 999: below the ephemeral range, above the well-known ports.
        let spread = seed.wrapping_add(attempt.wrapping_mul(7_919)) % 22_000;
        let base = 10_000 + spread as u16;
        let free = (4..30).all(|o| std::net::TcpListener::bind(("127.0.0.1", base + o)).is_ok());
        if free {
            return base;
        }
    }
    panic!("no free port base found");
}
