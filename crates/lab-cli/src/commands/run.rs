//! `lab run NAME...`: run scenarios, narrated, on one set of servers.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use lab_core::narrator::SharedSink;
use lab_core::render::{mermaid, swimlanes};
use lab_core::text::COMMON;
use lab_core::{Event, Gate, Lang, Msg, Narrator};
use lab_infra::url::redact;
use lab_scenarios::{KeptRun, ScenarioError};

use super::page::page;
use crate::cli::{ExportArg, FormatArg, Global, exit};
use crate::session::{self, Failure, Guarded, Mode, Session};
use crate::web::hub::{Hub, PauseKind, WebSink};
use crate::web::{self, WebServer};

/// Tells how to look at a kept run (on stderr: run ids are not part of the narrative). A
/// password in a URL is not printed; psql asks for it (or reads PGPASSWORD).
fn print_kept(kept: &KeptRun) {
    // After the narrative of the run it describes.
    crate::output::drain();
    eprintln!("lab: kept schema {}", kept.schema);
    if let Some(url) = &kept.pg_url {
        eprintln!(
            "  psql '{}' -c '\\dt' -c 'SELECT * FROM tasks' -c 'SELECT * FROM reports'",
            redact(url)
        );
    }
    if let Some(url) = &kept.redis_url {
        eprintln!("lab: kept keys {}*", kept.prefix);
        eprintln!(
            "  redis-cli -u '{}' --scan --pattern '{}*'",
            redact(url),
            kept.prefix
        );
    }
}

/// The learner's predictions in this call: how many were asked and how many answered right.
#[derive(Default)]
struct Score {
    asked: usize,
    right: usize,
}

impl Score {
    /// Grades the answers typed during one scenario against its answer key.
    fn add(&mut self, session: &Session, report: &lab_scenarios::RunReport) {
        let mut asked: Option<&str> = None;
        for event in &report.events {
            match event {
                Event::Predict { prefix } => {
                    self.asked += 1;
                    asked = Some(prefix);
                }
                Event::LearnerAnswer { answer } => {
                    let graded = asked.take().and_then(|prefix| {
                        session
                            .library
                            .texts
                            .grade(report.name, session.lang, prefix, answer)
                    });
                    self.right += usize::from(graded == Some(true));
                }
                _ => {}
            }
        }
    }

    fn print(&self, session: &Session) {
        match session.format {
            FormatArg::Json => say!(
                "{}",
                serde_json::json!({"event": "score", "right": self.right, "asked": self.asked})
            ),
            FormatArg::Text | FormatArg::Junit => {
                let line = session.library.texts.render(
                    COMMON,
                    session.lang,
                    &Msg::new("label.score")
                        .arg("right", self.right)
                        .arg("asked", self.asked),
                );
                say!("\n{line}");
            }
        }
    }
}

/// What to draw or write besides the narrative.
pub struct Pictures {
    pub diagram: bool,
    pub artifacts: Option<PathBuf>,
    pub export: Option<ExportArg>,
}

impl Pictures {
    /// After one scenario: the swimlanes, the artifacts, the exported page.
    fn after(&self, session: &Session, report: &lab_scenarios::RunReport) -> Result<(), Failure> {
        let texts = &session.library.texts;
        if self.diagram && self.export.is_none() {
            say!("\n{}", swimlanes(texts, session.lang, &report.events));
        }
        if let Some(dir) = &self.artifacts {
            write_artifacts(session, report, &dir.join(report.name)).map_err(|e| {
                Failure::environment(anyhow::anyhow!(
                    "cannot write artifacts to {}: {e}",
                    dir.display()
                ))
            })?;
        }
        if self.export == Some(ExportArg::Md) {
            say!("{}", page(&session.library.texts, session.lang, report));
        }
        Ok(())
    }
}

/// The event log, the Mermaid diagram, the facts and the table snapshots of one run.
fn write_artifacts(
    session: &Session,
    report: &lab_scenarios::RunReport,
    dir: &std::path::Path,
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let texts = session.library.texts.clone();
    let mut json = lab_core::render::JsonRenderer::new(texts.clone(), session.lang);
    let log: String = report.events.iter().map(|e| json.render(e)).collect();
    std::fs::write(dir.join("events.jsonl"), log)?;
    let states: String = report
        .events
        .iter()
        .filter(|e| matches!(e, Event::State { .. }))
        .map(|e| json.render(e))
        .collect();
    std::fs::write(dir.join("states.jsonl"), states)?;
    std::fs::write(
        dir.join("sequence.mmd"),
        mermaid(&texts, session.lang, &report.events),
    )?;
    std::fs::write(dir.join("page.md"), page(&texts, session.lang, report))?;
    std::fs::write(
        dir.join("facts.json"),
        serde_json::to_string_pretty(&report.facts).unwrap_or_default() + "\n",
    )
}

