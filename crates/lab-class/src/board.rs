//! The board's HTTP server: the page, the learners' posts, the instructor's views.
//!
//! ```text
//! learner's lab ── POST /api/join {code, name} ──▶ a learner token (kept in the exercise's state)
//!               ── POST /api/verdicts (Bearer learner token) ──▶ a row in lab_class.verdicts
//! instructor's lab class verify ── POST /api/verified (Bearer instructor token)
//! browsers ── GET / (the page) ── GET /api/board every second ──▶ the grid
//!             with the instructor's token: names, GET /api/learners/{id}/history, the exports
//! ```
//!
//! Who may do what:
//!
//! - anyone who reaches the board sees the grid with every learner a number (`#3`): that is the
//!   projector's view;
//! - the class code (on the projector) lets a learner join once, under a name nobody else has;
//!   after that only their token posts, and only to their own cells;
//! - the instructor's token (printed on the instructor's terminal only) shows names and
//!   histories, gives the exports, and posts verified verdicts.
//!
//! Every refusal is a 4xx with a JSON body `{"error": …}`: a body over 64 KiB 413, one that is
//! not the JSON asked for 400, a missing token 401, a wrong code or token 403, a taken name 409,
//! a client over its rate 429 with `Retry-After`. The only 5xx is a 503 when the board's own
//! database fails.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use parking_lot::Mutex;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::model::{self, JoinRequest, MAX_BODY_BYTES, Schedule, VerdictPost, VerifiedPost};
use crate::store::{Source, Store, StoreError};

const INDEX_HTML: &str = include_str!("page/index.html");
const APP_JS: &str = include_str!("page/app.js");
const STYLE_CSS: &str = include_str!("page/style.css");

/// How many verdicts of one learner the history view shows.
const HISTORY_LIMIT: i64 = 500;

/// What the page is told besides the grid: its default language, its words in both, and the
/// board's URL as the learners reach it.
#[derive(Clone)]
pub struct PageTexts {
    pub lang: String,
    /// `{"en": {key: text}, "ru": {…}}`: the `class.` texts of the lab's common texts.
    pub ui: Value,
    /// The URL the join line gives the learners (`lab class` works it out from `--bind`);
    /// `None`: the address the instructor's browser used.
    pub learners_url: Option<String>,
}

/// A running board, stopped by [`Board::stop`].
pub struct Board {
    pub addr: SocketAddr,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Board {
    /// Serves the board of `store` on `listener` until stopped.
    pub fn start(listener: TcpListener, store: Store, texts: PageTexts) -> std::io::Result<Board> {
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let app = App {
            store,
            texts,
            learners_rate: std::sync::Arc::new(Mutex::new(HashMap::new())),
            strangers_rate: std::sync::Arc::new(Mutex::new(Bucket::full(STRANGERS))),
        };
        let task = tokio::spawn(lab_services::http::serve(
            listener,
            router(app),
            stop.clone(),
            lab_services::http::Limits::default(),
        ));
        Ok(Board { addr, stop, task })
    }

    /// Stops serving; the requests in flight finish first.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// A token bucket: `rate` requests a second on average, `burst` at once.
#[derive(Clone, Copy)]
struct Rate {
    per_second: f64,
    burst: f64,
}

/// One learner's posts: a check run sends ten or so verdicts at once, `watch` a few more per
/// save; a client that sends a hundred a second is slowed to this.
const LEARNER: Rate = Rate {
    per_second: 20.0,
    burst: 60.0,
};
/// Requests with no valid token (joins, wrong codes, forged tokens), all together: a class
/// joins once; a flood of guesses is slowed without touching the learners already in.
const STRANGERS: Rate = Rate {
    per_second: 30.0,
    burst: 90.0,
};

struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(rate: Rate) -> Bucket {
        Bucket {
            tokens: rate.burst,
            at: Instant::now(),
        }
    }

    /// Takes one request; `Err(wait)` when the bucket is empty.
    fn take(&mut self, rate: Rate) -> Result<(), Duration> {
        let now = Instant::now();
        let refill = now.duration_since(self.at).as_secs_f64() * rate.per_second;
        self.tokens = (self.tokens + refill).min(rate.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64(
                (1.0 - self.tokens) / rate.per_second,
            ))
        }
    }
}

#[derive(Clone)]
struct App {
    store: Store,
    texts: PageTexts,
    learners_rate: std::sync::Arc<Mutex<HashMap<i64, Bucket>>>,
    strangers_rate: std::sync::Arc<Mutex<Bucket>>,
}

impl App {
    fn learner_may_post(&self, learner: i64) -> Result<(), ApiError> {
        let mut buckets = self.learners_rate.lock();
        let bucket = buckets
            .entry(learner)
            .or_insert_with(|| Bucket::full(LEARNER));
        bucket.take(LEARNER).map_err(ApiError::too_many)
    }

