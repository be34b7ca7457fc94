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
//!
//! # A dropped connection
//!
//! A connection can die between two commands (Redis restarted, a failover, a network blip): the
//! next command on it fails, and the client (redis's `ConnectionManager`) opens a fresh one. With
//! [`Policy::resend_on_dropped`](crate::Policy::resend_on_dropped) that failed command is sent
//! once more, on the fresh connection, inside the same timeout. Whether the first one reached
//! Redis cannot be told from the error, so each command is sent again only as it is safe:
//!
//! | command | sent again | if the first did reach Redis |
//! |---|---|---|
//! | `GET`, `SET … XX`, `SET … PX` (complete), `DEL`, `renew.lua`, `release.lua` | yes | the second does the same again |
//! | `complete.lua` | yes | it finds its own completed record, and says stored |
//! | `SET … NX GET` (reserve) | yes | it returns our own pending record, byte for byte: ours |
//! | `reserve.lua` | yes | it returns a pending record with our owner token: ours, with its fence |
//! | `SET … NX GET` (run mode's store) | yes | it returns our own record: stored |
//!
//! So a reservation that landed the first time is never taken for another caller's (which would
//! answer "in progress" for a call that holds the key itself) nor for an absent key.

use std::future::Future;
use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{RedisError, RedisResult, Script, Value};

use crate::error::{Stage, StorageCause, StorageError};
use crate::record::StoredRecord;

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

/// A connection, the timeout every command gets, and whether a command whose connection was
/// dropped is sent again.
#[derive(Clone)]
pub(crate) struct Store<C> {
    conn: C,
    timeout: Duration,
    resend: bool,
}

/// A reply, and whether it is the second sending's (the first lost its connection).
pub(crate) struct Sent<T> {
    pub(crate) reply: T,
    pub(crate) again: bool,
}

/// Whether a command failed because its connection is gone (or could not be made), so that a
/// fresh connection might do.
fn connection_lost(error: &RedisError) -> bool {
    error.is_connection_dropped() || error.is_connection_refusal() || error.is_unrecoverable_error()
}

