//! The stage: the bundled services of a scenario run (or of `lab serve`), started from their
//! specs in one way.
//!
//! [`Stage::start`] takes the specs a run needs, adds the services they call, and starts every
//! one after the services it calls: each gets the run's database and Redis, its own listener,
//! and the URLs of its peers. A service listed as a hop gets a fault-proxy hop in front of it,
//! named after the service: everyone who calls it (a worker, or another service) goes through
//! the hop, so the run can break exactly that link.
//!
//! A scenario's runner uses free ports; `lab serve` hands in listeners on fixed ports. Nothing
//! else differs.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use lab_core::{Checkpoints, Msg, Narrator};
use lab_infra::RunSpace;
use tokio::net::TcpListener;
use tokio_util::task::TaskTracker;

use crate::faults::Faults;
use crate::spec::ObserveFuture;
use crate::{Observer, RunningService, ServiceEnv, ServiceError, ServiceSpec, Voice, launch};

/// A link the fault proxy sits on, so a run can break it.
#[derive(Debug, Clone, Copy)]
pub enum Hop {
    /// Everyone who calls this service (a worker, another service) goes through a proxy named
    /// after it.
    Service(&'static ServiceSpec),
    /// The services' connections to Redis go through a proxy named `redis`; the lab itself (and
    /// everyone else) still reaches the real Redis directly.
    Redis,
}

impl Hop {
    /// The proxy's name (prefixed with the run's name in a run).
    pub fn name(self) -> &'static str {
        match self {
            Hop::Service(spec) => spec.name,
            Hop::Redis => REDIS_HOP,
        }
    }
}

/// The name of the proxy in front of Redis.
pub const REDIS_HOP: &str = "redis";

