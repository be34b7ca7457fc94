//! The external report service of Lesson A.
//!
//! `POST /reports {"task_id": 42, "report_type": "monthly"}` creates a report. With an
//! `Idempotency-Key` header the service promises that one key makes at most one report:
//!
//! | request                         | answer                                           |
//! |---------------------------------|--------------------------------------------------|
//! | new key                         | 201 `{"report_id": N, "replayed": false}`        |
//! | same key, same payload          | 200 `{"report_id": N, "replayed": true}` (same N) |
//! | same key, other payload         | 409 `{"error": "idempotency_key_reused", …}`     |
//! | no key                          | 201, a new report every time                     |
//!
//! The promise is kept by PostgreSQL, not by the handler's logic: `reports.idempotency_key` is
//! UNIQUE and the handler inserts with `ON CONFLICT (idempotency_key) DO NOTHING RETURNING id`.
//! Of two concurrent requests with one key, exactly one insert returns a row; the other waits for
//! the first to commit, inserts nothing, and then reads the winner's row and compares payload
//! hashes. Checking first with a SELECT and inserting after (the naive endpoint,
//! `POST /naive/reports`, kept to show the race) lets both requests see "no report
//! yet" and both insert.
//!
//! Other endpoints: `GET /reports` (count and rows: the service's own view, used for facts),
//! `GET /reports/{id}`, `GET /health`, and `GET`/`PUT /config`, the one switch a story turns:
//! whether a request's work outlives a client that went away (`finish_after_disconnect`, on by
//! default) or is cancelled with it, as a plain axum handler is.

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use lab_core::{Checkpoints, Msg};
use lab_infra::Needs;
use lab_infra::pool::LeanPool;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};
use sqlx::Connection as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use crate::api::{ApiError, JsonBody, PathParams, method_not_allowed, not_found};
use crate::spec::{Checkpoint, ServiceEnv, ServiceError, ServiceSpec, Voice};

/// The keyed insert of `POST /reports`: one statement that inserts, or does nothing when the key
/// is stored already (`lab bench report-api` runs the same statements directly, through sqlx).
pub const INSERT_KEYED: &str =
    "INSERT INTO reports (task_id, report_type, idempotency_key, payload_hash)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (idempotency_key) DO NOTHING
         RETURNING id";

/// The report stored under a key, read when the keyed insert did nothing.
pub const SELECT_BY_KEY: &str = "SELECT id, payload_hash FROM reports WHERE idempotency_key = $1";

/// The tables of the lessons (the top-level `schema.sql`, the one copy): the report service's
/// `reports` (with the naive design's `naive_reports` and the notifications,
/// `report_notifications`), and the lesson's `tasks` beside them.
pub const SCHEMA_SQL: &str = include_str!("../../../schema.sql");

/// The report service, as the lab starts it.
pub static SPEC: ServiceSpec = ServiceSpec {
    name: NAME,
    title: "report service",
    needs: Needs::POSTGRES,
    schema: SCHEMA_SQL,
    calls: &[],
    checkpoints: &[
        Checkpoint {
            name: BEFORE_INSERT,
            about: "inside the transaction, just before the INSERT",
        },
        Checkpoint {
            name: AFTER_INSERT,
            about: "the INSERT returned a new id; not committed yet",
        },
        Checkpoint {
            name: COMMITTED,
            about: "a new report is committed; the answer is about to go out",
        },
        Checkpoint {
            name: ANSWERED,
            about: "the answer (new or replayed) is ready and about to go out",
        },
        Checkpoint {
            name: NAIVE_AFTER_CHECK,
            about: "the naive endpoint found no report and is about to INSERT",
        },
    ],
    demo: DEMO,
    router: |env| ReportService::from_env(env).map(ReportService::router),
};

/// The service's name: in narration, and the name of its fault-proxy hop.
pub const NAME: &str = "reports";

const DEMO: &str = r#"  # create a report, then send the same request again: 201, then 200 with the same id
  curl -i -X POST {url}/reports -H 'Content-Type: application/json' \
       -H 'Idempotency-Key: report-task-42' -d '{"task_id":42,"report_type":"monthly"}'
  # hold every answer of the report service 900 ms on its way back
  curl -s -X POST {api}/proxies/reports/toxics -H 'Content-Type: application/json' \
       -d '{"type":"latency","stream":"downstream","attributes":{"latency":900}}'
  # a client that waits 150 ms: a timeout, yet the report is created
  curl -i --max-time 0.15 -X POST {url}/reports -H 'Content-Type: application/json' \
       -H 'Idempotency-Key: report-task-43' -d '{"task_id":43,"report_type":"monthly"}'
  curl -s {direct}/reports
  # (report ids may skip numbers: an INSERT that meets an existing key still draws one)
  # take the service off the network, then heal everything
  curl -s -X POST {api}/proxies/reports -d '{"enabled":false}'
  curl -s -X POST {api}/reset"#;

