//! The Toxiproxy HTTP API contract: shapes, status codes and error bodies.

use crate::common;

use std::io::ErrorKind;
use std::net::SocketAddr;

use common::*;
use faultproxy::FaultProxy;
use serde_json::json;
use tokio::net::TcpStream;

async fn api_with_echo() -> (FaultProxy, SocketAddr, String) {
    let proxies = FaultProxy::new();
    let api = serve_api(&proxies).await;
    (proxies, api, echo_server().await.to_string())
}

#[tokio::test]
async fn version_is_toxiproxys() {
    let (_proxies, api, _) = api_with_echo().await;
    assert_eq!(
        http(api, "GET", "/version", None).await,
        (200, json!({"version": "2.12.0"}))
    );
}

#[tokio::test]
async fn proxy_lifecycle_and_status_codes() {
    let (proxies, api, echo) = api_with_echo().await;
    let create = json!({"name": "echo", "listen": "127.0.0.1:0", "upstream": echo}).to_string();

    let (status, created) = http(api, "POST", "/proxies", Some(&create)).await;
    assert_eq!(status, 201);
    let listen = created["listen"].as_str().unwrap().to_owned();
    assert!(
        !listen.ends_with(":0"),
        "the real port is reported: {listen}"
    );
    assert_eq!(
        created,
        json!({"name": "echo", "listen": listen, "upstream": echo, "enabled": true, "toxics": []})
    );
    assert_error(
        http(api, "POST", "/proxies", Some(&create)).await,
        409,
        "proxy already exists",
    );
    assert_error(
        http(api, "POST", "/proxies", Some("{nope")).await,
        400,
        "bad request body",
    );
    assert_error(
        http(api, "POST", "/proxies", Some("")).await,
        400,
        "bad request body",
    );
    let no_upstream = r#"{"name": "x"}"#;
    assert_error(
        http(api, "POST", "/proxies", Some(no_upstream)).await,
        400,
        "missing required field",
    );
    let bad_upstream = r#"{"name": "x", "upstream": "not an address"}"#;
    assert_error(
        http(api, "POST", "/proxies", Some(bad_upstream)).await,
        400,
        "invalid address",
    );

    let (status, all) = http(api, "GET", "/proxies", None).await;
    assert_eq!((status, &all["echo"]), (200, &created));
    assert_eq!(
        http(api, "GET", "/proxies/echo", None).await,
        (200, created.clone())
    );
    assert_error(
        http(api, "GET", "/proxies/nope", None).await,
        404,
        "proxy not found",
    );

    // Partial update: `enabled` alone, as the toxiproxy_rust client sends it.
    let (status, disabled) = http(api, "POST", "/proxies/echo", Some(r#"{"enabled":false}"#)).await;
    assert_eq!((status, &disabled["enabled"]), (200, &json!(false)));
    let refused = TcpStream::connect(&listen).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::ConnectionRefused);
    let (status, enabled) = http(api, "POST", "/proxies/echo", Some(r#"{"enabled":true}"#)).await;
    assert_eq!(
        (status, &enabled["enabled"], &enabled["listen"]),
        (200, &json!(true), &json!(listen))
    );
    assert_eq!(roundtrip(&proxies.get("echo").unwrap(), b"hi").await, b"hi");

    // Moving the listen address and the upstream.
    let other_echo = echo_server().await.to_string();
    let moved = json!({"listen": "localhost:0", "upstream": other_echo}).to_string();
    let (status, moved) = http(api, "PATCH", "/proxies/echo", Some(&moved)).await;
    assert_eq!((status, &moved["upstream"]), (200, &json!(other_echo)));
    assert_ne!(moved["listen"], json!(listen));

    // Moving while disabled: enabling later listens on the new address.
    let free_port = move_while_disabled_then_enable(api, "echo").await;
    assert_eq!(
        roundtrip(&proxies.get("echo").unwrap(), b"moved").await,
        b"moved"
    );
    assert_error(
        http(api, "POST", "/proxies/echo", Some("[1,")).await,
        400,
        "bad request body",
    );
    assert_error(
        http(api, "POST", "/proxies/nope", Some("{}")).await,
        404,
        "proxy not found",
    );

    assert_eq!(
        http(api, "DELETE", "/proxies/echo", None).await,
        (204, json!(null))
    );
    assert_error(
        http(api, "DELETE", "/proxies/echo", None).await,
        404,
        "proxy not found",
    );
    let refused = TcpStream::connect(free_port).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::ConnectionRefused);

    assert_error(
        http(api, "GET", "/no/such/route", None).await,
        404,
        "not found",
    );
    assert_error(
        http(api, "PUT", "/proxies", None).await,
        405,
        "method not allowed",
    );
}

/// Moves the disabled proxy `name` to a port of our choosing, then enables it there;
/// returns that address.
///
/// A disabled proxy does not listen, so the port cannot be held for it: it is only
/// borrowed (bound by us, its number read, let go), and anybody may take it before the
/// proxy binds it on enabling. Then enabling answers 500 (address in use, as Toxiproxy
/// answers), and we try another port.
async fn move_while_disabled_then_enable(api: SocketAddr, name: &str) -> SocketAddr {
    let path = format!("/proxies/{name}");
    for _ in 0..20 {
        let (status, _) = http(api, "POST", &path, Some(r#"{"enabled": false}"#)).await;
        assert_eq!(status, 200);
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let move_disabled = json!({"listen": port.to_string()}).to_string();
        let (status, moved) = http(api, "POST", &path, Some(&move_disabled)).await;
        assert_eq!((status, &moved["enabled"]), (200, &json!(false)));
        match http(api, "POST", &path, Some(r#"{"enabled": true}"#)).await {
            (200, enabled) => {
                assert_eq!(enabled["listen"], json!(port.to_string()));
                return port;
            }
            (500, taken) => eprintln!("{port} was taken meanwhile ({taken}); another one"),
            other => panic!("enabling on {port}: {other:?}"),
        }
    }
    panic!("every port we picked was taken before the proxy could bind it");
}

#[tokio::test]
async fn toxic_crud_and_errors() {
    let (proxies, api, echo) = api_with_echo().await;
    proxies.create("db", "127.0.0.1:0", &echo).await.unwrap();
    let toxics = "/proxies/db/toxics";

    let latency = r#"{"type": "latency", "attributes": {"latency": 100}}"#;
    let expected = json!({"name": "latency_downstream", "type": "latency", "stream": "downstream",
        "toxicity": 1.0, "attributes": {"latency": 100, "jitter": 0}});
    assert_eq!(
        http(api, "POST", toxics, Some(latency)).await,
        (200, expected.clone())
    );
    assert_error(
        http(api, "POST", toxics, Some(latency)).await,
        409,
        "toxic already exists",
    );
    let cases = [
        (r#"{"type": "explode"}"#, "invalid toxic type"),
        (r#"{"attributes": {}}"#, "invalid toxic type"),
        (
            r#"{"type": "latency", "stream": "sideways"}"#,
            "stream was invalid",
        ),
        (
            r#"{"type": "latency", "attributes": {"latency": "slow"}}"#,
            "bad request body",
        ),
        (
            r#"{"type": "timeout", "attributes": {"timeout": -1}}"#,
            "bad request body",
        ),
        (r#"{"type": "latency", "toxicity": 2}"#, "bad request body"),
        (r#"{"type": 7}"#, "bad request body"),
        ("not json", "bad request body"),
    ];
    for (body, message) in cases {
        assert_error(http(api, "POST", toxics, Some(body)).await, 400, message);
    }
    let reset_peer =
        r#"{"name": "rst", "type": "reset_peer", "stream": "upstream", "toxicity": 0.5}"#;
    assert_eq!(http(api, "POST", toxics, Some(reset_peer)).await.0, 200);

    // Toxiproxy's order: upstream toxics first, then downstream ones.
    let (status, list) = http(api, "GET", toxics, None).await;
    assert_eq!((status, list.as_array().unwrap().len()), (200, 2));
    assert_eq!((&list[0]["name"], &list[1]), (&json!("rst"), &expected));
    assert_eq!(
        http(api, "GET", "/proxies/db/toxics/latency_downstream", None).await,
        (200, expected)
    );
    assert_eq!(
        http(api, "GET", "/proxies/db", None).await.1["toxics"],
        list
    );

    let update = r#"{"attributes": {"jitter": 5}, "toxicity": 0.25}"#;
    let (status, updated) = http(
        api,
        "POST",
        "/proxies/db/toxics/latency_downstream",
        Some(update),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(updated["attributes"], json!({"latency": 100, "jitter": 5}));
    assert_eq!(updated["toxicity"], json!(0.25));
    let bad_update = r#"{"attributes": {"jitter": "x"}}"#;
    let path = "/proxies/db/toxics/latency_downstream";
    assert_error(
        http(api, "POST", path, Some(bad_update)).await,
        400,
        "bad request body",
    );

    assert_error(
        http(api, "GET", "/proxies/db/toxics/nope", None).await,
        404,
        "toxic not found",
    );
    assert_error(
        http(api, "POST", "/proxies/db/toxics/nope", Some("{}")).await,
        404,
        "toxic not found",
    );
    assert_error(
        http(api, "GET", "/proxies/nope/toxics", None).await,
        404,
        "proxy not found",
    );
    assert_error(
        http(api, "POST", "/proxies/nope/toxics", Some(latency)).await,
        404,
        "proxy not found",
    );

    assert_eq!(http(api, "DELETE", path, None).await, (204, json!(null)));
    assert_error(
        http(api, "DELETE", path, None).await,
        404,
        "toxic not found",
    );
}

#[tokio::test]
async fn reset_works_without_body_or_content_length() {
    let (proxies, api, echo) = api_with_echo().await;
    proxies.create("db", "127.0.0.1:0", &echo).await.unwrap();
    let latency = r#"{"type": "latency", "attributes": {"latency": 100}}"#;

    for request_body in [None, Some("{}")] {
        http(api, "POST", "/proxies/db/toxics", Some(latency)).await;
        http(api, "POST", "/proxies/db", Some(r#"{"enabled": false}"#)).await;
        let response = match request_body {
            // Neither a body nor a Content-Length header (noxious answers 404 here).
            None => {
                raw_http(
                    api,
                    "POST /reset HTTP/1.1\r\nHost: toxiproxy\r\nConnection: close\r\n\r\n",
                )
                .await
            }
            Some(body) => http(api, "POST", "/reset", Some(body)).await,
        };
        assert_eq!(response, (204, json!(null)));
        let (_, db) = http(api, "GET", "/proxies/db", None).await;
        assert_eq!((&db["enabled"], &db["toxics"]), (&json!(true), &json!([])));
    }
}

#[tokio::test]
async fn populate_creates_keeps_and_replaces() {
    let (proxies, api, echo) = api_with_echo().await;
    let two = json!([
        {"name": "a", "listen": "127.0.0.1:0", "upstream": echo},
        {"name": "b", "upstream": echo, "enabled": false, "toxics": []},
    ])
    .to_string();
    let (status, body) = http(api, "POST", "/populate", Some(&two)).await;
    assert_eq!(status, 201);
    let populated = body["proxies"].as_array().unwrap();
    assert_eq!(
        (populated.len(), &populated[1]["enabled"]),
        (2, &json!(false))
    );
    let a_listen = populated[0]["listen"].clone();

    // Unchanged: kept as is, toxics included.
    http(
        api,
        "POST",
        "/proxies/a/toxics",
        Some(r#"{"type": "timeout"}"#),
    )
    .await;
    // Unchanged means the address it listens on (port 0 would ask for a new port).
    let same = json!([{"name": "a", "listen": a_listen, "upstream": echo}]).to_string();
    let (status, body) = http(api, "POST", "/populate", Some(&same)).await;
    assert_eq!((status, &body["proxies"][0]["listen"]), (201, &a_listen));
    assert_eq!(body["proxies"][0]["toxics"].as_array().unwrap().len(), 1);

    // A new upstream: replaced, toxics gone.
    let other_echo = echo_server().await.to_string();
    let changed = json!([{"name": "a", "listen": a_listen, "upstream": other_echo}]).to_string();
    let (status, body) = http(api, "POST", "/populate", Some(&changed)).await;
    assert_eq!(status, 201);
    assert_eq!(body["proxies"][0]["upstream"], json!(other_echo));
    assert_eq!(body["proxies"][0]["toxics"], json!([]));
    assert_eq!(
        roundtrip(&proxies.get("a").unwrap(), b"still works").await,
        b"still works"
    );

    let missing_name = json!([{"upstream": echo}]).to_string();
    let duplicate =
        json!([{"name": "c", "upstream": echo}, {"name": "c", "upstream": echo}]).to_string();
    assert_error(
        http(api, "POST", "/populate", Some(&missing_name)).await,
        400,
        "missing required field",
    );
    assert_error(
        http(api, "POST", "/populate", Some(&duplicate)).await,
        400,
        "bad request body",
    );
    assert_error(
        http(api, "POST", "/populate", Some("{}")).await,
        400,
        "bad request body",
    );
    assert_error(
        http(api, "POST", "/populate", Some("[")).await,
        400,
        "bad request body",
    );
    assert!(
        proxies.get("c").is_none(),
        "nothing is applied from a rejected request"
    );
}

/// Found by lab-scenarios' hostile-input property test: serde filled a toxic update from the
/// array `[{}]` and answered 200; Toxiproxy's decoder refuses an array where an object belongs.
#[tokio::test]
async fn an_array_where_an_object_belongs_is_400() {
    let (_proxies, api, echo) = api_with_echo().await;
    let create = json!({"name": "echo", "listen": "127.0.0.1:0", "upstream": echo}).to_string();
    assert_eq!(http(api, "POST", "/proxies", Some(&create)).await.0, 201);
    let toxic = r#"{"name": "t1", "type": "latency", "attributes": {"latency": 1}}"#;
    assert_eq!(
        http(api, "POST", "/proxies/echo/toxics", Some(toxic))
            .await
            .0,
        200
    );
    for (method, path) in [
        ("POST", "/proxies"),
        ("POST", "/proxies/echo"),
        ("POST", "/proxies/echo/toxics"),
        ("POST", "/proxies/echo/toxics/t1"),
    ] {
        for body in ["[]", "[{}]", r#"["x", "127.0.0.1:0", "127.0.0.1:9"]"#] {
            assert_error(
                http(api, method, path, Some(body)).await,
                400,
                "bad request body",
            );
        }
    }
}
