//! An at-least-once job queue on Redis Streams, the way a worker fleet uses one.
//!
//! Jobs are entries of a stream (`XADD`). Workers read them through a consumer group
//! (`XREADGROUP … >`): each entry goes to one worker and stays in the group's *pending entries
//! list* until that worker acknowledges it (`XACK`). A worker that crashes, or whose ack is lost,
//! leaves its entry pending, and it stays pending: Redis Streams has no visibility timeout and
//! redelivers nothing by itself. Another worker must claim it (`XAUTOCLAIM` with a min-idle-time:
//! only entries idle at least that long), and then it is delivered again, to that worker, with its
//! delivery count one higher and the same entry id. That is at-least-once delivery: nothing is lost, and anything may come twice. A job
//! that can never succeed goes to a dead-letter stream with its reason, and is acknowledged.
//!
//! ```text
//! XADD jobs * job {…}            publish
//! XREADGROUP GROUP g w1 … >      deliver a new entry to worker w1 (pending, count 1)
//! XACK jobs g <id>               done: no longer pending
//! XAUTOCLAIM jobs g w2 <idle> …  claim an entry idle ≥ <idle> ms for w2 (count + 1)
//! XADD jobs:dead * …; XACK       give up on a job, with its reason
//! ```
//!
//! Every key lives under the run's prefix. Waiting out the min-idle-time is simulated, as
//! the lab's leases are: [`Queue::age`] sets an entry's idle time (`XCLAIM … IDLE … JUSTID`,
//! which changes nothing else) instead of waiting.

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{RedisResult, Value};
use serde::{Deserialize, Serialize};

/// XAUTOCLAIM's min-idle-time: how long a delivered entry must stay unacknowledged before
/// another worker may claim it.
pub const CLAIM_MIN_IDLE: Duration = Duration::from_secs(30);

/// An invoice job, as the lesson defines it (the delivery id is the queue's, see [`Delivery`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvoiceJob {
    pub tenant_id: String,
    pub order_id: String,
    /// 1 for the first invoice of an order; a corrected invoice is a new version.
    pub invoice_version: u32,
    pub email: String,
}

/// One delivery of an entry to a worker.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The stream entry's id: the same on every delivery of the entry.
    pub entry: String,
    /// How many times the entry has been delivered, this delivery included.
    pub count: u64,
    pub job: InvoiceJob,
}

impl Delivery {
    /// The delivery's own id, new for every delivery: the entry and its delivery count.
    pub fn delivery_id(&self) -> String {
        format!("{}/{}", self.entry, self.count)
    }
}

/// An entry waiting for its acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub entry: String,
    pub consumer: String,
    pub count: u64,
}

/// A job queue: a stream, its consumer group, and its dead-letter stream.
#[derive(Clone)]
pub struct Queue<C> {
    conn: C,
    pub stream: String,
    pub group: String,
    pub dead: String,
}

/// Sends a consumer's command, once more if its connection had been dropped since the last one
/// (a Redis restart, a failover, a blip), so the first command after it does not fail for
/// nothing. Safe for every command a consumer sends here: `XACK`, `XPENDING`, `XRANGE`, `XINFO`
/// and `XCLAIM … JUSTID` do the same again, `XAUTOCLAIM` claims what is still idle, and an
/// `XREADGROUP >` that had landed leaves its entry pending for this consumer, to be claimed again
/// after its idle time: never lost, never acknowledged unhandled. (A producer's `XADD` is not
/// sent again: a second publish would be a second job.)
trait SendAgain {
    async fn send<T: redis::FromRedisValue, C: ConnectionLike + Clone + Send>(
        &self,
        queue: &Queue<C>,
    ) -> RedisResult<T>;
}

impl SendAgain for redis::Cmd {
    async fn send<T: redis::FromRedisValue, C: ConnectionLike + Clone + Send>(
        &self,
        queue: &Queue<C>,
    ) -> RedisResult<T> {
        match self.query_async(&mut queue.conn.clone()).await {
            Err(e) if e.is_connection_dropped() || e.is_unrecoverable_error() => {
                self.query_async(&mut queue.conn.clone()).await
            }
            result => result,
        }
    }
}

