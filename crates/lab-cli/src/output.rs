//! Stdout that never holds up a run.
//!
//! A reader that stops reading fills the pipe: `lab run all | less` left on its first page, or a
//! test that reads one run's output before another's. A write into a full pipe blocks, and the
//! narrative is written from inside the run: a service handler tells what it does while its
//! client's timeout keeps running. Were that write to block, the handler would stop mid-request
//! and the story would change with the reader's speed (`redis-down`'s calls stopped being
//! answered within the client's 10 s). So everything `lab` prints on stdout goes into a queue,
//! and a thread of its own writes the queue out, in order; the run never waits for the reader.
//!
//! [`drained`] (async) and [`drain`] (blocking, for `main` once the runtime is gone) wait until
//! everything queued so far is written. They are awaited before a step-mode prompt and before
//! anything else `lab` says on stderr (which must come after the text it follows), and before
//! `lab` exits, so nothing queued is lost. A stdout that is closed (`lab run all | head`) drops what
//! is left, as a direct write would have.

use std::io::Write;
use std::sync::OnceLock;
use std::sync::mpsc::{self, Receiver, Sender, SyncSender, TryRecvError};

enum Out {
    Bytes(Vec<u8>),
    /// Answered once everything queued before it has been written.
    Drained(Done),
}

/// Who waits for a drain: a blocked thread, or a task.
enum Done {
    Thread(SyncSender<()>),
    Task(tokio::sync::oneshot::Sender<()>),
}

static QUEUE: OnceLock<Option<Sender<Out>>> = OnceLock::new();

/// The queue, with its writer thread started on first use; `None` when no thread can be
/// started, and then stdout is written directly, as before the queue.
fn queue() -> Option<&'static Sender<Out>> {
    QUEUE
        .get_or_init(|| {
            let (send, receive) = mpsc::channel();
            std::thread::Builder::new()
                .name("lab-stdout".into())
                .spawn(move || write_out(receive))
                .ok()
                .map(|_| send)
        })
        .as_ref()
}

/// The writer thread: writes each piece as it comes, flushing whenever the queue runs dry (so a
/// line that is not finished yet still shows).
fn write_out(receive: Receiver<Out>) {
    // Locked per piece, not for the thread's life: a direct `println!` elsewhere (there should
    // be none: it would not keep its place in the queue's order) must not wait forever.
    let stdout = std::io::stdout();
    // After a failed write (a closed pipe) the rest is dropped, but drains are still answered.
    let mut open = true;
    loop {
        let piece = match receive.try_recv() {
            Ok(piece) => piece,
            Err(TryRecvError::Empty) => {
                open = open && stdout.lock().flush().is_ok();
                match receive.recv() {
                    Ok(piece) => piece,
                    Err(_) => break,
                }
            }
            Err(TryRecvError::Disconnected) => break,
        };
        match piece {
            Out::Bytes(bytes) => {
                open = open && stdout.lock().write_all(&bytes).is_ok();
            }
            Out::Drained(done) => {
                open = open && stdout.lock().flush().is_ok();
                match done {
                    Done::Thread(done) => drop(done.send(())),
                    Done::Task(done) => drop(done.send(())),
                }
            }
        }
    }
}

/// A handle that writes to stdout through the queue: `write` never blocks.
#[derive(Clone, Copy, Debug, Default)]
pub struct QueuedStdout;

impl Write for QueuedStdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match queue() {
            // The writer thread lives as long as the process; a send cannot fail before exit.
            Some(queue) => {
                let _ = queue.send(Out::Bytes(buf.to_vec()));
                Ok(buf.len())
            }
            None => std::io::stdout().write(buf),
        }
    }

    /// Waits for nothing: the writer flushes by itself whenever the queue runs dry. Use
    /// [`drain`] to wait until the text is out.
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Waits until everything queued so far is on stdout (or dropped, if stdout is closed). Blocks
/// the thread for as long as the reader takes: for `main`, after the runtime has ended; async
/// code awaits [`drained`].
pub fn drain() {
    let Some(Some(queue)) = QUEUE.get() else {
        // Nothing was ever queued (or everything was written directly).
        let _ = std::io::stdout().flush();
        return;
    };
    let (done, written) = mpsc::sync_channel(1);
    if queue.send(Out::Drained(Done::Thread(done))).is_ok() {
        let _ = written.recv();
    }
}

/// [`drain`] for async code: the task waits, the thread does not.
pub async fn drained() {
    let Some(Some(queue)) = QUEUE.get() else {
        // Nothing was ever queued: everything went to stdout directly, unbuffered by us.
        return;
    };
    let (done, written) = tokio::sync::oneshot::channel();
    if queue.send(Out::Drained(Done::Task(done))).is_ok() {
        let _ = written.await;
    }
}
