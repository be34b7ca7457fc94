//! The relays of the chain (orders, gateway) against a scripted service below them: the key
//! travels unchanged, answers travel up unchanged, what gets no answer is retried within the
//! policy, and the broken design mints a key per attempt.

use std::sync::Arc;

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use lab_services::{RunningService, ServiceEnv, launch, orders, payments};
use parking_lot::Mutex;
use serde_json::{Value, json};

/// An answer of the service below: status, headers, body.
type Answer = (StatusCode, Vec<(&'static str, &'static str)>, Value);

/// What the service below answers to its n-th request (from 0), and the keys it saw.
#[derive(Clone)]
struct Below {
    keys: Arc<Mutex<Vec<String>>>,
    answer: fn(usize) -> Answer,
}

async fn start_below(below: Below) -> String {
    let app = Router::new().route(
        "/payments",
        post(move |headers: HeaderMap| {
            let below = below.clone();
            async move {
                let key = headers
                    .get("idempotency-key")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                let n = {
                    let mut keys = below.keys.lock();
                    keys.push(key);
                    keys.len() - 1
                };
                let (status, headers, body) = (below.answer)(n);
                let mut response = (status, axum::Json(body)).into_response();
                for (name, value) in headers {
                    response.headers_mut().insert(name, value.parse().unwrap());
                }
                response
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

async fn start_orders(below_url: String) -> RunningService {
    let env = ServiceEnv::default()
        .with_key_prefix("lab:test:")
        .with_peer(payments::NAME, below_url);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    launch(&orders::SPEC, env, listener).unwrap()
}

fn payment() -> Value {
    json!({"tenant_id": "6f1c2d3e-4a5b-4c6d-8e7f-0a1b2c3d4e5f",
           "order_id": "0b7e4c1a-2d3f-4e5a-9b6c-7d8e9f0a1b2c", "amount": 1990, "currency": "RUB"})
}

async fn pay(orders: &RunningService) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}/orders/pay", orders.url()))
        .header("Idempotency-Key", "C1")
        .json(&payment())
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn an_answer_from_below_goes_up_unchanged_and_is_not_retried() {
    let keys = Arc::default();
    let url = start_below(Below {
        keys: Arc::clone(&keys),
        answer: |_| {
            (
                StatusCode::CONFLICT,
                vec![("retry-after", "1")],
                json!({"error": "payment_in_progress"}),
            )
        },
    })
    .await;
    let orders = start_orders(url).await;
    let response = pay(&orders).await;
    assert_eq!(response.status(), StatusCode::CONFLICT);
    assert_eq!(response.headers()["retry-after"], "1");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"], "payment_in_progress");
    assert_eq!(*keys.lock(), ["C1"], "a definite answer is not retried");
    orders.stop().await;
}

#[tokio::test]
async fn a_temporary_failure_is_retried_with_the_same_key() {
    let keys = Arc::default();
    let url = start_below(Below {
        keys: Arc::clone(&keys),
        answer: |n| match n {
            0 => (
                StatusCode::SERVICE_UNAVAILABLE,
                vec![],
                json!({"error": "busy"}),
            ),
            _ => (
                StatusCode::OK,
                vec![("idempotent-replayed", "true")],
                json!({"charge_id": "ch_1"}),
            ),
        },
    })
    .await;
    let orders = start_orders(url).await;
    let response = pay(&orders).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["idempotent-replayed"], "true");
    assert_eq!(*keys.lock(), ["C1", "C1"]);
    let stats: Value = reqwest::get(format!("{}/stats", orders.url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(stats["requests"], 1);
    orders.stop().await;
}

#[tokio::test]
async fn the_policy_bounds_the_retries_and_the_outcome_stays_unknown() {
    let keys = Arc::default();
    let url = start_below(Below {
        keys: Arc::clone(&keys),
        answer: |_| {
            (
                StatusCode::BAD_GATEWAY,
                vec![],
                json!({"error": "provider_unreachable"}),
            )
        },
    })
    .await;
    let orders = start_orders(url).await;
    let response = pay(&orders).await;
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"], "upstream_unavailable");
    assert_eq!(keys.lock().len(), 3, "three attempts, no more");
    orders.stop().await;
}

#[tokio::test]
async fn no_answer_at_all_is_retried_too() {
    // A service below that accepts connections and closes them without a word.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let accepted = Arc::new(Mutex::new(0usize));
    tokio::spawn({
        let accepted = accepted.clone();
        async move {
            while let Ok((socket, _)) = listener.accept().await {
                *accepted.lock() += 1;
                drop(socket);
            }
        }
    });
    let orders = start_orders(url).await;
    let response = pay(&orders).await;
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(*accepted.lock(), 3);
    orders.stop().await;
}

#[tokio::test]
async fn a_relay_that_mints_keys_sends_a_new_one_every_attempt() {
    let keys = Arc::default();
    let url = start_below(Below {
        keys: Arc::clone(&keys),
        answer: |n| match n {
            0 => (
                StatusCode::SERVICE_UNAVAILABLE,
                vec![],
                json!({"error": "busy"}),
            ),
            _ => (StatusCode::OK, vec![], json!({"charge_id": "ch_2"})),
        },
    })
    .await;
    let orders = start_orders(url).await;
    let configured = reqwest::Client::new()
        .put(format!("{}/config", orders.url()))
        .json(&json!({"mint_keys": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(configured.status(), StatusCode::OK);
    assert_eq!(pay(&orders).await.status(), StatusCode::OK);
    let keys = keys.lock().clone();
    assert_eq!(keys.len(), 2);
    assert_ne!(keys[0], keys[1]);
    assert!(keys.iter().all(|k| k != "C1"), "{keys:?}");
    // Malformed input: 4xx with a JSON body.
    let bad = reqwest::Client::new()
        .post(format!("{}/orders/pay", orders.url()))
        .json(&payment())
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    let body: Value = bad.json().await.unwrap();
    assert_eq!(body["error"], "missing_idempotency_key");
    orders.stop().await;
}

/// Found by the hostile-input property test: a key with a tab went down the chain and was
/// charged under it. Now the relay refuses it before calling anyone.
#[tokio::test]
async fn a_key_with_a_control_character_is_refused_before_the_next_hop() {
    let keys = Arc::default();
    let url = start_below(Below {
        keys: Arc::clone(&keys),
        answer: |_| (StatusCode::OK, vec![], json!({"charge_id": "ch_1"})),
    })
    .await;
    let orders = start_orders(url).await;
    let response = reqwest::Client::new()
        .post(format!("{}/orders/pay", orders.url()))
        .header("Idempotency-Key", "k\t1")
        .json(&payment())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"], "invalid_idempotency_key");
    assert!(keys.lock().is_empty(), "nothing went down the chain");
    orders.stop().await;
}
