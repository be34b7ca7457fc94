//! Serving a router on a listener, with the limits a server on a classroom network needs.
//!
//! `axum::serve` keeps a connection open for as long as the client likes, even one that never
//! sends a byte: two hundred idle connections held by a curious learner stay open forever. This
//! loop is `axum::serve` with one addition, a header-read timeout: a connection that has not sent
//! a complete request head within [`Limits::header_read`] is closed (hyper applies it to the first
//! request and to every keep-alive request after it).
//!
//! Every connection is a task in a `JoinSet` owned by the serving future: stopping gracefully
//! lets requests in flight finish; dropping the future (an aborted service) aborts them all.

use std::time::Duration;
use tracing::Instrument as _;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// How long a client may take to send a request head.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub header_read: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            // Generous for a person typing into `nc`, short enough that idle connections do not
            // pile up.
            header_read: Duration::from_secs(10),
        }
    }
}

/// Serves `router` on `listener` until `stop` is cancelled, then lets the requests in flight
/// finish (closing idle keep-alive connections at once).
pub async fn serve(listener: TcpListener, router: Router, stop: CancellationToken, limits: Limits) {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read);
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    loop {
        let stream = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of file descriptors, or a connection reset before it was accepted: the
                // listener is still good. A short pause keeps a full descriptor table from
                // turning this loop into a busy one.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            // Reap finished connections as they end, so the set does not grow with the count
            // of connections ever served.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let service = TowerToHyperService::new(router.clone());
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        // The connection's task carries the service's span on (a spawned task starts with none).
        // Boxed: a connection's future is several kilobytes (hyper's state machine with the
        // router's), and spawning moves a future into its task by value; a profile of `lab bench
        // report-api` had half of all instructions in memcpy, most of it from spawns.
        connections.spawn(
            Box::pin(async move {
                let _ = connection.await;
            })
            .in_current_span(),
        );
    }
    drop(listener);
    graceful.shutdown().await;
    while connections.join_next().await.is_some() {}
}

/// A file embedded in the binary (a page, its script, its style), never cached: a newer `lab`
/// serves a newer page. The web view of `lab run --web` and the board of `lab class` serve theirs
/// this way.
pub fn embedded_asset(content_type: &'static str, body: &'static str) -> axum::response::Response {
    use axum::http::{HeaderValue, header};
    use axum::response::IntoResponse as _;
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        body,
    )
        .into_response()
}
