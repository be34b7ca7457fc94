//! Supervised server processes: started in a process group of their own, stopped without
//! blocking the runtime, and never outlived by the directory they work in.
//!
//! A throwaway server must not outlive the `lab` call that started it, and its temporary
//! directory must not outlive the server: removing a data directory under a running PostgreSQL
//! fails or leaves half a tree behind. The guards, from the normal path to the worst case:
//!
//! - [`ServerProcess::stop`], the normal path, asks the server to shut down cleanly, awaits its
//!   exit for a grace period and only then escalates (see [`Shutdown`]). It is async all the way:
//!   no runtime thread sleeps while a server shuts down.
//! - `Drop` covers what cannot await: an error unwinding, a panic, a future dropped halfway
//!   (Ctrl-C while `initdb` runs). It ends the process at once and then waits for it, briefly and
//!   boundedly, on the dropping thread; returning earlier would let the directory be removed
//!   under a process that is still writing into it.
//! - Every process leads a process group of its own. A Ctrl-C in the terminal goes to the
//!   terminal's foreground group, so it reaches only `lab`, which then stops its servers in order
//!   (a server that got the SIGINT too could die mid-step). And stopping signals the whole group,
//!   so the helpers a process started go with it: `initdb` runs `postgres --boot` and
//!   `postgres --single` through a shell, and killing `initdb` alone would leave them writing
//!   into the directory about to be removed.
//! - The kernel kills every server when `lab` dies, even by SIGKILL (`PR_SET_PDEATHSIG`, set in
//!   each child forked by the `spawner` module's thread, which lives as long as the process).
//!
//! A [`ServerProcess`] holds a reference to the directory it works in, and a [`ThrowawayServer`]
//! removes the directory only once the process is gone, so the order holds whichever path
//! stopped the process.

use std::fs;
use std::io;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tempfile::TempDir;
use tokio::process::Child;

/// How long a server gets for a clean shutdown before it is ended.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// How long a server gets after its quick signal (PostgreSQL's immediate shutdown ends its
/// children first, and gives them five seconds).
const QUICK_GRACE: Duration = Duration::from_secs(6);
/// How long SIGKILL may take: only a process stuck in the kernel (a hung disk) takes longer.
const KILL_GRACE: Duration = Duration::from_secs(5);
/// How long the rest of a process group gets to be gone once its leader is.
const GROUP_GRACE: Duration = Duration::from_secs(5);
/// The bounded waits of the synchronous `Drop` path, for the quick signal and then SIGKILL.
/// A killed process is gone in milliseconds; these bound only the pathological cases.
const DROP_WAIT: Duration = Duration::from_secs(3);
/// How often exits are polled where they cannot be awaited (the `Drop` path, and the rest of a
/// process group, which are not our children).
const POLL: Duration = Duration::from_millis(5);

/// How a process is ended, from the politest signal to SIGKILL.
#[derive(Debug, Clone, Copy)]
pub struct Shutdown {
    /// Asks for a clean shutdown, awaited for up to ten seconds. `None`: the process is never
    /// stopped politely (an interrupted `initdb` has nothing worth finishing).
    pub clean: Option<Signal>,
    /// Ends it at once, awaited for a few seconds before SIGKILL; also the first signal of the
    /// `Drop` path.
    pub quick: Signal,
}

impl Shutdown {
    /// PostgreSQL: SIGINT is a "fast" shutdown (sessions are ended, a checkpoint is written),
    /// SIGQUIT an "immediate" one. SIGQUIT rather than SIGKILL as the quick signal because the
    /// postmaster's children each lead a process group of their own (PostgreSQL calls setsid()
    /// in every child), so a signal to the postmaster's group does not reach them: after a
    /// SIGKILL they would run on until they notice that the postmaster is gone, while after a
    /// SIGQUIT the postmaster ends them and waits for them before it exits.
    pub const POSTGRES: Shutdown = Shutdown {
        clean: Some(Signal::SIGINT),
        quick: Signal::SIGQUIT,
    };
    /// Redis: SIGTERM shuts down cleanly (without persistence there is nothing to save).
    pub const REDIS: Shutdown = Shutdown {
        clean: Some(Signal::SIGTERM),
        quick: Signal::SIGKILL,
    };
    /// A helper run to completion (`initdb`): when it must stop, it is killed with its group.
    pub const KILL: Shutdown = Shutdown {
        clean: None,
        quick: Signal::SIGKILL,
    };
}

