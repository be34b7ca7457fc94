//! The report-api bench: N requests over K Idempotency-Keys at concurrency C against the report
//! service, then the count of reports, which must be exactly K; and the same transaction sent
//! directly through sqlx, to see what HTTP, JSON and the service's handler cost on top of it.
//! [`run`] does all of it and returns a [`Report`]: one [`Side`] per way of sending, and the
//! JSON rows of `lab bench report-api --format json` ([`Report::rows`]).
//!
//! ```text
//! http   POST /reports {"task_id": k+1, "report_type": "bench"}, Idempotency-Key: <tag>-http-<k>
//!        (request i uses key k = i mod K): the first request of a key gets 201, every other 200
//! sqlx   BEGIN; INSERT … ON CONFLICT (idempotency_key) DO NOTHING RETURNING id;
//!        if no row: SELECT id, payload_hash … WHERE idempotency_key = $1; COMMIT
//!        (crates/lab-services/src/reports.rs, `create_report_to_the_end`), keys <tag>-sqlx-<k>
//! pgbench  (with --pgbench) the same four statements through `pgbench -M prepared`, C clients,
//!        on the same server and schema, keys <tag>-pgbench-<k> with k drawn at random (pgbench
//!        has no transaction counter): the database's own client, the ceiling of the other two
//! ```
//!
//! The embedded service is started as `lab run` starts it (a `Stage` on a run schema of a
//! throwaway PostgreSQL, or of `--database-url`), and the direct transaction runs on a pool of
//! the same kind and size as the service's (`LeanPool::beside` the run's pool), so both sides
//! have eight connections given back without a check after a commit. With a target
//! (`--target URL`) the requests go to a running service (`lab serve`'s, or any service with
//! this API), and the reports are counted through its `GET /reports`; the direct side then runs
//! on a schema of our own PostgreSQL, which is not the target's database, so compare the two
//! with that in mind.
//! Reports made on a target stay there (the API cannot delete them); their keys carry the
//! bench's tag.
//!
//! The http and sqlx sides take turns ([`ROUNDS`]), so that a machine whose speed drifts slows
//! both alike (pgbench runs after them, in one piece: see `take_turns`), and each row tells
//! the CPU a request cost its own process and the database (a throwaway server's processes,
//! read in `/proc`): on two cores that client, service and PostgreSQL share, that sum is what
//! bounds a side's rate, and docs/bench.md's profile of where the time goes is this table's two
//! columns.

//!
//! # Layout
//!
//! - [`run`], [`Load`], [`Report`], [`Side`], [`Row`]: what a caller gives and gets back.
//! - the turns: `take_turns` (every side, in [`ROUNDS`]), [`CpuUsed`] (what a side's requests
//!   cost the processes).
//! - the http side: `HttpClients` (a bare HTTP/1.1 connection per client), `Target`.
//! - the sqlx side: `directly` and `create_report`, the service's transaction without HTTP.
//! - the pgbench side: `Pgbench` and its script.
//! - counting: `count_in_database`, `count_through_api`.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper::header::HeaderValue;
use hyper_util::rt::TokioIo;
use lab_core::{Checkpoints, Msg};
use lab_infra::pool::LeanPool;
use lab_infra::{RunSpace, Servers};
use lab_services::reports::{self, CreateReport};
use lab_services::stage::{self, Ports, Stage, StageConfig};
use serde::Serialize;
use sqlx::Connection as _;
use sqlx::PgPool;
use tokio_util::task::TaskTracker;

use crate::{BenchError, Progress, Sample, measure, tenth};

/// How much load: requests in all, the keys they spread over, concurrent clients.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    pub requests: u64,
    pub keys: u64,
    pub concurrency: u32,
}

impl Load {
    /// Every request [`run`] tells its progress of, on `sides` sides (2, or 3 with pgbench): a
    /// progress bar's length.
    pub fn calls(&self, sides: u64) -> u64 {
        sides * self.requests
    }
}

/// Runs the bench on `servers` (PostgreSQL is needed): a run schema of its own, the embedded
/// report service on it (or `target`, a running service's `http://` URL without a trailing
/// slash, which the caller has checked), and the sides in turns, each side's reports counted at
/// the end; the schema is dropped however they end. `pgbench`: the program, for a third side.
///
/// `progress` hears of every request and of each side as it starts; it is shared (an `Arc`)
/// because the http side's connections run in tasks of their own.
pub async fn run(
    servers: &Servers,
    load: Load,
    target: Option<&str>,
    pgbench: Option<&Path>,
    progress: Arc<dyn Progress>,
) -> Result<Report, BenchError> {
    let space = RunSpace::create(servers, &stage::schemas(&[&reports::SPEC])).await?;
    let tasks = TaskTracker::new();
    let sides = take_turns(servers, &space, &tasks, load, target, pgbench, &progress).await;
    tasks.close();
    tasks.wait().await;
    let _ = space.release(servers, false).await;
    let (http, sqlx, pgbench) = sides?;
    Ok(Report {
        load,
        target: target.map(str::to_string),
        http,
        sqlx,
        pgbench,
    })
}

