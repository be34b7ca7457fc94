//! What every command that runs scenarios shares: choosing the language and colours, starting
//! the servers with a spinner, and running work so that Ctrl-C (or `q` in step mode) stops it
//! cleanly instead of killing the process halfway.

use std::future::Future;
use std::time::Duration;

use anyhow::anyhow;
use indicatif::{ProgressBar, ProgressStyle};
use lab_core::text::COMMON;
use lab_core::{Gate, Lang, Msg};
use lab_infra::{Needs, ServerOptions, Servers};
use lab_scenarios::{Library, Scenario, ScenarioError};
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::cli::{ColorArg, Global, LangArg, exit};

/// A command's failure: what to print and which exit code to end with.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub error: anyhow::Error,
}

impl Failure {
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure {
            code: exit::USAGE,
            error: anyhow!(message.into()),
        }
    }

    pub fn environment(error: impl Into<anyhow::Error>) -> Failure {
        Failure {
            code: exit::ENVIRONMENT,
            error: error.into(),
        }
    }
}

/// The language: `--lang`, else the environment.
pub fn lang(global: &Global) -> Lang {
    match global.lang {
        Some(LangArg::En) => Lang::En,
        Some(LangArg::Ru) => Lang::Ru,
        None => Lang::from_env(),
    }
}

/// Applies `--color` and tells whether stdout gets colour. `auto` follows `colored`: colour only
/// on a terminal, never with `NO_COLOR` set, always with `CLICOLOR_FORCE`.
pub fn color(global: &Global) -> bool {
    match global.color {
        ColorArg::Always => colored::control::set_override(true),
        ColorArg::Never => colored::control::set_override(false),
        ColorArg::Auto => {}
    }
    colored::control::SHOULD_COLORIZE.should_colorize()
}

/// Loads the scenario files; a broken installation is an environment problem.
pub fn library() -> Result<Library, Failure> {
    Library::load().map_err(Failure::environment)
}

/// Resolves scenario names (`all` means every one), rejecting unknown names as usage errors.
pub fn resolve(names: &[String]) -> Result<Vec<&'static Scenario>, Failure> {
    if names.is_empty() || names.iter().any(|n| n == "all") {
        return Ok(lab_scenarios::CATALOGUE.iter().collect());
    }
    names
        .iter()
        .map(|name| {
            lab_scenarios::find(name).ok_or_else(|| {
                let known: Vec<&str> = lab_scenarios::CATALOGUE.iter().map(|s| s.name).collect();
                Failure::usage(format!(
                    "unknown scenario `{name}`; known: {}, or `all` (see `lab list`)",
                    known.join(", ")
                ))
            })
        })
        .collect()
}

/// The union of what the scenarios need.
pub fn needs(scenarios: &[&Scenario]) -> Needs {
    scenarios
        .iter()
        .fold(Needs::default(), |acc, s| acc.union(s.needs))
}

/// Starts (or connects to) the servers, with a spinner on stderr when it is a terminal.
/// `Ok(None)`: Ctrl-C or SIGTERM came first; whatever was half started is already gone.
pub async fn start_servers(
    global: &Global,
    needs: Needs,
    library: &Library,
    lang: Lang,
    interrupts: &mut Interrupts,
) -> Result<Option<Servers>, Failure> {
    let options = ServerOptions::new(global.database_url.clone(), global.redis_url.clone());
    // indicatif draws nothing when stderr is not a terminal: scripts and CI see no spinner. A
    // spinner is made of escape codes, so NO_COLOR and --color never turn it off too.
    let spinner = if color(global) {
        ProgressBar::new_spinner()
    } else {
        ProgressBar::hidden()
    };
    spinner.set_style(ProgressStyle::with_template("{spinner} {msg}").expect("valid template"));
    spinner.set_message(
        library
            .texts
            .render(COMMON, lang, &Msg::new("cli.starting")),
    );
    spinner.enable_steady_tick(Duration::from_millis(100));
    // Nothing pauses while servers start, so no gate: only a signal can cut this short.
    let started = guarded(
        Servers::start(&options, needs),
        interrupts,
        &Gate::default(),
    )
    .await;
    spinner.finish_and_clear();
    match started {
        Guarded::Finished(Ok(servers)) => Ok(Some(servers)),
        // A URL that is not a URL is a usage error, not an unreachable server.
        Guarded::Finished(Err(e @ lab_infra::InfraError::BadUrl { .. })) => Err(Failure {
            code: exit::USAGE,
            error: e.into(),
        }),
        Guarded::Finished(Err(e)) => Err(Failure::environment(e)),
        Guarded::Interrupted | Guarded::Quit => Ok(None),
    }
}

/// Says that lab was interrupted and everything is cleaned up; the exit code for it.
pub fn interrupted() -> u8 {
    eprintln!("lab: interrupted; servers and temporary files are cleaned up");
    exit::INTERRUPTED
}

/// A scenario that could not follow its script is drift (exit 1); anything else that stopped
/// it (a server gone, a proxy unreachable) is the environment (exit 3).
pub fn scenario_failure(e: ScenarioError) -> Failure {
    match e {
        ScenarioError::Broken(reason) => Failure {
            code: exit::DRIFT,
            error: anyhow!("a scenario could not follow its script: {reason}"),
        },
        e => Failure::environment(e),
    }
}

/// Ctrl-C and SIGTERM, listened for from the start of a command: a signal that arrives while the
/// servers are still starting must also lead to a clean stop, not to the default "die at once".
pub struct Interrupts {
    interrupt: Option<Signal>,
    terminate: Option<Signal>,
}

impl Interrupts {
    pub fn listen() -> Interrupts {
        Interrupts {
            interrupt: signal(SignalKind::interrupt()).ok(),
            terminate: signal(SignalKind::terminate()).ok(),
        }
    }

    async fn recv(&mut self) {
        async fn next(s: &mut Option<Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            _ = next(&mut self.interrupt) => {}
            _ = next(&mut self.terminate) => {}
        }
    }
}

/// How a guarded piece of work ended.
pub enum Guarded<T> {
    Finished(T),
    /// Ctrl-C or SIGTERM.
    Interrupted,
    /// `q` at a pause in step mode.
    Quit,
}

/// How long work may take to wind down after `q`: it stops at its next pause by itself (every
/// pause answers `q` from then on) and releases what it holds on the way out.
const QUIT_GRACE: Duration = Duration::from_secs(10);

/// Runs `work` until it finishes, Ctrl-C or SIGTERM arrives, or the learner quits step mode.
/// After Ctrl-C the work is dropped at once (its services stop, its connections close); after
/// `q` it gets [`QUIT_GRACE`] to end by itself. Either way the caller then cleans up what the runs
/// left behind and stops the servers.
pub async fn guarded<T>(
    work: impl Future<Output = T>,
    interrupts: &mut Interrupts,
    gate: &Gate,
) -> Guarded<T> {
    tokio::pin!(work);
    tokio::select! {
        // Work that has finished wins over a signal that arrives in the same instant: its
        // cleanup has run, and its result is the true one.
        biased;
        result = &mut work => Guarded::Finished(result),
        _ = interrupts.recv() => Guarded::Interrupted,
        _ = gate.quit_requested() => {
            tokio::select! {
                _ = tokio::time::timeout(QUIT_GRACE, &mut work) => Guarded::Quit,
                _ = interrupts.recv() => Guarded::Interrupted,
            }
        }
    }
}
