//! Forty interrupts at seeded random moments of a `lab run` (while servers start, while
//! `initdb` runs, mid-scenario, while cleaning up): SIGINT and SIGTERM leave no process and no
//! temporary directory; SIGKILL leaves no process (the kernel ends the servers with `lab`), and
//! the next `lab` removes the directories it could not. Four streams of ten rounds run at once,
//! each in a `TMPDIR` of its own: what one leaves is seen in its own directory only.

use crate::common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{entries, lab, processes_in, shared_tempdir, signal, stderr};
use nix::sys::signal::Signal;
use rand::rngs::ChaCha8Rng;
use rand::{RngExt as _, SeedableRng as _};

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
    const STREAMS: u64 = 4;
    const ROUNDS: u32 = 10;
    let streams: Vec<_> = (0..STREAMS)
        .map(|stream| {
            std::thread::spawn(move || {
                // The same moments on every run, so a failure repeats.
                let mut moments = ChaCha8Rng::seed_from_u64(0x5eed_1ab5 + stream);
                let tmp = shared_tempdir();
                for round in 0..ROUNDS {
                    interrupt_once(
                        &mut moments,
                        tmp.path(),
                        &format!("stream {stream}, round {round}"),
                    );
                }
            })
        })
        .collect();
    for stream in streams {
        stream.join().expect("a stream of interrupts passed");
    }
}

/// One `lab run lease`, stopped by a seeded signal at a seeded moment; then nothing may be left.
fn interrupt_once(moments: &mut ChaCha8Rng, tmp: &std::path::Path, round: &str) {
    {
        let sig = match moments.random_range(0..3) {
            0 => Signal::SIGINT,
            1 => Signal::SIGTERM,
            _ => Signal::SIGKILL,
        };
        // From at once to past the end of a short run: servers starting, initdb, the
        // scenario, the cleanup.
        let delay = Duration::from_millis(moments.random_range(0..2_500));
        let what = format!("{round}: {sig} after {delay:?}");
        let child = lab(&["run", "lease", "--color", "never"])
            .env("TMPDIR", tmp)
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
                await_no_process(tmp, &what);
                // What it could not remove, the next start does (and `lab doctor` says so).
                let left = entries(tmp);
                let doctor = lab(&["doctor"]).env("TMPDIR", tmp).output().unwrap();
                assert_eq!(
                    entries(tmp),
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
                // Finished before the signal (0), or stopped by it (130 / 143). A signal in the
                // first instants, before `lab` listens (it does before it starts anything),
                // ends it as the signal ends any program: allowed, since nothing was started;
                // the checks below say whether that holds.
                let expected = if sig == Signal::SIGINT { 130 } else { 143 };
                let before_listening =
                    std::os::unix::process::ExitStatusExt::signal(&out.status) == Some(sig as i32);
                assert!(
                    before_listening
                        || matches!(out.status.code(), Some(c) if c == 0 || c == expected),
                    "{what}: exit {:?}, stderr: {}",
                    out.status,
                    stderr(&out)
                );
                assert!(processes_in(tmp).is_empty(), "{what}: processes left");
                assert_eq!(
                    entries(tmp),
                    Vec::<String>::new(),
                    "{what}: temporary directories left"
                );
            }
        }
    }
}
