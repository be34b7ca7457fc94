//! One [`Session`] per command that runs scenarios or services: the language and colours, the
//! scenario files, the step gate and the live renderer, and the one lifecycle every such command
//! goes through, so that Ctrl-C, SIGTERM or `q` in step mode stop its work cleanly instead of
//! killing the process halfway.
//!
//! ```text
//! Session::open(options, library, mode)     signals are listened for from here on
//! session.with_servers(needs, work, after)
//!   ├─ start the servers        a spinner after 300 ms, on a terminal; a signal stops cleanly
//!   ├─ work(&servers)           guarded: a signal drops it; `q` lets it end at its next pause
//!   ├─ after(&servers, ended)   unguarded: what must happen however the work ended
//!   └─ close                    proxies left on a given Toxiproxy, abandoned runs, servers
//! ```
//!
//! A session is built from typed [`SessionOptions`], never from the command line's own types:
//! the commands turn flags into options (`commands/mod.rs`), and nothing here knows clap.

use std::future::Future;
use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use lab_core::gate::{Flush, Look, Options, Pause, Place, Screen, Sofar, Viewer};
use lab_core::narrator::SharedSink;
use lab_core::render::{JsonRenderer, Renderer, TextRenderer, WriteSink, swimlanes};
use lab_core::text::COMMON;
use lab_core::{Bounds, Gate, Lang, Msg, Narrator};
use lab_infra::{Needs, Origin, ServerOptions, Servers};
use lab_scenarios::{Library, ProxyLedger, RunConfig, Settings};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use crate::exit::{Failure, Interrupt};
use crate::words::t;

/// How the narrative is written on stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Text for people, in the session's language and colours.
    Text,
    /// One JSON object per line.
    Json,
}

/// Whether the session pauses in step mode (`run`, `serve`) or never (`check` is headless).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Live,
    Headless,
}

/// What a session is made of, typed.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    pub lang: Lang,
    /// Colour on stdout (already resolved from `--color`, `NO_COLOR` and the terminal).
    pub color: bool,
    pub format: Format,
    /// Pause after every step, inside services and before answers (`--step`).
    pub step: bool,
    /// Ask the predictions and grade them (`--quiz`).
    pub quiz: bool,
    /// Show the quiz's model answers (`--answers`).
    pub answers: bool,
    /// Show what each step executed (`--show-sql`, `--show-commands`).
    pub show_sql: bool,
    pub show_commands: bool,
    /// Keep each run's schema and keys (`--keep`; live sessions only).
    pub keep: bool,
    /// Given servers, or throwaway ones.
    pub servers: ServerOptions,
    /// A Toxiproxy to create the fault proxies on (checked), instead of the embedded one.
    pub toxiproxy_url: Option<String>,
}

/// How a command's guarded work ended.
pub enum Ended<T> {
    Finished(Result<T, Failure>),
    /// Ctrl-C or SIGTERM.
    Interrupted(Interrupt),
    /// `q` at a pause in step mode.
    Quit,
}

impl<T> Ended<T> {
    /// The work's own result, or the failure that a signal or `q` is.
    pub fn into_result(self) -> Result<T, Failure> {
        match self {
            Ended::Finished(result) => result,
            Ended::Interrupted(signal) => Err(Failure::interrupted(signal)),
            Ended::Quit => Err(Failure::quit()),
        }
    }
}

/// How long work may take to wind down after `q`: it stops at its next pause by itself (every
/// pause answers `q` from then on) and releases what it holds on the way out.
const QUIT_GRACE: Duration = Duration::from_secs(10);

/// How long servers may take to start before a spinner says that they are starting: a start
/// from the template, against a warm machine, is over before anyone would read it, and a
/// spinner that flashes for 100 ms is noise on a projector.
const SPINNER_DELAY: Duration = Duration::from_millis(300);

/// What every command that runs scenarios or services shares.
pub struct Session {
    pub options: SessionOptions,
    pub library: Library,
    /// Pauses in step mode (`--step`, live only); never pauses otherwise.
    pub gate: Gate,
    /// How scenarios run in this call: `--keep`, `--toxiproxy-url`, knobs, proxies to clean.
    pub config: RunConfig,
    interrupts: Interrupts,
    /// Set while a signal is how the guarded work ends rather than an interruption of it: see
    /// [`Session::signal_ends_the_work`].
    signal_ends_work: AtomicBool,
}

