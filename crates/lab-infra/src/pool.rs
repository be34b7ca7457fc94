//! A pool of PostgreSQL connections that gives a connection back without a round trip when the
//! work on it ended cleanly: [`LeanPool`].
//!
//! sqlx's `PgPool` cannot know how the work on a connection ended, so it checks every connection
//! given back with a round trip of its own (a `ping`, in a task it spawns) before another caller
//! may have it. The check is there for two cases: a transaction dropped halfway (a cancelled
//! request) leaves a ROLLBACK queued in the connection's buffer, and the ping sends it at once, so
//! the transaction's locks go with it; and a connection that broke is found and closed. For the
//! report service's keyed request that is a fifth round trip after BEGIN, INSERT, SELECT and
//! COMMIT, and on this machine a round trip costs about as much as a statement (docs/bench.md,
//! "Benchmarks").
//!
//! Here the code that used the connection says how its work ended. [`Lease::release`], called
//! once the last statement (a COMMIT) has succeeded, puts the connection back as it is. A lease
//! dropped without it (an error returned with `?`, a request's future cancelled) gives its
//! connection back through the same check sqlx makes, so the ROLLBACK is sent and a broken
//! connection is closed; until the check is done the connection's place in the pool stays taken.
//!
//! ```no_run
//! # async fn example(pool: lab_infra::pool::LeanPool) -> Result<(), sqlx::Error> {
//! use sqlx::Connection as _;
//! let mut conn = pool.acquire().await?;
//! let mut tx = conn.begin().await?;
//! sqlx::query("INSERT INTO reports (task_id, report_type, payload_hash) VALUES (1, 'x', 'h')")
//!     .execute(&mut *tx)
//!     .await?;
//! tx.commit().await?;
//! conn.release(); // committed: back to the pool without a check
//! # Ok(())
//! # }
//! ```
//!
//! What it does not do, because the lab's services do not need it: minimum connections, idle
//! timeouts, a maximum lifetime. Connections are opened when a caller needs one and none is idle.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{Connection as _, PgPool};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long the check of a connection given back without [`Lease::release`] may take before
/// the connection is closed instead: a server that does not answer a bare Sync in this long is
/// not one to give a caller.
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// A pool of at most `size` PostgreSQL connections, cheap to clone (one pool, shared).
#[derive(Clone)]
pub struct LeanPool {
    shared: Arc<Shared>,
}

struct Shared {
    /// How a new connection is opened: the run's schema as `search_path`, its name as
    /// `application_name`, as for the run's own pool.
    options: PgConnectOptions,
    /// Connections nobody holds, ready to be handed out as they are.
    idle: Mutex<Vec<PgConnection>>,
    /// One permit per connection that may exist: held by a lease, and by a connection being
    /// checked on its way back. Closed when the pool is closed.
    places: Arc<Semaphore>,
    /// How long a caller waits for a connection (a place, then a connect) before
    /// `PoolTimedOut`.
    acquire_timeout: Duration,
}

impl LeanPool {
    /// A pool of `size` connections opened with `options`.
    pub fn new(options: PgConnectOptions, size: u32, acquire_timeout: Duration) -> LeanPool {
        LeanPool {
            shared: Arc::new(Shared {
                options,
                idle: Mutex::new(Vec::new()),
                places: Arc::new(Semaphore::new(size.max(1) as usize)),
                acquire_timeout,
            }),
        }
    }

    /// A pool of the same database, settings, size and acquire timeout as `pool` (a run's pool,
    /// [`crate::RunSpace::pg`]), with connections of its own.
    pub fn beside(pool: &PgPool) -> LeanPool {
        let settings = pool.options();
        LeanPool::new(
            (*pool.connect_options()).clone(),
            settings.get_max_connections(),
            settings.get_acquire_timeout(),
        )
    }