/// What [`run`] measured.
#[derive(Debug, Clone)]
pub struct Report {
    pub load: Load,
    /// The service's URL when it was not the embedded one.
    pub target: Option<String>,
    pub http: Side,
    pub sqlx: Side,
    /// With a pgbench program only.
    pub pgbench: Option<Side>,
}

impl Report {
    /// The sides in the order they are shown: http, sqlx, pgbench.
    pub fn sides(&self) -> impl Iterator<Item = &Side> {
        [&self.http, &self.sqlx].into_iter().chain(&self.pgbench)
    }

    /// The service the requests went to, as the rows name it: its URL, or `embedded`.
    pub fn target_shown(&self) -> &str {
        self.target.as_deref().unwrap_or("embedded")
    }

    /// Exactly K reports on the http and the sqlx side, or the protection failed. A target whose
    /// reports cannot be counted does not fail it (it is said so); pgbench draws its keys at
    /// random, so it may not reach every one of them.
    pub fn exact(&self) -> bool {
        [&self.http, &self.sqlx]
            .iter()
            .all(|s| s.reports.is_none_or(|n| n == self.load.keys))
    }

    /// One row per side, as `--format json` prints them.
    pub fn rows(&self) -> Vec<Row> {
        let direct_rate = self.sqlx.sample.ops_per_sec();
        let pgbench_rate = self.pgbench.as_ref().map(|s| tenth(s.sample.ops_per_sec()));
        self.sides()
            .map(|side| {
                let ops_per_sec = tenth(side.sample.ops_per_sec());
                Row {
                    bench: "report-api",
                    via: side.via,
                    target: self.target_shown().to_string(),
                    requests: self.load.requests,
                    keys: self.load.keys,
                    concurrency: self.load.concurrency,
                    requests_per_sec: ops_per_sec,
                    p50_us: tenth(side.sample.percentile_us(50.0)),
                    p99_us: tenth(side.sample.percentile_us(99.0)),
                    created: side.created,
                    replayed: side.replayed,
                    reports: side.reports,
                    expected_reports: self.load.keys,
                    ratio_to_sqlx: ops_per_sec / tenth(direct_rate).max(f64::MIN_POSITIVE),
                    ratio_to_pgbench: pgbench_rate.map(|p| ops_per_sec / p.max(f64::MIN_POSITIVE)),
                    cpu_own_us: tenth(side.per_request_us(side.cpu.own)),
                    cpu_postgres_us: side.cpu.database.map(|cpu| tenth(side.per_request_us(cpu))),
                    rounds: ROUNDS,
                }
            })
            .collect()
    }
}

/// One side's row of `lab bench report-api --format json`: rates and latencies rounded to a
/// tenth ([`tenth`]), the ratios computed from the rounded rates, CPU per request in
/// microseconds. Serialised with its fields in this order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// Always `report-api`.
    pub bench: &'static str,
    pub via: Via,
    /// The service's URL, or `embedded`.
    pub target: String,
    pub requests: u64,
    pub keys: u64,
    pub concurrency: u32,
    pub requests_per_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Answers 201 (a new key), or 200 (a replay); for pgbench, the keys it reached and the rest.
    pub created: u64,
    pub replayed: u64,
    /// `None` (`null`) when the target's reports cannot be counted.
    pub reports: Option<u64>,
    pub expected_reports: u64,
    pub ratio_to_sqlx: f64,
    /// With pgbench only.
    pub ratio_to_pgbench: Option<f64>,
    pub cpu_own_us: f64,
    /// `None` for a server given by URL, whose processes are not ours to read.
    pub cpu_postgres_us: Option<f64>,
    pub rounds: u64,
}

/// How a side sends its requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Via {
    /// `POST /reports` to the service.
    Http,
    /// The service's transaction, sent directly.
    Sqlx,
    /// The same statements through `pgbench -M prepared`.
    Pgbench,
}

impl Via {
    /// Its name in the table, the JSON rows and the progress bar.
    pub fn name(self) -> &'static str {
        match self {
            Via::Http => "http",
            Via::Sqlx => "sqlx",
            Via::Pgbench => "pgbench",
        }
    }
}

/// The report type of every bench request: the payload hash of key k is then fixed by k alone,
/// so a replay is always "same key, same payload" (200), never a 409.
const REPORT_TYPE: &str = "bench";

