//! Every toxic on real TCP connections through a real proxy.

use crate::common;

use std::io::ErrorKind;
use std::time::Duration;

use common::*;
use faultproxy::{Stream, Toxic, ToxicKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::time::Instant;

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

async fn echo_once(client: &mut TcpStream, message: &[u8]) -> Duration {
    let started = Instant::now();
    client.write_all(message).await.unwrap();
    let mut echoed = vec![0; message.len()];
    within(client.read_exact(&mut echoed)).await.unwrap();
    assert_eq!(echoed, message);
    started.elapsed()
}

#[tokio::test]
async fn latency_delays_each_stream_and_reaches_open_connections() {
    let (_proxies, proxy) = proxy_to(echo_server().await).await;
    let mut client = TcpStream::connect(proxy.listen_addr()).await.unwrap();
    echo_once(&mut client, b"warm-up").await;

    // Added while `client` is open: it must apply to it, like in Toxiproxy.
    let latency = ToxicKind::Latency {
        latency: 300,
        jitter: 0,
    };
    proxy
        .add_toxic(Toxic::new(latency.clone(), Stream::Downstream))
        .unwrap();
    assert!(echo_once(&mut client, b"ping").await >= ms(300));

    proxy
        .add_toxic(Toxic::new(latency, Stream::Upstream))
        .unwrap();
    assert!(echo_once(&mut client, b"ping").await >= ms(600));

    proxy.remove_toxic("latency_downstream").unwrap();
    proxy.remove_toxic("latency_upstream").unwrap();
    echo_once(&mut client, b"ping").await;

    // Removing a toxic reaches the open connection too: with an hour of latency the
    // chunk is seen held, then let go by the removal, and later chunks pass freely.
    let an_hour = ToxicKind::Latency {
        latency: AN_HOUR_MS,
        jitter: 0,
    };
    proxy
        .add_toxic(Toxic::new(an_hour, Stream::Downstream))
        .unwrap();
    client.write_all(b"held").await.unwrap();
    until("the proxy holds the echo", || proxy.held_chunks() == 1).await;
    proxy.remove_toxic("latency_downstream").unwrap();
    let mut echoed = [0; 4];
    within(client.read_exact(&mut echoed)).await.unwrap();
    assert_eq!(&echoed, b"held");
    assert_eq!(proxy.held_chunks(), 0);
    echo_once(&mut client, b"free").await;
}

/// The bug of the noxious port: a server that writes its answer and hangs up at
/// once must still get its whole answer delivered, late, and then the close.
#[tokio::test]
async fn latency_never_loses_an_answer_followed_by_a_close() {
    let answer: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let server = answering_server(answer.clone()).await;
    let (_proxies, proxy) = proxy_to(server.address).await;
    let latency = ToxicKind::Latency {
        latency: 300,
        jitter: 0,
    };
    proxy
        .add_toxic(Toxic::new(latency, Stream::Downstream))
        .unwrap();

    let started = Instant::now();
    assert_eq!(roundtrip(&proxy, b"GET / HTTP/1.0\r\n\r\n").await, answer);
    let elapsed = started.elapsed();
    assert!(elapsed >= ms(300), "{elapsed:?}");
    // That the 13+ chunks of 16 kB are each delayed from their own arrival, not one after
    // the other (another noxious bug, 4 s here), is checked exactly on a paused clock:
    // `latency_counts_from_each_chunks_arrival` in src/toxic.rs.
}

#[tokio::test]
async fn toxicity_zero_never_applies() {
    let (_proxies, proxy) = proxy_to(echo_server().await).await;
    let latency = ToxicKind::Latency {
        latency: AN_HOUR_MS,
        jitter: 0,
    };
    proxy
        .add_toxic(Toxic::new(latency, Stream::Downstream).with_toxicity(0.0))
        .unwrap();
    let mut client = TcpStream::connect(proxy.listen_addr()).await.unwrap();
    // Had the toxic applied, the echo would take an hour.
    echo_once(&mut client, b"ping").await;
    echo_once(&mut client, b"pong").await;
    assert_eq!(proxy.held_chunks(), 0);
}

#[tokio::test]
async fn timeout_swallows_data_then_closes() {
    let (_proxies, proxy) = proxy_to(echo_server().await).await;
    let timeout = ToxicKind::Timeout { timeout: 300 };
    proxy
        .add_toxic(Toxic::new(timeout, Stream::Downstream))
        .unwrap();

    // Started before connecting: the toxic's countdown starts when the proxy takes
    // the connection, which may be before `connect` returns here.
    let started = Instant::now();
    let mut client = TcpStream::connect(proxy.listen_addr()).await.unwrap();
    client.write_all(b"anyone there?").await.unwrap();
    let received = within(read_all(&mut client)).await.unwrap();
    assert!(received.is_empty(), "the echo must have been swallowed");
    assert!(started.elapsed() >= ms(300));
}

#[tokio::test]
async fn timeout_zero_blocks_until_removed_then_closes() {
    let (_proxies, proxy) = proxy_to(echo_server().await).await;
    let timeout = ToxicKind::Timeout { timeout: 0 };
    proxy
        .add_toxic(Toxic::new(timeout, Stream::Downstream))
        .unwrap();

    // Each echo is swallowed (seen in the proxy's count, not by waiting for nothing
    // to arrive), and the connection stays open.
    let mut client = TcpStream::connect(proxy.listen_addr()).await.unwrap();
    client.write_all(b"lost").await.unwrap();
    until("the first echo is swallowed", || {
        proxy.swallowed_chunks() == 1
    })
    .await;
    client.write_all(b"gone").await.unwrap();
    until("the second echo is swallowed", || {
        proxy.swallowed_chunks() == 2
    })
    .await;

    // Removing the toxic closes the connection it held, as Toxiproxy does: the client never
    // receives a byte, only the close. A new connection flows again.
    proxy.remove_toxic("timeout_downstream").unwrap();
    assert!(within(read_all(&mut client)).await.unwrap().is_empty());
    let mut again = TcpStream::connect(proxy.listen_addr()).await.unwrap();
    echo_once(&mut again, b"back").await;
    assert_eq!(proxy.swallowed_chunks(), 2);
}

#[tokio::test]
async fn reset_peer_resets_the_client() {
    let (_proxies, proxy) = proxy_to(echo_server().await).await;
    let reset = ToxicKind::ResetPeer { timeout: 200 };
    proxy
        .add_toxic(Toxic::new(reset, Stream::Downstream))
        .unwrap();

    let mut client = TcpStream::connect(proxy.listen_addr()).await.unwrap();
    let started = Instant::now();
    client.write_all(b"hello").await.unwrap();
    let error = within(read_all(&mut client)).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::ConnectionReset);
    assert!(started.elapsed() >= ms(200));
}

