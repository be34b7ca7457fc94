//! Exercise `invoice-consumer` (the payments lesson, background jobs): the learner's consumer of
//! a Redis Stream, in a consumer group the lab creates, that sends each invoice through the
//! lab's mailer once per invoice version (the lesson's `send_invoice_once`). The lab publishes
//! the jobs, holds the mailer at its checkpoint, kills consumers, cuts their link to Redis, and
//! reads the oracle itself: the mailer's list of emails, and the group's pending entries.
//!
//! ```text
//!   the lab ──XADD──► stream (group `invoicing`) ◄── XREADGROUP / XAUTOCLAIM / XACK, a door each ── consumers A, B
//!   the mailer (emails, counted) ◄───────────────────────────────────────────────────── POST /emails
//! ```
//!
//! | check                   | the schedule                                                           | the invariant                                      |
//! |-------------------------|------------------------------------------------------------------------|----------------------------------------------------|
//! | `one-email`             | one job                                                                | one email; the entry acked                         |
//! | `ack-lost`              | every XACK of A's held at A's door; A killed with it held (whenever A acks: before its send, after its store); B starts | B claims the entry and settles it: one email, acked; a fail names what was stored when the ack was lost |
//! | `redelivered`           | the same invoice published twice, with two delivery ids                | one email (the key names the invoice, not the delivery) |
//! | `new-version`           | version 1, then version 2                                              | two emails                                         |
//! | `changed-recipient`     | version 1 to one address, then to another (the fingerprint's one field changed alone) | refused by the fingerprint: no second email |
//! | `in-progress-duplicate` | A held inside the mailer; the same job again (the same delivery), taken by B | B does not ack it while A sends, claims it again, and settles it later: one email, both acked |
//! | `ack-after-send`        | A's XACK held at its door and its send held inside the mailer, whichever comes first; the send let go | the XACK comes after the send, and when it comes a record holds the email's id: send, store, ack, in that order |
//!
//! `ack-after-send` tells every order of the three effects apart: an XACK held before the email
//! was sent (ack → send → store, ack → store → send, store → ack → send) is `acked_before_send`;
//! one after the send with the email's id stored only once the XACK was let go (send → ack →
//! store) is `acked_before_store`; one after the send with the records as they were before it
//! (store → send → ack) is `stored_before_send`; and no record with the id at all,
//! `acked_unstored`.
//!
//! **Doors.** Each consumer reaches Redis through a door of its own ([`door`]): a proxy that
//! reads its commands, holds its XACKs while the check asks, and drops its connections when
//! it is killed (a held XACK never reaches Redis). A hold is aimed by the door it is armed on;
//! the mailer's hold (its `mailer.sent` checkpoint, the first caller) is armed while A is the
//! only consumer running. The lab confirms each moment it stages: the hold entered (or the
//! check is unknown: `never_sent`, `no_ack`), the entry not acked after A's death with its XACK
//! held (`ack_landed`), A's held call still waiting when the duplicate is judged (else
//! `gave_up_held`: A's own timeout ended the moment). An ack the door cannot hold (inside a
//! script) or can only hold with what it stores (in `MULTI … EXEC`) is said, not judged.
//!
//! **Nobody claims it** is read from the group's pending list, not from a clock of the lab's:
//! the entry has sat idle for `UNCLAIMED_IDLE_MS` (five claim intervals) since its last
//! delivery. The lab says so then, while A is still held inside the mailer (short of a mailer
//! client's usual timeout), instead of waiting out a bound.
//!
//! **Stored** means a record of the invoice (a key under `KEY_PREFIX` naming
//! `<order hex>.v<version>`, any type) whose value holds the email's id the mailer answered: the
//! lab does not read idempotency-kit's format, or a design's own.
//!
//! Every check has a stream of its own (`lab:<run>:invoices.<check>`) and its own consumers,
//! started for it and stopped after it, so nothing one check leaves pending reaches the next.
//!
//! There is no visibility timeout in Redis Streams: an entry delivered to a consumer that died
//! stays in the group's pending list until some consumer claims it (`XAUTOCLAIM` with a minimum
//! idle time, `CLAIM_IDLE_MS`). The lab's oracle for "acked" is that pending list.

