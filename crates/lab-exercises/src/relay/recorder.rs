//! The lab's recorder: what the relay's `PAYMENTS_URL` reaches, in front of the lab's payment
//! service.
//!
//! ```text
//!   the learner's relay ──► fault proxy ──► the recorder ──► the lab's payment service ──► provider
//! ```
//!
//! It notes every attempt the relay sends down (which payment, by the body's `order_id`; the
//! `Idempotency-Key` it carried; when it came; what it was answered; whether the relay hung up
//! before the answer), so a check counts exactly the attempts of its own payment and judges
//! them by the key the relay really sent. For most payments it only passes the attempt on to
//! the payment service and its answer back ([`Mode::Pass`]); for the payment a check names, it
//! stages what the check needs instead: a payment service that refuses every attempt with one
//! answer (503, 409, 422, 400), that answers 502 and then 504 before it lets the payment
//! through, that never answers, or that keeps the first attempt unanswered until the relay gives
//! up on it.
//!
//! A payment is named by its order, not by its key, so a relay that changes the key still gets
//! the staged answers, and the check sees the key it sent.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use lab_core::Wire;
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::error::ExerciseError;
use crate::lab_side::STAGING_LIMIT;

/// What the recorder does with the attempts of one payment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Each attempt goes on to the lab's payment service, and its answer comes back as it is.
    Pass,
    /// Every attempt gets this answer; nothing goes further down.
    Answer(Canned),
    /// The first attempt gets a 502, the second a 504; later ones go on to the payment service.
    GatewayErrors,
    /// No attempt ever gets an answer: the relay's own timeouts and deadline end them.
    Silent,
    /// The first attempt is kept unanswered until the relay gives up on it (it hangs up, or
    /// sends another attempt); then it goes on to the payment service, which charges, and each
    /// later attempt goes on once that one has been answered there.
    HoldFirst,
}

/// An answer the recorder gives in the payment service's place, worded as that service words
/// its own (`lab_services::payments`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Canned {
    /// 503: the payment service is down. No `Retry-After`: the pauses are the relay's own.
    Unavailable,
    /// 502: the payment service's own answer when the provider's was lost.
    BadGateway,
    /// 504: a gateway in front of the payment service got no answer from it in time.
    GatewayTimeout,
    /// 409 with `Retry-After: 1`: the same key is being charged right now.
    InProgress,
    /// 422: the key was used for another payment.
    Reused,
    /// 400: the payment was refused as malformed.
    BadRequest,
}

impl Canned {
    pub(super) fn reply(self) -> Reply {
        let (status, body, retry_after) = match self {
            Canned::Unavailable => (
                503,
                r#"{"error":"unavailable","message":"the payment service is down; retry later"}"#,
                None,
            ),
            Canned::BadGateway => (
                502,
                r#"{"error":"provider_outcome_unknown","message":"no answer from the payment provider: the charge may or may not have happened; retry with the same key"}"#,
                None,
            ),
            Canned::GatewayTimeout => (
                504,
                r#"{"error":"gateway_timeout","message":"the payment service did not answer in time: the charge may or may not have happened; retry with the same key"}"#,
                None,
            ),
            Canned::InProgress => (
                409,
                r#"{"error":"payment_in_progress","message":"a payment with this key is being charged right now; retry in a second"}"#,
                Some("1"),
            ),
            Canned::Reused => (
                422,
                r#"{"error":"idempotency_key_reused","message":"this Idempotency-Key was used for a payment with other parameters"}"#,
                None,
            ),
            Canned::BadRequest => (
                400,
                r#"{"error":"invalid_payment","message":"the payment service refused this payment as malformed"}"#,
                None,
            ),
        };
        Reply {
            status,
            body: body.to_string(),
            retry_after: retry_after.map(str::to_string),
            replayed: false,
        }
    }
}

/// An answer as the recorder gave it to the relay (its own, or the payment service's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Reply {
    pub status: u16,
    pub body: String,
    pub retry_after: Option<String>,
    /// `Idempotent-Replayed: true`.
    pub replayed: bool,
}

impl Reply {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::BAD_GATEWAY);
        let mut response = (status, self.body).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(value) = self
            .retry_after
            .and_then(|v| HeaderValue::from_str(&v).ok())
        {
            headers.insert(header::RETRY_AFTER, value);
        }
        if self.replayed {
            headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
        }
        response
    }

    /// What the relay gets when the lab's own payment service did not answer the recorder.
    fn lab_lost() -> Reply {
        Reply {
            status: 502,
            body: r#"{"error":"lab_payment_service_unreachable","message":"the lab's payment service did not answer the lab's recorder"}"#.into(),
            retry_after: None,
            replayed: false,
        }
    }
}