/// One side of the comparison, added up over its rounds.
#[derive(Debug, Clone)]
pub struct Side {
    pub via: Via,
    /// Every request of the side, unrounded.
    pub sample: Sample,
    /// Requests that made a report (201), and that replayed one (200).
    pub created: u64,
    pub replayed: u64,
    /// Reports with this side's keys afterwards; `None` when they cannot be counted.
    pub reports: Option<u64>,
    /// CPU used while the side ran: [`CpuUsed`], summed over the rounds.
    pub cpu: CpuUsed,
}

/// What one round of a side did.
struct Round {
    sample: Sample,
    created: u64,
    replayed: u64,
}

impl Side {
    fn new(via: Via) -> Side {
        Side {
            via,
            sample: Sample::default(),
            created: 0,
            replayed: 0,
            reports: None,
            cpu: CpuUsed {
                own: Duration::ZERO,
                database: Some(Duration::ZERO),
            },
        }
    }

    fn add(&mut self, round: Round, cpu: CpuUsed) {
        self.sample.absorb(round.sample);
        self.created += round.created;
        self.replayed += round.replayed;
        self.cpu.own += cpu.own;
        self.cpu.database = self.cpu.database.zip(cpu.database).map(|(a, b)| a + b);
    }

    /// Microseconds of `cpu` per request of this side.
    pub fn per_request_us(&self, cpu: Duration) -> f64 {
        cpu.as_secs_f64() * 1e6 / (self.sample.ops.max(1) as f64)
    }
}

/// The CPU a side's round used: its own process's (the lab's for the http side, with the
/// embedded service in it, and for the sqlx side; pgbench's for pgbench) and the database's (a
/// throwaway server's processes; `None` for a server given by URL, whose processes are not ours
/// to read). The profile of where a request's time goes, in every run: on two cores that the
/// client, the service and PostgreSQL share, each side's rate is bounded by the sum.
#[derive(Debug, Clone, Copy)]
pub struct CpuUsed {
    pub own: Duration,
    pub database: Option<Duration>,
}

/// The readings a [`CpuUsed`] is the difference of.
struct CpuClock<'s> {
    database: Option<&'s lab_infra::servers::PgServer>,
    own: Duration,
    database_then: Option<Duration>,
}

impl<'s> CpuClock<'s> {
    fn start(database: Option<&'s lab_infra::servers::PgServer>) -> CpuClock<'s> {
        CpuClock {
            database,
            own: own_cpu_time(),
            database_then: database.and_then(|pg| pg.cpu_time()),
        }
    }

    fn stop(self) -> CpuUsed {
        let database_now = self.database.and_then(|pg| pg.cpu_time());
        CpuUsed {
            own: own_cpu_time().saturating_sub(self.own),
            database: database_now
                .zip(self.database_then)
                .map(|(now, then)| now.saturating_sub(then)),
        }
    }
}

/// User and system time of this process and of the children it has waited for (pgbench, once
/// it has ended).
fn own_cpu_time() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    let of = |who| {
        getrusage(who).map_or(Duration::ZERO, |usage| {
            let time = |tv: nix::sys::time::TimeVal| {
                Duration::from_secs(u64::try_from(tv.tv_sec()).unwrap_or(0))
                    + Duration::from_micros(u64::try_from(tv.tv_usec()).unwrap_or(0))
            };
            time(usage.user_time()) + time(usage.system_time())
        })
    };
    of(UsageWho::RUSAGE_SELF) + of(UsageWho::RUSAGE_CHILDREN)
}

/// The sides take turns: each sends a third of its requests, then the next side does, three
/// times over. On a machine whose speed drifts during the bench (a VM beside busy neighbours:
/// this one's rate moved by a third from one run to the next) every side then meets the same
/// slow and fast stretches, and the ratios between them keep their meaning.
pub const ROUNDS: u64 = 3;

/// The requests of round `round`: `first..first + count`.
fn round_of(round: u64, requests: u64) -> (u64, u64) {
    let first = requests * round / ROUNDS;
    let next = requests * (round + 1) / ROUNDS;
    (first, next - first)
}

