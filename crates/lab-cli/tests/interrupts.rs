//! Forty interrupts at seeded random moments of a `lab run` (while servers start, while
//! `initdb` runs, mid-scenario, while cleaning up): SIGINT and SIGTERM leave no process and no
//! temporary directory; SIGKILL leaves no process (the kernel ends the servers with `lab`), and
//! the next `lab` removes the directories it could not.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{entries, lab, processes_in, shared_tempdir, signal, stderr};
use nix::sys::signal::Signal;

/// A small seeded generator (xorshift): the same moments on every run, so a failure repeats.
struct Moments(u64);

impl Moments {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Only keeps a broken build from hanging the suite.
const SAFETY: Duration = Duration::from_secs(60);

/// Waits until no process works in `dir` (the kernel's parent-death signal is asynchronous).
fn await_no_process(dir: &std::path::Path, what: &str) {
    let started = Instant::now();
    while !processes_in(dir).is_empty() {
        assert!(
            started.elapsed() < SAFETY,
            "{what}: processes left: {:?}",
            processes_in(dir)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn forty_interrupts_leave_nothing_behind() {
    let mut moments = Moments(0x5eed_1ab5);
    let tmp = shared_tempdir();
    for round in 0..40 {
        let sig = match moments.next() % 3 {
            0 => Signal::SIGINT,
            1 => Signal::SIGTERM,
            _ => Signal::SIGKILL,
        };
        // From at once to past the end of a short run: servers starting, initdb, the
        // scenario, the cleanup.
        let delay = Duration::from_millis(moments.next() % 2_500);
        let what = format!("round {round}: {sig} after {delay:?}");
        let child = lab(&["run", "lease", "--color", "never"])
            .env("TMPDIR", tmp.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        signal(&child, sig);
        let out = child.wait_with_output().unwrap();
        match sig {
            Signal::SIGKILL => {
                await_no_process(tmp.path(), &what);
                // What it could not remove, the next start does (and `lab doctor` says so).
                let left = entries(tmp.path());
                let doctor = lab(&["doctor"]).env("TMPDIR", tmp.path()).output().unwrap();
                assert_eq!(
                    entries(tmp.path()),
                    Vec::<String>::new(),
                    "{what}: after the next start"
                );
                let report = String::from_utf8_lossy(&doctor.stdout);
                for dir in left {
                    assert!(
                        report.contains(&dir),
                        "{what}: {dir} not reported: {report}"
                    );
                }
            }
            _ => {
                // Finished before the signal (0), or stopped by it (130 / 143).
                let expected = if sig == Signal::SIGINT { 130 } else { 143 };
                assert!(
                    matches!(out.status.code(), Some(c) if c == 0 || c == expected),
                    "{what}: exit {:?}, stderr: {}",
                    out.status,
                    stderr(&out)
                );
                assert!(
                    processes_in(tmp.path()).is_empty(),
                    "{what}: processes left"
                );
                assert_eq!(
                    entries(tmp.path()),
                    Vec::<String>::new(),
                    "{what}: temporary directories left"
                );
            }
        }
    }
}