#[tokio::test]
async fn limit_data_cuts_at_exactly_n_bytes() {
    let (_proxies, proxy) = proxy_to(echo_server().await).await;
    let limit = ToxicKind::LimitData { bytes: 10 };
    proxy
        .add_toxic(Toxic::new(limit, Stream::Downstream))
        .unwrap();

    let mut client = TcpStream::connect(proxy.listen_addr()).await.unwrap();
    client
        .write_all(b"0123456789abcdefghijklmno")
        .await
        .unwrap();
    assert_eq!(within(read_all(&mut client)).await.unwrap(), b"0123456789");
}

#[tokio::test]
async fn bandwidth_slows_the_transfer_without_losing_bytes() {
    let answer = vec![b'x'; 10_000];
    let server = answering_server(answer.clone()).await;
    let (_proxies, proxy) = proxy_to(server.address).await;
    let bandwidth = ToxicKind::Bandwidth { rate: 20 }; // 20 KB/s: 10 kB take 0.5 s
    proxy
        .add_toxic(Toxic::new(bandwidth, Stream::Downstream))
        .unwrap();

    let started = Instant::now();
    assert_eq!(roundtrip(&proxy, b"GET").await, answer);
    assert!(started.elapsed() >= ms(450), "{:?}", started.elapsed());
}

