//! `lab bench report-api`: N requests over K Idempotency-Keys at concurrency C against the report
//! service, then the count of reports, which must be exactly K; and the same transaction sent
//! directly through sqlx, to see what HTTP, JSON and the service's handler cost on top of it.
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
//! have eight connections given back without a check after a commit. With `--target URL` the
//! requests go to a running service (`lab serve`'s, or any service with this API), and the
//! reports are counted through its `GET /reports`; the direct side then runs on a schema of our
//! own PostgreSQL, which is not the target's database, so compare the two with that in mind.
//! Reports made on a target stay there (the API cannot delete them); their keys carry the
//! bench's tag.
//!
//! The http and sqlx sides take turns ([`ROUNDS`]), so that a machine whose speed drifts slows
//! both alike (pgbench runs after them, in one piece: see [`take_turns`]), and each row tells
//! the CPU a request cost its own process and the database (a throwaway server's processes,
//! read in `/proc`): on two cores that client, service and PostgreSQL share, that sum is what
//! bounds a side's rate, and docs/bench.md's profile of where the time goes is this table's two
//! columns.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::anyhow;
use axum::body::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::header::HeaderValue;
use hyper_util::rt::TokioIo;
use lab_core::{Checkpoints, Msg};
use lab_infra::pool::LeanPool;
use lab_infra::{Needs, RunSpace};
use lab_services::reports::{self, CreateReport};
use lab_services::stage::{self, Ports, Stage, StageConfig};
use serde_json::json;
use sqlx::Connection as _;
use sqlx::PgPool;
use tokio_util::task::TaskTracker;

use super::{Sample, measure, print_table, progress, ratio_cell, tenth};
use crate::exit::{self, Failure};
use crate::session::{Format, Session};
use crate::words::t;

/// The report type of every bench request: the payload hash of key k is then fixed by k alone,
/// so a replay is always "same key, same payload" (200), never a 409.
const REPORT_TYPE: &str = "bench";

/// One side of the comparison, added up over its rounds.
struct Side {
    via: &'static str,
    sample: Sample,
    created: u64,
    replayed: u64,
    /// Reports with this side's keys afterwards; `None` when they cannot be counted.
    reports: Option<u64>,
    /// CPU used while the side ran: [`CpuUsed`], summed over the rounds.
    cpu: CpuUsed,
}

/// What one round of a side did.
struct Round {
    sample: Sample,
    created: u64,
    replayed: u64,
}

