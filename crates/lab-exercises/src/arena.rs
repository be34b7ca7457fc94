//! Where a check runs: the learner's service (reached directly, or through the lab's fault
//! proxy), the table the lab reads as its oracle, and the schedule it records as it goes.
//!
//! ```text
//!   the lab's client ──► fault proxy ──► the learner's service ──► PostgreSQL (the run's schema)
//!          └───────────── directly ─────────┘                        ▲
//!   the lab reads `reports` back ────────────────────────────────────┘
//! ```
//!
//! Every call opens a connection of its own (the client keeps none idle), so a one-shot fault
//! armed on the proxy's next connection is aimed at exactly the call that follows.

use std::time::Duration;

use lab_core::Msg;
use sqlx::PgPool;

use crate::error::ExerciseError;
use crate::guest::Guest;
use crate::verdict::{Exchange, Line, Outcome, ReportRow};

/// How long a patient call waits: far longer than any of the learner's handlers should take.
pub const PATIENT: Duration = Duration::from_secs(10);
/// How much of an answer's body a schedule shows.
const ANSWER_CHARS: usize = 160;

/// Which way a call goes.
#[derive(Debug, Clone, Copy)]
pub enum Via {
    Direct,
    Proxy,
}

/// A call to make, built before it is sent (so several can be sent at once).
#[derive(Debug, Clone)]
pub struct Call {
    pub who: String,
    pub url: String,
    pub key: Option<String>,
    pub content_type: &'static str,
    pub body: String,
    pub timeout: Duration,
}

/// What a check works with.
pub struct Arena {
    /// The lab's own connections to the service's schema: the oracle, and the race's held row.
    pub pool: PgPool,
    /// The run id, in keys and in the commit channel's name.
    pub run: String,
    /// The channel PostgreSQL notifies when a report is committed (payload: its task id).
    pub commit_channel: Option<String>,
    pub direct: String,
    pub proxied: String,
    pub proxy: faultproxy::Proxy,
    /// The proxy's registry: dropping it stops the proxy.
    pub proxies: faultproxy::FaultProxy,
    /// The learner's program, when the lab started it (`None` with `--target`).
    pub guest: Option<Guest>,
    /// Task ids are `task_base + n`: small and readable in a run's own schema, far from
    /// anything already there in a target's.
    pub task_base: i64,
    pub seed: u64,
    pub repeat: u32,
    pub client: reqwest::Client,
    pub schedule: Vec<Line>,
}

impl Arena {
    pub fn task(&self, n: i64) -> i64 {
        self.task_base + n
    }

    pub fn key(&self, task: i64) -> String {
        format!("report-{}-{task}", self.run)
    }

    pub fn step(&mut self, msg: Msg) {
        self.schedule.push(Line::Step(msg));
    }

    /// A call with the report body of `task` and `report_type`.
    pub fn call(&self, who: &str, via: Via, key: Option<&str>, body: String) -> Call {
        let base = match via {
            Via::Direct => &self.direct,
            Via::Proxy => &self.proxied,
        };
        Call {
            who: who.to_string(),
            url: format!("{base}/reports"),
            key: key.map(str::to_string),
            content_type: "application/json",
            body,
            timeout: PATIENT,
        }
    }

    /// Sends one call and records it.
    pub async fn send(&mut self, call: Call) -> Exchange {
        let exchange = send(&self.client, call).await;
        self.schedule.push(Line::Call(exchange.clone()));
        exchange
    }

    /// Reads back the reports of `task`, and records them.
    pub async fn rows(&mut self, task: i64) -> Result<Vec<ReportRow>, ExerciseError> {
        let rows = read_rows(&self.pool, task).await?;
        self.schedule.push(Line::Rows {
            task_id: task,
            rows: rows.clone(),
        });
        Ok(rows)
    }
}

pub fn report_body(task: i64, report_type: &str) -> String {
    serde_json::json!({"task_id": task, "report_type": report_type}).to_string()
}

/// The reports of `task`, oldest first.
pub async fn read_rows(pool: &PgPool, task: i64) -> Result<Vec<ReportRow>, ExerciseError> {
    let rows: Vec<(i64, i64, String, Option<String>)> = sqlx::query_as(
        "SELECT id, task_id, report_type, idempotency_key FROM reports WHERE task_id = $1 ORDER BY id",
    )
    .bind(task)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, task_id, report_type, idempotency_key)| ReportRow {
            id,
            task_id,
            report_type,
            idempotency_key,
        })
        .collect())
}

/// Sends `call` on a connection of its own and says how it ended.
pub async fn send(client: &reqwest::Client, call: Call) -> Exchange {
    let mut request = client
        .post(&call.url)
        .timeout(call.timeout)
        .header("content-type", call.content_type)
        .body(call.body.clone());
    if let Some(key) = &call.key {
        request = request.header("idempotency-key", key.as_str());
    }
    let mut replayed_header = false;
    let mut retry_after = None;
    let (status, answer, outcome) = match request.send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            let header = |name: &str| {
                response
                    .headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
            };
            replayed_header = header("idempotent-replayed").is_some_and(|v| v == "true");
            retry_after = header("retry-after");
            let text = response.text().await.unwrap_or_default();
            let outcome = if (200..300).contains(&status) {
                Outcome::Ok
            } else {
                Outcome::Fail
            };
            (Some(status), text, outcome)
        }
        Err(e) if e.is_timeout() => (
            None,
            format!("no answer within {} ms", call.timeout.as_millis()),
            Outcome::Unknown,
        ),
        Err(_) => (
            None,
            "the connection closed without an answer".to_string(),
            Outcome::Unknown,
        ),
    };
    let parsed: Option<serde_json::Value> = serde_json::from_str(&answer).ok();
    let path = reqwest::Url::parse(&call.url)
        .map(|u| u.path().to_string())
        .unwrap_or_default();
    Exchange {
        who: call.who,
        path,
        key: call.key,
        body: cut(&call.body),
        status,
        json_body: parsed.is_some(),
        report_id: parsed.as_ref().and_then(|v| v.get("report_id")?.as_i64()),
        replayed: parsed.as_ref().and_then(|v| v.get("replayed")?.as_bool()),
        charge_id: parsed
            .as_ref()
            .and_then(|v| Some(v.get("charge_id")?.as_str()?.to_string())),
        replayed_header,
        retry_after,
        answer: cut(&answer),
        outcome,
    }
}

fn cut(text: &str) -> String {
    let line = text.replace(['\n', '\r'], " ");
    match line.char_indices().nth(ANSWER_CHARS) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line,
    }
}
