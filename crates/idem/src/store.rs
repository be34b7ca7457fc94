//! Every Redis command the coordinator sends, each bounded by the policy's command timeout.
//!
//! This is the one place that talks to Redis, so the whole protocol can be read here:
//!
//! | method | command | used for |
//! |---|---|---|
//! | [`Store::reserve`] | `SET key pending NX GET PX lease` | reserve-or-read, unfenced |
//! | [`Store::reserve_fenced`] | `EVALSHA reserve.lua` (GET, INCR, SET PX) | reserve-or-read with a fence |
//! | [`Store::read`] | `GET key` | run mode, inspection |
//! | [`Store::store_if_absent`] | `SET key record NX GET PX ttl` | run mode's store-or-read-the-winner |
//! | [`Store::overwrite`] | `SET key record PX ttl` | unfenced complete; replacing an unusable record |
//! | [`Store::renew`] | `SET key pending XX PX lease` | unfenced renewal |
//! | [`Store::renew_fenced`] | `EVALSHA renew.lua` | renewal, compare-and-set |
//! | [`Store::complete_fenced`] | `EVALSHA complete.lua` | complete, compare-and-set |
//! | [`Store::delete`] | `DEL key` | unfenced release |
//! | [`Store::release_fenced`] | `EVALSHA release.lua` | release, compare-and-delete |
//!
//! `SET … NX GET` needs Redis 7.0 or newer (6.2 refuses NX together with GET); Valkey has it too.
//! Scripts go out as `EVALSHA`; the first call on a server that does not know a script gets
//! `NOSCRIPT`, and `redis::Script` then loads it and retries, inside the same timeout.

use std::future::Future;
use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{RedisResult, Script, Value};

use crate::error::{Stage, StorageCause, StorageError};

static RESERVE: LazyLock<Script> = LazyLock::new(|| Script::new(crate::lua::RESERVE));
static COMPLETE: LazyLock<Script> = LazyLock::new(|| Script::new(crate::lua::COMPLETE));
static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(crate::lua::RENEW));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(crate::lua::RELEASE));

/// The outcome of reserve-or-read.
pub(crate) enum Reservation {
    /// The key was free and now holds our pending record; `fence` is our token if fenced.
    Reserved { fence: Option<u64> },
    /// The key was taken; this is what it holds (raw bytes: it may not even be UTF-8).
    Taken(Vec<u8>),
}

/// A connection and the timeout every command gets.
#[derive(Clone)]
pub(crate) struct Store<C> {
    conn: C,
    timeout: Duration,
}

