//! What a scenario's script gets to work with: the narrator, the run's space, checkpoints, and
//! exactly what its `Requires` declared (a database, fault proxies, services). Reaching for
//! anything else is a [`ScenarioError::Undeclared`], never a panic.

use lab_core::{Checkpoints, Narrator};
use lab_infra::RunSpace;
use lab_services::ServiceSpec;
use sqlx::PgPool;

use crate::catalogue::Entry;
use crate::error::ScenarioError;
use crate::scenario::Knob;
use lab_services::faults::Faults;
use lab_services::stage::{ServiceHandle, Stage};

/// What a scenario's script gets to work with.
pub struct Ctx {
    pub narrator: Narrator,
    pub space: RunSpace,
    pub checkpoints: Checkpoints,
    /// The scenario's name, for errors.
    pub name: &'static str,
    /// Its knobs, and the values set with `--set` (canonical form).
    knobs: &'static [Knob],
    settings: std::collections::BTreeMap<String, String>,
    faults: Option<Faults>,
    stage: Stage,
}

impl Ctx {
    pub(crate) fn new(
        narrator: Narrator,
        space: RunSpace,
        checkpoints: Checkpoints,
        entry: Entry,
        faults: Option<Faults>,
        stage: Stage,
        settings: std::collections::BTreeMap<String, String>,
    ) -> Ctx {
        Ctx {
            narrator,
            space,
            checkpoints,
            name: entry.name,
            knobs: entry.scenario.knobs,
            settings,
            faults,
            stage,
        }
    }

    /// What the runner releases when the script has ended.
    pub(crate) fn into_parts(self) -> (RunSpace, Option<Faults>, Stage) {
        (self.space, self.faults, self.stage)
    }

    fn knob(&self, name: &str) -> Result<Knob, ScenarioError> {
        self.knobs
            .iter()
            .copied()
            .find(|k| k.name() == name)
            .ok_or_else(|| self.undeclared(format!("the knob {name}")))
    }

    /// A duration knob: its `--set` value, else its default.
    pub fn millis(&self, name: &str) -> Result<std::time::Duration, ScenarioError> {
        let Knob::Millis { default, .. } = self.knob(name)? else {
            return Err(self.undeclared(format!("{name} as a duration")));
        };
        let ms = self
            .settings
            .get(name)
            .and_then(|v| v.parse().ok())
            .unwrap_or(default);
        Ok(std::time::Duration::from_millis(ms))
    }

    /// A switch knob: its `--set` value, else its default.
    pub fn switch(&self, name: &str) -> Result<bool, ScenarioError> {
        let Knob::Switch { default, .. } = self.knob(name)? else {
            return Err(self.undeclared(format!("{name} as a switch")));
        };
        Ok(self.settings.get(name).map_or(default, |v| v == "true"))
    }

    fn undeclared(&self, what: impl Into<String>) -> ScenarioError {
        ScenarioError::Undeclared {
            scenario: self.name,
            what: what.into(),
        }
    }

    /// The run's PostgreSQL pool (its `search_path` is the run's schema).
    pub fn pg(&self) -> Result<&PgPool, ScenarioError> {
        self.space
            .pg
            .as_ref()
            .ok_or_else(|| self.undeclared("PostgreSQL"))
    }

    /// The run's fault proxies.
    pub fn faults(&self) -> Result<&Faults, ScenarioError> {
        self.faults
            .as_ref()
            .ok_or_else(|| self.undeclared("the fault proxy"))
    }

    /// Redis as the run's services reach it: through the `redis` hop when the scenario breaks
    /// that link (`Hop::Redis`), else directly. For our own side's workers, which live on the
    /// same side of the link as the services.
    pub fn redis_link(&self) -> Result<&str, ScenarioError> {
        self.stage
            .redis_url()
            .ok_or_else(|| self.undeclared("Redis"))
    }

    /// A service the scenario declared, started for this run.
    pub fn service(&self, spec: &ServiceSpec) -> Result<&ServiceHandle, ScenarioError> {
        self.stage
            .get(spec)
            .ok_or_else(|| self.undeclared(format!("the {} service", spec.name)))
    }
}
