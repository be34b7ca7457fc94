//! Running one scenario: its own schema and key prefix, its fault plane, its services, its
//! script, and a cleanup that runs however the script ends.
//!
//! ```text
//! run(entry) ── RunSpace::create (schema lab_<run>, lesson's and services' tables)
//!            ── Faults (when it breaks a hop: embedded, or on a given Toxiproxy)
//!            ── Stage::start (its services, hops in front of those it breaks)
//!            ── the script, over a Ctx
//!            ── Stage::stop, spawned work awaited, Faults::release, RunSpace::release
//!            ── summary: measured facts against scenarios/<name>/expected.json
//! ```

use std::time::Duration;

use lab_core::trace::backstage;
use lab_core::{Checkpoints, Event, Facts, Narrator};
use lab_infra::{InfraError, RunSpace, Servers};
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use crate::catalogue::Entry;
use crate::ctx::Ctx;
use crate::error::ScenarioError;
use crate::kit::Settings;
use crate::library::Library;
use crate::scenario::FaultUse;
use lab_services::faults::{Faults, ProxyLedger};
use lab_services::stage::{self, Ports, Stage, StageConfig};

/// How long the work a run's services spawned (a commit nobody waits for any more) may take to
/// finish once the script has ended.
const SPAWNED_WORK_GRACE: Duration = Duration::from_secs(5);

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
    /// Knobs set with `--set name=value`, typed (checked against the scenarios' knobs before
    /// the run; each scenario takes those it declares).
    pub settings: Settings,
}

/// Checks that the servers of this call can give the scenario what it declares.
fn check_servers(entry: Entry, servers: &Servers) -> Result<(), ScenarioError> {
    let needs = entry.requires().servers();
    let missing = [
        (needs.postgres && servers.postgres.is_none(), "PostgreSQL"),
        (needs.redis && servers.redis.is_none(), "Redis"),
    ];
    match missing.iter().find(|(absent, _)| *absent) {
        Some((_, server)) => Err(InfraError::Missing {
            missing: format!("{server} (scenario `{}` needs it)", entry.name),
            get: lab_infra::binaries::command_for(*server == "PostgreSQL", *server == "Redis"),
        }
        .into()),
        None => Ok(()),
    }
}

/// Runs one scenario in a fresh run space: emits its events through `narrator`, ends with the
/// summary, and releases everything it started (the space only unless `keep`), also when it
/// fails.
pub async fn run(
    entry: Entry,
    servers: &Servers,
    narrator: Narrator,
    library: &Library,
    config: &RunConfig,
) -> Result<RunReport, ScenarioError> {
    // Everything the run does, in its own tasks and its services', happens inside this span:
    // that is how a statement a handler executes finds its way to this run's narrator.
    let span = lab_core::trace::run_span(&narrator);
    run_in_span(entry, servers, narrator, library, config)
        .instrument(span)
        .await
}

async fn run_in_span(
    entry: Entry,
    servers: &Servers,
    narrator: Narrator,
    library: &Library,
    config: &RunConfig,
) -> Result<RunReport, ScenarioError> {
    let settings = config.settings.for_knobs(entry.scenario.knobs);
    narrator.start(entry.name);
    check_servers(entry, servers)?;

    let tables = if servers.postgres.is_some() {
        tables(entry)
    } else {
        Vec::new()
    };
    let space = backstage(RunSpace::create(servers, &tables)).await?;

    let tasks = TaskTracker::new();
    // Where the run holds or orders requests, and what it breaks, are marked in its pictures.
    let checkpoints = Checkpoints::narrated(narrator.clone());
    let (faults, stage) = match start(entry, &space, &narrator, &checkpoints, &tasks, config).await
    {
        Ok(started) => started,
        Err(e) => {
            let _ = backstage(space.release(servers, config.keep)).await;
            return Err(e);
        }
    };
    let ctx = Ctx {
        narrator: narrator.clone(),
        space,
        checkpoints,
        name: entry.name,
        knobs: entry.scenario.knobs,
        settings: settings.clone(),
        faults,
        stage,
    };
    let result = (entry.scenario.run)(&ctx).await;
    let (kept, released) = wind_down(ctx, tasks, servers, config).await;
    result?;
    released?;
    let passed = narrator.summary(
        entry.name,
        &library.expected_facts(entry.name),
        settings.shown(),
    );
    Ok(RunReport {
        name: entry.name,
        passed,
        facts: narrator.facts(),
        events: narrator.events(),
        kept,
    })
}

/// The table scripts a scenario's run executes in its schema: its lesson's, then its services',
/// each once (the reports lesson and the report service share the top-level `schema.sql`).
pub fn tables(entry: Entry) -> Vec<&'static str> {
    let mut tables = Vec::new();
    for script in
        std::iter::once(entry.lesson.schema).chain(stage::schemas(entry.requires().services))
    {
        if !script.trim().is_empty() && !tables.contains(&script) {
            tables.push(script);
        }
    }
    tables
}

/// The run's fault plane and services. What was started is stopped again if the rest fails.
async fn start(
    entry: Entry,
    space: &RunSpace,
    narrator: &Narrator,
    checkpoints: &Checkpoints,
    tasks: &TaskTracker,
    config: &RunConfig,
) -> Result<(Option<Faults>, Stage), ScenarioError> {
    let requires = entry.requires();
    // One-shot faults exist only in the embedded proxy; toxics work on either.
    let faults = match (&config.toxiproxy_url, requires.faults) {
        (_, FaultUse::None) => None,
        (Some(url), FaultUse::Toxics(_)) => {
            Some(Faults::external(url, &space.run_id, &config.proxies).await?)
        }
        _ => Some(Faults::embedded(&space.run_id, tasks).await?),
    }
    .map(|faults| faults.narrated(narrator.clone()));
    let stage_config = StageConfig {
        space,
        narrator: Some(narrator.clone()),
        checkpoints: checkpoints.clone(),
        tasks: tasks.clone(),
        faults: faults.as_ref(),
        hops: requires.faults.hops(),
    };
    match Stage::start(requires.services, &stage_config, Ports::Free).await {
        Ok(stage) => Ok((faults, stage)),
        Err(e) => {
            if let Some(faults) = faults {
                faults.release().await;
            }
            Err(e.into())
        }
    }
}

/// Ends a run whose script has ended: stops its services and fault API, waits (boundedly) for
/// the work they spawned, releases its proxies and its space. Returns what `--keep` kept, and
/// whether the space was released.
async fn wind_down(
    ctx: Ctx,
    tasks: TaskTracker,
    servers: &Servers,
    config: &RunConfig,
) -> (Option<KeptRun>, Result<(), InfraError>) {
    let (space, mut faults, stage) = ctx.into_parts();
    stage.stop().await;
    // The fault API is one of the run's tasks and serves until stopped: stop it first, or the
    // wait below would always last its whole grace. The proxies stay up for work in flight.
    if let Some(faults) = &mut faults {
        faults.stop_api().await;
    }
    tasks.close();
    let _ = tokio::time::timeout(SPAWNED_WORK_GRACE, tasks.wait()).await;
    if let Some(faults) = faults {
        faults.release().await;
    }
    let kept = config.keep.then(|| KeptRun {
        schema: space.schema.clone(),
        prefix: space.prefix.clone(),
        pg_url: space.pg_url.clone(),
        redis_url: space.redis_url.clone(),
    });
    let released = backstage(space.release(servers, config.keep)).await;
    (kept, released)
}
