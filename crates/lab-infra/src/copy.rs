//! Copying a directory tree off the runtime, and stopping the copy when its caller goes away.
//!
//! A PostgreSQL data directory is about a thousand files: copying it is blocking file-system
//! work, so it runs on tokio's blocking pool ([`blocking`]). That opens a gap the rest of this
//! crate closes for processes (see [`crate::process`]): a caller dropped halfway (Ctrl-C while
//! the servers start) must not return while a thread is still writing into a directory that
//! is about to be removed, or the removal races the copy and leaves half a tree behind. So the
//! job is told to stop, it checks between files, and the drop waits for it: a file's copy at
//! most, bounded like every other wait of a `Drop`.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::unistd::{Gid, Uid};
use parking_lot::{Condvar, Mutex};

/// How long a dropped caller waits for its job to notice and stop. A job stops between two
/// files: milliseconds, unless the disk hangs.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// What a job and its caller share.
#[derive(Default)]
struct Shared {
    /// Set when the caller is gone: the job should stop at its next check.
    stop: AtomicBool,
    /// Set once the job has returned and dropped what it held.
    finished: Mutex<bool>,
    finished_cv: Condvar,
}

/// Marks the job finished when dropped: also when it panics.
struct Finished(Arc<Shared>);

impl Drop for Finished {
    fn drop(&mut self) {
        *self.0.finished.lock() = true;
        self.0.finished_cv.notify_all();
    }
}

/// Stops the job and waits for it if the caller is dropped before the job returned.
struct StopOnDrop {
    shared: Arc<Shared>,
    armed: bool,
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.shared.stop.store(true, Ordering::Relaxed);
        let mut finished = self.shared.finished.lock();
        if !*finished {
            self.shared
                .finished_cv
                .wait_while_for(&mut finished, |f| !*f, STOP_WAIT);
        }
    }
}

/// Runs `job` on the blocking pool and returns its result (`None` if it panicked).
///
/// `job` gets a flag that is set when this future is dropped; it should check it between
/// steps and give up (with [`interrupted`]). Dropping the future then blocks the dropping
/// thread until the job has returned and dropped everything it captured (a directory it holds
/// is removed then, if it held the last reference), for at most a few seconds.
pub(crate) async fn blocking<T, F>(job: F) -> Option<T>
where
    T: Send + 'static,
    F: FnOnce(&AtomicBool) -> T + Send + 'static,
{
    let shared = Arc::new(Shared::default());
    let mut guard = StopOnDrop {
        shared: shared.clone(),
        armed: true,
    };
    let result = tokio::task::spawn_blocking(move || {
        // Declared first, so dropped last: after `job`'s captures, which go when it returns.
        let _finished = Finished(shared.clone());
        job(&shared.stop)
    })
    .await;
    guard.armed = false;
    result.ok()
}

/// The error a job returns when it was told to stop.
pub(crate) fn interrupted() -> io::Error {
    io::Error::new(io::ErrorKind::Interrupted, "the copy was cancelled")
}

/// Copies the directory `from` to `to` (which must not exist): directories and regular files
/// with their permission bits, owned by `owner` when given (we are root, handing the copy to
/// the server's user), else by us. `skip` names a file at the top of `from` to leave out.
/// Anything that is neither a directory nor a regular file is an error: a data directory made
/// by `initdb` has nothing else.
///
/// Returns one line per entry copied (see [`listing_line`]), in no particular order. Checks
/// `stop` before every file.
pub(crate) fn copy_tree(
    from: &Path,
    to: &Path,
    owner: Option<(Uid, Gid)>,
    skip: Option<&OsStr>,
    stop: &AtomicBool,
) -> io::Result<Vec<String>> {
    // PostgreSQL insists on 0700 (or 0750) for its data directory: set exactly, past the umask.
    let mode = fs::metadata(from)?.permissions().mode() & 0o777;
    fs::DirBuilder::new().mode(mode).create(to)?;
    fs::set_permissions(to, fs::Permissions::from_mode(mode))?;
    hand_over(to, owner)?;
    let mut listing = Vec::new();
    copy_children(from, to, Path::new(""), owner, skip, stop, &mut listing)?;
    Ok(listing)
}

