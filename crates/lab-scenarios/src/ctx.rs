//! What a scenario's script gets to work with, and the only door to the kit: the narrator, the
//! run's space, its knobs, checkpoints to hold or notice calls at, and exactly what its
//! `Requires` declared (a database, Redis, fault proxies, services). Reaching for anything else
//! is a [`ScenarioError::Undeclared`], never a panic.

use lab_core::{Checkpoints, Narrator};
use lab_infra::RunSpace;
use lab_services::ServiceSpec;
use lab_services::admin::Admin;
use lab_services::api::ConfigRequest;
use lab_services::faults::Faults;
use lab_services::stage::{ServiceHandle, Stage};
use sqlx::PgPool;

use crate::error::ScenarioError;
use crate::kit::knob::KnobType;
use crate::kit::{Caller, Hold, Knob, KnobSpec, Notice, Settings, redis};

/// What a scenario's script gets to work with.
pub struct Ctx {
    pub narrator: Narrator,
    pub space: RunSpace,
    /// The run's checkpoints, for choreographies of their own (a race forced through a
    /// barrier); holding one call or noticing one is [`Ctx::hold`] and [`Ctx::notice`].
    pub checkpoints: Checkpoints,
    /// The scenario's name, for errors.
    pub name: &'static str,
    /// The knobs it declares, and those set away from their defaults for this run.
    pub(crate) knobs: &'static [KnobSpec],
    pub(crate) settings: Settings,
    pub(crate) faults: Option<Faults>,
    pub(crate) stage: Stage,
}

impl Ctx {
    /// What the runner releases when the script has ended.
    pub(crate) fn into_parts(self) -> (RunSpace, Option<Faults>, Stage) {
        (self.space, self.faults, self.stage)
    }

    fn undeclared(&self, what: impl Into<String>) -> ScenarioError {
        ScenarioError::Undeclared {
            scenario: self.name,
            what: what.into(),
        }
    }

    /// A knob's value in this run: as set with `--set`, else its default. A knob the scenario
    /// does not declare is a bug in the scenario.
    pub fn knob<T: KnobType>(&self, knob: &Knob<T>) -> Result<T, ScenarioError> {
        if !self.knobs.contains(&knob.spec) {
            return Err(self.undeclared(format!("the knob {}", knob.spec.name)));
        }
        let value = self
            .settings
            .get(&knob.spec)
            .unwrap_or_else(|| knob.spec.default_value());
        T::from_value(value).ok_or_else(|| self.undeclared(format!("the knob {}", knob.spec.name)))
    }

    /// Holds the next call that reaches `point` inside a service (see [`crate::kit::hold`]).
    pub fn hold(&self, point: &str) -> Hold {
        Hold::new(self.checkpoints.hold(point))
    }

    /// Tells when a call has passed `point` inside a service, without holding it.
    pub fn notice(&self, point: &str) -> Notice {
        Notice::new(self.checkpoints.notice(point))
    }

    /// The run's PostgreSQL pool (its `search_path` is the run's schema).
    pub fn pg(&self) -> Result<&PgPool, ScenarioError> {
        self.space
            .pg
            .as_ref()
            .ok_or_else(|| self.undeclared("PostgreSQL"))
    }

    /// The run's own connection to the real Redis (never through the fault proxy).
    pub fn redis(&self) -> Result<redis::Conn, ScenarioError> {
        self.space
            .redis
            .clone()
            .map(lab_core::trace::Traced::new)
            .ok_or_else(|| self.undeclared("Redis"))
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

    /// Switches a service (`PUT /config`, directly, past any fault): only what `change` gives
    /// changes. Returns the service's switches after it.
    pub async fn configure<C: ConfigRequest>(
        &self,
        spec: &ServiceSpec,
        change: &C,
    ) -> Result<C::Config, ScenarioError> {
        let base = self.direct_url(spec)?;
        Ok(Admin::new(Caller::new().http(), &base)
            .configure(change)
            .await?)
    }

    /// A service's direct address (past any fault proxy) as a base URL, `http://127.0.0.1:PORT`:
    /// where the lab reads its facts and flips its switches ([`Admin`]).
    pub fn direct_url(&self, spec: &ServiceSpec) -> Result<String, ScenarioError> {
        Ok(format!("http://{}", self.service(spec)?.direct))
    }
}
