//! What one HTTP call did on the wire, and what its caller learned from it: ok, fail or unknown.
//!
//! The lessons turn on that word, so the scenarios and the exercises decide it in one place,
//! [`classify`]:
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
//! This module is only the judgement: what a call did is told to it as a [`Wire`] by whoever
//! made the call (`lab_services::client` turns an HTTP client's result into one). Nothing of an
//! answer is thrown away: its status, the headers the lessons read (`Retry-After`,
//! `Idempotent-Replayed`) and its body are kept in the [`Answer`].

use serde::de::DeserializeOwned;

use crate::Msg;
use crate::event::Outcome;
use crate::narrator::CallView;

/// What happened to one request on the wire, before it is judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wire {
    /// The connection was refused: nothing was sent.
    Refused,
    /// No connection within the client's time: nothing was sent.
    ConnectTimedOut,
    /// Connected and sent; no (whole) answer within the client's time.
    TimedOut,
    /// Connected; the connection ended before a whole answer came (a reset, a close).
    Dropped,
    /// An answer, whole.
    Answered {
        status: u16,
        retry_after: Option<String>,
        /// `Idempotent-Replayed: true`.
        replayed: bool,
        body: String,
    },
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
pub fn classify(wire: Wire) -> Answer {
    let unanswered = |outcome, detail| Answer {
        outcome,
        status: None,
        retry_after: None,
        replayed: false,
        body: None,
        detail: Some(detail),
    };
    match wire {
        Wire::Refused => unanswered(Outcome::Fail, "call.refused"),
        Wire::ConnectTimedOut => unanswered(Outcome::Fail, "call.connect_timed_out"),
        Wire::TimedOut => unanswered(Outcome::Unknown, "call.timed_out"),
        Wire::Dropped => unanswered(Outcome::Unknown, "call.dropped"),
        Wire::Answered {
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

    /// Whether the whole body is JSON (the contract asks it of every error answer).
    pub fn is_json(&self) -> bool {
        self.json::<serde_json::Value>().is_some()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(status: u16, body: &str) -> Wire {
        Wire::Answered {
            status,
            retry_after: None,
            replayed: false,
            body: body.to_string(),
        }
    }

    #[test]
    fn a_2xx_is_ok_and_keeps_its_headers_and_body() {
        for status in [200, 201, 204, 299] {
            assert_eq!(classify(answered(status, "{}")).outcome, Outcome::Ok);
        }
        let answer = classify(Wire::Answered {
            status: 200,
            retry_after: None,
            replayed: true,
            body: r#"{"charge":"1"}"#.into(),
        });
        assert!(answer.replayed);
        assert_eq!(answer.body.as_deref(), Some(r#"{"charge":"1"}"#));
        assert_eq!(answer.detail, None);
    }

    #[test]
    fn a_definite_refusal_is_fail_and_shown_by_its_code() {
        for status in [400, 404, 409, 422, 500, 503] {
            assert_eq!(
                classify(answered(status, "{}")).outcome,
                Outcome::Fail,
                "{status}"
            );
        }
        let answer = classify(Wire::Answered {
            status: 409,
            retry_after: Some("1".into()),
            replayed: false,
            body: r#"{"error":"payment_in_progress","detail":1}"#.into(),
        });
        assert_eq!(answer.error_code().as_deref(), Some("payment_in_progress"));
        assert_eq!(
            answer.view().body.as_deref(),
            Some(r#"{"error":"payment_in_progress"}"#)
        );
        assert_eq!(
            answer.view_with_headers(None).body.as_deref(),
            Some(r#"Retry-After: 1 · {"error":"payment_in_progress"}"#)
        );
    }

    #[test]
    fn a_gateways_502_or_504_is_unknown() {
        for status in [502, 504] {
            assert_eq!(
                classify(answered(status, "{}")).outcome,
                Outcome::Unknown,
                "{status}"
            );
        }
    }

    #[test]
    fn nothing_sent_is_fail() {
        let refused = classify(Wire::Refused);
        assert_eq!(
            (refused.outcome, refused.status, refused.detail),
            (Outcome::Fail, None, Some("call.refused"))
        );
        let never = classify(Wire::ConnectTimedOut);
        assert_eq!(
            (never.outcome, never.detail),
            (Outcome::Fail, Some("call.connect_timed_out"))
        );
    }

    #[test]
    fn sent_and_no_whole_answer_is_unknown() {
        let timed_out = classify(Wire::TimedOut);
        assert_eq!(
            (timed_out.outcome, timed_out.detail),
            (Outcome::Unknown, Some("call.timed_out"))
        );
        let dropped = classify(Wire::Dropped);
        assert_eq!(
            (dropped.outcome, dropped.status, dropped.detail),
            (Outcome::Unknown, None, Some("call.dropped"))
        );
    }

    #[test]
    fn json_bodies_are_told_apart_from_text() {
        assert!(classify(answered(400, r#"{"error":"bad"}"#)).is_json());
        assert!(!classify(answered(400, "bad request")).is_json());
        assert!(!classify(Wire::Dropped).is_json());
    }
}
