//! The mock payment provider's contract, on a real socket: it counts charges, deduplicates by key
//! only when switched to, answers status queries, and refuses malformed requests with a 4xx.

use lab_services::provider;
use lab_services::{RunningService, ServiceEnv, launch};
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn start() -> RunningService {
    let env = ServiceEnv::default().with_key_prefix("lab:test:");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    launch(&provider::SPEC, env, listener).unwrap()
}

fn body() -> Value {
    json!({"order_id": "order-1", "amount": 1990, "currency": "RUB"})
}

async fn charge(http: &reqwest::Client, url: &str, key: &str) -> (StatusCode, Value) {
    let response = http
        .post(format!("{url}/charges"))
        .header("Idempotency-Key", key)
        .json(&body())
        .send()
        .await
        .unwrap();
    (response.status(), response.json().await.unwrap())
}

async fn count(http: &reqwest::Client, url: &str, query: &str) -> i64 {
    let body: Value = http
        .get(format!("{url}/charges{query}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    body["count"].as_i64().unwrap()
}

#[tokio::test]
async fn one_key_charges_twice_until_the_provider_deduplicates() {
    let service = start().await;
    let (url, http) = (service.url(), reqwest::Client::new());

    let (first, a) = charge(&http, &url, "k1").await;
    let (second, b) = charge(&http, &url, "k1").await;
    assert_eq!((first, second), (StatusCode::CREATED, StatusCode::CREATED));
    assert_ne!(a["charge_id"], b["charge_id"], "no dedup: two charges");
    assert_eq!(count(&http, &url, "").await, 2);

    let config = http
        .put(format!("{url}/config"))
        .json(&json!({"dedup_by_key": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(config.status(), StatusCode::OK);
    let (third, c) = charge(&http, &url, "k2").await;
    let (fourth, d) = charge(&http, &url, "k2").await;
    assert_eq!((third, fourth), (StatusCode::CREATED, StatusCode::OK));
    assert_eq!(c["charge_id"], d["charge_id"]);
    assert_eq!(d["replayed"], true);
    assert_eq!(count(&http, &url, "").await, 3);
    assert_eq!(count(&http, &url, "?key=k1").await, 2);
    assert_eq!(count(&http, &url, "?key=k2").await, 1);
    assert_eq!(count(&http, &url, "?key=none").await, 0);
    service.stop().await;
}

#[tokio::test]
async fn malformed_requests_get_a_4xx_with_a_json_body() {
    let service = start().await;
    let (url, http) = (service.url(), reqwest::Client::new());
    let cases = [
        (
            json!({"order_id": "o", "amount": 0, "currency": "RUB"}),
            422,
        ),
        (
            json!({"order_id": "o", "amount": -5, "currency": "RUB"}),
            422,
        ),
        (json!({"order_id": "", "amount": 5, "currency": "RUB"}), 422),
        (
            json!({"order_id": "o", "amount": 5, "currency": "rub"}),
            422,
        ),
        (
            json!({"order_id": "o", "amount": "5", "currency": "RUB"}),
            422,
        ),
        (json!({"amount": 5}), 422),
        // Found by the hostile-input property test: an unknown field was ignored, and charged.
        (
            json!({"order_id": "o", "amount": 5, "currency": "RUB", "capture": false}),
            422,
        ),
    ];
    for (body, status) in cases {
        let response = http
            .post(format!("{url}/charges"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), status, "{body}");
        let error: Value = response.json().await.unwrap();
        assert!(error["error"].is_string(), "{error}");
    }
    let not_json = http
        .post(format!("{url}/charges"))
        .header("content-type", "application/json")
        .body("{")
        .send()
        .await
        .unwrap();
    assert_eq!(not_json.status(), StatusCode::BAD_REQUEST);
    let bad_config = http
        .put(format!("{url}/config"))
        .json(&json!({"dedup": "yes"}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad_config.status(), StatusCode::UNPROCESSABLE_ENTITY);
    // Found by the hostile-input property test: a tab inside a key was charged under it.
    let (status, error) = charge(&http, &url, "k\t1").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(error["error"], "invalid_idempotency_key");
    // Found by the hostile-input property test: axum's query rejection was plain text.
    let twice = http
        .get(format!("{url}/charges?key=a&key=b"))
        .send()
        .await
        .unwrap();
    assert_eq!(twice.status(), StatusCode::BAD_REQUEST);
    let error: Value = twice.json().await.expect("a JSON error body");
    assert_eq!(error["error"], "invalid_query");
    let wrong_method = http.delete(format!("{url}/charges")).send().await.unwrap();
    assert_eq!(wrong_method.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(count(&http, &url, "").await, 0, "no charge from bad input");
    service.stop().await;
}

#[tokio::test]
async fn every_request_is_kept_with_the_key_it_sent_and_the_charge_it_got() {
    let service = start().await;
    let (url, http) = (service.url(), reqwest::Client::new());
    http.put(format!("{url}/config"))
        .json(&json!({"dedup_by_key": true}))
        .send()
        .await
        .unwrap();
    let (_, first) = charge(&http, &url, "shared").await;
    // Another order under the same key: the provider answers with the first order's charge.
    let other = http
        .post(format!("{url}/charges"))
        .header("Idempotency-Key", "shared")
        .json(&json!({"order_id": "order-2", "amount": 2490, "currency": "RUB"}))
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), StatusCode::OK);
    let listed: Value = http
        .get(format!("{url}/requests"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["count"], 2);
    let requests = listed["requests"].as_array().unwrap();
    assert_eq!(requests[0]["order_id"], "order-1");
    assert_eq!(requests[0]["replayed"], false);
    assert_eq!(requests[1]["order_id"], "order-2");
    assert_eq!(requests[1]["key"], "shared");
    assert_eq!(requests[1]["charge_id"], first["charge_id"]);
    assert_eq!(requests[1]["replayed"], true);
    assert_eq!(count(&http, &url, "").await, 1, "one charge, two requests");
    service.stop().await;
}

/// What the exercises' checks rely on to see a learner's service give up on a charge the lab
/// holds: the held handler is dropped when its caller's connection closes.
#[tokio::test]
async fn a_held_charge_is_abandoned_when_its_caller_goes_away() {
    let checkpoints = lab_core::Checkpoints::new();
    let env = ServiceEnv::default().with_checkpoints(checkpoints.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let service = launch(&provider::SPEC, env, listener).unwrap();
    let url = service.url();
    let hold = checkpoints.hold(provider::CHARGED);
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_millis(300))
        .build()
        .unwrap();
    let call = tokio::spawn(async move {
        client
            .post(format!("{url}/charges"))
            .header("Idempotency-Key", "k")
            .json(&body())
            .send()
            .await
    });
    let limit = std::time::Duration::from_secs(10);
    hold.entered(limit).await.unwrap();
    assert!(call.await.unwrap().is_err(), "the caller gave up");
    hold.abandoned(limit)
        .await
        .expect("the handler was dropped");
    hold.release();
    service.stop().await;
}
