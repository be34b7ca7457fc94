//! The Toxiproxy 2.x HTTP API, over a [`FaultProxy`], and the lab's fault extension.
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
//! | `/lab/proxies/{proxy}/faults`        | GET, POST, DELETE (lab extension) |
//!
//! Behaviour is Toxiproxy's, checked test by test against its own suite (the crate's
//! `CONFORMANCE.md` lists every test and what we do differently on purpose):
//!
//! * Status codes: 201 for a created proxy and for populate, 200 for a created toxic, 204 for
//!   DELETE and reset, 404 for an unknown proxy or toxic, 409 only for a name that exists,
//!   500 when the listen address cannot be bound (taken, say), 400 for anything wrong with
//!   the request.
//! * Errors: `{"error": "...", "status": N}`, with Toxiproxy's exact words in `error` (see
//!   [`Error::toxiproxy_message`]): clients compare them.
//! * Every answer carries an `X-Toxiproxy-Request-Id` header, and a request whose
//!   User-Agent starts with `Mozilla/` (a browser) is refused with 403 before anything
//!   runs: a web page must not be able to reconfigure a developer's proxies behind their
//!   back (a cross-site POST needs no CORS preflight).
//! * Bodies are read as JSON whatever their Content-Type, since Toxiproxy's Go server never
//!   looks at it either, and `null` means "not given" for any field, as it does for Go's
//!   decoder (the Go client sends `"attributes": null` and `"toxics": null`).
//!
//! The lab extension arms one-shot [`Fault`](crate::Fault)s over HTTP, under `/lab/` so that
//! it can never collide with a Toxiproxy path:
//!
//! * `POST /lab/proxies/{proxy}/faults` with `{"fault": NAME, "connections": N,
//!   "delay_ms": MS}` arms `NAME` (see [`Fault::name`](crate::Fault::name)) for the next
//!   `N` connections (default 1); `delay_ms` is for `slow_response` only, and required
//!   there. Answers 201 with the armed fault as a [`FaultInfo`].
//! * `GET /lab/proxies/{proxy}/faults` lists the armed faults with their uses left and
//!   fired counts; `DELETE` disarms them all (204).

use std::collections::{BTreeMap, HashSet};
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::FaultProxy;
use crate::error::Error;
use crate::fault::{Fault, FaultInfo};
use crate::proxy::{Proxy, ProxyInfo, ProxyUpdate};
use crate::rng::Rng;
use crate::toxic::{Toxic, ToxicUpdate, null_as_default};

/// The Toxiproxy version whose API we follow, reported by `GET /version`.
pub const TOXIPROXY_VERSION: &str = "2.12.0";

/// The API's routes, with `proxies` as their state: Toxiproxy 2.x's (`/version`, `/reset`,
/// `/populate`, `/proxies[/{proxy}[/toxics[/{toxic}]]]`) with its status codes, error words,
/// `X-Toxiproxy-Request-Id` header and refusal of browsers (403 to a `Mozilla/` User-Agent);
/// and the lab's one-shot faults under `/lab/proxies/{proxy}/faults` (POST arms
/// `{"fault": NAME, "connections": N, "delay_ms": MS}`, GET lists [`FaultInfo`]s, DELETE
/// disarms), which a real Toxiproxy does not have.
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
        // The lab's extension, under a prefix of its own: no Toxiproxy path starts so.
        .route(
            "/lab/proxies/{proxy}/faults",
            get(list_faults).post(arm_fault).delete(disarm_faults),
        )
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not found") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
        })
        .with_state(proxies)
        // The last layer added runs first: every answer, a refused browser's included, gets
        // its request id.
        .layer(middleware::from_fn(stop_browsers))
        .layer(middleware::from_fn(tag_with_request_id))
}

/// Refuses browsers (a User-Agent starting with `Mozilla/`), as Toxiproxy does: any web page
/// a developer opens could otherwise POST to `localhost:8474` and reconfigure their proxies
/// (a cross-site form POST needs no CORS preflight). Tools (curl, wget, the clients) are not
/// affected; a browser that really must talk to the API can be given another User-Agent.
async fn stop_browsers(request: Request, next: Next) -> Response {
    let from_browser = request
        .headers()
        .get(header::USER_AGENT)
        .is_some_and(|agent| agent.as_bytes().starts_with(b"Mozilla/"));
    if from_browser {
        return ApiError::new(StatusCode::FORBIDDEN, "User agent not allowed").into_response();
    }
    next.run(request).await
}