    /// A connection: an idle one, or a new one while fewer than `size` exist. Waits at most the
    /// acquire timeout (`sqlx::Error::PoolTimedOut`); `PoolClosed` once [`LeanPool::close`] ran.
    pub async fn acquire(&self) -> Result<Lease, sqlx::Error> {
        let shared = &self.shared;
        let (conn, place) = tokio::time::timeout(shared.acquire_timeout, async {
            let place = Arc::clone(&shared.places)
                .acquire_owned()
                .await
                .map_err(|_| sqlx::Error::PoolClosed)?;
            let idle = shared.idle.lock().pop();
            let conn = match idle {
                Some(conn) => conn,
                // A failed connect gives the place back with `place`.
                None => PgConnection::connect_with(&shared.options).await?,
            };
            Ok::<_, sqlx::Error>((conn, place))
        })
        .await
        .map_err(|_| sqlx::Error::PoolTimedOut)??;
        Ok(Lease {
            conn: Some(conn),
            place: Some(place),
            shared: Arc::clone(shared),
        })
    }

    /// Closes the idle connections (each with a Terminate message) and every connection given
    /// back from now on; callers waiting for one get `PoolClosed`.
    pub async fn close(&self) {
        self.shared.places.close();
        let idle = std::mem::take(&mut *self.shared.idle.lock());
        for conn in idle {
            let _ = conn.close().await;
        }
    }

    /// Connections that are idle in the pool now (for tests and diagnostics).
    pub fn idle_count(&self) -> usize {
        self.shared.idle.lock().len()
    }
}

/// A connection of a [`LeanPool`], held until [`Lease::release`] or drop. It derefs to
/// `PgConnection`: `conn.begin()`, `.execute(&mut *conn)`.
pub struct Lease {
    /// `Some` until it is given back.
    conn: Option<PgConnection>,
    /// The connection's place in the pool, given up after the connection is back (so a caller
    /// woken by it finds the connection idle).
    place: Option<OwnedSemaphorePermit>,
    shared: Arc<Shared>,
}

impl Lease {
    /// Gives the connection back as it is, without a round trip: call it once the work on it
    /// ended as planned (its transaction committed, its last statement answered). A connection
    /// still in a transaction, or with something queued to send (the ROLLBACK of a transaction
    /// dropped on it), is checked as a dropped lease's is, so calling this too early costs a
    /// round trip, never a connection in a wrong state.
    pub fn release(mut self) {
        let conn = self
            .conn
            .take()
            .expect("a lease holds its connection until given back");
        // `should_flush`: bytes waiting in the connection's write buffer (sqlx's own test
        // before it sends anything); a transaction dropped on the connection leaves its
        // ROLLBACK there.
        if conn.is_in_transaction() || conn.should_flush() {
            check_and_return(&self.shared, conn, self.place.take());
        } else if !self.shared.places.is_closed() {
            self.shared.idle.lock().push(conn);
        }
        // `self` drops here: its place is given up after the connection is idle again.
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            check_and_return(&self.shared, conn, self.place.take());
        }
    }
}

/// The check sqlx's pool makes on every connection given back: a Sync and its answer, which
/// sends whatever is queued (a ROLLBACK) and reads whatever answers are still on the way (a
/// cancelled statement's). A connection that passes goes back idle; one that fails, or does not
/// answer within [`CHECK_TIMEOUT`], is closed. Runs in a task of its own, as sqlx's does (a drop
/// cannot wait); without a runtime (the process is ending) the connection is just closed.
fn check_and_return(
    shared: &Arc<Shared>,
    mut conn: PgConnection,
    place: Option<OwnedSemaphorePermit>,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let shared = Arc::clone(shared);
    runtime.spawn(async move {
        // Held until the connection is back or closed: the pool never has more than its size.
        let _place = place;
        match tokio::time::timeout(CHECK_TIMEOUT, conn.ping()).await {
            Ok(Ok(())) if !shared.places.is_closed() => shared.idle.lock().push(conn),
            Ok(Ok(())) => {
                let _ = conn.close().await;
            }
            // Broken or silent: not worth a graceful goodbye.
            _ => {
                let _ = conn.close_hard().await;
            }
        }
    });
}

impl Deref for Lease {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        self.conn
            .as_ref()
            .expect("a lease holds its connection until given back")
    }
}

impl DerefMut for Lease {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.conn
            .as_mut()
            .expect("a lease holds its connection until given back")
    }
}
