//! Exercise `invoice-consumer` (the payments lesson, background jobs): the learner's consumer of
//! a Redis Stream, in a consumer group the lab creates, that sends each invoice through the
//! lab's mailer once per invoice version (the lesson's `send_invoice_once`). The lab publishes
//! the jobs, holds the mailer at its checkpoint, kills consumers, cuts their link to Redis, and
//! reads the oracle itself: the mailer's list of emails, and the group's pending entries.
//!
//! ```text
//!   the lab ──XADD──► stream (group `invoicing`) ◄──XREADGROUP / XAUTOCLAIM / XACK── the learner's
//!                                                     fault proxy ◄──────────────── consumers A, B
//!   the mailer (emails, counted) ◄──────────────────────────────────────────────── POST /emails
//! ```
//!
//! | check                   | the schedule                                                           | the invariant                                      |
//! |-------------------------|------------------------------------------------------------------------|----------------------------------------------------|
//! | `one-email`             | one job                                                                | one email; the entry acked                         |
//! | `ack-lost`              | A sends, stores the result, and is killed before its XACK reaches Redis; B starts | B claims the entry after its idle time and replays: one email, acked |
//! | `redelivered`           | the same invoice published twice, with two delivery ids                | one email (the key names the invoice, not the delivery) |
//! | `new-version`           | version 1, then version 2                                              | two emails                                         |
//! | `changed-recipient`     | version 1 to one address, then to another                              | refused by the fingerprint: no second email         |
//! | `in-progress-duplicate` | A held inside the mailer; the same invoice again, to B                 | B does not ack it while A sends, and settles it later: one email, both acked |
//! | `ack-after-send`        | A held inside the mailer                                               | the entry is not acked before the send finished, and is acked once the result is stored |
//!
//! Every check has a stream of its own (`lab:<run>:invoices.<check>`) and its own consumers,
//! started for it and stopped after it, so nothing one check leaves pending reaches the next.
//!
//! There is no visibility timeout in Redis Streams: an entry delivered to a consumer that died
//! stays in the group's pending list until some consumer claims it (`XAUTOCLAIM` with a minimum
//! idle time, `CLAIM_IDLE_MS`). The lab's oracle for "acked" is that pending list.

use std::time::{Duration, Instant};

use lab_core::{Checkpoints, Msg};
use lab_services::mailer;
use lab_services::spec::{RunningService, ServiceEnv};
use redis::aio::MultiplexedConnection;
use serde::Deserialize;

use crate::catalogue::{CheckSpec, Exercise};
use crate::error::ExerciseError;
use crate::guest::{Guest, Mark};
use crate::manifest::Manifest;
use crate::payment_world::{STAGING_LIMIT, TENANT, glob_escape, launch, redis_error, scan};
use crate::verdict::{Line, Verdict, fail};
use crate::world::World;

pub static EXERCISE: Exercise = Exercise {
    name: "invoice-consumer",
    lesson: "payments",
    needs: lab_infra::Needs::REDIS,
    langs: &["python", "rust"],
    rust_uses_idem: true,
    checks: &[
        CheckSpec::new("one-email"),
        CheckSpec::new("ack-lost").restarts(),
        CheckSpec::new("redelivered"),
        CheckSpec::new("new-version"),
        CheckSpec::new("changed-recipient"),
        CheckSpec::new("in-progress-duplicate"),
        CheckSpec::new("ack-after-send"),
    ],
    starter_fails: &[
        "ack-lost",
        "redelivered",
        "changed-recipient",
        "in-progress-duplicate",
        "ack-after-send",
    ],
};

