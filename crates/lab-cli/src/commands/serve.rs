//! `lab serve`: every bundled service on fixed loopback ports, each behind a fault proxy, and the
//! Toxiproxy API to break them live in class.
//!
//! Ports are fixed (and documented) so an instructor can prepare curl lines in advance. Service
//! number `i` of [`lab_services::ALL`] (the report service is 0) gets:
//!
//! | port            | what                                              |
//! |-----------------|---------------------------------------------------|
//! | base + 4        | the Toxiproxy API (8474 by default)               |
//! | base + 10 + i   | the service, through the proxy named after it     |
//! | base + 20 + i   | the service, direct (the proxy's upstream)        |
//!
//! `--port-base` moves all of them. The services are started from their specs exactly as a
//! scenario run starts them (`lab_scenarios::stage`); they narrate what they do, in the chosen
//! language, as requests arrive (and pause there with `--step`). Ctrl-C stops everything and
//! removes the session's schema and the throwaway servers.

use std::collections::BTreeMap;

use lab_core::Checkpoints;
use lab_infra::{Needs, Origin, RunSpace, Servers};
use lab_scenarios::stage::{self, Ports, Stage, StageConfig};
use lab_scenarios::{Faults, Hop};
use lab_services::{ALL, ServiceSpec};
use tokio::net::TcpListener;
use tokio_util::task::TaskTracker;

use crate::cli::{Global, exit};
use crate::session::{Failure, Guarded, Mode, Session};