/// A running child process, leader of its own process group.
#[derive(Debug)]
pub struct ServerProcess {
    child: Child,
    /// The child's pid, which is also its process group's id.
    pid: Pid,
    /// What to call it in messages.
    name: &'static str,
    shutdown: Shutdown,
    /// Set once the child is reaped and its group is gone: nothing is left to stop.
    done: bool,
    /// The directory the process works in, kept until the process is gone (fields are dropped
    /// after `Drop::drop` has stopped the process).
    _workdir: Option<Arc<TempDir>>,
}

impl ServerProcess {
    /// Starts `command` as the leader of a new process group, killed by the kernel if `lab`
    /// dies. `workdir` is kept at least as long as the process runs.
    pub async fn spawn(
        name: &'static str,
        mut command: std::process::Command,
        shutdown: Shutdown,
        workdir: Option<Arc<TempDir>>,
    ) -> io::Result<ServerProcess> {
        use std::os::unix::process::CommandExt;
        // A new group whose id is the child's pid.
        command.process_group(0);
        crate::spawner::spawn(command, move |child| {
            let pid = child.id().expect("a child just started has a pid");
            ServerProcess {
                child,
                pid: Pid::from_raw(pid as i32),
                name,
                shutdown,
                done: false,
                _workdir: workdir,
            }
        })
        .await
    }

    pub fn pid(&self) -> u32 {
        self.pid.as_raw() as u32
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        !self.done && matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits until the process has exited by itself and its group is gone.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        let status = self.child.wait().await;
        // An error means there is no child to wait for: nothing to signal any more either.
        if status.is_ok() {
            self.await_group().await;
        }
        self.done = true;
        status
    }

    /// Kills the process group at once (SIGKILL: no handler runs, nothing is flushed) and waits
    /// until it is gone: a crash, as `lab exercise` stages one.
    pub async fn kill(mut self) {
        if self.done {
            return;
        }
        if !self.has_exited() {
            self.signal_group(Signal::SIGKILL);
            if !self.exits_within(KILL_GRACE).await {
                eprintln!("lab: {} (pid {}) survives SIGKILL", self.name, self.pid);
                self.done = true;
                return;
            }
        }
        self.await_group().await;
        self.done = true;
    }

    /// Stops the process and waits until it and its group are gone: the clean signal, then the
    /// quick one, then SIGKILL, each after the previous one's grace period.
    pub async fn stop(mut self) {
        if self.done {
            return;
        }
        let mut exited = self.has_exited();
        if !exited && let Some(clean) = self.shutdown.clean {
            self.signal_group(clean);
            exited = self.exits_within(STOP_GRACE).await;
            if !exited {
                eprintln!(
                    "lab: {} did not stop within {}s; ending it",
                    self.name,
                    STOP_GRACE.as_secs()
                );
            }
        }
        if !exited && self.shutdown.quick != Signal::SIGKILL {
            self.signal_group(self.shutdown.quick);
            exited = self.exits_within(QUICK_GRACE).await;
        }
        if !exited {
            self.signal_group(Signal::SIGKILL);
            if !self.exits_within(KILL_GRACE).await {
                eprintln!("lab: {} (pid {}) survives SIGKILL", self.name, self.pid);
                // Nothing more can be done; `Drop` must not try again with blocking waits.
                self.done = true;
                return;
            }
        }
        self.await_group().await;
        self.done = true;
    }

    /// Sends `signal` to the process group.
    ///
    /// Only ever called while the leader is not reaped yet: until then its pid, which is the
    /// group's id, cannot be given to another process, so the signal cannot hit a stranger.
    fn signal_group(&self, signal: Signal) {
        let _ = killpg(self.pid, signal);
    }

