//! A throwaway PostgreSQL server: `initdb` in a temporary directory, `postgres` on a free
//! loopback port, everything removed when it is stopped (or dropped).
//!
//! PostgreSQL refuses to run as root. When `lab` runs as root (containers, CI), both programs
//! run as the `postgres` user, and the temporary directory is handed to that user.
//!
//! Both `initdb` and `postgres` are [`ServerProcess`]es: each in a process group of its own,
//! killed with `lab`, and holding the directory until it is gone. A start that is cancelled
//! halfway (Ctrl-C during `initdb`) thus kills `initdb` with its helpers before the directory
//! is removed, and leaves nothing behind.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::unistd::{Gid, Uid, User};
use sqlx::Connection;
use tempfile::TempDir;

use crate::InfraError;
use crate::binaries::PgBinaries;
use crate::process::{ServerProcess, Shutdown, ThrowawayServer, free_port, log_tail};

/// How long a fresh cluster may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Attempts with a new port when the chosen one was taken in the meantime.
const PORT_ATTEMPTS: usize = 3;

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

/// Creates a cluster and starts it.
pub async fn start(bins: &PgBinaries) -> Result<ThrowawayServer, InfraError> {
    let user = server_user().await?;
    // Shared with every process working in it: it is removed after the last of them is gone.
    let dir = Arc::new(
        tempfile::Builder::new()
            .prefix("lab-pg-")
            .tempdir()
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
    init_cluster(bins, &dir, &data, user).await?;

    let mut last_error = String::new();
    for _ in 0..PORT_ATTEMPTS {
        let port = free_port().map_err(|e| fail(format!("no free port: {e}")))?;
        let log_path = dir.path().join("postgres.log");
        let log = File::create(&log_path).map_err(|e| fail(format!("cannot create log: {e}")))?;
        let _ = hand_over(&log_path, user);
        let mut command = Command::new(&bins.postgres);
        as_user(&mut command, user)
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-h", "127.0.0.1", "-k"])
            // The socket goes to our own directory, not /var/run/postgresql (shared, maybe absent).
            .arg(dir.path())
            // Durability is pointless for a throwaway cluster; these make every commit cheap.
            .args(["-c", "fsync=off", "-c", "synchronous_commit=off"])
            .args(["-c", "full_page_writes=off"])
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
            match sqlx::PgConnection::connect(&url).await {
                Ok(conn) => {
                    let _ = conn.close().await;
                    return Ok(ThrowawayServer::new(process, dir, port, url));
                }
                Err(e) if Instant::now() > deadline => {
                    process.stop().await;
                    return Err(fail(format!(
                        "not ready after {}s: {e}; log: {}",
                        READY_TIMEOUT.as_secs(),
                        log_tail(&log_path, 3).await
                    )));
                }
                // Polling a server that is starting up.
                Err(_) => tokio::time::sleep(Duration::from_millis(25)).await,
            }
        }
        if !last_error.contains("already in use") {
            break;
        }
    }
    Err(fail(format!("the server exited: {last_error}")))
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
        // trust: only loopback connections, to a cluster that lives for one lab call.
        .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C"])
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
