//! The mock payment provider of the payments lesson: the outside world that actually moves money.
//!
//! It is a real HTTP server; only its business is made up. It counts every charge it makes, and
//! it can deduplicate by the caller's key, as real providers do when their integration contract
//! says so (Stripe's `Idempotency-Key`):
//!
//! | request                                   | answer                                            |
//! |-------------------------------------------|---------------------------------------------------|
//! | `POST /charges` with a new key            | 201 `{"charge_id": "ch_N", "replayed": false, …}` |
//! | the same key again, dedup on              | 200, the same charge, `"replayed": true`          |
//! | the same key again, dedup off             | 201, a new charge: the money moves twice          |
//! | `GET /charges?key=K`                      | the charges made under K (a status query)         |
//! | `GET /charges`                            | every charge and the count                        |
//! | `GET /requests`                           | every `POST /charges` it got (the latest 10,000): the key sent, the order, and the charge it answered with |
//! | `PUT /config {"dedup_by_key": true}`      | switches deduplication for this provider          |
//!
//! A caller whose answer was lost cannot know whether the money moved; the lesson's point is that
//! an uncertain outcome needs a status query (`GET /charges?key=…`) or a provider that
//! deduplicates, before a new charge. The lab loses answers in the fault proxy, right after the
//! provider's `provider.charged` checkpoint.
//!
//! The charges live in memory: a provider is one process of the run, and its counter is read over
//! HTTP, as a real provider's dashboard would be. So do the requests it got: the lab's exercises
//! read them to name what a learner's service sent (two tenants' payments under one provider
//! key show as two requests answered with one charge).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use lab_core::{Checkpoints, Msg};
use lab_infra::Needs;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::api::{ApiError, JsonBody, QueryParams, method_not_allowed, not_found};
use crate::spec::{Checkpoint, ServiceEnv, ServiceError, ServiceSpec, Voice};

/// The service's name: in narration, and the name of its fault-proxy hop.
pub const NAME: &str = "provider";

/// Checkpoint: the charge is recorded and the answer is about to go out. Losing the answer here
/// is "the provider charged, but its response was lost".
pub const CHARGED: &str = "provider.charged";

/// The mock payment provider, as the lab starts it.
pub static SPEC: ServiceSpec = ServiceSpec {
    name: NAME,
    title: "payment provider",
    needs: Needs {
        postgres: false,
        redis: false,
    },
    schema: "",
    calls: &[],
    checkpoints: &[Checkpoint {
        name: CHARGED,
        about: "the charge is recorded; the answer is about to go out",
    }],
    demo: DEMO,
    router: |env| Ok(Provider::from_env(env)?.router()),
};

const DEMO: &str = r#"  # charge twice with one key: two charges, until the provider deduplicates
  curl -s -X POST {url}/charges -H 'Content-Type: application/json' -H 'Idempotency-Key: k1' \
       -d '{"order_id":"7f1c0e3a-0000-4000-8000-000000000001","amount":1990,"currency":"RUB"}'
  curl -s -X PUT {direct}/config -H 'Content-Type: application/json' -d '{"dedup_by_key":true}'
  curl -s '{direct}/charges?key=k1'"#;

/// The longest key the provider accepts.
pub const MAX_KEY_LEN: usize = 512;

/// A charge request. An unknown field is refused (422), as real providers do.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ChargeRequest {
    pub order_id: String,
    /// Positive, in minor units (kopecks).
    pub amount: i64,
    pub currency: String,
}

/// A charge the provider made.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Charge {
    pub charge_id: String,
    pub order_id: String,
    pub amount: i64,
    pub currency: String,
    /// The caller's key, when it sent one.
    pub key: Option<String>,
}

/// The answer to `POST /charges`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct ChargeAnswer {
    #[serde(flatten)]
    pub charge: Charge,
    pub replayed: bool,
}

/// A `POST /charges` the provider answered: what the caller sent, and the charge it got back
/// (a new one, or the one its key had already made).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct ChargeCall {
    /// The caller's key, when it sent one.
    pub key: Option<String>,
    pub order_id: String,
    pub amount: i64,
    pub currency: String,
    /// The charge it answered with.
    pub charge_id: String,
    /// It answered with a charge made before (dedup on, a key seen already).
    pub replayed: bool,
}

/// How many requests the provider remembers: the latest, for the lab's reads; older ones go.
pub const REQUESTS_KEPT: usize = 10_000;

/// The provider's state: its charges, the requests it answered, its dedup switch, and the lab's
/// hooks.
#[derive(Clone)]
pub struct Provider {
    charges: Arc<Mutex<Vec<Charge>>>,
    requests: Arc<Mutex<VecDeque<ChargeCall>>>,
    dedup_by_key: Arc<AtomicBool>,
    voice: Voice,
    checkpoints: Checkpoints,
}

impl Provider {
    pub fn from_env(env: ServiceEnv) -> Result<Provider, ServiceError> {
        Ok(Provider {
            charges: Arc::default(),
            requests: Arc::default(),
            dedup_by_key: Arc::default(),
            voice: env.voice,
            checkpoints: env.checkpoints,
        })
    }