/// The consumer group the lab creates on each check's stream.
const GROUP: &str = "invoicing";
/// How long an entry must sit unacknowledged before a consumer claims it again.
const CLAIM_IDLE_MS: u64 = 1000;
/// The reservation's lease the consumers are given: longer than any hold of a check.
const LEASE_SECONDS: u64 = 30;
/// How long the lab waits for a state the consumers should reach (an entry acked, claimed
/// again): several claim intervals on a loaded machine.
const SETTLE_LIMIT: Duration = Duration::from_secs(30);
/// How often the lab reads the pending list or the mailer while it waits.
const POLL: Duration = Duration::from_millis(20);
/// How often it reads the stored result while a consumer's XACK is on its way (`ack-lost`).
const RECORD_POLL: Duration = Duration::from_millis(2);
/// The delay put on every command from the consumers to Redis while `ack-lost` waits for the
/// stored result: the XACK that follows it is still in the proxy when the lab cuts the link. Two
/// seconds: the lab sees the store within milliseconds and cuts the link at once, and a loaded
/// machine that stalls the lab longer than this makes the check unknown (the ack landed), never
/// a pass. (One second, with the kill before the cut, was unknown once in 101 of CI's runs on a
/// machine busy with other work.)
const ACK_DELAY_MS: u64 = 2000;

type Checked = Result<Verdict, ExerciseError>;

/// A job of a check: the lesson's InvoiceJob.
#[derive(Debug, Clone)]
struct Job {
    delivery: String,
    order: String,
    version: u32,
    email: String,
}

impl Job {
    /// Job `n`'s invoice, version 1, to Anna, delivered as delivery `d`.
    fn new(n: u32, d: u32) -> Job {
        Job {
            delivery: format!("d0c0ffee-0000-4000-8000-{d:012}"),
            order: format!("0b7e4c1a-2d3f-4e5a-9b6c-{n:012}"),
            version: 1,
            email: "anna@example.com".to_string(),
        }
    }

    fn delivered_as(&self, d: u32) -> Job {
        Job {
            delivery: format!("d0c0ffee-0000-4000-8000-{d:012}"),
            ..self.clone()
        }
    }

    /// The subject the contract says the email has: how the lab tells invoices apart.
    fn subject(&self) -> String {
        format!("Invoice {} v{}", self.order, self.version)
    }

    /// The lesson's idempotency key of the invoice: the order's hex and the version.
    fn invoice_key(&self) -> String {
        format!("{}.v{}", self.order.replace('-', ""), self.version)
    }
}

/// An email as the mailer lists it.
#[derive(Debug, Clone, Deserialize)]
struct Sent {
    email_id: String,
    to: String,
    subject: String,
}

/// What the invoice-consumer checks work with.
pub struct Depot {
    pub run: String,
    /// `lab:<run>:`: the streams' prefix.
    pub run_prefix: String,
    /// `KEY_PREFIX`: the consumers' records.
    pub key_prefix: String,
    pub redis: MultiplexedConnection,
    pub proxies: faultproxy::FaultProxy,
    /// The consumers → Redis.
    pub redis_hop: faultproxy::Proxy,
    pub mailer: RunningService,
    pub checkpoints: Checkpoints,
    pub dir: std::path::PathBuf,
    pub manifest: Manifest,
    pub env: Vec<(String, String)>,
    /// This check's stream, and its consumers (kept for their output).
    stream: String,
    consumers: Vec<(String, Guest)>,
    http: reqwest::Client,
    pub schedule: Vec<Line>,
}

/// Starts the depot: the mailer and the consumers' link to Redis.
pub async fn open(
    run: &str,
    run_prefix: &str,
    redis: MultiplexedConnection,
    redis_addr: &str,
    dir: std::path::PathBuf,
    manifest: Manifest,
    extra_env: Vec<(String, String)>,
) -> Result<Depot, ExerciseError> {
    let checkpoints = Checkpoints::new();
    let mailer = launch(
        &mailer::SPEC,
        ServiceEnv::default().with_checkpoints(checkpoints.clone()),
    )?;
    let proxies = faultproxy::FaultProxy::new();
    let hop = proxies
        .create(&format!("exercise-{run}-redis"), "127.0.0.1:0", redis_addr)
        .await?;
    let key_prefix = format!("{run_prefix}idempotency:");
    let env = vec![
        ("REDIS_URL".to_string(), format!("redis://{}/0", hop.listen)),
        ("KEY_PREFIX".to_string(), key_prefix.clone()),
        ("GROUP".to_string(), GROUP.to_string()),
        ("MAILER_URL".to_string(), mailer.url()),
        ("CLAIM_IDLE_MS".to_string(), CLAIM_IDLE_MS.to_string()),
        ("LEASE_SECONDS".to_string(), LEASE_SECONDS.to_string()),
        ("LAB_RUN".to_string(), run.to_string()),
        ("PYTHONUNBUFFERED".to_string(), "1".to_string()),
    ];
    Ok(Depot {
        run: run.to_string(),
        run_prefix: run_prefix.to_string(),
        key_prefix,
        redis,
        redis_hop: proxies.get(&hop.name).expect("just created"),
        proxies,
        mailer,
        checkpoints,
        dir,
        manifest,
        env: env.into_iter().chain(extra_env).collect(),
        stream: String::new(),
        consumers: Vec::new(),
        http: reqwest::Client::new(),
        schedule: Vec::new(),
    })
}

