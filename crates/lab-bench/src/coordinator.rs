//! The coordinator bench: the `idem` coordinator on Redis, next to a bare Redis client that
//! sends exactly the round trips idem sends on that path, so the difference is idem's own work.
//! (`lab bench coordinator` prints what [`idem_rows`] and [`python_rows`] return.)
//!
//! Rows: path (`new`: every call a fresh key; `replay`: every call one key whose result is
//! stored) × policy (`compatible`, `hardened`) × concurrency. For each row idem is measured, then
//! the bare client ("raw"), alternately, so that a machine that slows down during the run slows
//! both. What "raw" sends mirrors `crates/idem/src/store.rs`:
//!
//! | path   | compatible                                   | hardened                              |
//! |--------|----------------------------------------------|---------------------------------------|
//! | new    | `SET k pending NX GET PX lease`; `SET k record PX ttl` | `EVALSHA reserve.lua`; `EVALSHA complete.lua` |
//! | replay | `SET k pending NX GET PX lease` (→ the record) | `EVALSHA reserve.lua` (→ the record) |
//!
//! The raw client sends records of the same shape and size and checks each reply as idem would
//! (a new key must be free, a replay must find the record), but parses no JSON, validates no
//! key, bounds no command with a timeout and reports to no observer: that is the limit idem can
//! approach. [`Row::ratio_to_raw`] = idem's ops/s ÷ raw's.
//!
//! Keys: everything (idem's records, their fence counters, raw's keys) lives under
//! `lab:bench:<8 hex>:` ([`Plan::prefix`]), and is deleted at the end by `SCAN MATCH` of that
//! prefix on every node ([`delete_prefix`]); nothing else is read, written or flushed. On a
//! cluster node ([`connect`] asks the server) the bench runs on a cluster connection (idem's
//! fence counters share their record's slot, see `idem::key::fence_key`), and the cleanup scans
//! every master ([`Link::masters`]).
//!
//! [`python_rows`] runs `crates/idem/tests/python/bench.py` (idempotency-kit 0.4.1 and raw
//! redis-py) on the same Redis, under a prefix of its own below the bench's, and returns its rows.
//!
//! A caller runs the steps itself, so that it knows the masters to clean up on before anything
//! is written, and can clean up however the measuring ends (an error, Ctrl-C):
//!
//! ```text
//! let plan = Plan::new(ops, &concurrency);
//! let link = connect(redis).await?;              // remember link.masters() for the cleanup
//! let rows = idem_rows(&link, &plan, &progress).await?;
//! let more = python_rows(python, &redis.url, &plan, &progress).await?;   // if wanted
//! delete_prefix(redis, link.masters(), &plan.prefix).await?;            // always
//! ```

use std::convert::Infallible;
use std::path::Path;
use std::sync::LazyLock;
use std::time::Duration;

use idem::{Coordinator, Policy, Request, Source, Unprotected};
use lab_core::Msg;
use lab_infra::servers::RedisServer;
use redis::aio::ConnectionLike;
use redis::{Script, Value};
use serde::ser::{Serialize, SerializeStruct, Serializer};
use serde_json::json;

use crate::{BenchError, Progress, Sample, measure, tenth, warm_up};

/// The result TTL every call asks for: an hour, as the Python reference bench (`ttl_seconds=3600`).
const TTL: Duration = Duration::from_secs(3600);

/// The raw client's owner token for the hardened scripts: constant, since each key is reserved
/// once (complete.lua compares it with the pending record's `owner`).
const RAW_OWNER: &str = "0123456789abcdef0123456789abcdef";

static RESERVE: LazyLock<Script> = LazyLock::new(|| Script::new(idem::lua::RESERVE));
static COMPLETE: LazyLock<Script> = LazyLock::new(|| Script::new(idem::lua::COMPLETE));

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CallPath {
    New,
    Replay,
}

