//! A throwaway PostgreSQL server: `initdb` in a temporary directory, `postgres` on a free
//! loopback port, everything removed when dropped.
//!
//! PostgreSQL refuses to run as root. When `lab` runs as root (containers, CI), both programs
//! run as the `postgres` user, and the temporary directory is handed to that user.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::Connection;
use tempfile::TempDir;

use crate::InfraError;
use crate::binaries::PgBinaries;
use crate::process::{ServerProcess, free_port, log_tail};

/// How long a fresh cluster may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Attempts with a new port when the chosen one was taken in the meantime.
const PORT_ATTEMPTS: usize = 3;

/// A running throwaway PostgreSQL. Field order matters: the process stops before the directory
/// holding its data is removed.
#[derive(Debug)]
pub struct ThrowawayPostgres {
    process: ServerProcess,
    dir: TempDir,
    pub port: u16,
    pub url: String,
}

impl ThrowawayPostgres {
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Stops the server now (dropping does the same).
    pub fn stop(&mut self) {
        self.process.stop();
    }
}

/// The user to run PostgreSQL as: `postgres` when we are root, else ourselves.
fn server_user() -> Result<Option<(u32, u32)>, InfraError> {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() > 3 && f[0] == "postgres")
        .and_then(|f| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
        .map(Some)
        .ok_or_else(|| InfraError::Start {
            server: "PostgreSQL",
            reason: "running as root and there is no `postgres` user to run the server as \
                     (PostgreSQL refuses root); create one or pass --database-url"
                .to_string(),
        })
}

fn as_user(command: &mut Command, user: Option<(u32, u32)>) -> &mut Command {
    if let Some((uid, gid)) = user {
        // std drops supplementary groups too when changing uid as root.
        command.uid(uid).gid(gid);
    }
    command
}

/// Creates a cluster and starts it. Blocks for initdb (about a second).
pub async fn start(bins: &PgBinaries) -> Result<ThrowawayPostgres, InfraError> {
    let fail = |reason: String| InfraError::Start {
        server: "PostgreSQL",
        reason,
    };
    let user = server_user()?;
    let dir = tempfile::Builder::new()
        .prefix("lab-pg-")
        .tempdir()
        .map_err(|e| fail(format!("cannot create a temporary directory: {e}")))?;
    if let Some((uid, gid)) = user {
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).map_err(|e| {
            fail(format!(
                "cannot hand {} to postgres: {e}",
                dir.path().display()
            ))
        })?;
    }
    let data = dir.path().join("data");
    // tokio's Command, so the runtime stays free to notice Ctrl-C while initdb works; its own
    // process group, so a terminal's Ctrl-C reaches only lab; killed if lab drops this future.
    let mut initdb = tokio::process::Command::new(&bins.initdb);
    if let Some((uid, gid)) = user {
        initdb.uid(uid).gid(gid);
    }
    let init = initdb
        .arg("-D")
        .arg(&data)
        // trust: only loopback connections, to a cluster that lives for one lab call.
        .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C"])
        // --no-sync: the cluster is thrown away; waiting for fsync would only slow the start.
        .arg("--no-sync")
        .stdin(Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| fail(format!("cannot run {}: {e}", bins.initdb.display())))?;
    if !init.status.success() {
        let stderr = String::from_utf8_lossy(&init.stderr);
        return Err(fail(format!("initdb failed: {}", stderr.trim())));
    }

    let mut last_error = String::new();
    for _ in 0..PORT_ATTEMPTS {
        let port = free_port().map_err(|e| fail(format!("no free port: {e}")))?;
        let log_path = dir.path().join("postgres.log");
        let log = File::create(&log_path).map_err(|e| fail(format!("cannot create log: {e}")))?;
        if let Some((uid, gid)) = user {
            let _ = std::os::unix::fs::chown(&log_path, Some(uid), Some(gid));
        }
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
        let mut process = ServerProcess::spawn("PostgreSQL", &mut command, libc::SIGINT)
            .map_err(|e| fail(format!("cannot run {}: {e}", bins.postgres.display())))?;
        let url = format!("postgresql://postgres@127.0.0.1:{port}/postgres");
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if !process.is_running() {
                last_error = log_tail(&log_path, 3);
                break;
            }
            match sqlx::PgConnection::connect(&url).await {
                Ok(conn) => {
                    let _ = conn.close().await;
                    return Ok(ThrowawayPostgres {
                        process,
                        dir,
                        port,
                        url,
                    });
                }
                Err(e) if Instant::now() > deadline => {
                    return Err(fail(format!(
                        "not ready after {}s: {e}; log: {}",
                        READY_TIMEOUT.as_secs(),
                        log_tail(&log_path, 3)
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
