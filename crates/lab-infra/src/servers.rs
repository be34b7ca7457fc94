//! The servers of one `lab` call: the ones the learner gave (`--database-url`, `--redis-url`) or
//! throwaway ones started for this call and removed at its end.
//!
//! [`Servers::shutdown`] is the way out: it closes the connections and awaits the throwaway
//! servers' clean shutdown and the removal of their directories. Dropping [`Servers`] instead
//! (a panic, a cancelled start) still stops and removes everything, but blocks the dropping
//! thread while it does (see [`crate::process`]).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::MultiplexedConnection;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgPool};

use crate::binaries::{PgBinaries, RedisBinary};
use crate::postgres::Cluster;
use crate::process::ThrowawayServer;
use crate::template::TemplatePlace;
use crate::url::PgTarget;
use crate::{InfraError, binaries, postgres, redis_server, url};

/// What the user asked for: given servers (their URLs checked and parsed), or throwaway ones.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    pub database_url: Option<PgTarget>,
    /// A checked `redis://` (or socket) URL.
    pub redis_url: Option<String>,
    /// Where a throwaway PostgreSQL's template is kept: by default as the environment says.
    pub pg_template: TemplatePlace,
}

impl ServerOptions {
    /// The options from flags or environment; an empty value (`DATABASE_URL=`) counts as unset.
    /// Every given URL is checked here, whether or not this call needs that server: a typo is
    /// reported at once, not on the day a scenario needs Redis.
    pub fn new(
        database_url: Option<String>,
        redis_url: Option<String>,
    ) -> Result<ServerOptions, InfraError> {
        let given = |url: Option<String>| url.filter(|u| !u.trim().is_empty());
        let database_url = given(database_url)
            .map(|u| PgTarget::parse(&u))
            .transpose()?;
        let redis_url = given(redis_url).map(|u| check_redis_url(&u)).transpose()?;
        Ok(ServerOptions {
            database_url,
            redis_url,
            pg_template: TemplatePlace::FromEnv,
        })
    }
}

/// A Redis URL of the right scheme, that the client accepts.
fn check_redis_url(given: &str) -> Result<String, InfraError> {
    let checked = url::check_redis(given)?;
    redis::Client::open(checked.as_str()).map_err(|e| InfraError::BadUrl {
        server: "Redis",
        url: url::redact(given),
        reason: e.to_string(),
    })?;
    Ok(checked)
}

/// Which servers the scenarios of this call need.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Needs {
    pub postgres: bool,
    pub redis: bool,
}

impl Needs {
    pub const POSTGRES: Needs = Needs {
        postgres: true,
        redis: false,
    };

    pub const REDIS: Needs = Needs {
        postgres: false,
        redis: true,
    };

    pub const BOTH: Needs = Needs {
        postgres: true,
        redis: true,
    };

    pub fn union(self, other: Needs) -> Needs {
        Needs {
            postgres: self.postgres || other.postgres,
            redis: self.redis || other.redis,
        }
    }
}

/// Where a server comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A URL the user gave: we touch only our own schema and keys there.
    Given,
    /// Started by this `lab` call; stopped and deleted at its end.
    Throwaway,
}

/// The PostgreSQL of this call.
pub struct PgServer {
    pub target: PgTarget,
    pub origin: Origin,
    pub version: String,
    /// A small pool without a schema of its own: creates and drops run schemas.
    pub admin: PgPool,
    /// How a throwaway server's cluster was made (`None` for a given server).
    pub cluster: Option<Cluster>,
    throwaway: Option<ThrowawayServer>,
}

impl PgServer {
    /// The CPU time a throwaway server's processes (the postmaster and the backends still
    /// connected) have used so far; `None` for a given server, whose processes are not ours to
    /// read (`lab bench` shows the database's share of a request with it).
    pub fn cpu_time(&self) -> Option<std::time::Duration> {
        crate::process::family_cpu_time(self.throwaway.as_ref()?.pid())
    }

    async fn shutdown(self) {
        self.admin.close().await;
        if let Some(server) = self.throwaway {
            server.stop().await;
        }
    }
}

/// The Redis of this call.
pub struct RedisServer {
    pub url: String,
    pub origin: Origin,
    pub version: String,
    pub client: redis::Client,
    /// One multiplexed connection, shared by every run (cheap to clone).
    pub conn: MultiplexedConnection,
    throwaway: Option<ThrowawayServer>,
}

