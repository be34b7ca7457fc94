//! Toxiproxy's proxy tests (`proxy_test.go`), ported: one test per Go test, named after it.
//!
//! The Go tests call `proxy.Start()`, `Stop()` and `Update()` on a `Proxy` value; a client
//! of the API does the same with `POST /proxies` and `POST /proxies/{name}`, which is what
//! these tests do, checking the result over TCP. `CONFORMANCE.md` lists every Go test.

use crate::common;

use std::net::SocketAddr;

use common::*;
use faultproxy::FaultProxy;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// Toxiproxy's `WithTCPServer`: a server that accepts one connection and reports everything
/// it reads until the client closes.
async fn tcp_server() -> (SocketAddr, oneshot::Receiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (report, received) = oneshot::channel();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut everything = Vec::new();
        socket.read_to_end(&mut everything).await.unwrap();
        let _ = report.send(everything);
    });
    (address, received)
}

/// Toxiproxy's `WithTCPProxy`: that server behind a proxy named `test` listening on
/// `localhost:0`, and a client connected through it.
async fn tcp_proxy() -> (
    FaultProxy,
    SocketAddr,
    TcpStream,
    oneshot::Receiver<Vec<u8>>,
) {
    let (upstream, received) = tcp_server().await;
    let proxies = FaultProxy::new();
    let api = serve_api(&proxies).await;
    let (status, created) = create(api, "test", "localhost:0", &upstream.to_string()).await;
    assert_eq!(status, 201, "{created}");
    let client = TcpStream::connect(created["listen"].as_str().unwrap())
        .await
        .unwrap();
    (proxies, api, client, received)
}

async fn create(api: SocketAddr, name: &str, listen: &str, upstream: &str) -> (u16, Value) {
    let body = json!({"name": name, "listen": listen, "upstream": upstream});
    http(api, "POST", "/proxies", Some(&body.to_string())).await
}

/// `proxy.Update(...)` through the API.
async fn update(api: SocketAddr, name: &str, change: Value) -> (u16, Value) {
    let path = format!("/proxies/{name}");
    http(api, "POST", &path, Some(&change.to_string())).await
}

/// Sends `message` through the client, closes, and checks that the server read exactly it.
async fn assert_delivered(
    mut client: TcpStream,
    received: oneshot::Receiver<Vec<u8>>,
    parts: &[&[u8]],
) {
    for part in parts {
        client.write_all(part).await.unwrap();
    }
    client.shutdown().await.unwrap();
    let everything = within(received).await.unwrap();
    assert_eq!(everything, parts.concat());
}

#[tokio::test]
async fn proxy_simple_message() {
    let (_proxies, _api, client, received) = tcp_proxy().await;
    assert_delivered(client, received, &[b"hello world"]).await;
}

#[tokio::test]
async fn proxy_to_down_upstream() {
    let proxies = FaultProxy::new();
    let api = serve_api(&proxies).await;
    // Nothing listens on port 1 of this machine (a privileged port nobody serves).
    let (status, created) = create(api, "test", "localhost:0", "127.0.0.1:1").await;
    assert_eq!(status, 201, "{created}");
    let mut client = TcpStream::connect(created["listen"].as_str().unwrap())
        .await
        .unwrap();
    // The proxy could not reach the server: it closes the client's connection (EOF).
    let mut byte = [0; 1];
    assert_eq!(within(client.read(&mut byte)).await.unwrap(), 0);
}

#[tokio::test]
async fn proxy_big_message() {
    let (_proxies, _api, client, received) = tcp_proxy().await;
    // 32 kB hex-encoded: 64 kB, several chunks.
    let message: Vec<u8> = std::iter::repeat_n(b"00".as_slice(), 32 * 1024)
        .flatten()
        .copied()
        .collect();
    assert_delivered(client, received, &[&message]).await;
}

#[tokio::test]
async fn proxy_two_part_message() {
    let (_proxies, _api, client, received) = tcp_proxy().await;
    assert_delivered(client, received, &[b"hello world", b"hello world"]).await;
}

#[tokio::test]
async fn closing_proxy_multiple_times() {
    let (_proxies, api, _client, _received) = tcp_proxy().await;
    for _ in 0..3 {
        let (status, stopped) = update(api, "test", json!({"enabled": false})).await;
        assert_eq!((status, &stopped["enabled"]), (200, &json!(false)));
    }
}

#[tokio::test]
async fn start_two_proxies_on_same_address() {
    let (_proxies, api, _client, _received) = tcp_proxy().await;
    let (_, first) = http(api, "GET", "/proxies/test", None).await;
    let listen = first["listen"].as_str().unwrap();
    let (status, error) = create(api, "proxy_2", listen, "localhost:3306").await;
    assert_eq!(status, 500, "{error}");
}

