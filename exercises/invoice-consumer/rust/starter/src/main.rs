//! The invoice consumer of the payments lesson: one email per invoice version, however often the
//! job is delivered.
//!
//! THE STARTER: it sends every job it reads, and acks it first. The three TODOs below are the
//! lesson: each says what must hold and names the checks of `lab exercise check
//! invoice-consumer` that attack it; `lab exercise hint invoice-consumer` says how, a level at a
//! time.
//!
//! It reads invoice jobs from a Redis Stream in a consumer group and sends each invoice through
//! the mailer. A queue delivers at least once: the same invoice comes again after a lost ack,
//! after a consumer died, or as a new job with a new delivery id. [`send_invoice_once`] is the
//! lesson's coordinator around the send, with the key and the fingerprint the README's contract
//! names.
//!
//! Run it alone: `REDIS_URL=redis://127.0.0.1:6379/0 KEY_PREFIX=dev:idempotency: STREAM=invoices
//! GROUP=invoicing CONSUMER=a MAILER_URL=http://127.0.0.1:9000 cargo run`

use std::time::Duration;

use idem::{Coordinator, InFlight, Policy};
use redis::AsyncCommands as _;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::streams::{StreamId, StreamReadOptions, StreamReadReply};
use serde_json::json;

/// An invoice's result is kept a day: the longest the queue redelivers a job.
const RESULT_TTL: Duration = Duration::from_secs(86400);

/// The lesson's InvoiceJob.
struct InvoiceJob {
    tenant_id: uuid::Uuid,
    order_id: uuid::Uuid,
    invoice_version: u32,
    email: String,
}

impl InvoiceJob {
    /// The job in a stream entry's fields; `None` if it is not one.
    fn from_entry(entry: &StreamId) -> Option<InvoiceJob> {
        let field = |name: &str| entry.get::<String>(name);
        let _delivery: uuid::Uuid = field("delivery_id")?.parse().ok()?;
        let job = InvoiceJob {
            tenant_id: field("tenant_id")?.parse().ok()?,
            order_id: field("order_id")?.parse().ok()?,
            invoice_version: field("invoice_version")?.parse().ok()?,
            email: field("email")?,
        };
        (job.invoice_version >= 1).then_some(job)
    }
}

struct Consumer {
    redis: ConnectionManager,
    coordinator: Coordinator<ConnectionManager>,
    mailer_url: String,
    http: reqwest::Client,
    stream: String,
    group: String,
    name: String,
    claim_idle_ms: usize,
}

/// The mailer gave no usable answer: the entry stays pending, and is tried again.
#[derive(Debug)]
struct SendFailed(String);

impl std::fmt::Display for SendFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the mailer: {}", self.0)
    }
}

/// Sends the invoice: one call to the mailer. Returns `{"email_id": ...}`.
async fn send(
    consumer: &Consumer,
    job: &InvoiceJob,
    mail_key: &str,
) -> Result<serde_json::Value, SendFailed> {
    let failed = |e: reqwest::Error| SendFailed(e.to_string());
    let answer: serde_json::Value = consumer
        .http
        .post(format!("{}/emails", consumer.mailer_url))
        .header("Idempotency-Key", mail_key)
        .json(&json!({
            "to": job.email,
            "subject": format!("Invoice {} v{}", job.order_id, job.invoice_version),
        }))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(failed)?
        .json()
        .await
        .map_err(failed)?;
    Ok(json!({"email_id": answer["email_id"]}))
}

/// The lesson's `send_invoice_once`: the operation names the tenant, the key the invoice, the
/// fingerprint the recipient.
async fn send_invoice_once(
    consumer: &Consumer,
    job: &InvoiceJob,
) -> Result<serde_json::Value, idem::Error<SendFailed>> {
    let operation = format!("mail.invoice.{}", job.tenant_id.simple());
    let key = format!("{}.v{}", job.order_id.simple(), job.invoice_version);
    let mail_key = format!("{operation}.{key}");
    let fingerprint = idem::fingerprint_of(&json!({ "email": job.email }));
    let request = idem::Request::new(&operation, &key, RESULT_TTL).fingerprint(&fingerprint);
    consumer
        .coordinator
        .coordinate(request, |_fence| send(consumer, job, &mail_key))
        .await
        .map(|sent| sent.value)
}

