//! The lab's side of the payments lesson's exercises: its services (the provider that counts
//! charges, the payment service a relay calls), the payment intents the checks send, and the
//! calls held at a service's checkpoint while the lab stages something around them.
//!
//! The oracle of every payments exercise is here: [`LabProvider::charges`], the charges the
//! provider made for one order, read over its own HTTP API.

use std::time::Duration;

use lab_core::{Checkpoints, Msg};
use lab_services::provider;
use lab_services::spec::{RunningService, ServiceEnv, ServiceSpec};
use serde::Deserialize;
use tokio::task::JoinHandle;

use crate::arena::{Call, send};
use crate::error::ExerciseError;
use crate::verdict::{ChargeRow, Exchange, Line};

/// The tenants of the checks (the second only where two tenants meet).
pub const TENANT: &str = "6f1c2d3e-4a5b-4c6d-8e7f-0a1b2c3d4e5f";
pub const OTHER_TENANT: &str = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d";
/// The lesson's amount, in kopecks.
pub const AMOUNT: i64 = 1990;

/// How long the lab waits for a moment it stages (a call held at a checkpoint, a lost answer):
/// far longer than a working service needs; missing it is an unknown, never a pass.
pub const STAGING_LIMIT: Duration = Duration::from_secs(30);

/// A payment intent of a check: its tenant, its order, its amount.
#[derive(Debug, Clone)]
pub struct Intent {
    pub tenant: &'static str,
    pub order: String,
    pub amount: i64,
}

impl Intent {
    /// Intent `n` of a check: order ids are readable UUIDs that end with the number.
    pub fn new(n: u32) -> Intent {
        Intent {
            tenant: TENANT,
            order: format!("0b7e4c1a-2d3f-4e5a-9b6c-{n:012}"),
            amount: AMOUNT,
        }
    }

    pub fn body(&self) -> String {
        serde_json::json!({
            "tenant_id": self.tenant,
            "order_id": self.order,
            "amount": self.amount,
            "currency": "RUB",
        })
        .to_string()
    }

    pub fn with_amount(&self, amount: i64) -> Intent {
        Intent {
            amount,
            ..self.clone()
        }
    }
}

/// A payment call of `intent` with `key`, to `url` (the full URL of the route).
pub fn payment_call(url: &str, who: &str, intent: &Intent, key: &str, timeout: Duration) -> Call {
    Call {
        who: who.to_string(),
        url: url.to_string(),
        key: Some(key.to_string()),
        content_type: "application/json",
        body: intent.body(),
        timeout,
    }
}

/// Starts one of the lab's services on a loopback port of its own.
pub fn launch(
    spec: &'static ServiceSpec,
    env: ServiceEnv,
) -> Result<RunningService, ExerciseError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(ExerciseError::io("127.0.0.1"))?;
    let listener =
        tokio::net::TcpListener::from_std(listener).map_err(ExerciseError::io("127.0.0.1"))?;
    lab_services::spec::launch(spec, env, listener)
        .map_err(|e| ExerciseError::Target(format!("the {}: {e}", spec.title)))
}

/// The lab's payment provider, as the checks see it.
pub struct LabProvider {
    pub service: RunningService,
    http: reqwest::Client,
}

impl LabProvider {
    pub fn start(checkpoints: Checkpoints) -> Result<LabProvider, ExerciseError> {
        let env = ServiceEnv::default().with_checkpoints(checkpoints);
        Ok(LabProvider {
            service: launch(&provider::SPEC, env)?,
            http: reqwest::Client::new(),
        })
    }

    pub fn url(&self) -> String {
        self.service.url()
    }

