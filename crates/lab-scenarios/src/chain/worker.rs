//! `worker`: an invoice job delivered again after the email went out.
//!
//! Invoice jobs go through a real at-least-once queue (Redis Streams, a consumer group, see
//! [`super::queue`]) to two invoice workers ([`super::invoices`]), which send through the mailer.
//! Five things happen, each read back from the stream's pending list (`XPENDING`), the mailer's
//! own list and the dead-letter stream:
//!
//! 1. Worker A sends invoice v1 (em_1); the coordinator stores the result; then its `XACK` is
//!    lost: the lab takes the workers' Redis link off the network at that exact moment (a
//!    checkpoint before the ack), and puts it back after.
//! 2. The entry stays pending until worker B claims it with `XAUTOCLAIM` once it has been idle
//!    for the min-idle-time (simulated: the entry's idle time is set); B claims
//!    the entry (`XAUTOCLAIM`, delivery 2, a new delivery id): the coordinator replays em_1,
//!    nothing is mailed, B acknowledges.
//! 3. Invoice v2 is published twice (the producer retried its publish). Worker A's send is held
//!    inside the mailer call; worker B gets the duplicate, meets the in-progress reservation, and
//!    does not acknowledge. A finishes (em_2) and acknowledges its entry.
//! 4. The duplicate is claimed again once idle: worker A replays em_2 and acknowledges.
//! 5. Invoice v1 again, to another recipient: the fingerprint refuses it; the job goes to the
//!    dead-letter stream with its reason.
//!
//! Then two broken designs, each on a job of its own: a key from the delivery (worker A sends and
//! dies before its ack; B claims the entry, its key is new, and the invoice goes out twice) and
//! an ack before the send (A acknowledges and dies before sending: nothing stays pending, and no
//! email goes out at all).
//!
//! Last, the workers' own database: they book an invoice in PostgreSQL (`invoice_ledger`) inside
//! the coordinator. Worker A books and dies after its COMMIT, before the coordinator stores the
//! result; the reservation expires (simulated), B claims the entry and books again: two rows.
//! Booked in one transaction with a processing record (`processed_jobs`), the same schedule
//! leaves one row: B's transaction finds A's record and books nothing.
//!
//! Facts: `emails_sent` = 2, `v1_redelivery_email_id` = "em_1", `recipient_change_rejected` =
//! true, `in_progress_not_acked` = true, `all_jobs_settled` = true; `delivery_key_emails` = 2;
//! `ack_first_pending` = 0, `ack_first_claimed_again` = false, `ack_first_emails` = 0;
//! `ledger_rows_alone` = 2, `ledger_rows_with_record` = 1.

use std::time::Duration;

use lab_core::trace::backstage;
use lab_core::{Msg, Table};
use lab_services::admin::Admin;
use lab_services::mailer;
use lab_services::stage::REDIS_HOP;

use super::invoices::{
    Action, BEFORE_ACK, BOOKED, Design, Entries, Handled, InvoiceWorker, SENDING, WorkerConfig,
};
use super::queue::{CLAIM_MIN_IDLE, InvoiceJob, Queue};
use crate::kit::payments::{ORDER, TENANT};
use crate::kit::{Caller, redis};
use crate::{Ctx, FaultUse, Hop, Requires, Scenario, ScenarioError, ScenarioResult};

pub const SCENARIO: Scenario = Scenario {
    order: 2,
    requires: Requires {
        // The workers' own database, in the last part.
        postgres: true,
        redis: true,
        services: &[&mailer::SPEC],
        faults: FaultUse::Toxics(&[Hop::Redis]),
    },
    knobs: &[],
    run: |ctx| Box::pin(run(ctx)),
};

const ANNA: &str = "anna@example.com";
const BORIS: &str = "boris@example.com";

fn job(version: u32, email: &str) -> InvoiceJob {
    InvoiceJob {
        tenant_id: TENANT.to_string(),
        order_id: ORDER.to_string(),
        invoice_version: version,
        email: email.into(),
    }
}

type Conn = lab_services::spec::RedisLink;

struct Setup {
    /// The queue as the lab sees it: directly, never through the cut link.
    inspector: Queue<redis::Conn>,
    a: InvoiceWorker<Conn>,
    b: InvoiceWorker<Conn>,
    entries: Entries,
    /// Makes more workers of the same queue (the broken designs' sides).
    workers: Workers,
}

