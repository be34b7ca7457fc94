//! Proof of compatibility: the `toxiproxy_rust` client drives our embedded API,
//! in front of the machine's real Redis (127.0.0.1:6379; only PING is sent).
//!
//! The client is blocking (reqwest's blocking client), so every call goes through
//! `spawn_blocking`, on a multi-thread runtime: on a current-thread runtime it
//! would wait for an answer from a server that the waiting thread itself runs.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::time::Duration;

use common::*;
use faultproxy::FaultProxy;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use toxiproxy_rust::client::Client;
use toxiproxy_rust::proxy::{Proxy as ClientProxy, ProxyPack};

const REDIS: &str = "127.0.0.1:6379";
const PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";

async fn blocking<T: Send + 'static>(call: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(call)
        .await
        .expect("blocking call panicked")
}

/// Sends PING through the proxy, returns how long PONG took.
async fn ping(listen: &str) -> std::io::Result<Duration> {
    let started = Instant::now();
    let mut redis = TcpStream::connect(listen).await?;
    redis.write_all(PING).await?;
    let mut pong = [0; 7];
    within(redis.read_exact(&mut pong)).await?;
    assert_eq!(&pong, b"+PONG\r\n");
    Ok(started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn toxiproxy_rust_client_drives_the_embedded_api() {
    let proxies = FaultProxy::new();
    let api = serve_api(&proxies).await;
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
        let pack = ProxyPack::new("redis".into(), "127.0.0.1:0".into(), REDIS.into());
        blocking(move || client.populate(vec![pack])).await.unwrap()
    };
    assert_eq!(populated.len(), 1);
    let listen = populated[0].proxy_pack.listen.clone();
    assert!(!listen.ends_with(":0"));
    ping(&listen).await.unwrap();

    // A latency toxic added through the client slows a real Redis round trip.
    let find = |client: Client| blocking(move || client.find_proxy("redis").unwrap());
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

    // reset: toxics gone, fast again.
    let reset_client = client.clone();
    blocking(move || reset_client.reset()).await.unwrap();
    assert!(ping(&listen).await.unwrap() < Duration::from_millis(300));
    assert!(find(client.clone()).await.proxy_pack.toxics.is_empty());

    // The client's gaps, through plain HTTP: reset_peer, and status codes.
    let reset_peer = r#"{"type": "reset_peer", "attributes": {"timeout": 0}}"#;
    let (status, _) = http(api, "POST", "/proxies/redis/toxics", Some(reset_peer)).await;
    assert_eq!(status, 200);
    let error = blocking(move || {
        let mut redis = std::net::TcpStream::connect(&listen)?;
        redis.write_all(PING)?;
        redis.read(&mut [0; 7])
    })
    .await
    .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::ConnectionReset);
    assert_error(
        http(api, "POST", "/proxies/redis/toxics", Some(reset_peer)).await,
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
        http(api, "GET", "/proxies/redis", None).await,
        404,
        "proxy not found",
    );
    assert_eq!(http(api, "GET", "/proxies", None).await, (200, json!({})));
}