    /// Switches its deduplication by key; the step that says so.
    pub async fn dedup(&self, on: bool) -> Result<Line, ExerciseError> {
        self.http
            .put(format!("{}/config", self.url()))
            .json(&serde_json::json!({ "dedup_by_key": on }))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|e| ExerciseError::Target(format!("the provider's switch: {e}")))?;
        Ok(Line::Step(Msg::new(if on {
            "step.provider_dedup"
        } else {
            "step.provider_no_dedup"
        })))
    }

    /// The charges it made for `intent`'s order, as a schedule line too.
    pub async fn charges(&self, intent: &Intent) -> Result<(Vec<ChargeRow>, Line), ExerciseError> {
        #[derive(Deserialize)]
        struct Listed {
            charges: Vec<provider::Charge>,
        }
        let failed =
            |e: reqwest::Error| ExerciseError::Target(format!("the provider's charges: {e}"));
        let listed: Listed = self
            .http
            .get(format!("{}/charges", self.url()))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(failed)?
            .json()
            .await
            .map_err(failed)?;
        let charges: Vec<ChargeRow> = listed
            .charges
            .into_iter()
            .filter(|c| c.order_id == intent.order)
            .map(|c| ChargeRow {
                charge_id: c.charge_id,
                amount: c.amount,
                key: c.key,
            })
            .collect();
        let line = Line::Charges {
            order: intent.order.clone(),
            charges: charges.clone(),
        };
        Ok((charges, line))
    }

    pub async fn stop(self) {
        self.service.stop().await;
    }
}

/// A call that is held at a checkpoint, or what happened instead.
pub enum Reached {
    Held {
        hold: lab_core::checkpoint::Hold,
        call: JoinHandle<Exchange>,
    },
    /// It answered without getting there.
    Answered(Exchange),
    /// It neither got there nor answered within the bound.
    Never,
}

/// Sends `call`, holding the first caller that reaches `point` (in one of the lab's services);
/// returns once the call is held there, or has answered without getting there.
pub async fn send_held(
    http: &reqwest::Client,
    checkpoints: &Checkpoints,
    point: &str,
    call: Call,
) -> Reached {
    let hold = checkpoints.hold(point);
    let client = http.clone();
    let mut first = tokio::spawn(async move { send(&client, call).await });
    tokio::select! {
        entered = hold.entered(STAGING_LIMIT) => match entered {
            Ok(()) => Reached::Held { hold, call: first },
            Err(_) => {
                first.abort();
                Reached::Never
            }
        },
        answered = &mut first => match answered {
            Ok(exchange) => Reached::Answered(exchange),
            Err(_) => Reached::Never,
        },
    }
}

/// Every key on the server `conn` talks to that matches `pattern` (`SCAN MATCH`, never
/// `KEYS`: a shared Redis is not blocked while the lab looks).
pub async fn scan(
    conn: &mut redis::aio::MultiplexedConnection,
    pattern: &str,
) -> Result<Vec<String>, ExerciseError> {
    let mut found = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .map_err(redis_error)?;
        found.extend(keys);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    found.sort();
    found.dedup();
    Ok(found)
}

/// A Redis failure of the lab's own, reading its oracle.
pub fn redis_error(e: redis::RedisError) -> ExerciseError {
    ExerciseError::Target(format!("Redis: {e}"))
}

/// `key` as a literal inside a SCAN pattern.
pub fn glob_escape(key: &str) -> String {
    let mut escaped = String::with_capacity(key.len());
    for c in key.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// A 2xx answer that names a charge.
pub fn charged(exchange: &Exchange) -> bool {
    exchange.status.is_some_and(|s| (200..300).contains(&s)) && exchange.charge_id.is_some()
}

/// A payment's answer must be its Charge; the verdict that says it was not.
pub fn must_be_charged(exchange: &Exchange) -> Result<(), crate::verdict::Verdict> {
    if charged(exchange) {
        return Ok(());
    }
    Err(crate::verdict::Verdict::Fail(
        crate::verdict::fail("not_charged").arg("status", status_of(exchange)),
    ))
}

/// An answer's status for a message: `-` when none came.
pub fn status_of(exchange: &Exchange) -> String {
    exchange
        .status
        .map_or_else(|| "-".to_string(), |s| s.to_string())
}

/// The provider keys of some charges, for a message: `-` for a charge made without one.
pub fn keys_of(charges: &[ChargeRow]) -> String {
    charges
        .iter()
        .map(|c| c.key.clone().unwrap_or_else(|| "-".to_string()))
        .collect::<Vec<_>>()
        .join(", ")
}
