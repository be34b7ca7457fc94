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

use lab_core::Msg;
use lab_services::mailer;
use lab_services::spec::ServiceEnv;
use redis::aio::MultiplexedConnection;
use serde::Deserialize;

use crate::charge_once::with_payments_space;
use crate::error::ExerciseError;
use crate::exercise::{Check, CheckOptions, Checked, Checks, Exercise, Setup, Subject};
use crate::guest_env::GuestEnv;
use crate::judgement::{Judged, broke, fail, undecided, unknown};
use crate::lab_side::{STAGING_LIMIT, glob_escape, scan};
use crate::payment::TENANT;
use crate::rig::{Program, Rig, World, run_checks};

pub static EXERCISE: Exercise = Exercise {
    name: "invoice-consumer",
    lesson: "payments",
    needs: lab_infra::Needs::REDIS,
    langs: &["python", "rust"],
    rust_uses_idem: true,
    checks: &CHECKS,
    open: |setup| Box::pin(open(setup)),
};

static CHECKS: Checks<InvoiceConsumer> = Checks(&[
    Check::new("one-email", |w| Box::pin(one_email_check(w))),
    Check::new("ack-lost", |w| Box::pin(ack_lost(w)))
        .restarts()
        .starter_fails(),
    Check::new("redelivered", |w| Box::pin(redelivered(w))).starter_fails(),
    Check::new("new-version", |w| Box::pin(new_version(w))),
    Check::new("changed-recipient", |w| Box::pin(changed_recipient(w))).starter_fails(),
    Check::new("in-progress-duplicate", |w| {
        Box::pin(in_progress_duplicate(w))
    })
    .starter_fails(),
    Check::new("ack-after-send", |w| Box::pin(ack_after_send(w))).starter_fails(),
]);

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
struct Email {
    email_id: String,
    to: String,
    subject: String,
}

/// What the invoice-consumer checks work with.
pub struct InvoiceConsumer {
    rig: Rig,
    /// `lab:<run>:`: the streams' prefix.
    run_prefix: String,
    /// `KEY_PREFIX`: the consumers' records.
    key_prefix: String,
    redis: MultiplexedConnection,
    /// The consumers → Redis.
    redis_hop: faultproxy::Proxy,
    mailer: String,
    /// This check's stream.
    stream: String,
}

async fn open(setup: Setup<'_>) -> Result<Checked, ExerciseError> {
    let Setup {
        subject,
        servers,
        options,
        on_report,
    } = setup;
    let Subject::Program { dir, manifest } = subject else {
        return Err(ExerciseError::TargetNotApplicable {
            exercise: "invoice-consumer",
            why: "a consumer per check, with its link to Redis behind the fault proxy",
        });
    };
    with_payments_space(servers, async |space, redis, redis_addr| {
        let world = InvoiceConsumer::open(
            &space.run_id,
            &space.prefix,
            redis,
            redis_addr,
            Program { dir, manifest },
            options,
        )
        .await?;
        Ok(Checked::Reports(
            run_checks(&CHECKS, world, options, on_report).await?,
        ))
    })
    .await
}

/// One pending entry: its id, and how often it was delivered.
#[derive(Debug, Clone)]
struct Pending {
    id: String,
    deliveries: u64,
}

impl InvoiceConsumer {
    /// Starts the mailer and the consumers' link to Redis (the consumers start per check).
    async fn open(
        run: &str,
        run_prefix: &str,
        redis: MultiplexedConnection,
        redis_addr: &str,
        program: Program,
        options: &CheckOptions,
    ) -> Result<InvoiceConsumer, ExerciseError> {
        let mut rig = Rig::new(run, options, Some(program));
        rig.build().await?;
        let env = ServiceEnv::default().with_checkpoints(rig.checkpoints.clone());
        let mailer = rig.launch(&mailer::SPEC, env)?;
        let redis_hop = rig.proxy("redis", redis_addr).await?;
        Ok(InvoiceConsumer {
            rig,
            run_prefix: run_prefix.to_string(),
            key_prefix: format!("{run_prefix}idempotency:"),
            redis,
            redis_hop,
            mailer,
            stream: String::new(),
        })
    }

