//! `lab proxy`: toxiproxy-cli's commands and the lab's one-shot faults, against a real
//! `lab serve` (its proxies in front of the real report service, on PostgreSQL), and the
//! errors a class meets: no `lab serve` running, a wrong name, a malformed `-a`, a real
//! Toxiproxy (which has no one-shot faults).

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::IntoResponse;
use common::{
    assert_code, assert_nothing_left, free_port_base, interrupt, lab, shared_tempdir, stderr,
    stdout,
};
use serde_json::{Value, json};

/// A running `lab serve`, stopped with Ctrl-C when dropped, so that a failed assertion does not
/// leave it (and its throwaway PostgreSQL and Redis) running.
struct Serve {
    child: Option<Child>,
    base: u16,
    tmp: tempfile::TempDir,
}

impl Serve {
    /// Starts `lab serve` and waits for its banner (up to "Try:"); on a port taken in the
    /// meantime (exit 3 before the banner), tries another base.
    fn start() -> Serve {
        let tmp = shared_tempdir();
        for _ in 0..5 {
            let base = free_port_base();
            let mut child = lab(&["serve", "--port-base", &base.to_string(), "--lang", "en"])
                .env("TMPDIR", tmp.path())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
            let mut ready = false;
            for line in lines.by_ref() {
                if line.unwrap().starts_with("Try:") {
                    ready = true;
                    break;
                }
            }
            if ready {
                // Keep draining so the services' narration never blocks on a full pipe.
                std::thread::spawn(move || for _ in lines {});
                return Serve {
                    child: Some(child),
                    base,
                    tmp,
                };
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

    fn api(&self) -> String {
        format!("http://127.0.0.1:{}", self.base + 4)
    }

    /// The report service through its proxy, `reports`.
    fn via_proxy(&self) -> String {
        format!("http://127.0.0.1:{}", self.base + 10)
    }

    /// The report service itself, past the proxy.
    fn direct(&self) -> String {
        format!("http://127.0.0.1:{}", self.base + 20)
    }

    /// Ctrl-C, and the exit code once it has stopped (`None` if it had to be killed).
    fn interrupt_and_wait(child: &mut Child) -> Option<i32> {
        interrupt(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some(status) = child.try_wait().unwrap() {
                return status.code();
            }
            // Polling for a process to end, within a deadline: nothing is ordered by this.
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// Stops it as a class would (Ctrl-C) and checks that it ended cleanly.
    fn stop(mut self) {
        let mut child = self.child.take().unwrap();
        assert_eq!(Serve::interrupt_and_wait(&mut child), Some(0));
        assert_nothing_left(self.tmp.path());
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            Serve::interrupt_and_wait(&mut child);
        }
    }
}

/// Runs `lab proxy ARGS --toxiproxy-url API`.
async fn proxy(api: &str, args: &[&str]) -> Output {
    let mut all = vec!["proxy"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--toxiproxy-url", api]);
    tokio::process::Command::from(lab(&all))
        .output()
        .await
        .unwrap()
}

/// `lab proxy ARGS --format json`, which must succeed: the API's JSON.
async fn proxy_json(api: &str, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend_from_slice(&["--format", "json"]);
    let out = proxy(api, &all).await;
    assert_code(&out, 0);
    serde_json::from_str(&stdout(&out)).expect("one JSON value")
}

/// A client that opens a new connection for every request: faults strike connections.
fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn drives_lab_serves_proxies_like_toxiproxy_cli() {
    let serve = tokio::task::spawn_blocking(Serve::start).await.unwrap();
    let api = serve.api();
    let http = http();

    // list: every bundled service's proxy, and the one in front of Redis.
    let out = proxy(&api, &["list"]).await;
    assert_code(&out, 0);
    let table = stdout(&out);
    let reports_row = table
        .lines()
        .find(|l| l.starts_with("reports "))
        .unwrap_or_else(|| panic!("no reports row:\n{table}"));
    assert!(
        reports_row.contains(&format!("127.0.0.1:{}", serve.base + 10))
            && reports_row.contains(&format!("127.0.0.1:{}", serve.base + 20))
            && reports_row.contains("enabled")
            && reports_row.ends_with("None"),
        "{reports_row}"
    );
    let listed = proxy_json(&api, &["list"]).await;
    let mut expected: Vec<&str> = lab_services::ALL.iter().map(|s| s.name).collect();
    expected.push("redis");
    for name in expected {
        assert_eq!(listed[name]["name"], name, "{listed}");
    }

    // The line: every answer of the report service held 900 ms on its way back.
    let out = proxy(
        &api,
        &[
            "toxic",
            "add",
            "reports",
            "-t",
            "latency",
            "-a",
            "latency=900",
            "-d",
        ],
    )
    .await;
    assert_code(&out, 0);
    assert_eq!(
        stdout(&out).trim(),
        "Added downstream latency toxic 'latency_downstream' on proxy 'reports'"
    );
    let started = Instant::now();
    let health = http
        .get(format!("{}/health", serve.via_proxy()))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    let out = proxy(&api, &["inspect", "reports"]).await;
    assert_code(&out, 0);
    let inspected = stdout(&out);
    assert!(
        inspected.contains("Downstream toxics:")
            && inspected.contains(
                "latency_downstream: type=latency stream=downstream toxicity=1.00 \
                 attributes=[jitter=0 latency=900]"
            )
            && inspected.contains("Proxy has no Upstream toxics enabled."),
        "{inspected}"
    );

    // update changes one attribute and keeps the rest; remove takes the toxic away.
    let out = proxy(
        &api,
        &[
            "toxic",
            "update",
            "reports",
            "-n",
            "latency_downstream",
            "-a",
            "jitter=5",
        ],
    )
    .await;
    assert_code(&out, 0);
    assert_eq!(
        stdout(&out).trim(),
        "Updated toxic 'latency_downstream' on proxy 'reports'"
    );
    let shown = proxy_json(&api, &["inspect", "reports"]).await;
    assert_eq!(
        shown["toxics"][0]["attributes"],
        json!({"latency": 900, "jitter": 5}),
        "{shown}"
    );
    let out = proxy(
        &api,
        &["toxic", "remove", "reports", "-n", "latency_downstream"],
    )
    .await;
    assert_code(&out, 0);
    assert_eq!(
        stdout(&out).trim(),
        "Removed toxic 'latency_downstream' on proxy 'reports'"
    );
    let shown = proxy_json(&api, &["inspect", "reports"]).await;
    assert_eq!(shown["toxics"], json!([]), "{shown}");

    // toggle: the proxy refuses connections, then accepts them again.
    let out = proxy(&api, &["toggle", "reports"]).await;
    assert_code(&out, 0);
    assert_eq!(stdout(&out).trim(), "Proxy reports is now disabled");
    let refused = http
        .get(format!("{}/health", serve.via_proxy()))
        .send()
        .await;
    assert!(
        refused.is_err_and(|e| e.is_connect()),
        "a disabled proxy refuses"
    );
    let out = proxy(&api, &["toggle", "reports"]).await;
    assert_code(&out, 0);
    assert_eq!(stdout(&out).trim(), "Proxy reports is now enabled");
    let back = http
        .get(format!("{}/health", serve.via_proxy()))
        .send()
        .await
        .unwrap();
    assert_eq!(back.status(), 200);

    // A one-shot fault: the next POST creates its report, and its answer is lost.
    let out = proxy(
        &api,
        &["fault", "reports", "--kind", "response_lost_after_commit"],
    )
    .await;
    assert_code(&out, 0);
    assert!(
        stdout(&out).starts_with(
            "Armed response_lost_after_commit on proxy 'reports' (fault 1) for the next \
             connection"
        ),
        "{}",
        stdout(&out)
    );
    let post = || {
        http.post(format!("{}/reports", serve.via_proxy()))
            .header("Idempotency-Key", "proxy-cli-77")
            .json(&json!({"task_id": 77, "report_type": "monthly"}))
            .send()
    };
    assert!(post().await.is_err(), "the answer should be lost");
    // The proxy drops the answer only once the service has started sending it, after its
    // commit: the report is there, as the service's own port shows.
    let reports: Value = http
        .get(format!("{}/reports", serve.direct()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let created: Vec<&Value> = reports["reports"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["task_id"] == 77)
        .collect();
    assert_eq!(created.len(), 1, "{reports}");
    // The fault is spent: the retry gets through, and the key makes it a replay.
    let retry = post().await.unwrap();
    assert_eq!(retry.status(), 200);
    let retry: Value = retry.json().await.unwrap();
    assert_eq!(retry["replayed"], true, "{retry}");
    assert_eq!(retry["report_id"], created[0]["id"], "{retry}");

    let faults = proxy_json(&api, &["fault", "reports", "--list"]).await;
    assert_eq!(
        faults,
        json!([{"id": 1, "fault": "response_lost_after_commit", "arming": "next_connections",
                "uses_left": 0, "fired": 1}])
    );
    let armed = proxy_json(
        &api,
        &[
            "fault",
            "reports",
            "--kind",
            "slow_response",
            "--delay-ms",
            "50",
        ],
    )
    .await;
    assert_eq!(armed["delay_ms"], 50, "{armed}");
    let out = proxy(&api, &["fault", "reports", "--clear"]).await;
    assert_code(&out, 0);
    assert_eq!(
        proxy_json(&api, &["fault", "reports", "--list"]).await,
        json!([])
    );

    // Wrong names are the command's fault (exit 2), with a way to find the right one.
    let out = proxy(&api, &["inspect", "report"]).await;
    assert_code(&out, 2);
    assert!(
        stderr(&out).contains("no proxy `report`") && stderr(&out).contains("lab proxy list"),
        "{}",
        stderr(&out)
    );
    let out = proxy(
        &api,
        &["toxic", "remove", "reports", "-n", "latency_downstream"],
    )
    .await;
    assert_code(&out, 2);
    assert!(
        stderr(&out).contains("proxy `reports` has no toxic `latency_downstream`"),
        "{}",
        stderr(&out)
    );
    let out = proxy(&api, &["fault", "report", "--kind", "reset"]).await;
    assert_code(&out, 2);
    assert!(
        stderr(&out).contains("no proxy `report`"),
        "{}",
        stderr(&out)
    );
    // A misspelt attribute is refused before anything is sent.
    let out = proxy(
        &api,
        &[
            "toxic",
            "add",
            "reports",
            "-t",
            "latency",
            "-a",
            "latecny=900",
        ],
    )
    .await;
    assert_code(&out, 2);
    assert!(
        stderr(&out).contains("no attribute `latecny` (its attributes: jitter, latency)"),
        "{}",
        stderr(&out)
    );
    let shown = proxy_json(&api, &["inspect", "reports"]).await;
    assert_eq!(shown["toxics"], json!([]), "{shown}");

    tokio::task::spawn_blocking(move || serve.stop())
        .await
        .unwrap();
}

/// A stand-in for a real Toxiproxy: the lab's API without its `/lab/` extension, which answers
/// 404 there as Toxiproxy's router does.
async fn real_toxiproxy() -> String {
    let proxies = faultproxy::FaultProxy::new();
    let app = proxies.router().layer(middleware::from_fn(
        |request: Request, next: Next| async move {
            if request.uri().path().starts_with("/lab/") {
                return (StatusCode::NOT_FOUND, "404 page not found\n").into_response();
            }
            next.run(request).await
        },
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

#[tokio::test(flavor = "multi_thread")]
async fn works_on_any_toxiproxy_but_faults_need_the_lab() {
    let api = real_toxiproxy().await;

    let out = proxy(&api, &["list"]).await;
    assert_code(&out, 0);
    assert!(stdout(&out).starts_with("no proxies"), "{}", stdout(&out));

    let upstream = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = upstream.local_addr().unwrap().to_string();
    let created = proxy_json(
        &api,
        &["create", "db", "-l", "127.0.0.1:0", "-u", &upstream],
    )
    .await;
    assert_eq!(created["upstream"], upstream.as_str(), "{created}");
    let out = proxy(
        &api,
        &["create", "db", "-l", "127.0.0.1:0", "-u", &upstream],
    )
    .await;
    assert_code(&out, 2);
    assert!(stderr(&out).contains("already exists"), "{}", stderr(&out));

    // toxiproxy-cli's long flags and aliases: --type, --toxicName, --attribute, --upstream,
    // --tox.
    let added = proxy_json(
        &api,
        &[
            "toxic",
            "add",
            "--type",
            "bandwidth",
            "--toxicName",
            "slow_link",
            "--attribute",
            "rate=64",
            "--upstream",
            "--tox",
            "0.5",
            "db",
        ],
    )
    .await;
    assert_eq!(
        added,
        json!({"name": "slow_link", "type": "bandwidth", "stream": "upstream", "toxicity": 0.5,
               "attributes": {"rate": 64}})
    );

    // inspect shows the toxics, and no fault section where the API has no faults.
    let out = proxy(&api, &["inspect", "db"]).await;
    assert_code(&out, 0);
    assert!(
        stdout(&out).contains("slow_link: type=bandwidth stream=upstream toxicity=0.50")
            && !stdout(&out).contains("One-shot faults"),
        "{}",
        stdout(&out)
    );

    let out = proxy(&api, &["fault", "db", "--kind", "reset"]).await;
    assert_code(&out, 3);
    assert!(
        stderr(&out).contains("lab extension") && stderr(&out).contains(&api),
        "{}",
        stderr(&out)
    );

    let out = proxy(&api, &["delete", "db"]).await;
    assert_code(&out, 0);
    assert_eq!(stdout(&out).trim(), "Deleted proxy db");
    assert_eq!(proxy_json(&api, &["list"]).await, json!({}));
}

#[tokio::test(flavor = "multi_thread")]
async fn without_lab_serve_it_says_to_start_it() {
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let out = proxy(&format!("http://127.0.0.1:{port}"), &["list"]).await;
    assert_code(&out, 3);
    assert!(
        stderr(&out).contains("is `lab serve` running?"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn malformed_flags_are_usage_errors() {
    let run = |args: &[&str]| lab(args).output().unwrap();
    let out = run(&[
        "proxy", "toxic", "add", "reports", "-t", "latency", "-a", "latency",
    ]);
    assert_code(&out, 2);
    assert!(
        stderr(&out).contains("expected KEY=VALUE"),
        "{}",
        stderr(&out)
    );
    let out = run(&["proxy", "toxic", "add", "reports", "-t", "latncy"]);
    assert_code(&out, 2);
    let out = run(&[
        "proxy", "toxic", "add", "reports", "-t", "latency", "-u", "-d",
    ]);
    assert_code(&out, 2);
    let out = run(&["proxy", "fault", "reports", "--kind", "slow_response"]);
    assert_code(&out, 2);
    assert!(stderr(&out).contains("--delay-ms"), "{}", stderr(&out));
    let out = run(&[
        "proxy",
        "fault",
        "reports",
        "--kind",
        "reset",
        "--delay-ms",
        "5",
    ]);
    assert_code(&out, 2);
    let out = run(&["proxy", "fault", "reports"]);
    assert_code(&out, 2);
    let out = run(&["proxy", "list", "--toxiproxy-url", "ftp://127.0.0.1:8474"]);
    assert_code(&out, 2);
}

#[test]
fn help_shows_examples_and_exit_codes() {
    let out = lab(&["proxy", "--help"]).output().unwrap();
    assert_code(&out, 0);
    let help = stdout(&out);
    for needle in [
        "lab proxy toxic add reports -t latency -a latency=900 -d",
        "lab proxy fault reports --kind response_lost_after_commit",
        "Exit codes:",
    ] {
        assert!(help.contains(needle), "{needle} missing from:\n{help}");
    }
    let out = lab(&["proxy", "fault", "--help"]).output().unwrap();
    assert_code(&out, 0);
    for kind in faultproxy::Fault::NAMES {
        assert!(stdout(&out).contains(kind), "{kind}:\n{}", stdout(&out));
    }
}
