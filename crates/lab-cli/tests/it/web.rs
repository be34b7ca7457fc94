//! `lab run NAME --web`: the page and its stream, driven as a browser would.
//!
//! The first test drives a whole run over HTTP (the stream and the controls, no browser), and
//! checks that malformed requests get a 4xx with a JSON body. It runs with every `cargo test`.
//!
//! The others drive the page in Debian's headless Chromium through chromedriver: step `timeout`
//! and `concurrent` to the end with the page's own controls (Space, the Next button, the
//! prediction buttons), check what the diagram shows, that the predictions are graded, and that
//! the fact table is the run's JSON summary; they save the screenshots the README and the
//! instructor's guide show (docs/img/). They need the browser, so they are `#[ignore]`d: a plain
//! `cargo test` lists them as ignored, and `.ci/run` installs chromium and chromium-driver and
//! runs them with `--ignored`.

use crate::common;
use crate::webdriver;

use std::io::BufRead;
use std::process::{Child, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use common::{assert_nothing_left, interrupt, lab, repo, shared_tempdir, stdout};
use webdriver::{Driver, Session, WAIT};

/// A `lab run --web` in the background, on throwaway servers in a temporary directory.
struct WebLab {
    child: Child,
    /// The driver's URL (with the token) and the watchers'.
    drive_url: String,
    base: String,
    token: String,
    tmp: tempfile::TempDir,
    /// lab's stderr after the URL, line by line: shown when its exit code is not the one expected.
    stderr: std::sync::mpsc::Receiver<String>,
}

impl WebLab {
    fn start(args: &[&str]) -> WebLab {
        let tmp = shared_tempdir();
        let mut all = vec!["run", "--web", "--no-open", "--color", "never"];
        all.extend_from_slice(args);
        let mut child = lab(&all)
            .env("TMPDIR", tmp.path())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("lab starts");
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            // Read to the end even after the URL: lab must never block on a full stderr pipe.
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });
        let drive_url = loop {
            let line = rx
                .recv_timeout(Duration::from_secs(60))
                .expect("lab prints the web view's URL");
            // The line is in the run's language; the driver's URL is the one with the token.
            if line.contains("/?drive=")
                && let Some(at) = line.find("http://")
            {
                break line[at..].trim().to_string();
            }
        };
        let (base, token) = drive_url
            .split_once("/?drive=")
            .expect("a URL with a token");
        WebLab {
            base: base.to_string(),
            token: token.to_string(),
            drive_url,
            child,
            tmp,
            stderr: rx,
        }
    }

    /// Ctrl-C, and lab's exit code (which must be `expected`, or lab's stderr is shown); then
    /// nothing it started may be left.
    fn stop(mut self, expected: i32) {
        interrupt(&self.child);
        let status = self.child.wait().expect("lab exits");
        assert_nothing_left(self.tmp.path());
        let code = status.code().unwrap_or(-1);
        if code != expected {
            let said: Vec<String> =
                std::iter::from_fn(|| self.stderr.recv_timeout(Duration::from_secs(5)).ok())
                    .collect();
            panic!(
                "lab exited {code} after Ctrl-C, not {expected}; its stderr:\n{}",
                said.join("\n")
            );
        }
    }
}

impl Drop for WebLab {
    fn drop(&mut self) {
        // A failed test: stop lab so it cleans up its servers.
        if self.child.try_wait().ok().flatten().is_none() {
            interrupt(&self.child);
            let _ = self.child.wait();
        }
    }
}

/// The summary line of `lab run NAME --format json`: what the page's fact table must show.
fn json_summary(name: &str) -> Value {
    let out = lab(&["run", name, "--format", "json", "--lang", "en"])
        .output()
        .expect("lab runs");
    common::assert_code(&out, 0);
    stdout(&out)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("JSON lines"))
        .find(|l| l["event"] == "summary")
        .expect("a summary line")
}

/// One browser's server-sent event stream, message by message.
struct Stream {
    response: reqwest::Response,
    buffer: String,
}