/// HTTP (the embedded service, or the target) and the same transaction directly, in turns
/// ([`ROUNDS`]), then pgbench; each side's reports counted at the end.
async fn take_turns(
    servers: &Servers,
    space: &RunSpace,
    tasks: &TaskTracker,
    load: Load,
    target: Option<&str>,
    pgbench: Option<&Path>,
    progress: &Arc<dyn Progress>,
) -> Result<(Side, Side, Option<Side>), BenchError> {
    let tag = format!("bench-{}", space.run_id);
    let pool = space.pg.clone().ok_or_else(|| {
        BenchError::Environment(Msg::new("bench.no_server").arg("server", "PostgreSQL"))
    })?;
    let pgbench = match pgbench {
        Some(program) => {
            let url = servers
                .postgres
                .as_ref()
                .map(|pg| pg.target.guest_url(&space.schema))
                .transpose()?
                .unwrap_or_default();
            Some(Pgbench::prepare(program, url, &tag, load)?)
        }
        None => None,
    };
    // The embedded service, started as a scenario run starts it: silent, no faults.
    let (url, stage) = match target {
        Some(url) => (url.to_string(), None),
        None => {
            let stage = embedded_service(space, tasks).await?;
            let url = stage
                .get(&reports::SPEC)
                .map(|handle| handle.url.clone())
                .ok_or_else(|| {
                    BenchError::Environment(Msg::new("bench.cannot_start").arg("error", "-"))
                })?;
            (url, Some(stage))
        }
    };
    // The database's CPU is read only where it is the database that every side uses: a
    // throwaway server of ours, and for the http side only when the service is ours too.
    let database = servers
        .postgres
        .as_ref()
        .filter(|pg| pg.cpu_time().is_some());
    let http_database = database.filter(|_| target.is_none());
    // The same kind of pool as the service's, of the same size, on the same database.
    let direct_pool = LeanPool::beside(&pool);
    let turns = async {
        let mut clients = HttpClients::connect(&url, load.concurrency).await?;
        let mut http = Side::new(Via::Http);
        let mut direct = Side::new(Via::Sqlx);
        let mut through_pgbench = pgbench.as_ref().map(|_| Side::new(Via::Pgbench));
        for round in 0..ROUNDS {
            let (first, count) = round_of(round, load.requests);
            progress.side(Via::Http.name());
            let clock = CpuClock::start(http_database);
            let done = clients
                .send(&tag, load.keys, first, count, progress)
                .await?;
            http.add(done, clock.stop());
            progress.side(Via::Sqlx.name());
            let clock = CpuClock::start(database);
            let done = directly(&direct_pool, &tag, load, first, count, &**progress).await?;
            direct.add(done, clock.stop());
        }
        // pgbench in one piece, after the turns: each run of it opens its C connections anew,
        // and a new backend's first transactions (its caches filling) are dear. Split into the
        // rounds, pgbench at 50 clients lost a third of its rate to that, which is not the
        // database's limit. Its C clients send ⌈N / C⌉ transactions each.
        if let (Some(pgbench), Some(side)) = (&pgbench, &mut through_pgbench) {
            progress.side(Via::Pgbench.name());
            let per_client = load.requests.div_ceil(u64::from(load.concurrency.max(1)));
            let clock = CpuClock::start(database);
            let done = pgbench.run(per_client).await?;
            progress.advance(load.requests);
            side.add(done, clock.stop());
        }
        Ok::<_, BenchError>((http, direct, through_pgbench))
    }
    .await;
    direct_pool.close().await;
    if let Some(stage) = stage {
        stage.stop().await;
    }
    let (mut http, mut direct, through_pgbench) = turns?;
    http.reports = match target {
        None => Some(count_in_database(&pool, &format!("{tag}-http-")).await?),
        Some(url) => count_through_api(url, &format!("{tag}-http-")).await,
    };
    direct.reports = Some(count_in_database(&pool, &format!("{tag}-sqlx-")).await?);
    let through_pgbench = match through_pgbench {
        Some(mut side) => {
            // pgbench draws its keys at random: its reports are the keys it reached.
            let reached = count_in_database(&pool, &format!("{tag}-pgbench-")).await?;
            side.created = reached;
            side.replayed = side.sample.ops.saturating_sub(reached);
            side.reports = Some(reached);
            Some(side)
        }
        None => None,
    };
    Ok((http, direct, through_pgbench))
}

/// The report service, started as a scenario run starts it, on the bench's space.
async fn embedded_service(space: &RunSpace, tasks: &TaskTracker) -> Result<Stage, BenchError> {
    let config = StageConfig {
        space,
        narrator: None,
        checkpoints: Checkpoints::new(),
        tasks: tasks.clone(),
        faults: None,
        hops: &[],
    };
    Stage::start(&[&reports::SPEC], &config, Ports::Free)
        .await
        .map_err(|e| {
            BenchError::Environment(Msg::new("bench.cannot_start").arg("error", e.to_string()))
        })
}

/// The request for call `n`: key `n mod K`, and a payload fixed by the key.
fn request_of(n: u64, keys: u64) -> (u64, CreateReport) {
    let k = n % keys;
    let body = CreateReport {
        task_id: i64::try_from(k + 1).unwrap_or(i64::MAX),
        report_type: REPORT_TYPE.to_string(),
    };
    (k, body)
}