impl CallPath {
    fn name(self) -> &'static str {
        match self {
            CallPath::New => "new",
            CallPath::Replay => "replay",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PolicyName {
    Compatible,
    Hardened,
}

impl PolicyName {
    fn name(self) -> &'static str {
        match self {
            PolicyName::Compatible => "compatible",
            PolicyName::Hardened => "hardened",
        }
    }

    fn policy(self) -> Policy {
        match self {
            PolicyName::Compatible => Policy::compatible(),
            PolicyName::Hardened => Policy::hardened(),
        }
    }
}

/// What the bench measures, and under which prefix its keys go.
#[derive(Debug, Clone)]
pub struct Plan {
    /// `lab:bench:<8 hex>:`: every key the bench writes starts with it, and the cleanup deletes
    /// exactly these.
    pub prefix: String,
    /// Calls per row, after [`warm_up`] calls not counted.
    pub ops: u64,
    /// One row per path and policy for each of these numbers of concurrent callers.
    pub concurrency: Vec<u32>,
}

impl Plan {
    /// A plan under a fresh prefix.
    pub fn new(ops: u64, concurrency: &[u32]) -> Plan {
        // Eight hex digits of a fresh UUID: never a glob character, so `SCAN MATCH prefix*`
        // matches exactly the bench's keys.
        let prefix = format!(
            "lab:bench:{}:",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        Plan {
            prefix,
            ops,
            concurrency: concurrency.to_vec(),
        }
    }

    /// Every call [`idem_rows`] makes, warm-ups included: a progress bar's length.
    pub fn calls(&self) -> u64 {
        // Rows: 2 paths × 2 policies × each concurrency; each row times idem and raw, each after
        // its warm-up. (The Python rows, if any, are not counted: they report no progress.)
        let rows = 2 * 2 * self.concurrency.len() as u64;
        rows * 2 * (self.ops + warm_up(self.ops))
    }

    /// The Python bench's prefix: below the bench's, so the one cleanup deletes its keys too.
    fn python_prefix(&self) -> String {
        format!("{}py:", self.prefix)
    }
}

/// One row: a path and policy at one concurrency, measured, beside the bare client's rate.
///
/// Serialised (one JSON object per row, `lab bench coordinator --format json`) with its fields
/// in this order and [`Row::ratio_to_raw`] last.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Who was measured: `idem`, or `idempotency-kit` (the Python reference, [`python_rows`]).
    pub bench: String,
    /// `new` or `replay`.
    pub path: String,
    /// `compatible` or `hardened` (the Python rows say their version and mode, `0.4.1 wait`).
    pub policy: String,
    pub concurrency: u32,
    pub ops: u64,
    /// Rounded to a tenth ([`tenth`]), as are the latencies and the raw rate.
    pub ops_per_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// The bare client's ops/s on the same path and concurrency: redis-rs for idem's rows,
    /// redis-py (sending idempotency-kit's round trips) for the Python rows.
    pub raw_ops_per_sec: f64,
}

impl Row {
    fn new(
        bench: &str,
        path: CallPath,
        policy: &str,
        concurrency: u32,
        s: &Sample,
        raw: &Sample,
    ) -> Row {
        Row {
            bench: bench.to_string(),
            path: path.name().to_string(),
            policy: policy.to_string(),
            concurrency,
            ops: s.ops,
            ops_per_sec: tenth(s.ops_per_sec()),
            p50_us: tenth(s.percentile_us(50.0)),
            p99_us: tenth(s.percentile_us(99.0)),
            raw_ops_per_sec: tenth(raw.ops_per_sec()),
        }
    }

    /// Computed from the two printed numbers, so a reader can check it.
    pub fn ratio_to_raw(&self) -> f64 {
        if self.raw_ops_per_sec > 0.0 {
            self.ops_per_sec / self.raw_ops_per_sec
        } else {
            0.0
        }
    }
}

// By hand rather than derived: the ratio is computed, not stored, and belongs in the JSON too.
impl Serialize for Row {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut row = serializer.serialize_struct("Row", 10)?;
        row.serialize_field("bench", &self.bench)?;
        row.serialize_field("path", &self.path)?;
        row.serialize_field("policy", &self.policy)?;
        row.serialize_field("concurrency", &self.concurrency)?;
        row.serialize_field("ops", &self.ops)?;
        row.serialize_field("ops_per_sec", &self.ops_per_sec)?;
        row.serialize_field("p50_us", &self.p50_us)?;
        row.serialize_field("p99_us", &self.p99_us)?;
        row.serialize_field("raw_ops_per_sec", &self.raw_ops_per_sec)?;
        row.serialize_field("ratio_to_raw", &self.ratio_to_raw())?;
        row.end()
    }
}

/// The Redis the bench talks to: one server, or a cluster (and the masters to clean up on).
#[derive(Clone)]
pub enum Link {
    /// A server that is not a cluster node: its own multiplexed connection.
    Single(redis::aio::MultiplexedConnection),
    /// A cluster node: a connection that follows the slots, and every master's URL.
    Cluster {
        conn: redis::cluster_async::ClusterConnection,
        masters: Vec<String>,
    },
}

