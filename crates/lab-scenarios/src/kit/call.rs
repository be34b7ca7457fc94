//! One way to call a service, with the lab's client policy.
//!
//! What the caller learned (ok, fail or unknown) is decided in one place below every crate that
//! calls: [`lab_core::wire::classify`], whose table says why each case is what it is. The
//! scenarios and the exercises share it, so the word the lessons turn on means the same
//! everywhere.
//!
//! A [`Caller`] is a client with the lab's policy: one connection per call, so a fault on a hop
//! breaks exactly the call it is armed for, and ten seconds for an answer, so a busy machine
//! never turns an answer into a timeout. A call whose timeout is the lesson says so
//! ([`Caller::waiting`]); one the scenario holds inside a service for as long as a learner reads
//! waits as long as it takes ([`Caller::patient`]).

use std::time::Duration;

pub use lab_core::wire::{Answer, Wire, classify};
use serde::Serialize;

/// How long the lab's callers wait for an answer, unless a scenario says otherwise.
pub const ANSWER_TIME: Duration = Duration::from_secs(10);

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
        lab_services::client::call(request).await
    }
}
