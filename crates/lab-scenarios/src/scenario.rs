//! What a scenario is: a script over a [`Ctx`], what it requires, and where it comes in its
//! lesson.

use std::future::Future;
use std::pin::Pin;

use lab_infra::Needs;
use lab_services::ServiceSpec;
use lab_services::stage::Hop;

use crate::ctx::Ctx;
use crate::error::ScenarioResult;
use crate::kit::KnobSpec;

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

/// One scenario, as its module declares it. Its name and lesson come from where it lives: the
/// folder `scenarios/<name>/` and the topic folder of its module (see `build.rs`).
pub struct Scenario {
    /// Where it comes in its lesson (`lab run all`, `lab list`): lower first.
    pub order: u16,
    pub requires: Requires,
    /// What a class may change with `--set` (see [`crate::kit::knob`]); empty for most
    /// scenarios.
    pub knobs: &'static [KnobSpec],
    /// The script.
    pub run: for<'a> fn(&'a Ctx) -> ScenarioFuture<'a>,
}
