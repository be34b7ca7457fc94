//! One [`Session`] per command that runs scenarios or services (`run`, `check`, `serve`): the
//! language and colours, the scenario files, the step gate and the live renderer, the servers,
//! and a way to run work so that Ctrl-C, SIGTERM or `q` in step mode stop it cleanly instead of
//! killing the process halfway.
//!
//! ```text
//! Session::open ── start_servers (a spinner after 300 ms, on a terminal; a signal here stops
//!                                  cleanly too)
//!               ── guarded(work) ── Finished | Interrupted | Quit
//!               ── close: proxies left on a given Toxiproxy, abandoned runs, servers
//! ```

use std::future::Future;
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use lab_core::gate::{Look, Options, Pause, Place, Screen, Sofar, Viewer};
use lab_core::narrator::SharedSink;
use lab_core::render::{JsonRenderer, Renderer, TextRenderer, WriteSink, swimlanes};
use lab_core::text::COMMON;
use lab_core::{Gate, Lang, Msg, Narrator};
use lab_infra::{Needs, Origin, ServerOptions, Servers};
use lab_scenarios::{Entry, Library, RunConfig, ScenarioError, Settings};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::cli::{ColorArg, FormatArg, Global, LangArg, exit};
use crate::words::t;

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

/// Resolves scenario names (`all`, or none, means every one), rejecting unknown names as usage
/// errors.
pub fn resolve(names: &[String]) -> Result<Vec<Entry>, Failure> {
    if names.is_empty() || names.iter().any(|n| n == "all") {
        return Ok(lab_scenarios::CATALOGUE.to_vec());
    }
    names
        .iter()
        .map(|name| {
            lab_scenarios::find(name).ok_or_else(|| {
                let known: Vec<&str> = lab_scenarios::CATALOGUE.iter().map(|s| s.name).collect();
                Failure::usage(t(Msg::new("unknown_scenario")
                    .arg("name", name)
                    .arg("known", known.join(", "))))
            })
        })
        .collect()
}

/// Checks `--set NAME=VALUE` against the knobs of the selected scenarios: every name must be a
/// knob of one of them, and its value must fit it. Returns the values, typed.
pub fn settings(given: &[String], scenarios: &[Entry]) -> Result<Settings, Failure> {
    let mut settings = Settings::default();
    for item in given {
        let (name, value) = item
            .split_once('=')
            .ok_or_else(|| Failure::usage(t(Msg::new("set_syntax").arg("item", item))))?;
        let knob = scenarios
            .iter()
            .flat_map(|s| s.scenario.knobs)
            .find(|k| k.name == name.trim())
            .ok_or_else(|| {
                let known: Vec<&str> = scenarios
                    .iter()
                    .flat_map(|s| s.scenario.knobs.iter().map(|k| k.name))
                    .collect();
                Failure::usage(if known.is_empty() {
                    t(Msg::new("unknown_knob_none").arg("name", name))
                } else {
                    t(Msg::new("unknown_knob")
                        .arg("name", name)
                        .arg("known", known.join(", ")))
                })
            })?;
        let parsed = knob
            .parse(value)
            .map_err(|e| Failure::usage(e.to_string()))?;
        settings.set(knob, parsed);
    }
    Ok(settings)
}

/// The union of the servers the scenarios need.
pub fn needs(scenarios: &[Entry]) -> Needs {
    scenarios
        .iter()
        .fold(Needs::default(), |acc, s| acc.union(s.requires().servers()))
}

/// A scenario that could not follow its script (or used something it did not declare) is drift
/// (exit 1); anything else that stopped it (a server gone, a proxy unreachable) is the
/// environment (exit 3).
pub fn scenario_failure(e: ScenarioError) -> Failure {
    match e {
        ScenarioError::Broken(reason) => Failure {
            code: exit::DRIFT,
            error: anyhow!(t(Msg::new("scenario_broken").arg("reason", reason))),
        },
        e @ ScenarioError::Undeclared { .. } => Failure {
            code: exit::DRIFT,
            error: e.into(),
        },
        e => Failure::environment(e),
    }
}

/// Ctrl-C and SIGTERM, listened for from the start of a command: a signal that arrives while the
/// servers are still starting must also lead to a clean stop, not to the default "die at once".
struct Interrupts {
    interrupt: Option<Signal>,
    terminate: Option<Signal>,
}