impl RedisServer {
    async fn shutdown(self) {
        if let Some(server) = self.throwaway {
            server.stop().await;
        }
    }
}

/// The servers of one `lab` call.
pub struct Servers {
    pub postgres: Option<PgServer>,
    pub redis: Option<RedisServer>,
    /// Runs whose schema and keys exist and are not yet released: what a Ctrl-C must clean.
    pub(crate) live_runs: Arc<Mutex<BTreeSet<String>>>,
    /// Temporary directories a killed `lab` had left, removed when these servers started.
    pub leftovers: Vec<std::path::PathBuf>,
}

/// What would be used, for `lab doctor`.
#[derive(Debug, Clone)]
pub struct Plan {
    pub postgres: Result<String, String>,
    pub redis: Result<String, String>,
}

/// The throwaway server programs a call needs, found before anything is started.
struct Programs {
    postgres: Option<PgBinaries>,
    redis: Option<RedisBinary>,
}

impl Programs {
    /// Finds the programs for what `needs` asks and no URL gives; names what is missing.
    async fn find(options: &ServerOptions, needs: Needs) -> Result<Programs, InfraError> {
        let mut missing = Vec::new();
        let mut programs = Programs {
            postgres: None,
            redis: None,
        };
        if needs.postgres && options.database_url.is_none() {
            programs.postgres = binaries::find_postgres().await;
            if programs.postgres.is_none() {
                missing.push("PostgreSQL server programs (initdb, postgres)");
            }
        }
        if needs.redis && options.redis_url.is_none() {
            programs.redis = binaries::find_redis().await;
            if programs.redis.is_none() {
                missing.push("redis-server");
            }
        }
        if missing.is_empty() {
            Ok(programs)
        } else {
            Err(InfraError::Missing {
                missing: missing.join(" and "),
                get: binaries::command_for(
                    needs.postgres && programs.postgres.is_none() && options.database_url.is_none(),
                    needs.redis && programs.redis.is_none() && options.redis_url.is_none(),
                ),
            })
        }
    }
}

impl Servers {
    /// Describes what `start` would use, without starting anything (the programs are asked for
    /// their versions).
    pub async fn plan(options: &ServerOptions) -> Plan {
        let postgres = async {
            match &options.database_url {
                Some(target) => Ok(format!("given: {}", target.redacted())),
                None => match binaries::find_postgres().await {
                    Some(b) => {
                        let version = binaries::version_of(&b.postgres).await.unwrap_or_default();
                        Ok(format!(
                            "throwaway: {} ({version}), {}",
                            b.postgres.display(),
                            b.origin
                        ))
                    }
                    None => Err("initdb/postgres not found".to_string()),
                },
            }
        };
        let redis = async {
            match &options.redis_url {
                Some(u) => Ok(format!("given: {}", url::redact(u))),
                None => match binaries::find_redis().await {
                    Some(RedisBinary { path: p, origin }) => {
                        let version = binaries::version_of(&p).await.unwrap_or_default();
                        // `Redis server v=7.0.15 sha=…`
                        let number = version
                            .split_whitespace()
                            .find_map(|w| w.strip_prefix("v="))
                            .unwrap_or_default();
                        if at_least(number, OLDEST_REDIS) {
                            Ok(format!("throwaway: {} ({version}), {origin}", p.display()))
                        } else {
                            Err(format!(
                                "{} is {number}: the lab needs 7.0 or newer (SET … NX GET)",
                                p.display()
                            ))
                        }
                    }
                    None => Err("redis-server not found".to_string()),
                },
            }
        };
        let (postgres, redis) = tokio::join!(postgres, redis);
        Plan { postgres, redis }
    }

