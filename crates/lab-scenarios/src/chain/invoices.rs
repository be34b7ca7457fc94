//! The invoice worker: sends each invoice once, however often the queue delivers its job.
//!
//! The lesson's `send_invoice_once`: an invoice is identified by its tenant, order and version,
//! never by the delivery. Operation `mail.invoice.<tenant hex>`, key `<order hex>.v<version>`, a
//! TTL of a day (longer than any redelivery window), and a fingerprint over the recipient, so a
//! job that reuses a version for another address is refused rather than sent or replayed. The
//! worker acknowledges a job only after the send returned (or was replayed): a worker that dies
//! in between leaves the job pending, and its redelivery replays the stored email id.
//!
//! | the coordinator says        | the worker                                             |
//! |-----------------------------|--------------------------------------------------------|
//! | ran the send                | acknowledges                                           |
//! | replayed a stored send      | acknowledges (nothing mailed)                          |
//! | in progress (another holds) | does not acknowledge: the job comes back later         |
//! | key reused, other recipient | dead-letters the job with its reason, acknowledges     |
//! | the send failed             | does not acknowledge: the job comes back later         |
//!
//! The coordinator runs in `raise` mode: a worker must not wait on another worker's send, it
//! moves on and leaves the job pending, for a worker to claim again later.
//!
//! Two broken designs run beside it ([`Design`]), so the class sees what each rule prevents: a
//! key from the delivery (new on every delivery: a redelivery sends again) and an ack before the
//! send (a worker that dies after acknowledging leaves nothing to redeliver: no email at all).
//!
//! The same worker can also book each invoice in its own PostgreSQL instead of mailing it
//! ([`Action::Book`]): a row in `invoice_ledger`, alone, or in one transaction with a processing
//! record in `processed_jobs`, whose primary key is the job's operation and key. The coordinator
//! guards both the same way; only the second stays one row when the coordinator's record and
//! the ledger part ways (a worker that dies after its COMMIT, before the result is stored).

use std::sync::Arc;
use std::time::Duration;

use idem::{Coordinator, InFlight, Policy, Request, Source};
use lab_core::{Checkpoints, Msg, Narrator};
use lab_services::mailer::EmailRequest;
use parking_lot::Mutex;
use redis::aio::ConnectionLike;
use serde_json::{Value, json};
use sqlx::PgPool;

use super::queue::{Delivery, Queue};
use crate::kit::Caller;

/// How long a sent invoice is remembered: a day, longer than any redelivery.
pub const RESULT_TTL: Duration = Duration::from_secs(86_400);

/// Checkpoint: the worker has its email id (sent or replayed) and is about to acknowledge.
pub const BEFORE_ACK: &str = "worker.before_ack";
/// Checkpoint: the worker holds the invoice's key and is about to call the mailer.
pub const SENDING: &str = "worker.sending";
/// Checkpoint: the worker has committed its booking, and the coordinator has not stored it yet.
pub const BOOKED: &str = "worker.booked";

/// Stream entries by the order they were published in, so the story can say "entry 2" instead of
/// a timestamped id that changes every run.
#[derive(Clone, Default)]
pub struct Entries(Arc<Mutex<Vec<String>>>);

impl Entries {
    pub fn add(&self, id: String) {
        self.0.lock().push(id);
    }

    /// How many entries this run published.
    pub fn count(&self) -> usize {
        self.0.lock().len()
    }

    /// The id of the `number`-th entry published (from 1).
    pub fn id(&self, number: usize) -> Option<String> {
        self.0.lock().get(number.checked_sub(1)?).cloned()
    }

    /// "1", "2", … for an entry this run published.
    pub fn number(&self, id: &str) -> String {
        self.0
            .lock()
            .iter()
            .position(|e| e == id)
            .map_or_else(|| "?".to_string(), |i| (i + 1).to_string())
    }
}

/// What happened to a delivery. `result` is the email id (or, for a booking, the ledger row).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    /// The action ran now, and the job was acknowledged (or the ack failed).
    Sent { result: String, acked: bool },
    /// A stored result was replayed, nothing ran, and the job was acknowledged (or the ack failed).
    Replayed { result: String, acked: bool },
    /// Another delivery holds the invoice's key: not acknowledged.
    InProgress,
    /// The version was sent to another recipient: dead-lettered.
    Rejected,
    /// The send (or Redis) failed: not acknowledged.
    Failed,
}

