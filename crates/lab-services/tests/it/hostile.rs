//! Hostile input as properties: thousands of generated malformed requests, sent over a real
//! socket to every bundled service and to the Toxiproxy API, exactly as `lab serve` and a
//! scenario run start them (`Stage::start`, `Faults::embedded_on`).
//!
//! For every generated request the properties are:
//!
//! 1. a request that parses as HTTP gets a complete answer (a panic in a handler would close the
//!    connection without one), with a 4xx status (never a 2xx: every generated request is wrong
//!    on purpose; never a 5xx) and a JSON body with an `error` field;
//! 2. a request that does not parse as HTTP (a control character in a header) gets a 4xx from
//!    the HTTP layer, and the service keeps serving;
//! 3. nothing was created or changed: no report, charge, email, coordinator key in Redis, proxy
//!    or toxic, and no setting.
//!
//! Each generated request is a valid request of one of the service's routes with at least one
//! defect that makes it invalid by the service's contract: a method the route does not take, an
//! unknown path, a missing or wrong Content-Type, a body that is not JSON, truncated, of the
//! wrong shape, with a field missing, of the wrong type, out of range, unknown or given twice, or
//! over the 2 MB limit (413), an Idempotency-Key that is missing, empty, too long, has `:`,
//! non-ASCII or control characters, a path parameter or query that is not one.
//!
//! What it found, each fixed with its failing case kept as a regression test beside the fix: a
//! field given twice and an array in place of an object accepted (`lab_services::api`), unknown
//! fields ignored, plain-text rejections of a query and a path, a tab inside a key accepted, a
//! lease of up to `u64::MAX` ms, and `[{}]` taken as a Toxiproxy toxic update.
//!
//! # Determinism
//!
//! Each test draws its cases from ChaCha with a fixed seed (derived from the test's name), so
//! every run sends the same requests and a failure is reproduced by running the test again; no
//! regressions file is written (`failure_persistence: None`): a case that once failed is kept as
//! a named regression test in the service's own tests, next to its fix. `PROPTEST_CASES` changes
//! the number of cases (default [`CASES`]); `LAB_HOSTILE_SEED=<n>` draws another stream, to look
//! for new failures locally.

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use lab_core::Checkpoints;
use lab_infra::{RunSpace, ServerOptions, Servers};
use lab_services::stage::{self, Ports, Stage, StageConfig};
use lab_services::{ServiceSpec, gateway, mailer, orders, payments, provider, reports};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::task::TaskTracker;

/// Cases per service: enough to meet every defect on every route many times over, few enough
/// for CI's two cores (each case is one request and one read of the service's state).
const CASES: u32 = 400;

/// Only keeps a hung service from hanging the suite; never an assertion about speed.
const SAFETY: Duration = Duration::from_secs(30);

/// axum's default body limit: a body over it must be answered 413.
const BODY_LIMIT: usize = 2 * 1024 * 1024;

// ------------------------------------------------------------------------------------------------
// Raw HTTP: the generated requests are bytes, so they can be anything a client can send.
// ------------------------------------------------------------------------------------------------

/// A request as bytes on the wire.
#[derive(Clone)]
struct Req {
    method: String,
    target: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

impl fmt::Debug for Req {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} {}", self.method, self.target)?;
        for (name, value) in &self.headers {
            writeln!(f, "{name}: {}", value.escape_ascii())?;
        }
        let shown = &self.body[..self.body.len().min(300)];
        write!(f, "\n{}", shown.escape_ascii())?;
        if self.body.len() > shown.len() {
            write!(f, "… ({} bytes)", self.body.len())?;
        }
        Ok(())
    }
}

impl Req {
    fn new(method: &str, target: &str) -> Req {
        Req {
            method: method.to_string(),
            target: target.to_string(),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    fn header(mut self, name: &str, value: impl Into<Vec<u8>>) -> Req {
        self.headers.push((name.to_string(), value.into()));
        self
    }

    /// Whether an HTTP/1.1 parser must accept the head: every header value is field-vchar,
    /// obs-text, SP or HTAB (RFC 9110 §5.5). Anything else is not HTTP, and the HTTP layer
    /// answers it, not the service.
    fn parses_as_http(&self) -> bool {
        self.headers.iter().all(|(_, value)| {
            value
                .iter()
                .all(|&b| b == b'\t' || (0x20..=0x7e).contains(&b) || b >= 0x80)
        })
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = format!("{} {} HTTP/1.1\r\n", self.method, self.target).into_bytes();
        out.extend_from_slice(b"Host: 127.0.0.1\r\nConnection: close\r\n");
        for (name, value) in &self.headers {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(format!("Content-Length: {}\r\n\r\n", self.body.len()).as_bytes());
        out.extend_from_slice(&self.body);
        out
    }
}

/// What came back.
#[derive(Debug)]
struct Answer {
    status: u16,
    content_type: Option<String>,
    body: Vec<u8>,
}

/// Sends `req` on a connection of its own and reads the answer until the server closes.
///
/// The request is written while the answer is read: a server may answer (413) before it has
/// read a large body, and stop reading it.
async fn send(addr: SocketAddr, req: &Req) -> Result<Answer, String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (mut read, mut write) = stream.into_split();
    let bytes = req.bytes();
    let writer = tokio::spawn(async move {
        // A server that answered early and closed makes this fail: that is fine.
        let _ = write.write_all(&bytes).await;
        // Keep the write half open (dropping it would half-close the connection) until the
        // answer has been read.
        write
    });
    let mut got = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    let reading = async {
        loop {
            match read.read(&mut chunk).await {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&chunk[..n]),
                // A reset after the answer arrived (the server closed with our body unread).
                Err(_) if !got.is_empty() => break,
                Err(e) => return Err(format!("read: {e}")),
            }
        }
        Ok(())
    };
    tokio::time::timeout(SAFETY, reading)
        .await
        .map_err(|_| "no answer within the safety timeout".to_string())??;
    drop(writer.await);
    parse(&got)
}

fn parse(raw: &[u8]) -> Result<Answer, String> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| {
            format!(
                "no complete answer (a panic closes the connection): {:?}",
                raw.escape_ascii().to_string()
            )
        })?;
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let mut content_type = None;
    let mut chunked = false;
    let mut length = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim().to_string();
        match name.trim().to_ascii_lowercase().as_str() {
            "content-type" => content_type = Some(value),
            "transfer-encoding" => chunked = value.eq_ignore_ascii_case("chunked"),
            "content-length" => length = value.parse::<usize>().ok(),
            _ => {}
        }
    }
    let rest = &raw[end + 4..];
    let body = if chunked {
        dechunk(rest)?
    } else {
        rest[..length.unwrap_or(rest.len()).min(rest.len())].to_vec()
    };
    Ok(Answer {
        status,
        content_type,
        body,
    })
}

fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        let line_end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("a truncated chunk")?;
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&rest[..line_end])
                .split(';')
                .next()
                .unwrap_or_default()
                .trim(),
            16,
        )
        .map_err(|e| format!("a bad chunk size: {e}"))?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(body);
        }
        body.extend_from_slice(rest.get(..size).ok_or("a truncated chunk")?);
        rest = rest.get(size + 2..).ok_or("a truncated chunk")?;
    }
}

// ------------------------------------------------------------------------------------------------
// The properties, and running them.
// ------------------------------------------------------------------------------------------------

/// A read of everything a hostile request must not change (counts, settings, keys), as JSON.
type Snapshot<'a> = Box<dyn Fn() -> Pin<Box<dyn Future<Output = Value> + 'a>> + 'a>;

/// Properties 1 and 2 for one answer.
fn check(req: &Req, answer: &Answer) -> Result<(), String> {
    if !req.parses_as_http() {
        return if (400..500).contains(&answer.status) {
            Ok(())
        } else {
            Err(format!("not HTTP, yet answered {}", answer.status))
        };
    }
    if !(400..500).contains(&answer.status) {
        return Err(format!(
            "answered {} (not a 4xx): {}",
            answer.status,
            String::from_utf8_lossy(&answer.body)
        ));
    }
    let json = answer
        .content_type
        .as_deref()
        .is_some_and(|t| t.starts_with("application/json"));
    if !json {
        return Err(format!(
            "{} without a JSON content type ({:?}): {}",
            answer.status,
            answer.content_type,
            String::from_utf8_lossy(&answer.body)
        ));
    }
    if req.method == "HEAD" {
        // A HEAD answer has no body by definition; its status and type are checked above.
        return Ok(());
    }
    let body: Value = serde_json::from_slice(&answer.body).map_err(|e| {
        format!(
            "{} with a body that is not JSON ({e}): {}",
            answer.status,
            String::from_utf8_lossy(&answer.body)
        )
    })?;
    if !body["error"].is_string() {
        return Err(format!(
            "{} without an `error` field: {body}",
            answer.status
        ));
    }
    Ok(())
}

/// The seed of a test's case stream: fixed per test, or moved with `LAB_HOSTILE_SEED`.
fn seed(name: &str) -> [u8; 32] {
    let extra: u64 = std::env::var("LAB_HOSTILE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut seed = [0u8; 32];
    for (i, byte) in name.bytes().chain(extra.to_le_bytes()).enumerate() {
        seed[i % 32] = seed[i % 32].wrapping_mul(31).wrapping_add(byte);
    }
    seed
}

/// Sends every generated request to `addr` and checks the three properties; the first case that
/// breaks one is shrunk and reported.
fn hostile(
    name: &str,
    rt: &tokio::runtime::Runtime,
    addr: SocketAddr,
    requests: BoxedStrategy<Req>,
    snapshot: Snapshot<'_>,
) {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(CASES);
    let config = Config {
        cases,
        failure_persistence: None,
        rng_algorithm: RngAlgorithm::ChaCha,
        ..Config::default()
    };
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed(name));
    let mut runner = TestRunner::new_with_rng(config, rng);
    let result = runner.run(&requests, |req| {
        rt.block_on(async {
            // Read before every case: a case that did change something must not make every
            // case after it (and every step of its shrinking) fail too.
            let before = snapshot().await;
            let answer = send(addr, &req).await.map_err(TestCaseError::fail)?;
            check(&req, &answer).map_err(TestCaseError::fail)?;
            let after = snapshot().await;
            if after != before {
                return Err(TestCaseError::fail(format!(
                    "the request changed the service's state: {before} → {after}"
                )));
            }
            Ok(())
        })
    });
    if let Err(failure) = result {
        panic!("{name}: {failure}");
    }
}

// ------------------------------------------------------------------------------------------------
// What each service takes, and what makes a request to it invalid.
// ------------------------------------------------------------------------------------------------

/// What a JSON field holds.
#[derive(Debug, Clone, Copy)]
enum Kind {
    PositiveInt,
    Uuid,
    /// Three capital letters.
    Currency,
    /// 1 to `max` printable characters, not blank.
    Text(usize),
    Email,
    Bool,
    /// The payment service's lease: 1 ms to an hour.
    LeaseMs,
    /// `compatible` or `hardened`.
    Policy,
}

#[derive(Debug, Clone, Copy)]
struct Field {
    name: &'static str,
    kind: Kind,
    required: bool,
}

const fn req(name: &'static str, kind: Kind) -> Field {
    Field {
        name,
        kind,
        required: true,
    }
}

const fn opt(name: &'static str, kind: Kind) -> Field {
    Field {
        name,
        kind,
        required: false,
    }
}

/// How a route treats the Idempotency-Key header.
#[derive(Debug, Clone, Copy)]
enum Key {
    /// It does not read one.
    Ignored,
    /// May be absent; when present, 1 to `max` visible ASCII characters (`:` allowed or not).
    Optional { max: usize, colon: bool },
    /// Must be present, and as above.
    Required { max: usize, colon: bool },
}

/// A path parameter or query a route reads.
#[derive(Debug, Clone, Copy)]
enum Param {
    None,
    /// `/reports/{id}`: an integer.
    ReportId,
    /// `/charges?key=K`: one key at most.
    ChargesQuery,
}

#[derive(Debug, Clone, Copy)]
struct Route {
    method: &'static str,
    /// The path; `{id}` for [`Param::ReportId`].
    path: &'static str,
    /// The JSON body's fields; `None` for a route without a body.
    body: Option<&'static [Field]>,
    key: Key,
    param: Param,
}

const fn get(path: &'static str) -> Route {
    Route {
        method: "GET",
        path,
        body: None,
        key: Key::Ignored,
        param: Param::None,
    }
}

const fn with_body(method: &'static str, path: &'static str, body: &'static [Field]) -> Route {
    Route {
        method,
        path,
        body: Some(body),
        key: Key::Ignored,
        param: Param::None,
    }
}

const fn keyed(mut route: Route, key: Key) -> Route {
    route.key = key;
    route
}

const fn param(mut route: Route, param: Param) -> Route {
    route.param = param;
    route
}

