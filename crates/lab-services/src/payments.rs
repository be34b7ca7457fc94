//! The payment service of the payments lesson: one charge per payment, however often it is asked.
//!
//! `POST /payments` with an `Idempotency-Key` header and a payment command
//! `{"tenant_id", "order_id", "amount", "currency"}` charges the payment provider once per key,
//! through the Redis idempotency coordinator [`idem`]:
//!
//! | request                                          | answer                                              |
//! |--------------------------------------------------|-----------------------------------------------------|
//! | a new key                                        | 200, the Charge (the provider charged)              |
//! | the same key, the same payment                   | 200, the same Charge, `Idempotent-Replayed: true`   |
//! | the same key while the first call still charges  | 409 `{"error": "payment_in_progress"}`, `Retry-After: 1` |
//! | the same key, another amount, order or currency  | 422 `{"error": "idempotency_key_reused"}`           |
//! | a key that is empty, blank, has `:`, > 255 chars | 400 `{"error": "invalid_idempotency_key"}`, before the coordinator |
//! | the provider's answer lost                       | 502 `{"error": "provider_outcome_unknown"}`: the outcome is unknown |
//! | Redis down, fail-closed policy                   | 503 `{"error": "idempotency_unavailable"}` with `Retry-After: 1`, nothing charged |
//!
//! The coordinator call is the lesson's `charge_once`: operation `payment.charge.<tenant hex>`
//! (tenants never share keys), the client's key, a TTL of one hour, in-flight mode `raise`, a
//! 30 s lease, and a fingerprint over `order_id`, `amount` and `currency`. The provider gets its
//! own key, `<operation>.<key>`, so a provider that deduplicates can stop a second charge when
//! our reservation could not (its answer was lost, Redis was down, a record expired).
//!
//! `PUT /config` switches what the lab compares: the coordinator's policy (`compatible`, as
//! idempotency-kit 0.4.1, or `hardened`), the 400 guard for invalid keys, the lease, how long
//! the coordinator waits for one Redis command (`command_timeout_ms`), and whether a command
//! whose connection was dropped is sent again on a fresh one (`resend_on_dropped`, on by
//! default: a Redis restart or a blip then costs no payment its protection).
//!
//! What the coordinator does is narrated as it happens (reserved, replayed, in flight, Redis
//! down…): its events are collected during the call and told at the next point where the
//! handler can pause, so the story keeps the order in which things happened.

use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument as _;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use idem::{
    Coordinator, EventKind, InFlight, Policy, Request, Source, Stage, StorageCause, StorageError,
    Unprotected,
};
use lab_core::{Arg, Checkpoints, Msg};
use lab_infra::Needs;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio_util::task::TaskTracker;

use crate::api::{ApiError, JsonBody, Stats, method_not_allowed, not_found};
use crate::provider::{self, Charge, ChargeAnswer, ChargeRequest};
use crate::spec::{Checkpoint, RedisLink, ServiceEnv, ServiceError, ServiceSpec, Voice};

/// The service's name: in narration, and the name of its fault-proxy hop.
pub const NAME: &str = "payments";

/// Checkpoint: the key is reserved (or the call runs unprotected) and the provider is about to
/// be called. A scenario holds a first call here to send a second one "while it charges".
pub const IN_ACTION: &str = "payments.in_action";

/// Checkpoint: the provider has answered the charge (or failed to) and the coordinator has not
/// stored anything yet. A scenario holds a call here to break something *after* the money
/// moved: the holder crashes, or Redis goes away before the result is stored.
pub const CHARGED: &str = "payments.charged";

/// Checkpoint: a call met another call's reservation of its key (idempotency-kit's "in
/// flight"), whatever the mode then does with it: raise answers 409, wait polls. Reached from a
/// task of its own, so a notice installed here tells a scenario "the duplicate is waiting"
/// without holding anything.
pub const MET_IN_FLIGHT: &str = "payments.met_in_flight";

/// How long a payment's result is kept: an hour, as in the lesson.
pub const RESULT_TTL: Duration = Duration::from_secs(3600);

