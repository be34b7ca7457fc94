//! Toxiproxy's toxic tests (`toxics/*_test.go`), ported: one test per Go test that can be
//! seen from outside, named after it (`TestTwoLatencyToxics` → `two_latency_toxics`).
//!
//! The Go tests add toxics with `proxy.Toxics.AddToxicJson(...)`; these add them with the
//! same JSON through the HTTP API, and play client and server on real TCP connections. Many
//! Go toxic tests drive a toxic's `Pipe` directly on channels of chunks; here the chunks are
//! TCP writes, each one read by the other side before the next is written, so that they stay
//! apart.
//!
//! Timing: the Go tests allow ±10 ms around each delay. These check lower bounds only (a
//! delay at least as long as asked for) and never an upper bound, which would measure the
//! machine rather than the proxy; exact timing is checked on tokio's paused clock in
//! `src/toxic.rs`. `CONFORMANCE.md` lists every Go test and where it went.

use crate::common;

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use faultproxy::{FaultProxy, Proxy, Stream, Toxic, ToxicKind};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::time::Instant;

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// Adds a toxic to the proxy `test` with Toxiproxy's JSON, through the API.
async fn add(api: SocketAddr, toxic: Value) {
    let (status, body) = http(
        api,
        "POST",
        "/proxies/test/toxics",
        Some(&toxic.to_string()),
    )
    .await;
    assert_eq!(status, 200, "{toxic} → {body}");
}

async fn remove(api: SocketAddr, name: &str) {
    let path = format!("/proxies/test/toxics/{name}");
    assert_eq!(http(api, "DELETE", &path, None).await.0, 204);
}

/// `established()` with the API of its registry.
async fn established_with_api() -> (FaultProxy, Proxy, SocketAddr, TcpStream, TcpStream) {
    let (proxies, proxy, client, server) = established().await;
    let api = serve_api(&proxies).await;
    (proxies, proxy, api, client, server)
}

/// Toxiproxy's `AssertEchoResponse`: a line from client to server, and back.
async fn assert_echo_response(client: &mut TcpStream, server: &mut TcpStream) {
    let message = b"hello world\n";
    client.write_all(message).await.unwrap();
    let mut received = [0; 12];
    within(server.read_exact(&mut received)).await.unwrap();
    assert_eq!(&received, message);
    server.write_all(&received).await.unwrap();
    within(client.read_exact(&mut received)).await.unwrap();
    assert_eq!(&received, message);
}

