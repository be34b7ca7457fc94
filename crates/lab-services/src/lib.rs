//! The HTTP services the lab starts on 127.0.0.1, and our side's task functions.
//!
//! These are real axum servers talking to real PostgreSQL: only their business is made up.
//! Learners are meant to read them; the report service's handler is the lesson's answer to
//! "how does a server make POST safe to retry?".
//!
//! # Layout
//!
//! - [`reports`]: the external report service of Lesson A (`POST /reports` with an optional
//!   `Idempotency-Key`, deduplicated by a UNIQUE constraint).
//! - [`tasks`]: our background tasks: `claim_task` and `complete_task`, exactly as the lesson.
//! - [`api`]: the JSON error type and body extractor every service shares, so a malformed
//!   request gets a 4xx with a JSON body, never a 500.
//! - [`RunningService`]: a service bound to a port, stopped when dropped.

pub mod api;
pub mod reports;
pub mod tasks;

use std::net::SocketAddr;

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A service serving on a loopback port. Dropping it stops it.
pub struct RunningService {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl RunningService {
    /// Serves `router` on `listener` in a background task.
    pub fn spawn(router: Router, listener: TcpListener) -> std::io::Result<RunningService> {
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(RunningService {
            addr,
            stop: Some(stop),
            task,
        })
    }

    /// Binds a free loopback port and serves `router` there.
    pub async fn start(router: Router) -> std::io::Result<RunningService> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        RunningService::spawn(router, listener)
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for RunningService {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // Connections still open (a paused handler) must not keep the service alive.
        self.task.abort();
    }
}