/// The lesson's lease: longer than the worst charge, provider timeout included.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// How long the coordinator gives one Redis command before it decides without Redis (fails open
/// or closed), unless `PUT /config` says otherwise. Generous on purpose: a healthy Redis on a
/// loaded machine (a course CI running several labs at once) can take a few hundred
/// milliseconds, and a spurious timeout would change a story that is not about outages. The
/// lesson about the bound, `redis-down`, sets idem's own 250 ms (`command_timeout_ms`).
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the provider may take to answer. Shorter than the lease, or a slow provider would
/// outlive the reservation.
const PROVIDER_TIMEOUT: Duration = Duration::from_secs(10);

/// The payment service, as the lab starts it.
pub static SPEC: ServiceSpec = ServiceSpec {
    name: NAME,
    title: "payment service",
    needs: Needs {
        postgres: false,
        redis: true,
    },
    schema: "",
    calls: &[&provider::SPEC],
    checkpoints: &[
        Checkpoint {
            name: IN_ACTION,
            about: "the key is reserved; the provider is about to be called",
        },
        Checkpoint {
            name: CHARGED,
            about: "the provider has answered; the result is not stored yet",
        },
    ],
    demo: DEMO,
    router: |env| Ok(Payments::from_env(env)?.router()),
};

const DEMO: &str = r#"  # pay, then pay again with the same key: one charge, the second answer is a replay
  curl -i -X POST {url}/payments -H 'Content-Type: application/json' -H 'Idempotency-Key: K1' \
       -d '{"tenant_id":"6f1c2d3e-4a5b-4c6d-8e7f-0a1b2c3d4e5f","order_id":"0b7e4c1a-2d3f-4e5a-9b6c-7d8e9f0a1b2c","amount":1990,"currency":"RUB"}'
  # the same key with another amount: 422; an invalid key: 400
  # cut the services' link to Redis, pay twice with a new key: fail-open charges twice
  curl -s -X POST {api}/proxies/redis -d '{"enabled":false}'
  curl -s -X PUT {direct}/config -H 'Content-Type: application/json' -d '{"policy":"hardened"}'"#;

/// A payment command, as the service receives it after authentication. An unknown field is
/// refused (422): the fingerprint covers the fields below only, so a client's `"capture": false`
/// would be ignored and a retry with another value replayed as the same payment.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Payment {
    pub tenant_id: String,
    pub order_id: String,
    /// Positive, in kopecks.
    pub amount: i64,
    pub currency: String,
}

/// What a call does when its key is reserved by a call still running: idempotency-kit's
/// `in_flight`. The lesson's service uses `raise`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InFlightName {
    /// Answer at once: 409 `payment_in_progress` with `Retry-After`.
    #[default]
    Raise,
    /// Wait for the first call's result, at most one lease; a key freed meanwhile (the first
    /// call failed, or its lease expired) is reserved, and the action runs again.
    Wait,
    /// No reservation: read, run, store if the key is still free. Duplicates run side by side.
    Run,
}

impl From<InFlightName> for InFlight {
    fn from(mode: InFlightName) -> InFlight {
        match mode {
            InFlightName::Raise => InFlight::Raise,
            InFlightName::Wait => InFlight::Wait,
            InFlightName::Run => InFlight::Run,
        }
    }
}

/// Which coordinator policy the service uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyName {
    /// idempotency-kit 0.4.1, as the lesson shows it: fail-open, no owner token, minute TTLs.
    Compatible,
    /// Owner tokens, lease renewal, fencing, fail-closed, exact TTLs.
    Hardened,
}

