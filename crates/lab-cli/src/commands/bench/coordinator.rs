//! `lab bench coordinator`: the `idem` coordinator on Redis, next to a bare Redis client that
//! sends exactly the round trips idem sends on that path, so the difference is idem's own work.
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
//! approach. `ratio_to_raw` = idem's ops/s ÷ raw's.
//!
//! Keys: everything (idem's records, their fence counters, raw's keys) lives under
//! `lab:bench:<8 hex>:`, and is deleted at the end by `SCAN MATCH` of that prefix on every
//! node; nothing else is read, written or flushed. With `--redis-url` of a cluster node the bench
//! runs on a cluster connection (idem's fence counters share their record's slot, see
//! `idem::key::fence_key`), and the cleanup scans every master.
//!
//! `--python PATH` runs `crates/idem/tests/python/bench.py` (idempotency-kit 0.4.1 and raw
//! redis-py) on the same Redis, under a prefix of its own below the bench's, and adds its rows.

use std::convert::Infallible;
use std::path::Path as FsPath;
use std::sync::LazyLock;
use std::time::Duration;

use anyhow::anyhow;
use idem::{Coordinator, Policy, Request, Source, Unprotected};
use indicatif::ProgressBar;
use lab_core::Msg;
use lab_infra::servers::RedisServer;
use lab_infra::{Needs, Origin, Servers};
use redis::aio::ConnectionLike;
use redis::{Script, Value};
use serde_json::json;

use super::{Sample, measure, print_table, progress, ratio_cell, tenth, warm_up};
use crate::exit::{self, Failure};
use crate::session::{Format, Session};
use crate::words::t;

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

/// One row of the output.
#[derive(Debug, Clone)]
struct Row {
    /// Who was measured: `idem`, or `idempotency-kit` (the Python reference, `--python`).
    bench: String,
    path: String,
    policy: String,
    concurrency: u32,
    ops: u64,
    ops_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    /// The bare client's ops/s on the same path and concurrency: redis-rs for idem's rows,
    /// redis-py (sending idempotency-kit's round trips) for the Python rows.
    raw_ops_per_sec: f64,
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
    fn ratio_to_raw(&self) -> f64 {
        if self.raw_ops_per_sec > 0.0 {
            self.ops_per_sec / self.raw_ops_per_sec
        } else {
            0.0
        }
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "bench": self.bench,
            "path": self.path,
            "policy": self.policy,
            "concurrency": self.concurrency,
            "ops": self.ops,
            "ops_per_sec": self.ops_per_sec,
            "p50_us": self.p50_us,
            "p99_us": self.p99_us,
            "raw_ops_per_sec": self.raw_ops_per_sec,
            "ratio_to_raw": self.ratio_to_raw(),
        })
    }
}

/// The Redis the bench talks to: one server, or a cluster (and the masters to clean up on).
enum Link {
    Single(redis::aio::MultiplexedConnection),
    Cluster {
        conn: redis::cluster_async::ClusterConnection,
        masters: Vec<String>,
    },
}

/// What every row shares.
struct Plan<'a> {
    prefix: &'a str,
    ops: u64,
    bar: &'a ProgressBar,
}

