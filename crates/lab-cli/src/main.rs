//! `lab`: the command-line front of the lab. It parses flags, runs one lifecycle around the
//! work, and hands scenarios to `lab-scenarios` and services to `lab-services`.
//!
//! # Layout
//!
//! - [`cli`]: the command line as clap sees it; nothing below it knows clap.
//! - [`commands`]: one module per command; each turns flags into typed options
//!   ([`session::SessionOptions`]) and returns an exit code or a [`exit::Failure`].
//! - [`session`]: the one lifecycle of every command that runs scenarios or services (servers,
//!   guarded work, what comes after, cleanup), signals, and the step gate.
//! - [`select`]: the scenarios and knobs a command line chooses, checked before anything starts.
//! - [`exit`]: the exit codes, and a command's failure as the learner reads it.
//! - [`words`]: the CLI's own words in the learner's language; [`output`]: stdout through a
//!   queue that never holds up a run; [`logging`]: `--log`; [`web`]: the page of `run --web`.
//!
//! Every line `lab` prints on stderr is in the learner's language (clap's own messages are
//! clap's). Errors become one line on stderr and a documented exit code.
//!
//! The runtime is built by hand rather than with `#[tokio::main]` so that it can be shut down
//! without waiting for the thread that reads stdin in step mode (a blocked read would otherwise
//! keep the process alive after the last scenario).

/// `println!` that ignores a closed stdout (`lab list | head -1`): output is best effort, and a
/// panic there would skip stopping the servers.
macro_rules! say {
    () => {
        say!("")
    };
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        // Through the queue, after the narrative it follows (see `output`).
        let _ = writeln!($crate::output::QueuedStdout, $($arg)*);
    }};
}

mod cli;
mod commands;
mod exit;
mod logging;
mod output;
mod select;
mod session;
mod web;
mod words;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use crate::cli::Cli;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version are not errors; everything else clap rejects is exit 2.
            let code = if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    // Signals first: a Ctrl-C from now on ends a command that starts servers cleanly (the
    // commands that start none keep the default: Ctrl-C ends them at once).
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("lab: error: cannot start the async runtime: {e}");
            return ExitCode::from(exit::ENVIRONMENT);
        }
    };
    if !matches!(
        cli.command,
        cli::Command::List { .. } | cli::Command::Proxy(_) | cli::Command::Completions { .. }
    ) {
        let _in_runtime = runtime.enter();
        session::Interrupts::install();
    }
    // The scenario files are read once, here, outside the runtime's tasks: reading files is
    // blocking work, and every command's words (in the learner's language) come from them.
    let library = lab_scenarios::Library::load();
    words::init(
        commands::lang(&cli.global),
        library.as_ref().ok().map(|l| l.texts.clone()),
    );
    let log_color = cli.global.color == cli::ColorArg::Always
        || (cli.global.color == cli::ColorArg::Auto
            && std::io::IsTerminal::is_terminal(&std::io::stderr())
            && std::env::var_os("NO_COLOR").is_none());
    // `lab bench` runs no scenario: nothing of its work is told to a run, so it goes without the
    // layer that wants every span (see `logging::install`).
    let runs_scenarios = !matches!(cli.command, cli::Command::Bench(_));
    if let Err(e) = logging::install(cli.global.log, log_color, runs_scenarios) {
        return ExitCode::from(exit::Failure::new(exit::USAGE, anyhow::anyhow!(e)).report());
    }
    let result = runtime.block_on(commands::dispatch(cli, library));
    runtime.shutdown_timeout(Duration::from_millis(200));
    // After everything the command printed (and everything queued for stdout is written
    // before the process ends).
    let code = result.unwrap_or_else(exit::Failure::report);
    output::drain();
    ExitCode::from(code)
}
