//! The one thread that forks every server process.
//!
//! A throwaway server asks the kernel for SIGKILL when its parent dies (`PR_SET_PDEATHSIG`), so
//! that even a `lab` killed with SIGKILL leaves no server behind. The kernel's "parent" here is
//! the *thread* that forked the child, not the process: a server forked by a tokio worker would
//! be killed whenever that worker ends — a runtime shutting down, an idle blocking-pool thread
//! retiring after ten seconds — while `lab` goes on using it. So servers are never forked where
//! the async code happens to run: every spawn is handed to this module's thread, started on first
//! use and never ended, and the signal comes exactly when the `lab` process dies.
//!
//! The hand-over must not open a gap for cancellation either. A caller that is dropped (Ctrl-C
//! while the servers start) after sending its request must not leave behind a child that nobody
//! owns. Each request therefore has a [`Slot`] that records how far it got, and the dropped
//! caller settles it: a request not yet started is never started (and what it holds, such as the
//! server's directory, is dropped by the caller there and then); one being started is waited
//! for (a fork and an exec: milliseconds) and its product dropped at once, which for a
//! [`crate::process::ServerProcess`] means killed.

use std::io;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use tokio::runtime::Handle;
use tokio::sync::Notify;

/// How long a dropped caller waits for a spawn that is under way. A fork and an exec take
/// milliseconds; past this the spawner thread itself drops what it started.
const SPAWN_WAIT: Duration = Duration::from_secs(5);

type Job = Box<dyn FnOnce() + Send>;

/// The spawner thread's queue, created with the thread on first use. The sender lives in this
/// static and is never dropped, so the thread's receive loop never ends.
static QUEUE: Mutex<Option<mpsc::Sender<Job>>> = Mutex::new(None);

fn queue() -> io::Result<mpsc::Sender<Job>> {
    let mut queue = QUEUE.lock();
    if let Some(sender) = &*queue {
        return Ok(sender.clone());
    }
    let (sender, jobs) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("lab-spawner".into())
        .spawn(move || {
            for job in jobs {
                job();
            }
        })?;
    *queue = Some(sender.clone());
    Ok(sender)
}

/// What a request starts, run on the spawner thread.
type Start<T> = Box<dyn FnOnce() -> io::Result<T> + Send>;

/// How far one request got.
enum State<T> {
    /// In the queue, with what it is to start. Kept here rather than in the queue, so that a
    /// caller who goes away first drops it at once, with what it holds (the server's directory),
    /// instead of leaving that to the spawner thread whenever it gets to the request.
    Queued(Start<T>),
    /// Being forked on the spawner thread.
    Spawning,
    /// Started (or failed to); not yet taken by the caller.
    Done(io::Result<T>),
    /// The caller took the result.
    Taken,
    /// The caller is gone: whatever the request produces is dropped.
    Abandoned,
}

struct Slot<T> {
    state: Mutex<State<T>>,
    /// Wakes a dropped caller waiting (synchronously) for a spawn under way.
    finished: Condvar,
    /// Wakes the caller awaiting the result.
    ready: Notify,
}

/// Forks `command` on the spawner thread, with `PR_SET_PDEATHSIG` set to SIGKILL in the child,
/// and turns the child into a `T` there. `T` should stop the child when dropped: if the caller
/// is dropped before it takes the result, the result is dropped instead.
pub(crate) async fn spawn<T: Send + 'static>(
    command: std::process::Command,
    build: impl FnOnce(tokio::process::Child) -> T + Send + 'static,
) -> io::Result<T> {
    let mut command = tokio::process::Command::from(command);
    // lab's own pid: the child's parent for as long as lab lives (compared with getppid below).
    let lab = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child before exec. It makes only the prctl(2) and
    // getppid(2) system calls and builds an io::Error from an errno, which allocates nothing: all
    // async-signal-safe, and nothing is shared with the parent. It runs after std has switched
    // to the server's user, which matters: a change of credentials clears the setting.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
            // lab may have died between the fork and the prctl: then no signal will ever come
            // (the child already has a new parent), so give up now.
            if nix::unistd::getppid() != lab {
                return Err(nix::errno::Errno::ESRCH.into());
            }
            Ok(())
        });
    }
    // tokio registers each child with the runtime that awaits its exit: the caller's.
    let runtime = Handle::current();
    let start: Start<T> = Box::new(move || {
        let _runtime = runtime.enter();
        command.spawn().map(build)
    });
    let slot = Arc::new(Slot {
        state: Mutex::new(State::Queued(start)),
        finished: Condvar::new(),
        ready: Notify::new(),
    });
    let pending = Pending { slot: slot.clone() };
    let job: Job = Box::new(move || {
        let start = {
            let mut state = slot.state.lock();
            match std::mem::replace(&mut *state, State::Spawning) {
                State::Queued(start) => start,
                // Abandoned: the caller is gone, and dropped what this would have started.
                other => {
                    *state = other;
                    return;
                }
            }
        };
        let result = catch_unwind(AssertUnwindSafe(start))
            .unwrap_or_else(|_| Err(io::Error::other("starting the process panicked")));
        let mut state = slot.state.lock();
        if matches!(*state, State::Abandoned) {
            // The caller stopped waiting for this spawn: stop what it started here.
            drop(state);
            drop(result);
            return;
        }
        *state = State::Done(result);
        drop(state);
        slot.finished.notify_all();
        slot.ready.notify_one();
    });
    queue()?
        .send(job)
        .map_err(|_| io::Error::other("the process spawner thread is gone"))?;
    pending.result().await
}

/// A request sent to the spawner thread whose result the caller has not taken yet.
struct Pending<T> {
    slot: Arc<Slot<T>>,
}

impl<T> Pending<T> {
    async fn result(&self) -> io::Result<T> {
        loop {
            {
                let mut state = self.slot.state.lock();
                if matches!(*state, State::Done(_)) {
                    let State::Done(result) = std::mem::replace(&mut *state, State::Taken) else {
                        unreachable!("checked just above")
                    };
                    return result;
                }
            }
            // `notify_one` leaves a permit when nobody waits yet, so a result stored between
            // the check above and this line is not missed.
            self.slot.ready.notified().await;
        }
    }
}

impl<T> Drop for Pending<T> {
    /// Settles a request whose caller is gone (the future was dropped, or it took the result).
    ///
    /// Waiting here blocks the thread that drops the future, but only for a fork and an exec in
    /// progress; returning earlier would let the caller go on (remove the server's directory,
    /// report that nothing is left) while a child it will never see is being started.
    fn drop(&mut self) {
        let mut state = self.slot.state.lock();
        if matches!(*state, State::Spawning) {
            self.slot.finished.wait_while_for(
                &mut state,
                |s| matches!(s, State::Spawning),
                SPAWN_WAIT,
            );
        }
        let left = std::mem::replace(&mut *state, State::Abandoned);
        drop(state);
        // A child started for nobody: dropping it stops it, before the caller's drop goes on.
        // A request not started yet: never started, and what it held goes now.
        drop(left);
    }
}
