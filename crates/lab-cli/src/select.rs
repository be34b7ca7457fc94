//! Which scenarios a command runs, with which knobs, and the servers they need: the names and
//! `--set NAME=VALUE` of the command line, checked once, before anything starts.

use lab_core::Msg;
use lab_infra::Needs;
use lab_scenarios::kit::knob::KnobError;
use lab_scenarios::{Entry, Settings};

use crate::exit::Failure;
use crate::words::t;

/// Resolves scenario names (`all`, or none, means every one), rejecting unknown names as usage
/// errors.
pub fn scenarios(names: &[String]) -> Result<Vec<Entry>, Failure> {
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
/// knob of one of them, and its value must fit it. Returns the values, typed: this is the one
/// place a knob's text becomes its value.
pub fn settings(given: &[String], scenarios: &[Entry]) -> Result<Settings, Failure> {
    let declared = || scenarios.iter().flat_map(|s| s.scenario.knobs);
    let mut settings = Settings::default();
    for item in given {
        let (name, value) = item
            .split_once('=')
            .ok_or_else(|| Failure::usage(t(Msg::new("set_syntax").arg("item", item))))?;
        let knob = declared().find(|k| k.name == name.trim()).ok_or_else(|| {
            let known: Vec<&str> = declared().map(|k| k.name).collect();
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
            .map_err(|e| Failure::usage(knob_error(&e)))?;
        settings.set(knob, parsed);
    }
    Ok(settings)
}

/// A value that does not fit its knob, in the learner's language: the knob, what it takes, and
/// what was given.
fn knob_error(error: &KnobError) -> String {
    match error {
        KnobError::NotMillis {
            name,
            min,
            max,
            given,
        } => t(Msg::new("knob_millis")
            .arg("name", *name)
            .arg("min", *min)
            .arg("max", *max)
            .arg("given", given.as_str())),
        KnobError::NotSwitch { name, given } => t(Msg::new("knob_switch")
            .arg("name", *name)
            .arg("given", given.as_str())),
    }
}

/// The union of the servers the scenarios need.
pub fn needs(scenarios: &[Entry]) -> Needs {
    scenarios
        .iter()
        .fold(Needs::default(), |acc, s| acc.union(s.requires().servers()))
}
