//! The space of one scenario run: schema `lab_<run>` and key prefix `lab:<run>:`.
//!
//! Every run creates its own schema (with the tables of the schema scripts it is given, such as
//! `schema.sql`) and uses only keys under its own prefix. Its pool sets `search_path` to that
//! schema on every connection, so the SQL of the services and scenarios names tables without a
//! schema and still cannot reach anyone else's. Releasing a run drops exactly that schema and
//! deletes exactly those keys.
//!
//! Every run is on the [`Servers`]' list of live runs from before its schema exists until after
//! it is dropped, so a run cut short (Ctrl-C, `q` in step mode) is still cleaned up by
//! [`Servers::clean_abandoned_runs`].

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgPool};

use crate::{InfraError, Servers};

/// A run's schema, key prefix and connections.
pub struct RunSpace {
    /// Eight hex digits, fresh for every run.
    pub run_id: String,
    /// `lab_<run>`.
    pub schema: String,
    /// `lab:<run>:`: every Redis key of the run starts with it.
    pub prefix: String,
    /// Connections whose `search_path` is the run's schema.
    pub pg: Option<PgPool>,
    pub redis: Option<MultiplexedConnection>,
    /// The URL of the run's PostgreSQL with the schema in `options`, for psql: its password is
    /// hidden (psql asks for it, or reads PGPASSWORD), so it can be printed as it is.
    pub pg_url: Option<String>,
    pub redis_url: Option<String>,
}

/// A fresh run id: eight lowercase hex digits (what `lab_<run>` and `lab:<run>:` are made of).
pub fn new_run_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..8].to_string()
}

/// A run id is only ever eight hex digits: nothing else can be turned into a schema name.
fn valid_run_id(run: &str) -> bool {
    run.len() == 8
        && run
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

impl RunSpace {
    /// Creates the schema, its tables (the scripts of `schema_sql`, run in order with the schema
    /// as `search_path`) and the connections of a new run.
    pub async fn create(servers: &Servers, schema_sql: &[&str]) -> Result<RunSpace, InfraError> {
        let run_id = new_run_id();
        let schema = format!("lab_{run_id}");
        let prefix = format!("lab:{run_id}:");
        servers.live_runs.lock().insert(run_id.clone());

        let (pg, pg_url) = match &servers.postgres {
            Some(server) => {
                sqlx::query(AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
                    .execute(&server.admin)
                    .await?;
                let options = server.target.options().clone();
                let pool = PgPoolOptions::new()
                    // Enough for the concurrent scenarios: two requests, a worker, a reader.
                    .max_connections(8)
                    .acquire_timeout(Duration::from_secs(10))
                    // No ping before each acquire: sqlx's default sends one on every checkout,
                    // a round trip as dear as a statement (a transaction was ping, BEGIN, INSERT,
                    // COMMIT: four where three do). A dead connection still fails its first
                    // statement, and the pool drops it.
                    .test_before_acquire(false)
                    .connect_with(
                        options
                            .options([("search_path", schema.as_str())])
                            // Names the run's sessions in pg_stat_activity, so a scenario can
                            // watch its own backends (a lock wait) among other runs'.
                            .application_name(&schema),
                    )
                    .await?;
                for script in schema_sql {
                    // The lab's own schema files, not input from anyone.
                    sqlx::raw_sql(AssertSqlSafe(*script)).execute(&pool).await?;
                }
                let url = server.target.psql_url(&schema)?;
                (Some(pool), Some(url))
            }
            None => (None, None),
        };
        let (redis, redis_url) = match &servers.redis {
            Some(server) => (Some(server.conn.clone()), Some(server.url.clone())),
            None => (None, None),
        };
        Ok(RunSpace {
            run_id,
            schema,
            prefix,
            pg,
            redis,
            pg_url,
            redis_url,
        })
    }

    /// A Redis key of this run.
    pub fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// Ends the run: drops its schema and keys, unless `keep` (for inspection).
    pub async fn release(self, servers: &Servers, keep: bool) -> Result<(), InfraError> {
        if let Some(pool) = &self.pg {
            // Close the run's connections first: DROP SCHEMA would wait for their locks.
            pool.close().await;
        }
        if keep {
            servers.live_runs.lock().remove(&self.run_id);
            return Ok(());
        }
        // The run stays on the list of live runs until its schema is really gone: if this is
        // cancelled halfway (Ctrl-C, `q`), `clean_abandoned_runs` still knows what to drop.
        drop_run(servers, &self.run_id).await?;
        servers.live_runs.lock().remove(&self.run_id);
        Ok(())
    }
}

/// Drops `lab_<run>` and deletes the keys under `lab:<run>:`, and nothing else.
pub(crate) async fn drop_run(servers: &Servers, run: &str) -> Result<(), InfraError> {
    assert!(valid_run_id(run), "not a run id: {run}");
    if let Some(server) = &servers.postgres {
        sqlx::query(AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS lab_{run} CASCADE"
        )))
        .execute(&server.admin)
        .await?;
    }
    if let Some(server) = &servers.redis {
        let mut conn = server.conn.clone();
        delete_under_prefix(&mut conn, &format!("lab:{run}:")).await?;
    }
    Ok(())
}

/// Deletes every key under `prefix` on the server `conn` talks to: `SCAN MATCH prefix*`, then
/// `UNLINK` of each key found, one command per key (a cluster node refuses multi-key commands
/// across slots, so the same loop serves each master of a cluster). Returns how many went.
pub async fn delete_under_prefix<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    prefix: &str,
) -> redis::RedisResult<u64> {
    let pattern = format!("{prefix}*");
    let mut deleted = 0;
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await?;
        if !keys.is_empty() {
            let mut pipe = redis::pipe();
            for key in &keys {
                pipe.cmd("UNLINK").arg(key);
            }
            let removed: Vec<u64> = pipe.query_async(conn).await?;
            deleted += removed.iter().sum::<u64>();
        }
        if next == 0 {
            return Ok(deleted);
        }
        cursor = next;
    }
}

#[cfg(test)]
mod tests {
    use super::valid_run_id;

    #[test]
    fn only_eight_lowercase_hex_digits_are_run_ids() {
        assert!(valid_run_id("0a1b2c3d"));
        assert!(!valid_run_id("0A1B2C3D"));
        assert!(!valid_run_id("x; DROP"));
        assert!(!valid_run_id("0a1b2c3d4"));
    }
}