pub async fn run(
    session: Session,
    ops: u64,
    concurrency: &[u32],
    python: Option<&FsPath>,
) -> Result<u8, Failure> {
    if let Some(python) = python
        && !tokio::fs::try_exists(python).await.unwrap_or(false)
    {
        return Err(Failure::usage(t(
            Msg::new("bench.no_python").arg("path", python.display().to_string())
        )));
    }
    // Eight hex digits of a fresh UUID: never a glob character, so `SCAN MATCH prefix*` matches
    // exactly the bench's keys.
    let prefix = format!(
        "lab:bench:{}:",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    // Rows: 2 paths × 2 policies × each concurrency; each row times idem and raw, each after
    // its warm-up. (The Python rows, if any, run after the bar is full.)
    let rows = 2 * 2 * concurrency.len() as u64;
    let bar = progress(session.color(), rows * 2 * (ops + warm_up(ops)));
    bar.set_message("idem");
    let plan = Plan {
        prefix: &prefix,
        ops,
        bar: &bar,
    };
    let needs = Needs {
        postgres: false,
        redis: true,
    };
    let masters = parking_lot::Mutex::new(Vec::new());
    let (rows, about) = session
        .with_servers(
            needs,
            async |servers| {
                let redis = redis_of(servers)?;
                let rows = measure_rows(redis, &plan, concurrency, &masters).await?;
                let python = match python {
                    Some(python) => {
                        bar.set_message("idempotency-kit");
                        let python_prefix = format!("{prefix}py:");
                        python_rows(python, &redis.url, &python_prefix, ops, concurrency).await?
                    }
                    None => Vec::new(),
                };
                Ok([rows, python].concat())
            },
            async |servers, ended| {
                bar.finish_and_clear();
                // Whatever happened (an error, Ctrl-C), the bench's keys go.
                let redis = redis_of(servers)?;
                let nodes = masters.lock().clone();
                let deleted = delete_prefix(redis, &nodes, &prefix).await;
                let rows = ended.into_result()?;
                let about = About {
                    url: lab_infra::url::redact(&redis.url),
                    origin: redis.origin,
                    version: redis.version.clone(),
                    cluster: !masters.lock().is_empty(),
                    deleted: deleted.map_err(Failure::environment)?,
                };
                Ok((rows, about))
            },
        )
        .await?;
    if session.format() == Format::Json {
        for row in &rows {
            say!("{}", row.json());
        }
    } else {
        print_rows(&rows, &about, &prefix, ops, python.is_some());
    }
    Ok(exit::OK)
}

/// The Redis of the bench's servers.
fn redis_of(servers: &Servers) -> Result<&RedisServer, Failure> {
    servers.redis.as_ref().ok_or_else(|| {
        Failure::environment(anyhow!(t(
            Msg::new("bench.no_server").arg("server", "Redis")
        )))
    })
}

/// What the table's title and its last line say about the Redis measured on.
struct About {
    url: String,
    origin: Origin,
    version: String,
    cluster: bool,
    deleted: u64,
}

/// idem's rows and raw's, on a single Redis or a cluster (whose masters the cleanup scans).
async fn measure_rows(
    redis: &RedisServer,
    plan: &Plan<'_>,
    concurrency: &[u32],
    masters: &parking_lot::Mutex<Vec<String>>,
) -> Result<Vec<Row>, Failure> {
    match connect(redis).await? {
        Link::Single(conn) => all_rows(conn, plan, concurrency).await,
        Link::Cluster { conn, masters: m } => {
            *masters.lock() = m;
            all_rows(conn, plan, concurrency).await
        }
    }
}

/// The table for people.
fn print_rows(rows: &[Row], about: &About, prefix: &str, ops: u64, python: bool) {
    let origin = match about.origin {
        Origin::Given => t("bench.given"),
        Origin::Throwaway => t("bench.throwaway"),
    };
    let cluster = if about.cluster {
        format!(", {}", t("bench.cluster"))
    } else {
        String::new()
    };
    say!(
        "{}",
        t(Msg::new("bench.coordinator_title")
            .arg("url", about.url.as_str())
            .arg("origin", origin)
            .arg("version", about.version.as_str())
            .arg("ops", ops.to_string())
            .arg("warm", warm_up(ops).to_string())
            .arg("cluster", cluster))
    );
    say!();
    let header: Vec<String> = [
        "col_bench",
        "col_path",
        "col_policy",
        "col_concurrency",
        "col_ops_per_sec",
        "col_p50",
        "col_p99",
        "col_raw",
        "col_ratio",
    ]
    .iter()
    .map(|key| t(Msg::new(format!("bench.{key}"))))
    .collect();
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.bench.clone(),
                r.path.clone(),
                r.policy.clone(),
                r.concurrency.to_string(),
                format!("{:.0}", r.ops_per_sec),
                format!("{:.0}", r.p50_us),
                format!("{:.0}", r.p99_us),
                format!("{:.0}", r.raw_ops_per_sec),
                ratio_cell(r.ratio_to_raw()),
            ]
        })
        .collect();
    print_table(&header, &cells, 3);
    say!();
    say!("{}", t("bench.raw_means"));
    if python {
        say!("{}", t("bench.python_raw_means"));
    }
    say!(
        "{}",
        t(Msg::new("bench.cleaned")
            .arg("count", about.deleted.to_string())
            .arg("prefix", prefix))
    );
}