impl Session {
    /// Starts listening for signals, then builds the gate for `mode`.
    pub fn open(options: SessionOptions, library: Library, mode: Mode) -> Session {
        let interrupts = Interrupts::of_this_process();
        let gate = match (mode, options.step, options.quiz) {
            (Mode::Headless, _, _) | (Mode::Live, false, false) => Gate::default(),
            (Mode::Live, true, _) => Gate::stepping_with(
                stdin(),
                prompt(&library, options.lang),
                Options {
                    viewer: Some(viewer(&library, &options)),
                    screen: screen(),
                    flush: Some(flush()),
                },
            ),
            (Mode::Live, false, true) => Gate::quizzing(
                stdin(),
                prompt(&library, options.lang),
                Options {
                    viewer: None,
                    screen: screen(),
                    flush: Some(flush()),
                },
            ),
        };
        let config = RunConfig {
            keep: options.keep && mode == Mode::Live,
            toxiproxy_url: options.toxiproxy_url.clone(),
            proxies: ProxyLedger::default(),
            settings: Settings::default(),
        };
        Session {
            options,
            library,
            gate,
            config,
            interrupts,
            signal_ends_work: AtomicBool::new(false),
        }
    }

    /// The session's knobs (`--set`), checked already.
    pub fn with_settings(mut self, settings: Settings) -> Session {
        self.config.settings = settings;
        self
    }

    pub fn lang(&self) -> Lang {
        self.options.lang
    }

    pub fn color(&self) -> bool {
        self.options.color
    }

    pub fn format(&self) -> Format {
        self.options.format
    }

