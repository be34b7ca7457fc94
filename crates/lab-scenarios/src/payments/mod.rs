//! Lesson B: a payment charged once, with a Redis idempotency coordinator.
//!
//! A client pays through the payment service (`lab_services::payments`), which runs every charge
//! through the coordinator [`idem`] and charges the mock payment provider
//! (`lab_services::provider`). The helpers here are what every scenario of the lesson does: pay
//! and tell what the client saw, switch the service's policy or the provider's deduplication,
//! and show the two places where the truth is: the coordinator's record in Redis (read with
//! `GET` and `PTTL`) and the provider's own list of charges (read over HTTP).
//!
//! Each scenario module here has a folder of the same name under `scenarios/` (its texts and
//! expectations); `build.rs` lists the declared ones in the catalogue.

// The scenarios of this lesson, one module each (its folder under `scenarios/` has the same
// name, with `-` for `_`).
pub mod keys;
pub mod provider_lost;
pub mod redis_down;
pub mod ttl_expiry;

use lab_core::trace::Traced;
use lab_core::{Msg, Outcome, Table, narrator::CallView};
use lab_services::payments::{self, PaymentConfig};
use lab_services::provider::{self, Charge};
use serde_json::{Value, json};

use crate::scenario::Lesson;
use crate::{Ctx, ScenarioError};
use lab_services::stage::ServiceHandle;

/// The lesson: everything it keeps is in Redis and at the provider, so no tables of its own.
pub const LESSON: Lesson = Lesson {
    id: "B",
    order: 2,
    schema: "",
};

/// The tenant every payment of the lesson belongs to.
pub const TENANT: &str = "6f1c2d3e-4a5b-4c6d-8e7f-0a1b2c3d4e5f";
/// The order being paid.
pub const ORDER: &str = "0b7e4c1a-2d3f-4e5a-9b6c-7d8e9f0a1b2c";
/// 19.90 roubles, in kopecks.
pub const AMOUNT: i64 = 1990;
pub const CURRENCY: &str = "RUB";

/// The payment command a client sends.
pub fn payment(amount: i64) -> Value {
    json!({"tenant_id": TENANT, "order_id": ORDER, "amount": amount, "currency": CURRENCY})
}

/// The coordinator's operation for the lesson's tenant.
pub fn operation() -> String {
    payments::operation(&uuid::Uuid::parse_str(TENANT).expect("a UUID"))
}

/// The provider key the payment service derives from a client key.
pub fn provider_key(key: &str) -> String {
    format!("{}.{}", operation(), idem::normalise_key(key))
}

/// A client as the lesson's clients are: one connection per call, so a fault breaks exactly one.
/// It waits long enough that a busy machine never turns an answer into a timeout.
pub fn client() -> Result<reqwest::Client, ScenarioError> {
    Ok(reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(std::time::Duration::from_secs(10))
        .build()?)
}

/// A client that waits as long as it takes: for a call the scenario holds inside the service
/// (in step mode, for as long as the learner reads).
pub fn patient_client() -> Result<reqwest::Client, ScenarioError> {
    Ok(reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()?)
}

/// What a client learned from `POST /payments`.
#[derive(Debug, Clone)]
pub struct Paid {
    pub outcome: Outcome,
    pub status: Option<u16>,
    pub charge: Option<Charge>,
    /// The `Idempotent-Replayed` header said `true`.
    pub replayed: bool,
    pub retry_after: Option<String>,
    /// The error code of a refusal (`payment_in_progress`, …).
    pub error: Option<String>,
}

