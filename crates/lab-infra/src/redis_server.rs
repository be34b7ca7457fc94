//! A throwaway Redis: `redis-server` on a free loopback port, keeping nothing on disk.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::InfraError;
use crate::process::{ServerProcess, free_port, log_tail};

const READY_TIMEOUT: Duration = Duration::from_secs(10);
const PORT_ATTEMPTS: usize = 3;

/// A running throwaway Redis; the process stops before its directory is removed.
#[derive(Debug)]
pub struct ThrowawayRedis {
    process: ServerProcess,
    dir: TempDir,
    pub port: u16,
    pub url: String,
}

impl ThrowawayRedis {
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    pub fn stop(&mut self) {
        self.process.stop();
    }
}

/// Starts `redis-server` and waits until it answers PING.
pub async fn start(program: &Path) -> Result<ThrowawayRedis, InfraError> {
    let fail = |reason: String| InfraError::Start {
        server: "Redis",
        reason,
    };
    let dir = tempfile::Builder::new()
        .prefix("lab-redis-")
        .tempdir()
        .map_err(|e| fail(format!("cannot create a temporary directory: {e}")))?;
    let log_path = dir.path().join("redis.log");
    let mut last_error = String::new();
    for _ in 0..PORT_ATTEMPTS {
        let port = free_port().map_err(|e| fail(format!("no free port: {e}")))?;
        let mut command = Command::new(program);
        command
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            // No RDB snapshots and no AOF: a lab run leaves nothing on disk.
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .arg("--logfile")
            .arg(&log_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut process = ServerProcess::spawn("Redis", &mut command, libc::SIGTERM)
            .map_err(|e| fail(format!("cannot run {}: {e}", program.display())))?;
        let url = format!("redis://127.0.0.1:{port}");
        let client = redis::Client::open(url.as_str())?;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if !process.is_running() {
                last_error = log_tail(&log_path, 2);
                break;
            }
            let ping = async {
                let mut conn = client.get_multiplexed_async_connection().await?;
                redis::cmd("PING").query_async::<String>(&mut conn).await
            };
            match ping.await {
                Ok(_) => {
                    return Ok(ThrowawayRedis {
                        process,
                        dir,
                        port,
                        url,
                    });
                }
                Err(e) if Instant::now() > deadline => {
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