    fn stranger_may_try(&self) -> Result<(), ApiError> {
        self.strangers_rate
            .lock()
            .take(STRANGERS)
            .map_err(ApiError::too_many)
    }

    /// Whether the request carries the instructor's token (header, or `?token=` for a link).
    fn is_instructor(&self, headers: &HeaderMap, query: &TokenQuery) -> bool {
        bearer(headers)
            .or(query.token.as_deref())
            .is_some_and(|token| self.store.is_instructor(token))
    }
}

fn router(app: App) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/app.js", get(app_js))
        .route("/style.css", get(style_css))
        .route("/api/ui", get(ui))
        .route("/api/board", get(board))
        .route("/api/learners/{id}/history", get(history))
        .route("/api/join", post(join))
        .route("/api/verdicts", post(verdict))
        .route("/api/verified", post(verified))
        .route("/export.csv", get(export_csv))
        .route("/export.junit.xml", get(export_junit))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(app)
}

/// A refusal: its status and the JSON body `{"error": …}` that says why.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    message: String,
    retry_after: Option<Duration>,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    fn too_many(wait: Duration) -> ApiError {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: "too many requests: slow down".into(),
            retry_after: Some(wait),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        match e {
            StoreError::NameTaken(_) => ApiError::new(
                StatusCode::CONFLICT,
                format!("{e}: choose another, or join from the lab that took it"),
            ),
            StoreError::NoLearner(_) => ApiError::new(StatusCode::NOT_FOUND, e.to_string()),
            StoreError::Database(_) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response =
            (self.status, axum::Json(json!({"error": self.message}))).into_response();
        if let Some(wait) = self.retry_after {
            // Whole seconds, rounded up, as the header counts them.
            let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            if let Ok(value) = HeaderValue::from_str(&seconds.max(1).to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
        }
        response
    }
}

/// The body as `T`, or the 4xx that says what is wrong with it (too big, not JSON, not the
/// fields asked for).
fn json_body<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> Result<T, ApiError> {
    let body = body.map_err(|rejection| {
        let status = rejection.status();
        let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
            format!("the body is over {MAX_BODY_BYTES} bytes")
        } else {
            rejection.body_text()
        };
        ApiError::new(status, message)
    })?;
    serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("not the JSON asked for: {e}"),
        )
    })
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

#[derive(Debug, Default, Deserialize)]
struct TokenQuery {
    token: Option<String>,
    /// `?projector=1`: names hidden even for the instructor.
    projector: Option<String>,
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no such page: {}", uri.path()),
    )
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed here: the page and the grid are GET, joins and verdicts POST",
    )
}

async fn index() -> Response {
    lab_services::http::embedded_asset("text/html; charset=utf-8", INDEX_HTML)
}

async fn app_js() -> Response {
    lab_services::http::embedded_asset("text/javascript; charset=utf-8", APP_JS)
}

async fn style_css() -> Response {
    lab_services::http::embedded_asset("text/css; charset=utf-8", STYLE_CSS)
}

async fn ui(State(app): State<App>) -> Response {
    axum::Json(json!({"lang": app.texts.lang, "ui": app.texts.ui})).into_response()
}

async fn board(
    State(app): State<App>,
    headers: HeaderMap,
    Query(query): Query<TokenQuery>,
) -> Result<Response, ApiError> {
    let instructor = app.is_instructor(&headers, &query);
    let projector = query.projector.as_deref().is_some_and(|p| p != "0");
    let learners = app.store.learners().await?;
    let cells = app.store.cells().await?;
    let mut board = crate::grid::board(&learners, &cells, instructor && !projector);
    board["instructor"] = json!(instructor);
    // Each commonest broken invariant's example, with the schedule that broke it.
    let examples: Vec<i64> = board["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|check| check["commonest_broken"]["example"].as_i64())
        .collect();
    let schedules: HashMap<i64, Schedule> =
        app.store.schedules(&examples).await?.into_iter().collect();
    for check in board["checks"].as_array_mut().into_iter().flatten() {
        let example = check["commonest_broken"]["example"].as_i64();
        if let Some(schedule) = example.and_then(|id| schedules.get(&id)) {
            check["commonest_broken"]["schedule"] = json!(schedule);
        }
    }
    // The join line, with the class code, for the instructor's page to show the room: at the
    // learners' address when `lab class` knows it (the instructor's browser may have come in
    // through 127.0.0.1), else at the address this browser used.
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let url = app
        .texts
        .learners_url
        .clone()
        .or_else(|| host.map(|host| format!("http://{host}/")));
    board["join"] = match url {
        Some(url) if instructor => json!({"url": url, "code": app.store.class_code}),
        _ => Value::Null,
    };
    Ok(axum::Json(board).into_response())
}

async fn history(
    State(app): State<App>,
    headers: HeaderMap,
    Query(query): Query<TokenQuery>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    if !app.is_instructor(&headers, &query) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "a learner's history needs the instructor's token",
        ));
    }
    let id: i64 = id
        .parse()
        .map_err(|_| ApiError::new(StatusCode::BAD_REQUEST, "a learner's id is a number"))?;
    let learners = app.store.learners().await?;
    let learner = learners
        .iter()
        .find(|l| l.id == id)
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, format!("no learner {id}")))?;
    let verdicts = app.store.history(id, HISTORY_LIMIT).await?;
    let ids: Vec<i64> = verdicts.iter().map(|v| v.id).collect();
    let schedules: HashMap<i64, Schedule> = app.store.schedules(&ids).await?.into_iter().collect();
    let verdicts: Vec<Value> = verdicts
        .into_iter()
        .map(|verdict| {
            let schedule = schedules.get(&verdict.id).cloned();
            let mut verdict = json!(verdict);
            verdict["schedule"] = json!(schedule);
            verdict
        })
        .collect();
    Ok(axum::Json(json!({
        "learner": {"id": learner.id, "name": learner.name},
        "verdicts": verdicts,
    }))
    .into_response())
}

