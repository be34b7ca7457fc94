//! One way to call a service, and one way to tell what the caller learned: ok, fail or unknown.
//!
//! The lessons turn on that word, so it is decided in one place, [`classify`]:
//!
//! | what happened on the wire                          | outcome   | why it is that              |
//! |----------------------------------------------------|-----------|-----------------------------|
//! | an answer with a 2xx status                        | `ok`      | the service says it is done |
//! | 502 or 504 from a service that calls another       | `unknown` | a gateway's "my upstream gave no usable answer": the work behind it may have been done |
//! | an answer with any other status (409, 422, 503, …) | `fail`    | a definite answer from the service itself: not done, or done and refused again (the body says which) |
//! | the connection was refused                         | `fail`    | no request reached the service |
//! | no connection within the client's time             | `fail`    | no request reached the service |
//! | connected and sent, no answer within the time      | `unknown` | the request may have reached it, and it may have done the work |
//! | the connection ended without a whole answer        | `unknown` | the same                    |
//!
//! Nothing of an answer is thrown away: its status, the headers the lessons read
//! (`Retry-After`, `Idempotent-Replayed`) and its body are kept in the [`Answer`].
//!
//! A [`Caller`] is a client with the lab's policy: one connection per call, so a fault on a hop
//! breaks exactly the call it is armed for, and ten seconds for an answer, so a busy machine
//! never turns an answer into a timeout. A call whose timeout is the lesson says so
//! ([`Caller::waiting`]); one the scenario holds inside a service for as long as a learner reads
//! waits as long as it takes ([`Caller::patient`]).

use std::time::Duration;

use lab_core::narrator::CallView;
use lab_core::{Msg, Outcome};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::ScenarioError;

/// How long the lab's callers wait for an answer, unless a scenario says otherwise.
pub const ANSWER_TIME: Duration = Duration::from_secs(10);

/// What happened to one request on the wire, before it is judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exchange {
    /// The connection was refused: nothing was sent.
    Refused,
    /// No connection within the client's time: nothing was sent.
    ConnectTimedOut,
    /// Connected and sent; no (whole) answer within the client's time.
    TimedOut,
    /// Connected; the connection ended before a whole answer came.
    Dropped,
    /// An answer, whole.
    Answered {
        status: u16,
        retry_after: Option<String>,
        replayed: bool,
        body: String,
    },
}

impl Exchange {
    /// What a transport error means for the request: whether it could have been sent.
    fn from_error(error: &reqwest::Error) -> Exchange {
        match (error.is_connect(), error.is_timeout()) {
            (true, true) => Exchange::ConnectTimedOut,
            (true, false) => Exchange::Refused,
            (false, true) => Exchange::TimedOut,
            (false, false) => Exchange::Dropped,
        }
    }

    /// Reads the whole answer; a body that does not come whole is no answer.
    async fn from_response(response: reqwest::Response) -> Exchange {
        let status = response.status().as_u16();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let retry_after = header("retry-after");
        let replayed = header("idempotent-replayed").as_deref() == Some("true");
        match response.text().await {
            Ok(body) => Exchange::Answered {
                status,
                retry_after,
                replayed,
                body,
            },
            // Headers came, the body did not (in time): the caller still does not know.
            Err(error) if error.is_timeout() => Exchange::TimedOut,
            Err(_) => Exchange::Dropped,
        }
    }
}

/// What a caller learned from one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub outcome: Outcome,
    /// `None`: no answer.
    pub status: Option<u16>,
    pub retry_after: Option<String>,
    /// `Idempotent-Replayed: true`: the service answered from what it stored.
    pub replayed: bool,
    /// The body as received.
    pub body: Option<String>,
    /// Why there is no answer (a catalogue key: `call.refused`, `call.timed_out`, …).
    pub detail: Option<&'static str>,
}

/// The lab's one judgement of a call (see the table at the top of this module).
pub fn classify(exchange: Exchange) -> Answer {
    let unanswered = |outcome, detail| Answer {
        outcome,
        status: None,
        retry_after: None,
        replayed: false,
        body: None,
        detail: Some(detail),
    };
    match exchange {
        Exchange::Refused => unanswered(Outcome::Fail, "call.refused"),
        Exchange::ConnectTimedOut => unanswered(Outcome::Fail, "call.connect_timed_out"),
        Exchange::TimedOut => unanswered(Outcome::Unknown, "call.timed_out"),
        Exchange::Dropped => unanswered(Outcome::Unknown, "call.dropped"),
        Exchange::Answered {
            status,
            retry_after,
            replayed,
            body,
        } => Answer {
            outcome: match status {
                200..=299 => Outcome::Ok,
                // Bad Gateway, Gateway Timeout: the service did not finish the call it made, so
                // it cannot say whether the effect behind it happened.
                502 | 504 => Outcome::Unknown,
                _ => Outcome::Fail,
            },
            status: Some(status),
            retry_after,
            replayed,
            body: Some(body),
            detail: None,
        },
    }
}