/// One attempt the relay sent down, as the recorder saw it.
#[derive(Debug, Clone)]
pub(super) struct Attempt {
    /// The payment it belongs to: the body's `order_id` (`None` if the body had none).
    pub order: Option<String>,
    /// Its `Idempotency-Key`, as sent (`None` without one).
    pub key: Option<String>,
    /// When it reached the recorder.
    pub at: Instant,
    /// What the recorder answered it (`None`: no answer, yet or ever).
    pub reply: Option<Reply>,
    /// When the relay closed the connection before an answer came.
    pub hung_up: Option<Instant>,
}

/// How a first attempt kept by [`Mode::HoldFirst`] stopped being kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HoldEnd {
    /// The relay closed the attempt's connection: its own timeout, read from the wire.
    HungUp(Instant),
    /// The relay sent another attempt while the first still waited.
    Overtaken(Instant),
}

impl HoldEnd {
    pub(super) fn at(self) -> Instant {
        match self {
            HoldEnd::HungUp(at) | HoldEnd::Overtaken(at) => at,
        }
    }
}

/// A first attempt kept unanswered, and what became of it.
struct Kept {
    /// Its index among the attempts.
    first: usize,
    end: watch::Sender<Option<HoldEnd>>,
    /// The payment service's answer to it, once it went on.
    passed: watch::Sender<Option<Reply>>,
}

#[derive(Default)]
struct Book {
    attempts: Vec<Attempt>,
    modes: HashMap<String, Mode>,
    kept: HashMap<String, Kept>,
    /// The tasks that pass a kept attempt on once its hold ends.
    keepers: Vec<JoinHandle<()>>,
}

struct Desk {
    book: Mutex<Book>,
    /// Bumped at every change of the book, so a check waits for state, not for time.
    changed: watch::Sender<u64>,
    /// The lab's payment service.
    payments: String,
    http: reqwest::Client,
}

/// The recorder, serving on a loopback port of its own until dropped.
pub(super) struct Recorder {
    service: JoinHandle<()>,
    url: String,
    desk: Arc<Desk>,
}