/// How a worker is written: the lesson's way, or one of the two mistakes the lesson warns about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Design {
    /// Key from tenant, order and version; acknowledge after the result is stored.
    #[default]
    Lesson,
    /// Key from the delivery (entry id and delivery count): a new key on every delivery.
    KeyFromDelivery,
    /// Acknowledge as soon as the job is received, before the send.
    AckBeforeSend,
}

/// What the worker does with an invoice, inside the coordinator.
#[derive(Clone, Default)]
pub enum Action {
    /// The lesson's: send it through the mailer.
    #[default]
    Mail,
    /// Book it in the worker's own database: a row in `invoice_ledger`.
    Book {
        pool: PgPool,
        /// In one transaction with a processing record (`processed_jobs`), or alone.
        with_record: bool,
    },
}

impl Action {
    /// The operation's name, before the tenant: a booking is not a send, and has keys of its own.
    fn operation(&self) -> &'static str {
        match self {
            Action::Mail => "mail.invoice",
            Action::Book { .. } => "ledger.invoice",
        }
    }

    /// The field of the action's result that names what it made.
    fn result_field(&self) -> &'static str {
        match self {
            Action::Mail => "email_id",
            Action::Book { .. } => "ledger_id",
        }
    }

    /// What the worker says when the coordinator ran the action, or replayed it.
    fn done_msg(&self, replayed: bool) -> &'static str {
        match (self, replayed) {
            (Action::Mail, false) => "invoices.sent",
            (Action::Mail, true) => "invoices.replayed",
            (Action::Book { .. }, false) => "ledger.ran",
            (Action::Book { .. }, true) => "ledger.replayed",
        }
    }
}