fn copy_children(
    from: &Path,
    to: &Path,
    relative: &Path,
    owner: Option<(Uid, Gid)>,
    skip: Option<&OsStr>,
    stop: &AtomicBool,
    listing: &mut Vec<String>,
) -> io::Result<()> {
    for entry in fs::read_dir(from)? {
        if stop.load(Ordering::Relaxed) {
            return Err(interrupted());
        }
        let entry = entry?;
        let name = entry.file_name();
        if skip == Some(name.as_os_str()) {
            continue;
        }
        let (source, target, relative) = (entry.path(), to.join(&name), relative.join(&name));
        let meta = fs::symlink_metadata(&source)?;
        if meta.is_dir() {
            fs::DirBuilder::new()
                .mode(meta.permissions().mode() & 0o777)
                .create(&target)?;
            hand_over(&target, owner)?;
            listing.push(listing_line(&relative, None));
            copy_children(&source, &target, &relative, owner, None, stop, listing)?;
        } else if meta.is_file() {
            // std copies the bytes in the kernel (copy_file_range) and the permission bits.
            fs::copy(&source, &target)?;
            hand_over(&target, owner)?;
            listing.push(listing_line(&relative, Some(meta.len())));
        } else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is not a file or a directory", source.display()),
            ));
        }
    }
    Ok(())
}

/// One entry of a listing: `d <path>` for a directory, `f <size> <path>` for a file.
pub(crate) fn listing_line(relative: &Path, file_size: Option<u64>) -> String {
    match file_size {
        Some(size) => format!("f {size} {}", relative.display()),
        None => format!("d {}", relative.display()),
    }
}

fn hand_over(path: &Path, owner: Option<(Uid, Gid)>) -> io::Result<()> {
    match owner {
        Some((uid, gid)) => std::os::unix::fs::lchown(path, Some(uid.as_raw()), Some(gid.as_raw())),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_is_copied_with_its_modes_and_listed() {
        let tmp = tempfile::tempdir().unwrap();
        let from = tmp.path().join("from");
        fs::DirBuilder::new().mode(0o700).create(&from).unwrap();
        fs::create_dir(from.join("base")).unwrap();
        fs::write(from.join("base/1"), b"twelve bytes").unwrap();
        fs::write(from.join("PG_VERSION"), b"15\n").unwrap();
        fs::set_permissions(from.join("PG_VERSION"), fs::Permissions::from_mode(0o600)).unwrap();
        fs::write(from.join("skipped"), b"").unwrap();
        let to = tmp.path().join("to");
        let stop = AtomicBool::new(false);
        let mut listing = copy_tree(&from, &to, None, Some(OsStr::new("skipped")), &stop).unwrap();
        listing.sort();
        assert_eq!(listing, ["d base", "f 12 base/1", "f 3 PG_VERSION"]);
        assert_eq!(fs::read(to.join("base/1")).unwrap(), b"twelve bytes");
        assert!(!to.join("skipped").exists());
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&to), 0o700);
        assert_eq!(mode(&to.join("PG_VERSION")), 0o600);
    }

    #[test]
    fn a_stopped_copy_says_so() {
        let tmp = tempfile::tempdir().unwrap();
        let from = tmp.path().join("from");
        fs::create_dir(&from).unwrap();
        fs::write(from.join("a"), b"a").unwrap();
        let stop = AtomicBool::new(true);
        let err = copy_tree(&from, &tmp.path().join("to"), None, None, &stop).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::Interrupted);
    }

    #[tokio::test]
    async fn a_dropped_caller_waits_for_its_job_to_stop() {
        let stopped = Arc::new(AtomicBool::new(false));
        let seen = stopped.clone();
        let job = blocking(move |stop| {
            // Until told to stop, as a copy between two files would.
            while !stop.load(Ordering::Relaxed) {
                std::thread::yield_now();
            }
            seen.store(true, Ordering::Relaxed);
        });
        let mut job = Box::pin(job);
        // Polled once, so the job is on the blocking pool; then dropped.
        assert!(futures_poll_once(job.as_mut()).await.is_none());
        drop(job);
        assert!(
            stopped.load(Ordering::Relaxed),
            "the drop returned before the job stopped"
        );
    }

    /// Polls a future once, returning its output if it was ready.
    async fn futures_poll_once<F: std::future::Future + Unpin>(fut: F) -> Option<F::Output> {
        let mut fut = fut;
        std::future::poll_fn(|cx| {
            std::task::Poll::Ready(match std::pin::Pin::new(&mut fut).poll(cx) {
                std::task::Poll::Ready(v) => Some(v),
                std::task::Poll::Pending => None,
            })
        })
        .await
    }
}
