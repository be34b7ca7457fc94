//! What every bundled service shares: a JSON error type, and extractors (body, query, path)
//! whose rejections are that type.
//!
//! axum's own `Json` extractor answers malformed bodies with plain text. Ours answers with the
//! same JSON shape as every other error, `{"error": "<code>", "message": "<for people>"}`, and
//! a 4xx status: 400 for a body that is not JSON, 415 without a JSON content type, 422 for JSON
//! of the wrong shape (a missing field, a string where a number belongs, a field given twice, an
//! array instead of an object).

use axum::Json;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// An error answer of a bundled service.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request is malformed (4xx chosen by the caller of this variant).
    #[error("{message}")]
    Client {
        status: StatusCode,
        code: &'static str,
        message: String,
        /// `Retry-After`, in seconds, when the client should come back (a 409 in progress).
        retry_after: Option<u32>,
    },
    /// The database failed. Details go to the log, not to the client.
    #[error("database error: {}", lab_infra::pg_message(.0))]
    Database(sqlx::Error),
}

impl ApiError {
    pub fn client(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::Client {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    /// The same answer, telling the client to come back after `seconds`.
    pub fn retry_after(self, seconds: u32) -> ApiError {
        match self {
            ApiError::Client {
                status,
                code,
                message,
                ..
            } => ApiError::Client {
                status,
                code,
                message,
                retry_after: Some(seconds),
            },
            other => other,
        }
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::client(StatusCode::BAD_REQUEST, code, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            ApiError::Client {
                status,
                code,
                message,
                retry_after,
            } => {
                let body = Json(json!({"error": code, "message": message}));
                let mut response = (status, body).into_response();
                if let Some(seconds) = retry_after {
                    response
                        .headers_mut()
                        .insert(header::RETRY_AFTER, seconds.into());
                }
                response
            }
            ApiError::Database(e) => {
                // For the operator's log (`--log`), not for the client.
                tracing::warn!(error = %e, "database error");
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    Json(json!({"error": "database_unavailable", "message": "the database did not answer; retry later"})),
                )
                    .into_response()
            }
        }
    }
}

/// A JSON object in the request body, whose rejections are [`ApiError`]s.
pub struct JsonBody<T>(pub T);

/// The body of a service's `PUT /config`, and the switches it answers with: what the lab sends
/// a service to switch its behaviour for a story (a policy, a broken design), typed on both
/// sides.
pub trait ConfigRequest: serde::Serialize + Sync {
    /// The service's switches after the change, as it answers.
    type Config: DeserializeOwned;
}

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let is_json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                let mime = v.split(';').next().unwrap_or_default().trim();
                mime.eq_ignore_ascii_case("application/json") || mime.ends_with("+json")
            })
            .unwrap_or(false);
        if !is_json {
            return Err(ApiError::client(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "send the body as JSON with Content-Type: application/json",
            ));
        }
        // A body over axum's limit (2 MB) is 413, one that cannot be read 400: axum knows which.
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| ApiError::client(e.status(), "unreadable_body", e.body_text()))?;
        // Straight into `T`, not through a `serde_json::Value`: a `Value` keeps the last of two
        // fields with one name, so `{"amount": 1, "amount": 9}` would pass as 9 while a proxy
        // or log in front of us reads 1. Deserializing the struct itself refuses the duplicate.
        let value = serde_json::from_slice(&bytes).map_err(|e| {
            use serde_json::error::Category;
            match e.classify() {
                // Valid JSON of the wrong shape: a missing, unknown, repeated or mistyped field.
                Category::Data => ApiError::client(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_request",
                    format!("the JSON does not have the expected fields: {e}"),
                ),
                Category::Syntax | Category::Eof | Category::Io => {
                    ApiError::bad_request("invalid_json", format!("the body is not JSON: {e}"))
                }
            }
        })?;
        // serde also fills a struct from an array of its values in field order (`[42,
        // "monthly"]`), a form no client of ours means to send: a body is a JSON object.
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(ApiError::client(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_request",
                "the body must be a JSON object",
            ));
        }
        Ok(JsonBody(value))
    }
}

/// The `Idempotency-Key` header as sent, if there is one: printable ASCII only.
///
/// HTTP lets a header value carry tabs and bytes over 0x7F; `HeaderValue::to_str` refuses the
/// latter but lets a tab through. A key is printable ASCII (the IETF draft sends it as a
/// structured-field string, `%x20-7E`), so a tab is refused here rather than stored in a table,
/// in Redis and in the narration. Trimming and the length and `:` rules stay each service's.
pub fn key_header(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    let Some(raw) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    match raw.to_str() {
        Ok(key) if !key.contains(|c: char| c.is_ascii_control()) => Ok(Some(key)),
        _ => Err(ApiError::bad_request(
            "invalid_idempotency_key",
            "Idempotency-Key must be printable ASCII, without control characters",
        )),
    }
}