static REQUEST_ID: HeaderName = HeaderName::from_static("x-toxiproxy-request-id");

/// Gives every answer an `X-Toxiproxy-Request-Id` header, as Toxiproxy does (it logs the
/// same id, so a client can quote it in a report).
async fn tag_with_request_id(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    if let Ok(id) = HeaderValue::from_str(&new_request_id()) {
        response.headers_mut().insert(REQUEST_ID.clone(), id);
    }
    response
}

/// A request id shaped like Toxiproxy's (an xid: 20 characters of base32hex, `0-9a-v`): 4
/// bytes of Unix time, 5 bytes fixed for this process, a 3-byte counter.
fn new_request_id() -> String {
    static PROCESS: LazyLock<u64> = LazyLock::new(|| Rng::new().next_u64());
    static COUNTER: LazyLock<AtomicU32> =
        LazyLock::new(|| AtomicU32::new(Rng::new().next_u64() as u32));
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs() as u32);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff;
    let mut bytes = [0u8; 12];
    bytes[..4].copy_from_slice(&seconds.to_be_bytes());
    bytes[4..9].copy_from_slice(&PROCESS.to_be_bytes()[..5]);
    bytes[9..].copy_from_slice(&count.to_be_bytes()[1..]);
    // 96 bits, 5 at a time (the last character takes the 1 bit left, padded).
    let bits = u128::from_be_bytes({
        let mut wide = [0u8; 16];
        wide[..12].copy_from_slice(&bytes);
        wide
    });
    const ALPHABET: &[u8; 32] = b"0123456789abcdefghijklmnopqrstuv";
    (0..20)
        .map(|index| ALPHABET[((bits >> (123 - 5 * index)) & 0x1f) as usize] as char)
        .collect()
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
        ApiError::new(status, error.toxiproxy_message())
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

/// A proxy as `POST /proxies` and `POST /populate` receive it. Other fields (`toxics`, which
/// the Go client sends as `null`) are ignored, as Toxiproxy ignores them.
#[derive(Deserialize)]
struct ProxyInput {
    #[serde(default, deserialize_with = "null_as_default")]
    name: String,
    #[serde(default, deserialize_with = "null_as_default")]
    listen: String,
    #[serde(default, deserialize_with = "null_as_default")]
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
                let body = json!({"error": error.toxiproxy_message(), "status": status,
                    "proxies": populated});
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
            && (input.listen.is_empty() || existing.listens_on(&input.listen).await);
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

/// `POST /lab/proxies/{proxy}/faults`: what to arm.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ArmRequest {
    #[serde(default, deserialize_with = "null_as_default")]
    fault: String,
    /// How many of the next connections get it; 1 if absent.
    #[serde(default)]
    connections: Option<usize>,
    /// `slow_response`'s delay.
    #[serde(default)]
    delay_ms: Option<u64>,
}

/// Arms a one-shot fault for the next N connections (a lab extension).
async fn arm_fault(
    State(proxies): State<FaultProxy>,
    PathParams(name): PathParams<String>,
    body: Body,
) -> ApiResult<(StatusCode, Json<FaultInfo>)> {
    let proxy = find(&proxies, &name)?;
    let request: ArmRequest = body.parse()?;
    if request.fault.is_empty() {
        return Err(Error::MissingField("fault".into()).into());
    }
    let fault = Fault::from_name(&request.fault, request.delay_ms)?;
    let connections = request.connections.unwrap_or(1);
    if connections == 0 {
        // Arming nothing is surely a mistake (DELETE disarms).
        return Err(Error::BadRequestBody("connections must be at least 1".into()).into());
    }
    let armed = proxy.arm(fault, connections);
    Ok((StatusCode::CREATED, Json(armed.info())))
}

/// Lists the faults armed on a proxy, with their uses left and fired counts.
async fn list_faults(
    State(proxies): State<FaultProxy>,
    PathParams(name): PathParams<String>,
) -> ApiResult<Json<Vec<FaultInfo>>> {
    Ok(Json(find(&proxies, &name)?.faults()))
}

/// Disarms every fault of a proxy, those already aimed at open connections included.
async fn disarm_faults(
    State(proxies): State<FaultProxy>,
    PathParams(name): PathParams<String>,
) -> ApiResult<StatusCode> {
    find(&proxies, &name)?.disarm_all_faults();
    Ok(StatusCode::NO_CONTENT)
}