use std::time::{Duration, Instant};

use lab_core::Msg;
use lab_services::mailer::{self, Email};
use lab_services::spec::ServiceEnv;
use redis::aio::MultiplexedConnection;

use crate::charge_once::with_payments_space;
use crate::error::ExerciseError;
use crate::exercise::{Check, CheckOptions, Checked, Checks, Exercise, Setup, Subject};
use crate::guest_env::GuestEnv;
use crate::judgement::{Judged, broke, fail, undecided, unknown};
use crate::lab_side::{STAGING_LIMIT, glob_escape, read_key, scan};
use crate::payment::TENANT;
use crate::rig::{Program, Rig, World, run_checks};
use door::{Command, Door};

mod door;

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
/// How long the lab waits, after releasing an ack it held, for the consumer to store its result
/// or move on to the stream (`ack-after-send`): a consumer that stores after its ack does so at
/// once.
const MOVE_ON_LIMIT: Duration = Duration::from_secs(5);
/// How long an entry must sit idle past its delivery before the lab says nobody claims it:
/// five claim intervals (a consumer's claim loop runs every few hundred milliseconds). Short of
/// a mailer client's usual timeout, so that a consumer held inside the mailer meanwhile is
/// still held when the lab judges.
const UNCLAIMED_IDLE_MS: u64 = 5 * CLAIM_IDLE_MS;
/// How often B may claim the entry A's lost ack left pending before the lab judges what it did
/// (`ack-lost`): a consumer that can replay settles it on its first claim.
const CLAIMS_TO_SETTLE: u64 = 2;

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
}

/// What the invoice-consumer checks work with.
pub struct InvoiceConsumer {
    rig: Rig,
    /// `lab:<run>:`: the streams' prefix.
    run_prefix: String,
    /// `KEY_PREFIX`: the consumers' records.
    key_prefix: String,
    redis: MultiplexedConnection,
    /// Redis, as the consumers' doors reach it (`host:port`).
    redis_addr: String,
    /// This check's consumers' doors to Redis, by name.
    doors: Vec<(String, Door)>,
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

/// A record of the consumers', as the lab reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    key: String,
    value: String,
}

/// One pending entry: its id, and how often it was delivered.
#[derive(Debug, Clone)]
struct Pending {
    id: String,
    deliveries: u64,
    /// How long it has sat since it was last delivered or claimed (XPENDING's idle time).
    idle_ms: u64,
}

