//! The mock mailer: every request is a new email, numbered em_1, em_2, …; malformed requests get
//! a 4xx with a JSON body and send nothing.

use lab_services::{ServiceEnv, launch, mailer};
use reqwest::StatusCode;
use serde_json::{Value, json};

#[tokio::test]
async fn every_request_is_a_new_email_and_bad_ones_are_refused() {
    let env = ServiceEnv::default().with_key_prefix("lab:test:");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let service = launch(&mailer::SPEC, env, listener).unwrap();
    let http = reqwest::Client::new();
    let send = |body: Value| {
        http.post(format!("{}/emails", service.url()))
            .json(&body)
            .send()
    };
    let email = json!({"to": "anna@example.com", "subject": "Invoice v1"});
    for expected in ["em_1", "em_2"] {
        let response = send(email.clone()).await.unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["email_id"], expected, "no deduplication: a new email");
    }
    for bad in [
        json!({"to": "not an address", "subject": "x"}),
        json!({"to": "anna@example.com", "subject": ""}),
        json!({"to": "anna@example.com"}),
        json!({"to": 5, "subject": "x"}),
        // Found by the hostile-input property test: an unknown field was ignored and sent.
        json!({"to": "anna@example.com", "subject": "x", "cc": "boris@example.com"}),
    ] {
        let response = send(bad.clone()).await.unwrap();
        assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
        let body: Value = response.json().await.unwrap();
        assert!(body["error"].is_string());
    }
    let list: Value = http
        .get(format!("{}/emails", service.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["count"], 2);
    service.stop().await;
}
