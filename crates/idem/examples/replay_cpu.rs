//! How much CPU the coordinator itself spends on a replay, with the network taken away.
//!
//! `lab bench coordinator` measures idem against a bare Redis client over a real connection;
//! the difference between them is idem's own work per call. This example isolates that work: the
//! "connection" answers every command at once with a stored record, so each `coordinate()` is a
//! replay whose only cost is the coordinator's (validate the key, build the pending record for
//! the reserve-or-read, parse the stored record, check the fingerprint, decode the result; with
//! the hardened policy also a fresh owner token).
//!
//! ```sh
//! cargo run --release -p idem --example replay_cpu
//! ```
//!
//! The per-command timeout costs little here (its future is ready at once, so no timer is
//! registered); over a real connection each command also registers and clears a timer.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use idem::{Coordinator, Policy, Request};
use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// A stand-in for Redis that answers every command with the same stored, completed record.
#[derive(Clone)]
struct Stored(Vec<u8>);

impl ConnectionLike for Stored {
    fn req_packed_command<'a>(&'a mut self, _cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let reply = Value::BulkString(self.0.clone());
        Box::pin(async move { Ok(reply) })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        _pipeline: &'a Pipeline,
        _offset: usize,
        _count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move { Ok(Vec::new()) })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// Calls per measurement, after as many not counted.
const CALLS: u32 = 200_000;

#[tokio::main]
async fn main() {
    let record = br#"{"operation":"bench.replay","idempotency_key":"stored","result":{"n":0},"created_at":"2026-11-30T12:00:00.123456Z","expires_at":"2026-11-30T13:00:00.123456Z","status":"completed","fingerprint":null}"#;
    for (name, policy) in [
        ("compatible", Policy::compatible()),
        ("hardened", Policy::hardened()),
    ] {
        let coordinator = Coordinator::new(Stored(record.to_vec()), policy);
        let request = Request::new("bench.replay", "stored", Duration::from_secs(3600));
        let mut per_call = Duration::ZERO;
        for _warm_then_measure in 0..2 {
            let started = Instant::now();
            for _ in 0..CALLS {
                let replayed = coordinator
                    .coordinate(request, |_| async {
                        Ok::<_, Infallible>(serde_json::json!({"n": 1}))
                    })
                    .await
                    .expect("a stored record replays");
                std::hint::black_box(replayed);
            }
            per_call = started.elapsed() / CALLS;
        }
        println!(
            "{name:<10} {:.2} µs of CPU per replay",
            per_call.as_secs_f64() * 1e6
        );
    }
}
