//! The mock mailer of the worker lesson: the outside world that actually sends an email.
//!
//! `POST /emails {"to", "subject"}` sends an email and answers `{"email_id": "em_N"}`, numbered
//! from 1 in each run. It does not deduplicate: every request is a new email in someone's inbox,
//! which is what makes a redelivered job dangerous. An `Idempotency-Key` header, if the caller
//! sends one, is kept beside the email (shown, never used to refuse one). `GET /emails` is its
//! own list (the count the lab reads its facts from).
//!
//! Checkpoint [`SENT`]: the email is sent and the answer is about to go out; the exercises hold
//! a consumer there to see what it did before the send finished.

use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use lab_core::{Checkpoints, Msg};
use lab_infra::Needs;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::api::{ApiError, JsonBody, method_not_allowed, not_found};
use crate::spec::{Checkpoint, ServiceEnv, ServiceError, ServiceSpec, Voice};

/// The service's name: in narration, and the name of its fault-proxy hop.
pub const NAME: &str = "mailer";

/// Checkpoint: the email is sent; the answer is about to go out.
pub const SENT: &str = "mailer.sent";

/// The mailer, as the lab starts it.
pub static SPEC: ServiceSpec = ServiceSpec {
    name: NAME,
    title: "mailer",
    needs: Needs {
        postgres: false,
        redis: false,
    },
    schema: "",
    calls: &[],
    checkpoints: &[Checkpoint {
        name: SENT,
        about: "the email is sent; the answer is about to go out",
    }],
    demo: r#"  # every request is a new email: send twice, count two
  curl -s -X POST {url}/emails -H 'Content-Type: application/json' -d '{"to":"anna@example.com","subject":"Invoice"}'
  curl -s {direct}/emails"#,
    router: |env| Ok(Mailer::from_env(env)?.router()),
};

/// An email to send. An unknown field (`"cc"`, `"attachments"`) is refused (422) rather than
/// dropped from an email that then goes out without it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EmailRequest {
    pub to: String,
    pub subject: String,
}

/// An email the mailer sent.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Email {
    pub email_id: String,
    pub to: String,
    pub subject: String,
    /// The caller's Idempotency-Key, when it sent one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// `GET /emails` on the mailer.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct EmailList {
    pub count: usize,
    pub emails: Vec<Email>,
}

/// The mailer's state: the emails it sent.
#[derive(Clone)]
pub struct Mailer {
    sent: Arc<Mutex<Vec<Email>>>,
    voice: Voice,
    checkpoints: Checkpoints,
}

impl Mailer {
    pub fn from_env(env: ServiceEnv) -> Result<Mailer, ServiceError> {
        Ok(Mailer {
            sent: Arc::default(),
            voice: env.voice,
            checkpoints: env.checkpoints,
        })
    }

    pub fn router(self) -> Router {
        Router::new()
            .route("/emails", post(send).get(list))
            .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
            .fallback(not_found)
            .method_not_allowed_fallback(method_not_allowed)
            .with_state(self)
    }
}

fn validate(email: &EmailRequest) -> Result<(), ApiError> {
    let invalid = |message: &str| {
        ApiError::client(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            message.to_string(),
        )
    };
    let (local, domain) = email.to.split_once('@').unwrap_or_default();
    if local.is_empty()
        || !domain.contains('.')
        || email.to.len() > 254
        || email
            .to
            .chars()
            .any(|c| c.is_control() || c.is_whitespace())
    {
        return Err(invalid("to must be an email address"));
    }
    if email.subject.trim().is_empty()
        || email.subject.len() > 200
        || email.subject.chars().any(char::is_control)
    {
        return Err(invalid("subject must be 1 to 200 printable characters"));
    }
    Ok(())
}

/// `POST /emails`: sends, every time.
#[tracing::instrument(skip_all)]
async fn send(
    State(mailer): State<Mailer>,
    headers: HeaderMap,
    JsonBody(request): JsonBody<EmailRequest>,
) -> Result<Response, ApiError> {
    validate(&request)?;
    let key = crate::api::key_header(&headers)?.map(str::to_string);
    let email = {
        let mut sent = mailer.sent.lock();
        let email = Email {
            email_id: format!("em_{}", sent.len() + 1),
            to: request.to,
            subject: request.subject,
            key,
        };
        sent.push(email.clone());
        email
    };
    // The address is personal data: the log line names the email by its id only.
    tracing::info!(email_id = email.email_id, "email sent");
    mailer
        .voice
        .tell(
            NAME,
            Msg::new("mailer.sent")
                .arg("id", &email.email_id)
                .arg("to", &email.to),
        )
        .await;
    mailer.checkpoints.reached(SENT).await;
    Ok((
        StatusCode::CREATED,
        Json(json!({"email_id": email.email_id})),
    )
        .into_response())
}

/// `GET /emails`: every email sent, and the count.
async fn list(State(mailer): State<Mailer>) -> Json<EmailList> {
    let emails = mailer.sent.lock().clone();
    Json(EmailList {
        count: emails.len(),
        emails,
    })
}
