//! The servers of one `lab` call: the ones the learner gave (`--database-url`, `--redis-url`) or
//! throwaway ones started for this call and removed at its end.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgPool};

use crate::postgres::ThrowawayPostgres;
use crate::redis_server::ThrowawayRedis;
use crate::{InfraError, binaries, postgres, redis_server, url};

/// What the user asked for.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    pub database_url: Option<String>,
    pub redis_url: Option<String>,
}

impl ServerOptions {
    /// The options from flags or environment; an empty value (`DATABASE_URL=`) counts as unset.
    pub fn new(database_url: Option<String>, redis_url: Option<String>) -> ServerOptions {
        let given = |url: Option<String>| url.filter(|u| !u.trim().is_empty());
        ServerOptions {
            database_url: given(database_url),
            redis_url: given(redis_url),
        }
    }

    /// Checks that every given URL is a URL of the right kind, whether or not this call needs
    /// that server: a typo is reported at once, not on the day a scenario needs Redis.
    pub fn validate(&self) -> Result<(), InfraError> {
        if let Some(u) = &self.database_url {
            let normalized = url::normalize_postgres(u)?;
            normalized
                .parse::<sqlx::postgres::PgConnectOptions>()
                .map_err(|e| InfraError::BadUrl {
                    server: "PostgreSQL",
                    url: url::redact(u),
                    reason: e.to_string(),
                })?;
        }
        if let Some(u) = &self.redis_url {
            let checked = url::check_redis(u)?;
            redis::Client::open(checked.as_str()).map_err(|e| InfraError::BadUrl {
                server: "Redis",
                url: url::redact(u),
                reason: e.to_string(),
            })?;
        }
        Ok(())
    }
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
    pub url: String,
    pub origin: Origin,
    pub version: String,
    /// A small pool without a schema of its own: creates and drops run schemas.
    pub admin: PgPool,
    throwaway: Option<ThrowawayPostgres>,
}

/// The Redis of this call.
pub struct RedisServer {
    pub url: String,
    pub origin: Origin,
    pub version: String,
    pub client: redis::Client,
    /// One multiplexed connection, shared by every run (cheap to clone).
    pub conn: MultiplexedConnection,
    throwaway: Option<ThrowawayRedis>,
}

/// The servers of one `lab` call.
pub struct Servers {
    pub postgres: Option<PgServer>,
    pub redis: Option<RedisServer>,
    /// Runs whose schema and keys exist and are not yet released: what a Ctrl-C must clean.
    pub(crate) live_runs: Arc<Mutex<BTreeSet<String>>>,
}

/// What would be used, for `lab doctor`.
#[derive(Debug, Clone)]
pub struct Plan {
    pub postgres: Result<String, String>,
    pub redis: Result<String, String>,
}

impl Servers {
    /// Names what is missing to satisfy `needs` without URLs, or `None` when all is there.
    pub fn missing(options: &ServerOptions, needs: Needs) -> Option<String> {
        let mut missing = Vec::new();
        if needs.postgres && options.database_url.is_none() && binaries::find_postgres().is_none() {
            missing.push("PostgreSQL server programs (initdb, postgres)");
        }
        if needs.redis && options.redis_url.is_none() && binaries::find_redis().is_none() {
            missing.push("redis-server");
        }
        (!missing.is_empty()).then(|| missing.join(" and "))
    }

    /// Describes what `start` would use, without starting anything.
    pub fn plan(options: &ServerOptions) -> Plan {
        let postgres = match &options.database_url {
            Some(u) => Ok(format!("given: {}", url::redact(u))),
            None => binaries::find_postgres()
                .map(|b| {
                    let version = binaries::version_of(&b.postgres).unwrap_or_default();
                    format!("throwaway: {} ({version})", b.postgres.display())
                })
                .ok_or_else(|| "initdb/postgres not found".to_string()),
        };
        let redis = match &options.redis_url {
            Some(u) => Ok(format!("given: {}", url::redact(u))),
            None => binaries::find_redis()
                .map(|p| {
                    let version = binaries::version_of(&p).unwrap_or_default();
                    format!("throwaway: {} ({version})", p.display())
                })
                .ok_or_else(|| "redis-server not found".to_string()),
        };
        Plan { postgres, redis }
    }

    /// Connects to the given servers and starts throwaway ones for the rest of `needs`.
    pub async fn start(options: &ServerOptions, needs: Needs) -> Result<Servers, InfraError> {
        options.validate()?;
        if let Some(missing) = Servers::missing(options, needs) {
            return Err(InfraError::Missing { missing });
        }
        let postgres = if needs.postgres {
            Some(start_postgres(options.database_url.as_deref()).await?)
        } else {
            None
        };
        let redis = if needs.redis {
            Some(start_redis(options.redis_url.as_deref()).await?)
        } else {
            None
        };
        Ok(Servers {
            postgres,
            redis,
            live_runs: Arc::default(),
        })
    }

    /// Directories and pids of the throwaway servers (tests check they are gone afterwards).
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
        let runs: Vec<String> = std::mem::take(&mut *self.live_runs.lock().unwrap())
            .into_iter()
            .collect();
        for run in runs {
            let _ = crate::space::drop_run(self, &run).await;
        }
    }

    /// Closes connections and stops throwaway servers (dropping does the same, without waiting
    /// for pools to close).
    pub async fn shutdown(mut self) {
        if let Some(pg) = &mut self.postgres {
            pg.admin.close().await;
            if let Some(t) = &mut pg.throwaway {
                t.stop();
            }
        }
        if let Some(r) = &mut self.redis
            && let Some(t) = &mut r.throwaway
        {
            t.stop();
        }
    }
}

async fn start_postgres(given: Option<&str>) -> Result<PgServer, InfraError> {
    let (url, origin, throwaway) = match given {
        Some(u) => (url::normalize_postgres(u)?, Origin::Given, None),
        None => {
            let bins = binaries::find_postgres().ok_or_else(|| InfraError::Missing {
                missing: "PostgreSQL server programs (initdb, postgres)".into(),
            })?;
            let server = postgres::start(&bins).await?;
            (server.url.clone(), Origin::Throwaway, Some(server))
        }
    };
    let unreachable = |e: sqlx::Error| InfraError::Unreachable {
        server: "PostgreSQL",
        url: url::redact(&url),
        reason: e.to_string(),
    };
    // A single connection first: a pool would hide "connection refused" behind a pool timeout.
    let mut probe = sqlx::PgConnection::connect(&url)
        .await
        .map_err(unreachable)?;
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(&mut probe)
        .await?;
    let _ = probe.close().await;
    let admin = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&url)
        .await
        .map_err(unreachable)?;
    Ok(PgServer {
        url,
        origin,
        version,
        admin,
        throwaway,
    })
}

async fn start_redis(given: Option<&str>) -> Result<RedisServer, InfraError> {
    let (url, origin, throwaway) = match given {
        Some(u) => (url::check_redis(u)?, Origin::Given, None),
        None => {
            let program = binaries::find_redis().ok_or_else(|| InfraError::Missing {
                missing: "redis-server".into(),
            })?;
            let server = redis_server::start(&program).await?;
            (server.url.clone(), Origin::Throwaway, Some(server))
        }
    };
    let unreachable = |e: redis::RedisError| InfraError::Unreachable {
        server: "Redis",
        url: url::redact(&url),
        reason: e.to_string(),
    };
    let client = redis::Client::open(url.as_str()).map_err(unreachable)?;
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
    Ok(RedisServer {
        url,
        origin,
        version,
        client,
        conn,
        throwaway,
    })
}