impl Answer {
    /// The body, when it is a `T` (a report, a charge).
    pub fn json<T: DeserializeOwned>(&self) -> Option<T> {
        serde_json::from_str(self.body.as_deref()?).ok()
    }

    /// The error code of a refusal (`{"error": "payment_in_progress", …}`).
    pub fn error_code(&self) -> Option<String> {
        let body: serde_json::Value = self.json()?;
        body["error"].as_str().map(str::to_string)
    }

    /// The status, or 0 for no answer (a fact must always have a value).
    pub fn status_or_zero(&self) -> u16 {
        self.status.unwrap_or_default()
    }

    /// How the narrator shows it: the body as received, except that an error answer is shown by
    /// its error code alone (the service's message is English prose, and may name a port of
    /// this run; the narrative tells what it means in the learner's language).
    pub fn view(&self) -> CallView {
        let body = match (self.outcome, self.error_code()) {
            (Outcome::Fail | Outcome::Unknown, Some(code)) => {
                Some(serde_json::json!({ "error": code }).to_string())
            }
            _ => self.body.clone(),
        };
        CallView {
            outcome: self.outcome,
            status: self.status,
            body,
            detail: self.detail.map(Msg::new),
        }
    }

    /// [`Answer::view`] with the headers the lesson reads in front of the body, and the body
    /// shown as `shown` (a part of it, in a stable order) when it is not a refusal.
    pub fn view_with_headers(&self, shown: Option<String>) -> CallView {
        let mut view = self.view();
        if self.outcome == Outcome::Ok {
            view.body = shown;
        }
        let mut headers = Vec::new();
        if self.replayed {
            headers.push("Idempotent-Replayed: true".to_string());
        }
        if let Some(after) = &self.retry_after {
            headers.push(format!("Retry-After: {after}"));
        }
        if let (Some(body), false) = (&view.body, headers.is_empty()) {
            view.body = Some(format!("{} · {body}", headers.join(", ")));
        }
        view
    }
}

/// An HTTP client with the lab's policy (see the module's documentation).
#[derive(Debug, Clone)]
pub struct Caller {
    http: reqwest::Client,
}

impl Default for Caller {
    fn default() -> Self {
        Caller::new()
    }
}

impl Caller {
    /// One connection per call, [`ANSWER_TIME`] for an answer.
    pub fn new() -> Caller {
        Caller::with(Some(ANSWER_TIME))
    }

    /// Waits as long as it takes: for a call held inside a service while the learner reads.
    pub fn patient() -> Caller {
        Caller::with(None)
    }

    /// Gives up after `timeout`: a caller whose patience is the lesson.
    pub fn waiting(timeout: Duration) -> Caller {
        Caller::with(Some(timeout))
    }

    fn with(timeout: Option<Duration>) -> Caller {
        // No connection reuse: every call is its own connection, which keeps each call visible
        // on its own and lets a fault proxy break exactly one.
        let mut builder = reqwest::Client::builder().pool_max_idle_per_host(0);
        if let Some(timeout) = timeout {
            builder = builder.timeout(timeout);
        }
        Caller {
            http: builder.build().expect("a plain HTTP client builds"),
        }
    }

    /// The client itself, for code that speaks HTTP its own way (a worker's action).
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// `POST url` with a JSON body and, when given, an `Idempotency-Key`: the answer, judged.
    pub async fn post(&self, url: &str, key: Option<&str>, body: &impl Serialize) -> Answer {
        let mut request = self.http.post(url).json(body);
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        let exchange = match request.send().await {
            Ok(response) => Exchange::from_response(response).await,
            Err(error) => Exchange::from_error(&error),
        };
        classify(exchange)
    }

    /// `GET url` for the lab's own reading (a service's list, its counters): not a call the
    /// story is about, so anything but a 2xx with a `T` is a broken run.
    pub async fn get_json<T: DeserializeOwned>(&self, url: &str) -> Result<T, ScenarioError> {
        Ok(self
            .http
            .get(url)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?)
    }

