//! The report service's HTTP contract, on a real PostgreSQL and a real socket.

use lab_core::Checkpoints;
use lab_infra::{Needs, RunSpace, ServerOptions, Servers};
use lab_services::reports;
use lab_services::{RunningService, ServiceEnv, launch};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// A throwaway PostgreSQL, a run space and the service on a loopback port.
struct Fixture {
    servers: Servers,
    space: Option<RunSpace>,
    service: RunningService,
    checkpoints: Checkpoints,
    client: reqwest::Client,
}

impl Fixture {
    async fn new() -> Fixture {
        let servers = Servers::start(
            &ServerOptions::default(),
            Needs {
                postgres: true,
                redis: false,
            },
        )
        .await
        .unwrap();
        let space = RunSpace::create(&servers, &[reports::SPEC.schema])
            .await
            .unwrap();
        let checkpoints = Checkpoints::new();
        let env = ServiceEnv::default()
            .with_pg(space.pg.clone().expect("a PostgreSQL pool"))
            .with_key_prefix(space.prefix.clone())
            .with_checkpoints(checkpoints.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let service = launch(&reports::SPEC, env, listener).unwrap();
        Fixture {
            servers,
            space: Some(space),
            service,
            checkpoints,
            client: reqwest::Client::new(),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.service.url())
    }

    async fn post(&self, key: Option<&str>, body: Value) -> (StatusCode, Value) {
        let mut request = self.client.post(self.url("/reports")).json(&body);
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        let response = request.send().await.unwrap();
        (response.status(), response.json().await.unwrap())
    }

    async fn count(&self) -> i64 {
        let body: Value = self
            .client
            .get(self.url("/reports"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        body["count"].as_i64().unwrap()
    }

    async fn finish(mut self) {
        self.service.stop().await;
        self.space
            .take()
            .unwrap()
            .release(&self.servers, false)
            .await
            .unwrap();
        self.servers.shutdown().await;
    }
}

fn monthly() -> Value {
    json!({"task_id": 42, "report_type": "monthly"})
}

#[tokio::test(flavor = "multi_thread")]
async fn one_key_makes_one_report() {
    let f = Fixture::new().await;
    let (status, first) = f.post(Some("report-task-42"), monthly()).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(first, json!({"report_id": 1, "replayed": false}));

    let response = f
        .client
        .post(f.url("/reports"))
        .header("Idempotency-Key", "report-task-42")
        .json(&monthly())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["idempotent-replayed"], "true");
    let replay: Value = response.json().await.unwrap();
    assert_eq!(replay, json!({"report_id": 1, "replayed": true}));

    let (status, body) = f
        .post(
            Some("report-task-42"),
            json!({"task_id": 42, "report_type": "weekly"}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"], "idempotency_key_reused");
    assert_eq!(f.count().await, 1);

    // The IETF draft's quoted form is the same key.
    let (status, body) = f.post(Some("\"report-task-42\""), monthly()).await;
    assert_eq!(
        (status, body["report_id"].as_i64()),
        (StatusCode::OK, Some(1))
    );
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_key_every_call_is_a_new_report() {
    let f = Fixture::new().await;
    let (a, first) = f.post(None, monthly()).await;
    let (b, second) = f.post(None, monthly()).await;
    assert_eq!((a, b), (StatusCode::CREATED, StatusCode::CREATED));
    assert_ne!(first["report_id"], second["report_id"]);
    assert_eq!(f.count().await, 2);
    f.finish().await;
}

/// Two requests with one key inside the handler at once: the barrier holds both just before
/// the INSERT until both have arrived, so they really race, and UNIQUE decides.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_requests_with_one_key_make_one_report() {
    let f = Fixture::new().await;
    f.checkpoints.barrier(reports::BEFORE_INSERT, 2);
    let (a, b) = tokio::join!(
        f.post(Some("same-key"), monthly()),
        f.post(Some("same-key"), monthly())
    );
    let mut statuses = [a.0.as_u16(), b.0.as_u16()];
    statuses.sort();
    assert_eq!(statuses, [200, 201]);
    assert_eq!(a.1["report_id"], b.1["report_id"]);
    assert_eq!(f.count().await, 1);

    // The naive check-then-insert under the same forced overlap makes two.
    f.checkpoints.barrier(reports::NAIVE_AFTER_CHECK, 2);
    let naive = |f: &Fixture| {
        f.client
            .post(f.url("/naive/reports"))
            .header("Idempotency-Key", "same-key")
            .json(&monthly())
            .send()
    };
    let (a, b) = tokio::join!(naive(&f), naive(&f));
    assert_eq!(a.unwrap().status(), StatusCode::CREATED);
    assert_eq!(b.unwrap().status(), StatusCode::CREATED);
    let naive_total: i64 = sqlx::query_scalar("SELECT count(*) FROM naive_reports")
        .fetch_one(f.space.as_ref().unwrap().pg.as_ref().unwrap())
        .await
        .unwrap();
    assert_eq!(naive_total, 2);
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_requests_get_a_4xx_with_a_json_body() {
    let f = Fixture::new().await;
    let long_key = "k".repeat(256);
    let cases: Vec<(reqwest::RequestBuilder, StatusCode, &str)> = vec![
        (
            f.client
                .post(f.url("/reports"))
                .header("Content-Type", "application/json")
                .body("{not json"),
            StatusCode::BAD_REQUEST,
            "invalid_json",
        ),
        (
            f.client.post(f.url("/reports")).body("task_id=42"),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
        ),
        (
            f.client
                .post(f.url("/reports"))
                .json(&json!({"task_id": 42})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
        ),
        (
            f.client
                .post(f.url("/reports"))
                .json(&json!({"task_id": "x", "report_type": "monthly"})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
        ),
        // Found by the hostile-input property test: an unknown field was ignored, and stored.
        (
            f.client
                .post(f.url("/reports"))
                .json(&json!({"task_id": 42, "report_type": "monthly", "format": "pdf"})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
        ),
        (
            f.client
                .post(f.url("/reports"))
                .json(&json!({"task_id": -1, "report_type": "monthly"})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
        ),
        (
            f.client
                .post(f.url("/reports"))
                .json(&json!({"task_id": 42, "report_type": "a\u{0}b"})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
        ),
        (
            f.client
                .post(f.url("/reports"))
                .header("Idempotency-Key", "   ")
                .json(&monthly()),
            StatusCode::BAD_REQUEST,
            "invalid_idempotency_key",
        ),
        // Found by the hostile-input property test: a tab inside a key was stored with it.
        (
            f.client
                .post(f.url("/reports"))
                .header("Idempotency-Key", "k\t1")
                .json(&monthly()),
            StatusCode::BAD_REQUEST,
            "invalid_idempotency_key",
        ),
        (
            f.client
                .post(f.url("/reports"))
                .header("Idempotency-Key", long_key.as_str())
                .json(&monthly()),
            StatusCode::BAD_REQUEST,
            "invalid_idempotency_key",
        ),
        (
            f.client.get(f.url("/reports/abc")),
            StatusCode::BAD_REQUEST,
            "invalid_id",
        ),
        // Found by the hostile-input property test: a segment that is not UTF-8 once decoded
        // got axum's plain-text rejection.
        (
            f.client.get(f.url("/reports/%FF")),
            StatusCode::BAD_REQUEST,
            "invalid_path",
        ),
        (
            f.client.get(f.url("/reports/999")),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            f.client.get(f.url("/nowhere")),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            f.client.delete(f.url("/reports")),
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
    ];
    for (request, status, code) in cases {
        let response = request.send().await.unwrap();
        let got = response.status();
        let body: Value = response.json().await.expect("a JSON error body");
        assert_eq!(
            (got, body["error"].as_str()),
            (status, Some(code)),
            "{body}"
        );
        assert!(body["message"].is_string(), "{body}");
    }
    assert_eq!(f.count().await, 0, "nothing malformed was stored");
    f.finish().await;
}
