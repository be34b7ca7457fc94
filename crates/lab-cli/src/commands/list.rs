//! `lab list`: every scenario with a one-line summary, and with `--knobs` what each lets a class
//! change.

use lab_core::Msg;
use lab_scenarios::Library;

use crate::exit::{self, Failure};
use crate::session::{Format, SessionOptions};

pub fn list(options: &SessionOptions, library: &Library, knobs: bool) -> Result<u8, Failure> {
    let lang = options.lang;
    let render = |scope: &str, key: &str| library.texts.render(scope, lang, &Msg::new(key));
    let width = lab_scenarios::CATALOGUE
        .iter()
        .map(|s| s.name.len())
        .max()
        .unwrap_or(0);
    for scenario in lab_scenarios::CATALOGUE.iter() {
        let summary = render(scenario.name, "summary");
        let declared = scenario.scenario.knobs;
        match options.format {
            Format::Json => say!(
                "{}",
                serde_json::json!({
                    "scenario": scenario.name,
                    "lesson": scenario.lesson.id,
                    "title": render(scenario.name, "title"),
                    "summary": summary,
                    "knobs": declared.iter().map(|k| serde_json::json!({
                        "name": k.name,
                        "default": k.default_value().to_string(),
                        "about": render(scenario.name, &format!("knobs.{}", k.name)),
                    })).collect::<Vec<_>>(),
                })
            ),
            Format::Text => {
                say!("{:<width$}  {summary}", scenario.name);
                if knobs {
                    for knob in declared {
                        say!(
                            "{:<width$}    --set {}={}: {}",
                            "",
                            knob.name,
                            knob.default_value(),
                            render(scenario.name, &format!("knobs.{}", knob.name))
                        );
                    }
                }
            }
        }
    }
    Ok(exit::OK)
}
