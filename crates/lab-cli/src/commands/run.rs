//! `lab run NAME...`: run scenarios, narrated, on one set of servers.

use lab_core::text::COMMON;
use lab_core::{Event, Msg};
use lab_infra::url::redact;
use lab_scenarios::{KeptRun, ScenarioError};

use crate::cli::{FormatArg, Global, exit};
use crate::session::{self, Failure, Guarded, Mode, Session};

/// Tells how to look at a kept run (on stderr: run ids are not part of the narrative). A
/// password in a URL is not printed; psql asks for it (or reads PGPASSWORD).
fn print_kept(kept: &KeptRun) {
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

pub async fn run(global: &Global, names: &[String], set: &[String]) -> Result<u8, Failure> {
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
            let narrator = session.live_narrator(&sink);
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
            all_passed &= report.passed;
        }
        if session.quiz {
            score.print(&session);
        }
        Ok::<bool, ScenarioError>(all_passed)
    };
    let outcome = session.guarded(work).await;
    if matches!(outcome, Guarded::Finished(Ok(_))) {
        session.hold_kept_servers(&servers).await;
    }
    session.close(servers).await;
    match outcome {
        Guarded::Finished(Ok(true)) => Ok(exit::OK),
        // With knobs set, facts that differ from the default run are the point, not drift.
        Guarded::Finished(Ok(false)) if knobs_set => Ok(exit::OK),
        Guarded::Finished(Ok(false)) => Ok(exit::DRIFT),
        Guarded::Finished(Err(ScenarioError::Quit(_))) | Guarded::Quit => Ok(session::quit()),
        Guarded::Interrupted(signal) => Ok(session::interrupted(signal)),
        Guarded::Finished(Err(e)) => Err(session::scenario_failure(e)),
    }
}
