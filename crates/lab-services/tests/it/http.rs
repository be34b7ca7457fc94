//! The accept loop of every bundled port: idle connections are closed after the header-read
//! timeout, requests are served, a stop lets a request in flight finish.

use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use lab_services::http::{Limits, serve};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

const HEADER_READ: Duration = Duration::from_millis(300);
/// Only keeps a broken build from hanging the suite; never the assertion.
const SAFETY: Duration = Duration::from_secs(30);

async fn start() -> (
    std::net::SocketAddr,
    CancellationToken,
    tokio::task::JoinHandle<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = Router::new().route("/", get(|| async { "hello" }));
    let stop = CancellationToken::new();
    let task = tokio::spawn(serve(
        listener,
        router,
        stop.clone(),
        Limits {
            header_read: HEADER_READ,
        },
    ));
    (addr, stop, task)
}

/// Reads until the server closes the connection; returns what came and when it closed.
async fn read_to_close(stream: &mut TcpStream, since: Instant) -> (String, Duration) {
    let mut got = Vec::new();
    tokio::time::timeout(SAFETY, stream.read_to_end(&mut got))
        .await
        .expect("the server closes the connection")
        .ok();
    (String::from_utf8_lossy(&got).into_owned(), since.elapsed())
}

#[tokio::test]
async fn a_silent_connection_is_closed_after_the_header_read_timeout() {
    let (addr, stop, task) = start().await;
    let opened = Instant::now();
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let (got, after) = read_to_close(&mut silent, opened).await;
    assert!(after >= HEADER_READ, "closed too early: {after:?}");
    assert!(!got.contains("hello"), "{got}");

    // Half a request head is no better.
    let opened = Instant::now();
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let (_, after) = read_to_close(&mut half, opened).await;
    assert!(after >= HEADER_READ, "closed too early: {after:?}");

    stop.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn a_whole_request_is_served() {
    let (addr, stop, task) = start().await;
    let mut client = TcpStream::connect(addr).await.unwrap();
    client
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let (got, _) = read_to_close(&mut client, Instant::now()).await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(got.ends_with("hello"), "{got}");
    stop.cancel();
    tokio::time::timeout(SAFETY, task)
        .await
        .expect("a stopped server with no request in flight ends")
        .unwrap();
}
