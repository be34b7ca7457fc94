//! Tiny real servers and clients shared by the integration tests.
#![allow(dead_code)] // each test binary uses its own subset

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use faultproxy::{FaultProxy, Proxy};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

/// How long a test may wait for something that should happen at once. Only a guard
/// against a hung test: no assertion relies on it (a delay a test must see as "not
/// applied" is an hour long, far beyond it).
pub const SAFETY_TIMEOUT: Duration = Duration::from_secs(30);

/// Fails a test that hangs instead of letting it hang CI, naming the line that waited.
#[track_caller]
pub fn within<F: Future>(future: F) -> impl Future<Output = F::Output> {
    let waiting_at = std::panic::Location::caller();
    async move {
        match tokio::time::timeout(SAFETY_TIMEOUT, future).await {
            Ok(output) => output,
            Err(_) => panic!("hung: still waiting after {SAFETY_TIMEOUT:?} at {waiting_at}"),
        }
    }
}

/// Waits until `condition` holds, polling state the proxy exposes (`held_chunks`,
/// `swallowed_chunks`, ...) between the other tasks' steps: an observation, not a
/// guess at timing.
#[track_caller]
pub fn until(what: &str, condition: impl Fn() -> bool) -> impl Future<Output = ()> {
    let waiting_at = std::panic::Location::caller();
    let what = what.to_owned();
    async move {
        let polling = async {
            while !condition() {
                tokio::task::yield_now().await;
            }
        };
        if tokio::time::timeout(SAFETY_TIMEOUT, polling).await.is_err() {
            panic!("hung: {what} did not happen within {SAFETY_TIMEOUT:?} (at {waiting_at})");
        }
    }
}

/// A latency no test can wait out: if a chunk still got it, the test would hang
/// (and fail at [`SAFETY_TIMEOUT`]) instead of passing by luck.
pub const AN_HOUR_MS: u64 = 60 * 60 * 1000;

pub async fn read_all(stream: &mut TcpStream) -> io::Result<Vec<u8>> {
    let mut received = Vec::new();
    stream.read_to_end(&mut received).await?;
    Ok(received)
}

/// Sends `request` through the proxy, half-closes (so an echo server finishes
/// too), and returns everything until the server's close.
pub async fn roundtrip(proxy: &Proxy, request: &[u8]) -> Vec<u8> {
    let mut client = TcpStream::connect(proxy.listen_addr()).await.unwrap();
    client.write_all(request).await.unwrap();
    client.shutdown().await.unwrap();
    within(read_all(&mut client)).await.unwrap()
}

pub async fn proxy_to(upstream: SocketAddr) -> (FaultProxy, Proxy) {
    let proxies = FaultProxy::new();
    proxies
        .create("test", "127.0.0.1:0", &upstream.to_string())
        .await
        .unwrap();
    let proxy = proxies.get("test").unwrap();
    (proxies, proxy)
}

async fn spawn_server<F, Fut>(mut serve: F) -> SocketAddr
where
    F: FnMut(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(serve(socket));
        }
    });
    address
}

/// Echoes every byte back; answers end-of-stream with its own (half-close).
pub async fn echo_server() -> SocketAddr {
    spawn_server(|mut socket| async move {
        let (mut reader, mut writer) = socket.split();
        let _ = tokio::io::copy(&mut reader, &mut writer).await;
        let _ = writer.shutdown().await;
    })
    .await
}

/// A server like an HTTP/1.0 one: reads a request, writes `response`, hangs up at once.
pub struct AnsweringServer {
    pub address: SocketAddr,
    /// Every request that reached the server.
    pub requests: mpsc::UnboundedReceiver<Vec<u8>>,
    /// How many connections reached the server at all.
    pub connections: Arc<AtomicUsize>,
}