/// Why an action failed: the mailer's answer, or the database.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error("mailer: {0}")]
    Mail(#[from] reqwest::Error),
    #[error("database: {0}")]
    Book(#[from] sqlx::Error),
}

/// What an invoice worker is made of.
pub struct WorkerConfig<C> {
    /// Its consumer name in the group, and its label in the story (`worker.<name>`).
    pub name: &'static str,
    pub queue: Queue<C>,
    /// Its coordinator's connection to Redis.
    pub conn: C,
    /// Where its coordinator's records live.
    pub key_prefix: String,
    pub mailer_url: String,
    pub narrator: Narrator,
    pub checkpoints: Checkpoints,
    pub entries: Entries,
    pub design: Design,
    pub action: Action,
}

/// One invoice worker: a consumer of the queue, with its own coordinator.
pub struct InvoiceWorker<C> {
    /// Its consumer name in the group, and its label in the story (`worker.<name>`).
    pub name: &'static str,
    queue: Queue<C>,
    coordinator: Coordinator<C>,
    mailer_url: String,
    http: Caller,
    narrator: Narrator,
    checkpoints: Checkpoints,
    entries: Entries,
    design: Design,
    action: Action,
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> InvoiceWorker<C> {
    pub fn new(config: WorkerConfig<C>) -> InvoiceWorker<C> {
        let policy = Policy::compatible()
            .in_flight(InFlight::Raise)
            // Generous, as the payment service's (no outage in this story).
            .command_timeout(lab_services::payments::DEFAULT_COMMAND_TIMEOUT);
        InvoiceWorker {
            name: config.name,
            queue: config.queue,
            coordinator: Coordinator::new(config.conn, policy).with_prefix(config.key_prefix),
            mailer_url: config.mailer_url,
            http: Caller::new(),
            narrator: config.narrator,
            checkpoints: config.checkpoints,
            entries: config.entries,
            design: config.design,
            action: config.action,
        }
    }

    async fn tell(&self, msg: Msg) {
        self.narrator
            .service(&format!("worker_{}", self.name), msg)
            .await;
    }

    /// Takes the next new job, if any, and handles it.
    pub async fn take_new(&self) -> redis::RedisResult<Option<Handled>> {
        match self.queue.receive(self.name).await? {
            Some(delivery) => Ok(Some(self.handle(&delivery).await)),
            None => Ok(None),
        }
    }

    /// Claims a job that has been idle for at least the claim's min-idle-time, if any, and handles it.
    pub async fn take_redelivered(&self) -> redis::RedisResult<Option<Handled>> {
        match self.queue.reclaim(self.name).await? {
            Some(delivery) => Ok(Some(self.handle(&delivery).await)),
            None => Ok(None),
        }
    }

    /// The lesson's `send_invoice_once`, then the acknowledgement (or not).
    #[tracing::instrument(skip_all, fields(worker = self.name, entry = %delivery.entry, deliveries = delivery.count, invoice_version = delivery.job.invoice_version))]
    pub async fn handle(&self, delivery: &Delivery) -> Handled {
        let job = &delivery.job;
        self.tell(
            Msg::new("invoices.got")
                .arg("entry", self.entries.number(&delivery.entry))
                .arg("count", delivery.count as i64)
                .arg("version", i64::from(job.invoice_version))
                .arg("email", job.email.as_str()),
        )
        .await;
        let (Ok(tenant), Ok(order)) = (
            uuid::Uuid::parse_str(&job.tenant_id),
            uuid::Uuid::parse_str(&job.order_id),
        ) else {
            return self.reject(delivery, "ids_not_uuids").await;
        };
        let operation = format!("{}.{}", self.action.operation(), tenant.simple());
        let key = match self.design {
            Design::KeyFromDelivery => delivery.delivery_id(),
            Design::Lesson | Design::AckBeforeSend => {
                format!("{}.v{}", order.simple(), job.invoice_version)
            }
        };
        if self.design == Design::AckBeforeSend {
            // The mistake: the job is gone from the queue before anything was sent.
            self.acknowledge(delivery).await;
        }
        let fingerprint = idem::fingerprint_of(&json!({"email": job.email}));
        let request = Request::new(&operation, &key, RESULT_TTL).fingerprint(&fingerprint);
        let sent = self
            .coordinator
            .coordinate(request, |_| self.act(delivery, &operation, &key))
            .await;
        match &sent {
            Ok(done) => {
                tracing::info!(source = ?done.source, result = ?done.value, "invoice handled")
            }
            Err(error) => tracing::info!(%error, "invoice not sent"),
        }
        match sent {
            Ok(done) => {
                let result = match &done.value[self.action.result_field()] {
                    Value::String(id) => id.clone(),
                    other => other.to_string(),
                };
                let replayed = matches!(done.source, Source::Replayed);
                self.tell(Msg::new(self.action.done_msg(replayed)).arg("id", result.as_str()))
                    .await;
                self.checkpoints.reached(BEFORE_ACK).await;
                let acked =
                    self.design == Design::AckBeforeSend || self.acknowledge(delivery).await;
                if replayed {
                    Handled::Replayed { result, acked }
                } else {
                    Handled::Sent { result, acked }
                }
            }
            Err(idem::Error::InProgress { .. }) => {
                self.tell(Msg::new("invoices.in_progress")).await;
                Handled::InProgress
            }
            Err(idem::Error::KeyReused { .. }) => self.reject(delivery, "recipient_changed").await,
            Err(idem::Error::Invalid(_)) => self.reject(delivery, "invalid_key").await,
            Err(_) => {
                self.tell(Msg::new("invoices.failed")).await;
                Handled::Failed
            }
        }
    }

    /// `XACK`s the delivery's entry, and says whether Redis confirmed it.
    async fn acknowledge(&self, delivery: &Delivery) -> bool {
        match self.queue.ack(&delivery.entry).await {
            Ok(()) => {
                self.tell(Msg::new("invoices.acked")).await;
                true
            }
            Err(_) => {
                self.tell(Msg::new("invoices.ack_failed")).await;
                false
            }
        }
    }

    /// Moves the job to the dead-letter stream with a reason code (a code, not a sentence: it is
    /// data, read by people in any language and by tools).
    async fn reject(&self, delivery: &Delivery, reason: &str) -> Handled {
        match self.queue.dead_letter(delivery, reason).await {
            Ok(()) => {
                self.tell(Msg::new("invoices.dead_lettered")).await;
                Handled::Rejected
            }
            Err(_) => {
                self.tell(Msg::new("invoices.failed")).await;
                Handled::Failed
            }
        }
    }

    /// The action the coordinator guards: the send, or the booking.
    async fn act(
        &self,
        delivery: &Delivery,
        operation: &str,
        key: &str,
    ) -> Result<Value, ActionError> {
        match &self.action {
            Action::Mail => Ok(self.send(delivery).await?),
            Action::Book { pool, with_record } => {
                let booked = if *with_record {
                    self.book_with_record(pool, delivery, operation, key)
                        .await?
                } else {
                    self.book_alone(pool, delivery).await?
                };
                self.checkpoints.reached(BOOKED).await;
                Ok(json!({ "ledger_id": booked }))
            }
        }
    }

    /// The booking alone: one INSERT, committed. Only the coordinator's record in Redis stands
    /// between a redelivery and a second row.
    async fn book_alone(&self, pool: &PgPool, delivery: &Delivery) -> Result<i64, sqlx::Error> {
        let job = &delivery.job;
        let id = insert_ledger_row(pool, job).await?;
        self.tell(
            Msg::new("ledger.booked")
                .arg("version", i64::from(job.invoice_version))
                .arg("id", id),
        )
        .await;
        Ok(id)
    }

    /// The booking in one transaction with the job's processing record. The record goes first:
    /// its primary key lets one transaction per job insert it (a second one waits for the first
    /// to end, then inserts nothing), and only the transaction that inserted it books. A job
    /// processed before finds the record and answers with the row it booked. The record's
    /// identity is the coordinator's: the same operation and key.
    async fn book_with_record(
        &self,
        pool: &PgPool,
        delivery: &Delivery,
        operation: &str,
        key: &str,
    ) -> Result<i64, sqlx::Error> {
        let job = &delivery.job;
        let mut tx = pool.begin().await?;
        let inserted = sqlx::query(
            "INSERT INTO processed_jobs (operation, idempotency_key) VALUES ($1, $2) \
             ON CONFLICT DO NOTHING",
        )
        .bind(operation)
        .bind(key)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if inserted == 0 {
            let id: i64 = sqlx::query_scalar(
                "SELECT ledger_id FROM processed_jobs WHERE operation = $1 AND idempotency_key = $2",
            )
            .bind(operation)
            .bind(key)
            .fetch_one(&mut *tx)
            .await?;
            tx.commit().await?;
            self.tell(Msg::new("ledger.already_processed").arg("id", id))
                .await;
            return Ok(id);
        }
        let id = insert_ledger_row(&mut *tx, job).await?;
        sqlx::query(
            "UPDATE processed_jobs SET ledger_id = $3 WHERE operation = $1 AND idempotency_key = $2",
        )
        .bind(operation)
        .bind(key)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        self.tell(
            Msg::new("ledger.booked_with_record")
                .arg("version", i64::from(job.invoice_version))
                .arg("id", id),
        )
        .await;
        Ok(id)
    }

    /// The action: asks the mailer to send the invoice.
    async fn send(&self, delivery: &Delivery) -> Result<Value, reqwest::Error> {
        self.checkpoints.reached(SENDING).await;
        let job = &delivery.job;
        let email = EmailRequest {
            to: job.email.clone(),
            subject: format!(
                "Invoice v{} for order {}",
                job.invoice_version,
                &job.order_id[..8]
            ),
        };
        self.http
            .http()
            .post(format!("{}/emails", self.mailer_url))
            .json(&email)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await
    }
}

/// Books `job`'s invoice: one row of `invoice_ledger`, its id returned.
async fn insert_ledger_row<'e>(
    db: impl sqlx::PgExecutor<'e>,
    job: &super::queue::InvoiceJob,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO invoice_ledger (order_id, invoice_version) VALUES ($1::uuid, $2) RETURNING id",
    )
    .bind(&job.order_id)
    .bind(i64::from(job.invoice_version))
    .fetch_one(db)
    .await
}