/// The service's switches (`PUT /config`; every field optional).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PaymentConfig {
    pub policy: PolicyName,
    /// Answer 400 to an invalid key before the coordinator sees it.
    pub key_guard: bool,
    /// The reservation's lease, in milliseconds.
    pub lease_ms: u64,
    /// How long the coordinator waits for one Redis command, in milliseconds.
    pub command_timeout_ms: u64,
    /// A command whose connection to Redis was dropped is sent once more on a fresh one
    /// (`idem::Policy::resend_on_dropped`); `false` is the broken design of a client that does
    /// not reconnect and retry, which leaves the first payment after a blip unprotected.
    pub resend_on_dropped: bool,
    /// What a call does when another call holds its key (`raise` in the lesson).
    pub in_flight: InFlightName,
    /// Before charging, ask the provider whether a charge under the provider key exists
    /// (`GET /charges?key=…`) and return it instead of charging again: the lesson's status
    /// query for a provider that does not remove duplicates. Safe only once an earlier call can
    /// no longer be in flight at the provider (a charge still running is not listed yet).
    pub ask_provider_first: bool,
}

impl Default for PaymentConfig {
    fn default() -> PaymentConfig {
        PaymentConfig {
            policy: PolicyName::Compatible,
            key_guard: true,
            lease_ms: DEFAULT_LEASE.as_millis() as u64,
            command_timeout_ms: DEFAULT_COMMAND_TIMEOUT.as_millis() as u64,
            resend_on_dropped: true,
            in_flight: InFlightName::Raise,
            ask_provider_first: false,
        }
    }
}

/// A change to the switches (`PUT /config`): only the fields given change.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PaymentChange {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyName>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_guard: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command_timeout_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resend_on_dropped: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<InFlightName>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ask_provider_first: Option<bool>,
}

impl crate::api::ConfigRequest for PaymentChange {
    type Config = PaymentConfig;
}

impl PaymentConfig {
    /// The coordinator policy these switches mean (the lesson's `in_flight="raise"` unless
    /// `PUT /config` chose another mode).
    pub fn policy(&self) -> Policy {
        let base = match self.policy {
            PolicyName::Compatible => Policy::compatible(),
            PolicyName::Hardened => Policy::hardened(),
        };
        base.in_flight(self.in_flight.into())
            .lease(Duration::from_millis(self.lease_ms))
            .command_timeout(Duration::from_millis(self.command_timeout_ms))
            .resend_on_dropped(self.resend_on_dropped)
    }
}

/// The service's state.
#[derive(Clone)]
pub struct Payments {
    redis: RedisLink,
    /// Every coordinator key of this service starts with it: `lab:<run>:idempotency:`.
    prefix: String,
    provider_url: String,
    http: reqwest::Client,
    config: Arc<Mutex<PaymentConfig>>,
    /// Requests received on `POST /payments` (`GET /stats`).
    requests: Arc<std::sync::atomic::AtomicU64>,
    voice: Voice,
    checkpoints: Checkpoints,
    tasks: TaskTracker,
}

/// The lesson's fingerprint of a payment: what must not change between a request and its
/// retries (`fingerprint_of(order_id=…, amount=…, currency=…)` in the Python lesson).
pub fn fingerprint(order_id: &uuid::Uuid, amount: i64, currency: &str) -> String {
    idem::fingerprint_of(&json!({
        "order_id": order_id.hyphenated().to_string(),
        "amount": amount,
        "currency": currency,
    }))
}

/// The coordinator keys of a run: `<run prefix>idempotency:<operation>:<key>`.
pub fn key_prefix(run_prefix: &str) -> String {
    format!("{run_prefix}{}", idem::DEFAULT_PREFIX)
}

/// The lesson's operation name: tenants never share keys.
pub fn operation(tenant_id: &uuid::Uuid) -> String {
    format!("payment.charge.{}", tenant_id.simple())
}

impl Payments {
    pub fn from_env(env: ServiceEnv) -> Result<Payments, ServiceError> {
        Ok(Payments {
            redis: env.redis(NAME)?,
            prefix: key_prefix(&env.key_prefix),
            provider_url: env.peer(NAME, provider::NAME)?,
            // One connection per call: a fault on the provider's hop breaks exactly that call.
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .timeout(PROVIDER_TIMEOUT)
                .build()
                .map_err(|e| ServiceError::Io {
                    service: NAME,
                    source: std::io::Error::other(e),
                })?,
            config: Arc::default(),
            requests: Arc::default(),
            voice: env.voice,
            checkpoints: env.checkpoints,
            tasks: env.tasks,
        })
    }