/// One pending entry: its id, and how often it was delivered.
#[derive(Debug, Clone)]
struct Pending {
    id: String,
    deliveries: u64,
}

impl Depot {
    fn step(&mut self, msg: Msg) {
        self.schedule.push(Line::Step(msg));
    }

    /// A fresh stream and group for the check `name`.
    async fn new_stream(&mut self, name: &str) -> Result<(), ExerciseError> {
        self.stream = format!("{}invoices.{name}", self.run_prefix);
        redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&self.stream)
            .arg(GROUP)
            .arg("$")
            .arg("MKSTREAM")
            .query_async::<()>(&mut self.redis)
            .await
            .map_err(redis_error)
    }

    /// Starts consumer `who` on this check's stream.
    async fn start_consumer(&mut self, who: &str) -> Result<(), ExerciseError> {
        let env = self
            .env
            .iter()
            .cloned()
            .chain([
                ("STREAM".to_string(), self.stream.clone()),
                ("CONSUMER".to_string(), who.to_string()),
            ])
            .collect();
        let mut consumer = Guest::new(&self.dir, self.manifest.clone(), 0, env)?;
        consumer.launch().await?;
        self.step(Msg::new("step.start").arg("who", who));
        self.consumers.push((who.to_string(), consumer));
        Ok(())
    }

    async fn kill_consumer(&mut self, who: &str) {
        if let Some((_, consumer)) = self.consumers.iter_mut().find(|(w, _)| w == who) {
            consumer.kill().await;
        }
        self.step(Msg::new("step.kill").arg("who", who));
    }

    /// Publishes `job` to this check's stream; its entry id.
    async fn publish(&mut self, job: &Job) -> Result<String, ExerciseError> {
        let version = job.version.to_string();
        let id: String = redis::cmd("XADD")
            .arg(&self.stream)
            .arg("*")
            .arg(&[
                ("delivery_id", job.delivery.as_str()),
                ("tenant_id", TENANT),
                ("order_id", job.order.as_str()),
                ("invoice_version", version.as_str()),
                ("email", job.email.as_str()),
            ])
            .query_async(&mut self.redis)
            .await
            .map_err(redis_error)?;
        self.step(
            Msg::new("step.publish")
                .arg("order", job.order.as_str())
                .arg("version", i64::from(job.version))
                .arg("email", job.email.as_str())
                .arg("delivery", job.delivery.as_str()),
        );
        Ok(id)
    }

    /// The group's pending entries on this check's stream.
    async fn pending(&mut self) -> Result<Vec<Pending>, ExerciseError> {
        let rows: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
            .arg(&self.stream)
            .arg(GROUP)
            .arg("-")
            .arg("+")
            .arg(100)
            .query_async(&mut self.redis)
            .await
            .map_err(redis_error)?;
        Ok(rows
            .into_iter()
            .map(|(id, _consumer, _idle, deliveries)| Pending { id, deliveries })
            .collect())
    }

    /// Whether entry `id` was delivered and acked. Read in this order, delivered first (the
    /// group's last delivered id is at or past it), then not pending: a delivered entry stays
    /// pending until it is acked, so this cannot mistake an entry delivered between the two
    /// reads for an acked one.
    async fn acked(&mut self, id: &str) -> Result<bool, ExerciseError> {
        let groups: Vec<redis::Value> = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(&self.stream)
            .query_async(&mut self.redis)
            .await
            .map_err(redis_error)?;
        let last = groups.first().and_then(last_delivered);
        let delivered = last.is_some_and(|last| entry_order(&last) >= entry_order(id));
        if !delivered {
            return Ok(false);
        }
        Ok(!self.pending().await?.iter().any(|p| p.id == id))
    }

    /// Waits until every entry of `ids` is acked, at most [`SETTLE_LIMIT`]; whether they were.
    async fn wait_acked(&mut self, ids: &[&str]) -> Result<bool, ExerciseError> {
        let started = Instant::now();
        loop {
            let mut all = true;
            for id in ids {
                all &= self.acked(id).await?;
            }
            if all {
                return Ok(true);
            }
            if started.elapsed() > SETTLE_LIMIT {
                return Ok(false);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until entry `id` was delivered at least `times` times (claimed again), or acked;
    /// its deliveries, `None` if it was acked.
    async fn wait_delivered(&mut self, id: &str, times: u64) -> Result<Option<u64>, ExerciseError> {
        let started = Instant::now();
        loop {
            match self.pending().await?.into_iter().find(|p| p.id == id) {
                Some(p) if p.deliveries >= times || started.elapsed() > SETTLE_LIMIT => {
                    return Ok(Some(p.deliveries));
                }
                None if self.acked(id).await? => return Ok(None),
                None if started.elapsed() > SETTLE_LIMIT => return Ok(Some(0)),
                _ => {}
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The emails the mailer sent for `job`'s invoice (its subject), recorded.
    async fn emails(&mut self, job: &Job) -> Result<Vec<Sent>, ExerciseError> {
        let emails = self.list_emails(job).await?;
        let shown: Vec<String> = emails
            .iter()
            .map(|e| format!("{} → {}", e.email_id, e.to))
            .collect();
        self.step(
            Msg::new("step.emails")
                .arg("subject", job.subject())
                .arg("count", emails.len())
                .arg(
                    "emails",
                    if shown.is_empty() {
                        "-".to_string()
                    } else {
                        shown.join(", ")
                    },
                ),
        );
        Ok(emails)
    }

    async fn list_emails(&self, job: &Job) -> Result<Vec<Sent>, ExerciseError> {
        #[derive(Deserialize)]
        struct Listed {
            emails: Vec<Sent>,
        }
        let failed = |e: reqwest::Error| ExerciseError::Target(format!("the mailer's list: {e}"));
        let listed: Listed = self
            .http
            .get(format!("{}/emails", self.mailer.url()))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(failed)?
            .json()
            .await
            .map_err(failed)?;
        Ok(listed
            .emails
            .into_iter()
            .filter(|e| e.subject == job.subject())
            .collect())
    }

    /// Waits until the mailer has sent at least `count` emails for `job`'s invoice, at most
    /// [`SETTLE_LIMIT`] (an entry can be acked before its send: the wait is for the send).
    async fn wait_emails(&mut self, job: &Job, count: usize) -> Result<(), ExerciseError> {
        let started = Instant::now();
        while self.count_emails(job).await? < count && started.elapsed() < SETTLE_LIMIT {
            tokio::time::sleep(POLL).await;
        }
        Ok(())
    }

    async fn count_emails(&self, job: &Job) -> Result<usize, ExerciseError> {
        Ok(self.list_emails(job).await?.len())
    }

    /// Why more than one email went out for an invoice, or why its result is not where the
    /// lab looks: a key made of the delivery id, if the records say so; else `otherwise`.
    async fn explained(&mut self, job: &Job, otherwise: Verdict) -> Result<Verdict, ExerciseError> {
        let by_delivery = self.keys_naming_delivery(job).await?;
        Ok(match by_delivery.first() {
            Some(key) => Verdict::Fail(fail("delivery_key").arg("key", key.as_str())),
            None => otherwise,
        })
    }

    /// The consumers' records of `job`'s invoice: every key under the prefix that names its
    /// idempotency key (`<order hex>.v<version>`), with its value as `DUMP` gives it (any type
    /// of value: the lab does not read idempotency-kit's format, it sees a write).
    async fn records(&mut self, job: &Job) -> Result<Vec<(String, Vec<u8>)>, ExerciseError> {
        let pattern = format!("{}*{}*", glob_escape(&self.key_prefix), job.invoice_key());
        let mut records = Vec::new();
        for key in scan(&mut self.redis, &pattern).await? {
            let dumped: Option<Vec<u8>> = redis::cmd("DUMP")
                .arg(&key)
                .query_async(&mut self.redis)
                .await
                .map_err(redis_error)?;
            if let Some(dumped) = dumped {
                records.push((key, dumped));
            }
        }
        Ok(records)
    }

    /// Keys under the prefix that name `job`'s delivery id: a key made of the delivery.
    async fn keys_naming_delivery(&mut self, job: &Job) -> Result<Vec<String>, ExerciseError> {
        let mut found = Vec::new();
        for form in [job.delivery.clone(), job.delivery.replace('-', "")] {
            let pattern = format!("{}*{form}*", glob_escape(&self.key_prefix));
            found.extend(scan(&mut self.redis, &pattern).await?);
        }
        Ok(found)
    }

    /// Stops this check's consumers.
    async fn stop_consumers(&mut self) {
        for (_, consumer) in &mut self.consumers {
            consumer.stop().await;
        }
    }

    async fn consumers_output(&self) -> Option<String> {
        let mut said = Vec::new();
        for (who, consumer) in &self.consumers {
            let output = consumer.output().await;
            if !output.trim().is_empty() {
                said.push(format!("[consumer {who}]\n{output}"));
            }
        }
        (!said.is_empty()).then(|| said.join("\n"))
    }
}

/// The `last-delivered-id` of an `XINFO GROUPS` entry.
fn last_delivered(group: &redis::Value) -> Option<String> {
    let redis::Value::Array(fields) = group else {
        return None;
    };
    let mut fields = fields.iter();
    while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
        if let (redis::Value::BulkString(name), redis::Value::BulkString(value)) = (name, value)
            && name.as_slice() == b"last-delivered-id"
        {
            return Some(String::from_utf8_lossy(value).to_string());
        }
    }
    None
}

/// A stream entry id (`ms-seq`) as a number pair, for ordering.
fn entry_order(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}

/// Exactly one email for `job`'s invoice; the verdict that says otherwise.
fn one_email(emails: &[Sent]) -> Result<(), Verdict> {
    match emails.len() {
        1 => Ok(()),
        0 => Err(Verdict::Fail(fail("no_email"))),
        n => Err(Verdict::Fail(fail("emails").arg("count", n))),
    }
}

macro_rules! judged {
    ($e:expr) => {
        if let Err(verdict) = $e {
            return Ok(verdict);
        }
    };
}

/// Runs the check `name` on a stream of its own, with consumers of its own.
pub async fn run(name: &str, depot: &mut Depot) -> Checked {
    depot.consumers.clear();
    depot.new_stream(name).await?;
    match name {
        "one-email" => one_email_check(depot).await,
        "ack-lost" => ack_lost(depot).await,
        "redelivered" => redelivered(depot).await,
        "new-version" => new_version(depot).await,
        "changed-recipient" => changed_recipient(depot).await,
        "in-progress-duplicate" => in_progress_duplicate(depot).await,
        "ack-after-send" => ack_after_send(depot).await,
        other => unreachable!("invoice-consumer has no check {other}"),
    }
}

async fn one_email_check(depot: &mut Depot) -> Checked {
    depot.start_consumer("A").await?;
    let job = Job::new(1, 1);
    let id = depot.publish(&job).await?;
    let acked = depot.wait_acked(&[&id]).await?;
    depot.wait_emails(&job, 1).await?;
    let emails = depot.emails(&job).await?;
    judged!(one_email(&emails));
    if !acked {
        return Ok(Verdict::Fail(fail("never_acked")));
    }
    Ok(Verdict::Pass)
}

async fn ack_lost(depot: &mut Depot) -> Checked {
    depot.start_consumer("A").await?;
    let job = Job::new(2, 2);
    let hold = depot.checkpoints.hold(mailer::SENT);
    let id = depot.publish(&job).await?;
    if hold.entered(STAGING_LIMIT).await.is_err() {
        return Ok(Verdict::Unknown(Msg::new("unknown.never_sent")));
    }
    // From now on every command of A's reaches Redis ACK_DELAY_MS late: the store, and the
    // XACK A sends only once the store has answered.
    depot.redis_hop.add_toxic(
        faultproxy::Toxic::new(
            faultproxy::ToxicKind::Latency {
                latency: ACK_DELAY_MS,
                jitter: 0,
            },
            faultproxy::Stream::Upstream,
        )
        .named("ack_delay"),
    )?;
    depot.step(Msg::new("step.ack_delayed").arg("ms", ACK_DELAY_MS as i64));
    // What the records are while the email is sent (a reservation, if any): the store is the
    // next write to them.
    let before = depot.records(&job).await?;
    hold.release();
    let started = Instant::now();
    let stored = loop {
        let now = depot.records(&job).await?;
        if !now.is_empty() && now != before {
            break true;
        }
        if depot.acked(&id).await? || started.elapsed() > STAGING_LIMIT {
            break false;
        }
        tokio::time::sleep(RECORD_POLL).await;
    };
    // The link first: the XACK still in the proxy's delay goes with its connection, and while the
    // link is down A cannot connect again to send another. Then A is killed, and the link healed
    // for B.
    depot.redis_hop.set_enabled(false).await?;
    depot.kill_consumer("A").await;
    let _ = depot.redis_hop.remove_toxic("ack_delay");
    depot.redis_hop.set_enabled(true).await?;
    if !stored {
        let acked = depot.acked(&id).await?;
        depot.step(Msg::new(if acked {
            "step.acked_unstored"
        } else {
            "step.nothing_stored"
        }));
        return depot
            .explained(&job, Verdict::Fail(fail("no_record")))
            .await;
    }
    if depot.acked(&id).await? {
        return Ok(Verdict::Unknown(Msg::new("unknown.ack_landed")));
    }
    depot.step(Msg::new("step.stored_not_acked"));
    depot.start_consumer("B").await?;
    let acked = depot.wait_acked(&[&id]).await?;
    let emails = depot.emails(&job).await?;
    judged!(one_email(&emails));
    if !acked {
        return Ok(Verdict::Fail(
            fail("never_claimed").arg("ms", CLAIM_IDLE_MS as i64),
        ));
    }
    Ok(Verdict::Pass)
}

async fn redelivered(depot: &mut Depot) -> Checked {
    depot.start_consumer("A").await?;
    let job = Job::new(3, 31);
    let again = job.delivered_as(32);
    let first = depot.publish(&job).await?;
    let second = depot.publish(&again).await?;
    let acked = depot.wait_acked(&[&first, &second]).await?;
    depot.wait_emails(&job, 1).await?;
    let emails = depot.emails(&job).await?;
    if let Err(verdict) = one_email(&emails) {
        return depot.explained(&job, verdict).await;
    }
    if !acked {
        return Ok(Verdict::Fail(fail("never_acked")));
    }
    Ok(Verdict::Pass)
}

async fn new_version(depot: &mut Depot) -> Checked {
    depot.start_consumer("A").await?;
    let v1 = Job::new(4, 41);
    let v2 = Job {
        version: 2,
        ..v1.delivered_as(42)
    };
    let first = depot.publish(&v1).await?;
    let second = depot.publish(&v2).await?;
    let acked = depot.wait_acked(&[&first, &second]).await?;
    depot.wait_emails(&v1, 1).await?;
    depot.wait_emails(&v2, 1).await?;
    let one = depot.emails(&v1).await?;
    let two = depot.emails(&v2).await?;
    if two.is_empty() {
        return Ok(Verdict::Fail(fail("new_version_not_sent")));
    }
    judged!(one_email(&one));
    judged!(one_email(&two));
    if !acked {
        return Ok(Verdict::Fail(fail("never_acked")));
    }
    Ok(Verdict::Pass)
}

async fn changed_recipient(depot: &mut Depot) -> Checked {
    depot.start_consumer("A").await?;
    let job = Job::new(5, 51);
    let first = depot.publish(&job).await?;
    if !depot.wait_acked(&[&first]).await? {
        return Ok(Verdict::Fail(fail("never_acked")));
    }
    let other = Job {
        email: "boris@example.com".to_string(),
        ..job.delivered_as(52)
    };
    let second = depot.publish(&other).await?;
    // Settled (acked, refused for good), or tried and claimed again: either way, decided.
    let deliveries = depot.wait_delivered(&second, 2).await?;
    depot.step(match deliveries {
        None => Msg::new("step.settled"),
        Some(n) => Msg::new("step.pending").arg("count", n as i64),
    });
    let emails = depot.emails(&job).await?;
    if emails.iter().any(|e| e.to == other.email) {
        return Ok(Verdict::Fail(fail("recipient_changed_sent")));
    }
    judged!(one_email(&emails));
    Ok(Verdict::Pass)
}

async fn in_progress_duplicate(depot: &mut Depot) -> Checked {
    depot.start_consumer("A").await?;
    let job = Job::new(6, 61);
    let hold = depot.checkpoints.hold(mailer::SENT);
    let first = depot.publish(&job).await?;
    if hold.entered(STAGING_LIMIT).await.is_err() {
        return Ok(Verdict::Unknown(Msg::new("unknown.never_sent")));
    }
    depot.step(Msg::new("step.held").arg("who", "A"));
    // A is inside the mailer: the duplicate can only be B's.
    depot.start_consumer("B").await?;
    let again = job.delivered_as(62);
    let second = depot.publish(&again).await?;
    // B took it, and took it again after its idle time: its first attempt is over.
    let deliveries = depot.wait_delivered(&second, 2).await?;
    let emails_meanwhile = depot.emails(&job).await?;
    let verdict = match deliveries {
        _ if emails_meanwhile.len() > 1 => Some(
            depot
                .explained(
                    &job,
                    Verdict::Fail(fail("emails").arg("count", emails_meanwhile.len())),
                )
                .await?,
        ),
        None => Some(Verdict::Fail(fail("duplicate_acked"))),
        Some(n) if n < 2 => Some(Verdict::Fail(
            fail("never_claimed").arg("ms", CLAIM_IDLE_MS as i64),
        )),
        Some(n) => {
            depot.step(Msg::new("step.pending").arg("count", n as i64));
            None
        }
    };
    depot.step(Msg::new("step.release").arg("who", "A"));
    hold.release();
    if let Some(verdict) = verdict {
        return Ok(verdict);
    }
    let acked = depot.wait_acked(&[&first, &second]).await?;
    let emails = depot.emails(&job).await?;
    judged!(one_email(&emails));
    if !acked {
        return Ok(Verdict::Fail(fail("never_settled")));
    }
    Ok(Verdict::Pass)
}

async fn ack_after_send(depot: &mut Depot) -> Checked {
    depot.start_consumer("A").await?;
    let job = Job::new(7, 71);
    let hold = depot.checkpoints.hold(mailer::SENT);
    let id = depot.publish(&job).await?;
    if hold.entered(STAGING_LIMIT).await.is_err() {
        return Ok(Verdict::Unknown(Msg::new("unknown.never_sent")));
    }
    depot.step(Msg::new("step.held").arg("who", "A"));
    let acked_early = depot.acked(&id).await?;
    depot.step(Msg::new("step.release").arg("who", "A"));
    hold.release();
    if acked_early {
        return Ok(Verdict::Fail(fail("acked_before_send")));
    }
    let acked = depot.wait_acked(&[&id]).await?;
    if !acked {
        return Ok(Verdict::Fail(fail("never_acked")));
    }
    if depot.records(&job).await?.is_empty() {
        return depot
            .explained(&job, Verdict::Fail(fail("acked_unstored")))
            .await;
    }
    let emails = depot.emails(&job).await?;
    judged!(one_email(&emails));
    Ok(Verdict::Pass)
}

impl World for Depot {
    fn schedule(&mut self) -> &mut Vec<Line> {
        &mut self.schedule
    }

    async fn check(&mut self, name: &str) -> Checked {
        run(name, self).await
    }

    async fn after(&mut self) {
        self.stop_consumers().await;
        let _ = self.redis_hop.set_enabled(true).await;
    }

    /// Each consumer's output is its own (they are started for the check).
    async fn output(&self, _mark: &Mark) -> Option<String> {
        self.consumers_output().await
    }

    async fn close(mut self) {
        self.stop_consumers().await;
        self.mailer.stop().await;
    }
}