    /// True if the leader has exited (and is now reaped).
    fn has_exited(&mut self) -> bool {
        // An error means there is no child to wait for any more: it is gone either way.
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// Awaits the leader's exit for at most `grace`; true if it exited.
    async fn exits_within(&mut self, grace: Duration) -> bool {
        // `timeout` polls the wait first, so `false` means the leader was still unreaped at
        // the last look: the next signal to its group is still safe.
        tokio::time::timeout(grace, self.child.wait()).await.is_ok()
    }

    /// Waits until no process of the group runs any more. The rest of a group are not our
    /// children (they are the leader's, or orphans now), so their exits can only be polled.
    async fn await_group(&self) {
        let deadline = Instant::now() + GROUP_GRACE;
        while group_runs(self.pid) {
            if Instant::now() > deadline {
                eprintln!(
                    "lab: processes of {}'s group {} are still running",
                    self.name, self.pid
                );
                return;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Polls the leader's exit for at most `limit`, blocking this thread; true if it exited.
    /// Only for `Drop`, which cannot await.
    fn exits_within_blocking(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            if self.has_exited() {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for ServerProcess {
    /// Ends a process that was not stopped with [`ServerProcess::stop`] (an error, a panic, a
    /// dropped future), and waits for it.
    ///
    /// `drop` cannot await, and it must not return while the process may still run: the caller
    /// goes on to remove the process's directory (and a test to check that nothing is left). So
    /// this path blocks the dropping thread, but boundedly: the quick signal, a wait of at most
    /// `DROP_WAIT` (3 s), SIGKILL, another such wait, and a bounded wait for the rest of the group.
    /// A process ends in milliseconds after these signals; the bounds are for a hung kernel.
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if !self.has_exited() {
            self.signal_group(self.shutdown.quick);
            if !self.exits_within_blocking(DROP_WAIT) && self.shutdown.quick != Signal::SIGKILL {
                self.signal_group(Signal::SIGKILL);
                self.exits_within_blocking(DROP_WAIT);
            }
        }
        let deadline = Instant::now() + DROP_WAIT;
        while group_runs(self.pid) && Instant::now() < deadline {
            std::thread::sleep(POLL);
        }
    }
}

/// True while a process of group `pgid` runs. Zombies do not count: they run nothing and hold
/// no files, and it is up to their parent (or init) to reap them.
///
/// Reads `/proc`, which the kernel generates in memory: quick, and safe on a runtime thread.
fn group_runs(pgid: Pid) -> bool {
    // Probing with no signal: ESRCH means not even a zombie is left in the group.
    if killpg(pgid, None) == Err(Errno::ESRCH) {
        return false;
    }
    let Ok(entries) = fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|entry| {
        stat_of(&entry.path()).is_some_and(|stat| stat.pgrp == pgid.as_raw() && stat.runs())
    })
}

/// What `/proc/PID/stat` says of a process that the lab needs: its state, its parent, its group,
/// and the CPU it has used.
pub(crate) struct ProcStat {
    pub state: String,
    pub ppid: i32,
    pub pgrp: i32,
    /// User and system time, in clock ticks: its own (`utime`, `stime`) and that of the children
    /// it has waited for (`cutime`, `cstime`: a postmaster's ended backends).
    pub cpu_ticks: u64,
}

impl ProcStat {
    /// Running: not a zombie (exited, waiting for its parent) nor dead.
    pub fn runs(&self) -> bool {
        self.state != "Z" && self.state != "X"
    }
}

/// Reads the `stat` file under `proc_dir` (`/proc/PID`); `None` if the process is gone.
pub(crate) fn stat_of(proc_dir: &Path) -> Option<ProcStat> {
    let stat = fs::read_to_string(proc_dir.join("stat")).ok()?;
    // "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses, so the fields are
    // counted from the last ')'.
    let (_, fields) = stat.rsplit_once(')')?;
    let mut fields = fields.split_whitespace();
    let state = fields.next()?.to_string();
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    // After pgrp: session, tty_nr, tpgid, flags, minflt, cminflt, majflt, cmajflt, then the
    // times: utime, stime, cutime, cstime.
    let mut times = fields
        .skip(8)
        .take(4)
        .map(|field| field.parse::<u64>().ok());
    let mut cpu_ticks = 0;
    for _ in 0..4 {
        cpu_ticks += times.next()??;
    }
    Some(ProcStat {
        state,
        ppid,
        pgrp,
        cpu_ticks,
    })
}

/// The CPU time (user and system) used so far by process `pid` and its children: a throwaway
/// server's postmaster and its backends (each backend is a child of the postmaster, in a session
/// of its own). A child that has ended counts through its parent, which waited for it. `None`
/// where `/proc` cannot be read.
pub fn family_cpu_time(pid: u32) -> Option<Duration> {
    let ticks_per_second = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|&ticks| ticks > 0)?;
    let ticks: u64 = fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|entry| {
            let is_parent = entry.file_name().to_str()?.parse::<u32>().ok()? == pid;
            let stat = stat_of(&entry.path())?;
            (is_parent || u32::try_from(stat.ppid) == Ok(pid)).then_some(stat.cpu_ticks)
        })
        .sum();
    Some(Duration::from_secs_f64(
        ticks as f64 / ticks_per_second as f64,
    ))
}

/// A running throwaway server and its temporary directory.
#[derive(Debug)]
pub struct ThrowawayServer {
    process: ServerProcess,
    dir: Arc<TempDir>,
    pub port: u16,
    pub url: String,
}

impl ThrowawayServer {
    pub fn new(process: ServerProcess, dir: Arc<TempDir>, port: u16, url: String) -> Self {
        ThrowawayServer {
            process,
            dir,
            port,
            url,
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Stops the server, waits until it is gone, then removes its directory. (Dropping does
    /// the same, blocking the dropping thread for as long as it takes.)
    pub async fn stop(self) {
        let ThrowawayServer { process, dir, .. } = self;
        process.stop().await;
        remove_dir(dir).await;
    }
}

/// Removes a temporary directory once nothing else holds it.
pub async fn remove_dir(dir: Arc<TempDir>) {
    // Processes still holding the directory remove it when they are dropped.
    if let Ok(dir) = Arc::try_unwrap(dir) {
        let path = dir.path().to_path_buf();
        // A data directory is a thousand files to unlink: off the runtime's threads. If this
        // future is dropped meanwhile, the blocking task still finishes the removal.
        let removed = tokio::task::spawn_blocking(move || dir.close()).await;
        if let Ok(Err(e)) = removed {
            eprintln!("lab: could not remove {}: {e}", path.display());
        }
    }
}

/// A free TCP port on 127.0.0.1, for a program the lab starts and tells its port (a server, a
/// learner's service). The port is free when this returns; a program that then fails to bind it
/// (someone else took it in between) is retried by the caller with another port.
///
/// It comes from below the kernel's ephemeral range (`ip_local_port_range`), where nobody gets a
/// port without asking for it by number: every `bind` to port 0 and every outgoing connection
/// takes its port from that range, so a port handed out there is soon theirs. The likely end
/// of a `lab exercise verify` in CI ("cannot listen on 127.0.0.1:40689", a fault proxy enabled
/// again): a proxy, which binds port 0, got a port a learner's program had just been told, and
/// held it while disabled with a socket that does not listen (see `faultproxy`); a program that
/// binds that port then (with `SO_REUSEADDR`, as servers do) may listen on it, and the proxy
/// cannot listen on its own port again. Free means free of every socket: the port is
/// tried without `SO_REUSEADDR`, which a socket that only holds a port (or a connection ending
/// in `TIME_WAIT`) would let through. With no room below the range, port 0 decides.
pub fn free_port() -> io::Result<u16> {
    let below_ephemeral = PORT_FLOOR..ephemeral_range_start().unwrap_or(EPHEMERAL_START);
    if below_ephemeral.len() >= 1_000 {
        // Random: lab calls at once would otherwise try the same ports in the same order.
        let span = below_ephemeral.len() as u64;
        for _ in 0..PORT_ATTEMPTS {
            let offset = std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), 0u8);
            let port = below_ephemeral.start + (offset % span) as u16;
            let probe = tokio::net::TcpSocket::new_v4()?;
            if probe.bind(([127, 0, 0, 1], port).into()).is_ok() {
                return Ok(port);
            }
        }
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// The lowest port [`free_port`] gives: above the ports well-known services use by default
/// (PostgreSQL's 5432, Redis's 6379, and the like).
const PORT_FLOOR: u16 = 10_000;
/// Linux's default start of the ephemeral range, when `/proc` does not say.
const EPHEMERAL_START: u16 = 32_768;
/// Ports tried below the ephemeral range before port 0 decides.
const PORT_ATTEMPTS: usize = 64;

/// Where the kernel's ephemeral ports start (`/proc/sys/net/ipv4/ip_local_port_range`).
fn ephemeral_range_start() -> Option<u16> {
    let range = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    range.split_whitespace().next()?.parse().ok()
}

/// The last lines of a server's log, to explain a failed start.
pub async fn log_tail(path: &Path, lines: usize) -> String {
    let text = tokio::fs::read_to_string(path).await.unwrap_or_default();
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    all[all.len().saturating_sub(lines)..].join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ports given out are free, and below the ephemeral range where there is room.
    #[test]
    fn a_free_port_is_free_and_below_the_ephemeral_range() {
        let start = ephemeral_range_start().unwrap_or(EPHEMERAL_START);
        for _ in 0..50 {
            let port = free_port().unwrap();
            if start.saturating_sub(PORT_FLOOR) >= 1_000 {
                assert!(
                    (PORT_FLOOR..start).contains(&port),
                    "{port} (range from {start})"
                );
            }
            std::net::TcpListener::bind(("127.0.0.1", port)).expect("free");
        }
    }

    /// A family's time is its own and its children's: a child that spent CPU and was waited for
    /// adds its time to the parent's reading (a postmaster's ended backends count the same way).
    #[test]
    fn a_family_counts_the_children_it_waited_for() {
        let me = std::process::id();
        let before = family_cpu_time(me).expect("/proc is readable");
        let status = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 500000 ]; do i=$((i+1)); done"])
            .status()
            .unwrap();
        assert!(status.success());
        let after = family_cpu_time(me).expect("/proc is readable");
        assert!(
            after >= before + Duration::from_millis(50),
            "the child's loop counted: {before:?} -> {after:?}"
        );
    }
}
