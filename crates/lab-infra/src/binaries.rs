//! Finding the server programs.
//!
//! `redis-server` is looked up on `PATH`. PostgreSQL's `initdb` and `postgres` are looked up on
//! `PATH` first; Debian and Ubuntu keep them out of `PATH` (in `/usr/lib/postgresql/<version>/bin`)
//! and put wrappers such as `pg_config` or `pg_ctlcluster` there instead, so when one of those is
//! on `PATH` the lab asks it (or looks in that directory). `LAB_PG_BINDIR` overrides the search.
//! Everything is found through `PATH` or that variable: with the programs hidden from `PATH`, the
//! lab says what is missing instead of reaching around it.
//!
//! The look-ups run on `lab doctor`'s and `Servers::start`'s paths, inside the runtime, so none
//! of them blocks it: asking a program (`pg_config --bindir`, `postgres --version`) is an async
//! child process, and looking at files (`stat(2)` on `PATH`, reading `/usr/lib/postgresql`) runs
//! on the blocking pool ([`on_disk`]).

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::Command;

/// Where PostgreSQL's server programs are.
#[derive(Debug, Clone)]
pub struct PgBinaries {
    pub initdb: PathBuf,
    pub postgres: PathBuf,
}

/// Looks up a program on `PATH`.
pub fn on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

fn in_dir(dir: &Path) -> Option<PgBinaries> {
    let bins = PgBinaries {
        initdb: dir.join("initdb"),
        postgres: dir.join("postgres"),
    };
    (is_executable(&bins.initdb) && is_executable(&bins.postgres)).then_some(bins)
}

/// Runs a look at the disk on the blocking pool.
async fn on_disk<T: Send + 'static>(look: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(look)
        .await
        .expect("a look at the disk does not panic")
}

/// Where to look next for PostgreSQL, after the look at `LAB_PG_BINDIR` and `PATH`.
enum Next {
    /// Found (or, with `LAB_PG_BINDIR`, the only place to look).
    Done(Option<PgBinaries>),
    /// Not on `PATH`: ask `pg_config` when there is one, then Debian's directories.
    Ask { pg_config: Option<PathBuf> },
}

/// Finds `initdb` and `postgres`, or `None`.
pub async fn find_postgres() -> Option<PgBinaries> {
    let next = on_disk(|| {
        if let Some(dir) = std::env::var_os("LAB_PG_BINDIR") {
            return Next::Done(in_dir(Path::new(&dir)));
        }
        if let (Some(initdb), Some(postgres)) = (on_path("initdb"), on_path("postgres")) {
            return Next::Done(Some(PgBinaries { initdb, postgres }));
        }
        Next::Ask {
            pg_config: on_path("pg_config"),
        }
    })
    .await;
    let pg_config = match next {
        Next::Done(found) => return found,
        Next::Ask { pg_config } => pg_config,
    };
    if let Some(pg_config) = pg_config
        && let Some(out) = output_of(&pg_config, "--bindir").await
        && let Some(found) = on_disk(move || in_dir(Path::new(out.trim()))).await
    {
        return Some(found);
    }
    on_disk(debian_versions).await
}

/// Debian's postgresql-common puts pg_ctlcluster on PATH and the servers in versioned
/// directories: the newest that has both programs.
fn debian_versions() -> Option<PgBinaries> {
    on_path("pg_ctlcluster")?;
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            Some((version, e.path().join("bin")))
        })
        .collect();
    versions.sort();
    versions.into_iter().rev().find_map(|(_, dir)| in_dir(&dir))
}

/// Finds PostgreSQL's own benchmark client, `pgbench`: on `PATH`, or beside the server
/// programs (Debian keeps it in the versioned directory as well).
pub async fn find_pgbench() -> Option<PathBuf> {
    if let Some(found) = on_disk(|| on_path("pgbench")).await {
        return Some(found);
    }
    let server = find_postgres().await?;
    let beside = server.initdb.parent()?.join("pgbench");
    on_disk(move || is_executable(&beside).then_some(beside)).await
}

/// Finds `redis-server`, or `None`.
pub async fn find_redis() -> Option<PathBuf> {
    on_disk(|| on_path("redis-server")).await
}

/// The first line a program prints for `--version`, for `lab doctor`.
pub async fn version_of(program: &Path) -> Option<String> {
    let out = output_of(program, "--version").await?;
    out.lines().next().map(|l| l.trim().to_string())
}

/// What `program arg` prints on stdout, if it succeeds.
async fn output_of(program: &Path, arg: &str) -> Option<String> {
    let out = Command::new(program)
        .arg(arg)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        // A question answered in milliseconds, unlike a server: no process group or
        // parent-death signal, but no orphan either if the caller gives up (Ctrl-C).
        .kill_on_drop(true)
        .output()
        .await
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}