#[tokio::test]
async fn stop_proxy_before_starting() {
    let (upstream, _received) = tcp_server().await;
    let proxies = FaultProxy::new();
    let api = serve_api(&proxies).await;
    let listen = format!("localhost:{}", free_port());
    let body = json!({"name": "test", "listen": listen, "upstream": upstream.to_string(),
        "enabled": false});
    assert_eq!(
        http(api, "POST", "/proxies", Some(&body.to_string()))
            .await
            .0,
        201
    );
    assert_proxy_up(&listen, false).await;

    // Stopping a proxy that never started, then starting it twice: the second start is no
    // error over the API (Toxiproxy's `ErrProxyAlreadyStarted` stays inside its server).
    assert_eq!(update(api, "test", json!({"enabled": false})).await.0, 200);
    assert_eq!(update(api, "test", json!({"enabled": true})).await.0, 200);
    assert_eq!(update(api, "test", json!({"enabled": true})).await.0, 200);
    assert_proxy_up(&listen, true).await;

    assert_eq!(update(api, "test", json!({"enabled": false})).await.0, 200);
    assert_proxy_up(&listen, false).await;
}

#[tokio::test]
async fn proxy_update() {
    let (_proxies, api, _client, _received) = tcp_proxy().await;
    let (_, before) = http(api, "GET", "/proxies/test", None).await;
    let before = before["listen"].as_str().unwrap().to_owned();
    assert_proxy_up(&before, true).await;

    let (status, moved) = update(api, "test", json!({"listen": "localhost:0"})).await;
    assert_eq!(status, 200, "{moved}");
    let after = moved["listen"].as_str().unwrap().to_owned();
    assert_ne!(after, before, "the listen address changed");
    assert_ne!(after, "localhost:0", "the real address is shown");
    assert_proxy_up(&after, true).await;

    let (status, _) = update(api, "test", json!({"listen": after})).await;
    assert_eq!(status, 200);
    assert_proxy_up(&after, true).await;

    let (status, _) = update(api, "test", json!({"listen": after, "enabled": false})).await;
    assert_eq!(status, 200);
    assert_proxy_up(&after, false).await;
}

#[tokio::test]
async fn proxy_update_with_hostname() {
    let proxies = FaultProxy::new();
    let api = serve_api(&proxies).await;
    let echo = echo_server().await.to_string();
    let (_, created) = create(api, "test", "localhost:0", &echo).await;
    let listen = created["listen"].as_str().unwrap().to_owned();
    let mut client = TcpStream::connect(&listen).await.unwrap();
    client.write_all(b"before").await.unwrap();
    let mut echoed = [0; 6];
    within(client.read_exact(&mut echoed)).await.unwrap();

    // The same address under another name: nothing to restart, the connection survives.
    let port = listen.rsplit_once(':').unwrap().1;
    let (status, _) = update(api, "test", json!({"listen": format!("localhost:{port}")})).await;
    assert_eq!(status, 200);
    client.write_all(b"after!").await.unwrap();
    within(client.read_exact(&mut echoed)).await.unwrap();
    assert_eq!(&echoed, b"after!");
    assert_proxy_up(&listen, true).await;
}

#[tokio::test]
async fn restart_failed_to_start_proxy() {
    let (upstream, _received) = tcp_server().await;
    let upstream = upstream.to_string();
    let proxies = FaultProxy::new();
    let api = serve_api(&proxies).await;
    let (_, conflict) = create(api, "test2", "localhost:0", &upstream).await;
    let taken = conflict["listen"].as_str().unwrap().to_owned();
    assert_proxy_up(&taken, true).await;

    let body = json!({"name": "test", "listen": taken, "upstream": upstream, "enabled": false});
    assert_eq!(
        http(api, "POST", "/proxies", Some(&body.to_string()))
            .await
            .0,
        201
    );
    let (status, error) = update(api, "test", json!({"enabled": true})).await;
    assert_eq!(status, 500, "{error}");
    assert!(
        error["error"]
            .as_str()
            .unwrap()
            .ends_with("address already in use")
    );

    assert_eq!(update(api, "test2", json!({"enabled": false})).await.0, 200);
    assert_proxy_up(&taken, false).await;

    let (status, started) = update(api, "test", json!({"enabled": true})).await;
    assert_eq!((status, &started["enabled"]), (200, &json!(true)));
    assert_proxy_up(&taken, true).await;
    assert_eq!(update(api, "test", json!({"enabled": false})).await.0, 200);
    assert_proxy_up(&taken, false).await;
}

/// `Proxy.Differs` is internal to Toxiproxy; what it decides shows in `POST /populate`: a
/// proxy given again under another name of the same address (`localhost:PORT` for
/// `127.0.0.1:PORT`) does not differ, so it is kept, toxics and all.
#[tokio::test]
async fn proxy_differs() {
    let (upstream, _received) = tcp_server().await;
    let upstream = upstream.to_string();
    let proxies = FaultProxy::new();
    let api = serve_api(&proxies).await;
    let (_, created) = create(api, "test", "localhost:0", &upstream).await;
    let port = created["listen"]
        .as_str()
        .unwrap()
        .rsplit_once(':')
        .unwrap()
        .1;
    let toxic = json!({"type": "latency", "attributes": {"latency": 1}}).to_string();
    assert_eq!(
        http(api, "POST", "/proxies/test/toxics", Some(&toxic))
            .await
            .0,
        200
    );

    let again = json!([{"name": "test", "listen": format!("localhost:{port}"),
        "upstream": upstream}]);
    let (status, body) = http(api, "POST", "/populate", Some(&again.to_string())).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["proxies"][0]["toxics"].as_array().unwrap().len(), 1);
}