    pub fn router(self) -> Router {
        Router::new()
            .route("/payments", post(pay))
            .route("/config", put(set_config).get(get_config))
            .route("/stats", get(stats))
            .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
            .fallback(not_found)
            .method_not_allowed_fallback(method_not_allowed)
            .with_state(self)
    }

    async fn tell(&self, msg: Msg) {
        self.voice.tell(NAME, msg).await;
    }

    /// Tells, in order, what the coordinator reported since the last time.
    async fn tell_heard(&self, heard: &Heard) {
        let said: Vec<Msg> = std::mem::take(&mut *heard.lock());
        for msg in said {
            self.tell(msg).await;
        }
    }
}

/// What the coordinator reported during one call, as narration, not yet told.
type Heard = Arc<Mutex<Vec<Msg>>>;

/// A client key as the narration shows it: an empty one as "(empty value)" (not `""`, which is
/// the draft's wire form of an empty string: the lab sends an empty header value), a long one
/// shortened (the keys a scenario sends on purpose to be refused are long).
pub fn shown_key(key: &str) -> Arg {
    const LONGEST_SHOWN: usize = 32;
    if key.is_empty() {
        Arg::from(Msg::new("key.empty_value"))
    } else if key.chars().count() > LONGEST_SHOWN {
        let start: String = key.chars().take(8).collect();
        // "kkkkkkkk… (256 characters)", in the narrative's language.
        Arg::from(
            Msg::new("key.shortened")
                .arg("start", start)
                .arg("length", key.chars().count()),
        )
    } else {
        Arg::from(key)
    }
}

/// The coordinator's events as the payment service tells them. Renewals are not told: how many
/// happen depends on the clock, and the story must not.
fn narrate(kind: &EventKind<'_>, key: &str, bound: Duration) -> Option<Msg> {
    let msg = match kind {
        EventKind::Reserved { fence: None } => Msg::new("payments.reserved"),
        EventKind::Reserved { fence: Some(fence) } => {
            Msg::new("payments.reserved_fenced").arg("fence", *fence as i64)
        }
        EventKind::Replayed => Msg::new("payments.replayed"),
        EventKind::InFlight => Msg::new("payments.in_flight"),
        EventKind::KeyReused => Msg::new("payments.key_reused"),
        EventKind::Completed { .. } => Msg::new("payments.completed"),
        EventKind::Released { .. } => Msg::new("payments.released"),
        EventKind::LeaseLost { .. } => Msg::new("payments.lease_lost"),
        EventKind::StorageError { error } => storage_error(error, bound),
        EventKind::Resent { stage } => Msg::new("payments.resent").arg("stage", stage_msg(*stage)),
        // Redis failed while the result was being stored: the charge is done, and only its
        // record is missing (the reservation stays until its lease expires).
        EventKind::RanUnprotected {
            why: Unprotected::Storage(error),
        } if error.stage == Stage::Complete => Msg::new("payments.not_stored"),
        EventKind::RanUnprotected { why } => {
            Msg::new("payments.unprotected").arg("why", unprotected(why))
        }
        EventKind::Renewed { .. } | EventKind::WaitTimedOut | EventKind::Superseded => return None,
    };
    Some(msg.arg("key", shown_key(key)))
}

fn stage_msg(stage: Stage) -> Msg {
    Msg::new(match stage {
        Stage::Reserve => "payments.stage.reserve",
        Stage::Read => "payments.stage.read",
        Stage::Complete => "payments.stage.complete",
        Stage::Release => "payments.stage.release",
        Stage::Renew => "payments.stage.renew",
    })
}

/// A Redis failure: no answer within the bound, or an error from the connection (one dropped
/// under the command, one refused); a record that does not decode.
fn storage_error(error: &StorageError, bound: Duration) -> Msg {
    let key = match &error.cause {
        StorageCause::Timeout(_) => "payments.redis_down",
        StorageCause::Redis(_) => "payments.redis_dropped",
        StorageCause::Corrupt(_) => "payments.redis_corrupt",
    };
    Msg::new(key)
        .arg("stage", stage_msg(error.stage))
        .arg("ms", bound.as_millis() as i64)
}