impl<C> Store<C>
where
    C: ConnectionLike + Clone + Send + Sync,
{
    pub(crate) fn new(conn: C, timeout: Duration, resend: bool) -> Store<C> {
        Store {
            conn,
            timeout,
            resend,
        }
    }

    /// Runs one command with the timeout, sending it once more if its connection turned out to
    /// be dropped (both sendings inside the one timeout). The connection types are cheap handles
    /// to one shared connection, so each sending clones one instead of locking a shared `&mut`.
    async fn bounded<T, Fut>(
        &self,
        stage: Stage,
        command: impl Fn(C) -> Fut,
    ) -> Result<Sent<T>, StorageError>
    where
        Fut: Future<Output = RedisResult<T>>,
    {
        let sendings = async {
            match command(self.conn.clone()).await {
                Err(error) if self.resend && connection_lost(&error) => {
                    let reply = command(self.conn.clone()).await?;
                    Ok(Sent { reply, again: true })
                }
                result => result.map(|reply| Sent {
                    reply,
                    again: false,
                }),
            }
        };
        match tokio::time::timeout(self.timeout, sendings).await {
            Ok(Ok(sent)) => Ok(sent),
            Ok(Err(error)) => Err(StorageError::new(stage, StorageCause::Redis(error))),
            Err(_elapsed) => Err(StorageError::new(
                stage,
                StorageCause::Timeout(self.timeout),
            )),
        }
    }

    /// `SET key pending NX GET PX lease`: writes our reservation if the key is free, and in the
    /// same round trip returns what holds the key if it is not (nil means it was free). Sent
    /// again after a dropped connection, a reply that is our own pending record means the first
    /// sending landed: the key is ours.
    #[tracing::instrument(level = "debug", skip_all)]
    pub(crate) async fn reserve(
        &self,
        key: &str,
        pending: &str,
        lease: Duration,
    ) -> Result<Sent<Reservation>, StorageError> {
        let sent = self
            .bounded(Stage::Reserve, |mut conn| async move {
                redis::cmd("SET")
                    .arg(key)
                    .arg(pending)
                    .arg("NX")
                    .arg("GET")
                    .arg("PX")
                    .arg(millis(lease))
                    .query_async::<Option<Vec<u8>>>(&mut conn)
                    .await
            })
            .await?;
        let reply = match sent.reply {
            None => Reservation::Reserved { fence: None },
            Some(stored) if sent.again && stored == pending.as_bytes() => {
                Reservation::Reserved { fence: None }
            }
            Some(stored) => Reservation::Taken(stored),
        };
        Ok(Sent {
            reply,
            again: sent.again,
        })
    }

    /// `reserve.lua`: reserve-or-read, drawing a fencing token for a new reservation. Sent again
    /// after a dropped connection, a pending record with our `owner` token means the first
    /// sending landed: the key is ours, with the fence that record carries.
    #[tracing::instrument(level = "debug", skip_all)]
    pub(crate) async fn reserve_fenced(
        &self,
        key: &str,
        counter: &str,
        pending: &str,
        owner: &str,
        lease: Duration,
        counter_lifetime: Duration,
    ) -> Result<Sent<Reservation>, StorageError> {
        let sent = self
            .bounded(Stage::Reserve, |mut conn| async move {
                RESERVE
                    .key(key)
                    .key(counter)
                    .arg(pending)
                    .arg(millis(lease))
                    .arg(millis(counter_lifetime))
                    .invoke_async::<Value>(&mut conn)
                    .await
            })
            .await?;
        let reply = match sent.reply {
            Value::Int(fence) => Reservation::Reserved {
                fence: Some(fence.try_into().unwrap_or(0)),
            },
            // Only a second sending can have met its own first: the record is parsed for the owner
            // only then (parsing it on every replay was a tenth of the hardened replay's work).
            Value::BulkString(stored) => match sent.again.then(|| ours(&stored, owner)).flatten() {
                Some(fence) => Reservation::Reserved { fence },
                None => Reservation::Taken(stored),
            },
            other => return Err(unexpected(Stage::Reserve, &other)),
        };
        Ok(Sent {
            reply,
            again: sent.again,
        })
    }

    /// `GET key`.
    #[tracing::instrument(level = "debug", skip_all)]
    pub(crate) async fn read(
        &self,
        stage: Stage,
        key: &str,
    ) -> Result<Option<Vec<u8>>, StorageError> {
        self.bounded(stage, |mut conn| async move {
            redis::cmd("GET").arg(key).query_async(&mut conn).await
        })
        .await
        .map(|sent| sent.reply)
    }

    /// `SET key record NX GET PX ttl`: stores the record if the key is free; otherwise returns
    /// what holds it (the winner of a race), in the same round trip. Sent again, our own record
    /// in the reply means it was stored the first time.
    #[tracing::instrument(level = "debug", skip_all)]
    pub(crate) async fn store_if_absent(
        &self,
        key: &str,
        record: &str,
        ttl: Duration,
    ) -> Result<Option<Vec<u8>>, StorageError> {
        let sent = self
            .bounded(Stage::Complete, |mut conn| async move {
                redis::cmd("SET")
                    .arg(key)
                    .arg(record)
                    .arg("NX")
                    .arg("GET")
                    .arg("PX")
                    .arg(millis(ttl))
                    .query_async::<Option<Vec<u8>>>(&mut conn)
                    .await
            })
            .await?;
        Ok(sent
            .reply
            .filter(|stored| !(sent.again && stored == record.as_bytes())))
    }

    /// `SET key record PX ttl`, whatever the key holds: idempotency-kit's `replace`.
    #[tracing::instrument(level = "debug", skip_all)]
    pub(crate) async fn overwrite(
        &self,
        stage: Stage,
        key: &str,
        record: &str,
        ttl: Duration,
    ) -> Result<Sent<()>, StorageError> {
        self.bounded(stage, |mut conn| async move {
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
        let sent = self
            .bounded(Stage::Renew, |mut conn| async move {
                redis::cmd("SET")
                    .arg(key)
                    .arg(pending)
                    .arg("XX")
                    .arg("PX")
                    .arg(millis(lease))
                    .query_async::<Option<String>>(&mut conn)
                    .await
            })
            .await?;
        Ok(sent.reply.is_some())
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
        let sent = self
            .bounded(Stage::Renew, |mut conn| async move {
                RENEW
                    .key(key)
                    .key(counter)
                    .arg(owner)
                    .arg(pending)
                    .arg(millis(lease))
                    .arg(millis(counter_lifetime))
                    .invoke_async::<i64>(&mut conn)
                    .await
            })
            .await?;
        Ok(sent.reply == 1)
    }

    /// `complete.lua`: stores the result if the reservation is still ours (or says stored if
    /// it is ours and completed already: the first sending landed).
    #[tracing::instrument(level = "debug", skip_all)]
    pub(crate) async fn complete_fenced(
        &self,
        key: &str,
        counter: &str,
        owner: &str,
        record: &str,
        ttl: Duration,
        counter_lifetime: Duration,
    ) -> Result<Sent<bool>, StorageError> {
        let sent = self
            .bounded(Stage::Complete, |mut conn| async move {
                COMPLETE
                    .key(key)
                    .key(counter)
                    .arg(owner)
                    .arg(record)
                    .arg(millis(ttl))
                    .arg(millis(counter_lifetime))
                    .invoke_async::<i64>(&mut conn)
                    .await
            })
            .await?;
        Ok(Sent {
            reply: sent.reply == 1,
            again: sent.again,
        })
    }

    /// `DEL key`, whoever holds it: idempotency-kit's release.
    #[tracing::instrument(level = "debug", skip_all)]
    pub(crate) async fn delete(&self, key: &str) -> Result<(), StorageError> {
        self.bounded(Stage::Release, |mut conn| async move {
            redis::cmd("DEL")
                .arg(key)
                .query_async::<()>(&mut conn)
                .await
        })
        .await
        .map(|sent| sent.reply)
    }

    /// `release.lua`: deletes the reservation if it is still ours.
    #[tracing::instrument(level = "debug", skip_all)]
    pub(crate) async fn release_fenced(
        &self,
        key: &str,
        owner: &str,
    ) -> Result<bool, StorageError> {
        let sent = self
            .bounded(Stage::Release, |mut conn| async move {
                RELEASE
                    .key(key)
                    .arg(owner)
                    .invoke_async::<i64>(&mut conn)
                    .await
            })
            .await?;
        Ok(sent.reply == 1)
    }
}

/// The fence of a stored record that is a pending reservation with our owner token: `None` when
/// it is anyone else's (or not a record at all).
fn ours(stored: &[u8], owner: &str) -> Option<Option<u64>> {
    let record = StoredRecord::from_json(std::str::from_utf8(stored).ok()?).ok()?;
    (record.owner.as_deref() == Some(owner) && record.is_pending()).then_some(record.fence)
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