/// The longest Idempotency-Key accepted (Stripe's limit; the IETF draft sets none).
pub const MAX_KEY_LEN: usize = 255;

/// Checkpoint: inside the handler's transaction, just before the INSERT. A race is staged by
/// holding two requests here until both have arrived.
pub const BEFORE_INSERT: &str = "reports.before_insert";
/// Checkpoint: the INSERT returned a new id; the transaction has not committed yet, so the new
/// row (and its key) is still invisible to others, and another INSERT of the key must wait.
pub const AFTER_INSERT: &str = "reports.after_insert";
/// Checkpoint: a new report is committed and the service is about to answer. A scenario whose
/// client gave up waits for it before reading the table, whatever the client saw.
pub const COMMITTED: &str = "reports.committed";
/// Checkpoint: the service has its answer ready (a new report committed, or a replay) and is
/// about to send it. A scenario whose client gave up waits for it, so what the service did is
/// told before what the client saw, however slowly the machine runs.
pub const ANSWERED: &str = "reports.answered";
/// Checkpoint: the naive endpoint has run its SELECT (and found nothing) and is about to INSERT.
pub const NAIVE_AFTER_CHECK: &str = "reports.naive.after_check";

/// The service's state: its database, and the lab's hooks into it.
#[derive(Clone)]
pub struct ReportService {
    /// The run's database, through a pool of the service's own that takes a connection back
    /// without a round trip once its transaction has committed (`Lease::release`): sqlx's pool
    /// checks every connection given back, a fifth round trip on a replay's four.
    pool: LeanPool,
    /// Tells the story from inside the service.
    voice: Voice,
    checkpoints: Checkpoints,
    /// Where each create request's work runs, so it outlives a client that gave up.
    tasks: TaskTracker,
    /// `PUT /config`'s switch: run the work in a task of its own (`true`), or in the request's
    /// future, which hyper drops when the client's connection closes (`false`).
    finish_after_disconnect: Arc<AtomicBool>,
    /// `PUT /config`'s `notify`.
    notify: Arc<parking_lot::Mutex<Notify>>,
}

/// The service's switches (`GET`/`PUT /config`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ReportConfig {
    /// A create request's work finishes even when its client has gone (it runs in a task of its
    /// own); `false` cancels it with the request, rolling back what it has not committed.
    pub finish_after_disconnect: bool,
    /// Whether and where a keyed request writes its "report ready" notification.
    pub notify: Notify,
}

/// Where the service writes a keyed request's "report ready" notification
/// (`report_notifications`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Notify {
    /// Nowhere: the lessons' default.
    #[default]
    Off,
    /// The broken design: first thing in the handler, in a statement of its own, before the key
    /// is checked: a side effect outside the transaction, repeated by every retry.
    Outside,
    /// An outbox: in the report's own transaction, only when the report is created.
    Outbox,
}

/// A change to the switches (`PUT /config`): only the fields given change.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ReportChange {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finish_after_disconnect: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notify: Option<Notify>,
}

impl crate::api::ConfigRequest for ReportChange {
    type Config = ReportConfig;
}

/// The request body of `POST /reports`. An unknown field is refused (422), not ignored: a client
/// that sends one believes it means something, and the report would silently not have it.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CreateReport {
    pub task_id: i64,
    pub report_type: String,
}

/// The answer to a successful `POST /reports`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct ReportCreated {
    pub report_id: i64,
    pub replayed: bool,
}

impl ReportService {
    /// The service over the run's database, reporting through the run's voice.
    pub fn from_env(env: ServiceEnv) -> Result<ReportService, ServiceError> {
        Ok(ReportService {
            pool: LeanPool::beside(&env.pg(NAME)?),
            voice: env.voice,
            checkpoints: env.checkpoints,
            tasks: env.tasks,
            finish_after_disconnect: Arc::new(AtomicBool::new(true)),
            notify: Arc::default(),
        })
    }

    /// The HTTP routes of the service.
    pub fn router(self) -> Router {
        Router::new()
            .route("/reports", post(create_report).get(list_reports))
            .route("/reports/{id}", get(get_report))
            .route("/naive/reports", post(create_report_naive))
            .route("/config", put(set_config).get(get_config))
            .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
            .fallback(not_found)
            .method_not_allowed_fallback(method_not_allowed)
            .with_state(self)
    }