const REPORT: &[Field] = &[
    req("task_id", Kind::PositiveInt),
    req("report_type", Kind::Text(64)),
];
const PAYMENT: &[Field] = &[
    req("tenant_id", Kind::Uuid),
    req("order_id", Kind::Uuid),
    req("amount", Kind::PositiveInt),
    req("currency", Kind::Currency),
];
const CHARGE: &[Field] = &[
    req("order_id", Kind::Text(64)),
    req("amount", Kind::PositiveInt),
    req("currency", Kind::Currency),
];
const EMAIL: &[Field] = &[req("to", Kind::Email), req("subject", Kind::Text(200))];
const PAYMENTS_CONFIG: &[Field] = &[
    opt("policy", Kind::Policy),
    opt("key_guard", Kind::Bool),
    opt("lease_ms", Kind::LeaseMs),
];
const PROVIDER_CONFIG: &[Field] = &[req("dedup_by_key", Kind::Bool)];
const RELAY_CONFIG: &[Field] = &[req("mint_keys", Kind::Bool)];

/// The chain's key rule: the payment service's, which the relays pass it to unchanged.
const PAYMENT_KEY: Key = Key::Required {
    max: 255,
    colon: false,
};

const REPORTS: &[Route] = &[
    keyed(
        with_body("POST", "/reports", REPORT),
        Key::Optional {
            max: 255,
            colon: true,
        },
    ),
    get("/reports"),
    param(get("/reports/{id}"), Param::ReportId),
    keyed(
        with_body("POST", "/naive/reports", REPORT),
        Key::Required {
            max: 255,
            colon: true,
        },
    ),
    get("/health"),
];

const PROVIDER: &[Route] = &[
    keyed(
        with_body("POST", "/charges", CHARGE),
        Key::Optional {
            max: 512,
            colon: true,
        },
    ),
    param(get("/charges"), Param::ChargesQuery),
    with_body("PUT", "/config", PROVIDER_CONFIG),
    get("/config"),
    get("/health"),
];

const PAYMENTS: &[Route] = &[
    keyed(with_body("POST", "/payments", PAYMENT), PAYMENT_KEY),
    with_body("PUT", "/config", PAYMENTS_CONFIG),
    get("/config"),
    get("/stats"),
    get("/health"),
];

const ORDERS: &[Route] = &[
    keyed(with_body("POST", "/orders/pay", PAYMENT), PAYMENT_KEY),
    with_body("PUT", "/config", RELAY_CONFIG),
    get("/config"),
    get("/stats"),
    get("/health"),
];

const GATEWAY: &[Route] = &[
    keyed(with_body("POST", "/checkout", PAYMENT), PAYMENT_KEY),
    with_body("PUT", "/config", RELAY_CONFIG),
    get("/config"),
    get("/stats"),
    get("/health"),
];

const MAILER: &[Route] = &[
    with_body("POST", "/emails", EMAIL),
    get("/emails"),
    get("/health"),
];

/// The methods a generated request may use, including ones no route takes.
const METHODS: &[&str] = &[
    "GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "HEAD", "FOO", "BREW",
];

/// A valid value of a field, as JSON text.
fn valid(kind: Kind) -> BoxedStrategy<String> {
    let text = |max: usize| {
        proptest::string::string_regex(&format!("[a-zA-Z0-9 ]{{0,{}}}[a-z]", max.min(20) - 1))
            .expect("a valid regex")
            .prop_map(|s| Value::from(s).to_string())
    };
    match kind {
        Kind::PositiveInt => (1i64..=1_000_000).prop_map(|n| n.to_string()).boxed(),
        Kind::Uuid => prop_oneof![
            Just("\"6f1c2d3e-4a5b-4c6d-8e7f-0a1b2c3d4e5f\"".to_string()),
            Just("\"0b7e4c1a-2d3f-4e5a-9b6c-7d8e9f0a1b2c\"".to_string()),
        ]
        .boxed(),
        Kind::Currency => {
            prop_oneof![Just("\"RUB\"".to_string()), Just("\"USD\"".to_string())].boxed()
        }
        Kind::Text(max) => text(max).boxed(),
        Kind::Email => Just("\"anna@example.com\"".to_string()).boxed(),
        Kind::Bool => any::<bool>().prop_map(|b| b.to_string()).boxed(),
        Kind::LeaseMs => (1u64..=3_600_000).prop_map(|n| n.to_string()).boxed(),
        Kind::Policy => prop_oneof![
            Just("\"compatible\"".to_string()),
            Just("\"hardened\"".to_string())
        ]
        .boxed(),
    }
}

/// Values a field must refuse, as JSON text: wrong types and values out of its range.
fn invalid(field: Field) -> BoxedStrategy<String> {
    let long = |max: usize| Value::from("x".repeat(max + 1)).to_string();
    // JSON texts of every other type (a number where a string belongs, …).
    let mut values: Vec<String> = ["[]", "{}", "[1,2]", "{\"a\":1}", "1e400"]
        .map(String::from)
        .to_vec();
    if !matches!(field.kind, Kind::Bool) {
        values.push("true".into());
    }
    // `null` is "not given" for an optional field, and so valid.
    if field.required {
        values.push("null".into());
    }
    let specific: &[&str] = match field.kind {
        Kind::PositiveInt => &[
            "0",
            "-1",
            "-9223372036854775808",
            "9223372036854775808",
            "1.5",
            "1e3",
            "\"42\"",
        ],
        Kind::Uuid => &[
            "\"\"",
            "\"not-a-uuid\"",
            "\"6f1c2d3e-4a5b-4c6d-8e7f-0a1b2c3d4e5\"",
            "\"6f1c2d3e-4a5b-4c6d-8e7f-0a1b2c3d4e5f0\"",
            "\"6f1c2d3e-4a5b-4c6d-8e7f-0a1b2c3d4e5\\u0000\"",
            "42",
        ],
        Kind::Currency => &[
            "\"\"",
            "\"rub\"",
            "\"RUBL\"",
            "\"RU\"",
            "\"РУБ\"",
            "\"R\\u0000B\"",
            "643",
        ],
        Kind::Text(_) => &[
            "\"\"",
            "\"   \"",
            "\"\\u00a0\"",
            "\"a\\u0000b\"",
            "\"a\\nb\"",
            "\"a\\tb\"",
            "\"\\u007f\"",
            "\"\\u0085\"",
            "\"\\u001b[31mred\"",
            "7",
        ],
        Kind::Email => &[
            "\"\"",
            "\"anna\"",
            "\"anna@\"",
            "\"@example.com\"",
            "\"anna@example\"",
            "\"an na@example.com\"",
            "\"anna@example.com\\n\"",
            "\"anna@example.com\\u0000\"",
        ],
        Kind::Bool => &["\"true\"", "1", "0", "\"yes\""],
        Kind::LeaseMs => &[
            "0",
            "-1",
            "1.5",
            "\"1000\"",
            "3600001",
            "18446744073709551615",
            "18446744073709551616",
        ],
        Kind::Policy => &["\"strict\"", "\"Compatible\"", "\"\"", "1"],
    };
    values.extend(specific.iter().map(|s| s.to_string()));
    match field.kind {
        Kind::Text(max) => values.push(long(max)),
        Kind::Email => {
            values.push(Value::from(format!("{}@example.com", "a".repeat(250))).to_string())
        }
        _ => {}
    }
    proptest::sample::select(values).boxed()
}