    /// The live renderer on stdout.
    pub fn sink(&self) -> SharedSink {
        let texts = self.library.texts.clone();
        let options = &self.options;
        let renderer = match options.format {
            Format::Text => Renderer::Text(
                TextRenderer::new(texts, options.lang, options.color)
                    .with_answers(options.answers)
                    .with_executed(options.show_sql, options.show_commands),
            ),
            Format::Json => {
                Renderer::Json(JsonRenderer::new(texts, options.lang).with_answers(options.answers))
            }
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

    /// A live narrator within `bounds` (`lab serve`'s, which runs until it is stopped).
    pub fn live_narrator_within(&self, sink: &SharedSink, bounds: Bounds) -> Narrator {
        Narrator::bounded(Some(sink.clone()), self.gate.clone(), bounds)
    }

    /// Resolves when Ctrl-C or SIGTERM has come (at once, if one came already).
    pub async fn interrupted(&self) -> Interrupt {
        self.interrupts.next().await
    }

    /// Says whether, from now on, a signal is how the guarded work ends (`true`: the web view
    /// once every scenario has run, which listens for it with [`Session::interrupted`] and
    /// returns the runs' verdict) or an interruption of it (`false`, the default). While it is
    /// `true` the guard leaves the signal to the work and waits for the work's answer instead
    /// of racing it: the signal reaches both from the listener's thread, and the guard could
    /// see it first.
    pub fn signal_ends_the_work(&self, ends: bool) {
        self.signal_ends_work.store(ends, Ordering::SeqCst);
    }

    /// The lifecycle every command that needs servers goes through: starts (or connects to) the
    /// servers `needs` names, runs `work` on them guarded, then `after` (however the work ended,
    /// with the servers still up), then closes. A signal while the servers start ends it
    /// cleanly too, without `work` or `after`.
    pub async fn with_servers<T, U>(
        &self,
        needs: Needs,
        work: impl AsyncFnOnce(&Servers) -> Result<T, Failure>,
        after: impl AsyncFnOnce(&Servers, Ended<T>) -> Result<U, Failure>,
    ) -> Result<U, Failure> {
        let servers = match self.start_servers(needs).await? {
            Ok(servers) => servers,
            Err(signal) => return Err(Failure::interrupted(signal)),
        };
        let ended = self.guarded(work(&servers)).await;
        let result = after(&servers, ended).await;
        self.close(servers).await;
        result
    }

    /// [`Session::with_servers`] for work that needs nothing after it: its result, or the
    /// failure a signal or `q` is. With `--keep` on throwaway servers, they stay up for
    /// inspection once the work has finished.
    pub async fn run_with_servers<T>(
        &self,
        needs: Needs,
        work: impl AsyncFnOnce(&Servers) -> Result<T, Failure>,
    ) -> Result<T, Failure> {
        self.with_servers(needs, work, async |servers, ended| {
            if matches!(ended, Ended::Finished(Ok(_))) {
                self.hold_kept_servers(servers).await;
            }
            ended.into_result()
        })
        .await
    }

    /// Starts (or connects to) the servers, with a spinner on stderr when it is a terminal.
    /// `Ok(Err(signal))`: Ctrl-C or SIGTERM came first; whatever was half started is gone.
    async fn start_servers(&self, needs: Needs) -> Result<Result<Servers, Interrupt>, Failure> {
        self.note_unused_urls(needs).await;
        match self.start_servers_once(needs).await {
            Err(StartFailure::Missing(error)) if offer_servers_install(&error).await => {
                crate::commands::servers::install().await?;
                self.start_servers_once(needs).await.map_err(Failure::from)
            }
            started => started.map_err(Failure::from),
        }
    }

    /// One attempt of [`Session::start_servers`].
    async fn start_servers_once(
        &self,
        needs: Needs,
    ) -> Result<Result<Servers, Interrupt>, StartFailure> {
        let spinner = Spinner::after(
            SPINNER_DELAY,
            self.options.color,
            self.library
                .texts
                .render(COMMON, self.options.lang, &Msg::new("cli.starting")),
        );
        // Nothing pauses while servers start: only a signal can cut this short.
        let started = self
            .guarded_with(
                Servers::start(&self.options.servers, needs),
                &Gate::default(),
            )
            .await;
        spinner.clear().await;
        match started {
            Guarded::Finished(Ok(servers)) => {
                report_leftovers(&servers.leftovers).await;
                Ok(Ok(servers))
            }
            Guarded::Finished(Err(e @ lab_infra::InfraError::Missing { .. })) => {
                Err(StartFailure::Missing(e))
            }
            // A URL that is not a URL is a usage error, not an unreachable server.
            Guarded::Finished(Err(e)) => Err(StartFailure::Other(e.into())),
            Guarded::Interrupted(signal) => Ok(Err(signal)),
            // Nothing pauses here, so nothing can quit.
            Guarded::Quit => Ok(Err(Interrupt::CtrlC)),
        }
    }

    /// A given URL is always checked for its form (by `Servers::start`), and connected to when
    /// a selected scenario needs that server. One that nothing needs is said to be unused, so
    /// an unreachable one is not mistaken for a working one.
    async fn note_unused_urls(&self, needs: Needs) {
        let servers = &self.options.servers;
        for (given, needed, flag, server) in [
            (
                servers.database_url.is_some(),
                needs.postgres,
                "--database-url",
                "PostgreSQL",
            ),
            (
                servers.redis_url.is_some(),
                needs.redis,
                "--redis-url",
                "Redis",
            ),
        ] {
            if given && !needed {
                crate::output::drained().await;
                eprintln!(
                    "{}",
                    t(Msg::new("url_unused")
                        .arg("flag", flag)
                        .arg("server", server))
                );
            }
        }
    }

    /// Runs `work` until it finishes, Ctrl-C or SIGTERM arrives, or the learner quits step mode.
    /// After a signal the work is dropped at once (its services stop, its connections close);
    /// after `q` it gets [`QUIT_GRACE`] to end by itself.
    async fn guarded<T>(&self, work: impl Future<Output = Result<T, Failure>>) -> Ended<T> {
        match self.guarded_with(work, &self.gate).await {
            Guarded::Finished(result) => Ended::Finished(result),
            Guarded::Interrupted(signal) => Ended::Interrupted(signal),
            Guarded::Quit => Ended::Quit,
        }
    }

    async fn guarded_with<T>(&self, work: impl Future<Output = T>, gate: &Gate) -> Guarded<T> {
        tokio::pin!(work);
        tokio::select! {
            // Work that has finished wins over a signal that arrives in the same instant: its
            // cleanup has run, and its result is the true one. (Work that listens for the
            // signal itself says so with `signal_ends_the_work`: biased alone cannot promise
            // it wins, since the signal may land between the two polls.)
            biased;
            result = &mut work => Guarded::Finished(result),
            signal = self.interrupted() => {
                if self.signal_ends_work.load(Ordering::SeqCst) {
                    Guarded::Finished((&mut work).await)
                } else {
                    Guarded::Interrupted(signal)
                }
            }
            _ = gate.quit_requested() => {
                tokio::select! {
                    _ = tokio::time::timeout(QUIT_GRACE, &mut work) => Guarded::Quit,
                    signal = self.interrupted() => Guarded::Interrupted(signal),
                }
            }
        }
    }

    /// With `--keep` on throwaway servers, the data would vanish with the servers: keep them up
    /// until the learner presses Enter in a terminal, or until stdin closes when it is not one
    /// (`lab run x --keep < fifo`), or Ctrl-C; then say that they stopped.
    async fn hold_kept_servers(&self, servers: &Servers) {
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
        crate::output::drained().await;
        eprintln!(
            "{}",
            t(if terminal {
                "kept_until_enter"
            } else {
                "kept_until_eof"
            })
        );
        let mut stdin = BufReader::new(tokio::io::stdin());
        let wait = async {
            let mut line = String::new();
            // A terminal: one line. Anything else: to its end.
            while stdin.read_line(&mut line).await.is_ok_and(|n| n > 0) && !terminal {
                line.clear();
            }
        };
        tokio::select! {
            _ = wait => {}
            _ = self.interrupted() => {}
        }
        eprintln!("{}", t("kept_stopped"));
    }

    /// Ends the session: deletes proxies a cancelled run left on a given Toxiproxy, drops what
    /// runs that did not finish left behind (unless `--keep`), and stops the servers.
    async fn close(&self, servers: Servers) {
        self.config.proxies.delete_left_over().await;
        if !self.config.keep {
            servers.clean_abandoned_runs().await;
        }
        servers.shutdown().await;
    }
}

/// How a piece of guarded work ended (of any output: starting the servers is guarded too).
enum Guarded<T> {
    Finished(T),
    Interrupted(Interrupt),
    Quit,
}

/// Ctrl-C and SIGTERM, listened for from the start of a command: a signal that arrives while the
/// servers are still starting must also lead to a clean stop, not to the default "die at once".
/// The first one is kept, so whoever asks later (the guard, a web view that is done, `--keep`'s
/// wait) hears of it too. One listener per process, installed by `main` as soon as the runtime
/// exists, for the commands that run scenarios or services.
#[derive(Clone)]
pub struct Interrupts {
    first: watch::Receiver<Option<Interrupt>>,
}

static INTERRUPTS: std::sync::OnceLock<Interrupts> = std::sync::OnceLock::new();

impl Interrupts {
    /// Starts listening (once per process; again, it does nothing). Must be called inside the
    /// runtime's context.
    pub fn install() {
        INTERRUPTS.get_or_init(Interrupts::listen);
    }

    /// The process's listener, installed now if `main` has not.
    fn of_this_process() -> Interrupts {
        INTERRUPTS.get_or_init(Interrupts::listen).clone()
    }

    fn listen() -> Interrupts {
        // Registered here, before anything awaits: from now on a signal is ours to handle.
        let mut interrupt = signal(SignalKind::interrupt()).ok();
        let mut terminate = signal(SignalKind::terminate()).ok();
        let (tell, first) = watch::channel(None);
        tokio::spawn(async move {
            async fn next(signal: &mut Option<tokio::signal::unix::Signal>) {
                match signal {
                    Some(signal) => drop(signal.recv().await),
                    None => std::future::pending().await,
                }
            }
            loop {
                let came = tokio::select! {
                    _ = next(&mut interrupt) => Interrupt::CtrlC,
                    _ = next(&mut terminate) => Interrupt::Terminate,
                };
                tell.send_if_modified(|first| first.get_or_insert(came) == &came);
            }
        });
        Interrupts { first }
    }

    async fn next(&self) -> Interrupt {
        let mut first = self.first.clone();
        match first.wait_for(Option::is_some).await {
            Ok(signal) => signal.unwrap_or(Interrupt::CtrlC),
            // The listener is gone only with the runtime.
            Err(_) => std::future::pending().await,
        }
    }
}

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
pub async fn report_leftovers(removed: &[std::path::PathBuf]) {
    if !removed.is_empty() {
        crate::output::drained().await;
    }
    for dir in removed {
        eprintln!(
            "{}",
            t(Msg::new("removed_leftover").arg("dir", dir.display().to_string()))
        );
    }
}

/// Where step mode and quizzes read the learner's answers.
fn stdin() -> BufReader<tokio::io::Stdin> {
    BufReader::new(tokio::io::stdin())
}

/// Before a footer: everything the narrative queued is out first.
fn flush() -> Flush {
    Box::new(|| Box::pin(crate::output::drained()))
}

/// The footers of `--step` and `--quiz`, in the learner's language: where the run is (`step
/// 3/8`, or `step 3` when the count is not known) and the keys of this pause.
fn prompt(library: &Library, lang: Lang) -> lab_core::gate::Prompt {
    let texts = library.texts.clone();
    Box::new(move |place: Place| {
        let render = |msg: Msg| texts.render(COMMON, lang, &msg);
        let key = match place.pause {
            Pause::Step => "gate.step",
            Pause::Service => "gate.service",
            Pause::Predict => "gate.predict",
            Pause::Reveal => "gate.reveal",
        };
        let keys = render(Msg::new(key));
        // Before the first step (a service that pauses while the story is set up) there is no
        // progress to tell.
        if place.step == 0 {
            return render(Msg::new("gate.footer_bare").arg("keys", keys));
        }
        let progress = match place.of {
            Some(of) => Msg::new("gate.progress")
                .arg("step", place.step)
                .arg("of", of),
            None => Msg::new("gate.progress_unknown").arg("step", place.step),
        };
        let progress = render(progress);
        render(
            Msg::new("gate.footer")
                .arg("progress", progress)
                .arg("keys", keys),
        )
    })
}

/// What `s`, `d` and `b` show at a pause: the same renderers as the narrative and `--diagram`,
/// in the learner's language and colours, on the events recorded so far.
fn viewer(library: &Library, options: &SessionOptions) -> Viewer {
    let texts = library.texts.clone();
    let (lang, color) = (options.lang, options.color);
    let (show_sql, show_commands) = (options.show_sql, options.show_commands);
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

/// Why the servers did not start: programs missing (which `lab servers install` may fix), or
/// anything else.
enum StartFailure {
    Missing(lab_infra::InfraError),
    Other(Failure),
}

impl From<StartFailure> for Failure {
    fn from(failure: StartFailure) -> Failure {
        match failure {
            StartFailure::Missing(error) => error.into(),
            StartFailure::Other(failure) => failure,
        }
    }
}

/// On a terminal, when the missing servers are what `lab servers install` brings, asks whether
/// to install them now; `false` (no question) anywhere else, so a script gets the error and
/// its exit code at once, before anything has run.
async fn offer_servers_install(error: &lab_infra::InfraError) -> bool {
    use std::io::IsTerminal;
    let lab_infra::InfraError::Missing { missing, get } = error else {
        return false;
    };
    if !get.contains(lab_infra::binaries::SERVERS_INSTALL)
        || !std::io::stdin().is_terminal()
        || !std::io::stderr().is_terminal()
    {
        return false;
    }
    let Some(dir) = lab_infra::cached_servers::dir() else {
        return false;
    };
    crate::output::drained().await;
    eprint!(
        "{}",
        t(Msg::new("servers.offer")
            .arg("missing", missing.as_str())
            .arg("dir", dir.display().to_string()))
    );
    let answer = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    })
    .await;
    matches!(answer, Ok(Ok(line)) if matches!(line.trim().to_lowercase().as_str(), "y" | "yes" | "д" | "да"))
}