// ---------------------------------------------------------------------------------------
// toxics/toxic_test.go
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn persistent_connections() {
    let (_proxies, _proxy, api, mut client, mut server) = established_with_api().await;
    add(
        api,
        json!({"name": "noop_up", "type": "noop", "stream": "upstream"}),
    )
    .await;
    add(
        api,
        json!({"name": "noop_down", "type": "noop", "stream": "downstream"}),
    )
    .await;
    assert_echo_response(&mut client, &mut server).await;

    // Resetting the toxics leaves the open connection working, twice over.
    for _ in 0..2 {
        assert_eq!(http(api, "POST", "/reset", None).await.0, 204);
        assert_echo_response(&mut client, &mut server).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn toxic_add_remove() {
    let (_proxies, proxy, mut client, mut server) = established().await;
    // Toxics come and go as fast as they can while 100 lines go back and forth.
    let running = Arc::new(AtomicBool::new(true));
    let churn = {
        let (proxy, running) = (proxy.clone(), running.clone());
        tokio::spawn(async move {
            let noop = |name: &str, stream| Toxic::new(ToxicKind::Noop, stream).named(name);
            let mut enabled = false;
            while running.load(Ordering::SeqCst) {
                if enabled {
                    let _ = proxy.add_toxic(noop("noop_up", Stream::Upstream));
                    let _ = proxy.remove_toxic("noop_down");
                } else {
                    let _ = proxy.remove_toxic("noop_up");
                    let _ = proxy.add_toxic(noop("noop_down", Stream::Downstream));
                }
                enabled = !enabled;
                tokio::task::yield_now().await;
            }
        })
    };
    for _ in 0..100 {
        assert_echo_response(&mut client, &mut server).await;
    }
    running.store(false, Ordering::SeqCst);
    within(churn).await.unwrap();
}

/// Go asserts an average round trip under 300 µs: an upper bound on time, which measures the
/// machine (the project does not assert those). What is checked: 100 round trips, none held.
#[tokio::test]
async fn proxy_latency() {
    let (_proxies, proxy, mut client, mut server) = established().await;
    for _ in 0..100 {
        assert_echo_response(&mut client, &mut server).await;
    }
    assert_eq!(proxy.held_chunks(), 0);
}

// ---------------------------------------------------------------------------------------
// toxics/latency_test.go
// ---------------------------------------------------------------------------------------

/// Toxiproxy's `WithEchoServer`: accepts one connection, reads a line, reports it with the
/// moment it is about to write it back, and writes it back.
async fn line_echo_server() -> (SocketAddr, oneshot::Receiver<(Vec<u8>, Instant)>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (report, received) = oneshot::channel();
    tokio::spawn(async move {
        let (socket, _) = listener.accept().await.unwrap();
        let mut socket = BufReader::new(socket);
        let mut line = Vec::new();
        socket.read_until(b'\n', &mut line).await.unwrap();
        let _ = report.send((line.clone(), Instant::now()));
        socket.get_mut().write_all(&line).await.unwrap();
    });
    (address, received)
}

/// Toxiproxy's `DoLatencyTest`: a 32 kB line through latency toxics on either stream.
async fn do_latency_test(up: Option<u64>, down: Option<u64>) {
    let (upstream, received) = line_echo_server().await;
    let (proxies, _proxy) = proxy_to(upstream).await;
    let api = serve_api(&proxies).await;
    if let Some(latency) = up {
        add(
            api,
            json!({"name": "latency_up", "type": "latency", "stream": "upstream",
            "attributes": {"latency": latency}}),
        )
        .await;
    }
    if let Some(latency) = down {
        add(
            api,
            json!({"name": "latency_down", "type": "latency", "stream": "downstream",
            "attributes": {"latency": latency}}),
        )
        .await;
    }
    let (up, down) = (ms(up.unwrap_or(0)), ms(down.unwrap_or(0)));
    let message = [b"hello world ".as_slice(), &[b'a'; 32 * 1024], b"\n"].concat();

    let listen = proxies.get("test").unwrap().listen_addr();
    let mut client = TcpStream::connect(listen).await.unwrap();
    let started = Instant::now();
    client.write_all(&message).await.unwrap();
    let (line, server_answered) = within(received).await.unwrap();
    assert!(line == message, "the server read the whole line");
    let server_read = server_answered - started;
    assert!(
        server_read >= up,
        "server read after {server_read:?}, latency {up:?}"
    );

    let mut echoed = vec![0; message.len()];
    within(client.read_exact(&mut echoed)).await.unwrap();
    assert!(echoed == message, "the client read the whole line back");
    let client_read = server_answered.elapsed();
    assert!(
        client_read >= down,
        "client read after {client_read:?}, latency {down:?}"
    );
    let round_trip = started.elapsed();
    assert!(round_trip >= up + down, "round trip {round_trip:?}");
}

#[tokio::test]
async fn upstream_latency() {
    do_latency_test(Some(100), None).await;
}

#[tokio::test]
async fn downstream_latency() {
    do_latency_test(None, Some(100)).await;
}

#[tokio::test]
async fn fullstream_latency_even() {
    do_latency_test(Some(100), Some(100)).await;
}

#[tokio::test]
async fn fullstream_latency_bias_up() {
    do_latency_test(Some(1000), Some(100)).await;
}

#[tokio::test]
async fn fullstream_latency_bias_down() {
    do_latency_test(Some(100), Some(1000)).await;
}

#[tokio::test]
async fn zero_latency() {
    do_latency_test(Some(0), Some(0)).await;
}

#[tokio::test]
async fn latency_toxic_close_race() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (_proxies, proxy) = proxy_to(listener.local_addr().unwrap()).await;
    tokio::spawn(async move {
        // Accept and forget: the connections end when the clients do.
        while let Ok((socket, _)) = listener.accept().await {
            drop(socket);
        }
    });
    // Interrupting a latency toxic while connections come and go must never wedge the proxy.
    let latency = Toxic::new(
        ToxicKind::Latency {
            latency: 10,
            jitter: 0,
        },
        Stream::Upstream,
    );
    for _ in 0..1000 {
        proxy.add_toxic(latency.clone()).unwrap();
        let mut client = TcpStream::connect(proxy.listen_addr()).await.unwrap();
        let _ = client.write_all(b"hello").await;
        drop(client);
        proxy.remove_toxic("latency_upstream").unwrap();
    }
    until("no chunk is held any more", || proxy.held_chunks() == 0).await;
}

#[tokio::test]
async fn two_latency_toxics() {
    let (upstream, received) = line_echo_server().await;
    let (proxies, proxy) = proxy_to(upstream).await;
    let api = serve_api(&proxies).await;
    for index in 0..2 {
        add(
            api,
            json!({"name": format!("latency_{index}"), "type": "latency",
            "stream": "upstream", "attributes": {"latency": 500}}),
        )
        .await;
    }
    let message = [b"hello world ".as_slice(), &[b'a'; 32 * 1024], b"\n"].concat();
    let mut client = TcpStream::connect(proxy.listen_addr()).await.unwrap();
    let started = Instant::now();
    client.write_all(&message).await.unwrap();
    let (line, server_answered) = within(received).await.unwrap();
    assert!(line == message);
    // They add up, as in Toxiproxy's chain of toxics: 500 + 500, not the larger of the two.
    let took = server_answered - started;
    assert!(took >= ms(1000), "two latencies of 500 ms took {took:?}");
}

/// Go asserts the transfer runs at 100 MB/s or more under a 100 ms latency (each chunk is
/// delayed from its own arrival, not one after another): an upper bound on time. That
/// property is checked exactly on the paused clock (`latency_counts_from_each_chunks_arrival`
/// in `src/toxic.rs`); here: 1.2 MB arrive intact and in order through the latency.
#[tokio::test]
async fn latency_toxic_bandwidth() {
    let (_proxies, proxy, api, mut client, mut server) = established_with_api().await;
    let payload = b"hello world ".repeat(1000);
    let writing = {
        let payload = payload.clone();
        tokio::spawn(async move { while server.write_all(&payload).await.is_ok() {} })
    };
    add(
        api,
        json!({"type": "latency", "attributes": {"latency": 100}}),
    )
    .await;
    let mut received = vec![0; payload.len()];
    for _ in 0..100 {
        within(client.read_exact(&mut received)).await.unwrap();
        assert!(
            received == payload,
            "the stream arrived intact and in order"
        );
    }
    drop(client);
    // The proxy hangs up on the server too, which ends its writing.
    within(writing).await.unwrap();
    assert_eq!(proxy.held_chunks(), 0);
}

// ---------------------------------------------------------------------------------------
// toxics/timeout_test.go
// ---------------------------------------------------------------------------------------

/// Toxiproxy's `WithEstablishedProxy`: a connection that has carried data both ways.
async fn warmed_up() -> (FaultProxy, Proxy, SocketAddr, TcpStream, TcpStream) {
    let (proxies, proxy, api, mut client, mut server) = established_with_api().await;
    let mut received = [0; 6];
    client.write_all(b"foobar").await.unwrap();
    within(server.read_exact(&mut received)).await.unwrap();
    server.write_all(b"foobar").await.unwrap();
    within(client.read_exact(&mut received)).await.unwrap();
    (proxies, proxy, api, client, server)
}

#[tokio::test]
async fn timeout_toxic_does_not_cause_hang() {
    let (_proxies, proxy, api, mut client, _server) = warmed_up().await;
    add(
        api,
        json!({"name": "might_block", "type": "latency", "stream": "upstream",
        "attributes": {"latency": 10}}),
    )
    .await;
    add(
        api,
        json!({"name": "timeout", "type": "timeout", "stream": "upstream",
        "attributes": {"timeout": 0}}),
    )
    .await;
    for sent in 1..=5 {
        client.write_all(b"hello").await.unwrap();
        // Through the latency, then swallowed by the timeout (seen, not waited for).
        until("the chunk is swallowed", || {
            proxy.swallowed_chunks() == sent
        })
        .await;
    }
    // Removing the latency toxic in front of a timeout toxic answers (the safety timeout
    // of `http` would fail the test if it hung).
    remove(api, "might_block").await;
}

#[tokio::test]
async fn timeout_toxic_closes_connection_on_remove() {
    let (_proxies, _proxy, api, mut client, mut server) = warmed_up().await;
    add(
        api,
        json!({"name": "to_delete", "type": "timeout", "stream": "upstream",
        "attributes": {"timeout": 0}}),
    )
    .await;
    remove(api, "to_delete").await;
    let mut byte = [0; 1];
    assert_eq!(
        within(client.read(&mut byte)).await.unwrap(),
        0,
        "client: EOF"
    );
    assert_eq!(
        within(server.read(&mut byte)).await.unwrap(),
        0,
        "server: EOF"
    );
}

// ---------------------------------------------------------------------------------------
// toxics/bandwidth_test.go
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn bandwidth_toxic() {
    let (_proxies, _proxy, api, mut client, mut server) = established_with_api().await;
    let rate_kb_per_s = 1000;
    add(
        api,
        json!({"type": "bandwidth", "stream": "upstream",
        "attributes": {"rate": rate_kb_per_s}}),
    )
    .await;
    let payload = b"hello world ".repeat(40_000); // 480 kB
    let started = Instant::now();
    let sending = {
        let payload = payload.clone();
        tokio::spawn(async move {
            client.write_all(&payload).await.unwrap();
            client.shutdown().await.unwrap();
        })
    };
    let mut received = vec![0; payload.len()];
    within(server.read_exact(&mut received)).await.unwrap();
    assert!(received == payload, "the server read the whole payload");
    let took = started.elapsed();
    // 480 kB at 1000 KB/s (1 KB = 1000 bytes, as in Toxiproxy).
    let expected = Duration::from_secs_f64(payload.len() as f64 / (rate_kb_per_s * 1000) as f64);
    assert!(took >= expected, "{took:?} < {expected:?}");
    within(sending).await.unwrap();
}

/// From a later `bandwidth_test.go`: a rate of 0 forwards unthrottled (no hang). A negative
/// rate, which Toxiproxy also passes through unthrottled, is refused by our API with a 400
/// (CONFORMANCE.md).
#[tokio::test]
async fn bandwidth_toxic_non_positive_rate() {
    let (_proxies, _proxy, api, mut client, mut server) = established_with_api().await;
    add(
        api,
        json!({"type": "bandwidth", "stream": "upstream", "attributes": {"rate": 0}}),
    )
    .await;
    assert_echo_response(&mut client, &mut server).await;

    let negative = json!({"name": "negative", "type": "bandwidth", "attributes": {"rate": -1}});
    let (status, _) = http(
        api,
        "POST",
        "/proxies/test/toxics",
        Some(&negative.to_string()),
    )
    .await;
    assert_eq!(status, 400);
}

// ---------------------------------------------------------------------------------------
// toxics/slicer_test.go (and slicer_termination_test.go)
// ---------------------------------------------------------------------------------------

/// The server writes `payload`; the client must read exactly it.
async fn assert_arrives_whole(server: &mut TcpStream, client: &mut TcpStream, payload: &[u8]) {
    server.write_all(payload).await.unwrap();
    let mut received = vec![0; payload.len()];
    within(client.read_exact(&mut received)).await.unwrap();
    assert!(
        received == payload,
        "{} bytes arrived changed",
        payload.len()
    );
}

/// Go counts the slices (about 480 for 480 kB); over TCP the receiver's reads may merge
/// them, so the slicing itself is checked in `src/toxic.rs` (`slices_add_up_and_respect_bounds`).
/// Here: every byte arrives, in order.
#[tokio::test]
async fn slicer_toxic() {
    let (_proxies, _proxy, api, mut client, mut server) = established_with_api().await;
    add(
        api,
        json!({"type": "slicer", "attributes":
        {"average_size": 1024, "size_variation": 512, "delay": 10}}),
    )
    .await;
    assert_arrives_whole(&mut server, &mut client, &b"hello world ".repeat(40_000)).await;
}

#[tokio::test]
async fn slicer_toxic_zero_size_variation() {
    let (_proxies, _proxy, api, mut client, mut server) = established_with_api().await;
    add(
        api,
        json!({"type": "slicer", "attributes": {"average_size": 1, "delay": 10}}),
    )
    .await;
    assert_arrives_whole(&mut server, &mut client, &b"hello world ".repeat(2)).await;
}

#[tokio::test]
async fn slicer_toxic_degenerate_attributes_terminate() {
    let (_proxies, proxy, api, mut client, mut server) = established_with_api().await;
    let data = b"hello world ".repeat(20);
    for attributes in [json!({}), json!({"average_size": 1, "size_variation": 200})] {
        add(
            api,
            json!({"name": "slicer", "type": "slicer", "attributes": attributes}),
        )
        .await;
        assert_arrives_whole(&mut server, &mut client, &data).await;
        proxy.remove_toxic("slicer").unwrap();
    }
    // A negative size variation is refused (Toxiproxy takes it): CONFORMANCE.md.
    let negative = json!({"type": "slicer", "attributes":
        {"average_size": 4, "size_variation": -8}});
    let (status, _) = http(
        api,
        "POST",
        "/proxies/test/toxics",
        Some(&negative.to_string()),
    )
    .await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn slicer_reassembles_for_any_attributes() {
    let (_proxies, proxy, api, mut client, mut server) = established_with_api().await;
    // Go's list without its negative average (refused by our API, see above).
    let params = [
        (0, 0),
        (0, 5),
        (1, 0),
        (2, 1),
        (5, 10),
        (10, 10),
        (64, 8),
        (1024, 512),
    ];
    let sizes = [1, 2, 21, 64, 1000, 4096];
    for (average, variation) in params {
        add(
            api,
            json!({"name": "slicer", "type": "slicer", "attributes":
            {"average_size": average, "size_variation": variation}}),
        )
        .await;
        for size in sizes {
            let payload: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
            assert_arrives_whole(&mut server, &mut client, &payload).await;
        }
        proxy.remove_toxic("slicer").unwrap();
    }
}

// ---------------------------------------------------------------------------------------
// toxics/limit_data_test.go
// ---------------------------------------------------------------------------------------

/// A client whose data to the server is limited to `limit` bytes.
async fn limited(limit: u64) -> (FaultProxy, SocketAddr, TcpStream, TcpStream) {
    let (proxies, _proxy, api, client, server) = established_with_api().await;
    add(
        api,
        json!({"name": "limit", "type": "limit_data", "stream": "upstream",
        "attributes": {"bytes": limit}}),
    )
    .await;
    (proxies, api, client, server)
}

/// The client writes `size` bytes; the server reads exactly `size` of them.
async fn pass(client: &mut TcpStream, server: &mut TcpStream, size: usize) {
    let chunk = vec![7; size];
    client.write_all(&chunk).await.unwrap();
    let mut received = vec![0; size];
    within(server.read_exact(&mut received)).await.unwrap();
}

/// What the server reads until the connection closes.
async fn rest(server: &mut TcpStream) -> usize {
    within(read_all(server)).await.unwrap().len()
}

#[tokio::test]
async fn limit_data_toxic_may_be_restarted() {
    let (_proxies, api, mut client, mut server) = limited(100).await;
    pass(&mut client, &mut server, 90).await;
    // An update restarts the toxic in Toxiproxy; the count of bytes already let through
    // survives it.
    let path = "/proxies/test/toxics/limit";
    let update = json!({"attributes": {"bytes": 100}}).to_string();
    assert_eq!(http(api, "POST", path, Some(&update)).await.0, 200);
    client.write_all(&[7; 20]).await.unwrap();
    assert_eq!(rest(&mut server).await, 10);
}

/// Interrupting the toxic before any data (in Go, `stub.Interrupt`) is, from outside,
/// removing it: the connection then carries data freely.
#[tokio::test]
async fn limit_data_toxic_may_be_interrupted() {
    let (_proxies, api, mut client, mut server) = limited(100).await;
    remove(api, "limit").await;
    pass(&mut client, &mut server, 200).await;
}

#[tokio::test]
async fn limit_data_toxic_nil_should_close_pipe() {
    let (_proxies, _api, mut client, mut server) = limited(100).await;
    client.shutdown().await.unwrap();
    assert_eq!(rest(&mut server).await, 0, "the close passed through");
}

#[tokio::test]
async fn limit_data_toxic_chunk_smaller_than_limit() {
    let (_proxies, _api, mut client, mut server) = limited(100).await;
    pass(&mut client, &mut server, 50).await;
    // Under the limit: still open, until the client closes.
    client.shutdown().await.unwrap();
    assert_eq!(rest(&mut server).await, 0);
}

#[tokio::test]
async fn limit_data_toxic_chunk_length_matches_limit() {
    let (_proxies, _api, mut client, mut server) = limited(100).await;
    client.write_all(&[7; 100]).await.unwrap();
    // All of it, then the proxy closes (the client never did).
    assert_eq!(rest(&mut server).await, 100);
}

#[tokio::test]
async fn limit_data_toxic_chunk_bigger_than_limit() {
    let (_proxies, _api, mut client, mut server) = limited(100).await;
    client.write_all(&[7; 150]).await.unwrap();
    assert_eq!(rest(&mut server).await, 100);
}

#[tokio::test]
async fn limit_data_toxic_multiple_chunks_match_than_limit() {
    let (_proxies, _api, mut client, mut server) = limited(100).await;
    for _ in 0..4 {
        pass(&mut client, &mut server, 25).await;
    }
    assert_eq!(rest(&mut server).await, 0, "closed after exactly 100 bytes");
}

#[tokio::test]
async fn limit_data_toxic_second_chunk_would_overflow_limit() {
    let (_proxies, _api, mut client, mut server) = limited(100).await;
    pass(&mut client, &mut server, 90).await;
    client.write_all(&[7; 20]).await.unwrap();
    assert_eq!(rest(&mut server).await, 10);
}

#[tokio::test]
async fn limit_data_toxic_limit_is_set_to_zero() {
    let (_proxies, _api, mut client, mut server) = limited(0).await;
    client.write_all(&[7; 100]).await.unwrap();
    assert_eq!(rest(&mut server).await, 0);
}

// ---------------------------------------------------------------------------------------
// toxics/reset_peer_test.go
// ---------------------------------------------------------------------------------------

const RESET_PAYLOAD: &[u8] = b"reset toxic payload\n";

/// Toxiproxy's `resetTCPHelper`: a line server behind a proxy with a reset_peer toxic; the
/// client sends a line. Returns the client and when it started sending.
async fn reset_peer(stream: &str, timeout: u64) -> (FaultProxy, TcpStream, Instant) {
    let (upstream, _received) = line_echo_server().await;
    let (proxies, proxy) = proxy_to(upstream).await;
    let api = serve_api(&proxies).await;
    add(
        api,
        json!({"name": "resettcp", "type": "reset_peer", "stream": stream,
        "attributes": {"timeout": timeout}}),
    )
    .await;
    let mut client = TcpStream::connect(proxy.listen_addr()).await.unwrap();
    let started = Instant::now();
    client.write_all(RESET_PAYLOAD).await.unwrap();
    (proxies, client, started)
}

/// Toxiproxy's `checkConnectionState`: "connection reset by peer", then EOF.
async fn assert_reset_then_eof(client: &mut TcpStream) {
    let mut buffer = [0; 1000];
    let error = within(client.read(&mut buffer)).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::ConnectionReset, "{error}");
    assert_eq!(within(client.read(&mut buffer)).await.unwrap(), 0);
}

#[tokio::test]
async fn reset_toxic_no_timeout() {
    let (_proxies, mut client, _started) = reset_peer("upstream", 0).await;
    assert_reset_then_eof(&mut client).await;
}

#[tokio::test]
async fn reset_toxic_with_timeout() {
    let (_proxies, mut client, started) = reset_peer("upstream", 100).await;
    assert_reset_then_eof(&mut client).await;
    assert!(started.elapsed() >= ms(100), "{:?}", started.elapsed());
}

#[tokio::test]
async fn reset_toxic_with_timeout_downstream() {
    let (_proxies, mut client, started) = reset_peer("downstream", 100).await;
    assert_reset_then_eof(&mut client).await;
    assert!(started.elapsed() >= ms(100), "{:?}", started.elapsed());
}
