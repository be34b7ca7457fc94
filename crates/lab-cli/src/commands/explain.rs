//! `lab explain NAME...`: runs each scenario headless and prints the SQL statements and Redis
//! commands it executed, grouped by the function (file and line) they are written in, so a
//! learner can go from the narrative to the code. With `--format json`, one object per
//! statement or command instead.

use lab_core::{Event, Narrator, render};

use crate::cli::{FormatArg, Global, exit};
use crate::session::{self, Failure, Guarded, Mode, Session};

pub async fn explain(global: &Global, names: &[String]) -> Result<u8, Failure> {
    let session = Session::open(global, Mode::Headless)?;
    let scenarios = session::resolve(names)?;
    let servers = match session.start_servers(session::needs(&scenarios)).await? {
        Ok(servers) => servers,
        Err(signal) => return Ok(session::interrupted(signal)),
    };
    let work = async {
        for (i, &scenario) in scenarios.iter().enumerate() {
            let report = lab_scenarios::run(
                scenario,
                &servers,
                Narrator::recording(),
                &session.library,
                &session.config,
            )
            .await
            .map_err(session::scenario_failure)?;
            match global.format {
                FormatArg::Json => {
                    for event in &report.events {
                        if let Event::Executed(executed) = event {
                            let mut line = serde_json::json!({
                                "event": "executed",
                                "scenario": scenario.name,
                            });
                            if let (Some(line), Ok(serde_json::Value::Object(fields))) =
                                (line.as_object_mut(), serde_json::to_value(executed))
                            {
                                line.extend(fields);
                            }
                            say!("{line}");
                        }
                    }
                }
                _ => {
                    if i > 0 {
                        say!();
                    }
                    say!(
                        "{}",
                        render::render_explain(
                            &session.library.texts,
                            session.lang,
                            scenario.source,
                            &report.events,
                        )
                        .trim_end()
                    );
                }
            }
        }
        Ok::<(), Failure>(())
    };
    let outcome = session.guarded(work).await;
    session.close(servers).await;
    match outcome {
        Guarded::Finished(Ok(())) => Ok(exit::OK),
        Guarded::Finished(Err(failure)) => Err(failure),
        Guarded::Interrupted(signal) => Ok(session::interrupted(signal)),
        Guarded::Quit => Ok(session::quit()),
    }
}
