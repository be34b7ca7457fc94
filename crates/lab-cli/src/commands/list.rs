//! `lab list`: every scenario with a one-line summary, and with `--knobs` what each lets a class
//! change.

use lab_core::Msg;

use crate::cli::{FormatArg, Global, exit};
use crate::session::{self, Failure};

pub fn list(global: &Global, knobs: bool) -> Result<u8, Failure> {
    let lang = session::lang(global);
    let library = session::library()?;
    let render = |scope: &str, key: &str| library.texts.render(scope, lang, &Msg::new(key));
    let width = lab_scenarios::CATALOGUE
        .iter()
        .map(|s| s.name.len())
        .max()
        .unwrap_or(0);
    for scenario in lab_scenarios::CATALOGUE.iter() {
        let summary = render(scenario.name, "summary");
        let declared = scenario.scenario.knobs;
        match global.format {
            FormatArg::Json => say!(
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
            FormatArg::Text | FormatArg::Junit => {
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