impl Interrupts {
    fn listen() -> Interrupts {
        Interrupts {
            interrupt: signal(SignalKind::interrupt()).ok(),
            terminate: signal(SignalKind::terminate()).ok(),
        }
    }

    async fn recv(&mut self) -> Interrupt {
        async fn next(s: &mut Option<Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            _ = next(&mut self.interrupt) => Interrupt::CtrlC,
            _ = next(&mut self.terminate) => Interrupt::Terminate,
        }
    }
}

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
            Interrupt::CtrlC => exit::INTERRUPTED,
            Interrupt::Terminate => exit::TERMINATED,
        }
    }
}

/// How a guarded piece of work ended.
pub enum Guarded<T> {
    Finished(T),
    /// Ctrl-C or SIGTERM.
    Interrupted(Interrupt),
    /// `q` at a pause in step mode.
    Quit,
}

/// How long work may take to wind down after `q`: it stops at its next pause by itself (every
/// pause answers `q` from then on) and releases what it holds on the way out.
const QUIT_GRACE: Duration = Duration::from_secs(10);

/// Whether the session pauses in step mode (`run`, `serve`) or never (`check` is headless).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Live,
    Headless,
}

/// What every command that runs scenarios or services shares.
pub struct Session {
    pub lang: Lang,
    pub color: bool,
    pub format: FormatArg,
    /// Show the quiz's model answers (`--answers`).
    pub answers: bool,
    /// Grade the predictions and print the score (`--quiz`).
    pub quiz: bool,
    /// Show what each step executed (`--show-sql`, `--show-commands`).
    pub show_sql: bool,
    pub show_commands: bool,
    pub library: Library,
    /// Pauses in step mode (`--step`, live only); never pauses otherwise.
    pub gate: Gate,
    /// How scenarios run in this call: `--keep`, `--toxiproxy-url`, proxies to clean.
    pub config: RunConfig,
    options: ServerOptions,
    /// Locked only while waiting for a signal; never contended, but `guarded` takes `&self` so
    /// the work it guards can borrow the session too.
    interrupts: tokio::sync::Mutex<Interrupts>,
}

impl Session {
    /// Starts listening for signals, then resolves language, colour, scenario files and gate.
    pub fn open(global: &Global, mode: Mode) -> Result<Session, Failure> {
        let interrupts = Interrupts::listen();
        let toxiproxy_url = toxiproxy_url(global)?;
        let lang = lang(global);
        let color = color(global);
        let library = library()?;
        let gate = match (mode, global.step, global.quiz) {
            (Mode::Headless, _, _) => Gate::default(),
            (Mode::Live, true, _) => Gate::stepping_with(
                stdin(),
                prompt(&library, lang),
                Options {
                    viewer: Some(viewer(&library, lang, color, global)),
                    screen: screen(),
                },
            ),
            (Mode::Live, false, true) => Gate::quizzing(stdin(), prompt(&library, lang), screen()),
            (Mode::Live, false, false) => Gate::default(),
        };
        Ok(Session {
            lang,
            color,
            format: global.format,
            answers: global.answers,
            quiz: global.quiz,
            show_sql: global.show_sql,
            show_commands: global.show_commands,
            library,
            gate,
            config: RunConfig {
                keep: global.keep && mode == Mode::Live,
                toxiproxy_url,
                proxies: Default::default(),
                settings: Default::default(),
            },
            options: ServerOptions::new(global.database_url.clone(), global.redis_url.clone()),
            interrupts: tokio::sync::Mutex::new(interrupts),
        })
    }

    /// The live renderer on stdout.
    pub fn sink(&self) -> SharedSink {
        let renderer = match self.format {
            FormatArg::Text | FormatArg::Junit => Renderer::Text(
                TextRenderer::new(self.library.texts.clone(), self.lang, self.color)
                    .with_answers(self.answers)
                    .with_executed(self.show_sql, self.show_commands),
            ),
            FormatArg::Json => Renderer::Json(
                JsonRenderer::new(self.library.texts.clone(), self.lang).with_answers(self.answers),
            ),
        };
        // Never blocks on a slow reader: the story must not depend on how fast it is read.
        Arc::new(parking_lot::Mutex::new(WriteSink::new(
            renderer,
            crate::output::QueuedStdout,
        )))
    }