impl Paid {
    /// How the narrator shows it: the parts of the answer that matter, in a stable order.
    pub fn view(&self) -> CallView {
        let body = match (&self.charge, &self.error) {
            (Some(charge), _) => Some(format!(
                r#"{{"charge_id":"{}","amount":{},"currency":"{}"}}"#,
                charge.charge_id, charge.amount, charge.currency
            )),
            (None, Some(error)) => Some(format!(r#"{{"error":"{error}"}}"#)),
            (None, None) => None,
        };
        let mut headers = Vec::new();
        if self.replayed {
            headers.push("Idempotent-Replayed: true".to_string());
        }
        if let Some(after) = &self.retry_after {
            headers.push(format!("Retry-After: {after}"));
        }
        let body = match (body, headers.is_empty()) {
            (Some(body), false) => Some(format!("{} · {body}", headers.join(", "))),
            (body, _) => body,
        };
        CallView {
            outcome: self.outcome,
            status: self.status,
            body,
            detail: (self.status.is_none()).then(|| Msg::new("call.dropped")),
        }
    }

    pub fn charge_id(&self) -> Option<&str> {
        self.charge.as_ref().map(|c| c.charge_id.as_str())
    }
}

/// The payment service of the run.
pub fn payment_service(ctx: &Ctx) -> Result<&ServiceHandle, ScenarioError> {
    ctx.service(&payments::SPEC)
}

/// Sends `POST /payments` with `key` and classifies the answer, without narrating.
pub async fn send_pay(
    client: &reqwest::Client,
    service: &ServiceHandle,
    key: &str,
    amount: i64,
) -> Result<Paid, ScenarioError> {
    let sent = client
        .post(format!("{}/payments", service.url))
        .header("Idempotency-Key", key)
        .json(&payment(amount))
        .send()
        .await;
    let response = match sent {
        Ok(response) => response,
        Err(_) => {
            return Ok(Paid {
                outcome: Outcome::Unknown,
                status: None,
                charge: None,
                replayed: false,
                retry_after: None,
                error: None,
            });
        }
    };
    let status = response.status().as_u16();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let replayed = header("idempotent-replayed").as_deref() == Some("true");
    let retry_after = header("retry-after");
    let body: Value = response.json().await.unwrap_or(Value::Null);
    let ok = (200..300).contains(&status);
    Ok(Paid {
        outcome: if ok { Outcome::Ok } else { Outcome::Fail },
        status: Some(status),
        charge: ok
            .then(|| serde_json::from_value(body.clone()).ok())
            .flatten(),
        replayed,
        retry_after,
        error: body["error"].as_str().map(str::to_string),
    })
}

/// How a payment call is told; `who` names the caller (`who.client`, `who.first`, …).
pub fn pay_msg(who: &str, key: &str, amount: i64) -> Msg {
    Msg::new("call.pay")
        .arg("who", Msg::new(format!("who.{who}")))
        .arg("key", payments::shown_key(key))
        .arg("amount", amount)
        .arg("currency", CURRENCY)
}

/// The client pays with `key`, narrated: the request, what happens inside the services, and what
/// the client saw.
pub async fn pay(ctx: &Ctx, key: &str, amount: i64) -> Result<Paid, ScenarioError> {
    pay_as(ctx, "client", key, amount).await
}

/// [`pay`], by a named caller.
pub async fn pay_as(ctx: &Ctx, who: &str, key: &str, amount: i64) -> Result<Paid, ScenarioError> {
    let service = payment_service(ctx)?;
    ctx.narrator.call(
        &format!("who.{who}"),
        payments::NAME,
        pay_msg(who, key, amount),
    );
    let paid = send_pay(&client()?, service, key, amount).await?;
    ctx.narrator.response(paid.view());
    Ok(paid)
}

/// Switches the payment service (`PUT /config`): only the fields given change.
pub async fn configure_payments(ctx: &Ctx, change: Value) -> Result<PaymentConfig, ScenarioError> {
    let url = format!("http://{}/config", payment_service(ctx)?.direct);
    Ok(client()?
        .put(url)
        .json(&change)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?)
}

/// Switches the provider's deduplication by key.
pub async fn provider_dedup(ctx: &Ctx, on: bool) -> Result<(), ScenarioError> {
    let url = format!("http://{}/config", ctx.service(&provider::SPEC)?.direct);
    client()?
        .put(url)
        .json(&json!({"dedup_by_key": on}))
        .send()
        .await?
        .error_for_status()?;
    Ok(())
}

/// The provider's own list of charges (all, or those under one provider key), over HTTP.
pub async fn provider_charges(ctx: &Ctx, key: Option<&str>) -> Result<Vec<Charge>, ScenarioError> {
    let direct = ctx.service(&provider::SPEC)?.direct;
    let url = url::Url::parse_with_params(
        &format!("http://{direct}/charges"),
        key.map(|key| ("key", key)),
    )
    .map_err(|e| ScenarioError::Broken(format!("the provider's URL: {e}")))?;
    let body: Value = client()?
        .get(url)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    serde_json::from_value(body["charges"].clone())
        .map_err(|e| ScenarioError::Broken(format!("the provider's list of charges: {e}")))
}

/// Shows the provider's charges (all of them).
pub async fn show_charges(ctx: &Ctx) -> Result<Vec<Charge>, ScenarioError> {
    let charges = provider_charges(ctx, None).await?;
    ctx.narrator.state(Table {
        title: Msg::new("table.charges"),
        columns: ["charge_id", "key", "amount"].map(String::from).to_vec(),
        rows: charges
            .iter()
            .map(|c| {
                vec![
                    c.charge_id.clone(),
                    c.key.clone().unwrap_or_else(|| "NULL".into()),
                    c.amount.to_string(),
                ]
            })
            .collect(),
    });
    Ok(charges)
}

/// The coordinator's Redis key for a client key, as the run stores it.
pub fn record_key(ctx: &Ctx, key: &str) -> String {
    format!(
        "{}{}:{}",
        payments::key_prefix(&ctx.space.prefix),
        operation(),
        idem::normalise_key(key)
    )
}

/// A Redis key as the narrative shows it: without the run's own prefix, which changes every run.
pub fn shown_key(ctx: &Ctx, key: &str) -> String {
    key.strip_prefix(&ctx.space.prefix)
        .unwrap_or(key)
        .to_string()
}

/// The run's own connection to the real Redis (never through the fault proxy).
pub fn redis(ctx: &Ctx) -> Result<Traced<redis::aio::MultiplexedConnection>, ScenarioError> {
    ctx.space
        .redis
        .clone()
        .map(Traced::new)
        .ok_or_else(|| ScenarioError::Undeclared {
            scenario: ctx.name,
            what: "Redis".into(),
        })
}

/// A coordinator record as read from Redis: the record and its remaining life in whole seconds
/// (PTTL rounded up, so a record written a moment ago with one hour shows 3600).
pub struct RedisRecord {
    pub record: idem::Record,
    pub ttl_secs: i64,
}

/// Reads the coordinator's record for a client key with `GET` and `PTTL`.
#[tracing::instrument(name = "lab.backstage", skip_all)]
pub async fn read_record(ctx: &Ctx, key: &str) -> Result<Option<RedisRecord>, ScenarioError> {
    read_record_at(&mut redis(ctx)?, &record_key(ctx, key)).await
}

/// Reads the coordinator's record at a Redis key with `GET` and `PTTL`.
async fn read_record_at(
    conn: &mut Traced<redis::aio::MultiplexedConnection>,
    redis_key: &str,
) -> Result<Option<RedisRecord>, ScenarioError> {
    let (value, pttl): (Option<String>, i64) = redis::pipe()
        .get(redis_key)
        .pttl(redis_key)
        .query_async(conn)
        .await?;
    let Some(value) = value else {
        return Ok(None);
    };
    let record = idem::Record::from_json(&value)
        .map_err(|e| ScenarioError::Broken(format!("the record at {redis_key}: {e}")))?;
    Ok(Some(RedisRecord {
        record,
        ttl_secs: pttl_secs(pttl),
    }))
}

/// PTTL in whole seconds, rounded up; negative values (no key, no expiry) as they are.
pub fn pttl_secs(pttl: i64) -> i64 {
    if pttl < 0 { pttl } else { (pttl + 999) / 1000 }
}

/// Shows the coordinator's records for these client keys as they are in Redis now, each with
/// its TTL. In step mode, `s` reads them again (the TTLs have gone down since).
#[tracing::instrument(name = "lab.backstage", skip_all)]
pub async fn show_records(ctx: &Ctx, keys: &[&str]) -> Result<(), ScenarioError> {
    let conn = redis(ctx)?;
    // Each record's Redis key, and the key as the narrative shows it (without the run's
    // prefix).
    let keys: Vec<(String, String)> = keys
        .iter()
        .map(|key| {
            let redis_key = record_key(ctx, key);
            (redis_key.clone(), shown_key(ctx, &redis_key))
        })
        .collect();
    let table = records_table(conn.clone(), &keys).await?;
    let again = lab_core::narrator::reread(move || {
        let (conn, keys) = (conn.clone(), keys.clone());
        async move { records_table(conn, &keys).await.ok() }
    });
    ctx.narrator.state_view(table, again);
    Ok(())
}

/// The coordinator's records at these Redis keys (each with the key it is shown as).
async fn records_table(
    mut conn: Traced<redis::aio::MultiplexedConnection>,
    keys: &[(String, String)],
) -> Result<Table, ScenarioError> {
    let mut rows = Vec::new();
    for (redis_key, shown) in keys {
        let row = match read_record_at(&mut conn, redis_key).await? {
            None => vec![
                shown.clone(),
                "(none)".into(),
                "".into(),
                "".into(),
                "".into(),
            ],
            Some(found) => {
                let result: Value =
                    serde_json::from_str(found.record.result.get()).unwrap_or(Value::Null);
                vec![
                    shown.clone(),
                    match found.record.status {
                        idem::Status::Pending => "pending",
                        idem::Status::Completed => "completed",
                    }
                    .to_string(),
                    found
                        .record
                        .fingerprint
                        .as_deref()
                        .map_or("NULL".to_string(), |f| format!("{}…", &f[..8.min(f.len())])),
                    result["charge_id"].as_str().unwrap_or("NULL").to_string(),
                    format!("{} s", found.ttl_secs),
                ]
            }
        };
        rows.push(row);
    }
    Ok(Table {
        title: Msg::new("table.redis_records"),
        columns: ["key", "status", "fingerprint", "result", "ttl"]
            .map(String::from)
            .to_vec(),
        rows,
    })
}
