//! fail-closed-status-query, in Rust: one charge per payment with a provider that charges every
//! request (`provider_dedup = false`).
//!
//! The lesson's solution with three changes, each one a thing the provider's deduplication did
//! before: idem's hardened policy fails closed (Redis unreachable: 503, nothing charged) and
//! renews the reservation while the provider runs (a slow provider cannot outlive it); and the
//! action asks the provider first (`GET /charges?key=K`) and takes the charge it finds under
//! the payment's provider key instead of charging again (an answer lost, Redis lost mid-payment,
//! a crash after the charge: the retry finds the money that moved).
//!
//! The payment service of the payments lesson: `POST /payments` with an Idempotency-Key.
//!
//! One key is one payment, charged once, whatever fails:
//!
//! | request                             | answer                                                  |
//! |-------------------------------------|---------------------------------------------------------|
//! | a new key                           | 200, the Charge (the provider charged)                  |
//! | the same key, the same payment      | 200, the same Charge, `Idempotent-Replayed: true`       |
//! | the same key, the first call runs   | 409 `{"error": "payment_in_progress"}`, `Retry-After: 1` |
//! | the same key, another payment       | 422 `{"error": "idempotency_key_reused"}`               |
//! | an empty key, a colon, > 255        | 400 `{"error": "invalid_idempotency_key"}`, before anything |
//!
//! `idem` (the lab's coordinator, wire-compatible with idempotency-kit 0.4.1: a Python service
//! on the same Redis and prefix replays this one's Charges, and the other way round) reserves
//! the key before the charge, compares the fingerprint of what must not change between
//! retries, and stores the Charge for an hour. Redis is not enough on its own: the provider
//! also gets a key of its own, made of tenant, operation and the client's key, so it can refuse
//! a second charge when Redis could not (its answer was lost, Redis was down and the
//! coordinator failed open, the lease ran out under a slow provider).
//!
//! Run it alone: `PORT=8000 REDIS_URL=redis://127.0.0.1:6379/0 KEY_PREFIX=dev:idempotency:
//! PROVIDER_URL=http://127.0.0.1:9000 cargo run`

use std::time::Duration;

use axum::extract::{FromRequest, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idem::{Coordinator, InFlight, Policy, Source};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use serde::{Deserialize, Serialize};
use serde_json::json;
use uuid::Uuid;

/// The result is kept an hour: the longest a client retries one payment.
const RESULT_TTL: Duration = Duration::from_secs(3600);
/// How long the provider may take: shorter than the lease.
const PROVIDER_TIMEOUT: Duration = Duration::from_secs(10);

/// The payment command, as the service receives it after authentication. An unknown field is
/// refused: the fingerprint would not cover it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Payment {
    tenant_id: Uuid,
    order_id: Uuid,
    /// Kopecks.
    amount: i64,
    currency: String,
}

/// What a charge returns, stored and replayed as it is (the same JSON as the Python Charge).
#[derive(Clone, Serialize, Deserialize)]
struct Charge {
    charge_id: String,
    order_id: Uuid,
    amount: i64,
    currency: String,
}

#[derive(Clone)]
struct Service {
    coordinator: Coordinator<ConnectionManager>,
    provider_url: String,
    http: reqwest::Client,
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    (status, Json(json!({"error": code, "message": message}))).into_response()
}

/// The body as a payment, or a 422 with a JSON body (axum's own rejection is plain text).
struct Body(Payment);

impl<S: Send + Sync> FromRequest<S> for Body {
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Response> {
        let Json(payment) = Json::<Payment>::from_request(request, state)
            .await
            .map_err(|r| error(r.status(), "invalid_request", &r.body_text()))?;
        let currency_ok =
            payment.currency.len() == 3 && payment.currency.bytes().all(|b| b.is_ascii_uppercase());
        if payment.amount <= 0 || !currency_ok {
            return Err(error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_request",
                "amount must be positive (kopecks), currency three capital letters",
            ));
        }
        Ok(Body(payment))
    }
}

/// Why the provider gave no Charge.
enum ChargeError {
    /// No answer: the money may or may not have moved.
    Unknown(String),
    Refused(u16),
}

/// The status query: the charge the provider already made under `provider_key`, if any.
async fn charged_already(
    service: &Service,
    provider_key: &str,
) -> Result<Option<Charge>, ChargeError> {
    #[derive(Deserialize)]
    struct Listed {
        charges: Vec<Charge>,
    }
    let mut url = reqwest::Url::parse(&format!("{}/charges", service.provider_url))
        .map_err(|e| ChargeError::Unknown(e.to_string()))?;
    url.query_pairs_mut().append_pair("key", provider_key);
    let response = service
        .http
        .get(url)
        .send()
        .await
        .map_err(|e| ChargeError::Unknown(e.to_string()))?;
    if !response.status().is_success() {
        return Err(ChargeError::Unknown(format!(
            "the status query got {}",
            response.status()
        )));
    }
    let listed: Listed = response
        .json()
        .await
        .map_err(|e| ChargeError::Unknown(e.to_string()))?;
    Ok(listed.charges.into_iter().next())
}

/// The action: the charge already made under this key, else a new one. The provider charges
/// every request, so only asking it tells a retry after a lost answer from a first attempt.
async fn charge_once(
    service: &Service,
    payment: &Payment,
    provider_key: &str,
) -> Result<Charge, ChargeError> {
    match charged_already(service, provider_key).await? {
        Some(found) => Ok(found),
        None => charge(service, payment, provider_key).await,
    }
}