    /// How many steps a scenario's run has, counted in its expected narrative (`None` before
    /// its first `--bless`, or when the file does not count its steps in order).
    pub fn expected_steps(&self, scenario: &str) -> Option<u32> {
        let narrative = self.library.expected_narrative(scenario, Lang::En)?;
        lab_core::render::count_steps(&narrative)
    }

    /// A narrator that renders live and pauses at the session's gate.
    pub fn live_narrator(&self, sink: &SharedSink) -> Narrator {
        Narrator::new(Some(sink.clone()), self.gate.clone())
    }

    /// Starts (or connects to) the servers, with a spinner on stderr when it is a terminal.
    /// `Ok(Err(signal))`: Ctrl-C or SIGTERM came first; whatever was half started is gone.
    pub async fn start_servers(&self, needs: Needs) -> Result<Result<Servers, Interrupt>, Failure> {
        // A given URL is always checked for its form (by `Servers::start`), and connected to
        // when a selected scenario needs that server. One that nothing needs is said to be
        // unused, so an unreachable one is not mistaken for a working one.
        for (given, needed, flag, server) in [
            (
                &self.options.database_url,
                needs.postgres,
                "--database-url",
                "PostgreSQL",
            ),
            (&self.options.redis_url, needs.redis, "--redis-url", "Redis"),
        ] {
            if given.is_some() && !needed {
                eprintln!(
                    "lab: note: {flag} is not used: no selected scenario needs {server} \
                     (`lab doctor` lists what each scenario needs)"
                );
            }
        }
        let spinner = Spinner::after(
            SPINNER_DELAY,
            self.color,
            self.library
                .texts
                .render(COMMON, self.lang, &Msg::new("cli.starting")),
        );
        // Nothing pauses while servers start: only a signal can cut this short.
        let started = self
            .guarded_with(Servers::start(&self.options, needs), &Gate::default())
            .await;
        spinner.clear().await;
        match started {
            Guarded::Finished(Ok(servers)) => {
                report_leftovers(&servers.leftovers);
                Ok(Ok(servers))
            }
            // A URL that is not a URL is a usage error, not an unreachable server.
            Guarded::Finished(Err(e @ lab_infra::InfraError::BadUrl { .. })) => Err(Failure {
                code: exit::USAGE,
                error: e.into(),
            }),
            Guarded::Finished(Err(e)) => Err(Failure::environment(e)),
            Guarded::Interrupted(signal) => Ok(Err(signal)),
            // Nothing pauses here, so nothing can quit.
            Guarded::Quit => Ok(Err(Interrupt::CtrlC)),
        }
    }

    /// Runs `work` until it finishes, Ctrl-C or SIGTERM arrives, or the learner quits step mode.
    /// After a signal the work is dropped at once (its services stop, its connections close);
    /// after `q` it gets [`QUIT_GRACE`] to end by itself. Either way, [`Session::close`] then
    /// cleans up what the runs left behind.
    pub async fn guarded<T>(&self, work: impl Future<Output = T>) -> Guarded<T> {
        self.guarded_with(work, &self.gate).await
    }

    async fn guarded_with<T>(&self, work: impl Future<Output = T>, gate: &Gate) -> Guarded<T> {
        let mut interrupts = self.interrupts.lock().await;
        tokio::pin!(work);
        tokio::select! {
            // Work that has finished wins over a signal that arrives in the same instant: its
            // cleanup has run, and its result is the true one.
            biased;
            result = &mut work => Guarded::Finished(result),
            signal = interrupts.recv() => Guarded::Interrupted(signal),
            _ = gate.quit_requested() => {
                tokio::select! {
                    _ = tokio::time::timeout(QUIT_GRACE, &mut work) => Guarded::Quit,
                    signal = interrupts.recv() => Guarded::Interrupted(signal),
                }
            }
        }
    }

