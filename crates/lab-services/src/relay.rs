//! A service in the middle of a chain: it takes a payment, passes it to the next service with the
//! client's Idempotency-Key, and retries what gets no answer. The gateway and the orders service
//! are both this, each in front of the next one.
//!
//! What a relay must get right is in [`relay_payment`]:
//!
//! - the client's key goes down **unchanged** on every attempt. A relay that mints its own key per
//!   attempt (`PUT /config {"mint_keys": true}`, the broken design the lab shows) turns each
//!   retry into a new payment further down;
//! - an answer from below (200, 409, 422, any 4xx) goes back up **unchanged**, status, body,
//!   `Retry-After` and `Idempotent-Replayed` included: the relay has no business second-guessing
//!   it;
//! - what gets no answer, or a 502/503/504, is retried under the [`RetryPolicy`]; when the
//!   attempts or the deadline run out, the caller gets 504 `upstream_unavailable`, an outcome that
//!   is still unknown, so it may retry with the same key.
//!
//! Each relay counts the requests it receives (`GET /stats`), which is how the lab measures how
//! often each hop was called.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use lab_core::Msg;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::api::{ApiError, JsonBody, Stats, method_not_allowed, not_found};
use crate::payments::{Payment, shown_key};
use crate::retry::{Jitter, RetryPolicy};
use crate::spec::{ServiceEnv, ServiceError, Voice};

/// Where a relay sits: its own name and route, and what it calls.
#[derive(Debug, Clone, Copy)]
pub struct RelayRoute {
    /// The relay's service name (narration, its fault-proxy hop).
    pub name: &'static str,
    /// The route it serves, e.g. `/checkout`.
    pub route: &'static str,
    /// The service it calls, and the route there.
    pub next: &'static str,
    pub next_route: &'static str,
}

/// The headers an answer from below keeps on its way up.
const KEPT_HEADERS: [HeaderName; 2] = [
    header::RETRY_AFTER,
    HeaderName::from_static("idempotent-replayed"),
];

/// A relay's state.
#[derive(Clone)]
pub struct Relay {
    place: RelayRoute,
    next_url: String,
    http: reqwest::Client,
    policy: RetryPolicy,
    jitter: Arc<Jitter>,
    /// The broken design: a new key for every attempt.
    mint_keys: Arc<AtomicBool>,
    /// Requests received on `place.route`.
    requests: Arc<AtomicU64>,
    voice: Voice,
}

/// The relay's switch (`PUT /config`).
#[derive(Debug, Clone, Copy, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RelayConfig {
    pub mint_keys: bool,
}

impl crate::api::ConfigRequest for RelayConfig {
    type Config = RelayConfig;
}

impl Relay {
    pub fn from_env(place: RelayRoute, env: ServiceEnv) -> Result<Relay, ServiceError> {
        Ok(Relay {
            place,
            next_url: env.peer(place.name, place.next)?,
            // One connection per call, so a fault on the next hop breaks exactly one call, and a
            // dropped connection is never reused.
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .map_err(|e| ServiceError::Io {
                    service: place.name,
                    source: std::io::Error::other(e),
                })?,
            policy: RetryPolicy::default(),
            jitter: Arc::new(Jitter::from_name(place.name)),
            mint_keys: Arc::default(),
            requests: Arc::default(),
            voice: env.voice,
        })
    }

    pub fn router(self) -> Router {
        Router::new()
            .route(self.place.route, post(relay_payment))
            .route("/stats", get(stats))
            .route("/config", put(set_config).get(get_config))
            .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
            .fallback(not_found)
            .method_not_allowed_fallback(method_not_allowed)
            .with_state(self)
    }

    async fn tell(&self, msg: Msg) {
        self.voice.tell(self.place.name, msg).await;
    }

    /// The key for attempt `attempt`: the client's, or (broken) a new one each time.
    fn key_for(&self, client_key: &str, attempt: u32) -> String {
        if self.mint_keys.load(Ordering::SeqCst) {
            format!("{client_key}.{}-{attempt}", self.place.name)
        } else {
            client_key.to_string()
        }
    }
}

/// An answer from below, as it goes back up.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        let mut response = (self.status, self.body).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        response.headers_mut().extend(self.headers);
        response
    }
}

/// Why an attempt gets another try.
enum Retryable {
    /// No answer: the outcome below is unknown.
    NoAnswer,
    /// A temporary refusal (502, 503, 504).
    Status(u16),
}

