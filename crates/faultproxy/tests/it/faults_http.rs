//! The lab's fault extension of the API (`/lab/proxies/{proxy}/faults`) and its client
//! methods: armed over HTTP, seen on real TCP connections, listed, disarmed, and refused with
//! a 4xx JSON error when the request is wrong.

use crate::common;

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use faultproxy::client::{ClientError, ToxiproxyClient};
use faultproxy::{Arming, Fault, FaultInfo, FaultProxy, Proxy};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

const FAULTS: &str = "/lab/proxies/test/faults";

/// A proxy named `test` in front of an answering server, and the registry's API.
async fn setup(answer: &[u8]) -> (FaultProxy, Proxy, SocketAddr, AnsweringServer) {
    let server = answering_server(answer.to_vec()).await;
    let (proxies, proxy) = proxy_to(server.address).await;
    let api = serve_api(&proxies).await;
    (proxies, proxy, api, server)
}

async fn arm(api: SocketAddr, request: Value) -> Value {
    let (status, armed) = http(api, "POST", FAULTS, Some(&request.to_string())).await;
    assert_eq!(status, 201, "{request} → {armed}");
    armed
}

async fn listed(api: SocketAddr) -> Value {
    let (status, faults) = http(api, "GET", FAULTS, None).await;
    assert_eq!(status, 200);
    faults
}

async fn send(proxy: &Proxy, request: &[u8]) -> TcpStream {
    let mut client = TcpStream::connect(proxy.listen_addr()).await.unwrap();
    client.write_all(request).await.unwrap();
    client
}

async fn assert_reset(client: &mut TcpStream) {
    let error = within(read_all(client)).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::ConnectionReset);
}