    /// With `--keep` on throwaway servers, the data would vanish with the servers: keep them up
    /// until the learner presses Enter in a terminal, or until stdin closes when it is not one
    /// (`lab run x --keep < fifo`), or Ctrl-C; then say that they stopped.
    pub async fn hold_kept_servers(&self, servers: &Servers) {
        let throwaway = servers
            .postgres
            .as_ref()
            .is_some_and(|p| p.origin == Origin::Throwaway)
            || servers
                .redis
                .as_ref()
                .is_some_and(|r| r.origin == Origin::Throwaway);
        if !self.config.keep || !throwaway {
            return;
        }
        let terminal = std::io::stdin().is_terminal();
        eprintln!(
            "lab: the throwaway servers stay up for inspection until {}",
            if terminal {
                "you press Enter"
            } else {
                "stdin closes"
            }
        );
        let mut stdin = BufReader::new(tokio::io::stdin());
        let wait = async {
            let mut line = String::new();
            // A terminal: one line. Anything else: to its end.
            while stdin.read_line(&mut line).await.is_ok_and(|n| n > 0) && !terminal {
                line.clear();
            }
        };
        let _ = self.guarded_with(wait, &Gate::default()).await;
        eprintln!(
            "lab: the throwaway servers stopped, and the kept data with them (pass \
             --database-url/--redis-url to keep it on servers of yours)"
        );
    }

    /// Ends the session: deletes proxies a cancelled run left on a given Toxiproxy, drops what
    /// runs that did not finish left behind (unless `--keep`), and stops the servers.
    pub async fn close(&self, servers: Servers) {
        self.config.proxies.delete_left_over().await;
        if !self.config.keep {
            servers.clean_abandoned_runs().await;
        }
        servers.shutdown().await;
    }
}

/// How long servers may take to start before a spinner says that they are starting: a start
/// from the template, against a warm machine, is over before anyone would read it, and a
/// spinner that flashes for 100 ms is noise on a projector.
const SPINNER_DELAY: Duration = Duration::from_millis(300);

/// A spinner on stderr that appears only if what it waits for is still going after a delay,
/// and only on a terminal: scripts, CI and tests (which compare stderr byte for byte) never see
/// it.
struct Spinner {
    bar: ProgressBar,
    /// Shows the bar once the delay is over; aborted when the wait ends first.
    show: tokio::task::JoinHandle<()>,
}

impl Spinner {
    /// `color`: a spinner is made of escape codes, so NO_COLOR and `--color never` turn it off
    /// too.
    fn after(delay: Duration, color: bool, message: String) -> Spinner {
        // Hidden until the delay is over: drawing nothing costs nothing.
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
        bar.set_style(ProgressStyle::with_template("{spinner} {msg}").expect("valid template"));
        bar.set_message(message);
        let shown = bar.clone();
        let terminal = color && std::io::stderr().is_terminal();
        let show = tokio::spawn(async move {
            if !terminal {
                return;
            }
            tokio::time::sleep(delay).await;
            shown.set_draw_target(ProgressDrawTarget::stderr());
            shown.enable_steady_tick(Duration::from_millis(100));
        });
        Spinner { bar, show }
    }

    /// Stops it, and takes it off the screen if it was ever shown. The task is awaited after
    /// the abort: one that was already past its sleep (on another worker thread) must not
    /// start the ticking after the bar is cleared.
    async fn clear(self) {
        self.show.abort();
        let _ = self.show.await;
        self.bar.finish_and_clear();
    }
}

/// Says what a killed `lab` had left behind and this one removed.
pub fn report_leftovers(removed: &[std::path::PathBuf]) {
    for dir in removed {
        eprintln!(
            "{}",
            t(Msg::new("removed_leftover").arg("dir", dir.display().to_string()))
        );
    }
}