impl Stream {
    async fn open(url: &str) -> Stream {
        let response = reqwest::get(url).await.expect("the stream opens");
        assert_eq!(response.status(), 200);
        assert_eq!(
            response.headers()["content-type"],
            "text/event-stream",
            "server-sent events"
        );
        Stream {
            response,
            buffer: String::new(),
        }
    }

    async fn next(&mut self) -> Value {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let event: String = self.buffer.drain(..end + 2).collect();
                let data: Vec<&str> = event
                    .lines()
                    .filter_map(|l| l.strip_prefix("data: "))
                    .collect();
                if data.is_empty() {
                    continue; // a keep-alive comment, or the retry field alone
                }
                return serde_json::from_str(&data.join("\n")).expect("a JSON message");
            }
            let chunk = tokio::time::timeout(WAIT, self.response.chunk())
                .await
                .expect("the stream goes on")
                .expect("the stream reads")
                .expect("the stream is not over");
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    /// Skips to the next message of `kind`.
    async fn until(&mut self, kind: &str) -> Value {
        loop {
            let message = self.next().await;
            if message["kind"] == kind {
                return message;
            }
        }
    }
}

/// Posts a control command; returns the status and the JSON body (every answer has one).
async fn control(base: &str, body: &str) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(format!("{base}/api/control"))
        .body(body.to_string())
        .send()
        .await
        .expect("lab answers");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    let value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{status}: not a JSON body ({e}): {text}"));
    (status, value)
}

/// Drives a run over HTTP to its end: Next at every pause, `answer` to the first prediction,
/// and each pause's command sent twice (the second must be refused). Returns every message.
async fn drive_to_end(
    driver: &mut Stream,
    base: &str,
    token: &str,
    mut answer: Option<char>,
) -> Vec<Value> {
    let mut messages = Vec::new();
    loop {
        let message = driver.next().await;
        messages.push(message.clone());
        match message["kind"].as_str().unwrap() {
            "pause" => {
                let id = message["id"].as_u64().unwrap();
                let body = match (message["pause"].as_str(), answer) {
                    (Some("predict"), Some(letter)) => {
                        answer = None;
                        json!({"token": token, "action": "answer", "answer": letter.to_string(), "pause": id})
                    }
                    _ => json!({"token": token, "action": "next", "pause": id}),
                };
                let (status, value) = control(base, &body.to_string()).await;
                assert_eq!(status, 200, "{value}");
                let (again, _) = control(base, &body.to_string()).await;
                assert_eq!(again, 409, "pause {id} answered twice");
            }
            "end" => return messages,
            _ => {}
        }
    }
}

