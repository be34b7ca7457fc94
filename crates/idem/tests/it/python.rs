//! Wire compatibility with the Python library itself: idempotency-kit 0.4.1 and this crate share
//! one throwaway Redis and replay each other's results, honour each other's reservations, agree
//! on fingerprints and on which keys are valid.
//!
//! The test is ignored by default (it needs a Python venv with the library); `.ci/run` creates
//! the venv and runs it with
//!
//! ```text
//! IDEM_PYTHON=target/idem-py/bin/python cargo test -p idem --test it python:: -- --ignored
//! ```
//!
//! The Python side is `tests/python/peer.py`.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem::{Coordinator, Error, InFlight, Policy, Request, Source, fingerprint_of};
use serde_json::{Value, json};
use support::*;
use tokio::sync::Notify;

const HOUR: Duration = Duration::from_secs(3600);
const PREFIX: &str = idem::DEFAULT_PREFIX;

/// idempotency-kit, run through `peer.py` by the venv's interpreter.
struct Python {
    interpreter: String,
    url: String,
}

impl Python {
    fn from_env(redis: &RedisServer) -> Python {
        let interpreter = std::env::var("IDEM_PYTHON").expect(
            "IDEM_PYTHON must name a python with idempotency-kit[redis]==0.4.1, e.g. \
             `python3 -m venv target/idem-py && target/idem-py/bin/pip install 'idempotency-kit[redis]==0.4.1'` \
             then IDEM_PYTHON=target/idem-py/bin/python (.ci/run does this)",
        );
        Python {
            interpreter,
            url: redis.url(),
        }
    }

