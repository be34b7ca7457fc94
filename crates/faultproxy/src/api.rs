//! The Toxiproxy 2.x HTTP API (the subset clients use), over a [`FaultProxy`].
//!
//! | route                                | methods                    |
//! |--------------------------------------|----------------------------|
//! | `/version`                           | GET                        |
//! | `/reset`                             | POST (body optional)       |
//! | `/populate`                          | POST (JSON array)          |
//! | `/proxies`                           | GET, POST                  |
//! | `/proxies/{proxy}`                   | GET, POST/PATCH, DELETE    |
//! | `/proxies/{proxy}/toxics`            | GET, POST                  |
//! | `/proxies/{proxy}/toxics/{toxic}`    | GET, POST/PATCH, DELETE    |
//!
//! Status codes are Toxiproxy's: 201 for a created proxy and for populate, 204 for
//! DELETE and reset, 404 for an unknown proxy or toxic, 409 for a duplicate name,
//! 400 for anything wrong with the request. Every error answers
//! `{"error": "...", "status": N}`. Bodies are read as JSON whatever their
//! Content-Type, since Toxiproxy's Go server never looks at it either.

use std::collections::{BTreeMap, HashSet};

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::FaultProxy;
use crate::error::Error;
use crate::proxy::{Proxy, ProxyInfo, ProxyUpdate};
use crate::toxic::{Toxic, ToxicUpdate};

/// The Toxiproxy version whose API we follow, reported by `GET /version`.
pub const TOXIPROXY_VERSION: &str = "2.12.0";

/// The API's routes, with `proxies` as their state.
pub fn router(proxies: FaultProxy) -> Router {
    Router::new()
        .route("/version", get(version))
        .route("/reset", post(reset))
        .route("/populate", post(populate))
        .route("/proxies", get(list_proxies).post(create_proxy))
        .route(
            "/proxies/{proxy}",
            get(show_proxy)
                .post(update_proxy)
                .patch(update_proxy)
                .delete(delete_proxy),
        )
        .route(
            "/proxies/{proxy}/toxics",
            get(list_toxics).post(create_toxic),
        )
        .route(
            "/proxies/{proxy}/toxics/{toxic}",
            get(show_toxic)
                .post(update_toxic)
                .patch(update_toxic)
                .delete(delete_toxic),
        )
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not found") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
        })
        .with_state(proxies)
}

/// An error in Toxiproxy's shape: `{"error": message, "status": code}`.
struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }
}

impl From<Error> for ApiError {
    fn from(error: Error) -> ApiError {
        let status = StatusCode::from_u16(error.status_code()).unwrap_or(StatusCode::BAD_REQUEST);
        ApiError::new(status, error.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": self.message, "status": self.status.as_u16()});
        (self.status, Json(body)).into_response()
    }
}

type ApiResult<T> = Result<T, ApiError>;

/// Path parameters whose rejection (e.g. bad percent-encoding) is a JSON error too.
struct PathParams<T>(T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for PathParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(params)) => Ok(PathParams(params)),
            Err(rejection) => Err(ApiError::new(rejection.status(), rejection.body_text())),
        }
    }
}

/// The raw request body, any Content-Type, possibly empty.
struct Body(Bytes);

impl<S: Send + Sync> FromRequest<S> for Body {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        match Bytes::from_request(request, state).await {
            Ok(bytes) => Ok(Body(bytes)),
            Err(rejection) => Err(ApiError::new(rejection.status(), rejection.body_text())),
        }
    }
}

impl Body {
    fn parse<T: DeserializeOwned>(&self) -> Result<T, Error> {
        serde_json::from_slice(&self.0).map_err(|error| Error::BadRequestBody(error.to_string()))
    }

    /// [`Self::parse`] for a body that must be a JSON object. serde would also fill a struct
    /// from an array of its values (`[{}]` as a toxic update), which Toxiproxy's Go decoder
    /// refuses with 400.
    fn parse_object<T: DeserializeOwned>(&self) -> Result<T, Error> {
        let value = self.parse()?;
        if self.0.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(Error::BadRequestBody("expected a JSON object".into()));
        }
        Ok(value)
    }
}

/// A proxy as `POST /proxies` and `POST /populate` receive it.
#[derive(Deserialize)]
struct ProxyInput {
    #[serde(default)]
    name: String,
    #[serde(default)]
    listen: String,
    #[serde(default)]
    upstream: String,
    /// Absent means enabled, as in Toxiproxy.
    #[serde(default)]
    enabled: Option<bool>,
}

fn find(proxies: &FaultProxy, name: &str) -> Result<Proxy, Error> {
    proxies
        .get(name)
        .ok_or_else(|| Error::ProxyNotFound(name.to_owned()))
}

async fn version() -> impl IntoResponse {
    // Toxiproxy 2.12's exact answer. (The toxiproxy_rust client returns the body
    // verbatim; newer clients parse this JSON.)
    (
        [(header::CONTENT_TYPE, "application/json;charset=utf-8")],
        format!("{{\"version\": \"{TOXIPROXY_VERSION}\"}}\n"),
    )
}

