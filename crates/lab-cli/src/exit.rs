//! How `lab` ends: its exit codes (also printed at the end of `--help` and listed in the README),
//! and a command's [`Failure`], which says what to print and which code to end with.

use anyhow::anyhow;

use crate::words::t;

/// Every scenario ran and every fact (and, for `check`, every narrative) is as expected.
pub const OK: u8 = 0;
/// A fact or a narrative is not as expected.
pub const DRIFT: u8 = 1;
/// The command line is wrong (clap uses 2 as well).
pub const USAGE: u8 = 2;
/// The environment: a server cannot be started or reached, a file cannot be read.
pub const ENVIRONMENT: u8 = 3;
/// `lab exercise check`: a check could not decide (a fault that never fired, a race never
/// reached), or the learner's program never answered; no check failed.
pub const UNDECIDED: u8 = 4;
/// Interrupted with Ctrl-C (128 + SIGINT), or stopped with `q` in step mode, after cleaning up.
pub const INTERRUPTED: u8 = 130;
/// Terminated with SIGTERM (128 + SIGTERM), after cleaning up.
pub const TERMINATED: u8 = 143;

/// Which signal stopped the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interrupt {
    /// SIGINT, a Ctrl-C in the terminal.
    CtrlC,
    /// SIGTERM, what `kill`, systemd and CI runners send.
    Terminate,
}

impl Interrupt {
    /// The shell's convention: 128 + the signal's number.
    pub fn exit_code(self) -> u8 {
        match self {
            Interrupt::CtrlC => INTERRUPTED,
            Interrupt::Terminate => TERMINATED,
        }
    }
}

/// What a failed command says on stderr.
#[derive(Debug)]
enum Said {
    /// `lab: error: …`, the error and its causes on one line.
    Error(anyhow::Error),
    /// A signal stopped it; everything is cleaned up.
    Interrupted,
    /// The learner pressed `q` in step mode; everything is cleaned up.
    Quit,
}

/// A command's failure: what to print, and which exit code to end with.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    said: Said,
}

impl Failure {
    /// A failure with an error to print.
    pub fn new(code: u8, error: impl Into<anyhow::Error>) -> Failure {
        Failure {
            code,
            said: Said::Error(error.into()),
        }
    }

    /// The command line is wrong (exit 2).
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure::new(USAGE, anyhow!(message.into()))
    }

    /// The environment is wrong (exit 3).
    pub fn environment(error: impl Into<anyhow::Error>) -> Failure {
        Failure::new(ENVIRONMENT, error)
    }

    /// Stopped by a signal (130 or 143).
    pub fn interrupted(signal: Interrupt) -> Failure {
        Failure {
            code: signal.exit_code(),
            said: Said::Interrupted,
        }
    }

    /// Stopped with `q` in step mode (130, as Ctrl-C: the run did not get to its facts).
    pub fn quit() -> Failure {
        Failure {
            code: INTERRUPTED,
            said: Said::Quit,
        }
    }

    /// What it says (for reports and tests): the error's line, or what stopped the command.
    pub fn message(&self) -> String {
        match &self.said {
            Said::Error(error) => one_line(error),
            Said::Interrupted => "interrupted".into(),
            Said::Quit => "quit".into(),
        }
    }

    /// Whether a signal (or `q`) stopped the command, rather than an error.
    pub fn is_interruption(&self) -> bool {
        matches!(self.said, Said::Interrupted | Said::Quit)
    }

    /// Prints what the failure says on stderr, after everything the command printed before;
    /// returns its exit code.
    pub fn report(self) -> u8 {
        crate::output::drain();
        match self.said {
            Said::Error(error) => eprintln!("{} {}", t("error_prefix"), one_line(&error)),
            Said::Interrupted => {
                // A Ctrl-C at a pause leaves the cursor on the step footer (after the
                // terminal's `^C`): clear that line first, so the message does not run into it.
                // Every other line on stderr has ended, so on a terminal this clears nothing
                // else.
                if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
                    eprint!("\r\x1b[2K");
                }
                eprintln!("{}", t("interrupted"));
            }
            Said::Quit => eprintln!("{}", t("stopped")),
        }
        self.code
    }
}

/// An error and its causes on one line, each said once: many errors already include their
/// cause's text in their own message, and printing the chain as well would repeat it.
fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// A scenario that could not follow its script (or used something it did not declare) is drift
/// (exit 1); `q` in step mode is a quit; anything else that stopped it (a server gone, a proxy
/// unreachable) is the environment (exit 3).
impl From<lab_scenarios::ScenarioError> for Failure {
    fn from(e: lab_scenarios::ScenarioError) -> Failure {
        use lab_scenarios::ScenarioError;
        match e {
            ScenarioError::Quit(_) => Failure::quit(),
            ScenarioError::Broken(reason) => Failure::new(
                DRIFT,
                anyhow!(t(
                    lab_core::Msg::new("scenario_broken").arg("reason", reason)
                )),
            ),
            e @ ScenarioError::Undeclared { .. } => Failure::new(DRIFT, e),
            e => Failure::environment(e),
        }
    }
}

/// A server that cannot be had, in the learner's language: a URL that is not one is a usage
/// error (exit 2), anything else the environment (exit 3). The servers' own messages (what
/// PostgreSQL or Redis said) are passed on as they are.
impl From<lab_infra::InfraError> for Failure {
    fn from(e: lab_infra::InfraError) -> Failure {
        use lab_core::Msg;
        use lab_infra::InfraError;
        let said = match &e {
            InfraError::Missing { missing, get } => Msg::new("infra.missing")
                .arg("missing", missing.as_str())
                .arg("get", get.as_str()),
            InfraError::Start { server, reason } => Msg::new("infra.start")
                .arg("server", *server)
                .arg("reason", reason.as_str()),
            InfraError::Unreachable {
                server,
                url,
                reason,
            } => Msg::new("infra.unreachable")
                .arg("server", *server)
                .arg("url", url.as_str())
                .arg("reason", reason.as_str()),
            InfraError::Refused {
                server,
                url,
                reason,
            } => Msg::new("infra.refused")
                .arg("server", *server)
                .arg("url", url.as_str())
                .arg("reason", reason.as_str()),
            InfraError::BadUrl {
                server,
                url,
                reason,
            } => {
                let said = Msg::new("infra.bad_url")
                    .arg("server", *server)
                    .arg("url", url.as_str())
                    .arg("reason", reason.as_str());
                return Failure::new(USAGE, anyhow!(t(said)));
            }
            InfraError::TooOld {
                server,
                url,
                version,
                needs,
            } => Msg::new("infra.too_old")
                .arg("server", *server)
                .arg("url", url.as_str())
                .arg("version", version.as_str())
                .arg("needs", *needs),
            InfraError::Sql(_) | InfraError::Redis(_) => return Failure::environment(e),
        };
        Failure::environment(anyhow!(t(said)))
    }
}
