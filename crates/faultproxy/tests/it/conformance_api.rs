//! Toxiproxy's own API tests (`api_test.go`), ported: one test per Go test, named after it
//! (`TestCreateProxyBlankName` → `create_proxy_blank_name`), driving the embedded API over
//! HTTP and checking the proxies over TCP, as a Toxiproxy client would.
//!
//! The request bodies are the ones Toxiproxy's Go client sends (its `Proxy` and `Toxic`
//! structs marshalled: `"toxics": null`, `"attributes": null`, no `stream` when empty), and
//! errors are compared word for word, as the Go tests compare `err.Error()`. Where the Go
//! tests use fixed ports (3310, 7070, ...), these use free ones. `CONFORMANCE.md` lists every
//! Go test and where it went.

use crate::common;

use std::net::SocketAddr;

use common::*;
use faultproxy::{FaultProxy, TOXIPROXY_VERSION};
use serde_json::{Value, json};

/// A fresh registry and its API (Toxiproxy's `WithServer`, without the shared server).
async fn with_server() -> (FaultProxy, SocketAddr) {
    let proxies = FaultProxy::new();
    let api = serve_api(&proxies).await;
    (proxies, api)
}

/// `localhost:PORT` on a free port: how the Go tests name listen addresses.
fn localhost() -> (String, u16) {
    let port = free_port();
    (format!("localhost:{port}"), port)
}

/// The Go client's `CreateProxy(name, listen, upstream)`: its `Proxy` struct marshalled.
async fn create_proxy(api: SocketAddr, name: &str, listen: &str, upstream: &str) -> (u16, Value) {
    let body = json!({"name": name, "listen": listen, "upstream": upstream, "enabled": true,
        "toxics": null});
    http(api, "POST", "/proxies", Some(&body.to_string())).await
}

/// The Go client's `AddToxic(name, type, stream, toxicity, attributes)`: an empty stream is
/// left out (`omitempty`), nil attributes are `null`.
async fn add_toxic_to(
    api: SocketAddr,
    proxy: &str,
    name: &str,
    type_name: &str,
    stream: &str,
    toxicity: f32,
    attributes: Value,
) -> (u16, Value) {
    let mut body = json!({"name": name, "type": type_name, "toxicity": toxicity,
        "attributes": attributes});
    if !stream.is_empty() {
        body["stream"] = json!(stream);
    }
    let path = format!("/proxies/{proxy}/toxics");
    http(api, "POST", &path, Some(&body.to_string())).await
}

async fn toxics(api: SocketAddr, proxy: &str) -> Value {
    let (status, toxics) = http(api, "GET", &format!("/proxies/{proxy}/toxics"), None).await;
    assert_eq!(status, 200, "{toxics}");
    toxics
}

/// Asserts an error answer word for word: the Go client turns it into `HTTP {status}: {error}`.
#[track_caller]
fn assert_exact_error(response: (u16, Value), status: u16, error: &str) {
    assert_eq!(
        response,
        (status, json!({"error": error, "status": status}))
    );
}

/// A GET with the given User-Agent; returns the status and the head of the answer.
async fn get_as(api: SocketAddr, path: &str, user_agent: &str) -> (u16, String) {
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: toxiproxy\r\nUser-Agent: {user_agent}\r\nConnection: close\r\n\r\n"
    );
    let (status, head, _) = raw_http_text(api, &request).await;
    (status, head)
}

#[tokio::test]
async fn request_id() {
    let (_proxies, api) = with_server().await;
    let (status, head) = get_as(api, "/version", "curl").await;
    assert_eq!(status, 200);
    let id = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("x-toxiproxy-request-id")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no X-Toxiproxy-Request-Id in {head}"));
    // Shaped like Toxiproxy's (an xid), and new for every request.
    assert_eq!(id.len(), 20, "{id}");
    assert!(
        id.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'v').contains(&b))
    );
    let (_, again) = get_as(api, "/version", "curl").await;
    assert!(
        !again.contains(&id),
        "a second request got the same id {id}"
    );
}