async fn join(
    State(app): State<App>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    app.stranger_may_try()?;
    let request: JoinRequest = json_body(body)?;
    if !app.store.is_class_code(&request.code) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "wrong class code: it is the one on the instructor's screen",
        ));
    }
    let name = model::display_name(&request.name)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.to_string()))?;
    let joined = app.store.join(&name).await?;
    Ok((StatusCode::CREATED, axum::Json(joined)).into_response())
}

async fn verdict(
    State(app): State<App>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let Some(token) = bearer(&headers) else {
        app.stranger_may_try()?;
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "a verdict needs the learner's token (Authorization: Bearer …), which joining gives",
        ));
    };
    let Some(learner) = app.store.learner_of(token).await? else {
        app.stranger_may_try()?;
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "no learner has this token: join the class again",
        ));
    };
    app.learner_may_post(learner.id)?;
    let post: VerdictPost = json_body(body)?;
    post.validate()
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.to_string()))?;
    // The learner is the token's: a post names no learner, so nobody writes another's cells.
    app.store
        .record(learner.id, &post, Source::SelfReported)
        .await?;
    Ok((StatusCode::CREATED, axum::Json(json!({"recorded": true}))).into_response())
}

async fn verified(
    State(app): State<App>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    if !bearer(&headers).is_some_and(|token| app.store.is_instructor(token)) {
        app.stranger_may_try()?;
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "a verified verdict needs the instructor's token",
        ));
    }
    let post: VerifiedPost = json_body(body)?;
    post.verdict
        .validate()
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.to_string()))?;
    let learner = app.store.learner_named(&post.learner).await?;
    app.store
        .record(learner.id, &post.verdict, Source::Verified)
        .await?;
    Ok((StatusCode::CREATED, axum::Json(json!({"recorded": true}))).into_response())
}

async fn export(
    app: &App,
    headers: &HeaderMap,
    query: &TokenQuery,
) -> Result<(Vec<crate::store::Learner>, Vec<crate::store::Stored>), ApiError> {
    if !app.is_instructor(headers, query) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "the export has names: it needs the instructor's token",
        ));
    }
    Ok((app.store.learners().await?, app.store.cells().await?))
}

async fn export_csv(
    State(app): State<App>,
    headers: HeaderMap,
    Query(query): Query<TokenQuery>,
) -> Result<Response, ApiError> {
    let (learners, cells) = export(&app, &headers, &query).await?;
    Ok((
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"lab-class.csv\"",
            ),
        ],
        crate::grid::csv(&learners, &cells),
    )
        .into_response())
}

async fn export_junit(
    State(app): State<App>,
    headers: HeaderMap,
    Query(query): Query<TokenQuery>,
) -> Result<Response, ApiError> {
    let (learners, cells) = export(&app, &headers, &query).await?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/xml; charset=utf-8"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"lab-class.junit.xml\"",
            ),
        ],
        crate::grid::junit(&learners, &cells, &app.texts.lang),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_lets_a_burst_through_then_slows_to_its_rate() {
        let rate = Rate {
            per_second: 10.0,
            burst: 3.0,
        };
        let mut bucket = Bucket::full(rate);
        for _ in 0..3 {
            assert!(bucket.take(rate).is_ok());
        }
        let wait = bucket.take(rate).expect_err("the burst is spent");
        assert!(wait > Duration::ZERO && wait <= Duration::from_millis(100));
    }
}