/// What every worker of this run shares: the queue, the link, the mailer, the story.
struct Workers {
    queue: Queue<Conn>,
    /// The workers' link to Redis: through the hop the lab can cut.
    link: Conn,
    key_prefix: String,
    mailer_url: String,
    narrator: lab_core::Narrator,
    checkpoints: lab_core::Checkpoints,
    entries: Entries,
}

impl Workers {
    /// A worker of the queue, written as `design` says.
    fn worker(&self, name: &'static str, design: Design) -> InvoiceWorker<Conn> {
        self.doing(name, design, Action::Mail)
    }

    /// A worker of the queue, written as `design` says, that does `action` with each invoice.
    fn doing(&self, name: &'static str, design: Design, action: Action) -> InvoiceWorker<Conn> {
        InvoiceWorker::new(WorkerConfig {
            name,
            queue: self.queue.clone(),
            conn: self.link.clone(),
            key_prefix: self.key_prefix.clone(),
            mailer_url: self.mailer_url.clone(),
            narrator: self.narrator.clone(),
            checkpoints: self.checkpoints.clone(),
            entries: self.entries.clone(),
            design,
            action,
        })
    }
}

async fn setup(ctx: &Ctx) -> Result<Setup, ScenarioError> {
    let inspector = Queue::open(ctx.redis()?, &ctx.space.prefix, "invoices").await?;
    // The workers reach Redis the way the services do: through the link the lab can cut.
    let link = lab_services::spec::redis_connection(ctx.redis_link()?)?;
    let entries = Entries::default();
    let workers = Workers {
        queue: inspector.on(link.clone()),
        link,
        key_prefix: format!("{}{}", ctx.space.prefix, idem::DEFAULT_PREFIX),
        mailer_url: ctx.service(&mailer::SPEC)?.url.clone(),
        narrator: ctx.narrator.clone(),
        checkpoints: ctx.checkpoints.clone(),
        entries: entries.clone(),
    };
    Ok(Setup {
        a: workers.worker("a", Design::Lesson),
        b: workers.worker("b", Design::Lesson),
        inspector,
        entries,
        workers,
    })
}

async fn publish(ctx: &Ctx, s: &Setup, job: &InvoiceJob) -> Result<(), ScenarioError> {
    let id = s.inspector.publish(job).await?;
    s.entries.add(id);
    ctx.narrator.note(
        Msg::new("note.published")
            .arg("entry", s.entries.count() as i64)
            .arg("version", i64::from(job.invoice_version))
            .arg("email", job.email.as_str()),
    );
    Ok(())
}

/// Shows the stream's pending entries list, as `XPENDING` gives it. In step mode, `s` reads it
/// again.
#[tracing::instrument(name = "lab.backstage", skip_all)]
async fn show_pending(ctx: &Ctx, s: &Setup) -> Result<Vec<super::queue::Pending>, ScenarioError> {
    let pending = s.inspector.pending().await?;
    let again = lab_core::narrator::reread({
        let (inspector, entries) = (s.inspector.clone(), s.entries.clone());
        move || {
            let (inspector, entries) = (inspector.clone(), entries.clone());
            async move { Some(pending_table(&inspector.pending().await.ok()?, &entries)) }
        }
    });
    ctx.narrator
        .state_view(pending_table(&pending, &s.entries), again);
    Ok(pending)
}

/// The pending entries list, each entry by its number in this run.
fn pending_table(pending: &[super::queue::Pending], entries: &Entries) -> Table {
    Table {
        title: Msg::new("table.pending"),
        columns: ["entry", "consumer", "deliveries"]
            .map(String::from)
            .to_vec(),
        rows: pending
            .iter()
            .map(|p| {
                vec![
                    entries.number(&p.entry),
                    p.consumer.clone(),
                    p.count.to_string(),
                ]
            })
            .collect(),
    }
}

/// The mailer's own list of emails.
#[tracing::instrument(name = "lab.backstage", skip_all)]
async fn emails(ctx: &Ctx) -> Result<Vec<mailer::Email>, ScenarioError> {
    let base = ctx.direct_url(&mailer::SPEC)?;
    Ok(Admin::new(Caller::new().http(), &base).emails().await?)
}

async fn show_emails(ctx: &Ctx) -> Result<usize, ScenarioError> {
    let sent = emails(ctx).await?;
    ctx.narrator.state(Table {
        title: Msg::new("table.emails"),
        columns: ["email_id", "to", "subject"].map(String::from).to_vec(),
        rows: sent
            .iter()
            .map(|e| vec![e.email_id.clone(), e.to.clone(), e.subject.clone()])
            .collect(),
    });
    Ok(sent.len())
}

