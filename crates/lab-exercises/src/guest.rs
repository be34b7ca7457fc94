//! The learner's program, a guest of the lab: started from its manifest with only what it needs
//! (its port, the run's schema), in a process group of its own that is ended on every way out,
//! its output kept in a file and shown only when it helps.
//!
//! - The program is a [`ServerProcess`]: the leader of a new process group, killed by the
//!   kernel if `lab` dies; stopping or killing it signals the whole group, so a reloader's or a
//!   worker pool's children go with it. Dropping a [`Guest`] (an error, a Ctrl-C that drops the
//!   check) kills the group too.
//! - Its environment is the learner's own, minus the lab's settings (`LAB_*`, `DATABASE_URL`,
//!   `REDIS_URL`, `TOXIPROXY_URL`), plus what the lab gives it ([`crate::guest_env`]: the whole
//!   contract, in one table).
//! - Its stdout and stderr go to one log file in a temporary folder; the tail is shown when it
//!   never answered, or beside a failed check.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lab_infra::ports::{PortHolder, port_holder};
use lab_infra::process::{ServerProcess, Shutdown};
use nix::sys::signal::Signal;
use tempfile::TempDir;

use crate::error::ExerciseError;
use crate::guest_env::GuestEnv;
use crate::manifest::{self, Manifest};

/// How often readiness is probed while the program starts: a poll for a state, not for an order.
const READY_POLL: Duration = Duration::from_millis(50);
/// How many free ports a service is given before the lab gives up: each is lost only when
/// another program binds it between the lab's pick and the service's own bind.
const PORT_TRIES: u32 = 3;

/// How many lines of the program's output are shown.
pub const OUTPUT_LINES: usize = 30;
/// The lab's own settings, never passed to the guest: it must see only the run it is given.
const WITHHELD: &[&str] = &["DATABASE_URL", "REDIS_URL", "TOXIPROXY_URL"];

/// How the guest is ended politely: SIGTERM (uvicorn and tokio programs shut down on it), then
/// SIGKILL after the grace period.
const SHUTDOWN: Shutdown = Shutdown {
    clean: Some(Signal::SIGTERM),
    quick: Signal::SIGKILL,
};

/// Why the guest is not answering.
#[derive(Debug)]
pub enum NotReady {
    /// It exited before it answered.
    Exited {
        status: String,
        output: String,
        port: u16,
    },
    /// It ran, and never answered within the manifest's time.
    Silent {
        waited: Duration,
        output: String,
        port: u16,
    },
    /// Another program took its port before it could listen there (the port was free when the
    /// lab picked it): what answered there was not the learner's program, so nothing it said
    /// counts. [`crate::rig::Rig::start_service`] tries again on another port.
    PortTaken { output: String, port: u16 },
}

impl NotReady {
    /// What the program printed before the lab gave up on it.
    pub fn output(&self) -> &str {
        match self {
            NotReady::Exited { output, .. }
            | NotReady::Silent { output, .. }
            | NotReady::PortTaken { output, .. } => output,
        }
    }
}

/// A place in a guest's output (see [`Guest::mark`]).
#[derive(Debug, Clone, Default)]
pub struct Mark {
    log: PathBuf,
    at: u64,
}

/// The learner's program.
pub struct Guest {
    dir: PathBuf,
    manifest: Manifest,
    env: Vec<(String, String)>,
    pub port: u16,
    log: PathBuf,
    /// Holds the log file's folder as long as the guest.
    logs: Arc<TempDir>,
    process: Option<ServerProcess>,
}

impl Guest {
    /// A guest in `dir`, to listen on `port`, with `env` given on top of the learner's own.
    pub fn new(
        dir: &Path,
        manifest: Manifest,
        port: u16,
        env: Vec<(String, String)>,
    ) -> Result<Guest, ExerciseError> {
        let logs = tempfile::Builder::new()
            .prefix(lab_infra::leftovers::EXERCISE_PREFIX)
            .tempdir()
            .map_err(ExerciseError::io(std::env::temp_dir()))?;
        // Named for the next `lab`'s sweep: should this one be killed, it ends what the program
        // left running (see `lab_infra::leftovers`).
        lab_infra::leftovers::claim(logs.path()).map_err(ExerciseError::io(logs.path()))?;
        let log = logs.path().join("output.log");
        // Absolute: the program runs in `dir`, so a relative path to it (`.venv/bin/python`)
        // must not be taken relative to `dir` twice.
        let dir = std::path::absolute(dir).map_err(ExerciseError::io(dir))?;
        Ok(Guest {
            dir,
            manifest,
            env,
            port,
            log,
            logs: Arc::new(logs),
            process: None,
        })
    }

