//! A worker's door to the report service: the lab's report service (the same code, on the run's
//! tables) served on a loopback port of that worker's own, behind a thin layer of the lab's.
//! The worker's `REPORTS_URL` is its door, so nothing in a request has to say who sent it.
//!
//! The layer, for every `POST` that comes through:
//!
//! - writes it down ([`DoorCall`]: its path, key and body, and what it got: an answer, or
//!   nothing because its client went away first), so the schedule tells what each worker's
//!   calls got and a verdict can name it;
//! - passes it through a checkpoint of the door's own, [`DOOR`], before the service sees it.
//!   A hold there (`Checkpoints::hold_all`) keeps the worker inside its call, and every retry
//!   its client sends meanwhile, with no transaction, pooled connection or report of the
//!   service's: a client that gives up leaves nothing behind but its line in the log.
//!
//! The service's own checkpoints (`reports::COMMITTED`, `reports::ANSWERED`) sit on the same
//! registry: a hold there holds this worker's calls and nobody else's.
//!
//! Other requests (a `GET /health` before the work) go through unheld and unwritten.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use lab_core::Checkpoints;
use lab_core::wire::{Wire, classify};
use lab_services::reports;
use lab_services::spec::ServiceEnv;
use parking_lot::Mutex;
use sqlx::PgPool;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::error::ExerciseError;
use crate::verdict::Sent;

/// The checkpoint every `POST` passes at the door, before the report service sees it.
pub(super) const DOOR: &str = "worker.door";
/// The most of a body the door reads: the report service's requests and answers are a line.
const BODY_LIMIT: usize = 64 * 1024;
/// How often the door looks whether the service still finishes work handed off by a request
/// (a commit whose client went away): a poll of real state, bounded by the caller.
const SETTLE_POLL: Duration = Duration::from_millis(20);
/// How long a closing door lets its requests in flight finish.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// What one call through a door got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Got {
    /// Nothing yet: it is held, or inside the service.
    Pending,
    /// An answer, whole, handed to the connection.
    Answered {
        status: u16,
        body: String,
        replayed: bool,
    },
    /// Its client went away before the answer (its timeout, or the worker was killed): the
    /// connection closed, and the door's work on it was dropped.
    Gone,
}

/// One call through a door, as the door saw it.
#[derive(Debug, Clone)]
pub(super) struct DoorCall {
    pub path: String,
    pub key: Option<String>,
    pub body: String,
    pub arrived: Instant,
    pub ended: Option<Instant>,
    pub got: Got,
}

impl DoorCall {
    pub fn answered(&self) -> bool {
        matches!(self.got, Got::Answered { .. })
    }

    /// The call as a schedule shows it, as the worker's: what it sent and what it got.
    pub fn sent(&self, who: &str) -> Sent {
        let wire = match &self.got {
            Got::Answered {
                status,
                body,
                replayed,
            } => Wire::Answered {
                status: *status,
                retry_after: None,
                replayed: *replayed,
                body: body.clone(),
            },
            Got::Pending | Got::Gone => Wire::Dropped,
        };
        let answer = classify(wire);
        let body = answer.body.clone().unwrap_or_default();
        let parsed: Option<serde_json::Value> = serde_json::from_str(&body).ok();
        let waited = self.ended.unwrap_or(self.arrived) - self.arrived;
        Sent {
            who: who.to_string(),
            path: self.path.clone(),
            key: self.key.clone(),
            body: crate::call::cut(&self.body),
            status: answer.status,
            answer: crate::call::cut(&body),
            no_answer: answer.detail,
            waited_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
            json_body: parsed.is_some(),
            report_id: parsed.as_ref().and_then(|v| v.get("report_id")?.as_i64()),
            replayed: parsed.as_ref().and_then(|v| v.get("replayed")?.as_bool()),
            charge_id: None,
            replayed_header: answer.replayed,
            retry_after: None,
            outcome: answer.outcome,
        }
    }
}

/// A door's calls, in the order they arrived.
#[derive(Clone, Default)]
struct CallLog(Arc<Mutex<Vec<DoorCall>>>);

impl CallLog {
    fn arrive(&self, call: DoorCall) -> usize {
        let mut calls = self.0.lock();
        calls.push(call);
        calls.len() - 1
    }

    fn end(&self, index: usize, got: Got) {
        if let Some(call) = self.0.lock().get_mut(index) {
            call.got = got;
            call.ended = Some(Instant::now());
        }
    }
}

/// Marks its call gone when dropped before the answer: hyper drops the door's future when the
/// client closes its connection while the call is held or inside the service.
struct Unanswered {
    log: CallLog,
    index: usize,
    answered: bool,
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        if !self.answered {
            self.log.end(self.index, Got::Gone);
        }
    }
}