/// `--web`: where the page listens, and whether to open it in the default browser.
pub struct Web {
    pub bind: SocketAddr,
    pub open: bool,
}

pub async fn run(
    global: &Global,
    names: &[String],
    set: &[String],
    pictures: &Pictures,
    web: Option<&Web>,
) -> Result<u8, Failure> {
    if let Some(web) = web {
        return run_web(global, names, set, pictures, web).await;
    }
    let mut session = Session::open(global, Mode::Live)?;
    let scenarios = session::resolve(names)?;
    session.config.settings = session::settings(set, &scenarios)?;
    let knobs_set = !session.config.settings.is_empty();
    let servers = match session.start_servers(session::needs(&scenarios)).await? {
        Ok(servers) => servers,
        Err(signal) => return Ok(session::interrupted(signal)),
    };

    let sink = session.sink();
    let work = async {
        let mut all_passed = true;
        let mut score = Score::default();
        for &scenario in &scenarios {
            let narrator = if pictures.export.is_some() {
                // The page replaces the narrative on stdout.
                lab_core::Narrator::new(None, session.gate.clone())
            } else {
                session.live_narrator(&sink)
            };
            // The footer's `step 3/8`: counted in the scenario's expected narrative, the record
            // of the same run. A knob set may change the story, so then only `step 3`.
            if session.gate.is_stepping() && !knobs_set {
                narrator.expect_steps(session.expected_steps(scenario.name));
            }
            let report = lab_scenarios::run(
                scenario,
                &servers,
                narrator,
                &session.library,
                &session.config,
            )
            .await?;
            if let Some(kept) = &report.kept {
                print_kept(kept);
            }
            score.add(&session, &report);
            if let Err(failure) = pictures.after(&session, &report) {
                return Ok(Err(failure));
            }
            all_passed &= report.passed;
        }
        if session.quiz {
            score.print(&session);
        }
        Ok::<Result<bool, Failure>, ScenarioError>(Ok(all_passed))
    };
    let outcome = session.guarded(work).await;
    if matches!(outcome, Guarded::Finished(Ok(_))) {
        session.hold_kept_servers(&servers).await;
    }
    session.close(servers).await;
    match outcome {
        Guarded::Finished(Ok(Err(failure))) => Err(failure),
        Guarded::Finished(Ok(Ok(true))) => Ok(exit::OK),
        // With knobs set, facts that differ from the default run are the point, not drift.
        Guarded::Finished(Ok(Ok(false))) if knobs_set => Ok(exit::OK),
        Guarded::Finished(Ok(Ok(false))) => Ok(exit::DRIFT),
        Guarded::Finished(Err(ScenarioError::Quit(_))) | Guarded::Quit => Ok(session::quit()),
        Guarded::Interrupted(signal) => Ok(session::interrupted(signal)),
        Guarded::Finished(Err(e)) => Err(session::scenario_failure(e)),
    }
}

/// The exit code of a run whose scenarios all ended: drift is exit 1, unless knobs were set.
fn verdict(all_passed: bool, knobs_set: bool) -> u8 {
    if all_passed || knobs_set {
        exit::OK
    } else {
        exit::DRIFT
    }
}

/// Says where the page is: the driver's URL (with the token) and the watchers'.
fn print_web_urls(addr: SocketAddr, token: &str) {
    // An unspecified address (0.0.0.0) is not one to browse to: this machine is 127.0.0.1.
    let local = if addr.ip().is_unspecified() {
        SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), addr.port())
    } else {
        addr
    };
    eprintln!("lab: web view: drive the run from http://{local}/?drive={token}");
    if web::is_exposed(&addr) {
        eprintln!(
            "lab: web view: watch it at http://<this machine's address>:{}/",
            addr.port()
        );
        eprintln!(
            "lab: warning: the web view listens on {addr}: anyone who can reach this machine can \
             watch the run (only the URL with ?drive=… controls it)"
        );
    } else {
        eprintln!("lab: web view: watch it at http://{local}/");
    }
}

