//! One-shot faults: each does exactly what its name says, exactly N times.

use crate::common;

use std::io::ErrorKind;
use std::time::Duration;

use common::*;
use faultproxy::Fault;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

async fn send(proxy: &faultproxy::Proxy, request: &[u8]) -> TcpStream {
    let mut client = TcpStream::connect(proxy.listen_addr()).await.unwrap();
    client.write_all(request).await.unwrap();
    client
}

async fn assert_reset(client: &mut TcpStream) {
    let error = within(read_all(client)).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::ConnectionReset);
}

#[tokio::test]
async fn response_lost_after_commit_hits_exactly_n_connections() {
    let mut server = answering_server(b"charged".to_vec()).await;
    let (_proxies, proxy) = proxy_to(server.address).await;
    let lost = proxy.arm(Fault::ResponseLostAfterCommit, 2);

    for _ in 0..2 {
        let mut client = send(&proxy, b"pay 10").await;
        // The server did the work...
        assert_eq!(within(server.requests.recv()).await.unwrap(), b"pay 10");
        // ...and the client only sees a reset.
        assert_reset(&mut client).await;
    }
    within(lost.fired_times(2)).await;
    assert_eq!((lost.fired_count(), lost.uses_left()), (2, 0));

    assert_eq!(roundtrip(&proxy, b"pay 10").await, b"charged");
    assert_eq!(lost.fired_count(), 2);
}

#[tokio::test]
async fn request_lost_never_reaches_the_server() {
    let mut server = answering_server(b"charged".to_vec()).await;
    let (_proxies, proxy) = proxy_to(server.address).await;
    let lost = proxy.arm(Fault::RequestLost, 1);

    let mut client = send(&proxy, b"pay 10").await;
    assert!(within(read_all(&mut client)).await.unwrap().is_empty());
    within(lost.fired()).await;

    assert_eq!(roundtrip(&proxy, b"pay 20").await, b"charged");
    // Only the second request ever reached the server.
    assert_eq!(within(server.requests.recv()).await.unwrap(), b"pay 20");
    assert!(server.requests.try_recv().is_err());
}

#[tokio::test]
async fn slow_response_delivers_everything_late_even_when_the_server_hangs_up() {
    let answer: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
    let server = answering_server(answer.clone()).await;
    let (_proxies, proxy) = proxy_to(server.address).await;
    let slow = proxy.arm(Fault::SlowResponse(Duration::from_millis(400)), 1);

    let started = Instant::now();
    assert_eq!(roundtrip(&proxy, b"GET").await, answer);
    assert!(started.elapsed() >= Duration::from_millis(400));
    assert_eq!((slow.fired_count(), slow.uses_left()), (1, 0));

    // The next connection is untouched: the fault (counted the moment it holds a
    // response back) does not strike again.
    assert_eq!(roundtrip(&proxy, b"GET").await, answer);
    assert_eq!(slow.fired_count(), 1, "the next one is untouched");
}

#[tokio::test]
async fn connection_refused_cuts_before_the_server_sees_anything() {
    let server = answering_server(b"hello".to_vec()).await;
    let (_proxies, proxy) = proxy_to(server.address).await;
    let refused = proxy.arm(Fault::ConnectionRefused, 2);

    for _ in 0..2 {
        let mut client = TcpStream::connect(proxy.listen_addr()).await.unwrap();
        assert_reset(&mut client).await;
    }
    within(refused.fired_times(2)).await;
    assert_eq!(
        server.connection_count(),
        0,
        "not even a connection reached the server"
    );

    assert_eq!(roundtrip(&proxy, b"hi").await, b"hello");
    assert_eq!(server.connection_count(), 1);
}

#[tokio::test]
async fn reset_forwards_the_request_then_resets_the_client() {
    let mut server = answering_server(b"charged".to_vec()).await;
    let (_proxies, proxy) = proxy_to(server.address).await;
    let reset = proxy.arm(Fault::Reset, 1);

    let mut client = send(&proxy, b"pay 10").await;
    assert_reset(&mut client).await;
    assert_eq!(within(server.requests.recv()).await.unwrap(), b"pay 10");
    within(reset.fired()).await;

    assert_eq!(roundtrip(&proxy, b"pay 10").await, b"charged");
}

/// A trigger breaks the connection that carries the request when it fires, and
/// nothing opened after.
#[tokio::test]
async fn trigger_breaks_only_connections_open_when_it_fires() {
    let (server, mut checkpoints) = checkpoint_server().await;
    let (_proxies, proxy) = proxy_to(server).await;
    let (lost, trigger) = proxy.arm_on_trigger(Fault::ResponseLostAfterCommit, 2);

    // An idle connection, open when the trigger fires, but not carrying the request.
    let mut bystander = TcpStream::connect(proxy.listen_addr()).await.unwrap();

    let mut first = send(&proxy, b"first").await;
    let checkpoint = within(checkpoints.recv()).await.unwrap();
    assert_eq!(checkpoint.request, b"first");
    assert_eq!(trigger.fire(), 2, "aimed at `first` and `bystander`");
    checkpoint.proceed.send(()).unwrap();
    assert_reset(&mut first).await;
    within(lost.fired()).await;

    // Opened after the fire: untouched, although one use is left.
    let mut second = send(&proxy, b"second").await;
    within(checkpoints.recv())
        .await
        .unwrap()
        .proceed
        .send(())
        .unwrap();
    assert_eq!(within(read_all(&mut second)).await.unwrap(), b"done:second");

    // The bystander was aimed at, but `first` took the hit for that fire.
    bystander.write_all(b"bystander").await.unwrap();
    within(checkpoints.recv())
        .await
        .unwrap()
        .proceed
        .send(())
        .unwrap();
    assert_eq!(
        within(read_all(&mut bystander)).await.unwrap(),
        b"done:bystander"
    );

    // The second and last use. (`second` and `bystander` may still count as open
    // until the proxy has seen their close; they cannot take the hit any more.)
    drop((second, bystander));
    let mut third = send(&proxy, b"third").await;
    let checkpoint = within(checkpoints.recv()).await.unwrap();
    assert!(trigger.fire() >= 1);
    checkpoint.proceed.send(()).unwrap();
    assert_reset(&mut third).await;
    within(lost.fired_times(2)).await;

    // Used up: firing again does nothing.
    let mut fourth = send(&proxy, b"fourth").await;
    let checkpoint = within(checkpoints.recv()).await.unwrap();
    assert_eq!(trigger.fire(), 0);
    checkpoint.proceed.send(()).unwrap();
    assert_eq!(within(read_all(&mut fourth)).await.unwrap(), b"done:fourth");
    assert_eq!(lost.fired_count(), 2);
}

#[tokio::test]
async fn reset_of_the_registry_disarms_faults() {
    let server = answering_server(b"hello".to_vec()).await;
    let (proxies, proxy) = proxy_to(server.address).await;
    let refused = proxy.arm(Fault::ConnectionRefused, 1);
    proxies.reset().await;
    assert_eq!(refused.uses_left(), 0);
    assert_eq!(roundtrip(&proxy, b"hi").await, b"hello");
    assert_eq!(refused.fired_count(), 0);
}