    async fn tell(&self, msg: Msg) {
        self.voice.tell(NAME, msg).await;
    }
}

/// The payload hash: sha256 over the fields that define the operation, in a fixed order.
pub fn payload_hash(req: &CreateReport) -> String {
    let canonical = json!({"task_id": req.task_id, "report_type": req.report_type}).to_string();
    // Lowercase hex in one string (a `format!` per byte was a tenth of the service's
    // instructions under `lab bench report-api`).
    hex::encode(Sha256::digest(canonical.as_bytes()))
}

/// Reads the optional `Idempotency-Key`. The IETF draft sends it as a quoted structured-field
/// string (`"abc"`); most APIs send it bare. Both are accepted.
pub fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(raw) = crate::api::key_header(headers)? else {
        return Ok(None);
    };
    let key = raw
        .strip_prefix('"')
        .and_then(|k| k.strip_suffix('"'))
        .unwrap_or(raw)
        .trim();
    if key.is_empty() {
        return Err(ApiError::bad_request(
            "invalid_idempotency_key",
            "Idempotency-Key is empty",
        ));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(ApiError::bad_request(
            "invalid_idempotency_key",
            format!("Idempotency-Key is longer than {MAX_KEY_LEN} characters"),
        ));
    }
    Ok(Some(key.to_string()))
}

fn validate(req: &CreateReport) -> Result<(), ApiError> {
    if req.task_id <= 0 {
        return Err(ApiError::client(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            "task_id must be a positive integer",
        ));
    }
    // Control characters (a NUL byte above all, which PostgreSQL's text type refuses) are a
    // malformed request, not a database failure.
    if req.report_type.trim().is_empty()
        || req.report_type.len() > 64
        || req.report_type.chars().any(char::is_control)
    {
        return Err(ApiError::client(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            "report_type must be 1 to 64 printable characters",
        ));
    }
    Ok(())
}

fn created(status: StatusCode, report_id: i64, replayed: bool) -> Response {
    let mut response = (
        status,
        Json(ReportCreated {
            report_id,
            replayed,
        }),
    )
        .into_response();
    if replayed {
        // Stripe's replay marker, so a client can tell a replay without parsing the body.
        response
            .headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    response
}

/// `POST /reports`: create a report, at most once per Idempotency-Key.
///
/// The work runs in a task of its own: if the client goes away (a timeout, a dropped
/// connection), hyper drops the request's future, and without the task the transaction would be
/// cancelled with it. Whether a server finishes what it started once nobody is listening is the
/// server's choice (axum and hyper cancel; FastAPI on uvicorn lets a running endpoint finish),
/// and the client cannot tell which it got: that is why a timeout tells it nothing about the
/// outcome. `PUT /config {"finish_after_disconnect": false}` runs the work in the request's
/// future instead, so the `timeout` scenario can show both.
async fn create_report(
    State(service): State<ReportService>,
    headers: HeaderMap,
    JsonBody(req): JsonBody<CreateReport>,
) -> Result<Response, ApiError> {
    validate(&req)?;
    let key = idempotency_key(&headers)?;
    if !service.finish_after_disconnect.load(Ordering::SeqCst) {
        return create_report_to_the_end(service, key, req).await;
    }
    let tasks = service.tasks.clone();
    // Boxed, so that spawning moves a pointer rather than the whole future (its state machine
    // holds the transaction's and the checkpoints' futures: kilobytes, copied on every request).
    tasks
        .spawn(Box::pin(create_report_to_the_end(service, key, req)).in_current_span())
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "the report handler failed");
            Err(ApiError::client(
                StatusCode::SERVICE_UNAVAILABLE,
                "handler_failed",
                "the service could not finish this request; retry with the same key",
            ))
        })
}

async fn set_config(
    State(service): State<ReportService>,
    JsonBody(change): JsonBody<ReportChange>,
) -> Json<ReportConfig> {
    if let Some(finish) = change.finish_after_disconnect {
        service
            .finish_after_disconnect
            .store(finish, Ordering::SeqCst);
    }
    if let Some(notify) = change.notify {
        *service.notify.lock() = notify;
    }
    get_config(State(service)).await
}

async fn get_config(State(service): State<ReportService>) -> Json<ReportConfig> {
    Json(ReportConfig {
        finish_after_disconnect: service.finish_after_disconnect.load(Ordering::SeqCst),
        notify: *service.notify.lock(),
    })
}