/// Moves the money: one call to the provider, with the provider's own key.
async fn charge(
    service: &Service,
    payment: &Payment,
    provider_key: &str,
) -> Result<Charge, ChargeError> {
    #[derive(Deserialize)]
    struct Charged {
        charge_id: String,
    }
    let response = service
        .http
        .post(format!("{}/charges", service.provider_url))
        .header("Idempotency-Key", provider_key)
        .json(&json!({
            "order_id": payment.order_id,
            "amount": payment.amount,
            "currency": payment.currency,
        }))
        .send()
        .await
        .map_err(|e| ChargeError::Unknown(e.to_string()))?;
    if !response.status().is_success() {
        return Err(ChargeError::Refused(response.status().as_u16()));
    }
    let charged: Charged = response
        .json()
        .await
        .map_err(|e| ChargeError::Unknown(e.to_string()))?;
    Ok(Charge {
        charge_id: charged.charge_id,
        order_id: payment.order_id,
        amount: payment.amount,
        currency: payment.currency.clone(),
    })
}

async fn pay(State(service): State<Service>, headers: HeaderMap, Body(payment): Body) -> Response {
    let Some(key) = headers
        .get("idempotency-key")
        .map(|v| v.to_str().unwrap_or("\u{fffd}"))
    else {
        return error(
            StatusCode::BAD_REQUEST,
            "missing_idempotency_key",
            "a payment needs an Idempotency-Key",
        );
    };
    // Tenants never share keys: the operation names the tenant.
    let operation = format!("payment.charge.{}", payment.tenant_id.simple());
    // Checked before the coordinator, which (as idempotency-kit 0.4.1) would run the charge
    // unprotected with an empty key, a colon or more than 255 characters, and store nothing.
    let ids = match idem::validate(&operation, key) {
        Ok(ids) => ids,
        Err(why) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_idempotency_key",
                &why.to_string(),
            );
        }
    };
    let provider_key = format!("{}.{}", ids.operation, ids.key);
    // What must not change between retries (idempotency-kit's fingerprint_of, byte for byte).
    let fingerprint = idem::fingerprint_of(&json!({
        "order_id": payment.order_id,
        "amount": payment.amount,
        "currency": payment.currency,
    }));
    let request = idem::Request::new(&operation, key, RESULT_TTL).fingerprint(&fingerprint);
    let result = service
        .coordinator
        .coordinate(request, |_fence| charge_once(&service, &payment, &provider_key))
        .await;
    match result {
        Ok(charged) => {
            let mut response = (StatusCode::OK, Json(charged.value)).into_response();
            if matches!(charged.source, Source::Replayed) {
                response
                    .headers_mut()
                    .insert("idempotent-replayed", HeaderValue::from_static("true"));
            }
            response
        }
        Err(idem::Error::InProgress { .. }) => {
            let mut response = error(
                StatusCode::CONFLICT,
                "payment_in_progress",
                "this payment is being charged; retry in a second",
            );
            response
                .headers_mut()
                .insert("retry-after", HeaderValue::from_static("1"));
            response
        }
        Err(idem::Error::KeyReused { .. }) => error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency_key_reused",
            "this Idempotency-Key was used for another payment",
        ),
        Err(idem::Error::Invalid(why)) => error(
            StatusCode::BAD_REQUEST,
            "invalid_idempotency_key",
            &why.to_string(),
        ),
        Err(idem::Error::Storage(_)) => {
            let mut response = error(
                StatusCode::SERVICE_UNAVAILABLE,
                "idempotency_unavailable",
                "nothing was charged; retry later with the same key",
            );
            response
                .headers_mut()
                .insert("retry-after", HeaderValue::from_static("1"));
            response
        }
        // The reservation was released; a retry with the same key asks the provider again,
        // with the same provider key, and the provider answers with the charge it made.
        Err(idem::Error::Action(ChargeError::Unknown(why))) => error(
            StatusCode::BAD_GATEWAY,
            "provider_outcome_unknown",
            &format!("no answer from the payment provider: {why}"),
        ),
        Err(idem::Error::Action(ChargeError::Refused(status))) => error(
            StatusCode::BAD_GATEWAY,
            "provider_refused",
            &format!("the payment provider refused: {status}"),
        ),
    }
}

fn env(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("{name} is not set"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port = std::env::var("PORT").unwrap_or_else(|_| "8000".into());
    let lease: u64 = std::env::var("LEASE_SECONDS")
        .unwrap_or_else(|_| "30".into())
        .parse()?;
    let client = redis::Client::open(env("REDIS_URL")?)?;
    // Quick to give up on a dead Redis (the coordinator's command timeout is the real bound),
    // and reconnecting by itself once Redis is back.
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_millis(500)))
        .set_response_timeout(Some(Duration::from_millis(500)))
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(100));
    let conn = ConnectionManager::new_lazy_with_config(client, config)?;
    // The hardened policy: fail closed, a reservation renewed every third of its lease while
    // the charge runs and released only by its owner; in_flight="raise" (409 at once), the lease
    // from LEASE_SECONDS.
    let policy = Policy::hardened()
        .in_flight(InFlight::Raise)
        .lease(Duration::from_secs(lease))
        .resend_on_dropped(true);
    let coordinator = Coordinator::new(conn, policy).with_prefix(
        std::env::var("KEY_PREFIX").unwrap_or_else(|_| idem::DEFAULT_PREFIX.to_string()),
    );
    let service = Service {
        coordinator,
        provider_url: env("PROVIDER_URL")?.trim_end_matches('/').to_string(),
        http: reqwest::Client::builder()
            .timeout(PROVIDER_TIMEOUT)
            .build()?,
    };
    let app = Router::new()
        .route("/payments", post(pay))
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .with_state(service);
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