/// Simulated time: every pending entry looks idle for longer than XAUTOCLAIM's min-idle-time.
async fn timeout_passes(s: &Setup) -> Result<(), ScenarioError> {
    for pending in s.inspector.pending().await? {
        s.inspector
            .age(&pending, CLAIM_MIN_IDLE + Duration::from_secs(1))
            .await?;
    }
    Ok(())
}

fn broken(what: &str) -> ScenarioError {
    ScenarioError::Broken(what.to_string())
}

async fn run(ctx: &Ctx) -> ScenarioResult {
    let s = setup(ctx).await?;
    ack_lost(ctx, &s).await?;
    redelivery_replays(ctx, &s).await?;
    duplicate_meets_a_send(ctx, &s).await?;
    // Step 4: the duplicate comes back, and replays.
    ctx.narrator.step("step.comes_back").await?;
    timeout_passes(&s).await?;
    s.a.take_redelivered().await?;
    show_pending(ctx, &s).await?;
    another_recipient(ctx, &s).await?;
    settled(ctx, &s).await?;
    key_from_delivery(ctx, &s).await?;
    ack_before_send(ctx, &s).await?;
    booked_alone(ctx, &s).await?;
    booked_with_record(ctx, &s).await?;
    ctx.narrator.explain();
    ctx.narrator.quiz();
    Ok(())
}

/// Step 1: worker A sends invoice v1, the result is stored, and its ack is lost (the workers'
/// Redis link is taken off the network while A is about to acknowledge, and put back after).
async fn ack_lost(ctx: &Ctx, s: &Setup) -> ScenarioResult {
    let (n, faults) = (&ctx.narrator, ctx.faults()?);
    n.step("step.publish_v1").await?;
    publish(ctx, s, &job(1, ANNA)).await?;
    n.step("step.a_sends").await?;
    let at_ack = ctx.hold(BEFORE_ACK).call(s.a.take_new()).await?;
    faults.set_enabled(REDIS_HOP, false).await?;
    n.note("note.link_cut");
    let first = at_ack.release().await?;
    faults.set_enabled(REDIS_HOP, true).await?;
    n.note("note.link_back");
    if !matches!(first, Some(Handled::Sent { acked: false, .. })) {
        return Err(broken("the first ack was not lost"));
    }
    show_pending(ctx, s).await?;
    show_emails(ctx).await?;
    Ok(())
}

/// The coordinator's record of invoice `version` of the lesson's order, as Redis holds it (GET,
/// PTTL): its status, its email id and how long it is kept.
#[tracing::instrument(name = "lab.backstage", skip_all)]
async fn show_invoice_record(ctx: &Ctx, version: u32) -> ScenarioResult {
    let operation = format!("mail.invoice.{}", TENANT.simple());
    let key = format!("{}.v{version}", ORDER.simple());
    let redis_key = idem::key::record_key(
        &format!("{}{}", ctx.space.prefix, idem::DEFAULT_PREFIX),
        idem::Identifiers {
            operation: &operation,
            key: &key,
        },
    );
    let found = redis::read_record(&mut ctx.redis()?, &redis_key).await?;
    let shown = redis_key
        .strip_prefix(&ctx.space.prefix)
        .unwrap_or(&redis_key)
        .to_string();
    let row = match &found {
        None => vec![shown, "(none)".into(), String::new(), String::new()],
        Some(found) => {
            let result: serde_json::Value =
                serde_json::from_str(found.record.result.get()).unwrap_or_default();
            vec![
                shown,
                format!("{:?}", found.record.status).to_lowercase(),
                result["email_id"].as_str().unwrap_or("NULL").to_string(),
                // Minutes, not seconds: the seconds left depend on how long the lost ack took.
                format!(
                    "{} min = {} s",
                    minutes_left(found.ttl_secs),
                    minutes_left(found.ttl_secs) * 60
                ),
            ]
        }
    };
    ctx.narrator.state(Table {
        title: Msg::new("table.invoice_record"),
        columns: ["key", "status", "email_id", "ttl"]
            .map(String::from)
            .to_vec(),
        rows: vec![row],
    });
    ctx.narrator.fact(
        "invoice_record_ttl_minutes",
        found.map_or(0, |f| minutes_left(f.ttl_secs)),
    );
    Ok(())
}

/// A TTL in whole minutes, rounded up.
fn minutes_left(secs: i64) -> i64 {
    (secs + 59) / 60
}