impl Pending {
    /// Whether it has sat unclaimed for [`UNCLAIMED_IDLE_MS`]: nobody claims it.
    fn unclaimed(&self) -> bool {
        self.idle_ms >= UNCLAIMED_IDLE_MS
    }
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
        Ok(InvoiceConsumer {
            rig,
            run_prefix: run_prefix.to_string(),
            key_prefix: format!("{run_prefix}idempotency:"),
            redis,
            redis_addr: redis_addr.to_string(),
            doors: Vec::new(),
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

    /// Starts consumer `who` on this check's stream, with a door of its own to Redis.
    async fn start_consumer(&mut self, who: &str) -> Result<(), ExerciseError> {
        let door = Door::open(&self.redis_addr).await?;
        let env = GuestEnv {
            redis_url: Some(door.url()),
            key_prefix: Some(self.key_prefix.clone()),
            group: Some(GROUP.to_string()),
            mailer_url: Some(self.mailer.clone()),
            claim_idle_ms: Some(CLAIM_IDLE_MS),
            lease_seconds: Some(LEASE_SECONDS),
            stream: Some(self.stream.clone()),
            consumer: Some(who.to_string()),
            ..self.rig.env()
        };
        self.doors.push((who.to_string(), door));
        self.rig.launch_job(who, env).await?;
        self.step(Msg::new("step.start").arg("who", who));
        Ok(())
    }

    /// Consumer `who`'s door (it was started in this check).
    fn door(&self, who: &str) -> &Door {
        self.doors
            .iter()
            .find(|(name, _)| name == who)
            .map(|(_, door)| door)
            .expect("the consumer was started in this check")
    }

    /// Kills consumer `who` (SIGKILL, with its process group), then drops its connections at its
    /// door: what it had sent and the door still held never reaches Redis.
    async fn kill_consumer(&mut self, who: &str) {
        self.rig.kill_job(who).await;
        self.door(who).cut();
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
            .map(|(id, _consumer, idle_ms, deliveries)| Pending {
                id,
                deliveries,
                idle_ms,
            })
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

    /// Waits, at most [`MOVE_ON_LIMIT`], until consumer `who` reads the stream again after the
    /// last ack it sent: it is done with what it acked. A consumer that acks before it sends
    /// has then sent too, so a second email it owes is counted, not missed. (Without this the
    /// lab read the mailer between a starter's ack of a redelivered job and its send of it, saw
    /// one email, and passed `redelivered`.) A consumer whose ack the door did not see (one
    /// inside a script) is not waited for.
    async fn wait_moved_on(&self, who: &str) {
        let door = self.door(who);
        door.wait(MOVE_ON_LIMIT, |log| {
            let Some(last_ack) = log.sent.iter().rposition(Command::acks) else {
                return Some(());
            };
            log.read_stream_since(last_ack).then_some(())
        })
        .await;
    }

    /// Entry `id` while it is pending; `None` once it is not (acked).
    async fn pending_entry(&mut self, id: &str) -> Result<Option<Pending>, ExerciseError> {
        Ok(self.pending().await?.into_iter().find(|p| p.id == id))
    }

    /// Waits until entry `id` was delivered at least `times` times (claimed again), or acked, or
    /// has sat unclaimed for [`UNCLAIMED_IDLE_MS`]; its deliveries, `None` if it was acked.
    async fn wait_delivered(&mut self, id: &str, times: u64) -> Result<Option<u64>, ExerciseError> {
        let started = Instant::now();
        loop {
            match self.pending().await?.into_iter().find(|p| p.id == id) {
                Some(p)
                    if p.deliveries >= times
                        || p.unclaimed()
                        || started.elapsed() > SETTLE_LIMIT =>
                {
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
        let emails = lab_services::admin::Admin::new(&self.rig.http, &self.mailer)
            .emails()
            .await
            .map_err(ExerciseError::http("mailer's list"))?;
        Ok(emails
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
    /// order (any version, as hex or as a UUID) or its delivery, with its value as text (any type
    /// of value: the lab does not read idempotency-kit's format, or a design's own; it looks for
    /// the email's id in it). Wider than the contract's key, so that a check of the order of
    /// effects judges that order, not the key (other checks judge the key).
    async fn records(&mut self, job: &Job) -> Result<Vec<Record>, ExerciseError> {
        let mut keys = Vec::new();
        for name in [
            job.order.replace('-', ""),
            job.order.clone(),
            job.delivery.replace('-', ""),
            job.delivery.clone(),
        ] {
            let pattern = format!("{}*{name}*", glob_escape(&self.key_prefix));
            keys.extend(scan(&mut self.redis, &pattern).await?);
        }
        keys.sort();
        keys.dedup();
        let mut records = Vec::new();
        for key in keys {
            let read = read_key(&mut self.redis, &key).await?;
            if read.pttl != -2 {
                records.push(Record {
                    key,
                    value: read.value,
                });
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
        // The consumers first (their output is kept for the report), then their doors: a
        // consumer never sees its link to Redis go before it is told to stop.
        for (who, door) in self.doors.drain(..) {
            if let Some(job) = self.rig.job(&who) {
                job.stop().await;
            }
            door.close();
        }
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
    w.wait_moved_on("A").await;
    w.wait_emails(&job, 1).await?;
    let emails = w.emails(&job).await?;
    one_email(&emails)?;
    if !acked {
        return fail(broke("never_acked"));
    }
    Ok(())
}

/// What the lab saw when it lost A's ack (`ack-lost`): the emails sent for the invoice by then,
/// and whether a record held the email's id (the result stored).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Loss {
    emails: usize,
    stored: bool,
}

/// How the entry ended after B started (`ack-lost`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Aftermath {
    Acked,
    /// Still pending, delivered this many times (1: A's delivery only, nobody claimed it).
    Pending(u64),
}

/// `ack-lost`'s verdict: one email, the entry settled by B; a fail names what B did and what
/// was stored when A's ack was lost.
fn judge_ack_lost(loss: &Loss, emails: usize, aftermath: &Aftermath) -> Judged {
    if emails > 1 {
        return fail(if loss.stored {
            broke("resent_stored").arg("count", emails)
        } else {
            broke("resent_unstored").arg("count", emails)
        });
    }
    match aftermath {
        Aftermath::Pending(n) if *n <= 1 => fail(broke("never_claimed").arg("ms", CLAIM_IDLE_MS)),
        Aftermath::Pending(n) if !loss.stored && loss.emails > 0 => {
            fail(broke("lost_unstored").arg("count", *n))
        }
        Aftermath::Pending(n) => fail(broke("claimed_not_settled").arg("count", *n)),
        Aftermath::Acked if emails == 0 => fail(broke("job_lost")),
        Aftermath::Acked => Ok(()),
    }
}

async fn ack_lost(w: &mut InvoiceConsumer) -> Judged {
    w.new_stream("ack-lost").await?;
    w.start_consumer("A").await?;
    let job = Job::new(2, 2);
    // Every ack of A's stops at its door: whenever A asks for it (before its send, after its
    // store), it is asked for and has not reached Redis.
    w.door("A").hold_acks();
    let id = w.publish(&job).await?;
    let Some(ack) = w.door("A").held_ack(STAGING_LIMIT).await else {
        if w.acked(&id).await? {
            return unknown(undecided("ack_unseen"));
        }
        return unknown(undecided("no_ack"));
    };
    let emails = w.list_emails(&job).await?;
    let records = w.records(&job).await?;
    let loss = Loss {
        emails: emails.len(),
        stored: emails
            .first()
            .is_some_and(|e| result_stored(&records, &e.email_id)),
    };
    w.step(ack_held("A", &ack, loss.emails, loss.stored));
    if ack.carries_ack {
        // The ack rides in a transaction with what it stores: no ack can be lost alone.
        return unknown(undecided("ack_in_transaction"));
    }
    w.kill_consumer("A").await;
    w.step(Msg::new("step.kill_held").arg("who", "A"));
    if w.acked(&id).await? {
        return unknown(undecided("ack_landed"));
    }
    w.start_consumer("B").await?;
    // B settles the entry, or has claimed it CLAIMS_TO_SETTLE times without settling it.
    let started = Instant::now();
    let aftermath = loop {
        match w.pending_entry(&id).await? {
            None => break Aftermath::Acked,
            Some(p)
                if p.deliveries > CLAIMS_TO_SETTLE
                    || (p.deliveries <= 1 && p.unclaimed())
                    || started.elapsed() > SETTLE_LIMIT =>
            {
                break Aftermath::Pending(p.deliveries);
            }
            Some(_) => tokio::time::sleep(POLL).await,
        }
    };
    match aftermath {
        Aftermath::Pending(n) => w.step(Msg::new("step.pending").arg("count", n)),
        // An entry can be acked before its send (a consumer that acks first): the wait is for
        // the send.
        Aftermath::Acked => w.wait_emails(&job, 1).await?,
    }
    let emails = w.emails(&job).await?;
    judge_ack_lost(&loss, emails.len(), &aftermath)
}

/// The step that says consumer `who`'s ack is held at its door, with the emails sent for the
/// invoice by then, and whether a record held the email's id.
fn ack_held(who: &str, ack: &Command, emails: usize, stored: bool) -> Msg {
    Msg::new(if stored {
        "step.ack_held_stored"
    } else {
        "step.ack_held_unstored"
    })
    .arg("who", who)
    .arg("command", shown_ack(ack))
    .arg("count", emails)
}

/// The held ack, as the schedule shows it: `XACK <stream> <group> <ids>`, or the `EXEC` of a
/// transaction.
fn shown_ack(ack: &Command) -> String {
    if ack.name == "XACK" {
        format!("XACK {}", ack.args.join(" "))
    } else {
        format!("{} (MULTI … XACK …)", ack.name)
    }
}

/// Whether a record holds the email's id (`em_3`, not the start of `em_31`): the send's result,
/// stored.
fn result_stored(records: &[Record], email_id: &str) -> bool {
    records.iter().any(|record| {
        record.value.match_indices(email_id).any(|(at, _)| {
            !record.value[at + email_id.len()..]
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphanumeric())
        })
    })
}

async fn redelivered(w: &mut InvoiceConsumer) -> Judged {
    w.new_stream("redelivered").await?;
    w.start_consumer("A").await?;
    let job = Job::new(3, 31);
    let again = job.delivered_as(32);
    let first = w.publish(&job).await?;
    let second = w.publish(&again).await?;
    let acked = w.wait_acked(&[&first, &second]).await?;
    w.wait_moved_on("A").await;
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
    w.wait_moved_on("A").await;
    w.wait_emails(&v1, 1).await?;
    w.wait_emails(&v2, 1).await?;
    let one = w.emails(&v1).await?;
    let two = w.emails(&v2).await?;
    judge_versions(&one, &two)?;
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
    // Acked is not sent yet: a consumer that acks first sends after (verify saw the Rust
    // starter's one email counted between its ack of the second job and its send to the other
    // address, and pass `changed-recipient`).
    w.wait_moved_on("A").await;
    let emails = w.emails(&job).await?;
    let judged = judge_refusal(&emails, &other.email);
    w.explained(&other, judged).await
}

/// `new-version`: one email for each version; a version 2 not sent is named as such.
fn judge_versions(one: &[Email], two: &[Email]) -> Judged {
    if two.is_empty() {
        return fail(broke("new_version_not_sent"));
    }
    one_email(one)?;
    one_email(two)
}

/// `changed-recipient`: nothing sent to the other address, one email in all.
fn judge_refusal(emails: &[Email], other: &str) -> Judged {
    if emails.iter().any(|e| e.to == other) {
        return fail(broke("recipient_changed_sent"));
    }
    one_email(emails)
}

/// What the lab saw of the second job of `in-progress-duplicate` while A was inside the mailer.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Meanwhile {
    /// Emails for the invoice by then.
    emails: usize,
    /// The duplicate's deliveries, `None` if it was acked.
    deliveries: Option<u64>,
}

/// `in-progress-duplicate`, while A sends: one email, and the duplicate pending and claimed
/// again (its first attempt over, not acked).
fn judge_meanwhile(meanwhile: &Meanwhile) -> Judged {
    match meanwhile.deliveries {
        _ if meanwhile.emails > 1 => fail(broke("emails").arg("count", meanwhile.emails)),
        None => fail(broke("duplicate_acked")),
        Some(n) if n < 2 => fail(broke("never_claimed").arg("ms", CLAIM_IDLE_MS)),
        Some(_) => Ok(()),
    }
}

async fn in_progress_duplicate(w: &mut InvoiceConsumer) -> Judged {
    w.new_stream("in-progress-duplicate").await?;
    w.start_consumer("A").await?;
    let job = Job::new(6, 61);
    // Armed while A is the only consumer: the caller it holds is A.
    let hold = w.rig.checkpoints.hold(mailer::SENT);
    let first = w.publish(&job).await?;
    if hold.entered(STAGING_LIMIT).await.is_err() {
        return unknown(undecided("never_sent"));
    }
    w.step(Msg::new("step.held").arg("who", "A"));
    // A is inside the mailer: the duplicate (the same job published again, the same delivery)
    // can only be B's.
    w.start_consumer("B").await?;
    let second = w.publish(&job).await?;
    // B took it, and took it again after its idle time: its first attempt is over.
    let deliveries = w.wait_delivered(&second, 2).await?;
    let emails = w.emails(&job).await?.len();
    if hold.abandoned(Duration::ZERO).await.is_ok() {
        return unknown(undecided("gave_up_held").arg("who", "A"));
    }
    if let Some(n) = deliveries {
        w.step(Msg::new("step.pending").arg("count", n));
    }
    let meanwhile = judge_meanwhile(&Meanwhile { emails, deliveries });
    w.step(Msg::new("step.release").arg("who", "A"));
    hold.release();
    meanwhile?;
    let acked = w.wait_acked(&[&first, &second]).await?;
    w.wait_moved_on("A").await;
    w.wait_moved_on("B").await;
    let emails = w.emails(&job).await?;
    one_email(&emails)?;
    if !acked {
        return fail(broke("never_settled"));
    }
    Ok(())
}

/// What the records of the invoice were when A's ack came after its send (`ack-after-send`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct AtAck {
    /// A record held the email's id: the result was stored.
    stored: bool,
    /// Any record of the invoice existed.
    recorded: bool,
    /// The records changed after the email was sent.
    written_after_send: bool,
    /// A record held the email's id once A had moved on after its ack.
    stored_later: bool,
}

/// `ack-after-send`'s verdict on an ack that came after the send: the result stored by then.
fn judge_ack_order(at: &AtAck, email_id: &str) -> Judged {
    if at.stored {
        return Ok(());
    }
    if at.stored_later {
        return fail(broke("acked_before_store").arg("email", email_id));
    }
    if at.recorded && !at.written_after_send {
        return fail(broke("stored_before_send").arg("email", email_id));
    }
    fail(broke("acked_unstored").arg("email", email_id))
}

async fn ack_after_send(w: &mut InvoiceConsumer) -> Judged {
    w.new_stream("ack-after-send").await?;
    w.start_consumer("A").await?;
    let job = Job::new(7, 71);
    // Both armed while A is the only consumer: A's acks stop at its door, and its send is held
    // inside the mailer, whichever comes first.
    w.door("A").hold_acks();
    let hold = w.rig.checkpoints.hold(mailer::SENT);
    let id = w.publish(&job).await?;
    let acked_first = tokio::select! {
        entered = hold.entered(STAGING_LIMIT) => match entered {
            Ok(()) => None,
            Err(_) => return unknown(undecided("never_sent")),
        },
        ack = w.door("A").held_ack(STAGING_LIMIT) => match ack {
            Some(ack) => Some(ack),
            None => return unknown(undecided("never_sent")),
        },
    };
    if let Some(ack) = acked_first {
        w.step(ack_held("A", &ack, w.count_emails(&job).await?, false));
        return fail(broke("acked_before_send"));
    }
    w.step(Msg::new("step.held").arg("who", "A"));
    if w.acked(&id).await? {
        return fail(broke("acked_before_send"));
    }
    let before = w.records(&job).await?;
    w.step(Msg::new("step.release").arg("who", "A"));
    hold.release();
    let Some(ack) = w.door("A").held_ack(STAGING_LIMIT).await else {
        if w.acked(&id).await? {
            return unknown(undecided("ack_unseen"));
        }
        return unknown(undecided("no_ack"));
    };
    let email_id = w
        .list_emails(&job)
        .await?
        .first()
        .map(|e| e.email_id.clone())
        .unwrap_or_default();
    let records = w.records(&job).await?;
    let mut at = AtAck {
        stored: result_stored(&records, &email_id),
        recorded: !records.is_empty(),
        written_after_send: records != before,
        stored_later: false,
    };
    w.step(ack_held("A", &ack, 1, at.stored));
    // An ack inside a transaction lands with what the transaction stores: judged once it has.
    let transaction = ack.carries_ack;
    if !at.stored || transaction {
        let moved_on = w.door("A").sent_count();
        w.door("A").release();
        let started = Instant::now();
        loop {
            // Whether A has moved on first, the records then: what A stored before it moved on
            // is in them. (Read the other way round, a store and a move that both came between
            // the two reads would be taken for a move without a store.)
            let moved = w
                .door("A")
                .wait(Duration::ZERO, |log| {
                    log.read_stream_since(moved_on).then_some(())
                })
                .await
                .is_some();
            let records = w.records(&job).await?;
            at.stored_later = result_stored(&records, &email_id);
            if at.stored_later || moved || started.elapsed() > MOVE_ON_LIMIT {
                break;
            }
            tokio::time::sleep(POLL).await;
        }
        if transaction {
            at.stored = at.stored_later;
        }
    }
    judge_ack_order(&at, &email_id)?;
    w.door("A").release();
    if !w.wait_acked(&[&id]).await? {
        return fail(broke("never_acked"));
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
            key: None,
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

    /// The key of the fail a judgement stops with.
    fn failed(judged: Judged) -> String {
        match judged {
            Err(Stop::Verdict(verdict)) => verdict.reason().unwrap().key.clone(),
            Ok(()) => "pass".into(),
            Err(Stop::Error(error)) => panic!("{error}"),
        }
    }

    #[test]
    fn a_result_is_stored_when_a_record_holds_the_emails_id() {
        let record = |value: &str| Record {
            key: "k".into(),
            value: value.into(),
        };
        assert!(result_stored(
            &[record(r#"{"result":"{\"email_id\":\"em_3\"}"}"#)],
            "em_3"
        ));
        assert!(!result_stored(&[record(r#"{"email_id":"em_31"}"#)], "em_3"));
        assert!(!result_stored(&[record("in_progress")], "em_3"));
        assert!(!result_stored(&[], "em_3"));
    }

    #[test]
    fn the_ack_must_come_after_the_result_is_stored() {
        let at = |stored, recorded, written_after_send, stored_later| AtAck {
            stored,
            recorded,
            written_after_send,
            stored_later,
        };
        for (at, key) in [
            (at(true, true, true, true), "pass"),
            (at(false, true, false, true), "broke.acked_before_store"),
            (at(false, false, false, true), "broke.acked_before_store"),
            (at(false, true, false, false), "broke.stored_before_send"),
            (at(false, true, true, false), "broke.acked_unstored"),
            (at(false, false, false, false), "broke.acked_unstored"),
        ] {
            assert_eq!(failed(judge_ack_order(&at, "em_1")), key, "{at:?}");
        }
    }

    #[test]
    fn a_lost_ack_is_settled_by_a_claim_and_a_replay() {
        let stored = Loss {
            emails: 1,
            stored: true,
        };
        let unstored = Loss {
            emails: 1,
            stored: false,
        };
        let before_send = Loss {
            emails: 0,
            stored: false,
        };
        for (loss, emails, aftermath, key) in [
            (&stored, 1, Aftermath::Acked, "pass"),
            (&before_send, 1, Aftermath::Acked, "pass"),
            (&before_send, 0, Aftermath::Acked, "broke.job_lost"),
            (&stored, 2, Aftermath::Acked, "broke.resent_stored"),
            (&unstored, 2, Aftermath::Acked, "broke.resent_unstored"),
            (&stored, 1, Aftermath::Pending(1), "broke.never_claimed"),
            (
                &before_send,
                0,
                Aftermath::Pending(1),
                "broke.never_claimed",
            ),
            (&unstored, 1, Aftermath::Pending(3), "broke.lost_unstored"),
            (
                &stored,
                1,
                Aftermath::Pending(3),
                "broke.claimed_not_settled",
            ),
        ] {
            assert_eq!(
                failed(judge_ack_lost(loss, emails, &aftermath)),
                key,
                "{loss:?} {emails} {aftermath:?}"
            );
        }
    }

    #[test]
    fn a_duplicate_in_progress_stays_pending_and_is_claimed_again() {
        for (emails, deliveries, key) in [
            (1, Some(2), "pass"),
            (2, Some(2), "broke.emails"),
            (2, None, "broke.emails"),
            (1, None, "broke.duplicate_acked"),
            (1, Some(1), "broke.never_claimed"),
        ] {
            assert_eq!(
                failed(judge_meanwhile(&Meanwhile { emails, deliveries })),
                key
            );
        }
    }

    #[test]
    fn versions_and_refusals_count_the_emails_they_name() {
        let email = |to: &str| Email {
            email_id: "e1".into(),
            to: to.into(),
            subject: "Invoice x v1".into(),
            key: None,
        };
        let anna = [email("anna@example.com")];
        assert_eq!(failed(judge_versions(&anna, &anna)), "pass");
        assert_eq!(
            failed(judge_versions(&anna, &[])),
            "broke.new_version_not_sent"
        );
        assert_eq!(
            failed(judge_versions(&[anna[0].clone(), anna[0].clone()], &anna)),
            "broke.emails"
        );
        assert_eq!(failed(judge_refusal(&anna, "boris@example.com")), "pass");
        assert_eq!(
            failed(judge_refusal(
                &[anna[0].clone(), email("boris@example.com")],
                "boris@example.com"
            )),
            "broke.recipient_changed_sent"
        );
    }
}