    /// Starts a service in `dir` with `env` on a free port and waits until it answers there
    /// (see [`Guest::start`]). A port that another program took before the service listened
    /// there is given up for another, a few times.
    pub async fn start_on_a_free_port(
        dir: &Path,
        manifest: Manifest,
        mut env: GuestEnv,
    ) -> Result<(Guest, Result<Duration, NotReady>), ExerciseError> {
        let mut tries = 0;
        loop {
            tries += 1;
            let port = lab_infra::process::free_port().map_err(ExerciseError::io(dir))?;
            env.port = Some(port);
            let mut guest = Guest::new(dir, manifest.clone(), port, env.vars())?;
            match guest.start().await? {
                Err(NotReady::PortTaken { .. }) if tries < PORT_TRIES => continue,
                started => return Ok((guest, started)),
            }
        }
    }

    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn command(&self, argv: &[String], output: std::fs::File) -> std::process::Command {
        let mut command = std::process::Command::new(manifest::resolve(&self.dir, &argv[0]));
        command.args(&argv[1..]).current_dir(&self.dir);
        for (name, _) in std::env::vars_os().filter_map(|(n, v)| Some((n.into_string().ok()?, v))) {
            if name.starts_with("LAB_") || WITHHELD.contains(&name.as_str()) {
                command.env_remove(&name);
            }
        }
        command.envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let stderr = output
            .try_clone()
            .map(Stdio::from)
            .unwrap_or_else(|_| Stdio::null());
        command
            .stdin(Stdio::null())
            .stdout(Stdio::from(output))
            .stderr(stderr);
        command
    }

    fn open_log(&self) -> Result<std::fs::File, ExerciseError> {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(ExerciseError::io(&self.log))
    }

    /// Runs the manifest's build step, if any, to its end (in its own process group, killed
    /// if the check is dropped).
    pub async fn build(&self) -> Result<(), ExerciseError> {
        if self.manifest.build.is_empty() {
            return Ok(());
        }
        let argv = &self.manifest.build;
        let command = self.command(argv, self.open_log()?);
        let mut process =
            ServerProcess::spawn("the exercise's build", command, Shutdown::KILL, None)
                .await
                .map_err(|e| self.spawn_error(&argv[0], e))?;
        let status = process.wait().await.map_err(ExerciseError::io(&self.dir))?;
        if status.success() {
            return Ok(());
        }
        Err(ExerciseError::Build {
            command: argv.join(" "),
            status: status.to_string(),
            output: self.output().await,
        })
    }

    fn spawn_error(&self, program: &str, e: std::io::Error) -> ExerciseError {
        let reason = if e.kind() == std::io::ErrorKind::NotFound {
            format!("{e}; is it installed (the README's one install command)?")
        } else {
            e.to_string()
        };
        ExerciseError::Spawn {
            program: program.to_string(),
            dir: self.dir.clone(),
            reason,
        }
    }

    /// Starts the program, without waiting for anything: a job that runs to its end (a worker
    /// that processes one task).
    pub async fn launch(&mut self) -> Result<(), ExerciseError> {
        let argv = self.manifest.command.clone();
        let command = self.command(&argv, self.open_log()?);
        // Recorded before the start, so that a `lab` killed at any moment after it leaves
        // nothing the next one cannot find: the run's id is in every process the program starts.
        let mark = self
            .env
            .iter()
            .find(|(name, _)| name == crate::guest_env::RUN_VAR)
            .map(|(name, value)| format!("{name}={value}"))
            .unwrap_or_default();
        lab_infra::leftovers::record_program(self.logs.path(), &self.dir, &mark)
            .map_err(ExerciseError::io(self.logs.path()))?;
        let process = ServerProcess::spawn("the exercise's program", command, SHUTDOWN, None)
            .await
            .map_err(|e| self.spawn_error(&argv[0], e))?;
        lab_infra::leftovers::record_group(self.logs.path(), process.pid())
            .map_err(ExerciseError::io(self.logs.path()))?;
        self.process = Some(process);
        Ok(())
    }

    /// Waits, at most `limit`, for a launched program to exit: its exit code (`None` if a
    /// signal ended it), or `Err` if it still runs (it is killed then, with its group).
    pub async fn finish(&mut self, limit: Duration) -> Result<Option<i32>, ()> {
        let Some(process) = self.process.as_mut() else {
            return Ok(None);
        };
        match tokio::time::timeout(limit, process.wait()).await {
            Ok(status) => {
                self.process = None;
                Ok(status.ok().and_then(|s| s.code()))
            }
            Err(_) => {
                self.kill().await;
                Err(())
            }
        }
    }