impl Side {
    fn new(via: &'static str) -> Side {
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
    fn per_request_us(&self, cpu: Duration) -> f64 {
        cpu.as_secs_f64() * 1e6 / (self.sample.ops.max(1) as f64)
    }
}

/// The CPU a side's round used: its own process's (the lab's for the http side, with the
/// embedded service in it, and for the sqlx side; pgbench's for pgbench) and the database's (a
/// throwaway server's processes; `None` for a server given by URL, whose processes are not ours
/// to read). The profile of where a request's time goes, in every run: on two cores that the
/// client, the service and PostgreSQL share, each side's rate is bounded by the sum.
#[derive(Clone, Copy)]
struct CpuUsed {
    own: Duration,
    database: Option<Duration>,
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

/// How much load: requests in all, the keys they spread over, concurrent clients.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    pub requests: u64,
    pub keys: u64,
    pub concurrency: u32,
}

pub async fn run(
    session: Session,
    load: Load,
    target: Option<&str>,
    pgbench: bool,
) -> Result<u8, Failure> {
    let target = target.map(check_target).transpose()?;
    let pgbench = match pgbench {
        true => Some(
            lab_infra::binaries::find_pgbench()
                .await
                .ok_or_else(|| Failure::environment(anyhow!(t("bench.no_pgbench"))))?,
        ),
        false => None,
    };
    let sides_count = if pgbench.is_some() { 3 } else { 2 };
    let bar = progress(session.color(), sides_count * load.requests);
    let sides = session
        .with_servers(
            Needs::POSTGRES,
            async |servers| {
                all_sides(servers, load, target.as_deref(), pgbench.as_deref(), &bar).await
            },
            async |_, ended| {
                bar.finish_and_clear();
                ended.into_result()
            },
        )
        .await?;
    // Exactly K reports on each side, or the protection failed (drift, exit 1). A target whose
    // reports cannot be counted is said so, and does not fail the bench; pgbench draws its keys
    // at random, so it may not reach every one of them.
    let exact = sides
        .iter()
        .filter(|s| s.via != PGBENCH)
        .all(|s| s.reports.is_none_or(|n| n == load.keys));
    let shown = target.as_deref().unwrap_or("embedded");
    if session.format() == Format::Json {
        print_json(&sides, load, shown);
    } else {
        print_text(&sides, load, shown, exact, target.is_some());
    }
    Ok(if exact { exit::OK } else { exit::DRIFT })
}

/// The sides take turns: each sends a third of its requests, then the next side does, three
/// times over. On a machine whose speed drifts during the bench (a VM beside busy neighbours:
/// this one's rate moved by a third from one run to the next) every side then meets the same
/// slow and fast stretches, and the ratios between them keep their meaning.
const ROUNDS: u64 = 3;

/// The requests of round `round`: `first..first + count`.
fn round_of(round: u64, requests: u64) -> (u64, u64) {
    let first = requests * round / ROUNDS;
    let next = requests * (round + 1) / ROUNDS;
    (first, next - first)
}

/// Every side on a run schema of its own, released however they end.
async fn all_sides(
    servers: &lab_infra::Servers,
    load: Load,
    target: Option<&str>,
    pgbench: Option<&std::path::Path>,
    bar: &indicatif::ProgressBar,
) -> Result<Vec<Side>, Failure> {
    let space = RunSpace::create(servers, &stage::schemas(&[&reports::SPEC]))
        .await
        .map_err(Failure::environment)?;
    let tasks = TaskTracker::new();
    let sides = take_turns(servers, &space, &tasks, load, target, pgbench, bar).await;
    tasks.close();
    tasks.wait().await;
    let _ = space.release(servers, false).await;
    sides
}

/// HTTP (the embedded service, or the target) and the same transaction directly, in turns
/// ([`ROUNDS`]), then pgbench; each side's reports counted at the end.
async fn take_turns(
    servers: &lab_infra::Servers,
    space: &RunSpace,
    tasks: &TaskTracker,
    load: Load,
    target: Option<&str>,
    pgbench: Option<&std::path::Path>,
    bar: &indicatif::ProgressBar,
) -> Result<Vec<Side>, Failure> {
    let tag = format!("bench-{}", space.run_id);
    let pool = space.pg.clone().ok_or_else(|| {
        Failure::environment(anyhow!(t(
            Msg::new("bench.no_server").arg("server", "PostgreSQL")
        )))
    })?;
    let pgbench = match pgbench {
        Some(program) => {
            let url = servers
                .postgres
                .as_ref()
                .map(|pg| pg.target.guest_url(&space.schema))
                .transpose()
                .map_err(Failure::environment)?
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
                    Failure::environment(anyhow!(t(
                        Msg::new("bench.cannot_start").arg("error", "-")
                    )))
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
        let mut http = Side::new("http");
        let mut direct = Side::new("sqlx");
        let mut through_pgbench = pgbench.as_ref().map(|_| Side::new(PGBENCH));
        for round in 0..ROUNDS {
            let (first, count) = round_of(round, load.requests);
            bar.set_message("http");
            let clock = CpuClock::start(http_database);
            let done = clients.send(&tag, load.keys, first, count, bar).await?;
            http.add(done, clock.stop());
            bar.set_message("sqlx");
            let clock = CpuClock::start(database);
            let done = directly(&direct_pool, &tag, load, first, count, bar).await?;
            direct.add(done, clock.stop());
        }
        // pgbench in one piece, after the turns: each run of it opens its C connections anew,
        // and a new backend's first transactions (its caches filling) are dear. Split into the
        // rounds, pgbench at 50 clients lost a third of its rate to that, which is not the
        // database's limit. Its C clients send ⌈N / C⌉ transactions each.
        if let (Some(pgbench), Some(side)) = (&pgbench, &mut through_pgbench) {
            bar.set_message(PGBENCH);
            let per_client = load.requests.div_ceil(u64::from(load.concurrency.max(1)));
            let clock = CpuClock::start(database);
            let done = pgbench.run(per_client).await?;
            bar.inc(load.requests);
            side.add(done, clock.stop());
        }
        Ok::<_, Failure>((http, direct, through_pgbench))
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
    let mut sides = vec![http, direct];
    if let Some(mut side) = through_pgbench {
        // pgbench draws its keys at random: its reports are the keys it reached.
        let reached = count_in_database(&pool, &format!("{tag}-pgbench-")).await?;
        side.created = reached;
        side.replayed = side.sample.ops.saturating_sub(reached);
        side.reports = Some(reached);
        sides.push(side);
    }
    Ok(sides)
}

/// The report service, started as a scenario run starts it, on the bench's space.
async fn embedded_service(space: &RunSpace, tasks: &TaskTracker) -> Result<Stage, Failure> {
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
            Failure::environment(anyhow!(t(
                Msg::new("bench.cannot_start").arg("error", e.to_string())
            )))
        })
}

/// One JSON object per side.
fn print_json(sides: &[Side], load: Load, target: &str) {
    let direct_rate = sides[1].sample.ops_per_sec();
    let pgbench_rate = sides
        .iter()
        .find(|s| s.via == PGBENCH)
        .map(|s| tenth(s.sample.ops_per_sec()));
    for side in sides {
        let ops_per_sec = tenth(side.sample.ops_per_sec());
        say!(
            "{}",
            json!({
                "bench": "report-api",
                "via": side.via,
                "target": target,
                "requests": load.requests,
                "keys": load.keys,
                "concurrency": load.concurrency,
                "requests_per_sec": ops_per_sec,
                "p50_us": tenth(side.sample.percentile_us(50.0)),
                "p99_us": tenth(side.sample.percentile_us(99.0)),
                "created": side.created,
                "replayed": side.replayed,
                "reports": side.reports,
                "expected_reports": load.keys,
                "ratio_to_sqlx": ops_per_sec / tenth(direct_rate).max(f64::MIN_POSITIVE),
                "ratio_to_pgbench": pgbench_rate.map(|p| ops_per_sec / p.max(f64::MIN_POSITIVE)),
                "cpu_own_us": tenth(side.per_request_us(side.cpu.own)),
                "cpu_postgres_us": side.cpu.database.map(|cpu| tenth(side.per_request_us(cpu))),
                "rounds": ROUNDS,
            })
        );
    }
}

/// The table for people, and what its rows mean.
fn print_text(sides: &[Side], load: Load, target: &str, exact: bool, elsewhere: bool) {
    let direct_rate = sides[1].sample.ops_per_sec();
    say!(
        "{}",
        t(Msg::new("bench.report_title")
            .arg("requests", load.requests.to_string())
            .arg("keys", load.keys.to_string())
            .arg("concurrency", load.concurrency.to_string())
            .arg("target", target))
    );
    say!();
    let header: Vec<String> = [
        "col_via",
        "col_requests_per_sec",
        "col_p50",
        "col_p99",
        "col_created",
        "col_replayed",
        "col_reports",
        "col_ratio_sqlx",
        "col_cpu_own",
        "col_cpu_postgres",
    ]
    .iter()
    .map(|key| t(Msg::new(format!("bench.{key}"))))
    .collect();
    let cells: Vec<Vec<String>> = sides
        .iter()
        .map(|side| {
            vec![
                side.via.to_string(),
                format!("{:.0}", side.sample.ops_per_sec()),
                format!("{:.0}", side.sample.percentile_us(50.0)),
                format!("{:.0}", side.sample.percentile_us(99.0)),
                side.created.to_string(),
                side.replayed.to_string(),
                side.reports
                    .map_or_else(|| "?".to_string(), |n| n.to_string()),
                ratio_cell(side.sample.ops_per_sec() / direct_rate.max(f64::MIN_POSITIVE)),
                format!("{:.0}", side.per_request_us(side.cpu.own)),
                side.cpu.database.map_or_else(
                    || "-".to_string(),
                    |cpu| format!("{:.0}", side.per_request_us(cpu)),
                ),
            ]
        })
        .collect();
    print_table(&header, &cells, 1);
    say!();
    say!("{}", t("bench.report_means"));
    say!(
        "{}",
        t(Msg::new("bench.report_turns").arg("rounds", ROUNDS.to_string()))
    );
    if let Some(pgbench) = sides.iter().find(|s| s.via == PGBENCH) {
        let of = |side: &Side| {
            format!(
                "{:.2}",
                side.sample.ops_per_sec() / pgbench.sample.ops_per_sec().max(f64::MIN_POSITIVE)
            )
        };
        say!(
            "{}",
            t(Msg::new("bench.report_pgbench")
                .arg("http", of(&sides[0]))
                .arg("sqlx", of(&sides[1])))
        );
    }
    if elsewhere {
        say!("{}", t("bench.report_direct_elsewhere"));
    }
    if sides[0].reports.is_none() {
        say!("{}", t("bench.report_uncounted"));
    }
    let keys = load.keys.to_string();
    say!(
        "{}",
        t(if exact {
            Msg::new("bench.report_exact").arg("keys", keys)
        } else {
            Msg::new("bench.report_not_exact").arg("keys", keys)
        })
    );
}

/// `--target`: an http URL, without a trailing slash.
fn check_target(given: &str) -> Result<String, Failure> {
    let parsed = url::Url::parse(given).map_err(|e| {
        Failure::usage(t(Msg::new("bench.bad_target")
            .arg("url", given)
            .arg("reason", e.to_string())))
    })?;
    if parsed.scheme() != "http" || parsed.host_str().is_none_or(str::is_empty) {
        let reason = match parsed.scheme() {
            "https" => t("bench.plain_http"),
            _ => t("url_scheme"),
        };
        return Err(Failure::usage(t(Msg::new("bench.bad_target")
            .arg("url", given)
            .arg("reason", reason))));
    }
    Ok(given.trim_end_matches('/').to_string())
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
/// from the other two; reqwest, used here before, cost 18 µs more of user CPU per request (the
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
    bar: indicatif::ProgressBar,
}

impl HttpClients {
    async fn connect(url: &str, concurrency: u32) -> Result<HttpClients, Failure> {
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
        bar: &indicatif::ProgressBar,
    ) -> Result<Round, Failure> {
        let work = Arc::new(Work {
            tag: tag.to_string(),
            keys,
            first,
            count,
            next: AtomicU64::new(0),
            created: AtomicU64::new(0),
            replayed: AtomicU64::new(0),
            bar: bar.clone(),
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
    ) -> (ClientConnection, Result<Vec<Duration>, Failure>) {
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
                        return Err(Failure::new(
                            exit::DRIFT,
                            anyhow!(t(Msg::new("bench.unexpected_status")
                                .arg("status", status.to_string())
                                .arg("body", String::from_utf8_lossy(&body).into_owned()))),
                        ));
                    }
                };
                latencies.push(started.elapsed());
                work.bar.inc(1);
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
fn task_failed(error: tokio::task::JoinError) -> Failure {
    Failure::environment(anyhow!(t(
        Msg::new("bench.task_failed").arg("error", error.to_string())
    )))
}

fn service_failed(error: impl std::fmt::Display) -> Failure {
    Failure::environment(anyhow!(t(
        Msg::new("bench.service_failed").arg("error", error.to_string())
    )))
}

/// Where `POST /reports` goes: the address to connect to, the `Host` header, the path.
struct Target {
    address: String,
    host: HeaderValue,
    path: String,
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

impl Target {
    /// The target of an http URL: `--target` (which `check_target` has refused unless it is
    /// one) or the embedded service's.
    fn of(url: &str) -> Result<Target, Failure> {
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
    async fn connect(&self) -> Result<ClientConnection, Failure> {
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
    bar: &indicatif::ProgressBar,
) -> Result<Round, Failure> {
    let created = AtomicU64::new(0);
    let replayed = AtomicU64::new(0);
    let sample = measure(first, count, load.concurrency, bar, |n| {
        let (k, body) = request_of(n, load.keys);
        let key = format!("{tag}-sqlx-{k}");
        let (created, replayed) = (&created, &replayed);
        // In a task of its own, as the service runs each request's transaction
        // (`tasks.spawn(create_report_to_the_end(…))`): otherwise the C transactions would share
        // this one task's thread, while the service's spread over the runtime's threads.
        let transaction = tokio::spawn(create_report(pool.clone(), key, body));
        async move {
            let inserted = transaction
                .await
                .map_err(task_failed)?
                .map_err(|e| Failure::environment(anyhow!(lab_infra::pg_message(&e))))?;
            if inserted {
                created.fetch_add(1, Ordering::Relaxed);
            } else {
                replayed.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), Failure>(())
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
async fn count_in_database(pool: &PgPool, prefix: &str) -> Result<u64, Failure> {
    let count: i64 =
        sqlx::query_scalar("SELECT count(*) FROM reports WHERE starts_with(idempotency_key, $1)")
            .bind(prefix)
            .fetch_one(pool)
            .await
            .map_err(|e| Failure::environment(anyhow!(lab_infra::pg_message(&e))))?;
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

/// The name of the pgbench side, in the table and the JSON rows.
const PGBENCH: &str = "pgbench";

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
    program: std::path::PathBuf,
    url: String,
    concurrency: u32,
    /// The script, and the per-transaction logs of the run going on.
    scratch: tempfile::TempDir,
}

impl Pgbench {
    fn prepare(
        program: &std::path::Path,
        url: String,
        tag: &str,
        load: Load,
    ) -> Result<Pgbench, Failure> {
        let scratch = tempfile::tempdir().map_err(Failure::environment)?;
        std::fs::write(scratch.path().join(SCRIPT), pgbench_script(tag, load.keys))
            .map_err(Failure::environment)?;
        Ok(Pgbench {
            program: program.to_path_buf(),
            url,
            concurrency: load.concurrency,
            scratch,
        })
    }

    /// `per_client` transactions from each of the C clients.
    async fn run(&self, per_client: u64) -> Result<Round, Failure> {
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
            .await
            .map_err(Failure::environment)?;
        let said = String::from_utf8_lossy(&out.stdout).to_string();
        if !out.status.success() {
            let why = String::from_utf8_lossy(&out.stderr).to_string();
            return Err(Failure::environment(anyhow!(t(Msg::new(
                "bench.pgbench_failed"
            )
            .arg("error", lab_infra::url::redact(why.trim()))))));
        }
        let tps: f64 = said
            .lines()
            .find_map(|l| l.strip_prefix("tps = "))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .ok_or_else(|| {
                Failure::environment(anyhow!(t(
                    Msg::new("bench.pgbench_failed").arg("error", "no tps in its output")
                )))
            })?;
        // Each log line: client, transaction, its time in microseconds, script, when it ended.
        // Each log is removed once read, so the next round reads its own.
        let mut latencies = Vec::new();
        for entry in std::fs::read_dir(self.scratch.path()).map_err(Failure::environment)? {
            let path = entry.map_err(Failure::environment)?.path();
            if !path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(LOG_PREFIX))
            {
                continue;
            }
            let text = std::fs::read_to_string(&path).map_err(Failure::environment)?;
            latencies.extend(text.lines().filter_map(|line| {
                let micros: u64 = line.split_whitespace().nth(2)?.parse().ok()?;
                Some(Duration::from_micros(micros))
            }));
            std::fs::remove_file(&path).map_err(Failure::environment)?;
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