impl Recorder {
    /// Starts a recorder in front of the lab's payment service at `payments`.
    pub(super) async fn start(payments: &str) -> Result<Recorder, ExerciseError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(ExerciseError::io("127.0.0.1"))?;
        let address = listener
            .local_addr()
            .map_err(ExerciseError::io("127.0.0.1"))?;
        let desk = Arc::new(Desk {
            book: Mutex::default(),
            changed: watch::Sender::new(0),
            payments: payments.trim_end_matches('/').to_string(),
            http: reqwest::Client::new(),
        });
        let app = axum::Router::new()
            .route("/payments", axum::routing::post(attempt))
            .with_state(desk.clone());
        let service = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Recorder {
            service,
            url: format!("http://{address}"),
            desk,
        })
    }

    /// Its `host:port`.
    pub(super) fn address(&self) -> &str {
        self.url.trim_start_matches("http://")
    }

    /// Stages `mode` for the attempts of the payment of `order` from now on.
    pub(super) fn stage(&self, order: &str, mode: Mode) {
        self.desk.book.lock().modes.insert(order.to_string(), mode);
    }

    /// The attempts of the payment of `order`, in the order they came.
    pub(super) fn attempts(&self, order: &str) -> Vec<Attempt> {
        self.desk
            .book
            .lock()
            .attempts
            .iter()
            .filter(|a| a.order.as_deref() == Some(order))
            .cloned()
            .collect()
    }

    /// How the hold of `order`'s first attempt ended, if it has.
    pub(super) fn hold_end(&self, order: &str) -> Option<HoldEnd> {
        self.desk
            .book
            .lock()
            .kept
            .get(order)
            .and_then(|k| *k.end.borrow())
    }

    /// What the payment service answered the kept first attempt of `order`, once the recorder
    /// passed it on.
    pub(super) fn first_passed(&self, order: &str) -> Option<Reply> {
        self.desk
            .book
            .lock()
            .kept
            .get(order)
            .and_then(|k| k.passed.borrow().clone())
    }

    /// Waits until `done` says yes of the recorder's state, at most `limit`; whether it did.
    pub(super) async fn wait_for(&self, limit: Duration, done: impl Fn(&Recorder) -> bool) -> bool {
        let mut changed = self.desk.changed.subscribe();
        let waited = tokio::time::timeout(limit, async {
            loop {
                changed.borrow_and_update();
                if done(self) {
                    return;
                }
                if changed.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        });
        waited.await.is_ok()
    }

    /// Lets go of every attempt still kept (at the end of a check): none goes on to the
    /// payment service any more.
    pub(super) fn let_go(&self) {
        let mut book = self.desk.book.lock();
        for keeper in book.keepers.drain(..) {
            keeper.abort();
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.service.abort();
        self.let_go();
    }
}

impl Desk {
    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    /// Notes an attempt; its index, the mode of its payment, and how many attempts of that
    /// payment came so far (this one included).
    fn note(&self, order: Option<String>, key: Option<String>) -> (usize, Mode, usize) {
        let mut book = self.book.lock();
        let mode = order
            .as_ref()
            .and_then(|o| book.modes.get(o).copied())
            .unwrap_or(Mode::Pass);
        let nth = 1 + book
            .attempts
            .iter()
            .filter(|a| a.order.is_some() && a.order == order)
            .count();
        book.attempts.push(Attempt {
            order,
            key,
            at: Instant::now(),
            reply: None,
            hung_up: None,
        });
        let index = book.attempts.len() - 1;
        drop(book);
        self.bump();
        (index, mode, nth)
    }

    fn answered(&self, index: usize, reply: &Reply) {
        self.book.lock().attempts[index].reply = Some(reply.clone());
        self.bump();
    }

    /// The relay closed attempt `index`'s connection before it was answered.
    fn hung_up(&self, index: usize) {
        let now = Instant::now();
        let mut book = self.book.lock();
        book.attempts[index].hung_up = Some(now);
        for kept in book.kept.values().filter(|k| k.first == index) {
            kept.end.send_if_modified(|end| {
                let first = end.is_none();
                if first {
                    *end = Some(HoldEnd::HungUp(now));
                }
                first
            });
        }
        drop(book);
        self.bump();
    }

    /// Passes an attempt on to the lab's payment service; its answer.
    async fn forward(&self, key: Option<HeaderValue>, body: Bytes) -> Reply {
        let mut request = self
            .http
            .post(format!("{}/payments", self.payments))
            .header(header::CONTENT_TYPE, "application/json")
            .timeout(STAGING_LIMIT)
            .body(body);
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        match lab_services::client::exchange(request).await {
            Wire::Answered {
                status,
                retry_after,
                replayed,
                body,
            } => Reply {
                status,
                body,
                retry_after,
                replayed,
            },
            _ => Reply::lab_lost(),
        }
    }

    /// [`Mode::HoldFirst`] for attempt `nth` of `order`.
    async fn hold_first(
        self: &Arc<Self>,
        order: &str,
        index: usize,
        nth: usize,
        key: Option<HeaderValue>,
        body: Bytes,
    ) -> Reply {
        if nth == 1 {
            let (end, mut ended) = watch::channel(None);
            let (passed, mut answered) = watch::channel(None);
            let desk = self.clone();
            let (first_key, first_body) = (key, body);
            let keeper = tokio::spawn(async move {
                if ended.wait_for(Option::is_some).await.is_err() {
                    return;
                }
                let reply = desk.forward(first_key, first_body).await;
                let mut book = desk.book.lock();
                if let Some(kept) = book.kept.values_mut().find(|k| k.first == index) {
                    kept.passed.send_replace(Some(reply));
                }
                drop(book);
                desk.bump();
            });
            {
                let mut book = self.book.lock();
                book.kept.insert(
                    order.to_string(),
                    Kept {
                        first: index,
                        end,
                        passed,
                    },
                );
                book.keepers.push(keeper);
            }
            let reply = answered
                .wait_for(Option::is_some)
                .await
                .ok()
                .and_then(|reply| reply.clone());
            match reply {
                Some(reply) => reply,
                // Let go at the end of the check: it never gets an answer.
                None => std::future::pending().await,
            }
        } else {
            let now = Instant::now();
            let answered = {
                let book = self.book.lock();
                book.kept.get(order).map(|kept| {
                    kept.end.send_if_modified(|end| {
                        let first = end.is_none();
                        if first {
                            *end = Some(HoldEnd::Overtaken(now));
                        }
                        first
                    });
                    kept.passed.subscribe()
                })
            };
            self.bump();
            // Ordered by the payment service's answer to the first, not by time: the first
            // attempt charges, this one finds its result.
            if let Some(mut answered) = answered {
                let first_answered = answered.wait_for(Option::is_some).await.is_ok();
                if !first_answered {
                    std::future::pending::<()>().await;
                }
            }
            self.forward(key, body).await
        }
    }
}

/// Notes, on drop, that the relay hung up: hyper drops a handler whose connection closed
/// before it answered (an HTTP/1 connection that reads EOF in the middle of a request ends).
struct Unanswered {
    desk: Arc<Desk>,
    index: Option<usize>,
}

impl Unanswered {
    fn answered(mut self, reply: &Reply) {
        if let Some(index) = self.index.take() {
            self.desk.answered(index, reply);
        }
    }
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        if let Some(index) = self.index.take() {
            self.desk.hung_up(index);
        }
    }
}