impl<C: ConnectionLike + Clone + Send> Queue<C> {
    /// The queue `name` under `prefix`; creates the stream and its group if they do not exist.
    #[tracing::instrument(level = "debug", skip_all)]
    pub async fn open(conn: C, prefix: &str, name: &str) -> RedisResult<Queue<C>> {
        let queue = Queue {
            conn,
            stream: format!("{prefix}jobs:{name}"),
            group: format!("{name}-workers"),
            dead: format!("{prefix}jobs:{name}:dead"),
        };
        let created: RedisResult<()> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&queue.stream)
            .arg(&queue.group)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut queue.conn.clone())
            .await;
        match created {
            // The group exists already: another worker created it.
            Err(e) if e.code() == Some("BUSYGROUP") => Ok(queue),
            other => other.map(|()| queue),
        }
    }

    /// The same queue, through another connection.
    pub fn on<D>(&self, conn: D) -> Queue<D> {
        Queue {
            conn,
            stream: self.stream.clone(),
            group: self.group.clone(),
            dead: self.dead.clone(),
        }
    }

    /// Publishes a job; returns its entry id.
    #[tracing::instrument(level = "debug", skip_all)]
    pub async fn publish(&self, job: &InvoiceJob) -> RedisResult<String> {
        redis::cmd("XADD")
            .arg(&self.stream)
            .arg("*")
            .arg("job")
            .arg(serde_json::to_string(job).expect("a job serialises"))
            .query_async(&mut self.conn.clone())
            .await
    }

    /// The next new entry for `consumer`, if any.
    #[tracing::instrument(level = "debug", skip_all)]
    pub async fn receive(&self, consumer: &str) -> RedisResult<Option<Delivery>> {
        let reply: Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(&self.group)
            .arg(consumer)
            .arg("COUNT")
            .arg(1)
            .arg("STREAMS")
            .arg(&self.stream)
            .arg(">")
            .send(self)
            .await?;
        // [[stream, [[id, [field, value, …]]]]]
        let entry = first_entry(&reply, 2);
        self.delivered(entry).await
    }

    /// Claims for `consumer` the oldest entry idle for at least [`CLAIM_MIN_IDLE`]: its
    /// redelivery.
    #[tracing::instrument(level = "debug", skip_all)]
    pub async fn reclaim(&self, consumer: &str) -> RedisResult<Option<Delivery>> {
        let reply: Value = redis::cmd("XAUTOCLAIM")
            .arg(&self.stream)
            .arg(&self.group)
            .arg(consumer)
            .arg(CLAIM_MIN_IDLE.as_millis() as u64)
            .arg("0-0")
            .arg("COUNT")
            .arg(1)
            .send(self)
            .await?;
        // [next cursor, [[id, [field, value, …]]], [deleted ids]]
        let entry = first_entry(&reply, 1);
        self.delivered(entry).await
    }

    async fn delivered(&self, entry: Option<(String, String)>) -> RedisResult<Option<Delivery>> {
        let Some((id, job)) = entry else {
            return Ok(None);
        };
        let job: InvoiceJob = serde_json::from_str(&job).map_err(|e| {
            redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "not a job",
                e.to_string(),
            ))
        })?;
        let count = self
            .pending()
            .await?
            .into_iter()
            .find(|p| p.entry == id)
            .map_or(1, |p| p.count);
        Ok(Some(Delivery {
            entry: id,
            count,
            job,
        }))
    }

    /// Acknowledges an entry: it is done and will not be delivered again.
    #[tracing::instrument(level = "debug", skip_all)]
    pub async fn ack(&self, entry: &str) -> RedisResult<()> {
        redis::cmd("XACK")
            .arg(&self.stream)
            .arg(&self.group)
            .arg(entry)
            .send(self)
            .await
    }

    /// Moves a delivery to the dead-letter stream with its reason, and acknowledges it.
    #[tracing::instrument(level = "debug", skip_all)]
    pub async fn dead_letter(&self, delivery: &Delivery, reason: &str) -> RedisResult<()> {
        let () = redis::cmd("XADD")
            .arg(&self.dead)
            .arg("*")
            .arg("job")
            .arg(serde_json::to_string(&delivery.job).expect("a job serialises"))
            .arg("reason")
            .arg(reason)
            .arg("entry")
            .arg(&delivery.entry)
            .send(self)
            .await
            .map(|_: String| ())?;
        self.ack(&delivery.entry).await
    }

    /// The dead letters: each job with its reason.
    #[tracing::instrument(level = "debug", skip_all)]
    pub async fn dead_letters(&self) -> RedisResult<Vec<(InvoiceJob, String)>> {
        let reply: Value = redis::cmd("XRANGE")
            .arg(&self.dead)
            .arg("-")
            .arg("+")
            .send(self)
            .await?;
        let Value::Array(entries) = reply else {
            return Ok(Vec::new());
        };
        Ok(entries
            .iter()
            .filter_map(|entry| {
                let fields = fields(entry)?;
                let job = serde_json::from_str(fields.get("job")?).ok()?;
                Some((job, fields.get("reason")?.clone()))
            })
            .collect())
    }

    /// The pending entries list (`XPENDING … - + 100`): what was delivered and not acknowledged.
    #[tracing::instrument(level = "debug", skip_all)]
    pub async fn pending(&self) -> RedisResult<Vec<Pending>> {
        let rows: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
            .arg(&self.stream)
            .arg(&self.group)
            .arg("-")
            .arg("+")
            .arg(100)
            .send(self)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(entry, consumer, _idle, count)| Pending {
                entry,
                consumer,
                count,
            })
            .collect())
    }

    /// Entries never delivered yet (the group's `lag`, Redis 7).
    #[tracing::instrument(level = "debug", skip_all)]
    pub async fn undelivered(&self) -> RedisResult<u64> {
        let groups: Vec<std::collections::HashMap<String, Value>> = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(&self.stream)
            .send(self)
            .await?;
        Ok(groups
            .iter()
            .find(|g| {
                matches!(g.get("name"), Some(Value::BulkString(n)) if n == self.group.as_bytes())
            })
            .and_then(|g| match g.get("lag") {
                Some(Value::Int(lag)) => Some(*lag as u64),
                _ => None,
            })
            .unwrap_or(0))
    }

    /// Simulated time: makes a pending entry look idle for `idle` (its owner and delivery count
    /// unchanged), instead of waiting that long.
    #[tracing::instrument(level = "debug", skip_all)]
    pub async fn age(&self, pending: &Pending, idle: Duration) -> RedisResult<()> {
        let _: Value = redis::cmd("XCLAIM")
            .arg(&self.stream)
            .arg(&self.group)
            .arg(&pending.consumer)
            .arg(0)
            .arg(&pending.entry)
            .arg("IDLE")
            .arg(idle.as_millis() as u64)
            .arg("JUSTID")
            .send(self)
            .await?;
        Ok(())
    }
}