    /// Starts the program and waits until `GET /health` gets any HTTP answer from it: an answer
    /// counts only while the kernel says the port's listening socket is the program's own (see
    /// [`lab_infra::ports`]), never a stranger's that took the port first.
    pub async fn start(&mut self) -> Result<Result<Duration, NotReady>, ExerciseError> {
        let started = Instant::now();
        self.launch().await?;
        let probe = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .pool_max_idle_per_host(0)
            .build()
            .expect("a client without TLS builds");
        let url = format!("{}/health", self.base_url());
        let limit = self.manifest.start_timeout();
        let leader = self.process.as_ref().expect("started above").pid();
        loop {
            let holder = port_holder(self.port, leader);
            if holder == PortHolder::Program && probe.get(&url).send().await.is_ok() {
                return Ok(Ok(started.elapsed()));
            }
            let process = self.process.as_mut().expect("started above");
            if !process.is_running() {
                let status = match process.wait().await {
                    Ok(status) => status.to_string(),
                    Err(e) => e.to_string(),
                };
                self.process = None;
                let output = self.output().await;
                let port = self.port;
                // Read again now that the program is gone: did it die because a stranger held
                // its port?
                return Ok(Err(match port_holder(port, leader) {
                    PortHolder::Other => NotReady::PortTaken { output, port },
                    _ => NotReady::Exited {
                        status,
                        output,
                        port,
                    },
                }));
            }
            if started.elapsed() > limit {
                self.stop().await;
                let output = self.output().await;
                let port = self.port;
                return Ok(Err(if holder == PortHolder::Other {
                    NotReady::PortTaken { output, port }
                } else {
                    NotReady::Silent {
                        waited: limit,
                        output,
                        port,
                    }
                }));
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }

    /// Kills the program's process group with SIGKILL: a crash, nothing flushed.
    pub async fn kill(&mut self) {
        if let Some(process) = self.process.take() {
            process.kill().await;
        }
    }

    /// Stops the program: SIGTERM to its group, then SIGKILL after a grace period.
    pub async fn stop(&mut self) {
        if let Some(process) = self.process.take() {
            process.stop().await;
        }
    }

    /// How much the program has printed so far: a mark for [`Guest::output_since`].
    pub fn mark(&self) -> Mark {
        Mark {
            log: self.log.clone(),
            at: std::fs::metadata(&self.log).map_or(0, |m| m.len()),
        }
    }

    /// How many bytes the program has printed so far.
    pub fn printed(&self) -> u64 {
        std::fs::metadata(&self.log).map_or(0, |m| m.len())
    }

    /// The last lines the program printed (stdout and stderr together).
    pub async fn output(&self) -> String {
        self.output_since(&Mark::default()).await
    }

    /// What the program printed after `mark`, if it printed anything.
    pub async fn said_since(&self, mark: &Mark) -> Option<String> {
        Some(self.output_since(mark).await).filter(|o| !o.trim().is_empty())
    }

    /// The last lines the program printed after `mark`: what it said during one check, not
    /// its start-up banner. A mark of another guest (the program was started again since, with
    /// a log of its own) counts from the start.
    pub async fn output_since(&self, mark: &Mark) -> String {
        let mark = if mark.log == self.log { mark.at } else { 0 };
        let text = tokio::fs::read(&self.log).await.unwrap_or_default();
        let from = usize::try_from(mark).unwrap_or(usize::MAX).min(text.len());
        let text = String::from_utf8_lossy(&text[from..]);
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(OUTPUT_LINES)..].join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A program that serves `GET /health` on `$PORT` (and exits if it cannot bind it).
    fn health_server(dir: &Path) -> Manifest {
        let script = "import http.server, os\n\
                      class H(http.server.BaseHTTPRequestHandler):\n    \
                          def do_GET(self):\n        \
                              self.send_response(200); self.end_headers()\n\
                      http.server.HTTPServer(('127.0.0.1', int(os.environ['PORT'])), H).serve_forever()\n";
        std::fs::write(dir.join("serve.py"), script).unwrap();
        toml::from_str(
            r#"exercise = "report-api"
lang = "python"
command = ["python3", "serve.py"]
start_timeout_secs = 10"#,
        )
        .unwrap()
    }

    /// The collision CI once met: another program took the port between the lab's pick and
    /// the program's bind, and answered `GET /health` there. Its answer must not count: the
    /// program that exits on the bind error is said to have lost its port, not to be ready.
    #[tokio::test]
    async fn a_strangers_answer_on_the_port_does_not_count() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = health_server(dir.path());
        let stranger = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = stranger.local_addr().unwrap().port();
        let answering = tokio::spawn(async move {
            loop {
                let (mut socket, _) = stranger.accept().await.unwrap();
                use tokio::io::AsyncWriteExt;
                let _ = socket
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                    .await;
            }
        });
        let env = GuestEnv {
            port: Some(port),
            ..GuestEnv::default()
        };
        let mut guest = Guest::new(dir.path(), manifest.clone(), port, env.vars()).unwrap();
        let started = guest.start().await.unwrap();
        assert!(
            matches!(started, Err(NotReady::PortTaken { port: p, .. }) if p == port),
            "{started:?}"
        );
        // On a free port of its own the same program is ready.
        let (mut guest, started) =
            Guest::start_on_a_free_port(dir.path(), manifest, GuestEnv::default())
                .await
                .unwrap();
        assert!(started.is_ok(), "{started:?}");
        assert_ne!(guest.port, port);
        guest.stop().await;
        answering.abort();
    }
}
