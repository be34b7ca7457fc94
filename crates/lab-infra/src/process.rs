//! A server process that is stopped and reaped when dropped.
//!
//! Three guards make sure a throwaway server never outlives the `lab` call that started it:
//! - `Drop` stops it (on success, on error, and while unwinding from a panic);
//! - it runs in its own process group, so a Ctrl-C in the terminal reaches only `lab`, which then
//!   stops its servers in order (a server that got the terminal's SIGINT too could die mid-step);
//! - the kernel sends it SIGKILL if the thread that started it dies (`PR_SET_PDEATHSIG`), which
//!   covers `lab` itself being killed with SIGKILL. The CLI starts servers from the main thread,
//!   which lives as long as the process.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// How long a server gets to shut down cleanly before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// A running server process.
#[derive(Debug)]
pub struct ServerProcess {
    child: Child,
    /// What to call it in messages.
    name: &'static str,
    /// The signal that shuts this server down quickly but cleanly (PostgreSQL: SIGINT, "fast
    /// shutdown"; Redis: SIGTERM).
    stop_signal: i32,
}

/// Prepares `command` to run as a guarded child: own process group, killed with its parent.
pub fn guard(command: &mut Command) -> &mut Command {
    command.process_group(0);
    // SAFETY: the closure runs in the forked child before exec and calls only prctl(2), which is
    // async-signal-safe; it touches no memory shared with the parent.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command
}

impl ServerProcess {
    /// Spawns a guarded server process.
    pub fn spawn(
        name: &'static str,
        command: &mut Command,
        stop_signal: i32,
    ) -> std::io::Result<ServerProcess> {
        let child = guard(command).spawn()?;
        Ok(ServerProcess {
            child,
            name,
            stop_signal,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Stops the server and waits for it: its stop signal, then SIGKILL after a grace period.
    pub fn stop(&mut self) {
        if !self.is_running() {
            return;
        }
        // SAFETY: kill(2) with the pid of our own child, which we have not reaped yet (so the pid
        // cannot have been reused).
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, self.stop_signal);
        }
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if !self.is_running() {
                return;
            }
            // Polling a child that is shutting down; a few milliseconds each round.
            std::thread::sleep(Duration::from_millis(10));
        }
        eprintln!("lab: {} did not stop in time; killing it", self.name);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A free TCP port on 127.0.0.1. The port is free when this returns; a server that then fails to
/// bind it (someone else took it in between) is retried by the caller with another port.
pub fn free_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// The last lines of a server's log, to explain a failed start.
pub fn log_tail(path: &std::path::Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    all[all.len().saturating_sub(lines)..].join(" | ")
}
