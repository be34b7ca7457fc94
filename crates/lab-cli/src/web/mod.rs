//! `lab run NAME --web`: the run as a live page, for a projector.
//!
//! The page is one more renderer of the event stream, not a second telling of the scenarios:
//! every event the narrator emits is rendered for the page in both languages
//! ([`lab_core::render::WebRenderer`]) and sent to every browser over server-sent events. The
//! run pauses at the same step gate as `--step`; the page's Next and answer buttons feed the
//! gate's input the lines a learner would type.
//!
//! ```text
//!            Narrator ── WebSink ──▶ Hub ── GET /api/events (SSE) ──▶ every browser
//!               ▲                     │ replay of the current scenario for late browsers
//!   Gate ◀── LineReader ◀── Hub ◀── POST /api/control {token, action} ◀── the driving browser
//! ```
//!
//! - [`hub`]: the messages, the pause the run waits at, the driver's commands, restarts.
//! - [`input`]: the gate's input over a channel.
//! - this module: the HTTP server and the page itself (`page/`: plain HTML, CSS and JS,
//!   embedded in the binary with `include_str!`; there is no build step).
//!
//! One browser drives, any number watch. The driver is whoever opens the URL with the token
//! (`/?drive=…`) printed on the terminal (and opened in the default browser); the plain URL
//! watches. The server listens on 127.0.0.1 unless `--web-bind` says otherwise.
//!
//! Every malformed request gets a 4xx with a JSON body `{"error": …}`: an unknown path 404, a
//! wrong method 405, a body that is not the command JSON 400, a missing or wrong token 403, a
//! Next when nothing waits 409.

pub mod hub;
pub mod input;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{StatusCode, Uri};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use hub::{Command, Hub};

const INDEX_HTML: &str = include_str!("page/index.html");
const APP_JS: &str = include_str!("page/app.js");
const STYLE_CSS: &str = include_str!("page/style.css");

/// How long a browser waits before reconnecting after its stream ended (the SSE `retry` field).
const RECONNECT: Duration = Duration::from_millis(500);

/// The web server of one `lab run --web`, stopped by [`WebServer::stop`].
pub struct WebServer {
    pub addr: SocketAddr,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl WebServer {
    /// Binds `addr` and serves the page and the hub's streams on it.
    pub async fn start(addr: SocketAddr, hub: Arc<Hub>) -> std::io::Result<WebServer> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let router = router(hub, stop.clone());
        let task = tokio::spawn(lab_services::http::serve(
            listener,
            router,
            stop.clone(),
            lab_services::http::Limits::default(),
        ));
        Ok(WebServer { addr, stop, task })
    }

    /// Ends every stream (browsers show that lab is gone) and stops the server.
    pub async fn stop(self) {
        self.stop.cancel();
        let mut task = self.task;
        if tokio::time::timeout(Duration::from_secs(2), &mut task)
            .await
            .is_err()
        {
            task.abort();
        }
    }
}

#[derive(Clone)]
struct AppState {
    hub: Arc<Hub>,
    stop: CancellationToken,
}

fn router(hub: Arc<Hub>, stop: CancellationToken) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/app.js", get(app_js))
        .route("/style.css", get(style_css))
        .route("/api/events", get(events))
        .route("/api/control", axum::routing::post(control))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(AppState { hub, stop })
}

/// A JSON error body with its status: every refusal of this server looks like this.
fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, axum::Json(json!({"error": message.into()}))).into_response()
}

async fn not_found(uri: Uri) -> Response {
    error(
        StatusCode::NOT_FOUND,
        format!("no such page: {}", uri.path()),
    )
}