/// One call down the chain.
#[tracing::instrument(skip(relay, body, timeout))]
async fn attempt(
    relay: &Relay,
    key: &str,
    body: &Payment,
    timeout: Duration,
) -> Result<Answer, Retryable> {
    let sent = relay
        .http
        .post(format!("{}{}", relay.next_url, relay.place.next_route))
        .header("Idempotency-Key", key)
        .json(body)
        .timeout(timeout)
        .send()
        .await;
    let Ok(response) = sent else {
        return Err(Retryable::NoAnswer);
    };
    let status = response.status();
    if matches!(status.as_u16(), 502..=504) {
        return Err(Retryable::Status(status.as_u16()));
    }
    let mut headers = HeaderMap::new();
    for name in KEPT_HEADERS {
        if let Some(value) = response.headers().get(&name) {
            headers.insert(name, value.clone());
        }
    }
    // Headers came, the body did not: as good as no answer.
    let body = response.bytes().await.map_err(|_| Retryable::NoAnswer)?;
    Ok(Answer {
        status: StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY),
        headers,
        body,
    })
}

/// Takes a payment and relays it down the chain, retrying within the policy.
#[tracing::instrument(skip_all, fields(relay = relay.place.name, client_key))]
async fn relay_payment(
    State(relay): State<Relay>,
    headers: HeaderMap,
    JsonBody(payment): JsonBody<Payment>,
) -> Result<Response, ApiError> {
    relay.requests.fetch_add(1, Ordering::SeqCst);
    // Only what no service below could accept is refused here; the key's other rules (length,
    // `:`) are the payment service's, and its answer comes back up unchanged.
    let client_key = crate::api::key_header(&headers)?
        .ok_or_else(|| {
            ApiError::bad_request(
                "missing_idempotency_key",
                "a payment needs an Idempotency-Key",
            )
        })?
        .to_string();
    tracing::Span::current().record("client_key", client_key.as_str());
    let policy = relay.policy;
    let started = Instant::now();
    let next = relay.place.next;
    for n in 1..=policy.attempts {
        let left = policy.deadline.saturating_sub(started.elapsed());
        if left.is_zero() {
            break;
        }
        let key = relay.key_for(&client_key, n);
        relay
            .tell(
                Msg::new("relay.calling")
                    .arg("next", Msg::new(format!("service.{next}")))
                    .arg("key", shown_key(&key))
                    .arg("attempt", n)
                    .arg("attempts", policy.attempts),
            )
            .await;
        let why = match attempt(&relay, &key, &payment, policy.per_call.min(left)).await {
            Ok(answer) => {
                tracing::info!(attempt = n, status = answer.status.as_u16(), "answered");
                relay
                    .tell(
                        Msg::new("relay.answered")
                            .arg("next", Msg::new(format!("service.{next}")))
                            .arg("status", answer.status.as_u16()),
                    )
                    .await;
                return Ok(answer.into_response());
            }
            Err(Retryable::NoAnswer) => Msg::new("relay.no_answer"),
            Err(Retryable::Status(status)) => Msg::new("relay.status").arg("status", status),
        };
        tracing::info!(attempt = n, why = ?why.key, "no usable answer");
        if n == policy.attempts {
            break;
        }
        relay.back_off(&client_key, n, why).await;
    }
    relay
        .tell(Msg::new("relay.gave_up").arg("next", Msg::new(format!("service.{next}"))))
        .await;
    Err(ApiError::client(
        StatusCode::GATEWAY_TIMEOUT,
        "upstream_unavailable",
        format!(
            "no answer from {next} after the retries the policy allows: the payment may or may not have happened; retry with the same key"
        ),
    ))
}

impl Relay {
    /// Waits before attempt `n + 1`, after telling why and with which key it will be made.
    async fn back_off(&self, client_key: &str, n: u32, why: Msg) {
        let wait = self.jitter.backoff(&self.policy, n);
        let next_key = self.key_for(client_key, n + 1);
        let retry = if next_key == client_key {
            Msg::new("relay.retrying_same_key")
        } else {
            Msg::new("relay.retrying_new_key")
        };
        self.tell(
            retry
                .arg("next", Msg::new(format!("service.{}", self.place.next)))
                .arg("why", why)
                .arg("ms", wait)
                .arg("key", shown_key(&next_key)),
        )
        .await;
        // The backoff is the policy's, and real: spreading retries out is its whole point.
        tokio::time::sleep(wait).await;
    }
}

/// `GET /stats`: how many requests this relay received.
async fn stats(State(relay): State<Relay>) -> Json<Stats> {
    Json(Stats {
        requests: relay.requests.load(Ordering::SeqCst),
    })
}

async fn set_config(
    State(relay): State<Relay>,
    JsonBody(config): JsonBody<RelayConfig>,
) -> Json<RelayConfig> {
    relay.mint_keys.store(config.mint_keys, Ordering::SeqCst);
    Json(config)
}

async fn get_config(State(relay): State<Relay>) -> Json<RelayConfig> {
    Json(RelayConfig {
        mint_keys: relay.mint_keys.load(Ordering::SeqCst),
    })
}
