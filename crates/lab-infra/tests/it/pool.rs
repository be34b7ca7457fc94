//! `LeanPool` on a throwaway PostgreSQL: a connection released after a commit goes back at once
//! and is reused; a lease dropped halfway through a transaction has its ROLLBACK sent (its locks
//! released) before anyone else gets the connection; a connection whose backend was terminated is
//! closed, not handed out again; the pool never has more connections than its size.

use std::time::Duration;

use lab_infra::pool::LeanPool;
use lab_infra::{Needs, RunSpace, ServerOptions, Servers};
use sqlx::Connection as _;

const TABLE: &str = "CREATE TABLE taken (key text PRIMARY KEY)";

async fn backend_pid(conn: &mut sqlx::PgConnection) -> i32 {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(conn)
        .await
        .unwrap()
}

/// A pool of one connection beside the run's pool, so that who gets the connection next is
/// decided by the pool alone.
fn pool_of_one(space: &RunSpace, acquire_timeout: Duration) -> LeanPool {
    let run_pool = space.pg.as_ref().expect("a PostgreSQL pool");
    LeanPool::new((*run_pool.connect_options()).clone(), 1, acquire_timeout)
}

// The current-thread runtime matters in the first test: a check on the way back runs in a task
// of its own, which cannot have run before the test's next line, so an idle connection right
// after `release` proves that no check was made.
#[tokio::test(flavor = "current_thread")]
async fn a_connection_released_after_a_commit_goes_back_as_it_is() {
    let servers = Servers::start(&ServerOptions::default(), Needs::POSTGRES)
        .await
        .unwrap();
    let space = RunSpace::create(&servers, &[TABLE]).await.unwrap();
    let pool = LeanPool::beside(space.pg.as_ref().unwrap());

    let mut conn = pool.acquire().await.unwrap();
    let first_pid = backend_pid(&mut conn).await;
    let mut tx = conn.begin().await.unwrap();
    sqlx::query("INSERT INTO taken VALUES ('a')")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    conn.release();
    assert_eq!(pool.idle_count(), 1, "back without a round trip");

    // The same connection, on the run's schema (search_path), with the committed row.
    let mut conn = pool.acquire().await.unwrap();
    assert_eq!(backend_pid(&mut conn).await, first_pid);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM taken")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(rows, 1);

    // Released with a transaction dropped on it: its ROLLBACK is queued, so it is checked on
    // its way back (in a task of its own), not put back as it is.
    {
        let mut tx = conn.begin().await.unwrap();
        sqlx::query("INSERT INTO taken VALUES ('b')")
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    conn.release();
    assert_eq!(pool.idle_count(), 0, "checked first");
    let mut conn = pool.acquire().await.unwrap();
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM taken")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(rows, 1, "the dropped transaction was rolled back");
    conn.release();

    pool.close().await;
    assert_eq!(pool.idle_count(), 0);
    assert!(matches!(
        pool.acquire().await.err(),
        Some(sqlx::Error::PoolClosed)
    ));
    space.release(&servers, false).await.unwrap();
    servers.shutdown().await;
}

/// A request cancelled while its transaction holds a row lock: the lease is dropped, and the
/// check on its way back sends the queued ROLLBACK at once, so another session's INSERT of the
/// same key goes through while nobody uses the pool (without the check the ROLLBACK would wait
/// in the connection's buffer for its next caller, and the lock with it). The connection is
/// handed out again only after the check.
#[tokio::test(flavor = "multi_thread")]
async fn a_lease_dropped_in_a_transaction_releases_its_locks_at_once() {
    let servers = Servers::start(&ServerOptions::default(), Needs::POSTGRES)
        .await
        .unwrap();
    let space = RunSpace::create(&servers, &[TABLE]).await.unwrap();
    let run_pool = space.pg.as_ref().unwrap();
    let pool = pool_of_one(&space, Duration::from_secs(30));

    let mut conn = pool.acquire().await.unwrap();
    let pid = backend_pid(&mut conn).await;
    let mut tx = conn.begin().await.unwrap();
    sqlx::query("INSERT INTO taken VALUES ('k')")
        .execute(&mut *tx)
        .await
        .unwrap();
    // The request's future dropped with everything it held.
    drop(tx);
    drop(conn);

    // Waits for the key's lock; a generous bound, so that a lock never let go fails the test
    // rather than hanging it.
    let mut other = run_pool.begin().await.unwrap();
    sqlx::query("SET LOCAL lock_timeout = '30s'")
        .execute(&mut *other)
        .await
        .unwrap();
    sqlx::query("INSERT INTO taken VALUES ('k')")
        .execute(&mut *other)
        .await
        .expect("the dropped transaction's lock is released without another caller");
    other.commit().await.unwrap();

    // The pool's one place is given up only after the check: this waits for it.
    let mut conn = pool.acquire().await.unwrap();
    assert_eq!(
        backend_pid(&mut conn).await,
        pid,
        "the checked connection is reused"
    );
    assert!(!conn.is_in_transaction());
    conn.release();

    pool.close().await;
    space.release(&servers, false).await.unwrap();
    servers.shutdown().await;
}

/// A connection whose backend was terminated fails its next statement; dropped after that
/// failure, it is closed, and the next caller gets a new connection that works.
#[tokio::test(flavor = "multi_thread")]
async fn a_broken_connection_is_closed_not_handed_out_again() {
    let servers = Servers::start(&ServerOptions::default(), Needs::POSTGRES)
        .await
        .unwrap();
    let space = RunSpace::create(&servers, &[TABLE]).await.unwrap();
    let pool = pool_of_one(&space, Duration::from_secs(30));
    let run_pool = space.pg.as_ref().unwrap();

    let mut conn = pool.acquire().await.unwrap();
    let pid = backend_pid(&mut conn).await;
    conn.release();
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 10000)")
        .bind(pid)
        .fetch_one(run_pool)
        .await
        .unwrap();
    assert!(terminated);

    let mut conn = pool.acquire().await.unwrap();
    let failed = sqlx::query("SELECT 1").execute(&mut *conn).await;
    assert!(failed.is_err(), "the terminated backend cannot answer");
    drop(conn);

    let mut conn = pool.acquire().await.unwrap();
    let new_pid = backend_pid(&mut conn).await;
    assert_ne!(new_pid, pid, "a new connection");
    conn.release();

    pool.close().await;
    space.release(&servers, false).await.unwrap();
    servers.shutdown().await;
}

/// The pool's size bounds the connections: with its one connection held, the next caller waits
/// out the acquire timeout and gets `PoolTimedOut`, and gets the connection once it is back.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_pool_makes_a_caller_wait_then_times_out() {
    let servers = Servers::start(&ServerOptions::default(), Needs::POSTGRES)
        .await
        .unwrap();
    let space = RunSpace::create(&servers, &[TABLE]).await.unwrap();
    let timeout = Duration::from_millis(300);
    let pool = pool_of_one(&space, timeout);

    let held = pool.acquire().await.unwrap();
    let started = std::time::Instant::now();
    let waited = pool.acquire().await;
    assert!(matches!(waited.err(), Some(sqlx::Error::PoolTimedOut)));
    assert!(started.elapsed() >= timeout, "waited the acquire timeout");

    let waiting = tokio::spawn({
        let pool = pool.clone();
        async move { pool.acquire().await.map(|conn| conn.is_in_transaction()) }
    });
    held.release();
    assert!(!waiting.await.unwrap().unwrap());

    pool.close().await;
    space.release(&servers, false).await.unwrap();
    servers.shutdown().await;
}