impl Link {
    /// The URL of every master of a cluster; none for a single server (the cleanup then scans
    /// the server's own connection).
    pub fn masters(&self) -> &[String] {
        match self {
            Link::Single(_) => &[],
            Link::Cluster { masters, .. } => masters,
        }
    }
}

/// idem's rows and raw's, on a single Redis or a cluster: path × policy × concurrency, idem
/// then raw. Tells `progress` of every call, warm-ups included ([`Plan::calls`] in all).
pub async fn idem_rows(
    link: &Link,
    plan: &Plan,
    progress: &dyn Progress,
) -> Result<Vec<Row>, BenchError> {
    progress.side("idem");
    match link {
        Link::Single(conn) => all_rows(conn.clone(), plan, progress).await,
        Link::Cluster { conn, .. } => all_rows(conn.clone(), plan, progress).await,
    }
}

/// Connects the way the bench needs: a cluster connection when the server is a cluster node.
pub async fn connect(redis: &RedisServer) -> Result<Link, BenchError> {
    let mut conn = redis.conn.clone();
    let info: String = redis::cmd("INFO")
        .arg("cluster")
        .query_async(&mut conn)
        .await
        .map_err(storage)?;
    if !info.lines().any(|l| l.trim() == "cluster_enabled:1") {
        return Ok(Link::Single(conn));
    }
    let masters = cluster_masters(&mut conn, &redis.url).await?;
    let client = redis::cluster::ClusterClient::new(vec![redis.url.as_str()]).map_err(storage)?;
    let conn = client.get_async_connection().await.map_err(storage)?;
    Ok(Link::Cluster { conn, masters })
}

/// The URL of every master of the cluster (from `CLUSTER SLOTS`), for the cleanup's SCAN: a scan
/// sees only the node it is sent to.
async fn cluster_masters(
    conn: &mut redis::aio::MultiplexedConnection,
    url: &str,
) -> Result<Vec<String>, BenchError> {
    let slots: Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(conn)
        .await
        .map_err(storage)?;
    let base = url::Url::parse(url)?;
    let mut masters = Vec::new();
    let Value::Array(ranges) = slots else {
        return Err(storage(format!(
            "CLUSTER SLOTS: unexpected reply {slots:?}"
        )));
    };
    for range in ranges {
        // [start, end, [ip, port, id, …] (the master), replicas…]
        let Value::Array(range) = range else { continue };
        let Some(Value::Array(master)) = range.get(2) else {
            continue;
        };
        let (Some(Value::BulkString(ip)), Some(Value::Int(port))) = (master.first(), master.get(1))
        else {
            continue;
        };
        let mut node = base.clone();
        let ip = String::from_utf8_lossy(ip);
        // An empty address means "the node you asked".
        if !ip.is_empty() {
            let _ = node.set_host(Some(&ip));
        }
        let _ = node.set_port(u16::try_from(*port).ok());
        let node = node.to_string();
        if !masters.contains(&node) {
            masters.push(node);
        }
    }
    Ok(masters)
}

/// Deletes every key under `prefix` on the server, or on every master of a cluster
/// ([`Link::masters`]). Returns how many keys were deleted.
pub async fn delete_prefix(
    redis: &RedisServer,
    masters: &[String],
    prefix: &str,
) -> Result<u64, BenchError> {
    let mut nodes = Vec::new();
    if masters.is_empty() {
        nodes.push(redis.conn.clone());
    } else {
        for url in masters {
            let client = redis::Client::open(url.as_str()).map_err(BenchError::Redis)?;
            let conn = client.get_multiplexed_async_connection().await;
            nodes.push(conn.map_err(BenchError::Redis)?);
        }
    }
    let mut deleted = 0;
    for mut conn in nodes {
        deleted += lab_infra::space::delete_under_prefix(&mut conn, prefix)
            .await
            .map_err(BenchError::Redis)?;
    }
    Ok(deleted)
}

/// Every row: path × policy × concurrency, idem then raw.
async fn all_rows<C>(conn: C, plan: &Plan, progress: &dyn Progress) -> Result<Vec<Row>, BenchError>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let mut rows = Vec::new();
    for path in [CallPath::New, CallPath::Replay] {
        for policy in [PolicyName::Compatible, PolicyName::Hardened] {
            for &callers in &plan.concurrency {
                let ours = idem_sample(conn.clone(), plan, progress, path, policy, callers).await?;
                let raw = raw_sample(conn.clone(), plan, progress, path, policy, callers).await?;
                rows.push(Row::new("idem", path, policy.name(), callers, &ours, &raw));
            }
        }
    }
    Ok(rows)
}