fn unprotected(why: &Unprotected) -> Msg {
    match why {
        Unprotected::InvalidKey(_) => Msg::new("payments.why.invalid_key"),
        Unprotected::Storage(_) => Msg::new("payments.why.storage"),
        _ => Msg::new("payments.why.other"),
    }
}

/// Why the provider gave no usable answer.
#[derive(Debug, thiserror::Error)]
enum ChargeError {
    #[error("no answer from the provider: {0}")]
    Unreachable(String),
    #[error("the provider refused: {status} {body}")]
    Refused { status: u16, body: String },
}

fn invalid(message: &str) -> ApiError {
    ApiError::client(
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_request",
        message.to_string(),
    )
}

/// Checks the payment command; returns the tenant's and the order's ids.
fn validate(payment: &Payment) -> Result<(uuid::Uuid, uuid::Uuid), ApiError> {
    let tenant = uuid::Uuid::parse_str(&payment.tenant_id)
        .map_err(|_| invalid("tenant_id must be a UUID"))?;
    let order =
        uuid::Uuid::parse_str(&payment.order_id).map_err(|_| invalid("order_id must be a UUID"))?;
    if payment.amount <= 0 {
        return Err(invalid("amount must be a positive integer (kopecks)"));
    }
    if payment.currency.len() != 3 || !payment.currency.chars().all(|c| c.is_ascii_uppercase()) {
        return Err(invalid("currency must be three capital letters, e.g. RUB"));
    }
    Ok((tenant, order))
}

/// The client's key, exactly as sent (the coordinator trims and validates it).
fn client_key(headers: &HeaderMap) -> Result<String, ApiError> {
    crate::api::key_header(headers)?
        .map(str::to_string)
        .ok_or_else(|| {
            ApiError::bad_request(
                "missing_idempotency_key",
                "a payment needs an Idempotency-Key: one per payment, the same on every retry",
            )
        })
}

/// `POST /payments`: charge once per key.
///
/// The work runs in a task of its own, as the report service's does: a client that gives up must
/// not cancel a charge halfway (and leave a reservation nobody releases).
async fn pay(
    State(service): State<Payments>,
    headers: HeaderMap,
    JsonBody(payment): JsonBody<Payment>,
) -> Result<Response, ApiError> {
    service
        .requests
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let (tenant, order) = match validate(&payment) {
        Ok(ids) => ids,
        Err(refused) => {
            service.tell(Msg::new("payments.invalid_payment")).await;
            return Err(refused);
        }
    };
    let key = client_key(&headers)?;
    let tasks = service.tasks.clone();
    tasks
        .spawn(charge_once(service, tenant, order, payment, key).in_current_span())
        .await
        .unwrap_or_else(|_| {
            Err(ApiError::client(
                StatusCode::SERVICE_UNAVAILABLE,
                "handler_failed",
                "the service could not finish this payment; retry with the same key",
            ))
        })
}

