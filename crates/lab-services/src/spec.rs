//! A bundled service as a spec, and the one way to start it.
//!
//! Every service the lab bundles (the report service, the payment service and its provider, the
//! gateway and orders, the mailer) is described by a [`ServiceSpec`]: its name,
//! which servers it needs, the tables it owns, the services it calls, its checkpoints, and a
//! function that builds its router from a [`ServiceEnv`]. A scenario run and `lab serve` both
//! start services from their specs through [`launch`], so a service is never wired up by hand
//! twice.
//!
//! A service does not render anything. It reports what it does through an [`Observer`] (the lab
//! turns that into narration and, in step mode, a pause), and it offers [`Checkpoints`] where a
//! scenario can hold or order requests.
//!
//! ```text
//! ServiceSpec ──router(env)──▶ Router ──launch(listener)──▶ RunningService ──stop()──▶ gone
//!                 ▲
//!   ServiceEnv: database pool, Redis, key prefix, peers' URLs, observer, checkpoints, tasks
//! ```

use lab_core::trace::Traced;
use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tracing::Instrument as _;

use axum::Router;
use lab_core::{Checkpoints, Msg};
use lab_infra::Needs;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A future an [`Observer`] returns (boxed, so the trait stays object safe).
pub type ObserveFuture<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Where a service reports what it does. The lab narrates it; in step mode it pauses there,
/// which is why reporting is a future the handler awaits.
pub trait Observer: Send + Sync {
    fn observe<'a>(&'a self, service: &'static str, what: Msg) -> ObserveFuture<'a>;
}

/// A service's voice: its observer, which a scenario may mute (a race whose interleaving must
/// not show in the narrative). Cheap to clone; clones share the mute switch.
#[derive(Clone, Default)]
pub struct Voice {
    observer: Option<Arc<dyn Observer>>,
    muted: Arc<AtomicBool>,
}

impl Voice {
    pub fn new(observer: Option<Arc<dyn Observer>>) -> Voice {
        Voice {
            observer,
            muted: Arc::default(),
        }
    }

    /// Stops (or resumes) reporting.
    pub fn mute(&self, muted: bool) {
        self.muted.store(muted, Ordering::SeqCst);
    }

    /// Reports `what` from inside `service`, unless muted.
    pub async fn tell(&self, service: &'static str, what: Msg) {
        if let Some(observer) = &self.observer
            && !self.muted.load(Ordering::SeqCst)
        {
            observer.observe(service, what).await;
        }
    }
}

/// A named point inside a service, and what a scenario can use it for.
#[derive(Debug, Clone, Copy)]
pub struct Checkpoint {
    pub name: &'static str,
    pub about: &'static str,
}

/// What a bundled service is and how to build it.
pub struct ServiceSpec {
    /// Its name: in narration, in `lab serve`'s table, and as the name of its fault-proxy hop.
    pub name: &'static str,
    /// How people call it (`lab serve`'s table).
    pub title: &'static str,
    /// The servers it talks to.
    pub needs: Needs,
    /// Its tables (SQL run in the run's own schema before it starts); empty when it has none.
    pub schema: &'static str,
    /// The services it calls: they are started first, and their URLs reach it in
    /// [`ServiceEnv::peers`] (through their fault-proxy hop when they have one).
    pub calls: &'static [&'static ServiceSpec],
    /// Where a scenario can intervene.
    pub checkpoints: &'static [Checkpoint],
    /// What to try against it with curl in `lab serve` (`{url}`: through its proxy, `{direct}`,
    /// `{api}`: the Toxiproxy API).
    pub demo: &'static str,
    /// Builds its router.
    pub router: fn(ServiceEnv) -> Result<Router, ServiceError>,
}

impl std::fmt::Debug for ServiceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceSpec")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl ServiceSpec {
    /// The servers this service and every service it calls need.
    pub fn all_needs(&self) -> Needs {
        self.calls
            .iter()
            .fold(self.needs, |acc, callee| acc.union(callee.all_needs()))
    }
}