/// Query parameters whose rejection is an [`ApiError`] (400 `invalid_query`); axum's own
/// `Query` answers in plain text.
pub struct QueryParams<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(params)| QueryParams(params))
            .map_err(|e| ApiError::client(e.status(), "invalid_query", e.body_text()))
    }
}

/// Path parameters whose rejection (a segment that is not UTF-8 once percent-decoded) is an
/// [`ApiError`] (400 `invalid_path`); axum's own `Path` answers in plain text.
pub struct PathParams<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for PathParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(params)| PathParams(params))
            .map_err(|e| ApiError::client(e.status(), "invalid_path", e.body_text()))
    }
}

/// The answer to any path a service does not have.
pub async fn not_found() -> ApiError {
    ApiError::client(StatusCode::NOT_FOUND, "not_found", "no such endpoint")
}

/// The answer to a method an endpoint does not take.
pub async fn method_not_allowed() -> ApiError {
    ApiError::client(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this endpoint does not take that method",
    )
}

// By hand rather than `#[from]`: the message above already says what sqlx's error says, so it is
// not also exposed as the source (an error chain printed in full would repeat it, with the
// PostgreSQL source line sqlx appends).
impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> ApiError {
        ApiError::Database(e)
    }
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::body::Body;
    use axum::http::Request;
    use axum::routing::post;
    use tower::ServiceExt;

    use super::*;

    async fn echo(JsonBody(value): JsonBody<serde_json::Value>) -> Json<serde_json::Value> {
        Json(value)
    }

    async fn call(body: Vec<u8>) -> (StatusCode, serde_json::Value) {
        let request = Request::post("/")
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap();
        let response = Router::new()
            .route("/", post(echo))
            .oneshot(request)
            .await
            .unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_413_with_a_json_error() {
        // Spaces are valid JSON whitespace: only the size is wrong.
        let (status, body) = call(vec![b' '; 3 * 1024 * 1024]).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(body["error"], "unreadable_body");
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)] // read by serde only
    struct Amount {
        amount: i64,
    }

    async fn amount(JsonBody(amount): JsonBody<Amount>) -> Json<serde_json::Value> {
        Json(json!({"amount": amount.amount}))
    }

    /// Found by tests/it/hostile.rs in lab-scenarios: through a `serde_json::Value`, the second of
    /// two fields with one name won silently (and a report, a charge or an email was made).
    #[tokio::test]
    async fn a_field_given_twice_is_422() {
        let request = Request::post("/")
            .header("content-type", "application/json")
            .body(Body::from(r#"{"amount": 1, "amount": 9}"#))
            .unwrap();
        let response = Router::new()
            .route("/", post(amount))
            .oneshot(request)
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(body["error"], "invalid_request");
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains("duplicate field"),
            "{body}"
        );
    }

    #[tokio::test]
    async fn a_body_that_is_not_json_is_400_and_one_of_the_wrong_shape_422() {
        for (body, status) in [
            ("{\"amount\": ", StatusCode::BAD_REQUEST),
            ("{\"amount\": 1e400}", StatusCode::BAD_REQUEST),
            ("{\"amount\": 1} x", StatusCode::BAD_REQUEST),
            ("{\"amount\": \"1\"}", StatusCode::UNPROCESSABLE_ENTITY),
            // serde would fill the struct from the array `[1]`: refused, a body is an object.
            ("[1]", StatusCode::UNPROCESSABLE_ENTITY),
            ("\"1\"", StatusCode::UNPROCESSABLE_ENTITY),
        ] {
            let request = Request::post("/")
                .header("content-type", "application/json")
                .body(Body::from(body))
                .unwrap();
            let response = Router::new()
                .route("/", post(amount))
                .oneshot(request)
                .await
                .unwrap();
            assert_eq!(response.status(), status, "{body}");
        }
    }

    #[tokio::test]
    async fn a_body_within_the_limit_is_read() {
        let (status, body) = call(br#"{"a": 1}"#.to_vec()).await;
        assert_eq!((status, body), (StatusCode::OK, json!({"a": 1})));
    }
}

/// `GET /stats` on the payment service or a relay: how many requests it received.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize)]
pub struct Stats {
    pub requests: u64,
}
