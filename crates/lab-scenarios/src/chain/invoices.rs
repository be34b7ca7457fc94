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

use std::sync::Arc;
use std::time::Duration;

use idem::{Coordinator, InFlight, Policy, Request, Source};
use lab_core::{Checkpoints, Msg, Narrator};
use lab_services::mailer::EmailRequest;
use parking_lot::Mutex;
use redis::aio::ConnectionLike;
use serde_json::{Value, json};

use super::queue::{Delivery, Queue};
use crate::kit::Caller;

/// How long a sent invoice is remembered: a day, longer than any redelivery.
pub const RESULT_TTL: Duration = Duration::from_secs(86_400);

/// Checkpoint: the worker has its email id (sent or replayed) and is about to acknowledge.
pub const BEFORE_ACK: &str = "worker.before_ack";
/// Checkpoint: the worker holds the invoice's key and is about to call the mailer.
pub const SENDING: &str = "worker.sending";

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

/// What happened to a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    /// The invoice was sent now, and the job acknowledged (or the ack failed).
    Sent { email_id: String, acked: bool },
    /// A stored send was replayed, nothing mailed, and the job acknowledged (or the ack failed).
    Replayed { email_id: String, acked: bool },
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
        let operation = format!("mail.invoice.{}", tenant.simple());
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
            .coordinate(request, |_| self.send(delivery))
            .await;
        match &sent {
            Ok(done) => {
                tracing::info!(source = ?done.source, email_id = ?done.value["email_id"], "invoice handled")
            }
            Err(error) => tracing::info!(%error, "invoice not sent"),
        }
        match sent {
            Ok(done) => {
                let email_id = done.value["email_id"].as_str().unwrap_or("?").to_string();
                let replayed = matches!(done.source, Source::Replayed);
                self.tell(
                    Msg::new(if replayed {
                        "invoices.replayed"
                    } else {
                        "invoices.sent"
                    })
                    .arg("id", email_id.as_str()),
                )
                .await;
                self.checkpoints.reached(BEFORE_ACK).await;
                let acked =
                    self.design == Design::AckBeforeSend || self.acknowledge(delivery).await;
                if replayed {
                    Handled::Replayed { email_id, acked }
                } else {
                    Handled::Sent { email_id, acked }
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