/// `POST /reports` over one HTTP/1.1 connection per concurrent client, kept alive between its
/// requests and across the rounds, as wrk keeps its connections: hyper's client connection with
/// nothing around it (no pool, no redirects, no URL parsed per request). Client, service and
/// database share the machine's cores, so every microsecond the load generator spends is taken
/// from the other two; reqwest, used here before, cost 18 µs more of user CPU per request (see
/// the benchmarks in docs/bench.md).
///
/// Each connection is one task that drives hyper's connection and sends its own requests, as
/// wrk's event loop does: an answer wakes that one task. With the connection driven in a task of
/// its own and the callers in another, every request crossed between tasks (and often threads)
/// three times: the request to the driver, the answer's head and its body back.
struct HttpClients {
    target: Arc<Target>,
    /// Idle between the rounds; each round lends every connection to a task of its own.
    connections: Vec<ClientConnection>,
}

/// One connection: hyper's handle for sending, and the future that does its reading and writing.
struct ClientConnection {
    sender: Sender,
    driver: Pin<Box<Driver>>,
}

type Driver = hyper::client::conn::http1::Connection<TokioIo<tokio::net::TcpStream>, Full<Bytes>>;

/// What the connections of one round share: the requests still to send, and what came back.
struct Work {
    tag: String,
    keys: u64,
    first: u64,
    count: u64,
    next: AtomicU64,
    created: AtomicU64,
    replayed: AtomicU64,
    progress: Arc<dyn Progress>,
}

impl HttpClients {
    async fn connect(url: &str, concurrency: u32) -> Result<HttpClients, BenchError> {
        let target = Target::of(url)?;
        let mut connections = Vec::new();
        for _ in 0..concurrency.max(1) {
            connections.push(target.connect().await?);
        }
        Ok(HttpClients {
            target: Arc::new(target),
            connections,
        })
    }

    /// Requests `first..first + count`, each connection taking the next one as it is free.
    async fn send(
        &mut self,
        tag: &str,
        keys: u64,
        first: u64,
        count: u64,
        progress: &Arc<dyn Progress>,
    ) -> Result<Round, BenchError> {
        let work = Arc::new(Work {
            tag: tag.to_string(),
            keys,
            first,
            count,
            next: AtomicU64::new(0),
            created: AtomicU64::new(0),
            replayed: AtomicU64::new(0),
            progress: progress.clone(),
        });
        let started = std::time::Instant::now();
        let mut running = tokio::task::JoinSet::new();
        for connection in self.connections.drain(..) {
            running.spawn(connection.send_its_share(self.target.clone(), work.clone()));
        }
        let mut latencies = Vec::with_capacity(usize::try_from(count).unwrap_or(0));
        let mut failure = None;
        while let Some(joined) = running.join_next().await {
            let (connection, sent) = joined.map_err(task_failed)?;
            self.connections.push(connection);
            match sent {
                Ok(sent) => latencies.extend(sent),
                // The first failure is the one to tell; the others are its consequences.
                Err(e) => {
                    failure.get_or_insert(e);
                }
            }
        }
        let elapsed = started.elapsed();
        if let Some(failure) = failure {
            return Err(failure);
        }
        Ok(Round {
            sample: Sample::new(elapsed, latencies),
            created: work.created.load(Ordering::Relaxed),
            replayed: work.replayed.load(Ordering::Relaxed),
        })
    }
}

impl ClientConnection {
    /// Sends requests of `work` until none is left, driving the connection meanwhile; gives the
    /// connection back (for the next round) with the latencies of its requests.
    async fn send_its_share(
        mut self,
        target: Arc<Target>,
        work: Arc<Work>,
    ) -> (ClientConnection, Result<Vec<Duration>, BenchError>) {
        let ClientConnection { sender, driver } = &mut self;
        let requests = async {
            let mut latencies = Vec::new();
            loop {
                let n = work.next.fetch_add(1, Ordering::Relaxed);
                if n >= work.count {
                    return Ok(latencies);
                }
                let started = std::time::Instant::now();
                let (k, body) = request_of(work.first + n, work.keys);
                let request = target.post(&format!("{}-http-{k}", work.tag), &body);
                // A generous bound: a loaded machine is slow, not broken.
                let answer = tokio::time::timeout(REQUEST_TIMEOUT, async {
                    // Ready once the connection has finished the answer before.
                    sender.ready().await?;
                    let response = sender.send_request(request).await?;
                    let status = response.status().as_u16();
                    // The whole body is read, so that the connection can carry the next request.
                    let body = response.into_body().collect().await?.to_bytes();
                    Ok::<_, hyper::Error>((status, body))
                })
                .await;
                let (status, body) = match answer {
                    Ok(Ok(answer)) => answer,
                    Ok(Err(e)) => return Err(service_failed(e)),
                    Err(_) => {
                        return Err(service_failed(format!("no answer in {REQUEST_TIMEOUT:?}")));
                    }
                };
                match status {
                    201 => work.created.fetch_add(1, Ordering::Relaxed),
                    200 => work.replayed.fetch_add(1, Ordering::Relaxed),
                    status => {
                        return Err(BenchError::Drift(
                            Msg::new("bench.unexpected_status")
                                .arg("status", status.to_string())
                                .arg("body", String::from_utf8_lossy(&body).into_owned()),
                        ));
                    }
                };
                latencies.push(started.elapsed());
                work.progress.advance(1);
            }
        };
        // The driver ends only when the connection does: before the requests are done, that is
        // the service closing it (or failing), and the round fails.
        let sent = tokio::select! {
            sent = requests => sent,
            ended = driver.as_mut() => Err(service_failed(match ended {
                Ok(()) => "the service closed the connection".to_string(),
                Err(e) => e.to_string(),
            })),
        };
        if sent.is_err() {
            // The round has failed: the other connections take no further requests.
            work.next.fetch_max(work.count, Ordering::Relaxed);
        }
        (self, sent)
    }
}

