//! Changes that race with traffic or with each other: a removed latency lets a held answer go,
//! and a proxy deleted while someone re-enables it stays deleted.

use crate::common;

use common::{AN_HOUR_MS, answering_server, proxy_to, until, within};
use faultproxy::{Stream, Toxic, ToxicKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A latency of an hour on the answers: an answer that arrives at all was let go early.
fn an_hour_of_latency() -> Toxic {
    let latency = ToxicKind::Latency {
        latency: AN_HOUR_MS,
        jitter: 0,
    };
    Toxic::new(latency, Stream::Downstream)
}

#[tokio::test]
async fn removing_a_latency_toxic_releases_a_held_answer_at_once() {
    let mut server = answering_server(b"pong".to_vec()).await;
    let (_proxies, proxy) = proxy_to(server.address).await;
    let latency = an_hour_of_latency();
    proxy.add_toxic(latency.clone()).unwrap();

    let mut client = TcpStream::connect(proxy.listen_addr()).await.unwrap();
    client.write_all(b"ping").await.unwrap();
    within(server.requests.recv()).await.unwrap();
    until("the proxy holds the answer", || proxy.held_chunks() == 1).await;

    proxy.remove_toxic(&latency.name).unwrap();
    let mut answer = Vec::new();
    within(client.read_to_end(&mut answer)).await.unwrap();
    assert_eq!(answer, b"pong");
    assert_eq!(proxy.held_chunks(), 0, "nothing is held any more");
}

#[tokio::test]
async fn a_reset_releases_a_held_answer_too() {
    let mut server = answering_server(b"pong".to_vec()).await;
    let (proxies, proxy) = proxy_to(server.address).await;
    proxy.add_toxic(an_hour_of_latency()).unwrap();

    let mut client = TcpStream::connect(proxy.listen_addr()).await.unwrap();
    client.write_all(b"ping").await.unwrap();
    within(server.requests.recv()).await.unwrap();
    until("the proxy holds the answer", || proxy.held_chunks() == 1).await;

    proxies.reset().await;
    let mut answer = Vec::new();
    within(client.read_to_end(&mut answer)).await.unwrap();
    assert_eq!(answer, b"pong");
    assert_eq!(proxy.held_chunks(), 0, "nothing is held any more");
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

/// Disabling hands the port from the listener to the socket that keeps it without a moment in
/// between. Another socket that tries to bind the port all along (as any program's outgoing
/// connection may, when the port is from the ephemeral range) never gets it, and the proxy
/// listens again every time. The listener once closed first and kept the port after: a
/// connection made in that gap took the port, and enabling failed with "address in use".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabling_leaves_no_moment_when_the_port_is_free() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let server = answering_server(b"pong".to_vec()).await;
    let (_proxies, proxy) = proxy_to(server.address).await;
    let address = proxy.listen_addr();
    let done = Arc::new(AtomicBool::new(false));
    let contender = {
        let done = done.clone();
        // A plain thread, binding as fast as it can: no await point to give the gap away.
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                let socket = tokio::net::TcpSocket::new_v4().unwrap();
                if socket.bind(address).is_ok() {
                    return Some(socket);
                }
            }
            None
        })
    };
    for cycle in 0..300 {
        proxy.set_enabled(false).await.unwrap();
        if let Err(error) = proxy.set_enabled(true).await {
            panic!("enabling again failed in cycle {cycle}: {error}");
        }
    }
    done.store(true, Ordering::Relaxed);
    let taken = contender.join().unwrap();
    assert!(taken.is_none(), "another socket bound {address}");
}