/// A JSON object as (name, JSON text) pairs, in order; names may repeat.
type Members = Vec<(String, String)>;

fn render(members: &Members) -> Vec<u8> {
    let inner: Vec<String> = members
        .iter()
        .map(|(name, value)| format!("{}:{value}", Value::from(name.as_str())))
        .collect();
    format!("{{{}}}", inner.join(",")).into_bytes()
}

/// A valid body for `fields`: every required field, and some optional ones.
fn valid_members(fields: &'static [Field]) -> BoxedStrategy<Members> {
    let parts: Vec<BoxedStrategy<Option<(String, String)>>> = fields
        .iter()
        .map(|f| {
            let name = f.name.to_string();
            let value = valid(f.kind).prop_map(move |v| (name.clone(), v));
            if f.required {
                value.prop_map(Some).boxed()
            } else {
                proptest::option::of(value).boxed()
            }
        })
        .collect();
    parts
        .prop_map(|parts| parts.into_iter().flatten().collect())
        .boxed()
}

/// What is wrong with a body.
fn bad_body(fields: &'static [Field]) -> BoxedStrategy<Vec<u8>> {
    let members = valid_members(fields);
    let names: Vec<&'static str> = fields.iter().map(|f| f.name).collect();
    let mut options: Vec<(u32, BoxedStrategy<Vec<u8>>)> = vec![
        // Not JSON at all.
        (
            3,
            proptest::collection::vec(any::<u8>(), 0..64)
                .prop_filter("not JSON", |b| serde_json::from_slice::<Value>(b).is_err())
                .boxed(),
        ),
        // A valid body, cut short: a prefix of a JSON object is never a JSON text.
        (
            3,
            (members.clone(), any::<prop::sample::Index>())
                .prop_map(|(m, cut)| {
                    let body = render(&m);
                    body[..cut.index(body.len())].to_vec()
                })
                .boxed(),
        ),
        // JSON, but not an object.
        (
            2,
            prop_oneof![
                Just("null"),
                Just("[]"),
                Just("1"),
                Just("\"payment\""),
                Just("true"),
                Just("[{}]"),
            ]
            .prop_map(|s| s.as_bytes().to_vec())
            .boxed(),
        ),
        // The fields' values as an array (serde would fill a struct from it in field order).
        (
            1,
            members
                .clone()
                .prop_map(|m| {
                    let values: Vec<String> = m.into_iter().map(|(_, v)| v).collect();
                    format!("[{}]", values.join(",")).into_bytes()
                })
                .boxed(),
        ),
        // A field that is not one of the route's.
        (
            3,
            (
                members.clone(),
                proptest::string::string_regex("[a-z_]{1,12}|taskId|Amount|__proto__")
                    .expect("a valid regex")
                    .prop_filter("unknown", move |n| !names.contains(&n.as_str())),
                prop_oneof![Just("1"), Just("\"x\""), Just("null"), Just("{}")],
                any::<prop::sample::Index>(),
            )
                .prop_map(|(mut m, name, value, at)| {
                    m.insert(at.index(m.len() + 1), (name, value.to_string()));
                    render(&m)
                })
                .boxed(),
        ),
        // A body over the limit, valid but for its size.
        (
            1,
            members
                .clone()
                .prop_map(|m| {
                    let mut body = render(&m);
                    body.pop();
                    body.resize(BODY_LIMIT + 1024, b' ');
                    body.push(b'}');
                    body
                })
                .boxed(),
        ),
    ];
    // A field of the wrong type or out of range.
    let field_values: Vec<BoxedStrategy<(usize, String)>> = fields
        .iter()
        .enumerate()
        .map(|(i, f)| invalid(*f).prop_map(move |v| (i, v)).boxed())
        .collect();
    let fields_len = fields.len();
    options.push((
        6,
        (
            members.clone(),
            proptest::strategy::Union::new(field_values),
        )
            .prop_map(move |(mut m, (i, value))| {
                let name = fields[i].name.to_string();
                m.retain(|(n, _)| *n != name);
                let at = i.min(m.len());
                m.insert(at, (name, value));
                render(&m)
            })
            .boxed(),
    ));
    // A required field missing.
    let required: Vec<usize> = (0..fields_len).filter(|&i| fields[i].required).collect();
    if !required.is_empty() {
        options.push((
            3,
            (members.clone(), proptest::sample::select(required))
                .prop_map(move |(mut m, i)| {
                    m.retain(|(n, _)| n != fields[i].name);
                    render(&m)
                })
                .boxed(),
        ));
    }
    // A field given twice (JSON parsers disagree on which one wins).
    options.push((
        2,
        (members, any::<prop::sample::Index>())
            .prop_filter("a field to repeat", |(m, _)| !m.is_empty())
            .prop_map(|(mut m, at)| {
                let twice = m[at.index(m.len())].clone();
                m.push(twice);
                render(&m)
            })
            .boxed(),
    ));
    proptest::strategy::Union::new_weighted(options).boxed()
}

/// Content types that are not JSON (or none at all).
fn bad_content_type() -> BoxedStrategy<Option<Vec<u8>>> {
    prop_oneof![
        Just(None),
        Just(Some(b"text/plain".to_vec())),
        Just(Some(b"application/x-www-form-urlencoded".to_vec())),
        Just(Some(b"application/jsonx".to_vec())),
        Just(Some(b"json".to_vec())),
        Just(Some(b"".to_vec())),
        Just(Some(b"multipart/form-data; boundary=x".to_vec())),
    ]
    .boxed()
}

/// Idempotency-Key values the rule refuses. `None`: the header is missing.
fn bad_key(key: Key) -> Option<BoxedStrategy<Option<Vec<u8>>>> {
    let (max, colon, required) = match key {
        Key::Ignored => return None,
        Key::Optional { max, colon } => (max, colon, false),
        Key::Required { max, colon } => (max, colon, true),
    };
    let mut options: Vec<BoxedStrategy<Option<Vec<u8>>>> = vec![
        Just(Some(b"".to_vec())).boxed(),
        Just(Some(b"   ".to_vec())).boxed(),
        // Too long, by one character or by many.
        prop_oneof![Just(max + 1), (max + 2)..(max + 400)]
            .prop_map(|n| Some(vec![b'k'; n]))
            .boxed(),
        // Not ASCII: UTF-8, or any bytes over 0x7f (obs-text, which HTTP still carries).
        prop_oneof![
            Just("ключ-1".as_bytes().to_vec()),
            Just("clé".as_bytes().to_vec()),
            proptest::collection::vec(0x80u8..=0xff, 1..8).prop_map(|tail| [
                b"k".as_slice(),
                &tail
            ]
            .concat()),
        ]
        .prop_map(Some)
        .boxed(),
        // A control character inside: a tab is still HTTP (and must be refused by the
        // service: the draft's key is an sf-string of printable ASCII); the others are not HTTP.
        prop_oneof![Just(0x09u8), 0x01u8..0x09, 0x0bu8..0x20, Just(0x7f)]
            .prop_map(|c| Some(vec![b'k', c, b'1']))
            .boxed(),
    ];
    if !colon {
        options.push(Just(Some(b"order:1".to_vec())).boxed());
    }
    if required {
        options.push(Just(None).boxed());
    }
    Some(proptest::strategy::Union::new(options).boxed())
}

