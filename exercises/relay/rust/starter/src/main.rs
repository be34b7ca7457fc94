//! The orders service of the payments lesson: the hop between the gateway and the payment
//! service.
//!
//! THE STARTER: it relays each payment once, and loses what the answer's headers say. The two
//! TODOs below are the lesson; each names the checks of `lab exercise check relay` that
//! attack it.
//!
//! `POST /orders/pay` takes the client's payment with its Idempotency-Key and relays it to the
//! payment service's `POST /payments`. What a hop in the middle of a chain must get right:
//!
//! - the client's key goes down **unchanged** on every attempt: a key minted per attempt turns
//!   each retry into a new payment further down;
//! - an answer from below (200, 409, 422, any 4xx) goes up **unchanged**, status, body,
//!   `Retry-After` and `Idempotent-Replayed` included;
//! - what gets no answer (a timeout, a dropped connection) or a 502, 503, 504 has an unknown or
//!   temporary outcome, and is retried: at most [`ATTEMPTS`] calls, each with its own timeout,
//!   all within one [`DEADLINE`], with exponential backoff and jitter between them. When they
//!   run out, the client gets 504: the outcome is still unknown; it may retry with the same key.
//!
//! Run it alone: `PORT=8000 PAYMENTS_URL=http://127.0.0.1:9000 cargo run`

use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

/// The bounds of the retries: a charge takes milliseconds here; a second is a slow callee.
const ATTEMPTS: u32 = 3;
const PER_CALL: Duration = Duration::from_secs(1);
/// The manifest's `deadline_ms` says the same.
const DEADLINE: Duration = Duration::from_secs(3);
const BACKOFF_BASE: Duration = Duration::from_millis(100);
const BACKOFF_CAP: Duration = Duration::from_secs(1);
/// The starter's one attempt gives up after this long (reqwest has no timeout of its own).
const STARTER_TIMEOUT: Duration = Duration::from_secs(10);

/// The headers of an answer from below that go up with it.
const KEPT_HEADERS: [&str; 2] = ["retry-after", "idempotent-replayed"];

#[derive(Clone)]
struct Relay {
    payments_url: String,
    http: reqwest::Client,
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    (status, Json(json!({"error": code, "message": message}))).into_response()
}

/// The pause after failed attempt `attempt`: between half and all of `base · 2^(attempt−1)`,
/// capped. The random half spreads the retries of many clients apart (jitter).
fn backoff(attempt: u32) -> Duration {
    let ceiling = BACKOFF_BASE
        .saturating_mul(1 << (attempt - 1).min(16))
        .min(BACKOFF_CAP);
    ceiling.mul_f64(rand::random_range(0.5..=1.0))
}

/// An answer from below, as it goes up: its status, its body, the headers the client needs.
async fn passed_up(answer: reqwest::Response) -> Option<Response> {
    let status = StatusCode::from_u16(answer.status().as_u16()).ok()?;
    let mut headers = HeaderMap::new();
    // TODO(pass-through, conflict-passed-up): the client gets the payment service's answer as
    // it was given, the headers it acts on included (a 409's Retry-After, a replay's
    // Idempotent-Replayed). As written, only the status and the body go up.
    let _ = (KEPT_HEADERS, HeaderName::from_static);
    headers.insert(header::CONTENT_TYPE, "application/json".parse().ok()?);
    // Headers came, the body did not: as good as no answer.
    let body = answer.bytes().await.ok()?;
    Some((status, headers, body).into_response())
}

async fn pay(State(relay): State<Relay>, headers: HeaderMap, body: Bytes) -> Response {
    let Some(key) = headers.get("idempotency-key").cloned() else {
        return error(
            StatusCode::BAD_REQUEST,
            "missing_idempotency_key",
            "a payment needs an Idempotency-Key",
        );
    };
    // TODO(key-unchanged, lost-both, gateway-errors-retried, timeout-retried, deadline, backoff):
    // a payment whose outcome is unknown or temporary (no answer, a timeout, a dropped
    // connection, a 502, 503 or 504) is tried again, and the payment service must see every
    // try as the same payment; the client gets an answer within the deadline, the tries are
    // bounded in number, and the pauses between them grow and differ from payment to payment.
    // An answer from the payment service (200, 409, 422, any 4xx) is final. As written, each
    // payment is sent once, and a lost answer becomes 504. (This one attempt waits at most
    // STARTER_TIMEOUT.) (`lab exercise hint relay` when you are stuck.)
    let _ = (Instant::now, ATTEMPTS, PER_CALL, DEADLINE, backoff);
    let sent = relay
        .http
        .post(format!("{}/payments", relay.payments_url))
        .header("idempotency-key", key)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body)
        .timeout(STARTER_TIMEOUT)
        .send()
        .await;
    if let Ok(answer) = sent
        && !matches!(answer.status().as_u16(), 502..=504)
        && let Some(response) = passed_up(answer).await
    {
        return response;
    }
    error(
        StatusCode::GATEWAY_TIMEOUT,
        "upstream_unavailable",
        "no answer from the payment service: the payment may or may not have happened; retry with the same key",
    )
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port = std::env::var("PORT").unwrap_or_else(|_| "8000".into());
    let payments_url = std::env::var("PAYMENTS_URL").map_err(|_| "PAYMENTS_URL is not set")?;
    let relay = Relay {
        payments_url: payments_url.trim_end_matches('/').to_string(),
        http: reqwest::Client::new(),
    };
    let app = Router::new()
        .route("/orders/pay", post(pay))
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .with_state(relay);
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
