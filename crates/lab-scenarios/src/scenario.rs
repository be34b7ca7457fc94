//! What a scenario is: a script over a [`Ctx`], what it requires, and where it comes in its
//! lesson.

use std::future::Future;
use std::pin::Pin;

use lab_infra::Needs;
use lab_services::ServiceSpec;
use lab_services::stage::Hop;

use crate::ctx::Ctx;
use crate::error::ScenarioResult;

/// A boxed scenario future.
pub type ScenarioFuture<'a> = Pin<Box<dyn Future<Output = ScenarioResult> + Send + 'a>>;

/// A lesson: a topic folder of this crate (`src/reports/`), with the tables its own side uses.
#[derive(Debug)]
pub struct Lesson {
    /// How the lesson is called in `lab list` ("A", "B", …).
    pub id: &'static str,
    /// Where the lesson comes among the others (`lab run all`, `lab list`): lower first.
    pub order: u16,
    /// The tables of the lesson's own side (SQL run in each run's schema); empty for none.
    pub schema: &'static str,
}

/// Which hops a scenario breaks, and how.
#[derive(Debug, Clone, Copy)]
pub enum FaultUse {
    /// It breaks no hop.
    None,
    /// Only toxics, set through the Toxiproxy API: a real Toxiproxy (`--toxiproxy-url`) can do
    /// it too.
    Toxics(&'static [Hop]),
    /// Deterministic one-shot faults: the embedded proxy only.
    OneShot(&'static [Hop]),
}

impl FaultUse {
    /// The links that go through a proxy hop.
    pub fn hops(self) -> &'static [Hop] {
        match self {
            FaultUse::None => &[],
            FaultUse::Toxics(hops) | FaultUse::OneShot(hops) => hops,
        }
    }
}

/// Everything a scenario needs, in one declaration: servers, services, fault hops. The runner
/// provides exactly this before the script starts, and refuses (with an error, not a panic)
/// a script that reaches for anything else.
#[derive(Debug, Clone, Copy)]
pub struct Requires {
    /// The scenario's own use of PostgreSQL (its lesson's tables).
    pub postgres: bool,
    /// The scenario's own use of Redis.
    pub redis: bool,
    /// The bundled services it talks to (the services they call are started too).
    pub services: &'static [&'static ServiceSpec],
    pub faults: FaultUse,
}

impl Requires {
    /// The servers the scenario and its services need.
    pub fn servers(&self) -> Needs {
        let own = Needs {
            postgres: self.postgres,
            redis: self.redis,
        };
        self.services
            .iter()
            .fold(own, |acc, service| acc.union(service.all_needs()))
    }
}

/// A parameter a class may change (`lab run NAME --set name=value`), with its default. The
/// expected facts and narratives are the defaults'; a run with a knob set says which facts
/// differ, and why (`[knobs]` in the scenario's texts).
#[derive(Debug, Clone, Copy)]
pub enum Knob {
    /// A duration, in milliseconds.
    Millis { name: &'static str, default: u64 },
    /// On (`true`) or off (`false`).
    Switch { name: &'static str, default: bool },
}

impl Knob {
    pub fn name(self) -> &'static str {
        match self {
            Knob::Millis { name, .. } | Knob::Switch { name, .. } => name,
        }
    }

    /// The default, as `--set` would write it.
    pub fn default_value(self) -> String {
        match self {
            Knob::Millis { default, .. } => default.to_string(),
            Knob::Switch { default, .. } => default.to_string(),
        }
    }

    /// Checks a value given with `--set`, and returns it in its canonical form.
    pub fn parse(self, value: &str) -> Result<String, String> {
        match self {
            Knob::Millis { name, .. } => value
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|ms| (1..=600_000).contains(ms))
                .map(|ms| ms.to_string())
                .ok_or_else(|| {
                    format!("{name} takes milliseconds from 1 to 600000, not `{value}`")
                }),
            Knob::Switch { name, .. } => match value.trim() {
                "true" | "on" | "yes" | "1" => Ok("true".into()),
                "false" | "off" | "no" | "0" => Ok("false".into()),
                _ => Err(format!("{name} is true or false, not `{value}`")),
            },
        }
    }
}

/// One scenario, as its module declares it. Its name and lesson come from where it lives: the
/// folder `scenarios/<name>/` and the topic folder of its module (see `build.rs`).
pub struct Scenario {
    /// Where it comes in its lesson (`lab run all`, `lab list`): lower first.
    pub order: u16,
    pub requires: Requires,
    /// What a class may change with `--set` (see [`Knob`]); empty for most scenarios.
    pub knobs: &'static [Knob],
    /// The script.
    pub run: for<'a> fn(&'a Ctx) -> ScenarioFuture<'a>,
}