/// A key the rule accepts.
fn good_key() -> BoxedStrategy<Vec<u8>> {
    proptest::string::string_regex("[A-Za-z0-9._-]{1,40}")
        .expect("a valid regex")
        .prop_map(String::into_bytes)
        .boxed()
}

/// The concrete path of a route (its parameter filled validly).
fn path_of(route: &Route) -> String {
    route.path.replace("{id}", "1")
}

/// Whether some route of `routes` serves `path` (routes match whole segments; `{id}` one
/// non-empty segment).
fn known(routes: &[Route], path: &str) -> bool {
    let path = path.split('?').next().unwrap_or_default();
    routes.iter().any(|r| {
        let want: Vec<&str> = r.path.split('/').collect();
        let got: Vec<&str> = path.split('/').collect();
        want.len() == got.len()
            && want
                .iter()
                .zip(&got)
                .all(|(w, g)| w == g || (w.starts_with('{') && !g.is_empty()))
    })
}

/// One hostile request to one of `routes`: a valid request with at least one defect.
fn hostile_requests(routes: &'static [Route]) -> BoxedStrategy<Req> {
    let mut options: Vec<(u32, BoxedStrategy<Req>)> = Vec::new();

    // An unknown path, any method.
    options.push((
        2,
        (
            proptest::sample::select(METHODS),
            prop_oneof![
                Just("/".to_string()),
                Just("/admin".to_string()),
                Just("/%2e%2e/%2e%2e/etc/passwd".to_string()),
                Just("/reports%00".to_string()),
                Just("/charges/1/2".to_string()),
                proptest::string::string_regex("(/[a-z0-9%._-]{1,10}){1,3}/?").expect("a regex"),
                proptest::sample::select(routes.iter().map(path_of).collect::<Vec<_>>())
                    .prop_map(|p| format!("{p}/x")),
                proptest::sample::select(routes.iter().map(path_of).collect::<Vec<_>>())
                    .prop_map(|p| p.to_uppercase()),
            ]
            .prop_filter("unknown", move |p| !known(routes, p)),
            proptest::collection::vec(any::<u8>(), 0..32),
        )
            .prop_map(|(method, path, body)| {
                let mut req = Req::new(method, &path).header("Content-Type", "application/json");
                req.body = body;
                req
            })
            .boxed(),
    ));

    for route in routes {
        let path = path_of(route);
        // A method the path does not take (HEAD comes with GET).
        let taken: Vec<&str> = routes
            .iter()
            .filter(|r| path_of(r) == path)
            .map(|r| r.method)
            .collect();
        let others: Vec<&'static str> = METHODS
            .iter()
            .copied()
            .filter(|m| {
                let head_with_get = *m == "HEAD" && taken.contains(&"GET");
                !taken.contains(m) && !head_with_get
            })
            .collect();
        let at = path.clone();
        options.push((
            1,
            proptest::sample::select(others)
                .prop_map(move |m| Req::new(m, &at).header("Content-Type", "application/json"))
                .boxed(),
        ));

        match route.param {
            Param::None => {}
            Param::ReportId => {
                let ids = prop_oneof![
                    Just("abc"),
                    Just("1.5"),
                    Just("-"),
                    Just("0x10"),
                    Just("99999999999999999999"),
                    Just("%FF"),
                    Just("%C3%28"),
                    Just("%00"),
                    Just("0"),
                    Just("-1"),
                    Just("424242"),
                ];
                let template = route.path;
                options.push((
                    3,
                    ids.prop_map(move |id| Req::new("GET", &template.replace("{id}", id)))
                        .boxed(),
                ));
            }
            Param::ChargesQuery => {
                let queries = prop_oneof![
                    Just("key=a&key=b"),
                    Just("key=&key="),
                    Just("key=a&key=a&key=a"),
                ];
                let at = path.clone();
                options.push((
                    2,
                    queries
                        .prop_map(move |q| Req::new("GET", &format!("{at}?{q}")))
                        .boxed(),
                ));
            }
        }

        let Some(fields) = route.body else { continue };
        let (method, at, key) = (route.method, path.clone(), route.key);
        // A valid key for this route, or none when it needs none.
        let key_ok: BoxedStrategy<Option<Vec<u8>>> = match key {
            Key::Ignored => Just(None).boxed(),
            Key::Optional { .. } => proptest::option::of(good_key()).boxed(),
            Key::Required { .. } => good_key().prop_map(Some).boxed(),
        };
        let build = move |content_type: Option<Vec<u8>>, key: Option<Vec<u8>>, body: Vec<u8>| {
            let mut req = Req::new(method, &at);
            if let Some(ct) = content_type {
                req = req.header("Content-Type", ct);
            }
            if let Some(key) = key {
                req = req.header("Idempotency-Key", key);
            }
            req.body = body;
            req
        };
        let json = Just(Some(b"application/json".to_vec())).boxed();
        let members = valid_members(fields).prop_map(|m| render(&m));

        // The body is wrong (the key may be wrong too).
        let any_key = match bad_key(key) {
            Some(bad) => prop_oneof![3 => key_ok.clone(), 1 => bad].boxed(),
            None => key_ok.clone(),
        };
        let b = build.clone();
        options.push((
            12,
            (json.clone(), any_key, bad_body(fields))
                .prop_map(move |(ct, k, body)| b(ct, k, body))
                .boxed(),
        ));
        // The content type is wrong, the body fine.
        let b = build.clone();
        options.push((
            3,
            (bad_content_type(), key_ok.clone(), members.clone())
                .prop_map(move |(ct, k, body)| b(ct, k, body))
                .boxed(),
        ));
        // The key is wrong, the body fine.
        if let Some(bad) = bad_key(key) {
            let b = build.clone();
            options.push((
                6,
                (json, bad, members)
                    .prop_map(move |(ct, k, body)| b(ct, k, body))
                    .boxed(),
            ));
        }
    }
    proptest::strategy::Union::new_weighted(options).boxed()
}