    pub fn router(self) -> Router {
        Router::new()
            .route("/charges", post(create_charge).get(list_charges))
            .route("/requests", get(list_requests))
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

fn validate(req: &ChargeRequest) -> Result<(), ApiError> {
    let invalid = |message: &str| {
        ApiError::client(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            message.to_string(),
        )
    };
    if req.amount <= 0 {
        return Err(invalid("amount must be a positive integer (minor units)"));
    }
    if req.order_id.trim().is_empty()
        || req.order_id.len() > 64
        || req.order_id.chars().any(char::is_control)
    {
        return Err(invalid("order_id must be 1 to 64 printable characters"));
    }
    if req.currency.len() != 3 || !req.currency.chars().all(|c| c.is_ascii_uppercase()) {
        return Err(invalid("currency must be three capital letters, e.g. RUB"));
    }
    Ok(())
}

/// The caller's key, if any: printable ASCII, at most [`MAX_KEY_LEN`] characters.
fn provider_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(raw) = crate::api::key_header(headers)? else {
        return Ok(None);
    };
    let key = raw.trim();
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(ApiError::bad_request(
            "invalid_idempotency_key",
            "Idempotency-Key must be 1 to 512 characters",
        ));
    }
    Ok(Some(key.to_string()))
}

/// `POST /charges`: moves money, once per key when dedup is on.
#[tracing::instrument(skip_all, fields(key))]
async fn create_charge(
    State(provider): State<Provider>,
    headers: HeaderMap,
    JsonBody(req): JsonBody<ChargeRequest>,
) -> Result<Response, ApiError> {
    validate(&req)?;
    let key = provider_key(&headers)?;
    tracing::Span::current().record("key", key.as_deref());
    let dedup = provider.dedup_by_key.load(Ordering::SeqCst);
    // Find-or-create under one lock: two concurrent calls with one key cannot both charge when
    // dedup is on.
    let (charge, replayed) = {
        let mut charges = provider.charges.lock();
        let existing = key
            .as_ref()
            .filter(|_| dedup)
            .and_then(|k| charges.iter().find(|c| c.key.as_ref() == Some(k)).cloned());
        match existing {
            Some(charge) => (charge, true),
            None => {
                let charge = Charge {
                    charge_id: format!("ch_{}", charges.len() + 1),
                    order_id: req.order_id.clone(),
                    amount: req.amount,
                    currency: req.currency.clone(),
                    key: key.clone(),
                };
                charges.push(charge.clone());
                (charge, false)
            }
        }
    };
    {
        let mut requests = provider.requests.lock();
        if requests.len() == REQUESTS_KEPT {
            requests.pop_front();
        }
        requests.push_back(ChargeCall {
            key: key.clone(),
            order_id: req.order_id.clone(),
            amount: req.amount,
            currency: req.currency.clone(),
            charge_id: charge.charge_id.clone(),
            replayed,
        });
    }
    tracing::info!(
        charge_id = charge.charge_id,
        amount = charge.amount,
        replayed,
        dedup,
        "charge"
    );
    let msg = if replayed {
        Msg::new("provider.replayed").arg("id", &charge.charge_id)
    } else {
        Msg::new("provider.charged")
            .arg("id", &charge.charge_id)
            .arg("amount", charge.amount)
            .arg("key", key.as_deref().unwrap_or("-"))
    };
    provider.tell(msg).await;
    provider.checkpoints.reached(CHARGED).await;
    let status = if replayed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(ChargeAnswer { charge, replayed })).into_response())
}

/// `GET /charges[?key=K]` on the provider.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct ChargeList {
    pub count: usize,
    pub charges: Vec<Charge>,
}

/// `GET /requests` on the provider: every `POST /charges` it answered, oldest first.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct ChargeCallList {
    pub count: usize,
    pub requests: Vec<ChargeCall>,
}

#[derive(Debug, Deserialize)]
struct ChargesQuery {
    key: Option<String>,
}

/// `GET /charges[?key=K]`: the provider's own view, which the lab reads its facts from.
async fn list_charges(
    State(provider): State<Provider>,
    QueryParams(query): QueryParams<ChargesQuery>,
) -> Json<ChargeList> {
    let charges: Vec<Charge> = provider
        .charges
        .lock()
        .iter()
        .filter(|c| query.key.is_none() || c.key == query.key)
        .cloned()
        .collect();
    Json(ChargeList {
        count: charges.len(),
        charges,
    })
}

/// `GET /requests`: every `POST /charges` it answered (the latest [`REQUESTS_KEPT`]), oldest
/// first.
async fn list_requests(State(provider): State<Provider>) -> Json<ChargeCallList> {
    let requests: Vec<ChargeCall> = provider.requests.lock().iter().cloned().collect();
    Json(ChargeCallList {
        count: requests.len(),
        requests,
    })
}

/// The provider's switches.
#[derive(Debug, Clone, Copy, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    pub dedup_by_key: bool,
}

impl crate::api::ConfigRequest for ProviderConfig {
    type Config = ProviderConfig;
}

async fn set_config(
    State(provider): State<Provider>,
    JsonBody(config): JsonBody<ProviderConfig>,
) -> Json<ProviderConfig> {
    provider
        .dedup_by_key
        .store(config.dedup_by_key, Ordering::SeqCst);
    Json(config)
}

async fn get_config(State(provider): State<Provider>) -> Json<ProviderConfig> {
    Json(ProviderConfig {
        dedup_by_key: provider.dedup_by_key.load(Ordering::SeqCst),
    })
}