/// A batch of coordinated calls. Each call's source is checked: a new key must run the action
/// (`Ran`), a replay must not (`Replayed`). A compatible coordinator fails open, so without this
/// check a Redis that went away would show up as a fast bench instead of an error.
async fn idem_sample<C>(
    conn: C,
    plan: &Plan,
    progress: &dyn Progress,
    path: CallPath,
    policy: PolicyName,
    callers: u32,
) -> Result<Sample, BenchError>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let coordinator = Coordinator::new(conn, policy.policy()).with_prefix(&plan.prefix);
    let operation = format!("bench.{}.{}.{callers}", path.name(), policy.name());
    if path == CallPath::Replay {
        let first = coordinator
            .coordinate(Request::new(&operation, REPLAY_KEY, TTL), |_| async {
                Ok::<_, Infallible>(json!({"n": 0}))
            })
            .await;
        expect_source(first, Expect::Ran)?;
    }
    let call = |n: u64| {
        let coordinator = &coordinator;
        let operation = &operation;
        async move {
            let key = match path {
                CallPath::New => n.to_string(),
                CallPath::Replay => REPLAY_KEY.to_string(),
            };
            let outcome = coordinator
                .coordinate(Request::new(operation, &key, TTL), |_| async move {
                    Ok::<_, Infallible>(json!({"n": n}))
                })
                .await;
            expect_source(
                outcome,
                match path {
                    CallPath::New => Expect::Ran,
                    CallPath::Replay => Expect::Replayed,
                },
            )
        }
    };
    let warm = warm_up(plan.ops);
    measure(plan.ops, warm, callers, progress, call).await?;
    measure(0, plan.ops, callers, progress, call).await
}

/// Checks a coordinated call's source against what the path must give.
fn expect_source(
    outcome: Result<idem::Coordinated<serde_json::Value>, idem::Error<Infallible>>,
    expected: Expect,
) -> Result<(), BenchError> {
    let unexpected = |got: String| {
        BenchError::Drift(
            Msg::new("bench.unexpected")
                .arg("expected", format!("{expected:?}"))
                .arg("got", got),
        )
    };
    match outcome {
        Ok(done) => match (&done.source, expected) {
            (Source::Ran, Expect::Ran) | (Source::Replayed, Expect::Replayed) => Ok(()),
            // The compatible policy fails open: a Redis that went away shows up here.
            (Source::Unprotected(Unprotected::Storage(error)), _) => Err(storage(error)),
            (other, _) => Err(unexpected(format!("{other:?}"))),
        },
        Err(idem::Error::Storage(error)) => Err(storage(error)),
        Err(error) => Err(unexpected(error.to_string())),
    }
}

/// What a coordinated call must report as its source.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// A new key: the action ran under our reservation and its result is stored.
    Ran,
    /// A stored key: the result was replayed, the action did not run.
    Replayed,
}

/// A record as idem writes it (idempotency-kit's shape, compact JSON, fields in its order), for
/// the raw client's payloads: the same size on the wire as idem's.
fn record_json(operation: &str, key: &str, status: &str, owner: Option<&str>) -> String {
    let result = if status == "pending" {
        serde_json::Value::Null
    } else {
        json!({"n": 1})
    };
    let mut record = json!({
        "operation": operation,
        "idempotency_key": key,
        "result": result,
        "created_at": "2026-11-30T12:00:00.000000Z",
        "expires_at": "2026-11-30T13:00:00.000000Z",
        "status": status,
        "fingerprint": null,
    });
    if let Some(owner) = owner {
        record["owner"] = json!(owner);
    }
    record.to_string()
}

/// A batch of the bare client's round trips, mirroring idem's (see the module's table).
async fn raw_sample<C>(
    conn: C,
    plan: &Plan,
    progress: &dyn Progress,
    path: CallPath,
    policy: PolicyName,
    callers: u32,
) -> Result<Sample, BenchError>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let raw = Raw::new(plan, path, policy, callers);
    if path == CallPath::Replay {
        raw.store_replayed(conn.clone()).await?;
    }
    let call = |n: u64| raw.call(conn.clone(), n);
    let warm = warm_up(plan.ops);
    measure(plan.ops, warm, callers, progress, call).await?;
    measure(0, plan.ops, callers, progress, call).await
}