async fn method_not_allowed() -> Response {
    error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed here: the page is GET /, the stream GET /api/events, the controls POST /api/control",
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

#[derive(Deserialize)]
struct EventsQuery {
    drive: Option<String>,
}

/// The stream of one browser: a hello, the current scenario so far, then every new message.
/// A browser that falls too far behind loses its stream and reconnects, replaying from the
/// start of the scenario (the page redraws from what it gets).
async fn events(State(app): State<AppState>, Query(query): Query<EventsQuery>) -> Response {
    let driver = app.hub.drives(query.drive.as_deref());
    let (replay, rx) = app.hub.subscribe();
    let mut first: VecDeque<Arc<str>> = VecDeque::with_capacity(replay.len() + 1);
    first.push_back(app.hub.hello(driver));
    first.extend(replay);
    let stop = app.stop.clone();
    let stream = futures_util::stream::unfold(
        (first, rx, stop, false),
        |(mut first, mut rx, stop, told_retry)| async move {
            let message = match first.pop_front() {
                Some(message) => message,
                None => tokio::select! {
                    _ = stop.cancelled() => return None,
                    // Lagged or closed: end the stream; the browser reconnects.
                    received = rx.recv() => received.ok()?,
                },
            };
            let mut event = SseEvent::default().data(&*message);
            // Said once, with the hello: how soon to reconnect when the stream ends.
            if !told_retry {
                event = event.retry(RECONNECT);
            }
            Some((Ok::<_, Infallible>(event), (first, rx, stop, true)))
        },
    );
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// `POST /api/control`: `{"token": …, "action": "next" | "answer" | "restart", "answer": "b",
/// "pause": 17}`. `pause`, when given, is the pause the click was meant for.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ControlBody {
    token: Option<String>,
    action: String,
    answer: Option<String>,
    pause: Option<u64>,
}

async fn control(State(app): State<AppState>, body: Bytes) -> Response {
    let body: ControlBody = match serde_json::from_slice(&body) {
        Ok(body) => body,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!(
                    "expected a JSON object like {{\"token\": \"…\", \"action\": \"next\"}}: {e}"
                ),
            );
        }
    };
    if !app.hub.drives(body.token.as_deref()) {
        return error(
            StatusCode::FORBIDDEN,
            "only the driving browser controls the run: open the URL with ?drive=… that lab printed",
        );
    }
    let command = match (body.action.as_str(), body.answer.as_deref()) {
        ("next", None) => Command::Next { pause: body.pause },
        ("answer", Some(answer)) => match parse_letter(answer) {
            Some(letter) => Command::Answer {
                pause: body.pause,
                letter,
            },
            None => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("an answer is one letter, a to z, not {answer:?}"),
                );
            }
        },
        ("restart", None) => Command::Restart,
        ("answer", None) => {
            return error(
                StatusCode::BAD_REQUEST,
                "action answer needs \"answer\": a letter",
            );
        }
        (action @ ("next" | "restart"), Some(_)) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("action {action} takes no answer"),
            );
        }
        (other, _) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("unknown action {other:?}: next, answer or restart"),
            );
        }
    };
    match app.hub.control(command) {
        Ok(body) => axum::Json(body).into_response(),
        Err(refusal) => error(refusal.status, refusal.error),
    }
}

/// One letter, a to z, in either case.
fn parse_letter(answer: &str) -> Option<char> {
    let mut chars = answer.trim().chars();
    let letter = chars.next()?.to_ascii_lowercase();
    (chars.next().is_none() && letter.is_ascii_lowercase()).then_some(letter)
}

/// Whether `addr` can be reached from other machines (then anyone there can watch the run).
pub fn is_exposed(addr: &SocketAddr) -> bool {
    !addr.ip().is_loopback()
}

/// Opens `url` in the default browser, when there is a display to show one on: nothing in CI,
/// over SSH without forwarding, or in a container. Says so when it cannot.
pub fn open_browser(url: &str) {
    let display = ["DISPLAY", "WAYLAND_DISPLAY"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|s| !s.is_empty()));
    let ci = std::env::var_os("CI").is_some_and(|s| !s.is_empty());
    if !display || ci {
        return;
    }
    if let Err(e) = open::that_detached(url) {
        eprintln!("lab: could not open a browser ({e}); open the URL above yourself");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_one_letter() {
        assert_eq!(parse_letter("b"), Some('b'));
        assert_eq!(parse_letter(" C "), Some('c'));
        assert_eq!(parse_letter("bc"), None);
        assert_eq!(parse_letter("1"), None);
        assert_eq!(parse_letter(""), None);
        assert_eq!(parse_letter("я"), None);
    }

    #[test]
    fn loopback_is_not_exposed() {
        assert!(!is_exposed(&"127.0.0.1:0".parse().unwrap()));
        assert!(!is_exposed(&"[::1]:0".parse().unwrap()));
        assert!(is_exposed(&"0.0.0.0:8080".parse().unwrap()));
    }
}