/// How long one request may take before the bench gives up on the service.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A task of the bench's that panicked or was cancelled.
fn task_failed(error: tokio::task::JoinError) -> BenchError {
    BenchError::Environment(Msg::new("bench.task_failed").arg("error", error.to_string()))
}

/// The service failed, or cannot be reached.
fn service_failed(error: impl std::fmt::Display) -> BenchError {
    BenchError::Environment(Msg::new("bench.service_failed").arg("error", error.to_string()))
}

/// Where `POST /reports` goes: the address to connect to, the `Host` header, the path.
struct Target {
    address: String,
    host: HeaderValue,
    path: String,
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

impl Target {
    /// The target of an http URL: the caller's (which it has refused unless it is one, as
    /// `lab bench`'s `check_target` does) or the embedded service's.
    fn of(url: &str) -> Result<Target, BenchError> {
        let parsed = url::Url::parse(url).map_err(service_failed)?;
        let host = parsed.host_str().unwrap_or_default();
        let port = parsed.port_or_known_default().unwrap_or(80);
        let address = format!("{host}:{port}");
        Ok(Target {
            host: HeaderValue::from_str(&address).map_err(service_failed)?,
            address,
            path: format!("{}/reports", parsed.path().trim_end_matches('/')),
        })
    }

    /// A new connection; its driver runs in the task that sends on it.
    async fn connect(&self) -> Result<ClientConnection, BenchError> {
        let stream = tokio::net::TcpStream::connect(&self.address)
            .await
            .map_err(service_failed)?;
        // Small requests and answers: no waiting to fill a segment (reqwest and wrk do the same).
        stream.set_nodelay(true).map_err(service_failed)?;
        let (sender, driver) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(service_failed)?;
        Ok(ClientConnection {
            sender,
            driver: Box::pin(driver),
        })
    }