#[tokio::test]
async fn a_run_is_driven_over_http_and_malformed_requests_get_json_errors() {
    let web = WebLab::start(&["timeout", "--lang", "en"]);
    let base = web.base.clone();
    let token = web.token.clone();
    let http = reqwest::Client::new();

    // The page and its assets, embedded in the binary.
    for (path, kind, needle) in [
        ("/", "text/html", "/app.js"),
        ("/app.js", "text/javascript", "EventSource"),
        ("/style.css", "text/css", "--lanes"),
    ] {
        let response = http.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let content_type = response.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_string();
        assert!(content_type.starts_with(kind), "{path}: {content_type}");
        assert!(response.text().await.unwrap().contains(needle), "{path}");
    }

    // Refusals: a status and a JSON body saying why, never a 500.
    let response = http.get(format!("{base}/nope")).send().await.unwrap();
    assert_eq!(response.status(), 404);
    let body: Value = response.json().await.unwrap();
    assert!(body["error"].as_str().unwrap().contains("/nope"), "{body}");
    let response = http
        .delete(format!("{base}/api/control"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 405);
    assert!(response.json::<Value>().await.unwrap()["error"].is_string());
    let with = |action: &str| format!(r#"{{"token":"{token}",{action}}}"#);
    for (body, status) in [
        ("not json".to_string(), 400),
        (r#"{"action":"next"}"#.to_string(), 403),
        (r#"{"token":"guess","action":"next"}"#.to_string(), 403),
        (with(r#""action":"jump""#), 400),
        (with(r#""action":"answer""#), 400),
        (with(r#""action":"answer","answer":"zz""#), 400),
        (with(r#""action":"next","answer":"b""#), 400),
        (with(r#""action":"next","extra":1"#), 400),
        (with(r#""action":"next","pause":999"#), 409),
    ] {
        let (got, value) = control(&base, &body).await;
        assert_eq!(got, status, "{body}: {value}");
        assert!(value["error"].is_string(), "{body}: {value}");
    }

    // A watcher and the driver: the same messages, one of them drives.
    let mut watcher = Stream::open(&format!("{base}/api/events")).await;
    let hello = watcher.next().await;
    assert_eq!(hello["kind"], "hello");
    assert_eq!(hello["driver"], false);
    assert_eq!(hello["lang"], "en");
    assert_eq!(hello["ui"]["ru"]["web.next"], "Дальше");
    let ready = watcher.next().await;
    assert_eq!(
        (&ready["kind"], &ready["scenario"]),
        (&json!("ready"), &json!("timeout"))
    );
    let mut driver = Stream::open(&format!("{base}/api/events?drive={token}")).await;
    assert_eq!(driver.next().await["driver"], true);

    // Step to the end: Next at every pause, b to the first prediction. A second click on a
    // pause that is over is refused, so a double click never skips a step.
    let messages = drive_to_end(&mut driver, &base, &token, Some('b')).await;
    let of = |kind: &'static str| messages.iter().filter(move |m| m["kind"] == kind);
    let reveals: Vec<Value> = of("reveal")
        .map(|m| m["en"]["learner_right"].clone())
        .collect();
    let summary = of("summary").next().expect("a summary")["en"].clone();
    let requests: Vec<&Value> = of("request").collect();
    let calls = requests.len();
    for (i, request) in requests.iter().enumerate() {
        assert_eq!(request["draw"][0]["mark"], "call", "{request}");
        // The calls through the slow hop say how long the client waits; the retries after the
        // hop recovered do not.
        let waits = request["draw"][0]["timeout_ms"].as_u64();
        assert_eq!(
            waits.is_some(),
            ![2, 4, 6, 8].contains(&i),
            "call {i}: {request}"
        );
    }
    assert_eq!(of("end").next().unwrap()["passed"], true);
    // What the scenario broke and where it held a request are in the stream, to be drawn.
    let faults: Vec<(Value, Value)> = of("fault")
        .map(|m| (m["en"]["fault"].clone(), m["en"]["millis"].clone()))
        .collect();
    let (held, healed) = ((json!("held"), json!(900)), (json!("healed"), Value::Null));
    assert_eq!(faults, [held.clone(), healed.clone(), held, healed]);
    assert_eq!(
        of("checkpoint").count(),
        6,
        "reports.answered once per held answer; reports.after_insert twice and reports.committed \
         once before the COMMIT"
    );
    assert_eq!(
        reveals,
        [json!(false), Value::Null, Value::Null],
        "b was not right; the others were not answered"
    );
    assert_eq!(calls, 9);

    // The watcher saw the same run.
    let watched = watcher.until("summary").await;
    assert_eq!(watched["en"], summary);
    let expected = json_summary("timeout");
    assert_eq!(summary["facts"], expected["facts"]);
    assert_eq!(summary["passed"], true);

    // The page shows the end: every scenario has run, and Ctrl-C now closes the page with the
    // runs' verdict (before it, Ctrl-C interrupts a run: 130).
    assert_eq!(watcher.until("end").await["passed"], true);
    // Ctrl-C after the run: the run's verdict.
    web.stop(0);
}

#[tokio::test]
async fn between_two_scenarios_the_first_stays_until_next() {
    let web = WebLab::start(&["concurrent", "duplicate", "--lang", "ru"]);
    let mut driver = Stream::open(&format!("{}/api/events?drive={}", web.base, web.token)).await;
    assert_eq!(driver.next().await["lang"], "ru");
    let messages = drive_to_end(&mut driver, &web.base, &web.token, None).await;
    let seen: Vec<String> = messages
        .iter()
        .filter_map(|m| match m["kind"].as_str()? {
            "ready" => Some(format!("ready {}/{}", m["n"], m["of"])),
            "pause" if m["pause"] != "step" && m["pause"] != "service" => {
                Some(m["pause"].as_str()?.to_string())
            }
            "summary" => Some(format!("summary {}", m["en"]["scenario"].as_str()?)),
            _ => None,
        })
        .collect();
    assert_eq!(
        seen,
        [
            "ready 1/2",
            "start",
            "predict",
            "reveal",
            "predict",
            "reveal",
            "summary concurrent",
            // The first scenario's page stays up until Next; the second then starts at once.
            "next",
            "ready 2/2",
            "predict",
            "reveal",
            "summary duplicate",
        ]
    );
    web.stop(0);
}

// ---- in a real browser ---------------------------------------------------------------------

/// Waits until the page has moved past the pause `after` (or the run ended); returns where it
/// waits now: `{"kind", "id"}`, or `{"ended": …}`.
async fn next_pause(page: &Session, after: u64) -> Value {
    page.eval_async(
        "const after = arguments[0];
         window.labView.onChange(() => {
           const p = window.labView.pause, e = window.labView.ended;
           if (e) { done({ended: e}); return true; }
           if (p && p.id > after) { done(p); return true; }
           return false;
         });",
        json!([after]),
    )
    .await
}

async fn save_screenshot(page: &Session, name: &str) {
    let png = page.screenshot().await;
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    let dir = repo().join("docs/img");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), png).unwrap();
}

/// What the diagram shows, read from the page.
async fn diagram(page: &Session) -> Value {
    page.eval(
        "const rows = (sel) => [...document.querySelectorAll(sel)];
         return {
           lanes: rows('#lanes .lane-head').map(l => l.dataset.id),
           calls: rows('#diagram .row.call').map(r => ({
             outcome: r.dataset.outcome || null,
             timeout_ms: r.dataset.timeoutMs ? Number(r.dataset.timeoutMs) : null,
             in_flight: r.classList.contains('inflight'),
           })),
           answers: rows('#diagram .row.answer').map(r => r.dataset.outcome),
           versus: rows('#diagram .versus').map(v => [Number(v.dataset.heldMs), Number(v.dataset.timeoutMs)]),
           faults: rows('#diagram [data-mark=fault]').map(f => [f.dataset.fault, f.dataset.millis ? Number(f.dataset.millis) : null]),
           checkpoints: rows('#diagram .row.checkpoint').length,
           verdicts: rows('.verdict').map(v => v.dataset.right === 'true'),
           facts: Object.fromEntries(rows('#facts tbody tr').map(r =>
             [r.dataset.fact, JSON.parse(r.querySelector('.measured').textContent)])),
           facts_ok: rows('#facts tbody tr').every(r => r.classList.contains('ok')),
         };",
        json!([]),
    )
    .await
}

/// Steps a run to its end through the page: Space at most pauses, the Next button at the
/// others, and the prediction buttons where `answers` has a letter for the n-th prediction.
/// `at_pause` is called at every pause with its kind, to look at the page there.
async fn step_to_end<F>(page: &Session, answers: &[Option<char>], mut at_pause: F) -> Value
where
    F: AsyncFnMut(&Session, &str),
{
    let mut last = 0;
    let mut predictions = 0;
    let mut clicks = 0;
    loop {
        let pause = next_pause(page, last).await;
        if let Some(ended) = pause.get("ended") {
            return ended.clone();
        }
        last = pause["id"].as_u64().unwrap();
        let kind = pause["kind"].as_str().unwrap().to_string();
        at_pause(page, &kind).await;
        if kind == "predict" {
            predictions += 1;
            if let Some(Some(letter)) = answers.get(predictions - 1) {
                page.click(&format!(
                    ".predict:last-of-type .option[data-letter=\"{letter}\"]"
                ))
                .await;
                continue;
            }
        }
        clicks += 1;
        if clicks % 3 == 0 {
            page.click("#next").await;
        } else {
            page.press(" ").await;
        }
    }
}

#[tokio::test]
#[ignore = "needs Debian's chromium and chromium-driver; .ci/run installs them and runs this"]
async fn timeout_in_a_browser_shows_the_held_answer_the_graded_predictions_and_the_facts() {
    webdriver::require_browser();
    let expected = json_summary("timeout");
    let web = WebLab::start(&["timeout", "--lang", "en"]);
    let driver = Driver::start();
    let page = driver.session().await;
    page.goto(&web.drive_url).await;

    let mut seen_in_flight = false;
    let mut shot_held = false;
    let ended = step_to_end(&page, &[Some('c'), Some('b')], async |page, kind| {
        let now = diagram(page).await;
        // Inside the service, the first call has no answer yet: it is drawn in flight.
        if kind == "service" && now["answers"].as_array().unwrap().is_empty() {
            assert_eq!(now["calls"][0]["in_flight"], true, "{now}");
            seen_in_flight = true;
        }
        // The first pause after the first lost answer: the picture of the lesson.
        if !shot_held
            && now["answers"]
                .as_array()
                .unwrap()
                .contains(&json!("unknown"))
        {
            shot_held = true;
            save_screenshot(page, "web-timeout.png").await;
        }
    })
    .await;
    assert_eq!(ended["passed"], true);
    assert!(seen_in_flight, "a call was seen in flight");

    let now = diagram(&page).await;
    assert_eq!(now["lanes"], json!(["worker.a", "service.reports"]));
    let outcomes: Vec<&Value> = now["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["outcome"])
        .collect();
    // Two sides with the answer held on the way back (three lost answers), then the side with
    // the delay before the COMMIT: two clients that give up, each followed by a retry.
    let (unknown, ok) = (json!("unknown"), json!("ok"));
    assert_eq!(
        outcomes,
        [
            &unknown, &unknown, &ok, &unknown, &ok, &unknown, &ok, &unknown, &ok
        ]
    );
    assert_eq!(
        now["answers"],
        json!([
            "unknown", "unknown", "ok", "unknown", "ok", "unknown", "ok", "unknown", "ok"
        ])
    );
    assert!(
        now["calls"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["in_flight"] == false),
        "every call got its answer: {now}"
    );
    // Each lost answer beside why: held 900 ms against a client that waits 150 ms.
    assert_eq!(now["versus"], json!([[900, 150], [900, 150], [900, 150]]));
    assert_eq!(
        now["faults"],
        json!([
            ["held", 900],
            ["healed", null],
            ["held", 900],
            ["healed", null]
        ])
    );
    assert_eq!(
        now["checkpoints"], 6,
        "the service's answered checkpoint once per held answer, then after_insert twice and \
         committed once"
    );
    // c was right; b was not (a is).
    assert_eq!(now["verdicts"], json!([true, false]));
    // The fact table is the run's JSON summary.
    assert_eq!(now["facts"], expected["facts"]);
    assert_eq!(now["facts_ok"], true);
    // The report row, shown where it was read, highlighted as new.
    let report_rows = page
        .eval(
            "return [...document.querySelectorAll('table[data-table=\"table.reports\"] tbody tr')]
               .map(r => r.firstChild.textContent);",
            json!([]),
        )
        .await;
    assert!(
        report_rows.as_array().unwrap().contains(&json!("1")),
        "{report_rows}"
    );

    // The end of the story: the fact table in sight.
    page.eval(
        "document.getElementById('facts').scrollIntoView({block: 'end'});",
        json!([]),
    )
    .await;
    save_screenshot(&page, "web-timeout-facts.png").await;
    // The same page in Russian, without asking lab again.
    page.press("l").await;
    let lang = page.eval("return window.labView.lang;", json!([])).await;
    assert_eq!(lang, "ru");
    let next = page
        .eval(
            "return document.getElementById('next').textContent;",
            json!([]),
        )
        .await;
    assert_eq!(next, "Дальше");
    assert_eq!(
        diagram(&page).await["facts"],
        expected["facts"],
        "the same run, redrawn"
    );
    save_screenshot(&page, "web-timeout-ru.png").await;

    page.close().await;
    drop(driver);
    web.stop(0);
}

#[tokio::test]
#[ignore = "needs Debian's chromium and chromium-driver; .ci/run installs them and runs this"]
async fn concurrent_in_a_browser_then_a_restart_runs_it_again() {
    webdriver::require_browser();
    let expected = json_summary("concurrent");
    let web = WebLab::start(&["concurrent", "--lang", "en"]);
    let driver = Driver::start();
    let page = driver.session().await;
    // A watcher's window too: it follows the run, and has no controls.
    let watcher = driver.session().await;
    watcher.goto(&format!("{}/", web.base)).await;
    page.goto(&web.drive_url).await;

    let ended = step_to_end(&page, &[Some('d'), None], async |_, _| {}).await;
    assert_eq!(ended["passed"], true);
    let now = diagram(&page).await;
    assert_eq!(
        now["lanes"],
        json!(["worker.one", "service.reports", "worker.two"]),
        "{now}"
    );
    let outcomes: Vec<&Value> = now["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["outcome"])
        .collect();
    // Two calls with one key at once, the same key with another payload (409), the naive race.
    let (ok, fail) = (json!("ok"), json!("fail"));
    assert_eq!(outcomes, [&ok, &ok, &fail, &ok, &ok], "{now}");
    assert_eq!(now["answers"], json!(["ok", "ok", "fail", "ok", "ok"]));
    assert!(now["checkpoints"].as_u64().unwrap() >= 3, "{now}");
    assert_eq!(
        now["verdicts"],
        json!([true]),
        "only the first prediction was answered"
    );
    assert_eq!(now["facts"], expected["facts"]);
    page.eval(
        "document.getElementById('facts').scrollIntoView({block: 'end'});",
        json!([]),
    )
    .await;
    save_screenshot(&page, "web-concurrent.png").await;

    // The watcher saw the same run, without the driver's buttons.
    let watched = watcher
        .eval_async(
            "window.labView.onChange(() => {
               if (!window.labView.ended) return false;
               done({
                 driver: window.labView.driver,
                 next_shown: getComputedStyle(document.getElementById('next')).display !== 'none',
                 facts: document.querySelectorAll('#facts tbody tr').length,
               });
               return true;
             });",
            json!([]),
        )
        .await;
    assert_eq!(
        watched,
        json!({"driver": false, "next_shown": false, "facts": expected["facts"].as_object().unwrap().len()})
    );

    // Restart: the scenario again, from its start, on the same servers.
    page.click("#restart").await;
    let ready = page
        .eval_async(
            "window.labView.onChange(() => {
               const p = window.labView.pause;
               if (!p || p.kind !== 'start' || window.labView.ended) return false;
               done({steps: document.querySelectorAll('.step-card').length,
                     calls: document.querySelectorAll('#diagram .row.call').length, id: p.id});
               return true;
             });",
            json!([]),
        )
        .await;
    assert_eq!(
        (&ready["steps"], &ready["calls"]),
        (&json!(0), &json!(0)),
        "{ready}"
    );
    page.press(webdriver::ENTER).await;
    let step = next_pause(&page, ready["id"].as_u64().unwrap()).await;
    assert_eq!(step["kind"], "step", "{step}");
    let steps = page
        .eval(
            "return document.querySelectorAll('.step-card').length;",
            json!([]),
        )
        .await;
    assert_eq!(steps, 1);

    watcher.close().await;
    page.close().await;
    drop(driver);
    // Stopped in the middle of the restarted run: interrupted, and everything cleaned up.
    web.stop(130);
}