#[tokio::test]
async fn slow_close_delays_only_the_close() {
    let server = answering_server(b"bye".to_vec()).await;
    let (_proxies, proxy) = proxy_to(server.address).await;
    let slow_close = ToxicKind::SlowClose { delay: 300 };
    proxy
        .add_toxic(Toxic::new(slow_close, Stream::Downstream))
        .unwrap();

    let mut client = TcpStream::connect(proxy.listen_addr()).await.unwrap();
    let started = Instant::now();
    client.write_all(b"hi").await.unwrap();
    let mut answer = [0; 3];
    within(client.read_exact(&mut answer)).await.unwrap();
    assert_eq!(&answer, b"bye");
    assert!(within(read_all(&mut client)).await.unwrap().is_empty());
    assert!(started.elapsed() >= ms(300));
}

#[tokio::test]
async fn slicer_delivers_every_byte_in_pieces() {
    let answer: Vec<u8> = (0..200u8).collect();
    let server = answering_server(answer.clone()).await;
    let (_proxies, proxy) = proxy_to(server.address).await;
    let slicer = |delay_us| ToxicKind::Slicer {
        average_size: 10,
        size_variation: 5,
        delay: delay_us,
    };
    proxy
        .add_toxic(Toxic::new(slicer(5_000), Stream::Downstream))
        .unwrap();
    assert_eq!(
        roundtrip(&proxy, b"GET").await,
        answer,
        "every byte, in order"
    );

    // In pieces: with an hour between slices, all a reader can ever get is the first
    // slice (10 ± 5 bytes). Counting reads of a fast stream instead would depend on how
    // quickly the reader runs.
    proxy.remove_toxic("slicer_downstream").unwrap();
    proxy
        .add_toxic(Toxic::new(slicer(AN_HOUR_MS * 1000), Stream::Downstream))
        .unwrap();
    let mut client = TcpStream::connect(proxy.listen_addr()).await.unwrap();
    client.write_all(b"GET").await.unwrap();
    let mut buffer = [0; 1024];
    let read = within(client.read(&mut buffer)).await.unwrap();
    assert!((1..=15).contains(&read), "a first slice of {read} bytes");
    assert_eq!(buffer[..read], answer[..read]);
}

#[tokio::test]
async fn disabling_refuses_and_cuts_then_enabling_rebinds_the_same_port() {
    let (_proxies, proxy) = proxy_to(echo_server().await).await;
    let address = proxy.listen_addr();
    assert_ne!(address.port(), 0, "the real port is reported");
    let mut open = TcpStream::connect(address).await.unwrap();
    echo_once(&mut open, b"hello").await;

    proxy.set_enabled(false).await.unwrap();
    assert!(
        within(read_all(&mut open))
            .await
            .unwrap_or_default()
            .is_empty()
    );
    let refused = TcpStream::connect(address).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::ConnectionRefused);

    proxy.set_enabled(true).await.unwrap();
    assert_eq!(proxy.listen_addr(), address);
    let mut again = TcpStream::connect(address).await.unwrap();
    echo_once(&mut again, b"back").await;
}

