//! Serves the embedded proxy's Toxiproxy-compatible API on a given address until killed, so
//! that Toxiproxy's own clients (toxiproxy-python, toxiproxy-node-client, the Go client,
//! toxiproxy-cli, curl) can drive it: CI runs the Python and Node clients against it
//! (`clients/`).
//!
//! ```text
//! cargo run -p faultproxy --example serve_api -- 127.0.0.1:8474
//! ```
//!
//! Prints `listening on ADDRESS` once the port is bound (port 0 picks a free one), then serves
//! until SIGINT or SIGTERM.

use faultproxy::FaultProxy;
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let address = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8474".to_string());
    let listener = TcpListener::bind(&address).await.map_err(|error| {
        std::io::Error::new(error.kind(), format!("cannot listen on {address}: {error}"))
    })?;
    println!("listening on {}", listener.local_addr()?);

    let proxies = FaultProxy::new();
    let mut terminate = signal(SignalKind::terminate())?;
    tokio::select! {
        served = proxies.serve_api(listener) => served,
        _ = tokio::signal::ctrl_c() => Ok(()),
        _ = terminate.recv() => Ok(()),
    }
}