#[tracing::instrument(name = "create_report", skip_all, fields(task_id = req.task_id, key = key.as_deref()))]
async fn create_report_to_the_end(
    service: ReportService,
    key: Option<String>,
    req: CreateReport,
) -> Result<Response, ApiError> {
    let hash = payload_hash(&req);
    match key {
        Some(key) => insert_or_replay(&service, key, &req, hash).await,
        None => insert_without_key(&service, &req, hash).await,
    }
}

/// No key: the service cannot know this is a retry. Every call is a new report.
async fn insert_without_key(
    service: &ReportService,
    req: &CreateReport,
    hash: String,
) -> Result<Response, ApiError> {
    // The same point as a keyed request's, so a call can be held before its report exists
    // whether it carries a key or not (`lab exercise check worker` holds a worker's call here).
    service.checkpoints.reached(BEFORE_INSERT).await;
    let mut conn = service.pool.acquire().await?;
    let report_id: i64 = sqlx::query_scalar(
        "INSERT INTO reports (task_id, report_type, payload_hash) VALUES ($1, $2, $3) RETURNING id",
    )
    .bind(req.task_id)
    .bind(&req.report_type)
    .bind(&hash)
    .fetch_one(&mut *conn)
    .await?;
    conn.release();
    tracing::info!(report_id, "report created without a key");
    service
        .tell(Msg::new("reports.inserted_no_key").arg("id", report_id))
        .await;
    service.checkpoints.reached(COMMITTED).await;
    service.checkpoints.reached(ANSWERED).await;
    Ok(created(StatusCode::CREATED, report_id, false))
}

/// The lesson's answer: insert the report with its key, or find the one the key already has.
async fn insert_or_replay(
    service: &ReportService,
    key: String,
    req: &CreateReport,
    hash: String,
) -> Result<Response, ApiError> {
    let notify = *service.notify.lock();
    let mut conn = service.pool.acquire().await?;
    if notify == Notify::Outside {
        // The broken design: a side effect before the key is checked, in its own statement.
        sqlx::query("INSERT INTO report_notifications (task_id) VALUES ($1)")
            .bind(req.task_id)
            .execute(&mut *conn)
            .await?;
        service.tell(Msg::new("reports.notified_outside")).await;
    }
    // One transaction for "insert or find": the read below sees the row that beat us.
    let mut tx = conn.begin().await?;
    // sqlx does not report BEGIN as it reports the statements: this tells `--show-sql` (and
    // `lab explain`) that the transaction began here. Nothing else happens.
    lab_core::trace::began();
    service.checkpoints.reached(BEFORE_INSERT).await;
    // If another transaction has inserted this key but not committed yet, this statement waits
    // for it; then it either inserts (the other rolled back) or does nothing (it committed).
    let inserted: Option<i64> = sqlx::query_scalar(INSERT_KEYED)
        .bind(req.task_id)
        .bind(&req.report_type)
        .bind(&key)
        .bind(&hash)
        .fetch_optional(&mut *tx)
        .await?;

    if let Some(report_id) = inserted {
        if notify == Notify::Outbox {
            // The outbox: the notification commits with the report, or neither does.
            sqlx::query("INSERT INTO report_notifications (task_id, report_id) VALUES ($1, $2)")
                .bind(req.task_id)
                .bind(report_id)
                .execute(&mut *tx)
                .await?;
        }
        service.checkpoints.reached(AFTER_INSERT).await;
        tx.commit().await?;
        // Committed: the connection goes back as it is. On every other way out of this
        // function (an error, the request cancelled) it is checked on its way back, and a
        // transaction still open is rolled back then.
        conn.release();
        tracing::info!(report_id, "report created, key stored with it");
        if notify == Notify::Outbox {
            // Told first: it was written before the COMMIT the next line tells.
            service
                .tell(Msg::new("reports.notified_outbox").arg("id", report_id))
                .await;
        }
        service
            .tell(
                Msg::new("reports.inserted_key")
                    .arg("id", report_id)
                    .arg("key", &key),
            )
            .await;
        service.checkpoints.reached(COMMITTED).await;
        service.checkpoints.reached(ANSWERED).await;
        return Ok(created(StatusCode::CREATED, report_id, false));
    }

    // The key exists. Under READ COMMITTED each statement sees every committed row, including
    // the one that made our INSERT do nothing.
    let (report_id, stored_hash): (i64, String) = sqlx::query_as(SELECT_BY_KEY)
        .bind(&key)
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    conn.release();
    if stored_hash != hash {
        tracing::info!(report_id, "key reused for another payload: refused");
        service
            .tell(
                Msg::new("reports.key_mismatch")
                    .arg("id", report_id)
                    .arg("key", &key),
            )
            .await;
        return Err(ApiError::client(
            StatusCode::CONFLICT,
            "idempotency_key_reused",
            format!("Idempotency-Key {key} was used for another payload (report {report_id})"),
        ));
    }
    tracing::info!(report_id, "key seen before: stored report replayed");
    service
        .tell(
            Msg::new("reports.replayed")
                .arg("id", report_id)
                .arg("key", &key),
        )
        .await;
    service.checkpoints.reached(ANSWERED).await;
    Ok(created(StatusCode::OK, report_id, true))
}