    /// Connects to the given servers and starts throwaway ones for the rest of `needs`, both
    /// at once.
    ///
    /// Cancel-safe: a future dropped halfway (Ctrl-C while `initdb` runs) leaves no process and
    /// no temporary directory behind.
    pub async fn start(options: &ServerOptions, needs: Needs) -> Result<Servers, InfraError> {
        // What a `lab` killed with SIGKILL left behind goes before this one adds its own.
        let leftovers = crate::leftovers::sweep_async().await;
        let programs = Programs::find(options, needs).await?;
        // PostgreSQL takes the longest; Redis starts meanwhile. Each start cleans up after
        // itself when it fails; the other one, if it started, is stopped below.
        let postgres = async {
            if !needs.postgres {
                return Ok(None);
            }
            start_postgres(options, programs.postgres).await.map(Some)
        };
        let redis = async {
            if !needs.redis {
                return Ok(None);
            }
            let given = options.redis_url.as_deref();
            start_redis(given, programs.redis).await.map(Some)
        };
        // A server that started while the other failed is stopped here rather than dropped:
        // awaited, not blocking.
        let (postgres, redis) = match tokio::join!(postgres, redis) {
            (Ok(postgres), Ok(redis)) => (postgres, redis),
            (Err(e), redis) => {
                if let Ok(Some(redis)) = redis {
                    redis.shutdown().await;
                }
                return Err(e);
            }
            (Ok(postgres), Err(e)) => {
                if let Some(postgres) = postgres {
                    postgres.shutdown().await;
                }
                return Err(e);
            }
        };
        Ok(Servers {
            postgres,
            redis,
            live_runs: Arc::default(),
            leftovers,
        })
    }

    /// The pids of the throwaway servers (tests check they are gone afterwards).
    pub fn throwaway_pids(&self) -> Vec<u32> {
        let pg = self
            .postgres
            .as_ref()
            .and_then(|p| p.throwaway.as_ref())
            .map(|t| t.pid());
        let redis = self
            .redis
            .as_ref()
            .and_then(|r| r.throwaway.as_ref())
            .map(|t| t.pid());
        pg.into_iter().chain(redis).collect()
    }

    /// Drops the schema and keys of every run that was not released (the run was cancelled by
    /// Ctrl-C or a quit in step mode). Only `lab_<run>` schemas and `lab:<run>:` keys.
    pub async fn clean_abandoned_runs(&self) {
        let runs: Vec<String> = std::mem::take(&mut *self.live_runs.lock())
            .into_iter()
            .collect();
        for run in runs {
            let _ = crate::space::drop_run(self, &run).await;
        }
    }

    /// Closes connections, stops the throwaway servers (both at once) and awaits their exit
    /// and the removal of their directories. Dropping does the same, without waiting for pools
    /// to close and blocking the dropping thread meanwhile.
    pub async fn shutdown(self) {
        let Servers {
            postgres, redis, ..
        } = self;
        let postgres = async {
            if let Some(postgres) = postgres {
                postgres.shutdown().await;
            }
        };
        let redis = async {
            if let Some(redis) = redis {
                redis.shutdown().await;
            }
        };
        tokio::join!(postgres, redis);
    }
}

async fn start_postgres(
    options: &ServerOptions,
    bins: Option<PgBinaries>,
) -> Result<PgServer, InfraError> {
    let (target, origin, throwaway, cluster) = match &options.database_url {
        Some(target) => (target.clone(), Origin::Given, None, None),
        None => {
            let bins = bins.ok_or_else(|| InfraError::Missing {
                missing: "PostgreSQL server programs (initdb, postgres)".into(),
                get: binaries::command_for_postgres(),
            })?;
            let (server, cluster) = postgres::start(&bins, &options.pg_template).await?;
            match PgTarget::parse(&server.url) {
                Ok(target) => (target, Origin::Throwaway, Some(server), Some(cluster)),
                Err(e) => {
                    server.stop().await;
                    return Err(e);
                }
            }
        }
    };
    match connect_postgres(&target).await {
        Ok((version, admin)) => Ok(PgServer {
            target,
            origin,
            version,
            admin,
            cluster,
            throwaway,
        }),
        Err(e) => {
            if let Some(server) = throwaway {
                server.stop().await;
            }
            Err(e)
        }
    }
}