impl Consumer {
    async fn ack(&self, id: &str) {
        let mut redis = self.redis.clone();
        if let Err(e) = redis
            .xack::<_, _, _, i64>(&self.stream, &self.group, &[id])
            .await
        {
            eprintln!("XACK {id}: {e}; the entry will be claimed again");
        }
    }

    /// Processes one entry; acks it once it is settled.
    async fn handle(&self, entry: &StreamId) {
        let Some(job) = InvoiceJob::from_entry(entry) else {
            eprintln!(
                "entry {} is not an invoice job; acked, never sent",
                entry.id
            );
            return self.ack(&entry.id).await;
        };
        // TODO(ack-after-send, in-progress-duplicate): an ack says "settled": the email sent
        // and its id stored, or the entry refused for good. An entry acked before that is lost
        // if this consumer dies in between; a duplicate that meets another consumer's send
        // still in progress is not settled either (that consumer may hold this very entry).
        // As written, every entry is acked before anything else happens.
        self.ack(&entry.id).await;
        // TODO(redelivered, changed-recipient, ack-lost): one email per invoice version,
        // however often and under whatever delivery id its job comes: a job delivered again
        // gets the email already sent, and an old version for another address is refused,
        // never sent. As written, every delivery sends a new email.
        let _ = send_invoice_once;
        match send(self, &job, "").await {
            Ok(result) => println!(
                "invoice {} v{}: {}",
                job.order_id, job.invoice_version, result["email_id"]
            ),
            Err(e) => eprintln!("invoice {}: {e}", job.order_id),
        }
    }

    /// One round: the entries left pending past their idle time, then new ones.
    async fn round(&self) -> redis::RedisResult<()> {
        let mut redis = self.redis.clone();
        // TODO(ack-lost, in-progress-duplicate): an entry whose consumer died before acking it
        // is handled again by a live consumer once it has been idle for `claim_idle_ms`. As
        // written, this round reads only new entries, and an entry left pending waits for ever.
        let _ = self.claim_idle_ms;
        let read: StreamReadReply = redis
            .xread_options(
                &[&self.stream],
                &[">"],
                &StreamReadOptions::default()
                    .group(&self.group, &self.name)
                    .count(10)
                    .block(200),
            )
            .await?;
        for key in &read.keys {
            for entry in &key.ids {
                self.handle(entry).await;
            }
        }
        Ok(())
    }
}

fn env(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("{name} is not set"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let lease: u64 = std::env::var("LEASE_SECONDS")
        .unwrap_or_else(|_| "30".into())
        .parse()?;
    let client = redis::Client::open(env("REDIS_URL")?)?;
    // Quick to give up on a dead Redis, reconnecting by itself once it is back.
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_millis(500)))
        .set_response_timeout(Some(Duration::from_secs(2)))
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(100));
    let redis = ConnectionManager::new_lazy_with_config(client, config)?;
    let policy = Policy::compatible()
        .in_flight(InFlight::Raise)
        .lease(Duration::from_secs(lease))
        .resend_on_dropped(true);
    let consumer = Consumer {
        coordinator: Coordinator::new(redis.clone(), policy).with_prefix(
            std::env::var("KEY_PREFIX").unwrap_or_else(|_| idem::DEFAULT_PREFIX.to_string()),
        ),
        redis,
        mailer_url: env("MAILER_URL")?.trim_end_matches('/').to_string(),
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()?,
        stream: env("STREAM")?,
        group: std::env::var("GROUP").unwrap_or_else(|_| "invoicing".into()),
        name: std::env::var("CONSUMER").unwrap_or_else(|_| "consumer-1".into()),
        claim_idle_ms: std::env::var("CLAIM_IDLE_MS")
            .unwrap_or_else(|_| "30000".into())
            .parse()?,
    };
    let mut stop = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        tokio::select! {
            _ = stop.recv() => return Ok(()),
            round = consumer.round() => if let Err(e) = round {
                eprintln!("Redis: {e}; trying again");
                tokio::time::sleep(Duration::from_millis(200)).await;
            },
        }
    }
}