// ------------------------------------------------------------------------------------------------
// The services, started as a run starts them.
// ------------------------------------------------------------------------------------------------

/// The servers, the run space and the stage of one test: `spec` and everything it calls.
struct Fixture {
    servers: Servers,
    space: Option<RunSpace>,
    stage: Option<Stage>,
    tasks: TaskTracker,
}

impl Fixture {
    async fn start(spec: &'static ServiceSpec) -> Fixture {
        let needs = spec.all_needs();
        let servers = Servers::start(&ServerOptions::default(), needs)
            .await
            .expect("servers start");
        let space = RunSpace::create(&servers, &stage::schemas(&[spec]))
            .await
            .expect("a run space");
        let tasks = TaskTracker::new();
        let config = StageConfig {
            space: &space,
            narrator: None,
            checkpoints: Checkpoints::new(),
            tasks: tasks.clone(),
            faults: None,
            hops: &[],
        };
        let stage = Stage::start(&[spec], &config, Ports::Free)
            .await
            .expect("the services start");
        Fixture {
            servers,
            space: Some(space),
            stage: Some(stage),
            tasks,
        }
    }

    fn addr(&self, spec: &ServiceSpec) -> SocketAddr {
        self.stage
            .as_ref()
            .and_then(|s| s.get(spec))
            .expect("started")
            .direct
    }

    /// Every key of the run in Redis (none may appear: a hostile request reserves nothing).
    async fn redis_keys(&self) -> Value {
        let Some(mut conn) = self.space.as_ref().and_then(|s| s.redis.clone()) else {
            return Value::Null;
        };
        let prefix = &self.space.as_ref().expect("a space").prefix;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}*"))
            .query_async(&mut conn)
            .await
            .expect("KEYS");
        keys.into()
    }

    async fn finish(mut self) {
        if let Some(stage) = self.stage.take() {
            stage.stop().await;
        }
        self.tasks.close();
        self.tasks.wait().await;
        if let Some(space) = self.space.take() {
            space.release(&self.servers, false).await.expect("released");
        }
        self.servers.shutdown().await;
    }
}

/// `GET http://addr/path` as JSON, directly (not through the generated-request client).
async fn read_json(addr: SocketAddr, path: &str) -> Value {
    let answer = send(addr, &Req::new("GET", path)).await.expect("an answer");
    assert_eq!(answer.status, 200, "GET {path}");
    serde_json::from_slice(&answer.body).expect("JSON")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Runs the property against `spec`, with `snapshot` reading what must not change.
fn against<S>(spec: &'static ServiceSpec, routes: &'static [Route], snapshot: S)
where
    S: for<'a> Fn(&'a Fixture) -> Pin<Box<dyn Future<Output = Value> + 'a>>,
{
    let rt = runtime();
    let fixture = rt.block_on(Fixture::start(spec));
    let addr = fixture.addr(spec);
    hostile(
        spec.name,
        &rt,
        addr,
        hostile_requests(routes),
        Box::new(|| snapshot(&fixture)),
    );
    // Still serving after everything it was sent.
    let health = rt.block_on(read_json(addr, "/health"));
    assert_eq!(health["status"], "ok");
    rt.block_on(fixture.finish());
}

#[test]
fn the_report_service_refuses_hostile_requests_with_a_json_4xx_and_creates_nothing() {
    against(&reports::SPEC, REPORTS, |f| {
        Box::pin(async move {
            let addr = f.addr(&reports::SPEC);
            let pool = f
                .space
                .as_ref()
                .and_then(|s| s.pg.clone())
                .expect("PostgreSQL");
            let naive: i64 = sqlx::query_scalar("SELECT count(*) FROM naive_reports")
                .fetch_one(&pool)
                .await
                .expect("naive_reports");
            serde_json::json!({"reports": read_json(addr, "/reports").await["count"], "naive": naive})
        })
    });
}

#[test]
fn the_provider_refuses_hostile_requests_with_a_json_4xx_and_charges_nothing() {
    against(&provider::SPEC, PROVIDER, |f| {
        Box::pin(async move {
            let addr = f.addr(&provider::SPEC);
            serde_json::json!({
                "charges": read_json(addr, "/charges").await["count"],
                "config": read_json(addr, "/config").await,
            })
        })
    });
}

/// What the chain's services must keep as they were: the provider's charges, every service's
/// settings, and the run's keys in Redis.
fn chain_state(f: &Fixture) -> Pin<Box<dyn Future<Output = Value> + '_>> {
    Box::pin(async move {
        let mut state = serde_json::json!({
            "charges": read_json(f.addr(&provider::SPEC), "/charges").await["count"],
            "provider": read_json(f.addr(&provider::SPEC), "/config").await,
            "payments": read_json(f.addr(&payments::SPEC), "/config").await,
            "redis": f.redis_keys().await,
        });
        for relay in [&orders::SPEC, &gateway::SPEC] {
            if let Some(handle) = f.stage.as_ref().and_then(|s| s.get(relay)) {
                state[relay.name] = read_json(handle.direct, "/config").await;
            }
        }
        state
    })
}

#[test]
fn the_payment_service_refuses_hostile_requests_with_a_json_4xx_and_charges_nothing() {
    against(&payments::SPEC, PAYMENTS, chain_state);
}

#[test]
fn the_orders_service_refuses_hostile_requests_with_a_json_4xx_and_charges_nothing() {
    against(&orders::SPEC, ORDERS, chain_state);
}

#[test]
fn the_gateway_refuses_hostile_requests_with_a_json_4xx_and_charges_nothing() {
    against(&gateway::SPEC, GATEWAY, chain_state);
}

#[test]
fn the_mailer_refuses_hostile_requests_with_a_json_4xx_and_sends_nothing() {
    against(&mailer::SPEC, MAILER, |f| {
        Box::pin(async move {
            serde_json::json!({"emails": read_json(f.addr(&mailer::SPEC), "/emails").await["count"]})
        })
    });
}

// ------------------------------------------------------------------------------------------------
// The Toxiproxy API, served as a run serves it (`Faults::embedded_on`).
// ------------------------------------------------------------------------------------------------

/// The proxy every generated request may aim at, and its one toxic: neither may change.
const VICTIM: &str = "victim";
const TOXIC: &str = "t1";

/// Names that are neither [`VICTIM`] nor [`TOXIC`].
fn unknown_name() -> BoxedStrategy<String> {
    proptest::string::string_regex("[a-z0-9_-]{1,10}")
        .expect("a regex")
        .prop_filter("unknown", |n| n != VICTIM && n != TOXIC)
        .boxed()
}