/// The layer in front of the service (see the module's documentation).
async fn through_the_door(
    State((log, checkpoints)): State<(CallLog, Checkpoints)>,
    request: Request,
    next: Next,
) -> Response {
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    // Read whole before anything else: the service reads it whole too, and a connection whose
    // request is read is one hyper watches for its client closing it.
    let body = axum::body::to_bytes(body, BODY_LIMIT)
        .await
        .unwrap_or_default();
    let key = parts
        .headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let index = log.arrive(DoorCall {
        path: parts.uri.path().to_string(),
        key,
        body: String::from_utf8_lossy(&body).into_owned(),
        arrived: Instant::now(),
        ended: None,
        got: Got::Pending,
    });
    let mut unanswered = Unanswered {
        log: log.clone(),
        index,
        answered: false,
    };
    checkpoints.reached(DOOR).await;
    let response = next.run(Request::from_parts(parts, Body::from(body))).await;
    let (parts, body) = response.into_parts();
    let body = axum::body::to_bytes(body, BODY_LIMIT)
        .await
        .unwrap_or_default();
    let replayed = parts
        .headers
        .get("idempotent-replayed")
        .is_some_and(|v| v.as_bytes() == b"true");
    log.end(
        index,
        Got::Answered {
            status: parts.status.as_u16(),
            body: String::from_utf8_lossy(&body).into_owned(),
            replayed,
        },
    );
    unanswered.answered = true;
    Response::from_parts(parts, Body::from(body))
}

/// One worker's door (see the module's documentation).
pub(super) struct Door {
    pub who: &'static str,
    /// The worker's `REPORTS_URL`.
    pub url: String,
    /// The door's checkpoint and its service's, in one registry.
    pub checkpoints: Checkpoints,
    log: CallLog,
    /// The service's environment: its tracker of work handed off by requests.
    env: ServiceEnv,
    /// How many of the log's calls the schedule has shown.
    shown: usize,
    stop: Option<oneshot::Sender<()>>,
    server: JoinHandle<()>,
}

impl Door {
    /// Opens `who`'s door: a report service of its own on the run's `pool`, on a free port.
    pub async fn open(who: &'static str, pool: PgPool) -> Result<Door, ExerciseError> {
        let checkpoints = Checkpoints::new();
        let env = ServiceEnv::default()
            .with_pg(pool)
            .with_checkpoints(checkpoints.clone());
        let router = (reports::SPEC.router)(env.clone()).map_err(|e| ExerciseError::Service {
            service: reports::SPEC.title,
            reason: e.to_string(),
        })?;
        let log = CallLog::default();
        let router = router.layer(axum::middleware::from_fn_with_state(
            (log.clone(), checkpoints.clone()),
            through_the_door,
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(ExerciseError::io("127.0.0.1"))?;
        let address = listener
            .local_addr()
            .map_err(ExerciseError::io("127.0.0.1"))?;
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, router)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(Door {
            who,
            url: format!("http://{address}"),
            checkpoints,
            log,
            env,
            shown: 0,
            stop: Some(stop),
            server,
        })
    }

    /// Every call so far (since [`Door::clear`]).
    pub fn calls(&self) -> Vec<DoorCall> {
        self.log.0.lock().clone()
    }

    /// The calls that ended since the schedule last showed this door's, in the order they
    /// arrived (up to the first still inside: a schedule tells calls in order).
    pub fn unshown(&mut self) -> Vec<DoorCall> {
        let calls = self.log.0.lock();
        let new: Vec<DoorCall> = calls[self.shown.min(calls.len())..]
            .iter()
            .take_while(|c| c.got != Got::Pending)
            .cloned()
            .collect();
        self.shown += new.len();
        new
    }

    /// Forgets the calls of the check before.
    pub fn clear(&mut self) {
        self.log.0.lock().clear();
        self.shown = 0;
    }

    /// Waits, at most `limit`, until the service has finished the work its requests handed
    /// off (a report committed for a client that went away); whether it has.
    pub async fn settle(&self, limit: Duration) -> bool {
        let started = Instant::now();
        while !self.env.tasks.is_empty() {
            if started.elapsed() > limit {
                return false;
            }
            tokio::time::sleep(SETTLE_POLL).await;
        }
        true
    }

    /// Stops serving: requests in flight get a grace, then the server is ended.
    pub async fn close(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if tokio::time::timeout(CLOSE_GRACE, &mut self.server)
            .await
            .is_err()
        {
            self.server.abort();
        }
    }
}

impl Drop for Door {
    fn drop(&mut self) {
        self.server.abort();
    }
}