/// Why a stage could not start.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error(transparent)]
    Service(#[from] ServiceError),
    #[error("cannot start a service: {0}")]
    Io(#[from] std::io::Error),
    #[error("fault proxy: {0}")]
    Faults(#[from] faultproxy::client::ClientError),
    /// A hop was asked for and the run has no fault plane: a bug in what the run declared.
    #[error("{0} needs a hop, and the run has no fault proxy")]
    NoFaultPlane(String),
    /// `lab serve` bound no port for a service it starts.
    #[error("no port for the {0} service")]
    NoPort(&'static str),
    #[error("the run's Redis URL: {0}")]
    RedisUrl(String),
}

/// Narrates what services report: the [`Observer`] the lab gives its services.
struct Narrated(Narrator);

impl Observer for Narrated {
    fn observe<'a>(&'a self, service: &'static str, what: Msg) -> ObserveFuture<'a> {
        Box::pin(self.0.service(service, what))
    }
}

/// Where each service listens.
pub enum Ports {
    /// Free loopback ports (a scenario run).
    Free,
    /// `lab serve`: listeners already bound and the addresses of their hops, by service, and
    /// where the Redis hop listens.
    Fixed {
        services: BTreeMap<&'static str, (TcpListener, String)>,
        redis_hop: String,
    },
}

/// What the services of a stage share.
pub struct StageConfig<'a> {
    pub space: &'a RunSpace,
    /// Tells what the services do (`None`: they stay silent).
    pub narrator: Option<Narrator>,
    pub checkpoints: Checkpoints,
    /// Where the services spawn their work, awaited when the run ends.
    pub tasks: TaskTracker,
    /// The fault plane: needed when `hops` is not empty.
    pub faults: Option<&'a Faults>,
    /// The links that go through a proxy hop.
    pub hops: &'a [Hop],
}

impl StageConfig<'_> {
    fn hopped(&self, spec: &ServiceSpec) -> bool {
        self.hops
            .iter()
            .any(|hop| matches!(hop, Hop::Service(s) if s.name == spec.name))
    }

    fn faults(&self, what: &str) -> Result<&Faults, StageError> {
        self.faults
            .ok_or_else(|| StageError::NoFaultPlane(what.to_string()))
    }
}

/// A started service, and how to reach it.
pub struct ServiceHandle {
    pub spec: &'static ServiceSpec,
    /// How callers reach it: through its hop when it has one, else directly.
    pub url: String,
    /// Its own address, past any proxy.
    pub direct: SocketAddr,
    /// The hop's listening address, when it has one.
    pub hop: Option<SocketAddr>,
    running: RunningService,
}

impl ServiceHandle {
    /// Its voice: mute it for a race whose interleaving must not show in the narrative.
    pub fn voice(&self) -> &Voice {
        &self.running.voice
    }
}

/// The running services of a run.
#[derive(Default)]
pub struct Stage {
    services: Vec<ServiceHandle>,
    /// How the services reach Redis.
    redis_url: Option<String>,
    /// The Redis proxy's listening address, when the run breaks that link.
    redis_hop: Option<SocketAddr>,
}

impl Stage {
    /// Starts `specs` and the services they call, each after its callees.
    pub async fn start(
        specs: &[&'static ServiceSpec],
        config: &StageConfig<'_>,
        mut ports: Ports,
    ) -> Result<Stage, StageError> {
        let observer: Option<Arc<dyn Observer>> = config
            .narrator
            .clone()
            .map(|n| Arc::new(Narrated(n)) as Arc<dyn Observer>);
        // The services' link to Redis, through its proxy when the run breaks it.
        let mut stage = Stage {
            redis_url: config.space.redis_url.clone(),
            ..Stage::default()
        };
        if config.hops.iter().any(|hop| matches!(hop, Hop::Redis))
            && let Some(url) = &config.space.redis_url
        {
            let upstream = redis_addr(url)?;
            let at = match &ports {
                Ports::Free => "127.0.0.1:0",
                Ports::Fixed { redis_hop, .. } => redis_hop.as_str(),
            };
            let listen = config
                .faults("Redis")?
                .hop_at(REDIS_HOP, at, upstream)
                .await?;
            stage.redis_url = Some(with_addr(url, listen)?);
            stage.redis_hop = Some(listen);
        }
        for spec in in_start_order(specs) {
            let (listener, hop_listen) = match &mut ports {
                Ports::Free => (
                    TcpListener::bind("127.0.0.1:0").await?,
                    "127.0.0.1:0".to_string(),
                ),
                Ports::Fixed { services, .. } => services
                    .remove(spec.name)
                    .ok_or(StageError::NoPort(spec.name))?,
            };
            let peers = spec
                .calls
                .iter()
                .filter_map(|callee| Some((callee.name, stage.get(callee)?.url.clone())))
                .collect();
            let env = ServiceEnv {
                pg: config.space.pg.clone(),
                redis_url: stage.redis_url.clone(),
                key_prefix: config.space.prefix.clone(),
                peers,
                voice: Voice::new(observer.clone()),
                checkpoints: config.checkpoints.clone(),
                tasks: config.tasks.clone(),
            };
            let running = launch(spec, env, listener)?;
            let direct = running.addr;
            let hop = if config.hopped(spec) {
                let faults = config.faults(spec.title)?;
                Some(faults.hop_at(spec.name, &hop_listen, direct).await?)
            } else {
                None
            };
            stage.services.push(ServiceHandle {
                spec,
                url: format!("http://{}", hop.unwrap_or(direct)),
                direct,
                hop,
                running,
            });
        }
        Ok(stage)
    }

    /// A started service.
    pub fn get(&self, spec: &ServiceSpec) -> Option<&ServiceHandle> {
        self.services.iter().find(|s| s.spec.name == spec.name)
    }

    /// How the services reach Redis (through its hop when the run breaks that link).
    pub fn redis_url(&self) -> Option<&str> {
        self.redis_url.as_deref()
    }

    /// The Redis proxy's address, when the services reach Redis through one.
    pub fn redis_hop(&self) -> Option<SocketAddr> {
        self.redis_hop
    }

    /// Every started service, in start order.
    pub fn services(&self) -> &[ServiceHandle] {
        &self.services
    }

    /// Stops every service gracefully, callers first.
    pub async fn stop(self) {
        for handle in self.services.into_iter().rev() {
            handle.running.stop().await;
        }
    }
}

/// The address of the Redis in `url` (`redis://host:port/…`).
pub fn redis_addr(url: &str) -> Result<SocketAddr, StageError> {
    let parsed = url::Url::parse(url).map_err(|e| StageError::RedisUrl(e.to_string()))?;
    let host = parsed.host_str().unwrap_or("127.0.0.1");
    let port = parsed.port().unwrap_or(6379);
    std::net::ToSocketAddrs::to_socket_addrs(&(host, port))?
        .next()
        .ok_or_else(|| StageError::RedisUrl(format!("the host {host} has no address")))
}

/// `url` pointed at `addr` instead (the proxy), keeping its user, password and database.
pub fn with_addr(url: &str, addr: SocketAddr) -> Result<String, StageError> {
    let mut parsed = url::Url::parse(url).map_err(|e| StageError::RedisUrl(e.to_string()))?;
    let moved = parsed.set_ip_host(addr.ip()).is_ok() && parsed.set_port(Some(addr.port())).is_ok();
    if !moved {
        return Err(StageError::RedisUrl(format!(
            "cannot point it at the proxy {addr}"
        )));
    }
    Ok(parsed.into())
}

/// `specs` and everything they call, each after the services it calls, each once.
fn in_start_order(specs: &[&'static ServiceSpec]) -> Vec<&'static ServiceSpec> {
    fn visit(spec: &'static ServiceSpec, order: &mut Vec<&'static ServiceSpec>) {
        if order.iter().any(|s| s.name == spec.name) {
            return;
        }
        for callee in spec.calls {
            visit(callee, order);
        }
        order.push(spec);
    }
    let mut order = Vec::new();
    for spec in specs {
        visit(spec, &mut order);
    }
    order
}

/// The tables of `specs` and of the services they call, in start order.
pub fn schemas(specs: &[&'static ServiceSpec]) -> Vec<&'static str> {
    in_start_order(specs)
        .into_iter()
        .map(|s| s.schema)
        .filter(|sql| !sql.trim().is_empty())
        .collect()
}
