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
//! scenario run starts them (`lab_services::stage`); they narrate what they do, in the chosen
//! language, as requests arrive (and pause there with `--step`). Ctrl-C stops everything and
//! removes the session's schema and the throwaway servers.

use std::collections::BTreeMap;

use std::time::Duration;

use lab_core::{Bounds, Checkpoints, Narrator};
use lab_infra::{Needs, Origin, RunSpace, Servers};
use lab_services::faults::Faults;
use lab_services::stage::Hop;
use lab_services::stage::{self, Ports, Stage, StageConfig};
use lab_services::{ALL, ServiceSpec};
use tokio::net::TcpListener;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;

use lab_core::Msg;
use lab_scenarios::Library;

use crate::exit::{self, Failure};
use crate::session::{Ended, Mode, Session, SessionOptions};
use crate::words::t;

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
                Failure::usage(t(Msg::new("serve.port_base")
                    .arg("base", base)
                    .arg("max", u16::MAX - last)))
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

/// Binds a loopback port, or explains that it is taken. `what` is told in the learner's
/// language.
async fn bind(port: u16, what: Msg) -> Result<TcpListener, Failure> {
    TcpListener::bind(("127.0.0.1", port)).await.map_err(|e| {
        Failure::environment(anyhow::anyhow!(t(Msg::new("serve.cannot_listen")
            .arg("port", port)
            .arg("what", t(what))
            .arg("error", e.to_string()))))
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
    let api = bind(plan.api, Msg::new("serve.for_api")).await?;
    drop(bind(plan.redis_hop, Msg::new("serve.for_redis_proxy")).await?);
    let mut direct = BTreeMap::new();
    for (spec, proxy, own) in &plan.services {
        let listener = bind(*own, Msg::new("serve.for_service").arg("name", spec.name)).await?;
        let proxy_of = Msg::new("serve.for_service_proxy").arg("name", spec.name);
        drop(bind(*proxy, proxy_of).await?);
        direct.insert(spec.name, (listener, format!("127.0.0.1:{proxy}")));
    }
    Ok(Bound { api, direct })
}

/// A service's demo with its comments in the learner's language: the k-th comment line is
/// replaced by the k-th entry of `cli.serve.demo.<service>` (the commands stay as written).
fn localized_demo(service: &str, demo: &str) -> String {
    let comments = crate::words::list(&format!("serve.demo.{service}"));
    let mut next = comments.iter();
    demo.lines()
        .map(|line| match line.trim_start().strip_prefix("# ") {
            Some(original) => {
                let indent = &line[..line.len() - line.trim_start().len()];
                format!("{indent}# {}", next.next().map_or(original, String::as_str))
            }
            None => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn print_endpoints(plan: &Plan, servers: &Servers, space: &RunSpace, stage: &Stage) {
    let api = format!("http://127.0.0.1:{}", plan.api);
    say!("{}", t("serve.title"));
    say!();
    say!(
        "  {:<16} {:<28} {}",
        t("serve.service"),
        t("serve.proxied"),
        t("serve.direct")
    );
    for handle in stage.services() {
        say!(
            "  {:<16} {:<28} http://{}",
            crate::words::service(handle.spec.name),
            handle.url,
            handle.direct
        );
    }
    say!("  {:<16} {api}", t("serve.api"));
    for handle in stage.services() {
        if let Some(hop) = handle.hop {
            say!(
                "  {:<16} {}",
                "",
                t(Msg::new("serve.proxy")
                    .arg("name", handle.spec.name)
                    .arg("hop", hop.to_string())
                    .arg("direct", handle.direct.to_string()))
            );
        }
    }
    if let Some(hop) = stage.redis_hop() {
        say!(
            "  {:<16} {}",
            "",
            t(Msg::new("serve.redis_proxy").arg("hop", hop.to_string()))
        );
    }
    if let Some(url) = &space.pg_url {
        say!("  {:<16} {url}", "PostgreSQL");
    }
    if let Some(redis) = &servers.redis {
        let origin = match redis.origin {
            Origin::Given => t("serve.given"),
            Origin::Throwaway => t("serve.throwaway"),
        };
        say!(
            "  {:<16} {}",
            "Redis",
            t(Msg::new("serve.redis")
                .arg("url", redis.url.as_str())
                .arg("origin", origin)
                .arg("prefix", space.prefix.as_str()))
        );
    }
    say!();
    say!("{}", t("serve.try"));
    for handle in stage.services() {
        let demo = handle
            .spec
            .demo
            .replace("{url}", &handle.url)
            .replace("{direct}", &format!("http://{}", handle.direct))
            .replace("{api}", &api);
        say!("{}", localized_demo(handle.spec.name, &demo));
    }
    say!();
}

pub async fn serve(
    options: SessionOptions,
    library: Library,
    port_base: u16,
) -> Result<u8, Failure> {
    let plan = Plan::from_base(port_base)?;
    let session = Session::open(options, library, Mode::Live);
    let bound = bind_all(&plan).await?;
    let needs = ALL
        .iter()
        .fold(Needs::default(), |acc, s| acc.union(s.all_needs()));
    let served = session
        .with_servers(
            needs,
            async |servers| start(&session, &plan, bound, servers).await,
            async |servers, ended| match ended {
                // Serve until Ctrl-C (or `q` in step mode), then stop the services gracefully.
                Ended::Finished(Ok(serving)) => {
                    tokio::select! {
                        _ = session.interrupted() => {}
                        _ = session.gate.quit_requested() => {}
                    }
                    serving.stop(servers, session.config.keep).await;
                    Ok(())
                }
                Ended::Finished(Err(failure)) => Err(failure),
                // Ctrl-C is how serve ends, whenever it comes.
                Ended::Interrupted(_) | Ended::Quit => Ok(()),
            },
        )
        .await;
    match served {
        Ok(()) => {
            eprintln!("{}", t("serve.stopped"));
            Ok(exit::OK)
        }
        // A signal while the servers start: nothing was served, and serve ends as it always
        // does.
        Err(failure) if matches!(failure.code, exit::INTERRUPTED | exit::TERMINATED) => {
            Ok(exit::OK)
        }
        Err(failure) => Err(failure),
    }
}

/// What `lab serve` runs until it is stopped.
struct Serving {
    space: RunSpace,
    stage: Stage,
    faults: Faults,
    tasks: TaskTracker,
    /// Ends the task that tells, once a second, how many lines the narrator held back.
    teller: DropGuard,
}

impl Serving {
    /// Stops the services gracefully, then the proxies, then drops the session's schema and
    /// keys (unless `--keep`).
    async fn stop(self, servers: &Servers, keep: bool) {
        drop(self.teller);
        self.stage.stop().await;
        self.faults.release().await;
        self.tasks.close();
        let _ = self.space.release(servers, keep).await;
    }
}

/// The session's space, the API and the services, and where they are, printed.
async fn start(
    session: &Session,
    plan: &Plan,
    bound: Bound,
    servers: &Servers,
) -> Result<Serving, Failure> {
    let space = RunSpace::create(servers, &stage::schemas(ALL))
        .await
        .map_err(Failure::environment)?;
    let tasks = TaskTracker::new();
    let narrator = session.live_narrator_within(&session.sink(), BOUNDS);
    match start_services(plan, bound, servers, &space, &tasks, &narrator).await {
        Ok((stage, faults)) => Ok(Serving {
            space,
            stage,
            faults,
            teller: tell_held_back_every_second(narrator, &tasks),
            tasks,
        }),
        Err(failure) => {
            tasks.close();
            let _ = space.release(servers, session.config.keep).await;
            Err(failure)
        }
    }
}

/// What `lab serve`'s narrator keeps and shows. A person reads a few lines a second; a load
/// generator (`wrk` against the report service) makes thousands, and rendering each cost a fifth
/// of the service's throughput under such a storm, for lines nobody can read. Forty a second
/// is more than any class sends by hand. A look (`--step`) shows the last thousand events.
const BOUNDS: Bounds = Bounds {
    history: Some(1000),
    service_lines_per_second: Some(40),
};

/// Tells the narrator's held-back count every second, until the guard is dropped.
fn tell_held_back_every_second(narrator: Narrator, tasks: &TaskTracker) -> DropGuard {
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    tasks.spawn(async move {
        let mut every_second = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = stopped.cancelled() => return,
                _ = every_second.tick() => narrator.tell_held_back(),
            }
        }
    });
    stop.drop_guard()
}

/// Starts the API and the services, and prints where they are.
async fn start_services(
    plan: &Plan,
    bound: Bound,
    servers: &Servers,
    space: &RunSpace,
    tasks: &TaskTracker,
    narrator: &Narrator,
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
        narrator: Some(narrator.clone()),
        checkpoints: Checkpoints::new(),
        tasks: tasks.clone(),
        faults: Some(&faults),
        hops: &hops,
    };
    let ports = Ports::Fixed {
        services: bound.direct,
        redis_hop: format!("127.0.0.1:{}", plan.redis_hop),
    };
    let stage = Stage::start(ALL, &config, ports).await.map_err(|e| {
        Failure::environment(anyhow::anyhow!(t(
            Msg::new("serve.cannot_start").arg("error", e.to_string())
        )))
    })?;
    print_endpoints(plan, servers, space, &stage);
    Ok((stage, faults))
}

#[cfg(test)]
mod tests {
    use lab_core::Lang;
    use lab_core::text::COMMON;

    /// Each comment of a service's demo has its translation, in order: a comment added to the
    /// code without one would be shown in English in a Russian banner.
    #[test]
    fn every_demo_comment_has_its_words_in_both_languages() {
        let texts = lab_scenarios::Library::load()
            .expect("the scenario files")
            .texts;
        for spec in lab_services::ALL {
            let in_code = spec
                .demo
                .lines()
                .filter(|l| l.trim_start().starts_with("# "))
                .count();
            for lang in Lang::ALL {
                let words = texts.list(COMMON, lang, &format!("cli.serve.demo.{}", spec.name));
                assert_eq!(
                    words.len(),
                    in_code,
                    "cli.serve.demo.{} in {}: {} comments in the code",
                    spec.name,
                    lang.code(),
                    in_code
                );
            }
        }
    }
}
