//! `lab list`: every scenario with a one-line summary.

use lab_core::Msg;

use crate::cli::{FormatArg, Global, exit};
use crate::session::{self, Failure};

pub fn list(global: &Global) -> Result<u8, Failure> {
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
        match global.format {
            FormatArg::Json => say!(
                "{}",
                serde_json::json!({
                    "scenario": scenario.name,
                    "lesson": scenario.lesson.id,
                    "title": render(scenario.name, "title"),
                    "summary": summary,
                })
            ),
            FormatArg::Text => say!("{:<width$}  {summary}", scenario.name),
        }
    }
    Ok(exit::OK)
}