/// The payment an attempt belongs to: its body's `order_id`.
fn order_of(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    Some(value.get("order_id")?.as_str()?.to_string())
}

/// `POST /payments`: one attempt of the relay's.
async fn attempt(State(desk): State<Arc<Desk>>, headers: HeaderMap, body: Bytes) -> Response {
    let order = order_of(&body);
    let key = headers.get("idempotency-key").cloned();
    let shown_key = key
        .as_ref()
        .map(|k| String::from_utf8_lossy(k.as_bytes()).into_owned());
    let (index, mode, nth) = desk.note(order.clone(), shown_key);
    let unanswered = Unanswered {
        desk: desk.clone(),
        index: Some(index),
    };
    let reply = match mode {
        Mode::Pass => desk.forward(key, body).await,
        Mode::Answer(canned) => canned.reply(),
        Mode::GatewayErrors => match nth {
            1 => Canned::BadGateway.reply(),
            2 => Canned::GatewayTimeout.reply(),
            _ => desk.forward(key, body).await,
        },
        Mode::Silent => std::future::pending().await,
        Mode::HoldFirst => {
            let order = order.unwrap_or_default();
            desk.hold_first(&order, index, nth, key, body).await
        }
    };
    unanswered.answered(&reply);
    reply.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payment(order: &str) -> String {
        serde_json::json!({"order_id": order, "amount": 1990}).to_string()
    }

    async fn post(url: &str, key: &str, body: String, timeout: Duration) -> Option<u16> {
        reqwest::Client::new()
            .post(format!("{url}/payments"))
            .header("idempotency-key", key)
            .timeout(timeout)
            .body(body)
            .send()
            .await
            .ok()
            .map(|r| r.status().as_u16())
    }

    #[tokio::test]
    async fn it_notes_each_attempt_with_its_key_and_answers_as_staged() {
        let recorder = Recorder::start("http://127.0.0.1:9").await.unwrap();
        let url = recorder.url.clone();
        recorder.stage("o-1", Mode::Answer(Canned::InProgress));
        recorder.stage("o-2", Mode::GatewayErrors);
        let wait = Duration::from_secs(5);
        assert_eq!(post(&url, "k-1", payment("o-1"), wait).await, Some(409));
        assert_eq!(post(&url, "k-1b", payment("o-1"), wait).await, Some(409));
        assert_eq!(post(&url, "k-2", payment("o-2"), wait).await, Some(502));
        assert_eq!(post(&url, "k-2", payment("o-2"), wait).await, Some(504));
        // The third goes on to a payment service that is not there: the lab's own loss.
        assert_eq!(post(&url, "k-2", payment("o-2"), wait).await, Some(502));
        let first = recorder.attempts("o-1");
        assert_eq!(first.len(), 2);
        assert_eq!(first[1].key.as_deref(), Some("k-1b"));
        let reply = first[0].reply.as_ref().unwrap();
        assert_eq!(reply.retry_after.as_deref(), Some("1"));
        assert!(first[0].at <= first[1].at);
        let second = recorder.attempts("o-2");
        assert_eq!(second[2].reply.as_ref().unwrap(), &Reply::lab_lost());
    }

    /// The relay's timeout, read from the wire: a client that gives up on a silent attempt is
    /// seen hanging up, through the lab's fault proxy as well as directly.
    #[tokio::test]
    async fn a_client_that_gives_up_is_seen_hanging_up_even_through_a_proxy() {
        let recorder = Recorder::start("http://127.0.0.1:9").await.unwrap();
        recorder.stage("o-3", Mode::Silent);
        recorder.stage("o-4", Mode::HoldFirst);
        let proxies = faultproxy::FaultProxy::new();
        let info = proxies
            .create("recorder-test", "127.0.0.1:0", recorder.address())
            .await
            .unwrap();
        let through = format!("http://{}", info.listen);
        let short = Duration::from_millis(200);
        assert_eq!(post(&through, "k-3", payment("o-3"), short).await, None);
        let hung_up = |r: &Recorder| {
            r.attempts("o-3")
                .first()
                .is_some_and(|a| a.hung_up.is_some())
        };
        assert!(recorder.wait_for(Duration::from_secs(5), hung_up).await);
        assert_eq!(post(&through, "k-4", payment("o-4"), short).await, None);
        let ended = |r: &Recorder| r.hold_end("o-4").is_some();
        assert!(recorder.wait_for(Duration::from_secs(5), ended).await);
        assert!(matches!(recorder.hold_end("o-4"), Some(HoldEnd::HungUp(_))));
    }
}