/// Addresses the API must refuse without asking DNS (no port, or a port that is not one).
fn bad_address() -> BoxedStrategy<String> {
    prop_oneof![
        Just("nope".to_string()),
        Just("127.0.0.1".to_string()),
        Just("127.0.0.1:99999".to_string()),
        Just("127.0.0.1:-1".to_string()),
        Just("127.0.0.1:x".to_string()),
        Just("".to_string()),
    ]
    .boxed()
}

/// JSON texts that are not objects (`null` left out: Go's decoder, and so Toxiproxy, reads it
/// into a struct as "nothing given").
fn not_an_object() -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        Just(b"[]".to_vec()),
        Just(b"1".to_vec()),
        Just(b"\"x\"".to_vec()),
        Just(b"true".to_vec()),
        Just(b"[{}]".to_vec()),
    ]
    .boxed()
}

/// Bytes that are not JSON at all (the empty body included).
fn not_json() -> BoxedStrategy<Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..48)
        .prop_filter("not JSON", |b| serde_json::from_slice::<Value>(b).is_err())
        .boxed()
}

/// A proxy as `POST /proxies` takes it, with exactly one thing wrong.
fn bad_proxy(allow_conflict: bool) -> BoxedStrategy<Value> {
    let base = unknown_name().prop_map(|name| {
        serde_json::json!({"name": name, "listen": "127.0.0.1:0", "upstream": "127.0.0.1:9"})
    });
    let wrong_type = prop_oneof![
        Just(Value::from(1)),
        Just(Value::from(true)),
        Just(serde_json::json!([])),
        Just(serde_json::json!({})),
    ];
    let mut options: Vec<BoxedStrategy<Value>> = vec![
        (
            base.clone(),
            proptest::sample::select(vec!["name", "upstream"]),
        )
            .prop_map(|(mut p, field)| {
                p.as_object_mut().expect("an object").remove(field);
                p
            })
            .boxed(),
        (
            base.clone(),
            proptest::sample::select(vec!["name", "upstream"]),
        )
            .prop_map(|(mut p, field)| {
                p[field] = Value::from("");
                p
            })
            .boxed(),
        (
            base.clone(),
            proptest::sample::select(vec!["name", "listen", "upstream", "enabled"]),
            wrong_type,
        )
            .prop_map(|(mut p, field, value)| {
                p[field] = value;
                p
            })
            .boxed(),
        (
            base.clone(),
            proptest::sample::select(vec!["listen", "upstream"]),
            bad_address().prop_filter("not empty", |a| !a.is_empty()),
        )
            .prop_map(|(mut p, field, address)| {
                p[field] = Value::from(address);
                p
            })
            .boxed(),
    ];
    if allow_conflict {
        options.push(
            base.prop_map(|mut p| {
                p["name"] = Value::from(VICTIM);
                p
            })
            .boxed(),
        );
    }
    proptest::strategy::Union::new(options).boxed()
}

/// A toxic as `POST /proxies/{proxy}/toxics` takes it, with exactly one thing wrong.
fn bad_toxic() -> BoxedStrategy<Value> {
    let base = unknown_name().prop_map(|name| {
        serde_json::json!({"name": name, "type": "latency", "stream": "downstream",
                           "toxicity": 1.0, "attributes": {"latency": 10, "jitter": 0}})
    });
    let field = |name: &'static str, values: Vec<Value>| {
        (base.clone(), proptest::sample::select(values))
            .prop_map(move |(mut t, v)| {
                t[name] = v;
                t
            })
            .boxed()
    };
    let attribute = (
        base.clone(),
        proptest::sample::select(vec!["latency", "jitter"]),
        proptest::sample::select(vec![
            Value::from(-1),
            Value::from(1.5),
            Value::from("10"),
            Value::from(true),
            serde_json::json!([]),
        ]),
    )
        .prop_map(|(mut t, name, v)| {
            t["attributes"][name] = v;
            t
        })
        .boxed();
    prop_oneof![
        field(
            "type",
            vec!["".into(), "nope".into(), "LATENCY".into(), 1.into()]
        ),
        field(
            "stream",
            vec!["up".into(), "both".into(), "".into(), 1.into()]
        ),
        field(
            "toxicity",
            vec![
                (-0.5).into(),
                1.5.into(),
                "1".into(),
                1e39.into(),
                true.into()
            ]
        ),
        field(
            "attributes",
            vec!["x".into(), serde_json::json!([]), 1.into()]
        ),
        field("name", vec![1.into(), serde_json::json!([]), TOXIC.into()]),
        attribute,
    ]
    .boxed()
}

/// A toxic update with one thing wrong.
fn bad_toxic_update() -> BoxedStrategy<Value> {
    prop_oneof![
        proptest::sample::select(vec![
            Value::from(-0.5),
            Value::from(1.5),
            Value::from("1"),
            Value::from(1e39)
        ])
        .prop_map(|v| serde_json::json!({"toxicity": v})),
        proptest::sample::select(vec![
            Value::from(-1),
            Value::from(1.5),
            Value::from("10"),
            serde_json::json!({})
        ])
        .prop_map(|v| serde_json::json!({"attributes": {"latency": v}})),
        proptest::sample::select(vec![
            Value::from("x"),
            serde_json::json!([]),
            Value::from(1)
        ])
        .prop_map(|v| serde_json::json!({"attributes": v})),
    ]
    .boxed()
}

/// A proxy update with one thing wrong (and possibly a valid change beside it, which must not
/// be applied either: an update is all or nothing).
fn bad_proxy_update() -> BoxedStrategy<Value> {
    let wrong = prop_oneof![
        (
            proptest::sample::select(vec!["listen", "upstream"]),
            bad_address()
        )
            .prop_map(|(f, a)| (f, Value::from(a))),
        (
            proptest::sample::select(vec!["listen", "upstream", "enabled"]),
            proptest::sample::select(vec![
                Value::from(1),
                serde_json::json!([]),
                serde_json::json!({})
            ])
        ),
        Just(("enabled", Value::from("false"))),
    ];
    (wrong, any::<bool>())
        .prop_map(|((field, value), also_disable)| {
            let mut update = serde_json::json!({field: value});
            if also_disable && field != "enabled" {
                update["enabled"] = Value::from(false);
            }
            update
        })
        .boxed()
}

/// Every route of the API and the methods it takes, `{p}`/`{t}` for a proxy and a toxic.
const API_ROUTES: &[(&str, &[&str])] = &[
    ("/version", &["GET", "HEAD"]),
    ("/reset", &["POST"]),
    ("/populate", &["POST"]),
    ("/proxies", &["GET", "HEAD", "POST"]),
    ("/proxies/{p}", &["GET", "HEAD", "POST", "PATCH", "DELETE"]),
    ("/proxies/{p}/toxics", &["GET", "HEAD", "POST"]),
    (
        "/proxies/{p}/toxics/{t}",
        &["GET", "HEAD", "POST", "PATCH", "DELETE"],
    ),
];

