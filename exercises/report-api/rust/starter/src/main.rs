//! The report service of lesson 6 (§4 and §8): `POST /reports` with an Idempotency-Key.
//!
//! What it must promise (the contract `lab exercise check report-api` tests):
//!
//! | request                 | answer                                            |
//! |-------------------------|---------------------------------------------------|
//! | new key                 | 201 `{"report_id": N, "replayed": false}`         |
//! | same key, same content  | 200 `{"report_id": N, "replayed": true}` (same N) |
//! | same key, other content | 409 `{"error": "idempotency_key_reused", …}`      |
//! | no key                  | 201, a new report every time                      |
//! | an empty or long key    | 400 `{"error": "invalid_idempotency_key", …}`     |
//!
//! As it is, it creates a report for every request and ignores the key: a client that retries
//! after a lost answer gets a second report. The two TODOs below are the lesson.
//!
//! Run it alone: `PORT=8000 DATABASE_URL=postgresql://… cargo run`

use axum::extract::{FromRequest, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest, Sha256};
use sqlx::PgPool;

#[allow(dead_code)] // Used once TODO(1) is done.
const MAX_KEY_LENGTH: usize = 255;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateReport {
    task_id: i64,
    report_type: String,
}

/// An answer with a JSON body, success or error.
fn answer(status: StatusCode, body: serde_json::Value) -> Response {
    (status, Json(body)).into_response()
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    answer(status, json!({"error": code, "message": message}))
}

/// The body as JSON, or a 4xx with a JSON body (axum's own rejection is plain text).
struct Body(CreateReport);

impl<S: Send + Sync> FromRequest<S> for Body {
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Response> {
        match Json::<CreateReport>::from_request(request, state).await {
            Ok(Json(body)) => Ok(Body(body)),
            Err(rejection) => Err(error(
                rejection.status(),
                "invalid_request",
                &rejection.body_text(),
            )),
        }
    }
}

/// sha256 of the fields that define the report: a retry must carry the same ones.
fn payload_hash(body: &CreateReport) -> String {
    let canonical = json!({"task_id": body.task_id, "report_type": body.report_type}).to_string();
    Sha256::digest(canonical.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The optional key: `Ok(None)` without one, why it is refused for an invalid one.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, &'static str> {
    let Some(raw) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    // TODO(1): a key that is empty or blank, or longer than MAX_KEY_LENGTH, makes no report and
    // is refused with 400 and a JSON body (the handler answers so on `Err(why)`). As written,
    // such a key is accepted. Attacked by: invalid-key.
    let key = raw.to_str().map(str::trim).unwrap_or_default();
    Ok(Some(key.to_string()))
}

/// A positive task id; a report type of 1 to 64 printable characters (PostgreSQL's text
/// refuses a NUL byte: that would be a 500, not a bad request).
fn valid(body: &CreateReport) -> bool {
    let printable = !body.report_type.chars().any(char::is_control);
    body.task_id > 0
        && !body.report_type.trim().is_empty()
        && body.report_type.len() <= 64
        && printable
}

async fn create_report(
    State(pool): State<PgPool>,
    headers: HeaderMap,
    Body(body): Body,
) -> Response {
    if !valid(&body) {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            "task_id must be positive; report_type 1 to 64 printable characters",
        );
    }
    let key = match idempotency_key(&headers) {
        Ok(key) => key,
        Err(why) => return error(StatusCode::BAD_REQUEST, "invalid_idempotency_key", why),
    };
    match create(&pool, key, &body).await {
        Ok(response) => response,
        Err(e) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "database_unavailable",
            &e.to_string(),
        ),
    }
}

async fn create(
    pool: &PgPool,
    key: Option<String>,
    body: &CreateReport,
) -> Result<Response, sqlx::Error> {
    let digest = payload_hash(body);
    let mut tx = pool.begin().await?;
    // TODO(2): one key makes at most one report, however its requests interleave and
    // whatever happens after the COMMIT (a lost answer, a timeout, a crash): the key's later
    // requests get that report back (200, "replayed": true), or 409 when their content
    // differs. As written, the key is ignored and every request makes a report.
    // Attacked by: replay, conflict, lost-answer, timeout, race, burst, crash.
    // (`lab exercise hint report-api` when you are stuck.)
    let _ = key;
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO reports (task_id, report_type, payload_hash) VALUES ($1, $2, $3) RETURNING id",
    )
    .bind(body.task_id)
    .bind(&body.report_type)
    .bind(&digest)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(answer(
        StatusCode::CREATED,
        json!({"report_id": id, "replayed": false}),
    ))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL").map_err(|_| "DATABASE_URL is not set")?;
    let port = std::env::var("PORT").unwrap_or_else(|_| "8000".into());
    // The URL's `options` carry the run's search_path: the tables, named without a schema,
    // are the run's own.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(10)
        .connect(&url)
        .await?;
    let app = Router::new()
        .route("/reports", post(create_report))
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .with_state(pool);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port.parse::<u16>()?)).await?;
    axum::serve(listener, app).await?;
    Ok(())
}
