//! Changes that race with traffic or with each other: a removed latency lets a held answer go,
//! and a proxy deleted while someone re-enables it stays deleted.

mod common;

use std::time::{Duration, Instant};

use common::{answering_server, proxy_to, within};
use faultproxy::{Proxy, Stream, Toxic, ToxicKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Waits until the proxy holds the answer (a state the proxy reports, not a guess at timing).
async fn until_held(proxy: &Proxy) {
    within(async {
        while proxy.held_chunks() == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

#[tokio::test]
async fn removing_a_latency_toxic_releases_a_held_answer_at_once() {
    let mut server = answering_server(b"pong".to_vec()).await;
    let (proxies, proxy) = proxy_to(server.address).await;
    let latency = Toxic::new(
        ToxicKind::Latency {
            latency: 20_000,
            jitter: 0,
        },
        Stream::Downstream,
    );
    proxy.add_toxic(latency.clone()).unwrap();

    let mut client = TcpStream::connect(proxy.listen_addr()).await.unwrap();
    client.write_all(b"ping").await.unwrap();
    within(server.requests.recv()).await.unwrap();
    until_held(&proxy).await;
    let started = Instant::now();
    proxy.remove_toxic(&latency.name).unwrap();
    let mut answer = Vec::new();
    within(client.read_to_end(&mut answer)).await.unwrap();
    assert_eq!(answer, b"pong");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the answer still waited {:?}",
        started.elapsed()
    );
    drop(proxies);
}

#[tokio::test]
async fn a_reset_releases_a_held_answer_too() {
    let mut server = answering_server(b"pong".to_vec()).await;
    let (proxies, proxy) = proxy_to(server.address).await;
    proxy
        .add_toxic(Toxic::new(
            ToxicKind::Latency {
                latency: 20_000,
                jitter: 0,
            },
            Stream::Downstream,
        ))
        .unwrap();
    let mut client = TcpStream::connect(proxy.listen_addr()).await.unwrap();
    client.write_all(b"ping").await.unwrap();
    within(server.requests.recv()).await.unwrap();
    until_held(&proxy).await;
    proxies.reset().await;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut answer))
        .await
        .expect("the held answer was released by the reset")
        .unwrap();
    assert_eq!(answer, b"pong");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_deleted_while_being_enabled_stays_deleted() {
    let server = answering_server(b"pong".to_vec()).await;
    for _ in 0..50 {
        let (proxies, proxy) = proxy_to(server.address).await;
        let address = proxy.listen_addr();
        proxy.set_enabled(false).await.unwrap();
        let enabling = {
            let proxy = proxy.clone();
            tokio::spawn(async move { proxy.set_enabled(true).await })
        };
        proxies.remove("test").await.unwrap();
        let _ = enabling.await.unwrap();
        assert!(
            TcpStream::connect(address).await.is_err(),
            "a deleted proxy still listens on {address}"
        );
    }
}
