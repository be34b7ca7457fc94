//! `lab serve`: fixed ports, the Toxiproxy API, the report service through its proxy, a clean
//! stop on Ctrl-C, and a clear error when a port is taken.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{
    assert_code, assert_nothing_left, free_port_base, interrupt, lab, shared_tempdir, stderr,
};
use serde_json::{Value, json};

/// Starts `lab serve` and reads its banner (up to "Try:"); on a port taken in the meantime (exit
/// 3 before the banner), tries another base. Returns the child, its base and the banner.
fn start_serve(tmp: &std::path::Path) -> (std::process::Child, u16, String) {
    for _ in 0..5 {
        let base = free_port_base();
        let mut child = lab(&["serve", "--port-base", &base.to_string(), "--lang", "en"])
            .env("TMPDIR", tmp)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut banner = String::new();
        for line in lines.by_ref() {
            let line = line.unwrap();
            banner.push_str(&line);
            banner.push('\n');
            if line.starts_with("Try:") {
                break;
            }
        }
        if banner.contains("Try:") {
            // Keep draining so the service's narration never blocks on a full pipe.
            std::thread::spawn(move || for _ in lines {});
            return (child, base, banner);
        }
        let out = child.wait_with_output().unwrap();
        assert!(
            stderr(&out).contains("cannot listen"),
            "lab serve ended before its banner: {}",
            stderr(&out)
        );
    }
    panic!("no port base stayed free long enough");
}

#[tokio::test(flavor = "multi_thread")]
async fn serves_the_report_service_behind_a_proxy_until_ctrl_c() {
    let tmp = shared_tempdir();
    let tmp_path = tmp.path().to_path_buf();
    let (mut child, base, banner) = tokio::task::spawn_blocking(move || start_serve(&tmp_path))
        .await
        .unwrap();
    let api = format!("http://127.0.0.1:{}", base + 4);
    let via_proxy = format!("http://127.0.0.1:{}", base + 10);
    assert!(
        banner.contains(&via_proxy) && banner.contains(&api),
        "{banner}"
    );

    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let version: Value = http
        .get(format!("{api}/version"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(version["version"].is_string(), "{version}");

    // The Idempotency-Key contract, through the proxied port.
    let post = || {
        http.post(format!("{via_proxy}/reports"))
            .header("Idempotency-Key", "report-task-42")
            .json(&json!({"task_id": 42, "report_type": "monthly"}))
            .send()
    };
    let first = post().await.unwrap();
    assert_eq!(first.status(), 201);
    let first: Value = first.json().await.unwrap();
    let again = post().await.unwrap();
    assert_eq!(again.status(), 200);
    let again: Value = again.json().await.unwrap();
    assert_eq!(first["report_id"], again["report_id"]);
    assert_eq!(again["replayed"], true);

    // A latency toxic added with the API slows the proxied port.
    let toxic = http
        .post(format!("{api}/proxies/reports/toxics"))
        .json(&json!({"type": "latency", "stream": "downstream", "attributes": {"latency": 300}}))
        .send()
        .await
        .unwrap();
    assert!(toxic.status().is_success());
    let started = Instant::now();
    http.get(format!("{via_proxy}/health"))
        .send()
        .await
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );

    // Disabled: refused. Reset: back.
    http.post(format!("{api}/proxies/reports"))
        .json(&json!({"enabled": false}))
        .send()
        .await
        .unwrap();
    let refused = http.get(format!("{via_proxy}/health")).send().await;
    assert!(
        refused.is_err_and(|e| e.is_connect()),
        "a disabled proxy refuses"
    );
    http.post(format!("{api}/reset")).send().await.unwrap();
    let healed = http
        .get(format!("{via_proxy}/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(healed.status(), 200);

    interrupt(&child);
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0));
    assert_nothing_left(tmp.path());
}

#[test]
fn a_taken_port_is_a_clear_environment_error() {
    let base = free_port_base();
    let _taken = std::net::TcpListener::bind(("127.0.0.1", base + 4)).unwrap();
    let out = lab(&["serve", "--port-base", &base.to_string()])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_code(&out, 3);
    let err = stderr(&out);
    assert!(
        err.contains(&format!("127.0.0.1:{}", base + 4)) && err.contains("--port-base"),
        "{err}"
    );
}