/// What went wrong connecting to PostgreSQL, said for people: unreachable (nothing answered, or
/// the connection broke), or refused (it answered: the login failed, the database is missing).
/// The server's own message is used, without sqlx's wrapping or PostgreSQL's source line.
fn pg_connect_error(target: &PgTarget, e: sqlx::Error) -> InfraError {
    let url = target.redacted();
    match &e {
        sqlx::Error::Database(db) => {
            let reason = match db.code().as_deref() {
                // invalid_password, invalid_authorization_specification (no such role, or no
                // pg_hba.conf line lets it in)
                Some("28P01") | Some("28000") => format!(
                    "authentication failed: {}; check the user and password in the URL",
                    db.message()
                ),
                // invalid_catalog_name
                Some("3D000") => format!(
                    "{}; create it (createdb NAME) or name an existing database in the URL",
                    db.message()
                ),
                _ => db.message().to_string(),
            };
            InfraError::Refused {
                server: "PostgreSQL",
                url,
                reason,
            }
        }
        sqlx::Error::Io(io) => InfraError::Unreachable {
            server: "PostgreSQL",
            url,
            reason: io.to_string(),
        },
        _ => InfraError::Unreachable {
            server: "PostgreSQL",
            url,
            reason: e.to_string(),
        },
    }
}

/// Asks a PostgreSQL its version and opens the admin pool.
async fn connect_postgres(target: &PgTarget) -> Result<(String, PgPool), InfraError> {
    let unreachable = |e: sqlx::Error| pg_connect_error(target, e);
    // A single connection first: a pool would hide "connection refused" behind a pool timeout.
    let mut probe = sqlx::PgConnection::connect_with(target.options())
        .await
        .map_err(unreachable)?;
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(&mut probe)
        .await?;
    let _ = probe.close().await;
    let admin = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(target.options().clone())
        .await
        .map_err(unreachable)?;
    Ok((version, admin))
}

async fn start_redis(
    given: Option<&str>,
    program: Option<RedisBinary>,
) -> Result<RedisServer, InfraError> {
    let (url, origin, throwaway) = match given {
        Some(u) => (url::check_redis(u)?, Origin::Given, None),
        None => {
            let program = program.ok_or_else(|| InfraError::Missing {
                missing: "redis-server".into(),
                get: binaries::command_for_redis(),
            })?;
            let server = redis_server::start(&program.path).await?;
            (server.url.clone(), Origin::Throwaway, Some(server))
        }
    };
    match connect_redis(&url).await {
        Ok((version, client, conn)) => Ok(RedisServer {
            url,
            origin,
            version,
            client,
            conn,
            throwaway,
        }),
        Err(e) => {
            if let Some(server) = throwaway {
                server.stop().await;
            }
            Err(e)
        }
    }
}

/// Opens the shared connection to a Redis and asks its version.
async fn connect_redis(
    url: &str,
) -> Result<(String, redis::Client, MultiplexedConnection), InfraError> {
    let unreachable = |e: redis::RedisError| InfraError::Unreachable {
        server: "Redis",
        url: url::redact(url),
        reason: e.to_string(),
    };
    let client = redis::Client::open(url).map_err(unreachable)?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(3)))
        .set_response_timeout(Some(Duration::from_secs(5)));
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(unreachable)?;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .map_err(unreachable)?;
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_string();
    if !at_least(&version, OLDEST_REDIS) {
        return Err(InfraError::TooOld {
            server: "Redis",
            url: url::redact(url),
            version,
            needs: "7.0 (the coordinator reserves a key with SET … NX GET)",
        });
    }
    Ok((version, client, conn))
}

/// The oldest Redis the lab works with: `SET … NX GET`, the coordinator's reserve-or-read in one
/// round trip, came with 7.0 (6.2 refuses NX together with GET).
const OLDEST_REDIS: (u32, u32) = (7, 0);

/// Whether a `major.minor[.patch]` version is at least `(major, minor)`; a version that does not
/// read as one is given the benefit of the doubt (a fork that says something else).
fn at_least(version: &str, (major, minor): (u32, u32)) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>());
    match (parts.next(), parts.next()) {
        (Some(Ok(have_major)), Some(Ok(have_minor))) => (have_major, have_minor) >= (major, minor),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::at_least;

    #[test]
    fn redis_6_is_too_old_and_7_is_not() {
        assert!(!at_least("6.0.16", (7, 0)));
        assert!(!at_least("6.2.14", (7, 0)));
        assert!(at_least("7.0.15", (7, 0)));
        assert!(at_least("7.2.4", (7, 0)));
        assert!(at_least("8.0.0", (7, 0)));
        assert!(at_least("unknown", (7, 0)));
    }
}
