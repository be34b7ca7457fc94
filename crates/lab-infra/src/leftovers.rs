//! What a killed `lab` left behind, found and removed by the next one.
//!
//! A SIGKILL cannot be caught: the kernel ends the throwaway servers with `lab`
//! (`PR_SET_PDEATHSIG`), but nobody is left to remove their temporary directories. So every
//! throwaway directory records its owner, the `lab` process that created it, in a file
//! [`OWNER_FILE`]: its pid and its start time (a pid alone could have been reused by an unrelated
//! process since). The next `lab` ([`sweep`], called when servers start and by `lab doctor`)
//! removes the `lab-pg-*` and `lab-redis-*` directories whose owner is gone from the places
//! throwaway directories go (`TMPDIR` and memory, see [`crate::scratch`]), after ending any
//! process still working in them. Nothing else is touched: a directory of a live `lab`, one
//! whose owner cannot be read, and anything not named like ours stay.
//!
//! A learner's program (`lab exercise`) works in the learner's folder, not in a throwaway
//! directory, and only its group's leader dies with `lab`: a child it started (a reloader's
//! worker, the binary under `cargo run`) would live on, holding its port. Its `lab-exercise-*`
//! directory therefore also names them ([`GROUP_FILE`]): the folder the program runs in, an
//! environment variable that every process it starts inherits (its run's `LAB_RUN=<id>`),
//! written before the program starts, and its process group, added once it has started. The
//! sweep ends the processes still working in that folder that carry the variable or belong to
//! the group, and nothing else. (The variable closes the moment between the start and the
//! group's record: a `lab` killed then left a child that nothing named.) (Half-built templates in
//! the cache carry an owner file too, and [`crate::template`] removes them likewise.)

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The file in each throwaway directory that names its owner: `<pid> <start time>`.
pub const OWNER_FILE: &str = "lab.owner";

/// The prefix of an exercise's temporary folder (its program's log, and the record of its
/// process group).
pub const EXERCISE_PREFIX: &str = "lab-exercise-";
/// The names of our throwaway directories start with these.
pub const PREFIXES: [&str; 3] = ["lab-pg-", "lab-redis-", EXERCISE_PREFIX];

/// The file in a `lab-exercise-*` directory that names the learner's program's processes:
/// `<the folder it runs in>\n<NAME=value it inherits>\n`, then `<pgid>\n` once it has started.
pub const GROUP_FILE: &str = "lab.group";

/// Records, in `dir` and before the program starts, how the next `lab` finds what it leaves: the
/// folder `workdir` it runs in and the environment variable `mark` (`NAME=value`) it and every
/// process it starts inherit. [`record_group`] adds its process group once it has started.
pub fn record_program(dir: &Path, workdir: &Path, mark: &str) -> io::Result<()> {
    fs::write(
        dir.join(GROUP_FILE),
        format!("{}\n{mark}\n", workdir.display()),
    )
}

/// Adds the process group `pgid` of the program [`record_program`] recorded in `dir`.
pub fn record_group(dir: &Path, pgid: u32) -> io::Result<()> {
    use std::io::Write as _;
    let mut file = fs::OpenOptions::new()
        .append(true)
        .open(dir.join(GROUP_FILE))?;
    writeln!(file, "{pgid}")
}

/// The processes of the program recorded in `dir` that still work in its folder: those that
/// carry its mark, and those of its group.
fn recorded_program(dir: &Path) -> Vec<Pid> {
    let Ok(text) = fs::read_to_string(dir.join(GROUP_FILE)) else {
        return Vec::new();
    };
    let mut lines = text.lines();
    let (Some(workdir), Some(mark)) = (lines.next(), lines.next()) else {
        return Vec::new();
    };
    let pgid = lines.next().and_then(|line| line.parse::<i32>().ok());
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let cwd = fs::read_link(entry.path().join("cwd")).ok()?;
            if !cwd.starts_with(workdir) {
                return None;
            }
            let in_group = pgid.is_some_and(|pgid| {
                crate::process::stat_of(&entry.path()).is_some_and(|stat| stat.pgrp == pgid)
            });
            (in_group || carries(&entry.path(), mark)).then_some(Pid::from_raw(pid))
        })
        .collect()
}

/// Whether the process at `proc_dir` (`/proc/<pid>`) started with `mark` (`NAME=value`) in its
/// environment. An empty mark is no mark: it must never match the learner's own processes
/// (an editor, a shell) that work in the same folder.
fn carries(proc_dir: &Path, mark: &str) -> bool {
    mark.contains('=')
        && fs::read(proc_dir.join("environ"))
            .is_ok_and(|environ| environ.split(|b| *b == 0).any(|var| var == mark.as_bytes()))
}

/// A directory without an owner file is left alone this long: it may be one that a `lab` has
/// just created and not yet claimed.
const UNCLAIMED_GRACE: Duration = Duration::from_secs(600);

/// The start time of a process, in clock ticks since boot (field 22 of `/proc/PID/stat`), or
/// `None` when there is no such process.
fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces: count after it.
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(19)?.parse().ok()
}

/// Records this process as the owner of `dir`.
pub fn claim(dir: &Path) -> io::Result<()> {
    let pid = std::process::id();
    let started = start_time(pid).unwrap_or_default();
    fs::write(dir.join(OWNER_FILE), format!("{pid} {started}\n"))
}