/// The bare client of one row: what idem would send on this path, with this policy.
struct Raw<'a> {
    prefix: &'a str,
    path: CallPath,
    policy: PolicyName,
    operation: String,
    owner: Option<&'static str>,
    lease_ms: u64,
    ttl_ms: u64,
    retention_ms: u64,
}

/// The key every replay reads.
const REPLAY_KEY: &str = "stored";

impl<'a> Raw<'a> {
    fn new(plan: &'a Plan, path: CallPath, policy: PolicyName, callers: u32) -> Raw<'a> {
        let settings = policy.policy();
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Raw {
            prefix: &plan.prefix,
            path,
            policy,
            operation: format!("raw.{}.{}.{callers}", path.name(), policy.name()),
            owner: (policy == PolicyName::Hardened).then_some(RAW_OWNER),
            lease_ms: millis(settings.lease),
            ttl_ms: millis(TTL),
            retention_ms: millis(settings.fence_retention),
        }
    }

    fn record_key(&self, key: &str) -> String {
        format!("{}{}:{key}", self.prefix, self.operation)
    }

    /// The replay path's one stored record.
    async fn store_replayed<C: ConnectionLike + Send>(
        &self,
        mut conn: C,
    ) -> Result<(), BenchError> {
        let record = record_json(&self.operation, REPLAY_KEY, "completed", self.owner);
        redis::cmd("SET")
            .arg(self.record_key(REPLAY_KEY))
            .arg(record)
            .arg("PX")
            .arg(self.ttl_ms)
            .query_async::<()>(&mut conn)
            .await
            .map_err(storage)
    }

    /// Call `n`: the reservation, checked as idem checks it, then (for a new key) the result.
    async fn call<C: ConnectionLike + Send>(&self, mut conn: C, n: u64) -> Result<(), BenchError> {
        let key = match self.path {
            CallPath::New => n.to_string(),
            CallPath::Replay => REPLAY_KEY.to_string(),
        };
        let record_key = self.record_key(&key);
        let taken = self.reserve(&mut conn, &key, &record_key).await?;
        match (self.path, taken) {
            (CallPath::Replay, true) => Ok(()),
            (CallPath::New, false) => self.complete(&mut conn, &key, &record_key).await,
            _ => Err(BenchError::Drift(
                Msg::new("bench.raw_unexpected")
                    .arg("key", record_key.as_str())
                    .arg("taken", taken.to_string()),
            )),
        }
    }

    /// Reserves the key; whether it was taken already.
    async fn reserve<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        key: &str,
        record_key: &str,
    ) -> Result<bool, BenchError> {
        let pending = record_json(&self.operation, key, "pending", self.owner);
        match self.policy {
            PolicyName::Compatible => {
                let previous: Option<Vec<u8>> = redis::cmd("SET")
                    .arg(record_key)
                    .arg(&pending)
                    .arg("NX")
                    .arg("GET")
                    .arg("PX")
                    .arg(self.lease_ms)
                    .query_async(conn)
                    .await
                    .map_err(storage)?;
                Ok(previous.is_some())
            }
            PolicyName::Hardened => {
                let fence_key = idem::key::fence_key(self.prefix, record_key);
                let reply: Value = RESERVE
                    .key(record_key)
                    .key(&fence_key)
                    .arg(&pending)
                    .arg(self.lease_ms)
                    .arg(self.lease_ms + self.retention_ms)
                    .invoke_async(conn)
                    .await
                    .map_err(storage)?;
                Ok(matches!(reply, Value::BulkString(_)))
            }
        }
    }

    /// Stores the result of a new key.
    async fn complete<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        key: &str,
        record_key: &str,
    ) -> Result<(), BenchError> {
        let record = record_json(&self.operation, key, "completed", self.owner);
        match self.policy {
            PolicyName::Compatible => redis::cmd("SET")
                .arg(record_key)
                .arg(&record)
                .arg("PX")
                .arg(self.ttl_ms)
                .query_async::<()>(conn)
                .await
                .map_err(storage),
            PolicyName::Hardened => {
                let fence_key = idem::key::fence_key(self.prefix, record_key);
                let stored: i64 = COMPLETE
                    .key(record_key)
                    .key(&fence_key)
                    .arg(RAW_OWNER)
                    .arg(&record)
                    .arg(self.ttl_ms)
                    .arg(self.ttl_ms + self.retention_ms)
                    .invoke_async(conn)
                    .await
                    .map_err(storage)?;
                if stored == 1 {
                    Ok(())
                } else {
                    Err(BenchError::Drift(
                        Msg::new("bench.raw_not_stored").arg("key", record_key),
                    ))
                }
            }
        }
    }
}