    fn step(&mut self, msg: Msg) {
        self.rig.step(msg);
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
            .await?;
        Ok(())
    }

    /// Starts consumer `who` on this check's stream.
    async fn start_consumer(&mut self, who: &str) -> Result<(), ExerciseError> {
        let env = GuestEnv {
            redis_url: Some(format!("redis://{}/0", self.redis_hop.listen_addr())),
            key_prefix: Some(self.key_prefix.clone()),
            group: Some(GROUP.to_string()),
            mailer_url: Some(self.mailer.clone()),
            claim_idle_ms: Some(CLAIM_IDLE_MS),
            lease_seconds: Some(LEASE_SECONDS),
            stream: Some(self.stream.clone()),
            consumer: Some(who.to_string()),
            ..self.rig.env()
        };
        self.rig.launch_job(who, env).await?;
        self.step(Msg::new("step.start").arg("who", who));
        Ok(())
    }

    async fn kill_consumer(&mut self, who: &str) {
        self.rig.kill_job(who).await;
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
            .await?;
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
            .await?;
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
            .await?;
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
    async fn emails(&mut self, job: &Job) -> Result<Vec<Email>, ExerciseError> {
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

    async fn list_emails(&self, job: &Job) -> Result<Vec<Email>, ExerciseError> {
        #[derive(Deserialize)]
        struct Listed {
            emails: Vec<Email>,
        }
        let listed: Listed = self
            .rig
            .http
            .get(format!("{}/emails", self.mailer))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(ExerciseError::http("mailer's list"))?
            .json()
            .await
            .map_err(ExerciseError::http("mailer's list"))?;
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
    async fn explained(&mut self, job: &Job, otherwise: Judged) -> Judged {
        if otherwise.is_ok() {
            return otherwise;
        }
        let by_delivery = self.keys_naming_delivery(job).await?;
        match by_delivery.first() {
            Some(key) => fail(broke("delivery_key").arg("key", key.as_str())),
            None => otherwise,
        }
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
                .await?;
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
}

impl World for InvoiceConsumer {
    fn rig(&mut self) -> &mut Rig {
        &mut self.rig
    }

    async fn after(&mut self) {
        let _ = self.redis_hop.remove_toxic("ack_delay");
        let _ = self.redis_hop.set_enabled(true).await;
    }

    async fn close(self) {
        self.rig.close().await;
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

/// Exactly one email for `job`'s invoice.
fn one_email(emails: &[Email]) -> Judged {
    match emails.len() {
        1 => Ok(()),
        0 => fail(broke("no_email")),
        n => fail(broke("emails").arg("count", n)),
    }
}

async fn one_email_check(w: &mut InvoiceConsumer) -> Judged {
    w.new_stream("one-email").await?;
    w.start_consumer("A").await?;
    let job = Job::new(1, 1);
    let id = w.publish(&job).await?;
    let acked = w.wait_acked(&[&id]).await?;
    w.wait_emails(&job, 1).await?;
    let emails = w.emails(&job).await?;
    one_email(&emails)?;
    if !acked {
        return fail(broke("never_acked"));
    }
    Ok(())
}

async fn ack_lost(w: &mut InvoiceConsumer) -> Judged {
    w.new_stream("ack-lost").await?;
    w.start_consumer("A").await?;
    let job = Job::new(2, 2);
    let hold = w.rig.checkpoints.hold(mailer::SENT);
    let id = w.publish(&job).await?;
    if hold.entered(STAGING_LIMIT).await.is_err() {
        return unknown(undecided("never_sent"));
    }
    // From now on every command of A's reaches Redis ACK_DELAY_MS late: the store, and the
    // XACK A sends only once the store has answered.
    w.redis_hop.add_toxic(
        faultproxy::Toxic::new(
            faultproxy::ToxicKind::Latency {
                latency: ACK_DELAY_MS,
                jitter: 0,
            },
            faultproxy::Stream::Upstream,
        )
        .named("ack_delay"),
    )?;
    w.step(Msg::new("step.ack_delayed").arg("ms", ACK_DELAY_MS));
    // What the records are while the email is sent (a reservation, if any): the store is the
    // next write to them.
    let before = w.records(&job).await?;
    hold.release();
    let started = Instant::now();
    let stored = loop {
        let now = w.records(&job).await?;
        if !now.is_empty() && now != before {
            break true;
        }
        if w.acked(&id).await? || started.elapsed() > STAGING_LIMIT {
            break false;
        }
        tokio::time::sleep(RECORD_POLL).await;
    };
    // The link first: the XACK still in the proxy's delay goes with its connection, and while the
    // link is down A cannot connect again to send another. Then A is killed, and the link healed
    // for B.
    w.redis_hop.set_enabled(false).await?;
    w.kill_consumer("A").await;
    let _ = w.redis_hop.remove_toxic("ack_delay");
    w.redis_hop.set_enabled(true).await?;
    if !stored {
        let acked = w.acked(&id).await?;
        w.step(Msg::new(if acked {
            "step.acked_unstored"
        } else {
            "step.nothing_stored"
        }));
        return w.explained(&job, fail(broke("no_record"))).await;
    }
    if w.acked(&id).await? {
        return unknown(undecided("ack_landed"));
    }
    w.step(Msg::new("step.stored_not_acked"));
    w.start_consumer("B").await?;
    let acked = w.wait_acked(&[&id]).await?;
    let emails = w.emails(&job).await?;
    one_email(&emails)?;
    if !acked {
        return fail(broke("never_claimed").arg("ms", CLAIM_IDLE_MS));
    }
    Ok(())
}

async fn redelivered(w: &mut InvoiceConsumer) -> Judged {
    w.new_stream("redelivered").await?;
    w.start_consumer("A").await?;
    let job = Job::new(3, 31);
    let again = job.delivered_as(32);
    let first = w.publish(&job).await?;
    let second = w.publish(&again).await?;
    let acked = w.wait_acked(&[&first, &second]).await?;
    w.wait_emails(&job, 1).await?;
    let emails = w.emails(&job).await?;
    let judged = one_email(&emails);
    w.explained(&job, judged).await?;
    if !acked {
        return fail(broke("never_acked"));
    }
    Ok(())
}

async fn new_version(w: &mut InvoiceConsumer) -> Judged {
    w.new_stream("new-version").await?;
    w.start_consumer("A").await?;
    let v1 = Job::new(4, 41);
    let v2 = Job {
        version: 2,
        ..v1.delivered_as(42)
    };
    let first = w.publish(&v1).await?;
    let second = w.publish(&v2).await?;
    let acked = w.wait_acked(&[&first, &second]).await?;
    w.wait_emails(&v1, 1).await?;
    w.wait_emails(&v2, 1).await?;
    let one = w.emails(&v1).await?;
    let two = w.emails(&v2).await?;
    if two.is_empty() {
        return fail(broke("new_version_not_sent"));
    }
    one_email(&one)?;
    one_email(&two)?;
    if !acked {
        return fail(broke("never_acked"));
    }
    Ok(())
}

async fn changed_recipient(w: &mut InvoiceConsumer) -> Judged {
    w.new_stream("changed-recipient").await?;
    w.start_consumer("A").await?;
    let job = Job::new(5, 51);
    let first = w.publish(&job).await?;
    if !w.wait_acked(&[&first]).await? {
        return fail(broke("never_acked"));
    }
    let other = Job {
        email: "boris@example.com".to_string(),
        ..job.delivered_as(52)
    };
    let second = w.publish(&other).await?;
    // Settled (acked, refused for good), or tried and claimed again: either way, decided.
    let deliveries = w.wait_delivered(&second, 2).await?;
    w.step(match deliveries {
        None => Msg::new("step.settled"),
        Some(n) => Msg::new("step.pending").arg("count", n),
    });
    let emails = w.emails(&job).await?;
    if emails.iter().any(|e| e.to == other.email) {
        return fail(broke("recipient_changed_sent"));
    }
    one_email(&emails)
}

async fn in_progress_duplicate(w: &mut InvoiceConsumer) -> Judged {
    w.new_stream("in-progress-duplicate").await?;
    w.start_consumer("A").await?;
    let job = Job::new(6, 61);
    let hold = w.rig.checkpoints.hold(mailer::SENT);
    let first = w.publish(&job).await?;
    if hold.entered(STAGING_LIMIT).await.is_err() {
        return unknown(undecided("never_sent"));
    }
    w.step(Msg::new("step.held").arg("who", "A"));
    // A is inside the mailer: the duplicate can only be B's.
    w.start_consumer("B").await?;
    let again = job.delivered_as(62);
    let second = w.publish(&again).await?;
    // B took it, and took it again after its idle time: its first attempt is over.
    let deliveries = w.wait_delivered(&second, 2).await?;
    let emails_meanwhile = w.emails(&job).await?;
    let meanwhile: Judged = match deliveries {
        _ if emails_meanwhile.len() > 1 => {
            let judged = fail(broke("emails").arg("count", emails_meanwhile.len()));
            w.explained(&job, judged).await
        }
        None => fail(broke("duplicate_acked")),
        Some(n) if n < 2 => fail(broke("never_claimed").arg("ms", CLAIM_IDLE_MS)),
        Some(n) => {
            w.step(Msg::new("step.pending").arg("count", n));
            Ok(())
        }
    };
    w.step(Msg::new("step.release").arg("who", "A"));
    hold.release();
    meanwhile?;
    let acked = w.wait_acked(&[&first, &second]).await?;
    let emails = w.emails(&job).await?;
    one_email(&emails)?;
    if !acked {
        return fail(broke("never_settled"));
    }
    Ok(())
}

async fn ack_after_send(w: &mut InvoiceConsumer) -> Judged {
    w.new_stream("ack-after-send").await?;
    w.start_consumer("A").await?;
    let job = Job::new(7, 71);
    let hold = w.rig.checkpoints.hold(mailer::SENT);
    let id = w.publish(&job).await?;
    if hold.entered(STAGING_LIMIT).await.is_err() {
        return unknown(undecided("never_sent"));
    }
    w.step(Msg::new("step.held").arg("who", "A"));
    let acked_early = w.acked(&id).await?;
    w.step(Msg::new("step.release").arg("who", "A"));
    hold.release();
    if acked_early {
        return fail(broke("acked_before_send"));
    }
    if !w.wait_acked(&[&id]).await? {
        return fail(broke("never_acked"));
    }
    if w.records(&job).await?.is_empty() {
        return w.explained(&job, fail(broke("acked_unstored"))).await;
    }
    let emails = w.emails(&job).await?;
    one_email(&emails)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judgement::Stop;

    #[test]
    fn stream_ids_order_by_time_then_sequence() {
        assert!(entry_order("1700000000000-1") > entry_order("1700000000000-0"));
        assert!(entry_order("1700000000001-0") > entry_order("1700000000000-9"));
        assert_eq!(entry_order("5"), (5, 0));
    }

    #[test]
    fn the_groups_last_delivered_id_is_read_from_xinfo() {
        let group = redis::Value::Array(vec![
            redis::Value::BulkString(b"name".to_vec()),
            redis::Value::BulkString(b"invoicing".to_vec()),
            redis::Value::BulkString(b"last-delivered-id".to_vec()),
            redis::Value::BulkString(b"1-2".to_vec()),
        ]);
        assert_eq!(last_delivered(&group).as_deref(), Some("1-2"));
        assert_eq!(last_delivered(&redis::Value::Nil), None);
    }

    #[test]
    fn one_invoice_one_email() {
        let email = |to: &str| Email {
            email_id: "e1".into(),
            to: to.into(),
            subject: "Invoice x v1".into(),
        };
        assert!(one_email(&[email("a")]).is_ok());
        for (emails, key) in [
            (vec![], "broke.no_email"),
            (vec![email("a"), email("a")], "broke.emails"),
        ] {
            let Err(Stop::Verdict(verdict)) = one_email(&emails) else {
                panic!("{key} passed")
            };
            assert_eq!(verdict.reason().unwrap().key, key);
        }
    }
}