/// `--toxiproxy-url` (or `TOXIPROXY_URL`; empty counts as unset), checked before anything
/// starts: a URL that is not an http(s) URL is a usage error.
pub fn toxiproxy_url(global: &Global) -> Result<Option<String>, Failure> {
    let Some(given) = global
        .toxiproxy_url
        .as_deref()
        .filter(|u| !u.trim().is_empty())
    else {
        return Ok(None);
    };
    let bad = |reason: &str| {
        Failure::usage(t(Msg::new("toxiproxy_url")
            .arg("url", given)
            .arg("reason", reason)))
    };
    let parsed = url::Url::parse(given).map_err(|e| bad(&e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(bad(&t("url_scheme")));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(bad(&t("url_no_host")));
    }
    Ok(Some(given.trim_end_matches('/').to_string()))
}

/// Where step mode and quizzes read the learner's answers.
fn stdin() -> BufReader<tokio::io::Stdin> {
    BufReader::new(tokio::io::stdin())
}

/// The footers of `--step` and `--quiz`, in the learner's language: where the run is (`step
/// 3/8`, or `step 3` when the count is not known) and the keys of this pause.
fn prompt(library: &Library, lang: Lang) -> lab_core::gate::Prompt {
    let texts = library.texts.clone();
    Box::new(move |place: Place| {
        // The footer goes to stderr: the step it follows must be on the screen first.
        crate::output::drain();
        let key = match place.pause {
            Pause::Step => "gate.step",
            Pause::Service => "gate.service",
            Pause::Predict => "gate.predict",
            Pause::Reveal => "gate.reveal",
        };
        let keys = texts.render(COMMON, lang, &Msg::new(key));
        // Before the first step (a service that pauses while the story is set up) there is no
        // progress to tell.
        if place.step == 0 {
            return texts.render(
                COMMON,
                lang,
                &Msg::new("gate.footer_bare").arg("keys", keys),
            );
        }
        let progress = match place.of {
            Some(of) => Msg::new("gate.progress")
                .arg("step", place.step)
                .arg("of", of),
            None => Msg::new("gate.progress_unknown").arg("step", place.step),
        };
        let progress = texts.render(COMMON, lang, &progress);
        texts.render(
            COMMON,
            lang,
            &Msg::new("gate.footer")
                .arg("progress", progress)
                .arg("keys", keys),
        )
    })
}

/// What `s`, `d` and `b` show at a pause: the same renderers as the narrative and `--diagram`,
/// in the learner's language and colours, on the events recorded so far.
fn viewer(library: &Library, lang: Lang, color: bool, global: &Global) -> Viewer {
    let texts = library.texts.clone();
    let (show_sql, show_commands) = (global.show_sql, global.show_commands);
    Box::new(move |look: Look, sofar: &Sofar| {
        let events = &sofar.events;
        let renderer =
            || TextRenderer::new(texts.clone(), lang, color).with_executed(show_sql, show_commands);
        match look {
            Look::State => renderer().state_so_far(events, &sofar.now),
            Look::Back(n) => renderer().step_again(events, n),
            Look::Diagram => {
                let heading = texts.render(COMMON, lang, &Msg::new("gate.look.diagram"));
                let picture = swimlanes(&texts, lang, events);
                let picture = if picture.is_empty() {
                    format!(
                        "    {}\n",
                        texts.render(COMMON, lang, &Msg::new("gate.look.no_calls"))
                    )
                } else {
                    picture
                };
                format!("\n── {heading} ──\n{picture}")
            }
        }
    })
}

/// Where the footers go (stderr), and so how they leave the screen: erased on a terminal once
/// answered (by an echoed Enter when stdin is that terminal too), ending their line otherwise.
fn screen() -> Screen {
    fn columns() -> usize {
        console::Term::stderr().size().1.into()
    }
    if std::io::stderr().is_terminal() {
        Screen::Terminal {
            echo: std::io::stdin().is_terminal(),
            columns,
        }
    } else {
        Screen::Lines
    }
}

/// Says that lab was interrupted and everything is cleaned up; the exit code for it.
pub fn interrupted(signal: Interrupt) -> u8 {
    crate::output::drain();
    // A Ctrl-C at a pause leaves the cursor on the step footer (after the terminal's `^C`):
    // clear that line first, so the message does not run into it. Every other line on stderr
    // has ended, so on a terminal this clears nothing else.
    if std::io::stderr().is_terminal() {
        eprint!("\r\x1b[2K");
    }
    eprintln!("{}", t("interrupted"));
    signal.exit_code()
}

/// Says that the learner stopped step mode and everything is cleaned up; the exit code for it
/// (the same as Ctrl-C: the run did not get to its facts).
pub fn quit() -> u8 {
    crate::output::drain();
    eprintln!("{}", t("stopped"));
    exit::INTERRUPTED
}