/// Step 2: the entry is claimed again after its idle time, and the coordinator replays em_1.
async fn redelivery_replays(ctx: &Ctx, s: &Setup) -> ScenarioResult {
    let n = &ctx.narrator;
    n.predict("predict").await?;
    n.step(Msg::new("step.redelivery").arg("idle", CLAIM_MIN_IDLE.as_secs() as i64))
        .await?;
    timeout_passes(s).await?;
    let redelivered = s.b.take_redelivered().await?;
    let v1_again = match &redelivered {
        Some(Handled::Replayed { result, .. } | Handled::Sent { result, .. }) => result.clone(),
        _ => String::new(),
    };
    n.fact("v1_redelivery_email_id", v1_again.as_str());
    show_pending(ctx, s).await?;
    let after_redelivery = show_emails(ctx).await?;
    n.reveal(
        Msg::new("reveal")
            .arg("id", v1_again.as_str())
            .arg("emails", after_redelivery),
    )
    .await?;
    // What the replay came from, shown after the answer (before it, it would give it away).
    show_invoice_record(ctx, 1).await
}

/// Step 3: invoice v2 is published twice; worker A's send is held inside the mailer call while
/// worker B gets the duplicate, meets the reservation, and does not acknowledge.
async fn duplicate_meets_a_send(ctx: &Ctx, s: &Setup) -> ScenarioResult {
    let n = &ctx.narrator;
    n.step("step.publish_v2").await?;
    publish(ctx, s, &job(2, ANNA)).await?;
    publish(ctx, s, &job(2, ANNA)).await?;
    let mut a_sends = ctx.hold(SENDING).call(s.a.take_new()).await?;
    n.predict("predict_in_progress").await?;
    n.step("step.b_meets").await?;
    let b_meets = a_sends.meanwhile(s.b.take_new()).await??;
    let pending = show_pending(ctx, s).await?;
    // The duplicate of v2 is the third entry published.
    let duplicate = s.entries.id(3).unwrap_or_default();
    let not_acked = b_meets == Some(Handled::InProgress)
        && pending
            .iter()
            .any(|p| p.entry == duplicate && p.consumer == "b");
    n.fact("in_progress_not_acked", not_acked);
    n.reveal(Msg::new("reveal_in_progress").arg("pending", pending.len()))
        .await?;
    n.step("step.a_finishes").await?;
    a_sends.release().await?;
    show_pending(ctx, s).await?;
    Ok(())
}

/// Step 5: invoice v1 again, to another recipient, is refused by its fingerprint and
/// dead-lettered.
async fn another_recipient(ctx: &Ctx, s: &Setup) -> ScenarioResult {
    let n = &ctx.narrator;
    n.step("step.recipient").await?;
    publish(ctx, s, &job(1, BORIS)).await?;
    let before = emails(ctx).await?.len();
    let refused = s.b.take_new().await?;
    let dead = backstage(s.inspector.dead_letters()).await?;
    show_dead_letters(ctx, &dead);
    n.fact(
        "recipient_change_rejected",
        refused == Some(Handled::Rejected)
            && dead.iter().any(|(job, _)| job.email == BORIS)
            && emails(ctx).await?.len() == before,
    );
    Ok(())
}

/// Every job settled: nothing pending, nothing undelivered, and the emails the mailer sent.
async fn settled(ctx: &Ctx, s: &Setup) -> ScenarioResult {
    let n = &ctx.narrator;
    n.step("step.settled").await?;
    let pending = show_pending(ctx, s).await?;
    let undelivered = backstage(s.inspector.undelivered()).await?;
    let sent = show_emails(ctx).await?;
    n.fact("emails_sent", sent);
    n.fact("all_jobs_settled", pending.is_empty() && undelivered == 0);
    n.note(
        Msg::new("note.settled")
            .arg("pending", pending.len())
            .arg("undelivered", undelivered)
            .arg("emails", sent),
    );
    Ok(())
}

/// The order of the broken designs' jobs: another order, so their keys are their own.
const OTHER_ORDER: &str = "5d2a9e61-3c4b-4f0e-9a7d-2b8c1e6f4a90";

fn job_of_other_order(version: u32) -> InvoiceJob {
    InvoiceJob {
        order_id: OTHER_ORDER.to_string(),
        ..job(version, ANNA)
    }
}