/// Connects the way the bench needs: a cluster connection when the server is a cluster node.
async fn connect(redis: &RedisServer) -> Result<Link, Failure> {
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
) -> Result<Vec<String>, Failure> {
    let slots: Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(conn)
        .await
        .map_err(storage)?;
    let base = url::Url::parse(url).map_err(|e| Failure::usage(e.to_string()))?;
    let mut masters = Vec::new();
    let Value::Array(ranges) = slots else {
        return Err(storage(anyhow!(
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

/// Deletes every key under `prefix` on the server, or on every master of a cluster. Returns how
/// many keys were deleted.
async fn delete_prefix(
    redis: &RedisServer,
    masters: &[String],
    prefix: &str,
) -> anyhow::Result<u64> {
    let mut nodes = Vec::new();
    if masters.is_empty() {
        nodes.push(redis.conn.clone());
    } else {
        for url in masters {
            let client = redis::Client::open(url.as_str())?;
            nodes.push(client.get_multiplexed_async_connection().await?);
        }
    }
    let mut deleted = 0;
    for mut conn in nodes {
        deleted += lab_infra::space::delete_under_prefix(&mut conn, prefix).await?;
    }
    Ok(deleted)
}

/// Every row: path × policy × concurrency, idem then raw.
async fn all_rows<C>(conn: C, plan: &Plan<'_>, concurrency: &[u32]) -> Result<Vec<Row>, Failure>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let mut rows = Vec::new();
    for path in [CallPath::New, CallPath::Replay] {
        for policy in [PolicyName::Compatible, PolicyName::Hardened] {
            for &callers in concurrency {
                let ours = idem_sample(conn.clone(), plan, path, policy, callers).await?;
                let raw = raw_sample(conn.clone(), plan, path, policy, callers).await?;
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
    plan: &Plan<'_>,
    path: CallPath,
    policy: PolicyName,
    callers: u32,
) -> Result<Sample, Failure>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let coordinator = Coordinator::new(conn, policy.policy()).with_prefix(plan.prefix);
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
    measure(plan.ops, warm, callers, plan.bar, call).await?;
    measure(0, plan.ops, callers, plan.bar, call).await
}

/// Checks a coordinated call's source against what the path must give.
fn expect_source(
    outcome: Result<idem::Coordinated<serde_json::Value>, idem::Error<Infallible>>,
    expected: Expect,
) -> Result<(), Failure> {
    let unexpected = |got: String| {
        Failure::new(
            exit::DRIFT,
            anyhow!(t(Msg::new("bench.unexpected")
                .arg("expected", format!("{expected:?}"))
                .arg("got", got))),
        )
    };
    match outcome {
        Ok(done) => match (&done.source, expected) {
            (Source::Ran, Expect::Ran) | (Source::Replayed, Expect::Replayed) => Ok(()),
            // The compatible policy fails open: a Redis that went away shows up here.
            (Source::Unprotected(Unprotected::Storage(error)), _) => {
                Err(storage(anyhow!("{error}")))
            }
            (other, _) => Err(unexpected(format!("{other:?}"))),
        },
        Err(idem::Error::Storage(error)) => Err(storage(anyhow!("{error}"))),
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
    plan: &Plan<'_>,
    path: CallPath,
    policy: PolicyName,
    callers: u32,
) -> Result<Sample, Failure>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let raw = Raw::new(plan, path, policy, callers);
    if path == CallPath::Replay {
        raw.store_replayed(conn.clone()).await?;
    }
    let call = |n: u64| raw.call(conn.clone(), n);
    let warm = warm_up(plan.ops);
    measure(plan.ops, warm, callers, plan.bar, call).await?;
    measure(0, plan.ops, callers, plan.bar, call).await
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
    fn new(plan: &Plan<'a>, path: CallPath, policy: PolicyName, callers: u32) -> Raw<'a> {
        let settings = policy.policy();
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Raw {
            prefix: plan.prefix,
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
    async fn store_replayed<C: ConnectionLike + Send>(&self, mut conn: C) -> Result<(), Failure> {
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
    async fn call<C: ConnectionLike + Send>(&self, mut conn: C, n: u64) -> Result<(), Failure> {
        let key = match self.path {
            CallPath::New => n.to_string(),
            CallPath::Replay => REPLAY_KEY.to_string(),
        };
        let record_key = self.record_key(&key);
        let taken = self.reserve(&mut conn, &key, &record_key).await?;
        match (self.path, taken) {
            (CallPath::Replay, true) => Ok(()),
            (CallPath::New, false) => self.complete(&mut conn, &key, &record_key).await,
            _ => Err(Failure::new(
                exit::DRIFT,
                anyhow!(t(Msg::new("bench.raw_unexpected")
                    .arg("key", record_key.as_str())
                    .arg("taken", taken.to_string()))),
            )),
        }
    }

    /// Reserves the key; whether it was taken already.
    async fn reserve<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        key: &str,
        record_key: &str,
    ) -> Result<bool, Failure> {
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
    ) -> Result<(), Failure> {
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
                    Err(Failure::new(
                        exit::DRIFT,
                        anyhow!(t(Msg::new("bench.raw_not_stored").arg("key", record_key))),
                    ))
                }
            }
        }
    }
}

/// Redis failed during the bench: the environment (exit 3), with what Redis said.
fn storage(error: impl Into<anyhow::Error>) -> Failure {
    let error = error.into();
    Failure::environment(anyhow!(t(
        Msg::new("bench.redis_failed").arg("error", error.to_string())
    )))
}

/// Runs the Python reference bench and reads its rows (one JSON object per line on stdout).
async fn python_rows(
    python: &FsPath,
    url: &str,
    prefix: &str,
    ops: u64,
    concurrency: &[u32],
) -> Result<Vec<Row>, Failure> {
    let list: Vec<String> = concurrency.iter().map(u32::to_string).collect();
    let failed = |error: String| {
        Failure::environment(anyhow!(t(
            Msg::new("bench.python_failed").arg("error", error)
        )))
    };
    let mut child = tokio::process::Command::new(python)
        .arg("-")
        .args(["--url", url, "--prefix", prefix])
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
const PYTHON_BENCH: &str = include_str!("../../../../idem/tests/python/bench.py");
