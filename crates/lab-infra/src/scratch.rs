//! Where the throwaway servers' directories go: `$TMPDIR` when it is set, otherwise memory
//! (`/dev/shm`) when there is room, otherwise `/tmp`.
//!
//! A PostgreSQL data directory is about a thousand files, made at every start and removed at
//! every end. In memory that is a few hundredths of a second. On disk it can be a second: ext4
//! without a journal (a common root file system of small virtual machines, these included)
//! skips inodes freed in the last few seconds when it allocates new ones, so a `lab` run right
//! after another, whose files were just removed, pays about a millisecond for every file it
//! creates. A throwaway cluster wants nothing from a disk: it never syncs (`fsync=off`) and is
//! removed at the end. So it lives in memory unless the user chose a place (`TMPDIR`, which
//! the tests set too), or memory is small (a container's default `/dev/shm` is 64 MiB).

use std::path::PathBuf;

use nix::sys::statfs::{TMPFS_MAGIC, statfs};
use nix::unistd::{AccessFlags, access};

/// The memory file system every Linux has (POSIX shared memory lives there).
const MEMORY: &str = "/dev/shm";

/// The free space memory must have to be used: a fresh cluster is about 40 MiB, and a
/// `lab run all` adds some WAL (see the settings in [`crate::postgres`]).
const ROOM: u64 = 512 * 1024 * 1024;

/// The directory new throwaway directories go in.
///
/// A few system calls on file systems the kernel keeps in memory, so fine on a runtime thread.
pub fn root() -> PathBuf {
    let chosen = std::env::var_os("TMPDIR").is_some_and(|dir| !dir.is_empty());
    if !chosen && memory_has_room() {
        PathBuf::from(MEMORY)
    } else {
        std::env::temp_dir()
    }
}

/// Every directory a `lab` may have put throwaway directories in, for the leftovers' sweep:
/// another `lab` may have chosen differently (another `TMPDIR`, or memory that was full).
pub fn roots() -> Vec<PathBuf> {
    let mut roots = vec![std::env::temp_dir()];
    if roots[0] != std::path::Path::new(MEMORY) && is_memory(MEMORY) {
        roots.push(PathBuf::from(MEMORY));
    }
    roots
}

fn is_memory(dir: &str) -> bool {
    statfs(dir).is_ok_and(|fs| fs.filesystem_type() == TMPFS_MAGIC)
}

fn memory_has_room() -> bool {
    let Ok(fs) = statfs(MEMORY) else {
        return false;
    };
    // The field types differ between platforms (they are u64 and i64 here).
    #[allow(clippy::unnecessary_cast)]
    let free = (fs.blocks_available() as u64).saturating_mul(fs.block_size() as u64);
    fs.filesystem_type() == TMPFS_MAGIC
        && free >= ROOM
        && access(MEMORY, AccessFlags::W_OK | AccessFlags::X_OK).is_ok()
}