impl<C> Store<C>
where
    C: ConnectionLike + Clone + Send + Sync,
{
    pub(crate) fn new(conn: C, timeout: Duration) -> Store<C> {
        Store { conn, timeout }
    }

    /// Runs one command with the timeout. The connection types are cheap handles to one shared
    /// connection, so each command clones one instead of locking a shared `&mut`.
    async fn bounded<T>(
        &self,
        stage: Stage,
        command: impl Future<Output = RedisResult<T>>,
    ) -> Result<T, StorageError> {
        match tokio::time::timeout(self.timeout, command).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(error)) => Err(StorageError::new(stage, StorageCause::Redis(error))),
            Err(_elapsed) => Err(StorageError::new(
                stage,
                StorageCause::Timeout(self.timeout),
            )),
        }
    }

    /// `SET key pending NX GET PX lease`: writes our reservation if the key is free, and in the
    /// same round trip returns what holds the key if it is not (nil means it was free).
    #[tracing::instrument(level = "debug", skip_all)]
    pub(crate) async fn reserve(
        &self,
        key: &str,
        pending: &str,
        lease: Duration,
    ) -> Result<Reservation, StorageError> {
        let mut conn = self.conn.clone();
        let previous: Option<Vec<u8>> = self
            .bounded(Stage::Reserve, async move {
                redis::cmd("SET")
                    .arg(key)
                    .arg(pending)
                    .arg("NX")
                    .arg("GET")
                    .arg("PX")
                    .arg(millis(lease))
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        Ok(match previous {
            None => Reservation::Reserved { fence: None },
            Some(stored) => Reservation::Taken(stored),
        })
    }

    /// `reserve.lua`: reserve-or-read, drawing a fencing token for a new reservation.
    #[tracing::instrument(level = "debug", skip_all)]
    pub(crate) async fn reserve_fenced(
        &self,
        key: &str,
        counter: &str,
        pending: &str,
        lease: Duration,
        counter_lifetime: Duration,
    ) -> Result<Reservation, StorageError> {
        let mut conn = self.conn.clone();
        let reply: Value = self
            .bounded(Stage::Reserve, async move {
                RESERVE
                    .key(key)
                    .key(counter)
                    .arg(pending)
                    .arg(millis(lease))
                    .arg(millis(counter_lifetime))
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        match reply {
            Value::Int(fence) => Ok(Reservation::Reserved {
                fence: Some(fence.try_into().unwrap_or(0)),
            }),
            Value::BulkString(stored) => Ok(Reservation::Taken(stored)),
            other => Err(unexpected(Stage::Reserve, &other)),
        }
    }

    /// `GET key`.
    #[tracing::instrument(level = "debug", skip_all)]
    pub(crate) async fn read(
        &self,
        stage: Stage,
        key: &str,
    ) -> Result<Option<Vec<u8>>, StorageError> {
        let mut conn = self.conn.clone();
        self.bounded(stage, async move {
            redis::cmd("GET").arg(key).query_async(&mut conn).await
        })
        .await
    }

    /// `SET key record NX GET PX ttl`: stores the record if the key is free; otherwise returns
    /// what holds it (the winner of a race), in the same round trip.
    #[tracing::instrument(level = "debug", skip_all)]
    pub(crate) async fn store_if_absent(
        &self,
        key: &str,
        record: &str,
        ttl: Duration,
    ) -> Result<Option<Vec<u8>>, StorageError> {
        let mut conn = self.conn.clone();
        self.bounded(Stage::Complete, async move {
            redis::cmd("SET")
                .arg(key)
                .arg(record)
                .arg("NX")
                .arg("GET")
                .arg("PX")
                .arg(millis(ttl))
                .query_async(&mut conn)
                .await
        })
        .await
    }

    /// `SET key record PX ttl`, whatever the key holds: idempotency-kit's `replace`.
    #[tracing::instrument(level = "debug", skip_all)]
    pub(crate) async fn overwrite(
        &self,
        stage: Stage,
        key: &str,
        record: &str,
        ttl: Duration,
    ) -> Result<(), StorageError> {
        let mut conn = self.conn.clone();
        self.bounded(stage, async move {
            redis::cmd("SET")
                .arg(key)
                .arg(record)
                .arg("PX")
                .arg(millis(ttl))
                .query_async::<()>(&mut conn)
                .await
        })
        .await
    }

    /// `SET key pending XX PX lease`: extends a reservation without checking whose it is
    /// (idempotency-kit 0.5.0's renewal). `XX` at least does not resurrect a key that is gone.
    /// Returns whether the key existed.
    #[tracing::instrument(level = "debug", skip_all)]
    pub(crate) async fn renew(
        &self,
        key: &str,
        pending: &str,
        lease: Duration,
    ) -> Result<bool, StorageError> {
        let mut conn = self.conn.clone();
        let reply: Option<String> = self
            .bounded(Stage::Renew, async move {
                redis::cmd("SET")
                    .arg(key)
                    .arg(pending)
                    .arg("XX")
                    .arg("PX")
                    .arg(millis(lease))
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        Ok(reply.is_some())
    }

    /// `renew.lua`: extends the reservation if it is still ours.
    #[tracing::instrument(level = "debug", skip_all)]
    pub(crate) async fn renew_fenced(
        &self,
        key: &str,
        counter: &str,
        owner: &str,
        pending: &str,
        lease: Duration,
        counter_lifetime: Duration,
    ) -> Result<bool, StorageError> {
        let mut conn = self.conn.clone();
        let renewed: i64 = self
            .bounded(Stage::Renew, async move {
                RENEW
                    .key(key)
                    .key(counter)
                    .arg(owner)
                    .arg(pending)
                    .arg(millis(lease))
                    .arg(millis(counter_lifetime))
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        Ok(renewed == 1)
    }

    /// `complete.lua`: stores the result if the reservation is still ours.
    #[tracing::instrument(level = "debug", skip_all)]
    pub(crate) async fn complete_fenced(
        &self,
        key: &str,
        counter: &str,
        owner: &str,
        record: &str,
        ttl: Duration,
        counter_lifetime: Duration,
    ) -> Result<bool, StorageError> {
        let mut conn = self.conn.clone();
        let stored: i64 = self
            .bounded(Stage::Complete, async move {
                COMPLETE
                    .key(key)
                    .key(counter)
                    .arg(owner)
                    .arg(record)
                    .arg(millis(ttl))
                    .arg(millis(counter_lifetime))
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        Ok(stored == 1)
    }

    /// `DEL key`, whoever holds it: idempotency-kit's release.
    #[tracing::instrument(level = "debug", skip_all)]
    pub(crate) async fn delete(&self, key: &str) -> Result<(), StorageError> {
        let mut conn = self.conn.clone();
        self.bounded(Stage::Release, async move {
            redis::cmd("DEL")
                .arg(key)
                .query_async::<()>(&mut conn)
                .await
        })
        .await
    }

    /// `release.lua`: deletes the reservation if it is still ours.
    #[tracing::instrument(level = "debug", skip_all)]
    pub(crate) async fn release_fenced(
        &self,
        key: &str,
        owner: &str,
    ) -> Result<bool, StorageError> {
        let mut conn = self.conn.clone();
        let released: i64 = self
            .bounded(Stage::Release, async move {
                RELEASE.key(key).arg(owner).invoke_async(&mut conn).await
            })
            .await?;
        Ok(released == 1)
    }
}

/// A duration as Redis `PX` milliseconds; `PX 0` is an error, so at least 1.
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

fn unexpected(stage: Stage, reply: &Value) -> StorageError {
    StorageError::new(
        stage,
        StorageCause::Corrupt(format!("unexpected reply {reply:?}")),
    )
}