/// Why a service could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("the {service} service needs {what}, and this run has none")]
    Missing {
        service: &'static str,
        what: &'static str,
    },
    #[error("the {service} service cannot use Redis: {source}")]
    Redis {
        service: &'static str,
        #[source]
        source: redis::RedisError,
    },
    #[error("cannot serve the {service} service: {source}")]
    Io {
        service: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Everything a service gets from the run that starts it.
///
/// A stage fills every field; a test builds one with only what its service needs:
/// `ServiceEnv::default().with_pg(pool).with_peer(provider::NAME, url)`.
#[derive(Clone, Default)]
pub struct ServiceEnv {
    /// The run's PostgreSQL pool (its `search_path` is the run's schema).
    pub pg: Option<PgPool>,
    /// The run's Redis, as this service reaches it (through the fault proxy when the run
    /// breaks that link).
    pub redis_url: Option<String>,
    /// Every Redis key the service writes starts with this (`lab:<run>:`).
    pub key_prefix: String,
    /// Base URLs (`http://127.0.0.1:PORT`) of the services it calls, by name.
    pub peers: BTreeMap<&'static str, String>,
    pub voice: Voice,
    pub checkpoints: Checkpoints,
    /// Work that must outlive the request that started it (a commit the client stopped waiting
    /// for) is spawned here, so the run waits for it before it ends.
    pub tasks: TaskTracker,
}

impl ServiceEnv {
    /// With the run's PostgreSQL pool.
    pub fn with_pg(mut self, pool: PgPool) -> ServiceEnv {
        self.pg = Some(pool);
        self
    }

    /// With the run's Redis, as the service reaches it.
    pub fn with_redis(mut self, url: impl Into<String>) -> ServiceEnv {
        self.redis_url = Some(url.into());
        self
    }

    /// With the prefix of every Redis key the service writes.
    pub fn with_key_prefix(mut self, prefix: impl Into<String>) -> ServiceEnv {
        self.key_prefix = prefix.into();
        self
    }

    /// With the base URL of a service it calls.
    pub fn with_peer(mut self, name: &'static str, url: impl Into<String>) -> ServiceEnv {
        self.peers.insert(name, url.into());
        self
    }

    /// With the voice it reports through (silent by default).
    pub fn with_voice(mut self, voice: Voice) -> ServiceEnv {
        self.voice = voice;
        self
    }

    /// With the checkpoints a test holds or orders its requests at.
    pub fn with_checkpoints(mut self, checkpoints: Checkpoints) -> ServiceEnv {
        self.checkpoints = checkpoints;
        self
    }

    /// With the tracker its handed-off work is spawned on (a fresh one by default).
    pub fn with_tasks(mut self, tasks: TaskTracker) -> ServiceEnv {
        self.tasks = tasks;
        self
    }

    /// The database, or a clear error naming the service that needed it.
    pub fn pg(&self, service: &'static str) -> Result<PgPool, ServiceError> {
        self.pg.clone().ok_or(ServiceError::Missing {
            service,
            what: "PostgreSQL",
        })
    }

    /// A connection to the run's Redis, as [`redis_connection`] makes it: lazy, so a service
    /// starts even while Redis is unreachable. The coordinator bounds its own commands
    /// (`command_timeout`), so a payment never waits for this connection's backstop.
    pub fn redis(&self, service: &'static str) -> Result<RedisLink, ServiceError> {
        let url = self.redis_url.as_deref().ok_or(ServiceError::Missing {
            service,
            what: "Redis",
        })?;
        redis_connection(url).map_err(|source| ServiceError::Redis { service, source })
    }

    /// The URL of a service this one calls.
    pub fn peer(&self, service: &'static str, peer: &'static str) -> Result<String, ServiceError> {
        self.peers.get(peer).cloned().ok_or(ServiceError::Missing {
            service,
            what: "the URL of a service it calls",
        })
    }
}

/// A connection to Redis at `url` that gives up on a dead Redis and reconnects by itself: what the bundled
/// services (and the lab's own workers) use. Lazy: it connects on first use, so it can be made
/// while Redis is unreachable.
pub fn redis_connection(url: &str) -> redis::RedisResult<RedisLink> {
    let client = redis::Client::open(url)?;
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(REDIS_TIMEOUT))
        .set_response_timeout(Some(REDIS_TIMEOUT))
        // Reconnect quickly in the background instead of stalling commands on retries.
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(100));
    redis::aio::ConnectionManager::new_lazy_with_config(client, config).map(Traced::new)
}

/// A connection to the run's Redis that reconnects by itself and reports each command it sends
/// (what `--show-commands` shows).
pub type RedisLink = Traced<redis::aio::ConnectionManager>;

/// How long a Redis connection may take to connect or to answer one command before it is
/// treated as dead: a backstop, not a bound any lesson shows. A healthy Redis on a loaded
/// machine (a course CI running several labs at once) can take a few hundred milliseconds to
/// answer; that must not turn into an error in the middle of a story. Where a lesson needs a
/// tight bound, it sets its own: the coordinator's `command_timeout` (250 ms) in `redis-down`.
const REDIS_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a stopping service may take to finish the requests it is serving before they are
/// cut. A handler paused in step mode is cut, not waited for.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// A service serving on a loopback port.
///
/// [`RunningService::stop`] stops it gracefully: no new connections, requests in flight finish
/// (for up to two seconds), then whatever is left is aborted. Dropping it without `stop` (the run
/// was cancelled) aborts at once.
pub struct RunningService {
    pub name: &'static str,
    pub addr: SocketAddr,
    pub voice: Voice,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// Serves `spec` on `listener`: builds its router from `env` and spawns the server on
/// `env.tasks`.
pub fn launch(
    spec: &'static ServiceSpec,
    env: ServiceEnv,
    listener: TcpListener,
) -> Result<RunningService, ServiceError> {
    let io = |source| ServiceError::Io {
        service: spec.name,
        source,
    };
    let addr = listener.local_addr().map_err(io)?;
    let voice = env.voice.clone();
    let tasks = env.tasks.clone();
    let router = (spec.router)(env)?;
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    // Everything the service does runs in its span (a child of the run's, when a run starts
    // it), so the statements and commands its handlers execute are told as its own.
    let task = tasks.spawn(
        crate::http::serve(listener, router, stopped, crate::http::Limits::default())
            .instrument(lab_core::trace::service_span(spec.name)),
    );
    Ok(RunningService {
        name: spec.name,
        addr,
        voice,
        stop,
        task,
    })
}

impl RunningService {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting, lets requests in flight finish, aborts what is left after the grace.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if tokio::time::timeout(STOP_GRACE, &mut self.task)
            .await
            .is_err()
        {
            self.task.abort();
        }
    }
}

impl Drop for RunningService {
    fn drop(&mut self) {
        // Not stopped gracefully (the run was cancelled): connections still open, a handler
        // paused in step mode, must not keep the service alive.
        self.stop.cancel();
        self.task.abort();
    }
}