    /// `PUT url` with a JSON body, for the lab's own switches; the answer as a `T`.
    pub async fn put_json<T: DeserializeOwned>(
        &self,
        url: &str,
        body: &impl Serialize,
    ) -> Result<T, ScenarioError> {
        Ok(self
            .http
            .put(url)
            .json(body)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A server on a free port that answers every connection with `answer` (after reading the
    /// request), or holds it open without a word when `answer` is `None`.
    async fn server(answer: Option<&'static str>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let mut request = vec![0; 4096];
                    let _ = socket.read(&mut request).await;
                    match answer {
                        Some(bytes) => {
                            let _ = socket.write_all(bytes.as_bytes()).await;
                        }
                        // Holds the connection (and the request) without answering.
                        None => std::future::pending::<()>().await,
                    }
                });
            }
        });
        url
    }

    async fn post(url: &str, caller: &Caller) -> Answer {
        caller.post(url, Some("K1"), &serde_json::json!({})).await
    }

    #[tokio::test]
    async fn an_answer_is_ok_fail_or_unknown_by_its_status_and_keeps_its_headers_and_body() {
        let url = server(Some(
            "HTTP/1.1 200 OK\r\nIdempotent-Replayed: true\r\ncontent-length: 14\r\n\
             connection: close\r\n\r\n{\"charge\":\"1\"}",
        ))
        .await;
        let answer = post(&url, &Caller::new()).await;
        assert_eq!(answer.outcome, Outcome::Ok);
        assert_eq!(answer.status, Some(200));
        assert!(answer.replayed);
        assert_eq!(answer.body.as_deref(), Some(r#"{"charge":"1"}"#));

        let url = server(Some(
            "HTTP/1.1 409 Conflict\r\nRetry-After: 1\r\ncontent-length: 42\r\n\
             connection: close\r\n\r\n{\"error\":\"payment_in_progress\",\"detail\":1}",
        ))
        .await;
        let answer = post(&url, &Caller::new()).await;
        assert_eq!(answer.outcome, Outcome::Fail);
        assert_eq!(answer.status, Some(409));
        assert_eq!(answer.retry_after.as_deref(), Some("1"));
        assert_eq!(answer.error_code().as_deref(), Some("payment_in_progress"));
        assert_eq!(
            answer.view().body.as_deref(),
            Some(r#"{"error":"payment_in_progress"}"#),
            "a refusal is shown by its code"
        );
        assert_eq!(
            answer.view_with_headers(None).body.as_deref(),
            Some(r#"Retry-After: 1 · {"error":"payment_in_progress"}"#)
        );

        // A gateway's error says its upstream gave no usable answer: the effect is unknown.
        for gateway in [
            "HTTP/1.1 502 Bad Gateway\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
            "HTTP/1.1 504 Gateway Timeout\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
        ] {
            let url = server(Some(gateway)).await;
            assert_eq!(post(&url, &Caller::new()).await.outcome, Outcome::Unknown);
        }
        let url = server(Some(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
        ))
        .await;
        assert_eq!(post(&url, &Caller::new()).await.outcome, Outcome::Fail);
    }

    #[tokio::test]
    async fn a_refused_connection_is_fail_no_request_was_sent() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        drop(listener);
        let answer = post(&url, &Caller::new()).await;
        assert_eq!(answer.outcome, Outcome::Fail);
        assert_eq!(answer.status, None);
        assert_eq!(answer.detail, Some("call.refused"));
    }

    #[tokio::test]
    async fn no_answer_in_time_is_unknown_the_request_was_sent() {
        let url = server(None).await;
        let answer = post(&url, &Caller::waiting(Duration::from_millis(100))).await;
        assert_eq!(answer.outcome, Outcome::Unknown);
        assert_eq!(answer.detail, Some("call.timed_out"));
    }

    #[tokio::test]
    async fn a_connection_closed_before_a_whole_answer_is_unknown() {
        // Closed after the request, without a word.
        let url = server(Some("")).await;
        let answer = post(&url, &Caller::new()).await;
        assert_eq!(answer.outcome, Outcome::Unknown);
        assert_eq!(answer.detail, Some("call.dropped"));
        // Headers, then the connection ends before the body promised.
        let url = server(Some(
            "HTTP/1.1 201 Created\r\ncontent-length: 100\r\n\r\n{\"report_id\":",
        ))
        .await;
        let answer = post(&url, &Caller::new()).await;
        assert_eq!(answer.outcome, Outcome::Unknown);
        assert_eq!(answer.status, None, "no whole answer, no status");
        assert_eq!(answer.detail, Some("call.dropped"));
    }

    #[test]
    fn a_connection_that_never_came_is_fail() {
        let answer = classify(Exchange::ConnectTimedOut);
        assert_eq!(answer.outcome, Outcome::Fail);
        assert_eq!(answer.detail, Some("call.connect_timed_out"));
    }
}
