//! Proof of compatibility: the `toxiproxy_rust` client drives our embedded API, in
//! front of an upstream the test starts itself (a PING/+PONG responder on a port of
//! its own), so that nothing needs to be running on the machine.
//!
//! The client is blocking (reqwest's blocking client), so every call goes through
//! `spawn_blocking`, on a multi-thread runtime: on a current-thread runtime it
//! would wait for an answer from a server that the waiting thread itself runs.

use crate::common;

use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use faultproxy::FaultProxy;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use toxiproxy_rust::client::Client;
use toxiproxy_rust::proxy::{Proxy as ClientProxy, ProxyPack};

/// `PING` in the RESP wire format, and its answer.
const PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";
const PONG: &[u8] = b"+PONG\r\n";

/// The upstream: answers every complete PING with +PONG (however the bytes are split
/// into reads), until the client hangs up.
async fn pong_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut received, mut buffer) = (Vec::new(), [0; 256]);
                while let Ok(read @ 1..) = socket.read(&mut buffer).await {
                    received.extend_from_slice(&buffer[..read]);
                    while received.starts_with(PING) {
                        received.drain(..PING.len());
                        if socket.write_all(PONG).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    address
}

async fn blocking<T: Send + 'static>(call: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(call)
        .await
        .expect("blocking call panicked")
}

/// Sends PING through the proxy, returns how long PONG took.
async fn ping(listen: &str) -> std::io::Result<Duration> {
    let started = Instant::now();
    let mut upstream = TcpStream::connect(listen).await?;
    upstream.write_all(PING).await?;
    let mut pong = [0; PONG.len()];
    within(upstream.read_exact(&mut pong)).await?;
    assert_eq!(pong, PONG);
    Ok(started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn toxiproxy_rust_client_drives_the_embedded_api() {
    let proxies = FaultProxy::new();
    let api = serve_api(&proxies).await;
    let upstream = pong_server().await.to_string();
    let client = blocking(move || Client::new(api)).await;

    let version = {
        let client = client.clone();
        blocking(move || (client.is_running(), client.version())).await
    };
    assert!(version.0);
    assert!(version.1.unwrap().contains("2.12.0"));

    // populate, on a free port chosen by the proxy (Toxiproxy reports it back).
    let populated = {
        let client = client.clone();
        let pack = ProxyPack::new("pong".into(), "127.0.0.1:0".into(), upstream);
        blocking(move || client.populate(vec![pack])).await.unwrap()
    };
    assert_eq!(populated.len(), 1);
    let listen = populated[0].proxy_pack.listen.clone();
    assert!(!listen.ends_with(":0"));
    ping(&listen).await.unwrap();

    // A latency toxic added through the client slows a real round trip.
    let find = |client: Client| blocking(move || client.find_proxy("pong").unwrap());
    let proxy: ClientProxy = find(client.clone()).await;
    let proxy = blocking(move || {
        proxy.with_latency("downstream".into(), 300, 0, 1.0);
        proxy
    })
    .await;
    assert!(ping(&listen).await.unwrap() >= Duration::from_millis(300));

    // toxics() and find_proxy() must parse our JSON while a toxic exists.
    let (proxy, toxics) = blocking(move || {
        let toxics = proxy.toxics().unwrap();
        (proxy, toxics)
    })
    .await;
    assert_eq!(toxics.len(), 1);
    assert_eq!(
        (toxics[0].name.as_str(), toxics[0].attributes["latency"]),
        ("latency_downstream", 300)
    );
    assert_eq!(find(client.clone()).await.proxy_pack.toxics.len(), 1);

    // with_down: connection refused inside the closure, fine again after it.
    let down_listen = listen.clone();
    let (proxy, down) = blocking(move || {
        let mut refused = None;
        let result = proxy.with_down(|| {
            refused = Some(std::net::TcpStream::connect(&down_listen).map(|_| ()));
        });
        (proxy, result.map(|()| refused))
    })
    .await;
    let refused = down.unwrap().unwrap().unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::ConnectionRefused);
    ping(&listen).await.unwrap();

    // reset: toxics gone, a held request let go at once. With an hour of latency on
    // the requests, the PING is seen held by the proxy; only the reset can free it.
    let proxy = blocking(move || {
        let an_hour = u32::try_from(AN_HOUR_MS).unwrap();
        proxy.with_latency("upstream".into(), an_hour, 0, 1.0);
        proxy
    })
    .await;
    assert_eq!(find(client.clone()).await.proxy_pack.toxics.len(), 2);
    let held_ping = tokio::spawn({
        let listen = listen.clone();
        async move { ping(&listen).await }
    });
    let ours = proxies.get("pong").unwrap();
    until("the proxy holds the PING", || ours.held_chunks() == 1).await;
    let reset_client = client.clone();
    blocking(move || reset_client.reset()).await.unwrap();
    within(held_ping).await.unwrap().unwrap();
    assert_eq!(ours.held_chunks(), 0);
    assert!(find(client.clone()).await.proxy_pack.toxics.is_empty());
    ping(&listen).await.unwrap(); // would take an hour if a toxic had stayed

    // The client's gaps, through plain HTTP: reset_peer, and status codes.
    let reset_peer = r#"{"type": "reset_peer", "attributes": {"timeout": 0}}"#;
    let (status, _) = http(api, "POST", "/proxies/pong/toxics", Some(reset_peer)).await;
    assert_eq!(status, 200);
    let error = blocking(move || {
        let mut upstream = std::net::TcpStream::connect(&listen)?;
        upstream.write_all(PING)?;
        upstream.read(&mut [0; PONG.len()])
    })
    .await
    .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::ConnectionReset);
    assert_error(
        http(api, "POST", "/proxies/pong/toxics", Some(reset_peer)).await,
        409,
        "toxic already exists",
    );

    // delete() through the client really deletes (the client ignores statuses).
    blocking(move || {
        proxy.delete().unwrap();
        drop(client); // reqwest's blocking client must not be dropped on a runtime thread
    })
    .await;
    assert_error(
        http(api, "GET", "/proxies/pong", None).await,
        404,
        "proxy not found",
    );
    assert_eq!(http(api, "GET", "/proxies", None).await, (200, json!({})));
}
