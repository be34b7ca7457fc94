//! `lab serve`: the bundled services on fixed loopback ports, each behind a fault proxy, and the
//! Toxiproxy API to break them live in class.
//!
//! Ports are fixed (and documented) so an instructor can prepare curl lines in advance:
//!
//! | port          | what                                           |
//! |---------------|------------------------------------------------|
//! | base + 4      | the Toxiproxy API (8474 by default)            |
//! | base + 10     | the report service, through proxy `reports`   |
//! | base + 20     | the report service, direct (the proxy's upstream) |
//!
//! `--port-base` moves all of them. Services narrate what they do, in the chosen language, as
//! requests arrive (and pause there with `--step`). Ctrl-C stops everything and removes the
//! session's schema and the throwaway servers.

use std::net::SocketAddr;

use faultproxy::FaultProxy;
use lab_core::Checkpoints;
use lab_core::Narrator;
use lab_infra::{Needs, Origin, RunSpace, Servers};
use lab_scenarios::SCHEMA_SQL;
use lab_services::RunningService;
use lab_services::reports::ReportService;
use tokio::net::TcpListener;

use crate::cli::{Global, exit};
use crate::session::{self, Failure, Guarded, Interrupts};

/// The default port base: the Toxiproxy API lands on 8474, Toxiproxy's own port.
pub const DEFAULT_PORT_BASE: u16 = 8470;

/// The fixed ports of `lab serve`.
struct Ports {
    api: u16,
    reports_proxy: u16,
    reports_direct: u16,
}

impl Ports {
    fn from_base(base: u16) -> Result<Ports, Failure> {
        let at = |offset: u16| {
            base.checked_add(offset).ok_or_else(|| {
                Failure::usage(format!(
                    "--port-base {base} is too high (max {})",
                    u16::MAX - 20
                ))
            })
        };
        Ok(Ports {
            api: at(4)?,
            reports_proxy: at(10)?,
            reports_direct: at(20)?,
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

fn print_endpoints(ports: &Ports, servers: &Servers, space: &RunSpace) {
    let Ports {
        api,
        reports_proxy,
        reports_direct,
    } = ports;
    let proxied = format!("http://127.0.0.1:{reports_proxy}");
    say!("lab serve: the bundled services on 127.0.0.1 (Ctrl-C stops everything)");
    say!();
    say!("  service          through the fault proxy      direct");
    say!(
        "  {:<16} {proxied:<28} http://127.0.0.1:{reports_direct}",
        "report service"
    );
    say!(
        "  {:<16} http://127.0.0.1:{api}  (proxy \"reports\": 127.0.0.1:{reports_proxy} → 127.0.0.1:{reports_direct})",
        "Toxiproxy API"
    );
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
    say!("  # create a report, then send the same request again: 201, then 200 with the same id");
    say!(
        "  curl -i -X POST http://127.0.0.1:{reports_proxy}/reports -H 'Content-Type: application/json' \\\n       -H 'Idempotency-Key: report-task-42' -d '{{\"task_id\":42,\"report_type\":\"monthly\"}}'"
    );
    say!("  # hold every answer of the report service 900 ms on its way back");
    say!(
        "  curl -s -X POST http://127.0.0.1:{api}/proxies/reports/toxics -H 'Content-Type: application/json' \\\n       -d '{{\"type\":\"latency\",\"stream\":\"downstream\",\"attributes\":{{\"latency\":900}}}}'"
    );
    say!("  # a client that waits 150 ms: a timeout, yet the report is created");
    say!(
        "  curl -i --max-time 0.15 -X POST http://127.0.0.1:{reports_proxy}/reports -H 'Content-Type: application/json' \\\n       -H 'Idempotency-Key: report-task-43' -d '{{\"task_id\":43,\"report_type\":\"monthly\"}}'"
    );
    say!("  curl -s http://127.0.0.1:{reports_direct}/reports");
    say!("  # (report ids may skip numbers: an INSERT that meets an existing key still draws one)");
    say!("  # take the service off the network, then heal everything");
    say!("  curl -s -X POST http://127.0.0.1:{api}/proxies/reports -d '{{\"enabled\":false}}'");
    say!("  curl -s -X POST http://127.0.0.1:{api}/reset");
    say!();
}

pub async fn serve(
    global: &Global,
    port_base: u16,
    interrupts: &mut Interrupts,
) -> Result<u8, Failure> {
    let ports = Ports::from_base(port_base)?;
    let lang = session::lang(global);
    let color = session::color(global);
    let library = session::library()?;
    let gate = super::run::gate(global, &library, lang);

    // Take the ports first: a taken port is reported before the servers start. The proxy's port
    // is only probed (the proxy binds it itself later), so it could still be taken meanwhile;
    // that too ends with a clear message and exit 3.
    let api_listener = bind(ports.api, "the Toxiproxy API").await?;
    let direct_listener = bind(ports.reports_direct, "the report service").await?;
    drop(bind(ports.reports_proxy, "the report service's proxy").await?);

    let Some(servers) =
        session::start_servers(global, Needs::BOTH, &library, lang, interrupts).await?
    else {
        // Ctrl-C is how serve ends, whenever it comes.
        return Ok(exit::OK);
    };
    let space = match RunSpace::create(&servers, &[SCHEMA_SQL]).await {
        Ok(space) => space,
        Err(e) => {
            servers.shutdown().await;
            return Err(Failure::environment(e));
        }
    };

    let outcome = session::guarded(
        run_services(
            global,
            &library,
            lang,
            color,
            &gate,
            &ports,
            &servers,
            &space,
            api_listener,
            direct_listener,
        ),
        interrupts,
        &gate,
    )
    .await;
    let kept = global.keep;
    let _ = space.release(&servers, kept).await;
    servers.shutdown().await;
    match outcome {
        Guarded::Finished(Err(e)) => Err(e),
        _ => {
            eprintln!("lab serve: stopped; services, schema and throwaway servers are gone");
            Ok(exit::OK)
        }
    }
}

/// Starts the services and the API, prints where they are, and serves until cancelled.
#[allow(clippy::too_many_arguments)]
async fn run_services(
    global: &Global,
    library: &lab_scenarios::Library,
    lang: lab_core::Lang,
    color: bool,
    gate: &lab_core::Gate,
    ports: &Ports,
    servers: &Servers,
    space: &RunSpace,
    api_listener: TcpListener,
    direct_listener: TcpListener,
) -> Result<(), Failure> {
    let narrator = Narrator::new(
        Some(super::run::sink(global, library, lang, color)),
        gate.clone(),
    );
    let pg = space.pg.clone().expect("serve starts PostgreSQL");
    let reports = ReportService::new(pg, Some(narrator), Checkpoints::new());
    let _reports =
        RunningService::spawn(reports.router(), direct_listener).map_err(Failure::environment)?;

    let proxies = FaultProxy::new();
    let upstream = SocketAddr::from(([127, 0, 0, 1], ports.reports_direct));
    proxies
        .create(
            "reports",
            &format!("127.0.0.1:{}", ports.reports_proxy),
            &upstream.to_string(),
        )
        .await
        .map_err(|e| Failure::environment(anyhow::anyhow!("the report service's proxy: {e}")))?;
    print_endpoints(ports, servers, space);
    proxies
        .serve_api(api_listener)
        .await
        .map_err(|e| Failure::environment(anyhow::anyhow!("the Toxiproxy API stopped: {e}")))
}
