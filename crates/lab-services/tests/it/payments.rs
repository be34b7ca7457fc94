//! The payment service's HTTP contract, on a real Redis and a real provider: one charge per key,
//! a replay marked as such, 409 while in flight, 422 for a changed payment, 400 for an invalid
//! key before the coordinator, 503 when Redis is gone and the policy fails closed, and a 4xx with
//! a JSON body for every malformed request.

use std::sync::Arc;

use lab_core::Checkpoints;
use lab_infra::{Needs, ServerOptions, Servers};
use lab_services::payments::{self, IN_ACTION};
use lab_services::{RunningService, ServiceEnv, launch, provider};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::Duration;

const TENANT: &str = "6f1c2d3e-4a5b-4c6d-8e7f-0a1b2c3d4e5f";
const ORDER: &str = "0b7e4c1a-2d3f-4e5a-9b6c-7d8e9f0a1b2c";

struct Fixture {
    servers: Servers,
    provider: RunningService,
    payments: RunningService,
    checkpoints: Checkpoints,
    http: reqwest::Client,
}

fn env(
    redis_url: Option<String>,
    peers: &[(&'static str, String)],
    checkpoints: &Checkpoints,
) -> ServiceEnv {
    let env = ServiceEnv::default()
        .with_key_prefix(format!("lab:test{}:", std::process::id()))
        .with_checkpoints(checkpoints.clone());
    let env = match redis_url {
        Some(url) => env.with_redis(url),
        None => env,
    };
    peers
        .iter()
        .fold(env, |env, (name, url)| env.with_peer(name, url.clone()))
}

impl Fixture {
    /// The services on a throwaway Redis, or on `redis_url` when given (a dead one).
    async fn new(redis_url: Option<&str>) -> Fixture {
        let servers = Servers::start(
            &ServerOptions::default(),
            Needs {
                postgres: false,
                redis: true,
            },
        )
        .await
        .unwrap();
        let redis_url = redis_url
            .map(str::to_string)
            .or_else(|| servers.redis.as_ref().map(|r| r.url.clone()));
        let checkpoints = Checkpoints::new();
        let bind = || tokio::net::TcpListener::bind("127.0.0.1:0");
        let provider = launch(
            &provider::SPEC,
            env(None, &[], &checkpoints),
            bind().await.unwrap(),
        )
        .unwrap();
        let payments = launch(
            &payments::SPEC,
            env(redis_url, &[(provider::NAME, provider.url())], &checkpoints),
            bind().await.unwrap(),
        )
        .unwrap();
        Fixture {
            servers,
            provider,
            payments,
            checkpoints,
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .unwrap(),
        }
    }

    async fn pay(
        &self,
        key: Option<&str>,
        body: Value,
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let mut request = self
            .http
            .post(format!("{}/payments", self.payments.url()))
            .json(&body);
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        let response = request.send().await.unwrap();
        let (status, headers) = (response.status(), response.headers().clone());
        (status, headers, response.json().await.unwrap())
    }

    async fn charges(&self) -> i64 {
        let body: Value = self
            .http
            .get(format!("{}/charges", self.provider.url()))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        body["count"].as_i64().unwrap()
    }

    async fn configure(&self, change: Value) {
        let response = self
            .http
            .put(format!("{}/config", self.payments.url()))
            .json(&change)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }

    /// `PUT /config` with `change`, expecting a refusal: the status and the JSON body.
    async fn configure_refused(&self, change: Value) -> (StatusCode, Value) {
        let response = self
            .http
            .put(format!("{}/config", self.payments.url()))
            .json(&change)
            .send()
            .await
            .unwrap();
        (response.status(), response.json().await.unwrap())
    }

    /// `GET /config`.
    async fn config(&self) -> Value {
        self.http
            .get(format!("{}/config", self.payments.url()))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    async fn finish(self) {
        self.payments.stop().await;
        self.provider.stop().await;
        self.servers.shutdown().await;
    }
}

fn payment(amount: i64) -> Value {
    json!({"tenant_id": TENANT, "order_id": ORDER, "amount": amount, "currency": "RUB"})
}

#[tokio::test(flavor = "multi_thread")]
async fn one_key_one_charge_and_every_retry_answered_as_the_lesson_says() {
    let f = Fixture::new(None).await;

    let (first, headers, charge) = f.pay(Some("K1"), payment(1990)).await;
    assert_eq!(first, StatusCode::OK);
    assert!(headers.get("idempotent-replayed").is_none());
    let (again, headers, replayed) = f.pay(Some("K1"), payment(1990)).await;
    assert_eq!(again, StatusCode::OK);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(replayed, charge);
    // A padded key is the same key.
    let (padded, _, replayed) = f.pay(Some("  K1 "), payment(1990)).await;
    assert_eq!((padded, &replayed), (StatusCode::OK, &charge));
    assert_eq!(f.charges().await, 1);

    let (changed, _, body) = f.pay(Some("K1"), payment(2490)).await;
    assert_eq!(changed, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"], "idempotency_key_reused");

    // "k\t1": found by the hostile-input property test, charged under a key with a tab.
    for key in ["", "   ", "order:1", &"k".repeat(256), "k\t1"] {
        let (status, _, body) = f.pay(Some(key), payment(1990)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "key {key:?}");
        assert_eq!(body["error"], "invalid_idempotency_key");
    }
    let (missing, _, body) = f.pay(None, payment(1990)).await;
    assert_eq!(missing, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"], "missing_idempotency_key");
    assert_eq!(f.charges().await, 1, "no charge for a refused request");
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_call_while_the_first_charges_gets_409_with_retry_after() {
    let f = Arc::new(Fixture::new(None).await);
    let hold = f.checkpoints.hold(IN_ACTION);
    let first = tokio::spawn({
        let f = f.clone();
        async move { f.pay(Some("K3"), payment(1990)).await }
    });
    hold.entered(Duration::from_secs(10))
        .await
        .expect("the first call reaches the charge");
    let (second, headers, body) = f.pay(Some("K3"), payment(1990)).await;
    assert_eq!(second, StatusCode::CONFLICT);
    assert_eq!(headers["retry-after"], "1");
    assert_eq!(body["error"], "payment_in_progress");
    hold.release();
    let (first, _, charge) = first.await.unwrap();
    assert_eq!(first, StatusCode::OK);
    let (third, headers, replayed) = f.pay(Some("K3"), payment(1990)).await;
    assert_eq!((third, replayed), (StatusCode::OK, charge));
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(f.charges().await, 1);
    Arc::into_inner(f).unwrap().finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn with_redis_gone_compatible_charges_unprotected_and_hardened_refuses() {
    // A port nothing listens on: every Redis command fails at once.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("redis://{}", closed.local_addr().unwrap());
    drop(closed);
    let f = Fixture::new(Some(&dead)).await;

    for _ in 0..2 {
        let (status, _, _) = f.pay(Some("K1"), payment(1990)).await;
        assert_eq!(status, StatusCode::OK, "fail open: the charge runs");
    }
    assert_eq!(f.charges().await, 2, "and runs again on the retry");

    f.configure(json!({"policy": "hardened"})).await;
    let (status, _, body) = f.pay(Some("K2"), payment(1990)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["error"], "idempotency_unavailable");
    assert_eq!(f.charges().await, 2, "fail closed: nothing charged");
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_requests_get_a_4xx_with_a_json_body_and_charge_nothing() {
    let f = Fixture::new(None).await;
    let cases = [
        (
            json!({"tenant_id": "not-a-uuid", "order_id": ORDER, "amount": 1, "currency": "RUB"}),
            422,
        ),
        (
            json!({"tenant_id": TENANT, "order_id": "x", "amount": 1, "currency": "RUB"}),
            422,
        ),
        (
            json!({"tenant_id": TENANT, "order_id": ORDER, "amount": 0, "currency": "RUB"}),
            422,
        ),
        (
            json!({"tenant_id": TENANT, "order_id": ORDER, "amount": -1, "currency": "RUB"}),
            422,
        ),
        (
            json!({"tenant_id": TENANT, "order_id": ORDER, "amount": 1.5, "currency": "RUB"}),
            422,
        ),
        (
            json!({"tenant_id": TENANT, "order_id": ORDER, "amount": 1, "currency": "rubles"}),
            422,
        ),
        (json!({"tenant_id": TENANT, "order_id": ORDER}), 422),
        // Found by the hostile-input property test: an unknown field was ignored, and charged.
        (
            json!({"tenant_id": TENANT, "order_id": ORDER, "amount": 1, "currency": "RUB", "tip": 5}),
            422,
        ),
        (json!([1, 2, 3]), 422),
    ];
    for (body, status) in cases {
        let (got, _, error) = f.pay(Some("K9"), body.clone()).await;
        assert_eq!(got.as_u16(), status, "{body}");
        assert!(error["error"].is_string(), "{error}");
    }
    let not_json = f
        .http
        .post(format!("{}/payments", f.payments.url()))
        .header("content-type", "application/json")
        .header("Idempotency-Key", "K9")
        .body("{\"amount\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(not_json.status(), StatusCode::BAD_REQUEST);
    let (bad_config, _) = f.configure_refused(json!({"policy": "strict"})).await;
    assert_eq!(bad_config, StatusCode::UNPROCESSABLE_ENTITY);
    let (zero_lease, _) = f.configure_refused(json!({"lease_ms": 0})).await;
    assert_eq!(zero_lease, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(f.charges().await, 0);
    f.finish().await;
}

/// Found by the hostile-input property test: `PUT /config` took any lease up to `u64::MAX` ms
/// (584 million years), so the reservation of a caller that died could outlive the result TTL.
#[tokio::test(flavor = "multi_thread")]
async fn a_lease_longer_than_the_result_is_kept_is_refused() {
    let f = Fixture::new(None).await;
    for lease in [3_600_001u64, u64::MAX] {
        let (status, body) = f.configure_refused(json!({"lease_ms": lease})).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_eq!(body["error"], "invalid_request");
    }
    // The lease of an hour, as long as the result is kept, is the longest.
    f.configure(json!({"lease_ms": 3_600_000})).await;
    let (paid, _, _) = f.pay(Some("L1"), payment(1990)).await;
    assert_eq!(paid, StatusCode::OK);
    f.finish().await;
}

/// The coordinator's bound on a Redis command is a switch: from 1 ms to the client's 10 s, shown
/// by `GET /config`, and the default is generous (2 s; `redis-down` sets idem's 250 ms).
#[tokio::test(flavor = "multi_thread")]
async fn the_redis_command_bound_is_a_switch_within_limits() {
    let f = Fixture::new(None).await;
    let shown = f.config().await;
    assert_eq!(shown["command_timeout_ms"], 2000, "{shown}");
    for bound in [0u64, 10_001, u64::MAX] {
        let (status, body) = f
            .configure_refused(json!({"command_timeout_ms": bound}))
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bound}: {body}");
        assert_eq!(body["error"], "invalid_request");
    }
    f.configure(json!({"command_timeout_ms": 250})).await;
    let shown = f.config().await;
    assert_eq!(shown["command_timeout_ms"], 250, "{shown}");
    let (paid, _, _) = f.pay(Some("B1"), payment(1990)).await;
    assert_eq!(paid, StatusCode::OK);
    f.finish().await;
}