/// The lesson's `charge_once`.
#[tracing::instrument(skip_all, fields(key, provider_key, order = %order, tenant = %tenant))]
async fn charge_once(
    service: Payments,
    tenant: uuid::Uuid,
    order: uuid::Uuid,
    payment: Payment,
    key: String,
) -> Result<Response, ApiError> {
    tracing::Span::current().record("key", key.as_str());
    let config = *service.config.lock();
    let operation = operation(&tenant);
    if config.key_guard
        && let Err(why) = idem::validate(&operation, &key)
    {
        service.tell(Msg::new("payments.rejected_key")).await;
        return Err(ApiError::bad_request(
            "invalid_idempotency_key",
            why.to_string(),
        ));
    }
    let fingerprint = fingerprint(&order, payment.amount, &payment.currency);
    let provider_key = format!("{operation}.{}", idem::normalise_key(&key));
    tracing::Span::current().record("provider_key", provider_key.as_str());

    let heard: Heard = Arc::default();
    let coordinator = service.coordinator(&config, &heard);
    let request = Request::new(&operation, &key, RESULT_TTL).fingerprint(&fingerprint);
    let charge = ChargeRequest {
        order_id: payment.order_id.clone(),
        amount: payment.amount,
        currency: payment.currency.clone(),
    };
    let result = coordinator
        .coordinate(request, |_fence| async {
            service.tell_heard(&heard).await;
            if config.ask_provider_first {
                if let Some(found) = charge_at_provider(&service, &provider_key).await {
                    service
                        .tell(
                            Msg::new("payments.found_at_provider")
                                .arg("id", found.charge_id.as_str()),
                        )
                        .await;
                    return Ok(found);
                }
                service.tell(Msg::new("payments.none_at_provider")).await;
            }
            service.checkpoints.reached(IN_ACTION).await;
            let charged = call_provider(&service, &provider_key, &charge).await;
            service.checkpoints.reached(CHARGED).await;
            charged
        })
        .await;
    service.tell_heard(&heard).await;
    match &result {
        Ok(charged) => {
            tracing::info!(source = ?charged.source, charge_id = charged.value.charge_id, "payment answered");
        }
        Err(error) => tracing::info!(%error, "payment not charged"),
    }
    let charged = result?;
    let mut response = (StatusCode::OK, Json(charged.value)).into_response();
    if matches!(charged.source, Source::Replayed) {
        response
            .headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(response)
}

impl Payments {
    /// A coordinator for one call. One per call, not one per service, on purpose: its policy is
    /// the service's switches *now* (`PUT /config` changes them between two calls of a story),
    /// and its observer collects this call's events into this call's narration. Both are cheap:
    /// the Redis connection is shared, and the scripts are loaded once per connection.
    fn coordinator(&self, config: &PaymentConfig, heard: &Heard) -> Coordinator<RedisLink> {
        let policy = config.policy();
        let bound = policy.command_timeout;
        let heard = heard.clone();
        let checkpoints = self.checkpoints.clone();
        Coordinator::new(self.redis.clone(), policy)
            .with_prefix(self.prefix.clone())
            .with_observer(move |event| {
                if matches!(event.kind, EventKind::InFlight) {
                    // The observer cannot wait; the checkpoint is reached beside the call.
                    let checkpoints = checkpoints.clone();
                    tokio::spawn(async move { checkpoints.reached(MET_IN_FLIGHT).await });
                }
                if let Some(msg) = narrate(&event.kind, event.key, bound) {
                    heard.lock().push(msg);
                }
            })
    }
}

/// What the coordinator's refusals and failures mean for the client: the table at the top of
/// this module, row by row.
impl From<idem::Error<ChargeError>> for ApiError {
    fn from(error: idem::Error<ChargeError>) -> ApiError {
        match error {
            idem::Error::InProgress { .. } => ApiError::client(
                StatusCode::CONFLICT,
                "payment_in_progress",
                "a payment with this key is being charged right now; retry in a second",
            )
            .retry_after(1),
            idem::Error::KeyReused { .. } => ApiError::client(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency_key_reused",
                "this Idempotency-Key was used for a payment with other parameters",
            ),
            idem::Error::Invalid(why) => {
                ApiError::bad_request("invalid_idempotency_key", why.to_string())
            }
            idem::Error::Storage(_) => ApiError::client(
                StatusCode::SERVICE_UNAVAILABLE,
                "idempotency_unavailable",
                "the idempotency store is unavailable, so nothing was charged; retry later with the same key",
            )
            // RFC 9110's header for a 503: when to come back. One second, as for a 409.
            .retry_after(1),
            idem::Error::Action(ChargeError::Unreachable(reason)) => ApiError::client(
                StatusCode::BAD_GATEWAY,
                "provider_outcome_unknown",
                format!(
                    "no answer from the payment provider ({reason}): the charge may or may not have happened; retry with the same key"
                ),
            ),
            idem::Error::Action(ChargeError::Refused { status, body }) => ApiError::client(
                StatusCode::BAD_GATEWAY,
                "provider_refused",
                format!("the payment provider refused the charge: {status} {body}"),
            ),
        }
    }
}

/// The provider's charge under `provider_key`, if it lists one (`GET /charges?key=…`). A
/// failed query is no answer: the caller charges as it would without asking.
async fn charge_at_provider(service: &Payments, provider_key: &str) -> Option<Charge> {
    #[derive(Deserialize)]
    struct Listed {
        charges: Vec<Charge>,
    }
    let url = reqwest::Url::parse_with_params(
        &format!("{}/charges", service.provider_url),
        [("key", provider_key)],
    )
    .ok()?;
    let listed: Listed = service.http.get(url).send().await.ok()?.json().await.ok()?;
    listed.charges.into_iter().next()
}

/// Charges at the provider with the provider key; narrates what came back.
#[tracing::instrument(skip(service, body))]
async fn call_provider(
    service: &Payments,
    provider_key: &str,
    body: &ChargeRequest,
) -> Result<Charge, ChargeError> {
    let sent = service
        .http
        .post(format!("{}/charges", service.provider_url))
        .header("Idempotency-Key", provider_key)
        .json(body)
        .send()
        .await;
    let answer = match sent {
        Ok(response) if response.status().is_success() => response
            .json::<ChargeAnswer>()
            .await
            .map_err(|e| e.to_string()),
        Ok(response) => {
            let status = response.status().as_u16();
            let body = response.text().await.unwrap_or_default();
            return Err(ChargeError::Refused { status, body });
        }
        Err(e) => Err(e.to_string()),
    };
    match answer {
        Ok(answer) => Ok(answer.charge),
        Err(reason) => {
            service
                .tell(Msg::new("payments.provider_lost").arg("key", provider_key))
                .await;
            Err(ChargeError::Unreachable(reason))
        }
    }
}

async fn set_config(
    State(service): State<Payments>,
    JsonBody(change): JsonBody<PaymentChange>,
) -> Result<Json<PaymentConfig>, ApiError> {
    // A lease is how long a reservation whose caller died blocks its key; longer than the
    // result is kept, it would outlive the very record it protects.
    let longest = RESULT_TTL.as_millis() as u64;
    if let Some(lease_ms) = change.lease_ms
        && !(1..=longest).contains(&lease_ms)
    {
        return Err(invalid(&format!(
            "lease_ms must be from 1 to {longest} (the result's TTL)"
        )));
    }
    // A bound longer than the client's patience would turn an outage into hanging calls.
    const LONGEST_BOUND_MS: u64 = 10_000;
    if let Some(bound) = change.command_timeout_ms
        && !(1..=LONGEST_BOUND_MS).contains(&bound)
    {
        return Err(invalid(&format!(
            "command_timeout_ms must be from 1 to {LONGEST_BOUND_MS}"
        )));
    }
    let mut config = service.config.lock();
    if let Some(policy) = change.policy {
        config.policy = policy;
    }
    if let Some(key_guard) = change.key_guard {
        config.key_guard = key_guard;
    }
    if let Some(lease_ms) = change.lease_ms {
        config.lease_ms = lease_ms;
    }
    if let Some(bound) = change.command_timeout_ms {
        config.command_timeout_ms = bound;
    }
    if let Some(resend) = change.resend_on_dropped {
        config.resend_on_dropped = resend;
    }
    if let Some(mode) = change.in_flight {
        config.in_flight = mode;
    }
    if let Some(ask) = change.ask_provider_first {
        config.ask_provider_first = ask;
    }
    Ok(Json(*config))
}

async fn get_config(State(service): State<Payments>) -> Json<PaymentConfig> {
    Json(*service.config.lock())
}

/// `GET /stats`: how many payment requests this service received.
async fn stats(State(service): State<Payments>) -> Json<Stats> {
    Json(Stats {
        requests: service.requests.load(std::sync::atomic::Ordering::SeqCst),
    })
}