/// A broken design: the key comes from the delivery. Worker A sends and dies before its ack;
/// worker B claims the entry again, and its key is new: the invoice is sent a second time.
async fn key_from_delivery(ctx: &Ctx, s: &Setup) -> ScenarioResult {
    let n = &ctx.narrator;
    n.side("side.delivery_key");
    let a = s.workers.worker("a", Design::KeyFromDelivery);
    let b = s.workers.worker("b", Design::KeyFromDelivery);
    n.step("step.delivery_key_publish").await?;
    let before = emails(ctx).await?.len();
    publish(ctx, s, &job_of_other_order(1)).await?;
    n.step("step.delivery_key_a_sends").await?;
    ctx.hold(BEFORE_ACK).call(a.take_new()).await?.crash();
    n.note("note.crashed_before_ack");
    show_pending(ctx, s).await?;
    n.predict("predict_delivery_key").await?;
    n.step("step.delivery_key_claimed").await?;
    timeout_passes(s).await?;
    b.take_redelivered().await?;
    show_pending(ctx, s).await?;
    let sent = show_emails(ctx).await? - before;
    n.fact("delivery_key_emails", sent);
    n.reveal(Msg::new("reveal_delivery_key").arg("emails", sent))
        .await?;
    Ok(())
}

/// A broken design: the ack comes first. Worker A acknowledges, then dies before the send;
/// nothing is pending, nothing is claimed again, and no email goes out.
async fn ack_before_send(ctx: &Ctx, s: &Setup) -> ScenarioResult {
    let n = &ctx.narrator;
    n.side("side.ack_first");
    let a = s.workers.worker("a", Design::AckBeforeSend);
    n.step("step.ack_first_publish").await?;
    let before = emails(ctx).await?.len();
    publish(ctx, s, &job_of_other_order(2)).await?;
    n.step("step.ack_first_a").await?;
    ctx.hold(SENDING).call(a.take_new()).await?.crash();
    n.note("note.crashed_before_send");
    let pending = show_pending(ctx, s).await?;
    n.step("step.ack_first_later").await?;
    timeout_passes(s).await?;
    let claimed = s.b.take_redelivered().await?;
    if claimed.is_none() {
        n.note("note.nothing_to_claim");
    }
    let sent = show_emails(ctx).await? - before;
    n.fact("ack_first_pending", pending.len());
    n.fact("ack_first_claimed_again", claimed.is_some());
    n.fact("ack_first_emails", sent);
    n.note(Msg::new("note.ack_first").arg("emails", sent));
    Ok(())
}

/// The orders of the bookings' jobs: one per part, so their keys are their own.
const BOOKED_ALONE_ORDER: &str = "8f3b6c1d-2e4a-4b7c-9d0e-1a2b3c4d5e6f";
const BOOKED_WITH_RECORD_ORDER: &str = "a41c7e92-6b3d-4c58-8e1f-0d9b2a7c3e54";

/// A job of `order`, version 1, to the lesson's recipient.
fn job_of(order: &str) -> InvoiceJob {
    InvoiceJob {
        order_id: order.to_string(),
        ..job(1, ANNA)
    }
}

/// Worker A books `order`'s invoice and dies after its COMMIT, before the coordinator stores
/// the result: the ledger row is there, the reservation stays without a result, and the entry
/// stays pending.
async fn a_books_and_dies(ctx: &Ctx, s: &Setup, order: &str, with_record: bool) -> ScenarioResult {
    let n = &ctx.narrator;
    let a = s
        .workers
        .doing("a", Design::Lesson, booking(ctx, with_record)?);
    publish(ctx, s, &job_of(order)).await?;
    ctx.hold(BOOKED).call(a.take_new()).await?.crash();
    n.note("note.crashed_after_commit");
    show_ledger(ctx, order).await?;
    show_pending(ctx, s).await?;
    Ok(())
}

/// The reservation A left expires (simulated: PEXPIRE to 1 ms), the entry looks idle for long
/// enough, and worker B claims it and books.
async fn b_claims(ctx: &Ctx, s: &Setup, order: &str, with_record: bool) -> ScenarioResult {
    let b = s
        .workers
        .doing("b", Design::Lesson, booking(ctx, with_record)?);
    expire_now_booking(ctx, order).await?;
    timeout_passes(s).await?;
    b.take_redelivered().await?;
    show_pending(ctx, s).await?;
    Ok(())
}

fn booking(ctx: &Ctx, with_record: bool) -> Result<Action, ScenarioError> {
    Ok(Action::Book {
        pool: ctx.pg()?.clone(),
        with_record,
    })
}