#[tokio::test]
async fn browser_gets_403() {
    let (proxies, api) = with_server().await;
    let opera = "Mozilla/5.0 (Linux; Android 4.4.2); Nexus 5 Build/KOT49H) AppleWebKit/537.36\
        (KHTML, like Gecko) Chrome/33.0.1750.117 Mobile Safari/537.36 OPR/20.0.1396.72047";
    assert_eq!(get_as(api, "/proxies", opera).await.0, 403);
    // A browser cannot change anything either (the point: a web page posting to the API).
    let body = r#"{"name": "x", "upstream": "127.0.0.1:1"}"#;
    let create = format!(
        "POST /proxies HTTP/1.1\r\nHost: toxiproxy\r\nUser-Agent: {opera}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let (status, head, body) = raw_http_text(api, &create).await;
    assert_eq!(status, 403, "{head}\n{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"error": "User agent not allowed", "status": 403})
    );
    assert!(proxies.proxies().is_empty());
}

#[tokio::test]
async fn non_browser_gets_200() {
    let (_proxies, api) = with_server().await;
    assert_eq!(get_as(api, "/proxies", "Wget/2.1").await.0, 200);
}

#[tokio::test]
async fn index_with_no_proxies() {
    let (_proxies, api) = with_server().await;
    assert_eq!(http(api, "GET", "/proxies", None).await, (200, json!({})));
}

#[tokio::test]
async fn create_proxy_blank_name() {
    let (_proxies, api) = with_server().await;
    assert_exact_error(
        create_proxy(api, "", "", "").await,
        400,
        "missing required field: name",
    );
}

#[tokio::test]
async fn create_proxy_blank_upstream() {
    let (_proxies, api) = with_server().await;
    assert_exact_error(
        create_proxy(api, "test", "", "").await,
        400,
        "missing required field: upstream",
    );
}

/// The Go client's `Populate`: its `Proxy` structs marshalled, `"toxics": null` included.
async fn populate(api: SocketAddr, proxies: Value) -> (u16, Value) {
    http(api, "POST", "/populate", Some(&proxies.to_string())).await
}

#[tokio::test]
async fn populate_proxy() {
    let (_proxies, api) = with_server().await;
    let ((one, _), (two, _)) = (localhost(), localhost());
    let (status, body) = populate(
        api,
        json!([
            {"name": "one", "listen": one, "upstream": "localhost:7171", "enabled": true,
             "toxics": null},
            {"name": "two", "listen": two, "upstream": "localhost:7474", "enabled": true,
             "toxics": null},
        ]),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let populated = body["proxies"].as_array().unwrap();
    assert_eq!(populated.len(), 2);
    assert_eq!(
        (&populated[0]["name"], &populated[1]["name"]),
        (&json!("one"), &json!("two"))
    );
    for proxy in populated {
        assert_proxy_up(proxy["listen"].as_str().unwrap(), true).await;
    }
}

#[tokio::test]
async fn populate_default_enabled() {
    let (_proxies, api) = with_server().await;
    let (listen, _) = localhost();
    let request = json!([{"name": "test", "listen": listen, "upstream": "localhost:7171"}]);
    assert_eq!(populate(api, request).await.0, 201);
    let (_, proxies) = http(api, "GET", "/proxies", None).await;
    let proxies = proxies.as_object().unwrap();
    assert_eq!(proxies.keys().collect::<Vec<_>>(), ["test"]);
    assert_proxy_up(proxies["test"]["listen"].as_str().unwrap(), true).await;
}

#[tokio::test]
async fn populate_disabled_proxy() {
    let (_proxies, api) = with_server().await;
    let ((one, _), (two, _)) = (localhost(), localhost());
    let (status, body) = populate(
        api,
        json!([
            {"name": "one", "listen": one, "upstream": "localhost:7171", "enabled": false,
             "toxics": null},
            {"name": "two", "listen": two, "upstream": "localhost:7474", "enabled": true,
             "toxics": null},
        ]),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let populated = body["proxies"].as_array().unwrap();
    assert_eq!(
        (&populated[0]["name"], &populated[1]["name"]),
        (&json!("one"), &json!("two"))
    );
    assert_proxy_up(&one, false).await;
    assert_proxy_up(&two, true).await;
}

#[tokio::test]
async fn populate_existing_proxy() {
    let (_proxies, api) = with_server().await;
    let ((one, one_port), (two, _), (_, three_port)) = (localhost(), localhost(), localhost());
    assert_eq!(
        create_proxy(api, "one", &one, "localhost:7171").await.0,
        201
    );
    assert_eq!(
        create_proxy(api, "two", &two, "localhost:7474").await.0,
        201
    );
    // A toxic, to see that `one` is kept rather than replaced.
    assert_eq!(
        add_toxic_to(api, "one", "", "latency", "downstream", 1.0, Value::Null)
            .await
            .0,
        200
    );

    let one_again = format!("127.0.0.1:{one_port}");
    let two_moved = format!("127.0.0.1:{three_port}");
    let (status, body) = populate(
        api,
        json!([
            {"name": "one", "listen": one_again, "upstream": "localhost:7171", "enabled": true,
             "toxics": null},
            {"name": "two", "listen": two_moved, "upstream": "localhost:7676", "enabled": true,
             "toxics": null},
        ]),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let populated = body["proxies"].as_array().unwrap();
    assert_eq!(
        (&populated[0]["name"], &populated[1]["name"]),
        (&json!("one"), &json!("two"))
    );
    assert_eq!(
        (&populated[0]["listen"], &populated[1]["listen"]),
        (&json!(one_again), &json!(two_moved))
    );
    let one_toxics = toxics(api, "one").await;
    assert_eq!(one_toxics.as_array().unwrap().len(), 1, "{one_toxics}");
    assert_eq!(one_toxics[0]["type"], "latency");
    for proxy in populated {
        assert_proxy_up(proxy["listen"].as_str().unwrap(), true).await;
    }
}

#[tokio::test]
async fn populate_with_bad_name() {
    let (proxies, api) = with_server().await;
    let (one, _) = localhost();
    let response = populate(
        api,
        json!([
            {"name": "one", "listen": one, "upstream": "localhost:7171", "enabled": true,
             "toxics": null},
            {"name": "", "listen": "", "upstream": "", "enabled": true, "toxics": null},
        ]),
    )
    .await;
    assert_exact_error(response, 400, "missing required field: name at proxy 2");
    assert!(proxies.proxies().is_empty(), "nothing is created");
    assert_eq!(http(api, "GET", "/proxies", None).await.1, json!({}));
}

#[tokio::test]
async fn populate_proxy_with_bad_data_should_return_error() {
    let (_proxies, api) = with_server().await;
    let ((one, _), (three, _)) = (localhost(), localhost());
    let (status, body) = populate(
        api,
        json!([
            {"name": "one", "listen": one, "upstream": "localhost:7171", "enabled": true,
             "toxics": null},
            {"name": "two", "listen": "local373", "upstream": "localhost:7474", "enabled": true,
             "toxics": null},
            {"name": "three", "listen": three, "upstream": "localhost:7676", "enabled": true,
             "toxics": null},
        ]),
    )
    .await;
    // Toxiproxy answers 500 (Go's net.Listen fails on it); we answer 400, an address that
    // cannot be parsed being the request's fault (CONFORMANCE.md). Either way: an error, and
    // what came before it was applied, what came after was not.
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("local373"),
        "{body}"
    );
    let (_, proxies) = http(api, "GET", "/proxies", None).await;
    let names: Vec<&String> = proxies.as_object().unwrap().keys().collect();
    assert_eq!(names, ["one"]);
    assert_proxy_up(&one, true).await;
}

#[tokio::test]
async fn populate_add_toxic() {
    let (_proxies, api) = with_server().await;
    let (one, _) = localhost();
    let (status, body) = populate(
        api,
        json!([{"name": "one", "listen": one, "upstream": "localhost:7171", "enabled": true,
                "toxics": null}]),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["proxies"].as_array().unwrap().len(), 1);
    assert_eq!(body["proxies"][0]["name"], "one");
    let (status, toxic) =
        add_toxic_to(api, "one", "", "latency", "downstream", 1.0, Value::Null).await;
    assert_eq!(status, 200, "{toxic}");
}

#[tokio::test]
async fn listing_proxies() {
    let (_proxies, api) = with_server().await;
    let (listen, port) = localhost();
    assert_eq!(
        create_proxy(api, "mysql_master", &listen, "localhost:20001")
            .await
            .0,
        201
    );
    let (status, proxies) = http(api, "GET", "/proxies", None).await;
    assert_eq!(status, 200);
    let proxy = &proxies["mysql_master"];
    assert_eq!(
        (&proxy["name"], &proxy["listen"], &proxy["upstream"]),
        (
            &json!("mysql_master"),
            &json!(format!("127.0.0.1:{port}")),
            &json!("localhost:20001")
        )
    );
    assert!(find_toxic(&proxy["toxics"], "latency").is_none());
}

#[tokio::test]
async fn create_and_get_proxy() {
    let (_proxies, api) = with_server().await;
    let (listen, port) = localhost();
    assert_eq!(
        create_proxy(api, "mysql_master", &listen, "localhost:20001")
            .await
            .0,
        201
    );
    let (status, proxy) = http(api, "GET", "/proxies/mysql_master", None).await;
    assert_eq!(status, 200);
    assert_eq!(
        (
            &proxy["name"],
            &proxy["listen"],
            &proxy["upstream"],
            &proxy["enabled"]
        ),
        (
            &json!("mysql_master"),
            &json!(format!("127.0.0.1:{port}")),
            &json!("localhost:20001"),
            &json!(true)
        )
    );
    assert!(find_toxic(&proxy["toxics"], "latency").is_none());
}

/// The Go client's `proxy.Save()`: the whole `Proxy` struct, to `POST /proxies` when new and
/// to `POST /proxies/{name}` (as text/plain!) once created.
async fn save(api: SocketAddr, created: bool, name: &str, listen: &str, enabled: bool) -> Value {
    let body = json!({"name": name, "listen": listen, "upstream": "localhost:20001",
        "enabled": enabled, "toxics": null})
    .to_string();
    let (status, saved) = if created {
        let request = format!(
            "POST /proxies/{name} HTTP/1.1\r\nHost: toxiproxy\r\nContent-Type: text/plain\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        raw_http(api, &request).await
    } else {
        http(api, "POST", "/proxies", Some(&body)).await
    };
    assert_eq!(status, if created { 200 } else { 201 }, "{saved}");
    saved
}

#[tokio::test]
async fn create_proxy_with_save() {
    let (_proxies, api) = with_server().await;
    let (listen, port) = localhost();
    save(api, false, "mysql_master", &listen, true).await;
    let (_, proxy) = http(api, "GET", "/proxies/mysql_master", None).await;
    assert_eq!(
        (&proxy["listen"], &proxy["upstream"], &proxy["enabled"]),
        (
            &json!(format!("127.0.0.1:{port}")),
            &json!("localhost:20001"),
            &json!(true)
        )
    );
    assert_proxy_up(proxy["listen"].as_str().unwrap(), true).await;
}

#[tokio::test]
async fn create_disabled_proxy() {
    let (_proxies, api) = with_server().await;
    let (listen, _) = localhost();
    save(api, false, "mysql_master", &listen, false).await;
    let (_, proxy) = http(api, "GET", "/proxies/mysql_master", None).await;
    // Not started yet: the listen address as given, not resolved.
    assert_eq!(
        (&proxy["listen"], &proxy["upstream"], &proxy["enabled"]),
        (&json!(listen), &json!("localhost:20001"), &json!(false))
    );
    assert_proxy_up(&listen, false).await;
}

#[tokio::test]
async fn create_disabled_proxy_and_enable() {
    let (_proxies, api) = with_server().await;
    let (listen, port) = localhost();
    save(api, false, "mysql_master", &listen, false).await;
    let (_, proxy) = http(api, "GET", "/proxies/mysql_master", None).await;
    assert_eq!(
        (&proxy["listen"], &proxy["enabled"]),
        (&json!(listen), &json!(false))
    );

    let enabled = save(api, true, "mysql_master", &listen, true).await;
    assert_eq!(enabled["listen"], json!(format!("127.0.0.1:{port}")));
    assert_proxy_up(&listen, true).await;

    // The Go client saves what the last answer said: the resolved address now.
    save(
        api,
        true,
        "mysql_master",
        enabled["listen"].as_str().unwrap(),
        false,
    )
    .await;
    assert_proxy_up(&listen, false).await;
}

#[tokio::test]
async fn delete_proxy() {
    let (_proxies, api) = with_server().await;
    let (listen, _) = localhost();
    let (_, created) = create_proxy(api, "mysql_master", &listen, "localhost:20001").await;
    assert_ne!(http(api, "GET", "/proxies", None).await.1, json!({}));
    assert_proxy_up(&listen, true).await;

    assert_eq!(
        http(api, "DELETE", "/proxies/mysql_master", None).await,
        (204, Value::Null)
    );
    assert_proxy_up(created["listen"].as_str().unwrap(), false).await;
    assert_eq!(http(api, "GET", "/proxies", None).await.1, json!({}));
    assert_exact_error(
        http(api, "DELETE", "/proxies/mysql_master", None).await,
        404,
        "proxy not found",
    );
}

#[tokio::test]
async fn create_proxy_port_conflict() {
    let (_proxies, api) = with_server().await;
    let (listen, port) = localhost();
    assert_eq!(
        create_proxy(api, "mysql_master", &listen, "localhost:20001")
            .await
            .0,
        201
    );
    assert_exact_error(
        create_proxy(api, "test", &listen, "localhost:20001").await,
        500,
        &format!("listen tcp 127.0.0.1:{port}: bind: address already in use"),
    );
    assert_eq!(
        http(api, "DELETE", "/proxies/mysql_master", None).await.0,
        204
    );
    assert_eq!(
        create_proxy(api, "test", &listen, "localhost:20001")
            .await
            .0,
        201
    );
}

#[tokio::test]
async fn create_proxy_name_conflict() {
    let (_proxies, api) = with_server().await;
    let ((first, _), (second, _)) = (localhost(), localhost());
    assert_eq!(
        create_proxy(api, "mysql_master", &first, "localhost:20001")
            .await
            .0,
        201
    );
    assert_exact_error(
        create_proxy(api, "mysql_master", &second, "localhost:20001").await,
        409,
        "proxy already exists",
    );
    assert_eq!(
        http(api, "DELETE", "/proxies/mysql_master", None).await.0,
        204
    );
    assert_eq!(
        create_proxy(api, "mysql_master", &second, "localhost:20001")
            .await
            .0,
        201
    );
}

#[tokio::test]
async fn reset_state() {
    let (_proxies, api) = with_server().await;
    let (listen, _) = localhost();
    create_proxy(api, "mysql_master", &listen, "localhost:20001").await;
    let attributes = json!({"latency": 100, "jitter": 10});
    let (status, latency) = add_toxic_to(
        api,
        "mysql_master",
        "",
        "latency",
        "downstream",
        1.0,
        attributes.clone(),
    )
    .await;
    assert_eq!((status, &latency["attributes"]), (200, &attributes));

    // The Go client's ResetState: an empty text/plain body.
    let request = "POST /reset HTTP/1.1\r\nHost: toxiproxy\r\nContent-Type: text/plain\r\n\
                   Content-Length: 0\r\nConnection: close\r\n\r\n";
    assert_eq!(raw_http(api, request).await, (204, Value::Null));

    let (_, proxies) = http(api, "GET", "/proxies", None).await;
    let proxy = &proxies["mysql_master"];
    assert_eq!(proxy["enabled"], true);
    assert!(find_toxic(&toxics(api, "mysql_master").await, "latency").is_none());
    assert_proxy_up(proxy["listen"].as_str().unwrap(), true).await;
}

#[tokio::test]
async fn listing_toxics() {
    let (_proxies, api) = with_server().await;
    let (listen, _) = localhost();
    create_proxy(api, "mysql_master", &listen, "localhost:20001").await;
    assert_eq!(toxics(api, "mysql_master").await, json!([]));
}

#[tokio::test]
async fn add_toxic() {
    let (_proxies, api) = with_server().await;
    let (listen, _) = localhost();
    create_proxy(api, "mysql_master", &listen, "localhost:20001").await;
    let attributes = json!({"latency": 100, "jitter": 10});
    let (status, latency) = add_toxic_call(
        api,
        "foobar",
        "latency",
        "downstream",
        1.0,
        attributes.clone(),
    )
    .await;
    assert_eq!((status, &latency["attributes"]), (200, &attributes));

    let toxics = toxics(api, "mysql_master").await;
    let toxic = find_toxic(&toxics, "foobar").expect("foobar is listed");
    assert_eq!(
        toxic,
        &json!({"name": "foobar", "type": "latency", "stream": "downstream", "toxicity": 1.0,
            "attributes": attributes})
    );
}

/// `add_toxic` on the proxy every test of this kind names `mysql_master`.
async fn add_toxic_call(
    api: SocketAddr,
    name: &str,
    type_name: &str,
    stream: &str,
    toxicity: f32,
    attributes: Value,
) -> (u16, Value) {
    add_toxic_to(
        api,
        "mysql_master",
        name,
        type_name,
        stream,
        toxicity,
        attributes,
    )
    .await
}

#[tokio::test]
async fn add_multiple_toxics() {
    let (_proxies, api) = with_server().await;
    let (listen, _) = localhost();
    create_proxy(api, "mysql_master", &listen, "localhost:20001").await;
    // Nil attributes: the Go client sends `"attributes": null`.
    for name in ["latency1", "latency2"] {
        let (status, body) =
            add_toxic_call(api, name, "latency", "downstream", 1.0, Value::Null).await;
        assert_eq!(status, 200, "{body}");
    }
    let toxics = toxics(api, "mysql_master").await;
    for name in ["latency1", "latency2"] {
        let toxic = find_toxic(&toxics, name).unwrap();
        assert_eq!(
            (&toxic["type"], &toxic["stream"]),
            (&json!("latency"), &json!("downstream"))
        );
        assert_eq!(toxic["toxicity"], 1.0);
        assert_eq!(toxic["attributes"], json!({"latency": 0, "jitter": 0}));
    }
    assert!(
        toxics
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["stream"] != "upstream")
    );
}

#[tokio::test]
async fn add_conflicting_toxic() {
    let (_proxies, api) = with_server().await;
    let (listen, _) = localhost();
    create_proxy(api, "mysql_master", &listen, "localhost:20001").await;
    assert_eq!(
        add_toxic_call(api, "foobar", "latency", "downstream", 1.0, Value::Null)
            .await
            .0,
        200
    );
    assert_exact_error(
        add_toxic_call(api, "foobar", "slow_close", "downstream", 1.0, Value::Null).await,
        409,
        "toxic already exists",
    );
    let toxics = toxics(api, "mysql_master").await;
    let toxic = find_toxic(&toxics, "foobar").unwrap();
    assert_eq!(
        (&toxic["type"], &toxic["stream"]),
        (&json!("latency"), &json!("downstream"))
    );
    assert_eq!(toxic["attributes"], json!({"latency": 0, "jitter": 0}));
    assert_eq!(toxics.as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn add_conflicting_toxics_multistream() {
    let (_proxies, api) = with_server().await;
    let (listen, _) = localhost();
    create_proxy(api, "mysql_master", &listen, "localhost:20001").await;
    assert_eq!(
        add_toxic_call(api, "foobar", "latency", "upstream", 1.0, Value::Null)
            .await
            .0,
        200
    );
    assert_exact_error(
        add_toxic_call(api, "foobar", "latency", "downstream", 1.0, Value::Null).await,
        409,
        "toxic already exists",
    );
    let toxics = toxics(api, "mysql_master").await;
    let toxic = find_toxic(&toxics, "foobar").unwrap();
    assert_eq!(
        (&toxic["type"], &toxic["stream"]),
        (&json!("latency"), &json!("upstream"))
    );
    assert_eq!(toxics.as_array().unwrap().len(), 1, "no downstream foobar");
}

#[tokio::test]
async fn add_conflicting_toxics_multistream_defaults() {
    let (_proxies, api) = with_server().await;
    let (listen, _) = localhost();
    create_proxy(api, "mysql_master", &listen, "localhost:20001").await;
    for stream in ["upstream", "downstream"] {
        assert_eq!(
            add_toxic_call(api, "", "latency", stream, 1.0, Value::Null)
                .await
                .0,
            200
        );
    }
    let toxics = toxics(api, "mysql_master").await;
    for stream in ["upstream", "downstream"] {
        let toxic = find_toxic(&toxics, &format!("latency_{stream}")).unwrap();
        assert_eq!(
            (&toxic["type"], &toxic["stream"]),
            (&json!("latency"), &json!(stream))
        );
        assert_eq!(toxic["toxicity"], 1.0);
        assert_eq!(toxic["attributes"], json!({"latency": 0, "jitter": 0}));
    }
}

#[tokio::test]
async fn add_toxic_with_toxicity() {
    let (_proxies, api) = with_server().await;
    let (listen, _) = localhost();
    create_proxy(api, "mysql_master", &listen, "localhost:20001").await;
    let attributes = json!({"latency": 100, "jitter": 10});
    let (status, latency) =
        add_toxic_call(api, "", "latency", "downstream", 0.2, attributes.clone()).await;
    assert_eq!(status, 200);
    assert_eq!(
        (&latency["toxicity"], &latency["attributes"]),
        (&json!(0.2), &attributes)
    );
    let toxics = toxics(api, "mysql_master").await;
    let toxic = find_toxic(&toxics, "latency_downstream").unwrap();
    assert_eq!(
        (&toxic["toxicity"], &toxic["attributes"]),
        (&json!(0.2), &attributes)
    );
}

#[tokio::test]
async fn add_noop() {
    let (_proxies, api) = with_server().await;
    let (listen, _) = localhost();
    create_proxy(api, "mysql_master", &listen, "localhost:20001").await;
    // No stream (left out by the Go client), nil attributes.
    let (status, noop) = add_toxic_call(api, "foobar", "noop", "", 1.0, Value::Null).await;
    assert_eq!(
        (status, noop),
        (
            200,
            json!({"name": "foobar", "type": "noop", "stream": "downstream", "toxicity": 1.0,
                "attributes": {}})
        )
    );
    let toxics = toxics(api, "mysql_master").await;
    let toxic = find_toxic(&toxics, "foobar").unwrap();
    assert_eq!(
        (&toxic["type"], &toxic["stream"]),
        (&json!("noop"), &json!("downstream"))
    );
}

/// The Go client's `UpdateToxic(name, toxicity, attributes)`: toxicity -1 means "keep it",
/// and is then left out of the body.
async fn update_toxic(api: SocketAddr, name: &str, toxicity: f32, attributes: Value) -> Value {
    let mut body = json!({"attributes": attributes});
    if toxicity != -1.0 {
        body["toxicity"] = json!(toxicity);
    }
    let path = format!("/proxies/mysql_master/toxics/{name}");
    let (status, updated) = http(api, "POST", &path, Some(&body.to_string())).await;
    assert_eq!(status, 200, "{updated}");
    updated
}

#[tokio::test]
async fn update_toxics() {
    let (_proxies, api) = with_server().await;
    let (listen, _) = localhost();
    create_proxy(api, "mysql_master", &listen, "localhost:20001").await;
    // AddToxic with toxicity -1 sends 1 ("to be consistent with the default").
    let (_, latency) = add_toxic_call(
        api,
        "",
        "latency",
        "downstream",
        1.0,
        json!({"latency": 100, "jitter": 10}),
    )
    .await;
    assert_eq!(latency["toxicity"], 1.0);

    let updated = update_toxic(api, "latency_downstream", 0.5, json!({"latency": 1000})).await;
    assert_eq!(
        (&updated["toxicity"], &updated["attributes"]),
        (&json!(0.5), &json!({"latency": 1000, "jitter": 10}))
    );
    let updated = update_toxic(api, "latency_downstream", -1.0, json!({"latency": 500})).await;
    let expected = json!({"latency": 500, "jitter": 10});
    assert_eq!(
        (&updated["toxicity"], &updated["attributes"]),
        (&json!(0.5), &expected)
    );

    let toxics = toxics(api, "mysql_master").await;
    let toxic = find_toxic(&toxics, "latency_downstream").unwrap();
    assert_eq!(
        (&toxic["toxicity"], &toxic["attributes"]),
        (&json!(0.5), &expected)
    );
}

#[tokio::test]
async fn remove_toxic() {
    let (_proxies, api) = with_server().await;
    let (listen, _) = localhost();
    create_proxy(api, "mysql_master", &listen, "localhost:20001").await;
    add_toxic_call(api, "", "latency", "downstream", 1.0, Value::Null).await;
    let listed = toxics(api, "mysql_master").await;
    let toxic = find_toxic(&listed, "latency_downstream").unwrap();
    assert_eq!(toxic["attributes"], json!({"latency": 0, "jitter": 0}));

    let path = "/proxies/mysql_master/toxics/latency_downstream";
    assert_eq!(http(api, "DELETE", path, None).await, (204, Value::Null));
    assert!(find_toxic(&toxics(api, "mysql_master").await, "latency_downstream").is_none());
}

#[tokio::test]
async fn version_endpoint_returns_version() {
    let (_proxies, api) = with_server().await;
    let request = "GET /version HTTP/1.1\r\nHost: toxiproxy\r\nConnection: close\r\n\r\n";
    let (status, head, body) = raw_http_text(api, request).await;
    // Byte for byte what Toxiproxy writes (clients that print it, print the same).
    assert_eq!(
        (status, body),
        (200, format!("{{\"version\": \"{TOXIPROXY_VERSION}\"}}\n"))
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json;charset=utf-8"),
        "{head}"
    );
}

#[tokio::test]
async fn invalid_stream() {
    let (_proxies, api) = with_server().await;
    let (listen, _) = localhost();
    create_proxy(api, "mysql_master", &listen, "localhost:20001").await;
    assert_exact_error(
        add_toxic_call(api, "", "latency", "walrustream", 1.0, Value::Null).await,
        400,
        "stream was invalid, can be either upstream or downstream",
    );
}

/// `toxic_collection_test.go`'s `TestUpdateToxicJsonDoesNotShareStateWithLiveToxic`, as far as
/// it can be seen from outside: a rejected update changes nothing, an accepted one changes
/// only what it names.
#[tokio::test]
async fn update_toxic_json_does_not_share_state_with_live_toxic() {
    let (_proxies, api) = with_server().await;
    let (listen, _) = localhost();
    create_proxy(api, "mysql_master", &listen, "localhost:20001").await;
    let attributes = json!({"latency": 100, "jitter": 10});
    add_toxic_call(api, "", "latency", "downstream", 1.0, attributes.clone()).await;

    let path = "/proxies/mysql_master/toxics/latency_downstream";
    let rejected = json!({"attributes": {"latency": 1000, "jitter": "lots"}}).to_string();
    let (status, _) = http(api, "POST", path, Some(&rejected)).await;
    assert_eq!(status, 400);
    let (_, unchanged) = http(api, "GET", path, None).await;
    assert_eq!(unchanged["attributes"], attributes);

    let accepted = update_toxic(api, "latency_downstream", 1.0, json!({"latency": 5})).await;
    assert_eq!(accepted["attributes"], json!({"latency": 5, "jitter": 10}));
}
