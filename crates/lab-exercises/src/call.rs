//! A call the lab makes to the learner's program (or through it), and the record of what came
//! back. Whether the caller learned ok, fail or unknown is not decided here: the wire's story
//! goes to `lab_core::classify`, the judgement the scenarios use too.

use std::time::Duration;

use crate::verdict::Sent;

/// How much of an answer's body a schedule shows.
const ANSWER_CHARS: usize = 160;

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

impl Call {
    /// A JSON `POST` to `url` as `who`, with `key` as its `Idempotency-Key`.
    pub fn post(
        who: &str,
        url: String,
        key: Option<&str>,
        body: String,
        timeout: Duration,
    ) -> Call {
        Call {
            who: who.to_string(),
            url,
            key: key.map(str::to_string),
            content_type: "application/json",
            body,
            timeout,
        }
    }
}

/// The lab's client: one connection per call, so a fault armed on a proxy's next connection is
/// aimed at exactly the call that follows, and nothing of one call's connection is left for the
/// next.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("a client without TLS builds")
}

/// Sends `call` and says how it ended.
pub async fn send(client: &reqwest::Client, call: Call) -> Sent {
    let mut request = client
        .post(&call.url)
        .timeout(call.timeout)
        .header("content-type", call.content_type)
        .body(call.body.clone());
    if let Some(key) = &call.key {
        request = request.header("idempotency-key", key.as_str());
    }
    let answer = lab_services::client::call(request).await;
    let body = answer.body.clone().unwrap_or_default();
    let parsed: Option<serde_json::Value> = serde_json::from_str(&body).ok();
    let path = reqwest::Url::parse(&call.url)
        .map(|u| u.path().to_string())
        .unwrap_or_default();
    Sent {
        who: call.who,
        path,
        key: call.key,
        body: cut(&call.body),
        status: answer.status,
        answer: cut(&body),
        no_answer: answer.detail,
        waited_ms: u64::try_from(call.timeout.as_millis()).unwrap_or(u64::MAX),
        json_body: parsed.is_some(),
        report_id: parsed.as_ref().and_then(|v| v.get("report_id")?.as_i64()),
        replayed: parsed.as_ref().and_then(|v| v.get("replayed")?.as_bool()),
        charge_id: parsed
            .as_ref()
            .and_then(|v| Some(v.get("charge_id")?.as_str()?.to_string())),
        replayed_header: answer.replayed,
        retry_after: answer.retry_after,
        outcome: answer.outcome,
    }
}

/// A body on one line, cut to [`ANSWER_CHARS`].
pub(crate) fn cut(text: &str) -> String {
    let line = text.replace(['\n', '\r'], " ");
    match line.char_indices().nth(ANSWER_CHARS) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line,
    }
}