/// Redis failed during the bench: the environment, with what Redis said.
fn storage(error: impl std::fmt::Display) -> BenchError {
    BenchError::Environment(Msg::new("bench.redis_failed").arg("error", error.to_string()))
}

/// Runs the Python reference bench with the interpreter `python` (which has idempotency-kit
/// 0.4.1 installed) on the Redis at `url`, with the plan's calls and concurrency, and reads its
/// rows (one JSON object per line on stdout). Its calls are not told to `progress`, only that
/// it runs: it reports nothing until it has finished.
pub async fn python_rows(
    python: &Path,
    url: &str,
    plan: &Plan,
    progress: &dyn Progress,
) -> Result<Vec<Row>, BenchError> {
    progress.side("idempotency-kit");
    let (prefix, ops) = (plan.python_prefix(), plan.ops);
    let list: Vec<String> = plan.concurrency.iter().map(u32::to_string).collect();
    let failed = |error: String| {
        BenchError::Environment(Msg::new("bench.python_failed").arg("error", error))
    };
    let mut child = tokio::process::Command::new(python)
        .arg("-")
        .args(["--url", url, "--prefix", &prefix])
        .args([
            "--ops",
            &ops.to_string(),
            "--warm-up",
            &warm_up(ops).to_string(),
        ])
        .args(["--concurrency", &list.join(",")])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        // Ctrl-C drops this future: the Python bench stops with it.
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| failed(e.to_string()))?;
    if let Some(mut stdin) = child.stdin.take() {
        use tokio::io::AsyncWriteExt as _;
        stdin
            .write_all(PYTHON_BENCH.as_bytes())
            .await
            .map_err(|e| failed(e.to_string()))?;
        // Dropping stdin closes it: Python then runs what it read.
    }
    let output = child
        .wait_with_output()
        .await
        .map_err(|e| failed(e.to_string()))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        // Python's last line is the exception; a program that says nothing has its status.
        let last = stderr
            .lines()
            .rfind(|l| !l.trim().is_empty())
            .map_or_else(|| output.status.to_string(), str::to_string);
        return Err(failed(last));
    }
    let mut rows = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|e| failed(format!("{e}: {line}")))?;
        let number = |name: &str| value[name].as_f64().unwrap_or(0.0);
        rows.push(Row {
            bench: value["bench"]
                .as_str()
                .unwrap_or("idempotency-kit")
                .to_string(),
            path: value["path"].as_str().unwrap_or_default().to_string(),
            policy: value["policy"].as_str().unwrap_or_default().to_string(),
            concurrency: number("concurrency") as u32,
            ops: number("ops") as u64,
            ops_per_sec: tenth(number("ops_per_sec")),
            p50_us: tenth(number("p50_us")),
            p99_us: tenth(number("p99_us")),
            raw_ops_per_sec: tenth(number("raw_ops_per_sec")),
        });
    }
    Ok(rows)
}

/// `crates/idem/tests/python/bench.py`, built into the binary: an installed `lab` has no
/// checkout beside it. Python reads it from stdin (`python - ARGS`), so no file is written.
const PYTHON_BENCH: &str = include_str!("../../idem/tests/python/bench.py");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_serialises_its_fields_in_order_and_the_ratio_last() {
        let row = Row {
            bench: "idem".into(),
            path: "new".into(),
            policy: "compatible".into(),
            concurrency: 50,
            ops: 100,
            ops_per_sec: 900.0,
            p50_us: 1.5,
            p99_us: 9.0,
            raw_ops_per_sec: 1000.0,
        };
        assert_eq!(
            serde_json::to_string(&row).unwrap(),
            r#"{"bench":"idem","path":"new","policy":"compatible","concurrency":50,"ops":100,"ops_per_sec":900.0,"p50_us":1.5,"p99_us":9.0,"raw_ops_per_sec":1000.0,"ratio_to_raw":0.9}"#
        );
    }

    #[test]
    fn the_python_bench_writes_below_the_benchs_prefix() {
        let plan = Plan::new(10, &[1, 50]);
        assert!(plan.prefix.starts_with("lab:bench:"), "{}", plan.prefix);
        assert!(plan.python_prefix().starts_with(&plan.prefix));
        // 2 paths × 2 policies × 2 concurrencies, idem and raw, 10 calls after 1 of warm-up.
        assert_eq!(plan.calls(), 8 * 2 * 11);
    }
}