/// Whether the owner recorded in `dir` is still running: `Some(true)` or `Some(false)`, or
/// `None` when the directory names no owner (not claimed yet, or not ours).
fn owner_alive(dir: &Path) -> Option<bool> {
    let text = fs::read_to_string(dir.join(OWNER_FILE)).ok()?;
    let mut fields = text.split_whitespace();
    let pid: u32 = fields.next()?.parse().ok()?;
    let started: u64 = fields.next()?.parse().ok()?;
    Some(start_time(pid) == Some(started))
}

/// Processes whose working directory is inside `dir` (a server that outlived its owner: the
/// throwaway servers run with their directory as working directory).
fn processes_in(dir: &Path) -> Vec<Pid> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let cwd = fs::read_link(entry.path().join("cwd")).ok()?;
            cwd.starts_with(dir).then_some(Pid::from_raw(pid))
        })
        .collect()
}

/// True while `pid` runs (a zombie, killed and waiting for its parent, does not).
fn still_runs(pid: Pid) -> bool {
    crate::process::stat_of(Path::new(&format!("/proc/{pid}"))).is_some_and(|stat| stat.runs())
}

/// Our throwaway directories in `tmp` whose owner is gone.
fn abandoned(tmp: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(tmp) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|entry| {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            PREFIXES.iter().any(|prefix| name.starts_with(prefix))
                && entry.file_type().is_ok_and(|t| t.is_dir())
        })
        .map(|entry| entry.path())
        .filter(|dir| is_abandoned(dir))
        .collect()
}

/// Whether the `lab` that made `dir` is gone: its owner file names a process that no longer
/// runs, or it has none and is old enough that no `lab` is about to write one.
pub(crate) fn is_abandoned(dir: &Path) -> bool {
    match owner_alive(dir) {
        Some(alive) => !alive,
        // Unclaimed: a `lab` killed between creating and claiming it, if it is old.
        None => fs::metadata(dir)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|modified| modified.elapsed().ok())
            .is_some_and(|age| age > UNCLAIMED_GRACE),
    }
}

/// Removes the throwaway directories of `lab` processes that are gone (killed with SIGKILL, or
/// by a power cut), after ending any server still working in them. Returns what it removed.
///
/// Blocking file-system work: call it from `spawn_blocking` in async code.
pub fn sweep() -> Vec<PathBuf> {
    let mut removed = Vec::new();
    for dir in crate::scratch::roots()
        .iter()
        .flat_map(|root| abandoned(root))
    {
        // The kernel ended them with their owner; a straggler gets the same end now.
        let stragglers: Vec<Pid> = processes_in(&dir)
            .into_iter()
            .chain(recorded_program(&dir))
            .collect();
        for pid in &stragglers {
            let _ = kill(*pid, Signal::SIGKILL);
        }
        // Gone before this `lab` goes on (a learner's program may hold files or a port):
        // SIGKILL takes milliseconds; the bound is for a process stuck in the kernel.
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while stragglers.iter().any(|pid| still_runs(*pid)) && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        if fs::remove_dir_all(&dir).is_ok() {
            removed.push(dir);
        }
    }
    removed
}

/// [`sweep`], off the async runtime's threads.
pub async fn sweep_async() -> Vec<PathBuf> {
    tokio::task::spawn_blocking(sweep).await.unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_of_a_live_owner_stays_and_one_of_a_dead_owner_goes() {
        let tmp = tempfile::tempdir().unwrap();
        let mine = tmp.path().join("lab-pg-mine");
        let dead = tmp.path().join("lab-redis-dead");
        let other = tmp.path().join("someone-else");
        for dir in [&mine, &dead, &other] {
            fs::create_dir(dir).unwrap();
        }
        claim(&mine).unwrap();
        // A pid that exists, with a start time it never had: its owner is gone.
        fs::write(dead.join(OWNER_FILE), format!("{} 1\n", std::process::id())).unwrap();
        fs::write(other.join(OWNER_FILE), "1 1\n").unwrap();
        assert_eq!(abandoned(tmp.path()), vec![dead]);
    }

    /// A process that carries the mark is found before its group is recorded, one without it
    /// never is, and an empty mark matches nothing.
    #[test]
    fn a_program_is_found_by_its_mark_before_its_group_is_recorded() {
        let tmp = tempfile::tempdir().unwrap();
        let workdir = tempfile::tempdir().unwrap();
        let spawn = |mark: &str| {
            let mut command = std::process::Command::new("sleep");
            command.arg("30").current_dir(workdir.path());
            if let Some((name, value)) = mark.split_once('=') {
                command.env(name, value);
            }
            command.spawn().unwrap()
        };
        let mut marked = spawn("LAB_RUN=0badcafe");
        let mut other = spawn("LAB_RUN=12345678");
        record_program(tmp.path(), workdir.path(), "LAB_RUN=0badcafe").unwrap();
        let found = recorded_program(tmp.path());
        assert_eq!(found, vec![Pid::from_raw(marked.id() as i32)]);
        record_program(tmp.path(), workdir.path(), "").unwrap();
        assert_eq!(recorded_program(tmp.path()), vec![]);
        for child in [&mut marked, &mut other] {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    #[test]
    fn the_start_time_is_read_past_a_name_with_spaces() {
        assert!(start_time(std::process::id()).is_some());
        assert_eq!(start_time(u32::MAX), None);
    }
}