    async fn run(&self, args: &[&str], stdin: Option<&str>) -> Value {
        use tokio::io::AsyncWriteExt;
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/peer.py");
        let mut child = tokio::process::Command::new(&self.interpreter)
            .arg(script)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the IDEM_PYTHON interpreter starts");
        let mut input = child.stdin.take().unwrap();
        input
            .write_all(stdin.unwrap_or("").as_bytes())
            .await
            .unwrap();
        drop(input);
        let output = child.wait_with_output().await.unwrap();
        assert!(
            output.status.success(),
            "peer.py {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).unwrap()
    }

    /// `coordinate()` in raise mode with an action returning `result`.
    async fn coordinate(
        &self,
        operation: &str,
        key: &str,
        ttl: u64,
        fingerprint: Option<&str>,
        result: &Value,
    ) -> Value {
        let ttl = ttl.to_string();
        let result = result.to_string();
        let args = [
            "coordinate",
            &self.url,
            PREFIX,
            operation,
            key,
            &ttl,
            fingerprint.unwrap_or("-"),
            &result,
        ];
        self.run(&args, None).await
    }

    /// A pending reservation written by Python, left in place.
    async fn reserve(&self, operation: &str, key: &str, fingerprint: Option<&str>) {
        let args = [
            "reserve",
            &self.url,
            PREFIX,
            operation,
            key,
            "30",
            fingerprint.unwrap_or("-"),
        ];
        assert_eq!(self.run(&args, None).await, json!({"reserved": true}));
    }
}

fn never(_: idem::Fence) -> std::future::Ready<Result<Value, String>> {
    panic!("this call must replay, not run the action")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "drives the Python idempotency-kit 0.4.1: set IDEM_PYTHON to a venv's python (.ci/run does)"]
async fn python_and_rust_replay_each_other() {
    let redis = RedisServer::start();
    let mut inspector = redis.inspector().await;
    let python = Python::from_env(&redis);
    let compatible = Coordinator::new(
        redis.manager(),
        Policy::compatible().in_flight(InFlight::Raise),
    );
    let hardened = Coordinator::new(
        redis.manager(),
        Policy::hardened().in_flight(InFlight::Raise),
    );
    let fingerprint =
        fingerprint_of(&json!({"order_id": "o-1", "amount": 1990, "currency": "RUB"}));
    let other = fingerprint_of(&json!({"order_id": "o-1", "amount": 2990, "currency": "RUB"}));
    let request = |key| Request::new("payment.charge", key, HOUR).fingerprint(&fingerprint);

    // Python writes, Rust replays (both policies), without running its action.
    let charge = json!({"charge_id": "ch_1", "amount": 1990, "by": "python"});
    let written = python
        .coordinate("payment.charge", "py-1", 3600, Some(&fingerprint), &charge)
        .await;
    assert_eq!(written, json!({"value": charge, "action_runs": 1}));
    for coordinator in [&compatible, &hardened] {
        let replay = coordinator
            .coordinate(request("py-1"), never)
            .await
            .unwrap();
        assert!(matches!(replay.source, Source::Replayed));
        assert_eq!(replay.value, charge);
    }
    let reused = compatible
        .coordinate(
            Request::new("payment.charge", "py-1", HOUR).fingerprint(&other),
            never,
        )
        .await
        .unwrap_err();
    assert!(matches!(reused, Error::KeyReused { .. }));

    // A padded key: Python stores it trimmed, and we find it for the same padded key.
    python
        .coordinate("payment.charge", " py-2 ", 3600, None, &charge)
        .await;
    let padded = compatible
        .coordinate(Request::new("payment.charge", " py-2 ", HOUR), never)
        .await
        .unwrap();
    assert!(matches!(padded.source, Source::Replayed));

    // Rust writes (both policies), Python replays without running its action.
    for (coordinator, key) in [(&compatible, "rs-1"), (&hardened, "rs-2")] {
        let ours = json!({"charge_id": key, "amount": 1990, "by": "rust"});
        let value = ours.clone();
        let done = coordinator
            .coordinate(request(key), |_| async move { Ok::<_, String>(value) })
            .await
            .unwrap();
        assert!(matches!(done.source, Source::Ran));
        let replayed = python
            .coordinate(
                "payment.charge",
                key,
                3600,
                Some(&fingerprint),
                &json!("python ran"),
            )
            .await;
        assert_eq!(replayed, json!({"value": ours, "action_runs": 0}), "{key}");
        let refused = python
            .coordinate(
                "payment.charge",
                key,
                3600,
                Some(&other),
                &json!("python ran"),
            )
            .await;
        assert_eq!(
            refused,
            json!({"error": "IdempotencyKeyReuseError", "action_runs": 0})
        );
    }

    // Python's reservation stops Rust ...
    python
        .reserve("payment.charge", "py-pending", Some(&fingerprint))
        .await;
    for coordinator in [&compatible, &hardened] {
        let busy = coordinator
            .coordinate(request("py-pending"), never)
            .await
            .unwrap_err();
        assert!(matches!(busy, Error::InProgress { .. }));
    }

    // ... and Rust's (with the hardened fields, too) stops Python; then Python replays its result.
    for (coordinator, key) in [(&compatible, "rs-pending-1"), (&hardened, "rs-pending-2")] {
        let (started, finish) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let runs = Arc::new(AtomicUsize::new(0));
        let holder = {
            let (coordinator, started, finish, runs) = (
                coordinator.clone(),
                started.clone(),
                finish.clone(),
                runs.clone(),
            );
            let key = key.to_owned();
            let fingerprint = fingerprint.clone();
            tokio::spawn(async move {
                let request = Request::new("payment.charge", &key, HOUR).fingerprint(&fingerprint);
                coordinator
                    .coordinate(request, |_| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        started.notify_one();
                        finish.notified().await;
                        Ok::<_, String>(json!({"charge_id": "held", "by": "rust"}))
                    })
                    .await
            })
        };
        started.notified().await;
        let busy = python
            .coordinate(
                "payment.charge",
                key,
                3600,
                Some(&fingerprint),
                &json!("python ran"),
            )
            .await;
        assert_eq!(
            busy,
            json!({"error": "IdempotencyInProgressError", "action_runs": 0}),
            "{key}"
        );
        finish.notify_one();
        within(holder).await.unwrap();
        let replayed = python
            .coordinate(
                "payment.charge",
                key,
                3600,
                Some(&fingerprint),
                &json!("python ran"),
            )
            .await;
        assert_eq!(
            replayed,
            json!({"value": {"charge_id": "held", "by": "rust"}, "action_runs": 0})
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    // Both round a 90 s TTL down to the same whole minute.
    python
        .coordinate("payment.charge", "ttl-py", 90, None, &charge)
        .await;
    compatible
        .coordinate(
            Request::new("payment.charge", "ttl-rs", Duration::from_secs(90)),
            |_| async { Ok::<_, String>(json!(1)) },
        )
        .await
        .unwrap();
    for key in [
        "idempotency:payment.charge:ttl-py",
        "idempotency:payment.charge:ttl-rs",
    ] {
        let left: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut inspector)
            .await
            .unwrap();
        assert!(left <= 60_000 && left > 58_000, "{key}: PTTL {left}");
    }
}

#[tokio::test]
#[ignore = "drives the Python idempotency-kit 0.4.1: set IDEM_PYTHON to a venv's python (.ci/run does)"]
async fn fingerprints_equal_pythons() {
    let redis = RedisServer::start();
    let python = Python::from_env(&redis);
    let theirs = python.run(&["fingerprints"], None).await;

    // The same values as `VECTORS` in peer.py, as their JSON forms (a UUID and a Decimal are
    // strings, a tuple an array), with the names in other orders than Python's.
    let ours = json!({
        "empty": {},
        "payment": {"currency": "RUB", "amount": 1990, "order_id": "0b5e6a2c-1f0e-4d55-9a43-5d6a1c1f0e2b"},
        "int": {"a": 1},
        "float": {"a": 1.0},
        "floats": {
            "whole": 1e15, "tiny": 1e-05, "small": 0.0001, "third": 0.1 + 0.2, "big": 1e16,
            "bigger": 1.5e300, "neg_zero": -0.0, "subnormal": 5e-324, "neg": -2.5e-07,
        },
        "nested": {
            "list_of_maps": [{"b": 1, "a": 2}],
            "outer": {"a": false, "z": {"b": 2, "a": [1, {"y": null, "x": true}]}},
        },
        "unicode": {
            "labels": {"\u{2028}": "\u{0}\u{1f}\u{7f}\t", "ключ": "значение", "é": "e\u{301}"},
            "name": "Ёжик \"в\" тумане\n😀\\",
        },
        "list_and_tuple": {"pair": [1, "two"], "items": [1, 2, 3], "empty_map": {}, "empty_list": []},
        "decimal": {"total": "19.90", "one": "1.0"},
        "big": {"neg": i64::MIN, "n": 9_223_372_036_854_775_808u64},
        "email": {"email": "a@example.com"},
    });
    let ours = ours.as_object().unwrap();
    let theirs = theirs.as_object().unwrap();
    assert_eq!(ours.len(), theirs.len(), "the two vector lists are in step");
    for (name, values) in ours {
        assert_eq!(
            Value::String(fingerprint_of(values)),
            theirs[name],
            "{name}: we hash {}",
            idem::canonical_json(values)
        );
    }
}

#[tokio::test]
#[ignore = "drives the Python idempotency-kit 0.4.1: set IDEM_PYTHON to a venv's python (.ci/run does)"]
async fn key_rules_equal_pythons() {
    let redis = RedisServer::start();
    let python = Python::from_env(&redis);
    let long = "k".repeat(255);
    let too_long = "k".repeat(256);
    let wide = "é".repeat(255);
    let long_operation = "o".repeat(101);
    let pairs = [
        ["op", " k1 "],
        ["op", "\u{a0}k\u{85}"],
        ["op", "\u{3000}k\u{2028}"],
        ["op", "\u{1c}k\u{1f}"],
        ["op", "\u{200b}k"],
        ["op", "a\nb"],
        ["op", ""],
        ["op", "   "],
        ["op", "a:b"],
        ["op", long.as_str()],
        ["op", too_long.as_str()],
        ["op", wide.as_str()],
        [long_operation.as_str(), "k"],
        [" op\t", "k"],
        ["op:x", "k"],
        ["", "k"],
    ];
    let theirs = python
        .run(&["identifiers"], Some(&json!(pairs).to_string()))
        .await;
    let ours: Vec<Value> = pairs
        .iter()
        .map(|[operation, key]| match idem::validate(operation, key) {
            Ok(ids) => json!([ids.operation, ids.key]),
            Err(_) => Value::Null,
        })
        .collect();
    assert_eq!(Value::Array(ours), theirs);
}