async fn reset(State(proxies): State<FaultProxy>) -> ApiResult<StatusCode> {
    proxies.try_reset().await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn list_proxies(State(proxies): State<FaultProxy>) -> Json<BTreeMap<String, ProxyInfo>> {
    let by_name = proxies
        .proxies()
        .into_iter()
        .map(|proxy| (proxy.name().to_owned(), proxy.info()))
        .collect();
    Json(by_name)
}

async fn create_proxy(
    State(proxies): State<FaultProxy>,
    body: Body,
) -> ApiResult<(StatusCode, Json<ProxyInfo>)> {
    let input: ProxyInput = body.parse_object()?;
    let enabled = input.enabled.unwrap_or(true);
    let proxy = proxies
        .add(&input.name, &input.listen, &input.upstream, enabled)
        .await?;
    Ok((StatusCode::CREATED, Json(proxy.info())))
}

/// Creates or updates several proxies at once. Like Toxiproxy, the whole request is
/// checked before anything changes; a proxy whose listen address and upstream are
/// unchanged is kept (with its toxics and connections), a changed one is replaced.
async fn populate(State(proxies): State<FaultProxy>, body: Body) -> Response {
    let inputs = match body.parse::<Vec<ProxyInput>>().and_then(check_populate) {
        Ok(inputs) => inputs,
        Err(error) => return ApiError::from(error).into_response(),
    };
    let mut populated = Vec::new();
    for input in inputs {
        match populate_one(&proxies, input).await {
            Ok(proxy) => populated.push(proxy.info()),
            Err(error) => {
                // Toxiproxy reports the error along with what was already applied.
                let status = error.status_code();
                let body =
                    json!({"error": error.to_string(), "status": status, "proxies": populated});
                let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
                return (status, Json(body)).into_response();
            }
        }
    }
    (StatusCode::CREATED, Json(json!({ "proxies": populated }))).into_response()
}

fn check_populate(inputs: Vec<ProxyInput>) -> Result<Vec<ProxyInput>, Error> {
    let mut names = HashSet::new();
    for (index, input) in inputs.iter().enumerate() {
        let position = index + 1;
        if input.name.is_empty() {
            return Err(Error::MissingField(format!("name at proxy {position}")));
        }
        if input.upstream.is_empty() {
            return Err(Error::MissingField(format!("upstream at proxy {position}")));
        }
        if !names.insert(input.name.as_str()) {
            return Err(Error::BadRequestBody(format!(
                "duplicate proxy name {:?}",
                input.name
            )));
        }
    }
    Ok(inputs)
}

async fn populate_one(proxies: &FaultProxy, input: ProxyInput) -> Result<Proxy, Error> {
    let enabled = input.enabled.unwrap_or(true);
    if let Some(existing) = proxies.get(&input.name) {
        let unchanged = existing.upstream() == input.upstream
            && (input.listen.is_empty() || existing.listens_on(&input.listen));
        if unchanged {
            existing.set_enabled(enabled).await?;
            return Ok(existing);
        }
        proxies.remove(&input.name).await?;
    }
    proxies
        .add(&input.name, &input.listen, &input.upstream, enabled)
        .await
}

async fn show_proxy(
    State(proxies): State<FaultProxy>,
    PathParams(name): PathParams<String>,
) -> ApiResult<Json<ProxyInfo>> {
    Ok(Json(find(&proxies, &name)?.info()))
}

async fn update_proxy(
    State(proxies): State<FaultProxy>,
    PathParams(name): PathParams<String>,
    body: Body,
) -> ApiResult<Json<ProxyInfo>> {
    let proxy = find(&proxies, &name)?;
    let update: ProxyUpdate = body.parse_object()?;
    proxy.update(update).await?;
    Ok(Json(proxy.info()))
}

async fn delete_proxy(
    State(proxies): State<FaultProxy>,
    PathParams(name): PathParams<String>,
) -> ApiResult<StatusCode> {
    proxies.remove(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn list_toxics(
    State(proxies): State<FaultProxy>,
    PathParams(name): PathParams<String>,
) -> ApiResult<Json<Vec<Toxic>>> {
    Ok(Json(find(&proxies, &name)?.toxics()))
}

/// Answers 200 with the toxic, as Toxiproxy does (not 201).
async fn create_toxic(
    State(proxies): State<FaultProxy>,
    PathParams(name): PathParams<String>,
    body: Body,
) -> ApiResult<Json<Toxic>> {
    let proxy = find(&proxies, &name)?;
    // Through `serde_json::Value` so that Toxic's own checks (type, stream,
    // attributes) report their precise error rather than a generic parse error.
    let toxic = Toxic::from_json(body.parse_object()?)?;
    proxy.add_toxic(toxic.clone())?;
    Ok(Json(toxic))
}

async fn show_toxic(
    State(proxies): State<FaultProxy>,
    PathParams((name, toxic)): PathParams<(String, String)>,
) -> ApiResult<Json<Toxic>> {
    let proxy = find(&proxies, &name)?;
    let toxic = proxy.toxic(&toxic).ok_or(Error::ToxicNotFound(toxic))?;
    Ok(Json(toxic))
}

async fn update_toxic(
    State(proxies): State<FaultProxy>,
    PathParams((name, toxic)): PathParams<(String, String)>,
    body: Body,
) -> ApiResult<Json<Toxic>> {
    let proxy = find(&proxies, &name)?;
    if proxy.toxic(&toxic).is_none() {
        return Err(Error::ToxicNotFound(toxic).into());
    }
    let update: ToxicUpdate = body.parse_object()?;
    Ok(Json(proxy.update_toxic(&toxic, update)?))
}

async fn delete_toxic(
    State(proxies): State<FaultProxy>,
    PathParams((name, toxic)): PathParams<(String, String)>,
) -> ApiResult<StatusCode> {
    find(&proxies, &name)?.remove_toxic(&toxic)?;
    Ok(StatusCode::NO_CONTENT)
}