/// `lab run NAME... --web`: the same runs, shown on a page and driven from it.
///
/// Each scenario waits for the driver's Next before it starts, and pauses at every step as with
/// `--step`. A restart drops the scenario's run (as Ctrl-C would: its services stop, its
/// connections close; what it left in its schema is removed at the end) and runs it again on the
/// same servers. When every scenario has run, the page stays up, showing the last one, until
/// Ctrl-C or SIGTERM; the exit code is then the runs' (0, or 1 for drift).
async fn run_web(
    global: &Global,
    names: &[String],
    set: &[String],
    pictures: &Pictures,
    web: &Web,
) -> Result<u8, Failure> {
    let mut session = Session::open(global, Mode::Live)?;
    let scenarios = session::resolve(names)?;
    session.config.settings = session::settings(set, &scenarios)?;
    let knobs_set = !session.config.settings.is_empty();

    let token = uuid::Uuid::new_v4().simple().to_string();
    let hub = Hub::new(&session.library.texts, session.lang, token);
    let server = WebServer::start(web.bind, hub.clone()).await.map_err(|e| {
        Failure::environment(anyhow::anyhow!(
            "cannot serve the web view on {}: {e}; choose another with --web-bind",
            web.bind
        ))
    })?;
    print_web_urls(server.addr, hub.token());
    if web.open {
        let ip = if server.addr.ip().is_unspecified() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            server.addr.ip()
        };
        let local = SocketAddr::new(ip, server.addr.port());
        web::open_browser(&format!("http://{local}/?drive={}", hub.token()));
    }

    let servers = match session.start_servers(session::needs(&scenarios)).await {
        Ok(Ok(servers)) => servers,
        Ok(Err(signal)) => {
            server.stop().await;
            return Ok(session::interrupted(signal));
        }
        Err(failure) => {
            server.stop().await;
            return Err(failure);
        }
    };

    let terminal = session.sink();
    let texts = session.library.texts.clone();
    // Set once every scenario has run (to whether all passed), cleared by a restart: a Ctrl-C
    // then closes the page with the runs' verdict rather than "interrupted".
    let finished: parking_lot::Mutex<Option<bool>> = parking_lot::Mutex::new(None);
    let work = async {
        let mut passed = vec![true; scenarios.len()];
        let mut index = 0;
        let mut epoch = 0;
        // Whether the scenario waits at its title for Next. After the one before it, the driver
        // has just pressed Next on its end already.
        let mut wait_to_start = true;
        loop {
            while let Some(&entry) = scenarios.get(index) {
                let title = |lang: Lang| texts.render(entry.name, lang, &Msg::new("title"));
                let (run_epoch, input) = hub.begin(serde_json::json!({
                    "scenario": entry.name,
                    "n": index + 1,
                    "of": scenarios.len(),
                    "title": {"en": title(Lang::En), "ru": title(Lang::Ru)},
                }));
                epoch = run_epoch;
                // The gate's prompt is where the page learns that the run waits.
                let gate = Gate::stepping(input, {
                    let hub = hub.clone();
                    Box::new(move |place: lab_core::gate::Place| {
                        hub.gate_paused(run_epoch, place.pause);
                        String::new()
                    })
                });
                let sink: SharedSink = Arc::new(parking_lot::Mutex::new(WebSink::new(
                    texts.clone(),
                    session.answers,
                    hub.clone(),
                    run_epoch,
                    Some(terminal.clone()),
                )));
                let narrator = Narrator::new(Some(sink), gate);
                let wait = wait_to_start;
                let attempt = async {
                    if wait && !hub.wait_for_next(run_epoch, PauseKind::Start).await {
                        return Ok::<_, ScenarioError>(None);
                    }
                    let report = lab_scenarios::run(
                        entry,
                        &servers,
                        narrator,
                        &session.library,
                        &session.config,
                    )
                    .await?;
                    // Another scenario follows: this one stays on the page until Next.
                    if index + 1 < scenarios.len() {
                        hub.wait_for_next(run_epoch, PauseKind::Next).await;
                    }
                    Ok(Some(report))
                };
                tokio::select! {
                    result = attempt => if let Some(report) = result? {
                        if let Some(kept) = &report.kept {
                            print_kept(kept);
                        }
                        if let Err(failure) = pictures.after(&session, &report) {
                            return Ok(failure);
                        }
                        passed[index] = report.passed;
                        index += 1;
                        wait_to_start = false;
                    },
                    _ = hub.restart_requested() => {
                        eprintln!("lab: web view: restarting {}", entry.name);
                        wait_to_start = true;
                    }
                }
            }
            let all_passed = passed.iter().all(|p| *p);
            *finished.lock() = Some(all_passed);
            hub.finished(epoch, all_passed);
            hub.restart_requested().await;
            *finished.lock() = None;
            index = scenarios.len() - 1;
            wait_to_start = true;
            eprintln!("lab: web view: restarting {}", scenarios[index].name);
        }
    };
    let outcome: Guarded<Result<Failure, ScenarioError>> = session.guarded(work).await;
    server.stop().await;
    session.close(servers).await;
    match outcome {
        Guarded::Finished(Ok(failure)) => Err(failure),
        Guarded::Interrupted(signal) => match *finished.lock() {
            Some(all_passed) => {
                eprintln!("lab: web view closed; servers and temporary files are cleaned up");
                Ok(verdict(all_passed, knobs_set))
            }
            None => Ok(session::interrupted(signal)),
        },
        Guarded::Finished(Err(ScenarioError::Quit(_))) | Guarded::Quit => Ok(session::quit()),
        Guarded::Finished(Err(e)) => Err(session::scenario_failure(e)),
    }
}
