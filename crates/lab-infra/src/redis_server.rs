//! A throwaway Redis: `redis-server` on a free loopback port, keeping nothing on disk.
//!
//! Its temporary directory holds only the log and is the server's working directory. Like
//! PostgreSQL, it is a [`ServerProcess`]: own process group, killed with `lab`, stopped before
//! the directory is removed.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::InfraError;
use crate::process::{ServerProcess, Shutdown, ThrowawayServer, free_port, log_tail};

/// How long a fresh Redis may take to answer PING.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts with a new port when the chosen one was taken in the meantime.
const PORT_ATTEMPTS: usize = 3;

/// Starts `redis-server` and waits until it answers PING.
pub async fn start(program: &Path) -> Result<ThrowawayServer, InfraError> {
    let fail = |reason: String| InfraError::Start {
        server: "Redis",
        reason,
    };
    let dir = Arc::new(
        tempfile::Builder::new()
            .prefix("lab-redis-")
            .tempdir_in(crate::scratch::root())
            .map_err(|e| fail(format!("cannot create a temporary directory: {e}")))?,
    );
    // Names this lab as the owner, so the next one can tell the directory was abandoned if this
    // one is killed with SIGKILL.
    crate::leftovers::claim(dir.path())
        .map_err(|e| fail(format!("cannot write to {}: {e}", dir.path().display())))?;
    let log_path = dir.path().join("redis.log");
    let mut last_error = String::new();
    for _ in 0..PORT_ATTEMPTS {
        let port = free_port().map_err(|e| fail(format!("no free port: {e}")))?;
        let url = format!("redis://127.0.0.1:{port}");
        let client = redis::Client::open(url.as_str())?;
        let mut command = Command::new(program);
        command
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            // No RDB snapshots and no AOF: a lab run leaves nothing on disk.
            .args(["--save", "", "--appendonly", "no"])
            // Redis changes into --dir at start: the directory is also its working directory.
            .arg("--dir")
            .arg(dir.path())
            .arg("--logfile")
            .arg(&log_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut process =
            ServerProcess::spawn("Redis", command, Shutdown::REDIS, Some(dir.clone()))
                .await
                .map_err(|e| fail(format!("cannot run {}: {e}", program.display())))?;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if !process.is_running() {
                process.stop().await;
                last_error = log_tail(&log_path, 2).await;
                break;
            }
            let ping = async {
                let mut conn = client.get_multiplexed_async_connection().await?;
                redis::cmd("PING").query_async::<String>(&mut conn).await
            };
            match ping.await {
                Ok(_) => return Ok(ThrowawayServer::new(process, dir, port, url)),
                Err(e) if Instant::now() > deadline => {
                    process.stop().await;
                    return Err(fail(format!("not ready: {e}")));
                }
                // Polling a server that is starting up.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
        if !last_error.contains("in use") {
            break;
        }
    }
    Err(fail(format!("redis-server exited: {last_error}")))
}