/// Where the API, each service's proxy and each service listen.
struct Plan {
    api: u16,
    redis_hop: u16,
    /// (service, its proxy's port, its own port)
    services: Vec<(&'static ServiceSpec, u16, u16)>,
}

impl Plan {
    fn from_base(base: u16) -> Result<Plan, Failure> {
        let last = 20 + ALL.len() as u16 - 1;
        let at = |offset: u16| {
            base.checked_add(offset).ok_or_else(|| {
                Failure::usage(format!(
                    "--port-base {base} is too high (max {})",
                    u16::MAX - last
                ))
            })
        };
        at(last)?;
        let services = ALL
            .iter()
            .enumerate()
            .map(|(i, spec)| Ok((*spec, at(10 + i as u16)?, at(20 + i as u16)?)))
            .collect::<Result<_, Failure>>()?;
        Ok(Plan {
            api: at(4)?,
            redis_hop: at(9)?,
            services,
        })
    }
}

/// Binds a loopback port, or explains that it is taken.
async fn bind(port: u16, what: &str) -> Result<TcpListener, Failure> {
    TcpListener::bind(("127.0.0.1", port)).await.map_err(|e| {
        Failure::environment(anyhow::anyhow!(
            "cannot listen on 127.0.0.1:{port} for {what}: {e}; stop whatever uses it, or move \
             every port with --port-base"
        ))
    })
}

/// The listeners of the plan, bound before any server starts so a taken port is reported at
/// once. A proxy's port is only probed (the proxy binds it itself), so it could still be taken
/// meanwhile; that too ends with a clear message and exit 3.
struct Bound {
    api: TcpListener,
    direct: BTreeMap<&'static str, (TcpListener, String)>,
}

async fn bind_all(plan: &Plan) -> Result<Bound, Failure> {
    let api = bind(plan.api, "the Toxiproxy API").await?;
    drop(bind(plan.redis_hop, "the Redis proxy").await?);
    let mut direct = BTreeMap::new();
    for (spec, proxy, own) in &plan.services {
        let listener = bind(*own, &format!("the {} service", spec.name)).await?;
        drop(bind(*proxy, &format!("the {} service's proxy", spec.name)).await?);
        direct.insert(spec.name, (listener, format!("127.0.0.1:{proxy}")));
    }
    Ok(Bound { api, direct })
}

fn print_endpoints(plan: &Plan, servers: &Servers, space: &RunSpace, stage: &Stage) {
    let api = format!("http://127.0.0.1:{}", plan.api);
    say!("lab serve: the bundled services on 127.0.0.1 (Ctrl-C stops everything)");
    say!();
    say!("  service          through the fault proxy      direct");
    for handle in stage.services() {
        say!(
            "  {:<16} {:<28} http://{}",
            handle.spec.title,
            handle.url,
            handle.direct
        );
    }
    say!("  {:<16} {api}", "Toxiproxy API");
    for handle in stage.services() {
        if let Some(hop) = handle.hop {
            say!(
                "  {:<16} proxy \"{}\": {hop} → {}",
                "",
                handle.spec.name,
                handle.direct
            );
        }
    }
    if let Some(hop) = stage.redis_hop() {
        say!(
            "  {:<16} proxy \"redis\": {hop} → the services' Redis (cut it to see fail-open)",
            ""
        );
    }
    if let Some(url) = &space.pg_url {
        say!("  {:<16} {url}", "PostgreSQL");
    }
    if let Some(redis) = &servers.redis {
        let origin = match redis.origin {
            Origin::Given => "given",
            Origin::Throwaway => "throwaway",
        };
        say!(
            "  {:<16} {} ({origin}; keys of this session: {}*)",
            "Redis",
            redis.url,
            space.prefix
        );
    }
    say!();
    say!("Try:");
    for handle in stage.services() {
        let demo = handle
            .spec
            .demo
            .replace("{url}", &handle.url)
            .replace("{direct}", &format!("http://{}", handle.direct))
            .replace("{api}", &api);
        say!("{demo}");
    }
    say!();
}

pub async fn serve(global: &Global, port_base: u16) -> Result<u8, Failure> {
    let plan = Plan::from_base(port_base)?;
    let session = Session::open(global, Mode::Live)?;
    let bound = bind_all(&plan).await?;

    let needs = ALL
        .iter()
        .fold(Needs::default(), |acc, s| acc.union(s.all_needs()));
    // Ctrl-C is how serve ends, whenever it comes.
    let Ok(servers) = session.start_servers(needs).await? else {
        return Ok(exit::OK);
    };
    let space = match RunSpace::create(&servers, &stage::schemas(ALL)).await {
        Ok(space) => space,
        Err(e) => {
            session.close(servers).await;
            return Err(Failure::environment(e));
        }
    };

    let tasks = TaskTracker::new();
    let started = session
        .guarded(start_services(
            &session, &plan, bound, &servers, &space, &tasks,
        ))
        .await;
    let outcome = match started {
        Guarded::Finished(Ok((stage, faults))) => {
            // Serve until Ctrl-C (or `q` in step mode), then stop the services gracefully.
            session.guarded(std::future::pending::<()>()).await;
            stage.stop().await;
            faults.release().await;
            Ok(())
        }
        Guarded::Finished(Err(e)) => Err(e),
        Guarded::Interrupted(_) | Guarded::Quit => Ok(()),
    };
    tasks.close();
    let _ = space.release(&servers, session.config.keep).await;
    session.close(servers).await;
    outcome?;
    eprintln!("lab serve: stopped; services, schema and throwaway servers are gone");
    Ok(exit::OK)
}

/// Starts the API and the services, and prints where they are.
async fn start_services(
    session: &Session,
    plan: &Plan,
    bound: Bound,
    servers: &Servers,
    space: &RunSpace,
    tasks: &TaskTracker,
) -> Result<(Stage, Faults), Failure> {
    let faults = Faults::embedded_on(bound.api, "", tasks).map_err(Failure::environment)?;
    // Every service behind its proxy, and the services' link to Redis behind one too.
    let hops: Vec<Hop> = ALL
        .iter()
        .map(|spec| Hop::Service(spec))
        .chain(servers.redis.is_some().then_some(Hop::Redis))
        .collect();
    let config = StageConfig {
        space,
        narrator: Some(session.live_narrator(&session.sink())),
        checkpoints: Checkpoints::new(),
        tasks: tasks.clone(),
        faults: Some(&faults),
        hops: &hops,
    };
    let ports = Ports::Fixed {
        services: bound.direct,
        redis_hop: format!("127.0.0.1:{}", plan.redis_hop),
    };
    let stage = Stage::start(ALL, &config, ports)
        .await
        .map_err(|e| Failure::environment(anyhow::anyhow!("cannot start the services: {e}")))?;
    print_endpoints(plan, servers, space, &stage);
    Ok((stage, faults))
}
