//! `lab explain NAME...`: runs each scenario headless and prints the SQL statements and Redis
//! commands it executed, grouped by the function (file and line) they are written in, so a
//! learner can go from the narrative to the code. With `--format json`, one object per
//! statement or command instead.

use lab_core::{Event, Narrator, render};

use lab_scenarios::Library;

use crate::exit::{self, Failure};
use crate::select;
use crate::session::{Format, Mode, Session, SessionOptions};

pub async fn explain(
    options: SessionOptions,
    library: Library,
    names: &[String],
) -> Result<u8, Failure> {
    let scenarios = select::scenarios(names)?;
    let session = Session::open(options, library, Mode::Headless);
    session
        .run_with_servers(select::needs(&scenarios), async |servers| {
            for (i, &scenario) in scenarios.iter().enumerate() {
                let report = lab_scenarios::run(
                    scenario,
                    servers,
                    Narrator::recording(),
                    &session.library,
                    &session.config,
                )
                .await?;
                match session.format() {
                    Format::Json => print_json(scenario.name, &report.events),
                    Format::Text => {
                        if i > 0 {
                            say!();
                        }
                        say!(
                            "{}",
                            render::render_explain(
                                &session.library.texts,
                                session.lang(),
                                scenario.source,
                                &report.events,
                            )
                            .trim_end()
                        );
                    }
                }
            }
            Ok(exit::OK)
        })
        .await
}

/// One JSON object per statement or command, with the scenario it belongs to.
fn print_json(scenario: &str, events: &[Event]) {
    for event in events {
        if let Event::Executed(executed) = event {
            let mut line = serde_json::json!({
                "event": "executed",
                "scenario": scenario,
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