/// Waits until the listing shows `fired` for the only armed fault: an observation of the
/// proxy's state, not a sleep.
async fn until_fired(api: SocketAddr, fired: usize) -> Value {
    within(async {
        loop {
            let faults = listed(api).await;
            if faults[0]["fired"] == fired {
                return faults;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
}

#[tokio::test]
async fn response_lost_after_commit_over_http() {
    let (_proxies, proxy, api, mut server) = setup(b"charged").await;
    let armed = arm(api, json!({"fault": "response_lost_after_commit"})).await;
    assert_eq!(
        armed,
        json!({"id": 1, "fault": "response_lost_after_commit", "arming": "next_connections",
            "uses_left": 1, "fired": 0})
    );
    let mut client = send(&proxy, b"pay 10").await;
    assert_eq!(within(server.requests.recv()).await.unwrap(), b"pay 10");
    assert_reset(&mut client).await;
    let faults = until_fired(api, 1).await;
    assert_eq!(faults[0]["uses_left"], 0);
    // Spent: the next connection is untouched.
    assert_eq!(roundtrip(&proxy, b"pay 10").await, b"charged");
}

#[tokio::test]
async fn request_lost_over_http() {
    let (_proxies, proxy, api, mut server) = setup(b"charged").await;
    arm(api, json!({"fault": "request_lost", "connections": 1})).await;
    let mut client = send(&proxy, b"pay 10").await;
    assert!(within(read_all(&mut client)).await.unwrap().is_empty());
    until_fired(api, 1).await;
    assert_eq!(roundtrip(&proxy, b"pay 20").await, b"charged");
    // The first request never reached the server.
    assert_eq!(within(server.requests.recv()).await.unwrap(), b"pay 20");
}

#[tokio::test]
async fn reset_over_http() {
    let (_proxies, proxy, api, mut server) = setup(b"charged").await;
    arm(api, json!({"fault": "reset"})).await;
    let mut client = send(&proxy, b"pay 10").await;
    assert_reset(&mut client).await;
    assert_eq!(within(server.requests.recv()).await.unwrap(), b"pay 10");
    until_fired(api, 1).await;
}

#[tokio::test]
async fn connection_refused_over_http() {
    let (_proxies, proxy, api, server) = setup(b"charged").await;
    arm(api, json!({"fault": "connection_refused"})).await;
    let mut client = send(&proxy, b"pay 10").await;
    assert_reset(&mut client).await;
    until_fired(api, 1).await;
    assert_eq!(server.connection_count(), 0, "the server never saw it");
}

#[tokio::test]
async fn slow_response_over_http() {
    let (_proxies, proxy, api, _server) = setup(b"charged").await;
    let armed = arm(api, json!({"fault": "slow_response", "delay_ms": 300})).await;
    assert_eq!(
        (&armed["fault"], &armed["delay_ms"]),
        (&json!("slow_response"), &json!(300))
    );
    let started = Instant::now();
    assert_eq!(roundtrip(&proxy, b"GET").await, b"charged");
    assert!(started.elapsed() >= Duration::from_millis(300));
    until_fired(api, 1).await;
}

#[tokio::test]
async fn armed_for_exactly_n_connections() {
    let (_proxies, proxy, api, _server) = setup(b"charged").await;
    arm(
        api,
        json!({"fault": "connection_refused", "connections": 2}),
    )
    .await;
    for fired in 1..=2 {
        assert_reset(&mut send(&proxy, b"pay").await).await;
        let faults = until_fired(api, fired).await;
        assert_eq!(faults[0]["uses_left"], 2 - fired);
    }
    assert_eq!(roundtrip(&proxy, b"pay").await, b"charged");
    assert_eq!(listed(api).await[0]["fired"], 2);
}

#[tokio::test]
async fn listed_with_rust_armed_faults_then_disarmed() {
    let (proxies, proxy, api, _server) = setup(b"charged").await;
    arm(api, json!({"fault": "request_lost", "connections": 3})).await;
    let (_armed, _trigger) = proxy.arm_on_trigger(Fault::Reset, 1);
    assert_eq!(
        listed(api).await,
        json!([
            {"id": 1, "fault": "request_lost", "arming": "next_connections", "uses_left": 3,
             "fired": 0},
            {"id": 2, "fault": "reset", "arming": "on_trigger", "uses_left": 1, "fired": 0},
        ])
    );

    assert_eq!(http(api, "DELETE", FAULTS, None).await, (204, Value::Null));
    assert_eq!(listed(api).await, json!([]));
    assert_eq!(roundtrip(&proxy, b"pay").await, b"charged");

    // `POST /reset` disarms them too.
    arm(api, json!({"fault": "request_lost"})).await;
    assert_eq!(http(api, "POST", "/reset", None).await.0, 204);
    assert_eq!(listed(api).await, json!([]));
    assert_eq!(
        roundtrip(&proxies.get("test").unwrap(), b"pay").await,
        b"charged"
    );
}

#[tokio::test]
async fn bad_requests_are_4xx_json_errors() {
    let (_proxies, _proxy, api, _server) = setup(b"charged").await;
    let cases = [
        (
            json!({"fault": "explode"}).to_string(),
            "bad request body: unknown fault \"explode\"",
        ),
        (json!({}).to_string(), "missing required field: fault"),
        (
            json!({"fault": null}).to_string(),
            "missing required field: fault",
        ),
        (
            json!({"fault": "slow_response"}).to_string(),
            "missing required field: delay_ms",
        ),
        (
            json!({"fault": "reset", "delay_ms": 5}).to_string(),
            "bad request body: delay_ms applies to slow_response only",
        ),
        (
            json!({"fault": "reset", "connections": 0}).to_string(),
            "bad request body: connections must be at least 1",
        ),
        (
            json!({"fault": "reset", "connections": -1}).to_string(),
            "bad request body",
        ),
        (
            json!({"fault": "reset", "conections": 2}).to_string(),
            "bad request body",
        ),
        ("not json".to_owned(), "bad request body"),
        (String::new(), "bad request body"),
    ];
    for (body, message) in cases {
        assert_error(http(api, "POST", FAULTS, Some(&body)).await, 400, message);
    }
    assert_eq!(listed(api).await, json!([]), "nothing was armed");

    let unknown = "/lab/proxies/nope/faults";
    let reset = json!({"fault": "reset"}).to_string();
    assert_error(
        http(api, "POST", unknown, Some(&reset)).await,
        404,
        "proxy not found",
    );
    assert_error(
        http(api, "GET", unknown, None).await,
        404,
        "proxy not found",
    );
    assert_error(
        http(api, "DELETE", unknown, None).await,
        404,
        "proxy not found",
    );
    assert_error(
        http(api, "PUT", FAULTS, None).await,
        405,
        "method not allowed",
    );
}

#[tokio::test]
async fn client_methods_drive_the_extension() {
    let (_proxies, proxy, api, _server) = setup(b"charged").await;
    let client = ToxiproxyClient::new(&format!("http://{api}"));

    let slow = Fault::SlowResponse(Duration::from_millis(200));
    let armed = client.arm_fault("test", &slow, 2).await.unwrap();
    assert_eq!(
        armed,
        FaultInfo {
            id: 1,
            fault: slow,
            arming: Arming::NextConnections,
            uses_left: 2,
            fired: 0,
        }
    );
    let started = Instant::now();
    assert_eq!(roundtrip(&proxy, b"GET").await, b"charged");
    assert!(started.elapsed() >= Duration::from_millis(200));
    let faults = client.faults("test").await.unwrap();
    assert_eq!(
        (faults.len(), faults[0].uses_left, faults[0].fired),
        (1, 1, 1)
    );

    client.disarm_faults("test").await.unwrap();
    assert!(client.faults("test").await.unwrap().is_empty());

    match client.arm_fault("nope", &Fault::Reset, 1).await {
        Err(ClientError::Status {
            status: 404,
            message,
            ..
        }) => {
            assert_eq!(message, "proxy not found");
        }
        other => panic!("expected a 404, got {other:?}"),
    }
}
