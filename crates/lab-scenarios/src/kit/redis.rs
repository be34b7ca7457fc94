//! Redis as the lab reads it: the run's own connection (never through the fault proxy), a
//! coordinator record with its remaining life, and simulated expiry.
//!
//! The lab waits an hour for nothing: to show what happens when a record or a lease ends, it
//! cuts the key's remaining life to a millisecond and watches Redis until the key is gone, and
//! the narrative says that time was simulated.

use std::time::Duration;

use lab_core::trace::Traced;
use tokio::time::Instant;

use crate::ScenarioError;

/// The run's own connection to the real Redis: every command it sends is reported (what
/// `--show-commands` shows), unless it runs backstage.
pub type Conn = Traced<redis::aio::MultiplexedConnection>;

/// A key that must expire within this, and does not, is a broken script.
const EXPIRY_LIMIT: Duration = Duration::from_secs(10);

/// A coordinator record as read from Redis, with its remaining life in whole seconds.
pub struct RedisRecord {
    pub record: idem::Record,
    pub ttl_secs: i64,
}

/// PTTL in whole seconds, rounded up (a record written a moment ago with an hour shows 3600);
/// negative values (no key, no expiry) as they are.
pub fn pttl_secs(pttl: i64) -> i64 {
    if pttl < 0 { pttl } else { (pttl + 999) / 1000 }
}

/// Reads the coordinator's record at a Redis key with `GET` and `PTTL`, in one round trip.
pub async fn read_record(
    conn: &mut Conn,
    redis_key: &str,
) -> Result<Option<RedisRecord>, ScenarioError> {
    let (value, pttl): (Option<String>, i64) = redis::pipe()
        .get(redis_key)
        .pttl(redis_key)
        .query_async(conn)
        .await?;
    let Some(value) = value else {
        return Ok(None);
    };
    let record = idem::Record::from_json(&value)
        .map_err(|e| ScenarioError::Broken(format!("the record at {redis_key}: {e}")))?;
    Ok(Some(RedisRecord {
        record,
        ttl_secs: pttl_secs(pttl),
    }))
}

/// A key's remaining life (`PTTL`) in whole seconds, rounded up.
pub async fn ttl_secs(conn: &mut Conn, redis_key: &str) -> Result<i64, ScenarioError> {
    let pttl: i64 = redis::cmd("PTTL").arg(redis_key).query_async(conn).await?;
    Ok(pttl_secs(pttl))
}

/// Simulated time: cuts a key's remaining life to 1 ms (`PEXPIRE`), then waits, by watching
/// Redis, until it has expired: until it is gone, or holds another value (with a millisecond
/// left, nothing but a new write can have changed it). A caller that was waiting on the key may
/// write a new record under it the moment it expires (a takeover), before the lab looks again;
/// on a loaded machine it often did.
pub async fn expire_now(conn: &mut Conn, redis_key: &str) -> Result<(), ScenarioError> {
    let expiring = value_backstage(conn, redis_key).await?;
    let _: i64 = redis::cmd("PEXPIRE")
        .arg(redis_key)
        .arg(1)
        .query_async(conn)
        .await?;
    // A key that was already gone has nothing left to expire.
    wait_until(conn, redis_key, |now| {
        expiring.is_none() || now != expiring.as_deref()
    })
    .await
}

/// Waits until `redis_key` no longer exists (it expired), watching Redis itself.
pub async fn wait_until_gone(conn: &mut Conn, redis_key: &str) -> Result<(), ScenarioError> {
    wait_until(conn, redis_key, |now| now.is_none()).await
}

/// The value at `redis_key` (`None` if there is none), read backstage.
#[tracing::instrument(name = "lab.backstage", skip_all)]
async fn value_backstage(
    conn: &mut Conn,
    redis_key: &str,
) -> Result<Option<String>, ScenarioError> {
    Ok(redis::cmd("GET").arg(redis_key).query_async(conn).await?)
}

/// Polls the value at `redis_key` (backstage) until `expired` says it has expired.
#[tracing::instrument(name = "lab.backstage", skip_all)]
async fn wait_until(
    conn: &mut Conn,
    redis_key: &str,
    expired: impl Fn(Option<&str>) -> bool,
) -> Result<(), ScenarioError> {
    let deadline = Instant::now() + EXPIRY_LIMIT;
    loop {
        let now: Option<String> = redis::cmd("GET").arg(redis_key).query_async(conn).await?;
        if expired(now.as_deref()) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(ScenarioError::Broken(format!("{redis_key} never expired")));
        }
        // Polling Redis for an expiry that is due within milliseconds.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
