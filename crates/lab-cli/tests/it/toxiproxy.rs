//! `--toxiproxy-url`: the lab creates its proxies and toxics on a Toxiproxy server through the
//! HTTP API. No real Toxiproxy can be installed here, so the server is the lab's own proxy,
//! served by this test on a loopback port and watched: every API call it gets is recorded.

use crate::common;

use std::sync::Arc;

use axum::extract::Request;
use axum::middleware::{self, Next};
use common::{assert_code, interrupt, lab, stderr};
use faultproxy::FaultProxy;
use parking_lot::Mutex;

#[tokio::test(flavor = "multi_thread")]
async fn timeout_runs_on_a_given_toxiproxy_and_cleans_up_its_proxies() {
    let proxies = FaultProxy::new();
    let calls = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = calls.clone();
    let app = proxies
        .router()
        .layer(middleware::from_fn(move |req: Request, next: Next| {
            let seen = seen.clone();
            async move {
                seen.lock()
                    .push(format!("{} {}", req.method(), req.uri().path()));
                next.run(req).await
            }
        }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let given = url.clone();
    let out = tokio::task::spawn_blocking(move || {
        lab(&["run", "timeout", "--toxiproxy-url", &given])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_code(&out, 0);

    let calls = calls.lock().clone();
    let created = |prefix: &str| calls.iter().any(|c| c.starts_with(prefix));
    assert!(created("POST /proxies"), "no proxy was created: {calls:?}");
    assert!(
        calls
            .iter()
            .any(|c| c.starts_with("POST /proxies/lab_") && c.ends_with("_reports/toxics")),
        "no toxic on the run's proxy: {calls:?}"
    );
    assert!(
        created("DELETE /proxies/lab_"),
        "the proxy was not deleted: {calls:?}"
    );
    assert!(proxies.proxies().is_empty(), "proxies left on the server");
}

#[test]
fn an_unreachable_toxiproxy_is_an_environment_error() {
    let out = lab(&["run", "timeout", "--toxiproxy-url", "http://127.0.0.1:1"])
        .output()
        .unwrap();
    assert_code(&out, 3);
    assert!(stderr(&out).contains("Toxiproxy API"), "{}", stderr(&out));
}

/// Ctrl-C in the middle of a run: the proxy the run made on the given Toxiproxy is deleted
/// anyway (the run itself can no longer do it).
#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_leaves_no_proxy_on_a_given_toxiproxy() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let proxies = FaultProxy::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = proxies.clone();
    tokio::spawn(async move { server.serve_api(listener).await });

    let watched = proxies.clone();
    let status = tokio::task::spawn_blocking(move || {
        let mut child = lab(&["run", "timeout", "--step", "--toxiproxy-url", &url])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let _stdin = child.stdin.take().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        while !line.starts_with(" 1. ") {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "lab ended early");
        }
        assert_eq!(watched.proxies().len(), 1, "the run's proxy exists mid-run");
        interrupt(&child);
        child.wait().unwrap()
    })
    .await
    .unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(
        proxies.proxies().is_empty(),
        "a proxy was left on the Toxiproxy"
    );
}