fn api_known(path: &str) -> bool {
    let got: Vec<&str> = path.split('/').collect();
    API_ROUTES.iter().any(|(route, _)| {
        let want: Vec<&str> = route.split('/').collect();
        want.len() == got.len()
            && want
                .iter()
                .zip(&got)
                .all(|(w, g)| w == g || (w.starts_with('{') && !g.is_empty()))
    })
}

fn api_requests() -> BoxedStrategy<Req> {
    let json_req = |method: &'static str, path: String, body: Vec<u8>| {
        let mut req = Req::new(method, &path).header("Content-Type", "application/json");
        req.body = body;
        req
    };
    let text = |v: Value| v.to_string().into_bytes();
    let update_methods = || proptest::sample::select(vec!["POST", "PATCH"]);
    let any_body = || {
        prop_oneof![
            not_json(),
            not_an_object(),
            Just(br#"{"type":"latency","attributes":{"latency":1}}"#.to_vec()),
        ]
    };
    let unknown_path = (
        proptest::sample::select(METHODS),
        proptest::string::string_regex("(/[a-z0-9%._-]{1,10}){1,4}/?")
            .expect("a regex")
            .prop_filter("unknown", |p| !api_known(p)),
    )
        .prop_map(move |(m, p)| json_req(m, p, Vec::new()));
    let wrong_method = proptest::sample::select(API_ROUTES).prop_flat_map(move |(route, taken)| {
        let path = route.replace("{p}", VICTIM).replace("{t}", TOXIC);
        let others: Vec<&'static str> = METHODS
            .iter()
            .copied()
            .filter(|m| !taken.contains(m))
            .collect();
        proptest::sample::select(others).prop_map(move |m| json_req(m, path.clone(), Vec::new()))
    });
    let unknown_proxy = (
        proptest::sample::select(vec![
            ("GET", "/proxies/{p}"),
            ("POST", "/proxies/{p}"),
            ("PATCH", "/proxies/{p}"),
            ("DELETE", "/proxies/{p}"),
            ("GET", "/proxies/{p}/toxics"),
            ("POST", "/proxies/{p}/toxics"),
            ("GET", "/proxies/{p}/toxics/{t}"),
            ("POST", "/proxies/{p}/toxics/{t}"),
            ("DELETE", "/proxies/{p}/toxics/{t}"),
        ]),
        unknown_name(),
        prop_oneof![Just(TOXIC.to_string()), unknown_name()],
        any_body(),
    )
        .prop_map(move |((m, route), p, t, body)| {
            json_req(m, route.replace("{p}", &p).replace("{t}", &t), body)
        });
    let unknown_toxic = (
        proptest::sample::select(vec!["GET", "POST", "PATCH", "DELETE"]),
        unknown_name(),
        any_body(),
    )
        .prop_map(move |(m, t, body)| json_req(m, format!("/proxies/{VICTIM}/toxics/{t}"), body));
    let create_proxy = prop_oneof![
        not_json(),
        not_an_object(),
        bad_proxy(true).prop_map(text),
        // Over the body limit.
        Just(format!("{{\"name\":\"big\"{}}}", " ".repeat(BODY_LIMIT + 1024)).into_bytes()),
    ]
    .prop_map(move |body| json_req("POST", "/proxies".into(), body));
    let populate = prop_oneof![
        not_json(),
        Just(b"{}".to_vec()),
        Just(b"\"x\"".to_vec()),
        // The first proxy is wrong, so nothing may be applied.
        (bad_proxy(false), proptest::option::of(unknown_name())).prop_map(|(bad, next)| {
            let mut list = vec![bad];
            if let Some(name) = next {
                list.push(
                    serde_json::json!({"name": name, "listen": "127.0.0.1:0", "upstream": "127.0.0.1:9"}),
                );
            }
            Value::from(list).to_string().into_bytes()
        }),
        // One name twice.
        unknown_name().prop_map(|name| {
            let p = serde_json::json!({"name": name, "listen": "127.0.0.1:0", "upstream": "127.0.0.1:9"});
            Value::from(vec![p.clone(), p]).to_string().into_bytes()
        }),
    ]
    .prop_map(move |body| json_req("POST", "/populate".into(), body));
    let update_proxy = (
        update_methods(),
        prop_oneof![
            not_json(),
            not_an_object(),
            bad_proxy_update().prop_map(text)
        ],
    )
        .prop_map(move |(m, body)| json_req(m, format!("/proxies/{VICTIM}"), body));
    let create_toxic = prop_oneof![not_json(), not_an_object(), bad_toxic().prop_map(text)]
        .prop_map(move |body| json_req("POST", format!("/proxies/{VICTIM}/toxics"), body));
    let update_toxic = (
        update_methods(),
        prop_oneof![
            not_json(),
            not_an_object(),
            bad_toxic_update().prop_map(text)
        ],
    )
        .prop_map(move |(m, body)| json_req(m, format!("/proxies/{VICTIM}/toxics/{TOXIC}"), body));
    prop_oneof![
        1 => unknown_path,
        1 => wrong_method,
        2 => unknown_proxy,
        1 => unknown_toxic,
        3 => create_proxy,
        2 => populate,
        3 => update_proxy,
        3 => create_toxic,
        3 => update_toxic,
    ]
    .boxed()
}

#[test]
fn the_toxiproxy_api_refuses_hostile_requests_with_a_json_4xx_and_changes_nothing() {
    let rt = runtime();
    let tasks = TaskTracker::new();
    let (faults, api) = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let api = listener.local_addr().expect("an address");
        let faults =
            lab_services::faults::Faults::embedded_on(listener, "", &tasks).expect("the API");
        let create = |path: &str, body: Value| {
            let mut req = Req::new("POST", path).header("Content-Type", "application/json");
            req.body = body.to_string().into_bytes();
            req
        };
        let victim =
            serde_json::json!({"name": VICTIM, "listen": "127.0.0.1:0", "upstream": "127.0.0.1:9"});
        let toxic =
            serde_json::json!({"name": TOXIC, "type": "latency", "attributes": {"latency": 10}});
        for (path, body) in [
            ("/proxies".to_string(), victim),
            (format!("/proxies/{VICTIM}/toxics"), toxic),
        ] {
            let answer = send(api, &create(&path, body)).await.expect("an answer");
            assert!(answer.status < 300, "{path}: {answer:?}");
        }
        (faults, api)
    });
    hostile(
        "toxiproxy",
        &rt,
        api,
        api_requests(),
        Box::new(|| Box::pin(async move { read_json(api, "/proxies").await })),
    );
    let version = rt.block_on(read_json(api, "/version"));
    assert!(version["version"].is_string(), "still serving: {version}");
    rt.block_on(faults.release());
}
