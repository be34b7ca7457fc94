//! `lab run NAME...`: run scenarios, narrated, on one set of servers. What both ways of showing a
//! run share is here (the selection, what to draw or write after each run, the score of the
//! predictions); the terminal's run is [`run`], the page's is `web_run`.

use std::path::PathBuf;

use lab_core::render::{mermaid, swimlanes};
use lab_core::text::COMMON;
use lab_core::{Event, Msg};
use lab_infra::url::redact;
use lab_scenarios::{Entry, KeptRun, Library, RunReport, Settings};

use super::page::page;
use crate::cli::ExportArg;
use crate::exit::{self, Failure};
use crate::select;
use crate::session::{Format, Mode, Session, SessionOptions};
use crate::words::t;

/// The scenarios a run shows, and its knobs, checked before anything starts.
pub struct Selection {
    pub scenarios: Vec<Entry>,
    pub settings: Settings,
}

impl Selection {
    pub fn new(names: &[String], set: &[String]) -> Result<Selection, Failure> {
        let scenarios = select::scenarios(names)?;
        let settings = select::settings(set, &scenarios)?;
        Ok(Selection {
            scenarios,
            settings,
        })
    }

    /// With knobs set, facts that differ from the default run are the point, not drift.
    pub fn knobs_set(&self) -> bool {
        !self.settings.is_empty()
    }

    /// The exit code of a run whose scenarios all ended.
    pub fn verdict(&self, all_passed: bool) -> u8 {
        if all_passed || self.knobs_set() {
            exit::OK
        } else {
            exit::DRIFT
        }
    }
}

/// The terminal's `lab run`: each scenario narrated in turn; then, with `--keep` on throwaway
/// servers, the servers stay up for a look.
pub async fn run(
    options: SessionOptions,
    library: Library,
    selection: Selection,
    pictures: &Pictures,
) -> Result<u8, Failure> {
    let session =
        Session::open(options, library, Mode::Live).with_settings(selection.settings.clone());
    let needs = select::needs(&selection.scenarios);
    let all_passed = session
        .run_with_servers(needs, async |servers| {
            let sink = session.sink();
            let mut all_passed = true;
            let mut score = Score::default();
            for &scenario in &selection.scenarios {
                let narrator = if pictures.export.is_some() {
                    // The page replaces the narrative on stdout.
                    lab_core::Narrator::new(None, session.gate.clone())
                } else {
                    session.live_narrator(&sink)
                };
                // The footer's `step 3/8`: counted in the scenario's expected narrative, the
                // record of the same run. A knob set may change the story, so then only `step 3`.
                if session.gate.is_stepping() && !selection.knobs_set() {
                    narrator.expect_steps(session.expected_steps(scenario.name));
                }
                let report = lab_scenarios::run(
                    scenario,
                    servers,
                    narrator,
                    &session.library,
                    &session.config,
                )
                .await?;
                after_each(&session, pictures, &report).await?;
                score.add(&session, &report);
                all_passed &= report.passed;
            }
            if session.options.quiz {
                score.print(&session);
            }
            Ok(all_passed)
        })
        .await?;
    Ok(selection.verdict(all_passed))
}

/// After one scenario's run: how to look at what it kept, and its pictures.
pub async fn after_each(
    session: &Session,
    pictures: &Pictures,
    report: &RunReport,
) -> Result<(), Failure> {
    if let Some(kept) = &report.kept {
        print_kept(kept).await;
    }
    pictures.after(session, report).await
}

/// Tells how to look at a kept run (on stderr: run ids are not part of the narrative). A
/// password in a URL is not printed; psql asks for it (or reads PGPASSWORD).
async fn print_kept(kept: &KeptRun) {
    // After the narrative of the run it describes.
    crate::output::drained().await;
    eprintln!(
        "{}",
        t(Msg::new("kept_schema").arg("schema", kept.schema.as_str()))
    );
    if let Some(url) = &kept.pg_url {
        eprintln!(
            "  psql '{}' -c '\\dt' -c 'SELECT * FROM tasks' -c 'SELECT * FROM reports'",
            redact(url)
        );
    }
    if let Some(url) = &kept.redis_url {
        eprintln!(
            "{}",
            t(Msg::new("kept_keys").arg("prefix", kept.prefix.as_str()))
        );
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
    fn add(&mut self, session: &Session, report: &RunReport) {
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
                            .grade(report.name, session.lang(), prefix, answer)
                    });
                    self.right += usize::from(graded == Some(true));
                }
                _ => {}
            }
        }
    }

    fn print(&self, session: &Session) {
        match session.format() {
            Format::Json => say!(
                "{}",
                serde_json::json!({"event": "score", "right": self.right, "asked": self.asked})
            ),
            Format::Text => {
                let line = session.library.texts.render(
                    COMMON,
                    session.lang(),
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
    async fn after(&self, session: &Session, report: &RunReport) -> Result<(), Failure> {
        let texts = &session.library.texts;
        if self.diagram && self.export.is_none() {
            say!("\n{}", swimlanes(texts, session.lang(), &report.events));
        }
        if let Some(dir) = &self.artifacts {
            let dir = dir.join(report.name);
            write_artifacts(artifacts(session, report), &dir)
                .await
                .map_err(|e| {
                    Failure::environment(anyhow::anyhow!(t(Msg::new("artifacts_failed")
                        .arg("dir", dir.display().to_string())
                        .arg("error", e.to_string()))))
                })?;
        }
        if self.export == Some(ExportArg::Md) {
            say!("{}", page(texts, session.lang(), report));
        }
        Ok(())
    }
}

/// The files `--artifacts` writes for one run: the event log, the table snapshots, the Mermaid
/// diagram, the page and the facts.
fn artifacts(session: &Session, report: &RunReport) -> Vec<(&'static str, String)> {
    let texts = session.library.texts.clone();
    let lang = session.lang();
    let mut json = lab_core::render::JsonRenderer::new(texts.clone(), lang);
    let log: String = report.events.iter().map(|e| json.render(e)).collect();
    let states: String = report
        .events
        .iter()
        .filter(|e| matches!(e, Event::State { .. }))
        .map(|e| json.render(e))
        .collect();
    vec![
        ("events.jsonl", log),
        ("states.jsonl", states),
        ("sequence.mmd", mermaid(&texts, lang, &report.events)),
        ("page.md", page(&texts, lang, report)),
        (
            "facts.json",
            serde_json::to_string_pretty(&report.facts).unwrap_or_default() + "\n",
        ),
    ]
}

/// Writes the files into `dir`, without blocking the runtime.
async fn write_artifacts(
    files: Vec<(&'static str, String)>,
    dir: &std::path::Path,
) -> std::io::Result<()> {
    tokio::fs::create_dir_all(dir).await?;
    for (name, text) in files {
        tokio::fs::write(dir.join(name), text).await?;
    }
    Ok(())
}