/// `POST /naive/reports`: the design the lesson warns against. It checks whether a report with
/// the key exists, then inserts: two concurrent requests can both find nothing and both insert.
/// Its table has no UNIQUE constraint to stop them.
#[tracing::instrument(name = "create_report_naive", skip_all, fields(task_id = req.task_id))]
async fn create_report_naive(
    State(service): State<ReportService>,
    headers: HeaderMap,
    JsonBody(req): JsonBody<CreateReport>,
) -> Result<Response, ApiError> {
    validate(&req)?;
    let Some(key) = idempotency_key(&headers)? else {
        return Err(ApiError::bad_request(
            "missing_idempotency_key",
            "the naive endpoint needs an Idempotency-Key",
        ));
    };
    let mut conn = service.pool.acquire().await?;
    let existing: Option<i64> =
        sqlx::query_scalar("SELECT id FROM naive_reports WHERE idempotency_key = $1")
            .bind(&key)
            .fetch_optional(&mut *conn)
            .await?;
    if let Some(report_id) = existing {
        conn.release();
        return Ok(created(StatusCode::OK, report_id, true));
    }
    // The gap between the check and the insert: the race lives here.
    service.checkpoints.reached(NAIVE_AFTER_CHECK).await;
    let report_id: i64 = sqlx::query_scalar(
        "INSERT INTO naive_reports (task_id, report_type, idempotency_key, payload_hash)
         VALUES ($1, $2, $3, $4) RETURNING id",
    )
    .bind(req.task_id)
    .bind(&req.report_type)
    .bind(&key)
    .bind(payload_hash(&req))
    .fetch_one(&mut *conn)
    .await?;
    conn.release();
    tracing::info!(
        report_id,
        key,
        "naive: report created after the check found none"
    );
    Ok(created(StatusCode::CREATED, report_id, false))
}

/// A report row as `GET /reports` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, sqlx::FromRow)]
pub struct ReportRow {
    pub id: i64,
    pub task_id: i64,
    pub report_type: String,
    pub idempotency_key: Option<String>,
    pub payload_hash: String,
}

/// Every report, oldest first.
pub async fn all_reports(db: impl sqlx::PgExecutor<'_>) -> Result<Vec<ReportRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, task_id, report_type, idempotency_key, payload_hash FROM reports ORDER BY id",
    )
    .fetch_all(db)
    .await
}

/// `GET /reports`: the service's own count of reports and the rows.
async fn list_reports(State(service): State<ReportService>) -> Result<Response, ApiError> {
    let mut conn = service.pool.acquire().await?;
    let reports = all_reports(&mut *conn).await?;
    conn.release();
    Ok(Json(json!({"count": reports.len(), "reports": reports})).into_response())
}

/// `GET /reports/{id}`.
async fn get_report(
    State(service): State<ReportService>,
    PathParams(id): PathParams<String>,
) -> Result<Response, ApiError> {
    let id: i64 = id
        .parse()
        .map_err(|_| ApiError::bad_request("invalid_id", "the report id must be an integer"))?;
    let mut conn = service.pool.acquire().await?;
    let report: Option<ReportRow> = sqlx::query_as(
        "SELECT id, task_id, report_type, idempotency_key, payload_hash FROM reports WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    conn.release();
    match report {
        Some(report) => Ok(Json(report).into_response()),
        None => Err(ApiError::client(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no report {id}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The payload hash is sha256 of the canonical JSON in lowercase hex: the value stored in
    /// `reports.payload_hash`, so it must never change (Python's hashlib gives the same).
    #[test]
    fn the_payload_hash_is_sha256_hex_of_the_canonical_body() {
        let req = CreateReport {
            task_id: 42,
            report_type: "monthly".into(),
        };
        assert_eq!(
            payload_hash(&req),
            "a24163f749bc6a5b16badec0da003ff0252eeb57a31e87f24dd0568c83756132"
        );
    }
}