/// While disabled, the proxy's port is still its own: a port from the ephemeral range, given up,
/// may be any other socket's a moment later, and enabling again would fail with "address in
/// use" (it did, in CI, when a parallel test's connection took it). Another socket cannot bind
/// it, and a connection to it is refused.
#[tokio::test]
async fn a_disabled_proxy_keeps_its_port() {
    let (_proxies, proxy) = proxy_to(echo_server().await).await;
    let address = proxy.listen_addr();
    proxy.set_enabled(false).await.unwrap();

    let other = tokio::net::TcpSocket::new_v4().unwrap();
    let taken = other.bind(address).unwrap_err();
    assert_eq!(taken.kind(), ErrorKind::AddrInUse);
    let refused = TcpStream::connect(address).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::ConnectionRefused);

    // Disabled twice, the port is still held; enabled, the proxy listens on it.
    proxy.set_enabled(false).await.unwrap();
    assert!(
        tokio::net::TcpSocket::new_v4()
            .unwrap()
            .bind(address)
            .is_err()
    );
    proxy.set_enabled(true).await.unwrap();
    let mut again = TcpStream::connect(address).await.unwrap();
    echo_once(&mut again, b"back").await;
}

/// A disabled proxy keeps its port from servers too, which bind a port by number with
/// `SO_REUSEADDR` (a socket that only holds a port lets such a bind through unless it is
/// exclusive). Not from another proxy of the same registry: that one takes the port over, as in
/// Toxiproxy, where a disabled proxy has given its port up, and enabling the first then fails
/// with "address in use" instead of sharing the second one's connections. Once the second one is
/// gone, the first listens again.
#[tokio::test]
async fn a_disabled_proxys_port_is_refused_to_a_server_and_taken_over_by_another_proxy() {
    let (proxies, proxy) = proxy_to(echo_server().await).await;
    let address = proxy.listen_addr();
    proxy.set_enabled(false).await.unwrap();

    let server = tokio::net::TcpSocket::new_v4().unwrap();
    server.set_reuseaddr(true).unwrap();
    assert_eq!(
        server.bind(address).unwrap_err().kind(),
        ErrorKind::AddrInUse
    );

    let answering = answering_server(b"second".to_vec()).await;
    proxies
        .create(
            "second",
            &address.to_string(),
            &answering.address.to_string(),
        )
        .await
        .unwrap();
    let taken = proxy.set_enabled(true).await.unwrap_err().to_string();
    assert!(
        taken.ends_with("Address already in use (os error 98)"),
        "{taken}"
    );
    for _ in 0..8 {
        let mut client = TcpStream::connect(address).await.unwrap();
        client.write_all(b"hi").await.unwrap();
        assert_eq!(within(read_all(&mut client)).await.unwrap(), b"second");
    }

    proxies.remove("second").await.unwrap();
    proxy.set_enabled(true).await.unwrap();
    let mut again = TcpStream::connect(address).await.unwrap();
    echo_once(&mut again, b"back").await;
}

/// The client stops sending (FIN) and still gets its answer: the server only
/// answers after reading end-of-stream, which must have been passed on.
#[tokio::test]
async fn half_close_from_the_client_is_forwarded() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let request = read_all(&mut socket).await.unwrap();
        socket
            .write_all(format!("got {} bytes", request.len()).as_bytes())
            .await
            .unwrap();
    });
    let (_proxies, proxy) = proxy_to(upstream).await;

    let mut client = TcpStream::connect(proxy.listen_addr()).await.unwrap();
    client.write_all(b"abc").await.unwrap();
    client.shutdown().await.unwrap();
    assert_eq!(within(read_all(&mut client)).await.unwrap(), b"got 3 bytes");
}

/// The server stops sending first; the client's later bytes still reach it.
#[tokio::test]
async fn half_close_from_the_server_is_forwarded() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    let (received_tx, received) = oneshot::channel();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        socket.write_all(b"greeting").await.unwrap();
        socket.shutdown().await.unwrap();
        let _ = received_tx.send(read_all(&mut socket).await.unwrap());
    });
    let (_proxies, proxy) = proxy_to(upstream).await;

    let mut client = TcpStream::connect(proxy.listen_addr()).await.unwrap();
    assert_eq!(within(read_all(&mut client)).await.unwrap(), b"greeting");
    client.write_all(b"late words").await.unwrap();
    client.shutdown().await.unwrap();
    assert_eq!(within(received).await.unwrap(), b"late words");
}