    /// `POST /reports` with `key` and the JSON of `body`.
    fn post(&self, key: &str, body: &CreateReport) -> hyper::Request<Full<Bytes>> {
        let json = serde_json::to_vec(body).expect("a report request serialises");
        hyper::Request::post(self.path.as_str())
            .header(hyper::header::HOST, self.host.clone())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header("idempotency-key", key)
            .body(Full::new(Bytes::from(json)))
            .expect("a valid request")
    }
}

/// The service's transaction, sent directly: what a request costs without HTTP around it.
/// Requests `first..first + count`.
async fn directly(
    pool: &LeanPool,
    tag: &str,
    load: Load,
    first: u64,
    count: u64,
    progress: &dyn Progress,
) -> Result<Round, BenchError> {
    let created = AtomicU64::new(0);
    let replayed = AtomicU64::new(0);
    let sample = measure(first, count, load.concurrency, progress, |n| {
        let (k, body) = request_of(n, load.keys);
        let key = format!("{tag}-sqlx-{k}");
        let (created, replayed) = (&created, &replayed);
        // In a task of its own, as the service runs each request's transaction
        // (`tasks.spawn(create_report_to_the_end(…))`): otherwise the C transactions would share
        // this one task's thread, while the service's spread over the runtime's threads.
        let transaction = tokio::spawn(create_report(pool.clone(), key, body));
        async move {
            let inserted = transaction.await.map_err(task_failed)??;
            if inserted {
                created.fetch_add(1, Ordering::Relaxed);
            } else {
                replayed.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), BenchError>(())
        }
    })
    .await?;
    Ok(Round {
        sample,
        created: created.into_inner(),
        replayed: replayed.into_inner(),
    })
}

/// `create_report_to_the_end`'s transaction (reports.rs), without the service around it.
/// Returns whether this call inserted the report.
async fn create_report(
    pool: LeanPool,
    key: String,
    req: CreateReport,
) -> Result<bool, sqlx::Error> {
    let (key, req) = (key.as_str(), &req);
    let hash = reports::payload_hash(req);
    let mut conn = pool.acquire().await?;
    let mut tx = conn.begin().await?;
    let inserted: Option<i64> = sqlx::query_scalar(lab_services::reports::INSERT_KEYED)
        .bind(req.task_id)
        .bind(&req.report_type)
        .bind(key)
        .bind(&hash)
        .fetch_optional(&mut *tx)
        .await?;
    if inserted.is_some() {
        tx.commit().await?;
        conn.release();
        return Ok(true);
    }
    let (_id, stored_hash): (i64, String) = sqlx::query_as(lab_services::reports::SELECT_BY_KEY)
        .bind(key)
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    conn.release();
    if stored_hash != hash {
        return Err(sqlx::Error::Protocol(format!(
            "key {key} was stored with another payload"
        )));
    }
    Ok(false)
}

/// Reports whose key starts with `prefix`, read from the run's schema.
async fn count_in_database(pool: &PgPool, prefix: &str) -> Result<u64, BenchError> {
    let count: i64 =
        sqlx::query_scalar("SELECT count(*) FROM reports WHERE starts_with(idempotency_key, $1)")
            .bind(prefix)
            .fetch_one(pool)
            .await?;
    Ok(u64::try_from(count).unwrap_or(0))
}

/// Reports whose key starts with `prefix`, through the service's `GET /reports`; `None` when the
/// service does not answer it as the report service does.
async fn count_through_api(url: &str, prefix: &str) -> Option<u64> {
    let listing: serde_json::Value = reqwest::get(format!("{url}/reports"))
        .await
        .ok()?
        .error_for_status()
        .ok()?
        .json()
        .await
        .ok()?;
    let rows = listing.get("reports")?.as_array()?;
    Some(
        rows.iter()
            .filter(|row| {
                row["idempotency_key"]
                    .as_str()
                    .is_some_and(|key| key.starts_with(prefix))
            })
            .count() as u64,
    )
}

/// The pgbench script of the service's transaction: the same four statements (BEGIN, the keyed
/// INSERT, the SELECT of the stored report, COMMIT), with key `<tag>-pgbench-<k>` for a `k`
/// drawn from `0..keys`. The SELECT runs every time: a script cannot skip it when the INSERT
/// returned a row, and the service sends it only then; this makes pgbench's side, if anything,
/// the slower.
fn pgbench_script(tag: &str, keys: u64) -> String {
    let key = format!("'{tag}-pgbench-' || :k");
    let one_line = |sql: &str| sql.split_whitespace().collect::<Vec<_>>().join(" ");
    let insert = one_line(reports::INSERT_KEYED)
        .replace("$1", ":k + 1")
        .replace("$2", &format!("'{REPORT_TYPE}'"))
        .replace("$3", &key)
        .replace("$4", "'pgbench'");
    let select = one_line(reports::SELECT_BY_KEY).replace("$1", &key);
    format!(
        "\\set k random(0, {last})\nBEGIN;\n{insert};\n{select};\nCOMMIT;\n",
        last = keys.saturating_sub(1)
    )
}

/// The same statements through `pgbench -M prepared` (C clients, two threads as this machine
/// has two cores), on the same schema of the same server; its per-transaction log gives the
/// latencies, and its own `tps` (without the connections' set-up) the rate.
struct Pgbench {
    program: PathBuf,
    url: String,
    concurrency: u32,
    /// The script, and the per-transaction logs of the run going on.
    scratch: tempfile::TempDir,
}

impl Pgbench {
    fn prepare(program: &Path, url: String, tag: &str, load: Load) -> Result<Pgbench, BenchError> {
        let scratch = tempfile::tempdir()?;
        std::fs::write(scratch.path().join(SCRIPT), pgbench_script(tag, load.keys))?;
        Ok(Pgbench {
            program: program.to_path_buf(),
            url,
            concurrency: load.concurrency,
            scratch,
        })
    }