/// The field map of a stream entry `[id, [field, value, …]]`.
fn fields(entry: &Value) -> Option<std::collections::HashMap<String, String>> {
    let Value::Array(parts) = entry else {
        return None;
    };
    let Value::Array(pairs) = parts.get(1)? else {
        return None;
    };
    let text = |v: &Value| match v {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        _ => None,
    };
    pairs
        .chunks(2)
        .map(|pair| Some((text(pair.first()?)?, text(pair.get(1)?)?)))
        .collect()
}

/// The first entry (id and `job` field) in a reply, where entries are at `path` depth: 2 for
/// `XREADGROUP` (streams, then entries), 1 for `XAUTOCLAIM` (its second element).
fn first_entry(reply: &Value, path: usize) -> Option<(String, String)> {
    let entries = match (reply, path) {
        (Value::Array(streams), 2) => match streams.first()? {
            Value::Array(stream) => stream.get(1)?,
            _ => return None,
        },
        (Value::Array(parts), 1) => parts.get(1)?,
        (Value::Map(streams), 2) => &streams.first()?.1,
        _ => return None,
    };
    let Value::Array(entries) = entries else {
        return None;
    };
    let entry = entries.first()?;
    let Value::Array(parts) = entry else {
        return None;
    };
    let id = match parts.first()? {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::SimpleString(s) => s.clone(),
        _ => return None,
    };
    let job = fields(entry)?.get("job")?.clone();
    Some((id, job))
}