impl AnsweringServer {
    pub fn connection_count(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

pub async fn answering_server(response: Vec<u8>) -> AnsweringServer {
    let (requests_tx, requests) = mpsc::unbounded_channel();
    let connections = Arc::new(AtomicUsize::new(0));
    let counter = connections.clone();
    let address = spawn_server(move |mut socket| {
        counter.fetch_add(1, Ordering::SeqCst);
        let (requests_tx, response) = (requests_tx.clone(), response.clone());
        async move {
            let mut request = vec![0; 1024];
            let read = socket.read(&mut request).await.unwrap_or(0);
            if read == 0 {
                return; // the client (the proxy) never sent anything
            }
            request.truncate(read);
            let _ = requests_tx.send(request);
            let _ = socket.write_all(&response).await;
        }
    })
    .await;
    AnsweringServer {
        address,
        requests,
        connections,
    }
}

/// A request parked at a server checkpoint: the server answers once `proceed` is sent.
pub struct Checkpoint {
    pub request: Vec<u8>,
    pub proceed: oneshot::Sender<()>,
}

/// A server that stops at a checkpoint for every request ("charged, about to
/// respond") until the test lets it answer `done:<request>` and hang up.
pub async fn checkpoint_server() -> (SocketAddr, mpsc::UnboundedReceiver<Checkpoint>) {
    let (checkpoints_tx, checkpoints) = mpsc::unbounded_channel();
    let address = spawn_server(move |mut socket| {
        let checkpoints_tx = checkpoints_tx.clone();
        async move {
            let mut request = vec![0; 1024];
            let read = socket.read(&mut request).await.unwrap_or(0);
            request.truncate(read);
            let (proceed, go) = oneshot::channel();
            let _ = checkpoints_tx.send(Checkpoint {
                request: request.clone(),
                proceed,
            });
            if go.await.is_ok() {
                let _ = socket.write_all(&[b"done:", &request[..]].concat()).await;
            }
        }
    })
    .await;
    (address, checkpoints)
}

/// Starts the Toxiproxy API of `proxies` on a port the listener picks (port 0) and keeps.
pub async fn serve_api(proxies: &FaultProxy) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let proxies = proxies.clone();
    tokio::spawn(async move { proxies.serve_api(listener).await });
    address
}

/// A minimal HTTP/1.1 client: one request per connection, JSON in and out.
pub async fn http(api: SocketAddr, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    let mut request =
        format!("{method} {path} HTTP/1.1\r\nHost: toxiproxy\r\nConnection: close\r\n");
    if let Some(body) = body {
        request += "Content-Type: application/json\r\n";
        request += &format!("Content-Length: {}\r\n", body.len());
    }
    request += "\r\n";
    request += body.unwrap_or("");
    raw_http(api, &request).await
}

/// Sends `request` as is; returns the status and the body parsed as JSON
/// (`Null` when empty, a JSON string when it is not JSON).
pub async fn raw_http(api: SocketAddr, request: &str) -> (u16, Value) {
    let mut stream = TcpStream::connect(api).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let response = String::from_utf8(within(read_all(&mut stream)).await.unwrap()).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(
        !head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "this little client cannot read chunked bodies: {head}"
    );
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let body = match body {
        "" => Value::Null,
        text => serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.into())),
    };
    (status, body)
}

/// Asserts Toxiproxy's error shape: `{"error": "...", "status": N}`.
pub fn assert_error(response: (u16, Value), status: u16, message_start: &str) {
    let (actual_status, body) = response;
    assert_eq!(actual_status, status, "body: {body}");
    assert_eq!(body["status"], status, "body: {body}");
    let message = body["error"].as_str().expect("an error message");
    assert!(
        message.starts_with(message_start),
        "{message:?} should start with {message_start:?}"
    );
}

/// Like [`raw_http`], but returns the head (status line and headers) and the body as text,
/// untouched: for the exact bytes of an answer, and its headers.
pub async fn raw_http_text(api: SocketAddr, request: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(api).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let response = String::from_utf8(within(read_all(&mut stream)).await.unwrap()).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head.to_owned(), body.to_owned())
}

/// A port that nothing holds right now (bound by us, its number read, let go): for tests that,
/// like Toxiproxy's, name the listen address themselves (`localhost:PORT`). Drawn at random
/// from below Linux's ephemeral range (10000 to 32767), where nobody gets a port without
/// asking for it by number: a port the kernel hands out for port 0 is soon a proxy's or an
/// outgoing connection's. Somebody could still take it before the test binds it; at random
/// among 22 000 ports that is very unlikely.
pub fn free_port() -> u16 {
    use std::hash::BuildHasher;
    for _ in 0..64 {
        let random = std::hash::RandomState::new().hash_one(0u8);
        let port = 10_000 + (random % 22_768) as u16;
        // Without SO_REUSEADDR: free of every socket, not only of listeners.
        let probe = tokio::net::TcpSocket::new_v4().unwrap();
        if probe.bind(([127, 0, 0, 1], port).into()).is_ok() {
            return port;
        }
    }
    panic!("no free port below the ephemeral range");
}

/// Toxiproxy's `AssertProxyUp`: a connection to `address` succeeds (`up`) or is refused.
#[track_caller]
pub fn assert_proxy_up(address: &str, up: bool) -> impl Future<Output = ()> {
    let waiting_at = std::panic::Location::caller();
    let address = address.to_owned();
    async move {
        match within(TcpStream::connect(&address)).await {
            Ok(_) if up => {}
            Err(error) if !up => assert_eq!(
                error.kind(),
                io::ErrorKind::ConnectionRefused,
                "{address} (at {waiting_at})"
            ),
            Ok(_) => panic!("{address} should be down (at {waiting_at})"),
            Err(error) => panic!("{address} should be up: {error} (at {waiting_at})"),
        }
    }
}

/// A proxy's toxic named `name` in a toxic list (a JSON array), if any: Toxiproxy's
/// `AssertToxicExists`.
pub fn find_toxic<'a>(toxics: &'a Value, name: &str) -> Option<&'a Value> {
    toxics
        .as_array()
        .expect("a toxic list")
        .iter()
        .find(|toxic| toxic["name"] == name)
}

/// An upstream that accepts one connection and hands it to the test, which plays the server
/// itself; and a proxy in front of it with a client connected through it. Returns the
/// registry, the proxy, the client's side and the server's side.
pub async fn established() -> (FaultProxy, Proxy, TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (proxies, proxy) = proxy_to(listener.local_addr().unwrap()).await;
    let client = TcpStream::connect(proxy.listen_addr()).await.unwrap();
    let (server, _) = within(listener.accept()).await.unwrap();
    (proxies, proxy, client, server)
}