/// Expires the coordinator's reservation of `order`'s booking (version 1) at once.
async fn expire_now_booking(ctx: &Ctx, order: &str) -> ScenarioResult {
    let order = uuid::Uuid::parse_str(order).map_err(|e| broken(&e.to_string()))?;
    let record_key = idem::key::record_key(
        &format!("{}{}", ctx.space.prefix, idem::DEFAULT_PREFIX),
        idem::Identifiers {
            operation: &format!("ledger.invoice.{}", TENANT.simple()),
            key: &format!("{}.v1", order.simple()),
        },
    );
    crate::kit::redis::expire_now(&mut ctx.redis()?, &record_key).await
}

/// The ledger's rows for `order`, read from the workers' database; returns how many.
#[tracing::instrument(name = "lab.backstage", skip_all)]
async fn show_ledger(ctx: &Ctx, order: &str) -> Result<usize, ScenarioError> {
    let rows: Vec<(i64, i32)> = sqlx::query_as(
        "SELECT id, invoice_version FROM invoice_ledger WHERE order_id = $1::uuid ORDER BY id",
    )
    .bind(order)
    .fetch_all(ctx.pg()?)
    .await?;
    ctx.narrator.state(Table {
        title: Msg::new("table.ledger"),
        columns: ["id", "order_id", "invoice_version"]
            .map(String::from)
            .to_vec(),
        rows: rows
            .iter()
            .map(|(id, version)| vec![id.to_string(), order[..8].to_string(), version.to_string()])
            .collect(),
    });
    Ok(rows.len())
}

/// The processing records, read from the workers' database.
#[tracing::instrument(name = "lab.backstage", skip_all)]
async fn show_processed(ctx: &Ctx) -> ScenarioResult {
    let rows: Vec<(String, String, Option<i64>)> = sqlx::query_as(
        "SELECT operation, idempotency_key, ledger_id FROM processed_jobs ORDER BY processed_at",
    )
    .fetch_all(ctx.pg()?)
    .await?;
    ctx.narrator.state(Table {
        title: Msg::new("table.processed"),
        columns: ["operation", "idempotency_key", "ledger_id"]
            .map(String::from)
            .to_vec(),
        rows: rows
            .into_iter()
            .map(|(operation, key, ledger_id)| {
                vec![
                    operation,
                    key,
                    ledger_id.map_or_else(|| "NULL".to_string(), |id| id.to_string()),
                ]
            })
            .collect(),
    });
    Ok(())
}

/// The workers' own database, the booking alone: A books and dies after its COMMIT, the
/// reservation expires, and B books the same invoice again.
async fn booked_alone(ctx: &Ctx, s: &Setup) -> ScenarioResult {
    let n = &ctx.narrator;
    n.side("side.ledger_alone");
    n.step("step.ledger_alone").await?;
    a_books_and_dies(ctx, s, BOOKED_ALONE_ORDER, false).await?;
    n.step("step.ledger_claimed").await?;
    b_claims(ctx, s, BOOKED_ALONE_ORDER, false).await?;
    let rows = show_ledger(ctx, BOOKED_ALONE_ORDER).await?;
    n.fact("ledger_rows_alone", rows);
    n.note(Msg::new("note.ledger_alone").arg("rows", rows));
    Ok(())
}

/// The same schedule, with the booking in one transaction with its processing record: B's
/// transaction finds A's record and books nothing.
async fn booked_with_record(ctx: &Ctx, s: &Setup) -> ScenarioResult {
    let n = &ctx.narrator;
    n.side("side.ledger_with_record");
    n.step("step.ledger_with_record").await?;
    a_books_and_dies(ctx, s, BOOKED_WITH_RECORD_ORDER, true).await?;
    n.predict("predict_with_record").await?;
    n.step("step.ledger_claimed").await?;
    b_claims(ctx, s, BOOKED_WITH_RECORD_ORDER, true).await?;
    let rows = show_ledger(ctx, BOOKED_WITH_RECORD_ORDER).await?;
    show_processed(ctx).await?;
    n.fact("ledger_rows_with_record", rows);
    n.reveal(Msg::new("reveal_with_record").arg("rows", rows))
        .await?;
    Ok(())
}

fn show_dead_letters(ctx: &Ctx, dead: &[(InvoiceJob, String)]) {
    ctx.narrator.state(Table {
        title: Msg::new("table.dead_letters"),
        columns: ["invoice_version", "email", "reason"]
            .map(String::from)
            .to_vec(),
        rows: dead
            .iter()
            .map(|(job, reason)| {
                vec![
                    job.invoice_version.to_string(),
                    job.email.clone(),
                    reason.clone(),
                ]
            })
            .collect(),
    });
}
