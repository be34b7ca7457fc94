//! Every scenario of the lab, one module each, and the runner that gives each run its own
//! schema, key prefix and services.
//!
//! A scenario is a short async function over a [`Ctx`]: it drives real services and real
//! databases, tells what happens through the narrator, and records facts it reads back from real
//! state. It never prints and never decides whether it passed: the runner compares its facts with
//! the expected ones kept under `scenarios/<name>/expected.json`.
//!
//! # Layout
//!
//! - [`library`]: the files under `scenarios/` (texts, expected facts and narratives), read from
//!   the checkout when there is one, else the copies embedded at build time.
//! - [`faults`]: the proxies on the hops a scenario breaks (embedded, or a real Toxiproxy).
//! - [`lesson_a`]: the PostgreSQL background-task lesson (`duplicate`, `idempotent`,
//!   `timeout`, `concurrent`, `lease`, `lease-stale`).
//! - [`CATALOGUE`]: every scenario, in the order `lab run all` runs them.
//!
//! To add a scenario: write its module (see `lesson_a::duplicate`), add it to [`CATALOGUE`], add
//! `scenarios/<name>/{en,ru}.toml`, then `lab check <name> --bless` to record its expectations.

pub mod faults;
pub mod lesson_a;
pub mod library;

use std::future::Future;
use std::pin::Pin;

use lab_core::{Checkpoints, Event, Facts, Narrator, Quit};
use lab_infra::{InfraError, Needs, RunSpace, Servers};
use sqlx::PgPool;

pub use faults::{Faults, ProxyLedger};
pub use library::Library;

/// The tables every run starts with.
pub const SCHEMA_SQL: &str = include_str!("../../../schema.sql");

/// Why a scenario could not run to its end.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error(transparent)]
    Quit(#[from] Quit),
    #[error(transparent)]
    Infra(#[from] InfraError),
    #[error("PostgreSQL error: {0}")]
    Sql(#[from] sqlx::Error),
    #[error("Redis error: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("HTTP client error: {0}")]
    Http(#[from] reqwest::Error),
    #[error("cannot start a service: {0}")]
    Io(#[from] std::io::Error),
    #[error("fault proxy: {0}")]
    Faults(#[from] faultproxy::client::ClientError),
    /// The world did not behave as the scenario's script needs (a claim that found no task).
    #[error("{0}")]
    Broken(String),
}

/// What a scenario function returns.
pub type ScenarioResult = Result<(), ScenarioError>;

/// A boxed scenario future.
pub type ScenarioFuture<'a> = Pin<Box<dyn Future<Output = ScenarioResult> + Send + 'a>>;

/// What a scenario needs from the fault proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultUse {
    /// It breaks no hop.
    None,
    /// Only toxics, set through the Toxiproxy API: a real Toxiproxy can do it too.
    Toxics,
    /// Deterministic one-shot faults: the embedded proxy only.
    OneShot,
}

/// One scenario: its name, what it needs, and its script.
pub struct Scenario {
    pub name: &'static str,
    /// The lesson it belongs to (for `lab list`).
    pub lesson: &'static str,
    pub needs: Needs,
    pub faults: FaultUse,
    pub run: for<'a> fn(&'a Ctx) -> ScenarioFuture<'a>,
}

/// Every scenario, in the order `lab run all` runs them.
pub static CATALOGUE: &[Scenario] = &[
    lesson_a::duplicate::SCENARIO,
    lesson_a::idempotent::SCENARIO,
    lesson_a::timeout::SCENARIO,
    lesson_a::concurrent::SCENARIO,
    lesson_a::lease::SCENARIO,
    lesson_a::lease_stale::SCENARIO,
];

/// Finds a scenario by name.
pub fn find(name: &str) -> Option<&'static Scenario> {
    CATALOGUE.iter().find(|s| s.name == name)
}

/// What a scenario gets to work with.
pub struct Ctx {
    pub narrator: Narrator,
    pub space: RunSpace,
    pub checkpoints: Checkpoints,
    /// The run's fault proxies; only for scenarios that break a hop (`FaultUse` not `None`).
    faults: Option<Faults>,
}

impl Ctx {
    /// The run's PostgreSQL pool (its `search_path` is the run's schema).
    pub fn pg(&self) -> &PgPool {
        self.space
            .pg
            .as_ref()
            .expect("this scenario declared that it needs PostgreSQL")
    }

    /// The run's fault proxies.
    pub fn faults(&self) -> &Faults {
        self.faults
            .as_ref()
            .expect("this scenario declared that it breaks a hop (FaultUse)")
    }
}

/// The result of one scenario run.
pub struct RunReport {
    pub name: &'static str,
    pub passed: bool,
    pub facts: Facts,
    pub events: Vec<Event>,
    /// Where the run's data is, when it was kept (`--keep`).
    pub kept: Option<KeptRun>,
}

/// What `--keep` left behind, and how to look at it.
pub struct KeptRun {
    pub schema: String,
    pub prefix: String,
    pub pg_url: Option<String>,
    pub redis_url: Option<String>,
}

/// How scenarios are run in this `lab` call.
#[derive(Debug, Clone, Default)]
pub struct RunConfig {
    /// Keep each run's schema and keys (`--keep`).
    pub keep: bool,
    /// Create proxies on this Toxiproxy instead of the embedded one (`--toxiproxy-url`).
    pub toxiproxy_url: Option<String>,
    /// Proxies on that Toxiproxy not yet deleted: what a Ctrl-C must clean.
    pub proxies: ProxyLedger,
}

/// Runs one scenario in a fresh run space: emits its events through `narrator`, ends with the
/// summary, and releases the space (unless `keep`) and its proxies, also when it fails.
pub async fn run(
    scenario: &'static Scenario,
    servers: &Servers,
    narrator: Narrator,
    library: &Library,
    config: &RunConfig,
) -> Result<RunReport, ScenarioError> {
    let keep = config.keep;
    narrator.start(scenario.name);
    let space = RunSpace::create(servers, &[SCHEMA_SQL]).await?;
    // One-shot faults exist only in the embedded proxy; toxics work on either.
    let faults: Result<Option<Faults>, ScenarioError> =
        match (&config.toxiproxy_url, scenario.faults) {
            (_, FaultUse::None) => Ok(None),
            (Some(url), FaultUse::Toxics) => Faults::external(url, &space.run_id, &config.proxies)
                .await
                .map(Some)
                .map_err(Into::into),
            _ => Faults::embedded(&space.run_id)
                .await
                .map(Some)
                .map_err(Into::into),
        };
    let faults = match faults {
        Ok(faults) => faults,
        Err(e) => {
            let _ = space.release(servers, keep).await;
            return Err(e);
        }
    };
    let ctx = Ctx {
        narrator: narrator.clone(),
        space,
        checkpoints: Checkpoints::new(),
        faults,
    };
    let result = (scenario.run)(&ctx).await;
    if let Some(faults) = &ctx.faults {
        faults.release().await;
    }
    let kept = keep.then(|| KeptRun {
        schema: ctx.space.schema.clone(),
        prefix: ctx.space.prefix.clone(),
        pg_url: ctx.space.pg_url.clone(),
        redis_url: ctx.space.redis_url.clone(),
    });
    let released = ctx.space.release(servers, keep).await;
    result?;
    released?;
    let passed = narrator.summary(scenario.name, &library.expected_facts(scenario.name));
    Ok(RunReport {
        name: scenario.name,
        passed,
        facts: narrator.facts(),
        events: narrator.events(),
        kept,
    })
}