    /// `per_client` transactions from each of the C clients.
    async fn run(&self, per_client: u64) -> Result<Round, BenchError> {
        let clients = u64::from(self.concurrency.max(1));
        let threads = self.concurrency.clamp(1, 2);
        let out = tokio::process::Command::new(&self.program)
            .args(["--no-vacuum", "--protocol=prepared", "--log"])
            .arg(format!(
                "--log-prefix={}",
                self.scratch.path().join(LOG_PREFIX).display()
            ))
            .arg(format!("--client={clients}"))
            .arg(format!("--jobs={threads}"))
            .arg(format!("--transactions={per_client}"))
            .arg(format!(
                "--file={}",
                self.scratch.path().join(SCRIPT).display()
            ))
            .arg(&self.url)
            .kill_on_drop(true)
            .output()
            .await?;
        let said = String::from_utf8_lossy(&out.stdout).to_string();
        if !out.status.success() {
            let why = String::from_utf8_lossy(&out.stderr).to_string();
            return Err(BenchError::Environment(
                Msg::new("bench.pgbench_failed").arg("error", lab_infra::url::redact(why.trim())),
            ));
        }
        let tps: f64 = said
            .lines()
            .find_map(|l| l.strip_prefix("tps = "))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .ok_or_else(|| {
                BenchError::Environment(
                    Msg::new("bench.pgbench_failed").arg("error", "no tps in its output"),
                )
            })?;
        // Each log line: client, transaction, its time in microseconds, script, when it ended.
        // Each log is removed once read, so the next round reads its own.
        let mut latencies = Vec::new();
        for entry in std::fs::read_dir(self.scratch.path())? {
            let path = entry?.path();
            if !path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(LOG_PREFIX))
            {
                continue;
            }
            let text = std::fs::read_to_string(&path)?;
            latencies.extend(text.lines().filter_map(|line| {
                let micros: u64 = line.split_whitespace().nth(2)?.parse().ok()?;
                Some(Duration::from_micros(micros))
            }));
            std::fs::remove_file(&path)?;
        }
        let ops = latencies.len() as u64;
        Ok(Round {
            sample: Sample::new(
                Duration::from_secs_f64(ops as f64 / tps.max(f64::MIN_POSITIVE)),
                latencies,
            ),
            // Counted once, at the end: pgbench's keys are drawn at random.
            created: 0,
            replayed: 0,
        })
    }
}

/// The pgbench script's file, and the start of its per-transaction logs' names.
const SCRIPT: &str = "report.sql";
const LOG_PREFIX: &str = "tx";

#[cfg(test)]
mod tests {
    use super::*;

    /// A side of `ops` calls of 1 ms each, at `per_sec` calls a second, with its reports.
    fn side(via: Via, ops: u64, per_sec: u64, reports: Option<u64>) -> Side {
        let elapsed = Duration::from_secs_f64(ops as f64 / per_sec as f64);
        Side {
            via,
            sample: Sample::new(elapsed, vec![Duration::from_millis(1); ops as usize]),
            created: 10,
            replayed: ops - 10,
            reports,
            cpu: CpuUsed {
                own: Duration::from_millis(ops),
                database: None,
            },
        }
    }

    #[test]
    fn rows_compare_every_side_with_sqlx_and_pgbench() {
        let report = Report {
            load: Load {
                requests: 100,
                keys: 10,
                concurrency: 4,
            },
            target: None,
            http: side(Via::Http, 100, 500, Some(10)),
            sqlx: side(Via::Sqlx, 100, 1000, Some(10)),
            pgbench: Some(side(Via::Pgbench, 100, 2000, Some(7))),
        };
        // pgbench's keys are drawn at random: 7 of 10 reached is not a failed protection.
        assert!(report.exact());
        let rows = report.rows();
        let vias: Vec<&str> = rows.iter().map(|r| r.via.name()).collect();
        assert_eq!(vias, ["http", "sqlx", "pgbench"]);
        assert_eq!(rows[0].ratio_to_sqlx, 0.5);
        assert_eq!(rows[0].ratio_to_pgbench, Some(0.25));
        assert_eq!(rows[0].cpu_own_us, 1000.0);
        assert_eq!(rows[0].cpu_postgres_us, None);
        let json = serde_json::to_value(&rows[0]).unwrap();
        assert_eq!(json["via"], "http");
        assert_eq!(json["target"], "embedded");
        assert_eq!(json["rounds"], 3);

        let short = Report {
            http: side(Via::Http, 100, 500, Some(11)),
            ..report
        };
        assert!(!short.exact());
    }

    #[test]
    fn the_pgbench_script_sends_the_services_statements() {
        let script = pgbench_script("bench-1", 20);
        assert!(script.starts_with("\\set k random(0, 19)\n"), "{script}");
        assert!(
            script.contains("ON CONFLICT (idempotency_key) DO NOTHING RETURNING id"),
            "{script}"
        );
        assert!(
            script.contains("VALUES (:k + 1, 'bench', 'bench-1-pgbench-' || :k, 'pgbench')"),
            "{script}"
        );
        assert!(
            script.contains("WHERE idempotency_key = 'bench-1-pgbench-' || :k;"),
            "{script}"
        );
        assert!(
            !script.contains('$'),
            "every placeholder replaced: {script}"
        );
        assert_eq!(script.lines().count(), 5);
    }
}
