//! A small W3C WebDriver client, enough to drive Debian's headless Chromium through
//! `chromedriver` (package chromium-driver): open a page, run a script, wait for the page to say
//! something changed, click, press a key, take a screenshot.
//!
//! WebDriver is plain HTTP and JSON, and the tests already have reqwest: a client crate would
//! bring a TLS stack and a browser-automation dependency tree to a 2-core machine for the dozen
//! calls made here.
//!
//! `chromedriver` is started in a process group of its own, and the browser it launches joins
//! that group, so dropping [`Driver`] ends both, also when a test fails halfway.

#![allow(dead_code)]

use std::io::BufRead;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

pub const CHROMIUM: &str = "/usr/bin/chromium";
/// The Enter key, as WebDriver names it (a code point of its own, not "\n").
pub const ENTER: &str = "\u{E007}";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// How long a page may take to reach what a test waits for (a scenario step runs real
/// PostgreSQL queries and a 900 ms held answer; a busy 2-core machine is slow).
pub const WAIT: Duration = Duration::from_secs(90);

/// Fails the test, saying how to get the browser, when it is not installed. The tests that
/// need it are `#[ignore]`d, so a plain `cargo test` shows them as ignored, never as passed.
pub fn require_browser() {
    for path in [CHROMIUM, CHROMEDRIVER] {
        assert!(
            Path::new(path).exists(),
            "{path} is missing: `apt-get install -y chromium chromium-driver` (.ci/run does it)"
        );
    }
}

/// A running chromedriver.
pub struct Driver {
    child: Child,
    base: String,
    http: reqwest::Client,
}

impl Driver {
    /// Starts chromedriver on a free loopback port and waits until it says it listens.
    pub fn start() -> Driver {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("chromedriver starts");
        // "ChromeDriver was started successfully on port N." is printed once it listens.
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line.contains("started successfully") {
                    let _ = tx.send(());
                }
            }
        });
        let driver = Driver {
            child,
            base: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
        };
        rx.recv_timeout(Duration::from_secs(30))
            .expect("chromedriver says it started");
        driver
    }

    /// A new headless browser session with a 1280×720 viewport (a projector's).
    pub async fn session(&self) -> Session {
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--hide-scrollbars", "--window-size=1280,720", "--force-device-scale-factor=1",
                    "--no-first-run", "--disable-extensions",
                ],
            },
        }}});
        let created = post(&self.http, &format!("{}/session", self.base), &capabilities).await;
        let id = created["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("a session id in {created}"))
            .to_string();
        let session = Session {
            http: self.http.clone(),
            url: format!("{}/session/{id}", self.base),
        };
        session
            .call("timeouts", json!({"script": WAIT.as_millis() as u64}))
            .await;
        // --window-size is the window's; the page gets it less the browser's own bars. Grow the
        // window by those, so the viewport (and every screenshot) is exactly 1280×720.
        let bars = session
            .eval(
                "return [window.outerWidth - window.innerWidth, window.outerHeight - window.innerHeight];",
                json!([]),
            )
            .await;
        let (w, h) = (bars[0].as_u64().unwrap_or(0), bars[1].as_u64().unwrap_or(0));
        session
            .call("window/rect", json!({"width": 1280 + w, "height": 720 + h}))
            .await;
        let viewport = session
            .eval("return [window.innerWidth, window.innerHeight];", json!([]))
            .await;
        assert_eq!(viewport, json!([1280, 720]), "the viewport of a projector");
        session
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // The whole group: chromedriver and the browser it started.
        let group = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

async fn post(http: &reqwest::Client, url: &str, body: &Value) -> Value {
    let response = http
        .post(url)
        .json(body)
        .send()
        .await
        .expect("chromedriver answers");
    let status = response.status();
    let value: Value = response.json().await.expect("a JSON answer");
    assert!(status.is_success(), "POST {url} {body}: {status} {value}");
    value["value"].clone()
}

/// One browser window.
pub struct Session {
    http: reqwest::Client,
    url: String,
}

impl Session {
    async fn call(&self, path: &str, body: Value) -> Value {
        post(&self.http, &format!("{}/{path}", self.url), &body).await
    }

    pub async fn goto(&self, url: &str) {
        self.call("url", json!({"url": url})).await;
    }

    /// Runs `script` (a function body; `arguments` are `args`) and returns what it returns.
    pub async fn eval(&self, script: &str, args: Value) -> Value {
        self.call("execute/sync", json!({"script": script, "args": args}))
            .await
    }

    /// Runs `script`, which calls `done(value)` (the last argument) when it is ready; waits up to
    /// [`WAIT`].
    pub async fn eval_async(&self, script: &str, args: Value) -> Value {
        let script = format!("const done = arguments[arguments.length - 1];\n{script}");
        self.call("execute/async", json!({"script": script, "args": args}))
            .await
    }

    /// Clicks the element `selector` finds.
    pub async fn click(&self, selector: &str) {
        let found = self
            .call(
                "element",
                json!({"using": "css selector", "value": selector}),
            )
            .await;
        let id = found
            .as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("no element {selector}: {found}"))
            .to_string();
        self.call(&format!("element/{id}/click"), json!({})).await;
    }

    /// Presses and releases a key, as a person at the keyboard does (`" "` is Space).
    pub async fn press(&self, key: &str) {
        self.call(
            "actions",
            json!({"actions": [{"type": "key", "id": "keyboard", "actions": [
                {"type": "keyDown", "value": key}, {"type": "keyUp", "value": key},
            ]}]}),
        )
        .await;
    }

    /// A PNG of the viewport.
    pub async fn screenshot(&self) -> Vec<u8> {
        let response = self
            .http
            .get(format!("{}/screenshot", self.url))
            .send()
            .await
            .expect("chromedriver answers");
        let value: Value = response.json().await.expect("a JSON answer");
        let encoded = value["value"].as_str().expect("base64 PNG");
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .expect("valid base64")
    }

    pub async fn close(self) {
        let _ = self.http.delete(&self.url).send().await;
    }
}
