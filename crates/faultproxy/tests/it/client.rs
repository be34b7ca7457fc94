//! The async client against the embedded API, on real connections.

use std::time::{Duration, Instant};

use faultproxy::client::{ClientError, ToxiproxyClient};
use faultproxy::{FaultProxy, Stream, Toxic, ToxicKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An upstream that answers every line with `pong\n`.
async fn pong_server() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 64];
                while let Ok(n) = socket.read(&mut buf).await {
                    if n == 0 || socket.write_all(b"pong\n").await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

async fn ping(addr: &str) -> std::io::Result<Duration> {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr).await?;
    stream.write_all(b"ping\n").await?;
    let mut buf = [0u8; 5];
    stream.read_exact(&mut buf).await?;
    Ok(started.elapsed())
}

#[tokio::test]
async fn configures_proxies_and_toxics_over_http() {
    let proxies = FaultProxy::new();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = format!("http://{}", listener.local_addr().unwrap());
    let server = proxies.clone();
    tokio::spawn(async move { server.serve_api(listener).await });
    let client = ToxiproxyClient::new(&api);

    assert_eq!(
        client.version().await.unwrap(),
        faultproxy::TOXIPROXY_VERSION
    );
    let upstream = pong_server().await;
    let info = client
        .create_proxy("pong", "127.0.0.1:0", &upstream.to_string())
        .await
        .unwrap();
    assert!(
        !info.listen.ends_with(":0"),
        "the real port: {}",
        info.listen
    );
    ping(&info.listen).await.unwrap();

    let latency = Toxic::new(
        ToxicKind::Latency {
            latency: 200,
            jitter: 0,
        },
        Stream::Downstream,
    );
    let created = client.add_toxic("pong", &latency).await.unwrap();
    assert_eq!(created.name, "latency_downstream");
    assert!(ping(&info.listen).await.unwrap() >= Duration::from_millis(200));
    client
        .remove_toxic("pong", "latency_downstream")
        .await
        .unwrap();

    client.set_enabled("pong", false).await.unwrap();
    assert!(
        ping(&info.listen).await.is_err(),
        "a disabled proxy refuses"
    );
    client.reset().await.unwrap();
    ping(&info.listen).await.unwrap();

    match client.proxy("nope").await {
        Err(ClientError::Status { status: 404, .. }) => {}
        other => panic!("expected a 404, got {other:?}"),
    }
    match client
        .create_proxy("pong", "127.0.0.1:0", "127.0.0.1:1")
        .await
    {
        Err(ClientError::Status { status: 409, .. }) => {}
        other => panic!("expected a 409, got {other:?}"),
    }
    client.delete_proxy("pong").await.unwrap();
    assert!(
        ping(&info.listen).await.is_err(),
        "a deleted proxy no longer listens"
    );
}

#[tokio::test]
async fn an_absent_api_is_reported_as_unreachable() {
    let client = ToxiproxyClient::new("http://127.0.0.1:1");
    assert!(matches!(
        client.version().await,
        Err(ClientError::Unreachable { .. })
    ));
}
