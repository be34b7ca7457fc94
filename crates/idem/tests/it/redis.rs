//! The coordinator against a real Redis: each test starts its own throwaway `redis-server`.
//!
//! Interleavings are forced with notifications (an action that waits until the test lets it
//! finish), never with sleeps. Lease expiry is simulated by shortening the record's PTTL, except
//! where a real lease running out is the point; then only lower bounds on time are asserted.

use crate::support;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem::{
    Coordinator, Error, EventKind, Fence, InFlight, Ownership, Policy, Request, Source, Stage,
    StorageCause, Unprotected,
};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use serde_json::{Value, json};
use support::*;
use tokio::sync::Notify;

const HOUR: Duration = Duration::from_secs(3600);

type Action = Pin<Box<dyn Future<Output = Result<Value, String>> + Send>>;

/// An action that counts its runs and returns `value` with the fence it was given.
fn counted(runs: &Arc<AtomicUsize>, value: Value) -> impl FnOnce(Fence) -> Action + Send + use<> {
    let runs = runs.clone();
    move |fence| {
        runs.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move { Ok(json!({"value": value, "fence": fence.token})) })
    }
}

/// An action that counts its runs and fails.
fn failing(runs: &Arc<AtomicUsize>) -> impl FnOnce(Fence) -> Action + Send + use<> {
    let runs = runs.clone();
    move |_| {
        runs.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Err("declined".to_owned()) })
    }
}

/// An action that must not run.
fn never() -> impl FnOnce(Fence) -> Action + Send + use<> {
    |_| Box::pin(async { panic!("this call must not run the action") })
}

/// Lets a test hold an action inside its run: it reports `started`, then waits for `finish`.
#[derive(Clone, Default)]
struct Hold {
    started: Arc<Notify>,
    finish: Arc<Notify>,
}

impl Hold {
    fn action(
        &self,
        runs: &Arc<AtomicUsize>,
        value: Value,
        outcome: Result<(), String>,
    ) -> impl FnOnce(Fence) -> Action + Send + use<> {
        let (hold, runs) = (self.clone(), runs.clone());
        move |fence| {
            runs.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                hold.started.notify_one();
                hold.finish.notified().await;
                outcome.map(|()| json!({"value": value, "fence": fence.token}))
            })
        }
    }
}

/// Collects the observer's events as short labels.
#[derive(Clone, Default)]
struct Journal(Arc<Mutex<Vec<String>>>);

impl Journal {
    fn observe<C>(&self, coordinator: Coordinator<C>) -> Coordinator<C>
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        let journal = self.0.clone();
        coordinator.with_observer(move |event| {
            let label = match event.kind {
                EventKind::Reserved { fence } => format!("reserved {fence:?}"),
                EventKind::Replayed => "replayed".to_owned(),
                EventKind::InFlight => "in flight".to_owned(),
                EventKind::WaitTimedOut => "wait timed out".to_owned(),
                EventKind::KeyReused => "key reused".to_owned(),
                EventKind::Renewed { .. } => "renewed".to_owned(),
                EventKind::Completed { fence } => format!("completed {fence:?}"),
                EventKind::Released { fence } => format!("released {fence:?}"),
                EventKind::LeaseLost { stage, fence } => {
                    format!("lease lost at {stage:?} {fence:?}")
                }
                EventKind::Superseded => "superseded".to_owned(),
                EventKind::StorageError { error } => format!("storage error at {:?}", error.stage),
                EventKind::Resent { stage } => format!("resent at {stage:?}"),
                EventKind::RanUnprotected { why } => format!("unprotected: {why}"),
            };
            journal.lock().unwrap().push(label);
        })
    }

    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

async fn get(inspector: &mut MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query_async(inspector)
        .await
        .unwrap()
}

async fn pttl(inspector: &mut MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(inspector)
        .await
        .unwrap()
}

/// "Simulated time": the lease runs out now instead of in 30 s.
async fn expire_now(inspector: &mut MultiplexedConnection, key: &str) {
    let _: () = redis::cmd("PEXPIRE")
        .arg(key)
        .arg(1)
        .query_async(inspector)
        .await
        .unwrap();
    while get(inspector, key).await.is_some() {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn dbsize(inspector: &mut MultiplexedConnection) -> i64 {
    redis::cmd("DBSIZE").query_async(inspector).await.unwrap()
}

// ---- The record and the round trips ------------------------------------------------------------

#[tokio::test]
async fn compatible_writes_the_python_record() {
    let redis = RedisServer::start();
    let mut inspector = redis.inspector().await;
    let coordinator = Coordinator::new(redis.manager(), Policy::compatible());
    let runs = Arc::default();

    let first = coordinator
        .coordinate(Request::new("order.create", "replay-1", HOUR), |_| async {
            Ok::<_, String>(json!({"by": "a", "run": 1}))
        })
        .await
        .unwrap();
    assert!(matches!(first.source, Source::Ran));

    let stored = get(&mut inspector, "idempotency:order.create:replay-1")
        .await
        .unwrap();
    assert!(
        stored.starts_with(
            r#"{"operation":"order.create","idempotency_key":"replay-1","result":{"by":"a","run":1},"created_at":""#
        ),
        "{stored}"
    );
    assert!(
        stored.ends_with(r#"Z","status":"completed","fingerprint":null}"#),
        "{stored}"
    );
    let fields: serde_json::Map<String, Value> = serde_json::from_str(&stored).unwrap();
    let names: Vec<&str> = fields.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "operation",
            "idempotency_key",
            "result",
            "created_at",
            "expires_at",
            "status",
            "fingerprint"
        ]
    );
    // `EX` = the seconds left to `expires_at`: one hour.
    let left = pttl(&mut inspector, "idempotency:order.create:replay-1").await;
    assert!((3_598_000..=3_600_000).contains(&left), "PTTL {left}");

    let replay = coordinator
        .coordinate(
            Request::new("order.create", "replay-1", HOUR),
            counted(&runs, json!(0)),
        )
        .await
        .unwrap();
    assert!(matches!(replay.source, Source::Replayed));
    assert_eq!(replay.value, json!({"by": "a", "run": 1}));
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    let inspected = coordinator
        .read("order.create", " replay-1 ")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(inspected.to_json(), stored);
}

/// The round trips of the crate docs' table, counted on the connection.
#[tokio::test]
async fn round_trips_per_path() {
    let redis = RedisServer::start();
    let conn = Counting::new(redis.manager());
    let runs = Arc::default();
    let request = |key| Request::new("op", key, HOUR);

    // Compatible: plain commands.
    let compatible = Coordinator::new(
        conn.clone(),
        Policy::compatible().in_flight(InFlight::Raise),
    );
    compatible
        .coordinate(request("c1"), counted(&runs, json!(1)))
        .await
        .unwrap();
    assert_eq!(conn.take(), ["SET", "SET"], "new key: SET NX GET, then SET");
    compatible.coordinate(request("c1"), never()).await.unwrap();
    assert_eq!(conn.take(), ["SET"], "replay: one SET NX GET");
    compatible
        .coordinate(request("c2"), failing(&runs))
        .await
        .unwrap_err();
    assert_eq!(
        conn.take(),
        ["SET", "DEL"],
        "action fails: reserve, then DEL"
    );

    let hold = Hold::default();
    let holder = {
        let (compatible, action) = (compatible.clone(), hold.action(&runs, json!(3), Ok(())));
        tokio::spawn(async move { compatible.coordinate(request("c3"), action).await })
    };
    hold.started.notified().await;
    conn.take();
    compatible
        .coordinate(request("c3"), never())
        .await
        .unwrap_err();
    assert_eq!(conn.take(), ["SET"], "pending, raise mode: one trip");
    hold.finish.notify_one();
    within(holder).await.unwrap();
    conn.take();

    // Hardened: one script per step. The very first use of a script costs two more trips, once.
    let hardened = Coordinator::new(conn.clone(), Policy::hardened());
    hardened
        .coordinate(request("h1"), counted(&runs, json!(1)))
        .await
        .unwrap();
    assert_eq!(
        conn.take(),
        [
            "EVALSHA", "SCRIPT", "EVALSHA", "EVALSHA", "SCRIPT", "EVALSHA"
        ],
        "first use: NOSCRIPT, SCRIPT LOAD, EVALSHA for reserve.lua and for complete.lua"
    );
    hardened
        .coordinate(request("h2"), counted(&runs, json!(2)))
        .await
        .unwrap();
    assert_eq!(
        conn.take(),
        ["EVALSHA", "EVALSHA"],
        "new key: reserve.lua, complete.lua"
    );
    hardened.coordinate(request("h2"), never()).await.unwrap();
    assert_eq!(conn.take(), ["EVALSHA"], "replay: one reserve.lua");
    hardened
        .coordinate(request("h3"), failing(&runs))
        .await
        .unwrap_err();
    assert_eq!(
        conn.take(),
        ["EVALSHA", "EVALSHA", "SCRIPT", "EVALSHA"],
        "reserve.lua, release.lua (first use)"
    );
    hardened
        .coordinate(request("h4"), failing(&runs))
        .await
        .unwrap_err();
    assert_eq!(
        conn.take(),
        ["EVALSHA", "EVALSHA"],
        "action fails: reserve.lua, release.lua"
    );

    // Run mode: no reservation.
    let run_mode = Coordinator::new(conn.clone(), Policy::compatible().in_flight(InFlight::Run));
    run_mode
        .coordinate(request("r1"), counted(&runs, json!(1)))
        .await
        .unwrap();
    assert_eq!(conn.take(), ["GET", "SET"], "new key: GET, then SET NX GET");
    run_mode.coordinate(request("r1"), never()).await.unwrap();
    assert_eq!(conn.take(), ["GET"], "replay: one GET");
}

// ---- 100 concurrent calls with one key ---------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_concurrent_calls_raise_compatible() {
    let redis = RedisServer::start();
    hundred_concurrent_raise(redis.manager(), Policy::compatible(), "k-raise").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_concurrent_calls_raise_hardened_on_a_multiplexed_connection() {
    let redis = RedisServer::start();
    hundred_concurrent_raise(redis.inspector().await, Policy::hardened(), "k-raise").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_concurrent_calls_wait_compatible() {
    let redis = RedisServer::start();
    hundred_concurrent_wait(redis.manager(), Policy::compatible(), "k-wait").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_concurrent_calls_wait_hardened() {
    let redis = RedisServer::start();
    hundred_concurrent_wait(redis.manager(), Policy::hardened(), "k-wait").await;
}

// ---- Failures, fingerprints, keys --------------------------------------------------------------

#[tokio::test]
async fn a_failed_action_releases_the_key_and_the_retry_runs() {
    let redis = RedisServer::start();
    let mut inspector = redis.inspector().await;
    for policy in [Policy::compatible(), Policy::hardened()] {
        let coordinator = Coordinator::new(redis.manager(), policy.clone());
        let key = format!("{:?}", policy.ownership);
        let runs = Arc::default();
        let failed = coordinator
            .coordinate(Request::new("op", &key, HOUR), failing(&runs))
            .await
            .unwrap_err();
        assert!(matches!(failed, Error::Action(ref message) if message == "declined"));
        assert_eq!(
            get(&mut inspector, &coordinator.record_key("op", &key)).await,
            None
        );

        let retry = coordinator
            .coordinate(Request::new("op", &key, HOUR), counted(&runs, json!("ok")))
            .await
            .unwrap();
        assert!(matches!(retry.source, Source::Ran));
        assert_eq!(runs.load(Ordering::SeqCst), 2, "{policy:?}");
    }
}

#[tokio::test]
async fn the_same_key_with_another_request_is_refused_even_while_pending() {
    let redis = RedisServer::start();
    let coordinator = Coordinator::new(redis.manager(), Policy::compatible());
    let runs = Arc::default();
    let request = |fingerprint| Request::new("payment.charge", "K1", HOUR).fingerprint(fingerprint);

    coordinator
        .coordinate(request("fp-a"), counted(&runs, json!("charge-1")))
        .await
        .unwrap();
    let changed = coordinator
        .coordinate(request("fp-b"), never())
        .await
        .unwrap_err();
    assert!(matches!(changed, Error::KeyReused { ref key, .. } if key == "K1"));
    // Without a fingerprint on one side, the key alone decides.
    let keyless = coordinator
        .coordinate(Request::new("payment.charge", "K1", HOUR), never())
        .await
        .unwrap();
    assert!(matches!(keyless.source, Source::Replayed));
    assert!(matches!(
        coordinator
            .coordinate(request("fp-a"), never())
            .await
            .unwrap()
            .source,
        Source::Replayed
    ));

    // A waiter with another fingerprint is refused at once, not after the holder finishes.
    let hold = Hold::default();
    let holder = {
        let (coordinator, action) = (coordinator.clone(), hold.action(&runs, json!(2), Ok(())));
        tokio::spawn(async move {
            let request = Request::new("payment.charge", "K2", HOUR).fingerprint("fp-a");
            coordinator.coordinate(request, action).await
        })
    };
    hold.started.notified().await;
    let waiter = coordinator
        .coordinate(
            Request::new("payment.charge", "K2", HOUR).fingerprint("fp-b"),
            never(),
        )
        .await
        .unwrap_err();
    assert!(matches!(waiter, Error::KeyReused { .. }));
    hold.finish.notify_one();
    within(holder).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn invalid_keys_run_unprotected_when_compatible_and_are_refused_when_hardened() {
    let redis = RedisServer::start();
    let mut inspector = redis.inspector().await;
    let long = "k".repeat(256);
    let invalid = [
        ("op", ""),
        ("op", "   "),
        ("op", "a:b"),
        ("op", long.as_str()),
        ("op:x", "k"),
    ];

    let compatible = Coordinator::new(redis.manager(), Policy::compatible());
    for (operation, key) in invalid {
        let runs = Arc::default();
        for _retry in 0..2 {
            let done = compatible
                .coordinate(
                    Request::new(operation, key, HOUR),
                    counted(&runs, json!("charged")),
                )
                .await
                .unwrap();
            assert!(matches!(
                done.source,
                Source::Unprotected(Unprotected::InvalidKey(_))
            ));
        }
        // The lab's `invalid_key_unguarded_charges` = 2: a retried call charges again.
        assert_eq!(runs.load(Ordering::SeqCst), 2, "{key:?}");
    }
    assert_eq!(dbsize(&mut inspector).await, 0, "nothing was stored");

    let hardened = Coordinator::new(redis.manager(), Policy::hardened());
    for (operation, key) in invalid {
        let refused = hardened
            .coordinate(Request::new(operation, key, HOUR), never())
            .await
            .unwrap_err();
        assert!(matches!(refused, Error::Invalid(_)), "{key:?}");
    }
    assert_eq!(dbsize(&mut inspector).await, 0);
}

#[tokio::test]
async fn padded_keys_are_trimmed_on_every_path() {
    let redis = RedisServer::start();
    let mut inspector = redis.inspector().await;
    let coordinator = Coordinator::new(
        redis.manager(),
        Policy::compatible().in_flight(InFlight::Raise),
    );
    let runs = Arc::default();

    coordinator
        .coordinate(
            Request::new(" op ", " k1 ", HOUR),
            counted(&runs, json!("a")),
        )
        .await
        .unwrap();
    assert_eq!(coordinator.record_key(" op ", " k1 "), "idempotency:op:k1");
    assert!(
        get(&mut inspector, "idempotency:op:k1")
            .await
            .unwrap()
            .contains(r#""idempotency_key":"k1""#)
    );
    for key in [" k1 ", "k1", "\tk1\n"] {
        let started = Instant::now();
        let replay = coordinator
            .coordinate(Request::new("op", key, HOUR), never())
            .await
            .unwrap();
        assert!(matches!(replay.source, Source::Replayed), "{key:?}");
        // idempotency-kit spins for a whole lease here; we replay at once (generous bound).
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    // A padded failing call releases the trimmed key.
    coordinator
        .coordinate(Request::new("op", " k2 ", HOUR), failing(&runs))
        .await
        .unwrap_err();
    assert_eq!(get(&mut inspector, "idempotency:op:k2").await, None);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn an_unusable_record_is_replaced_when_failing_open_and_refused_when_failing_closed() {
    let redis = RedisServer::start();
    let mut inspector = redis.inspector().await;
    let runs = Arc::default();
    for key in ["idempotency:op:garbage", "idempotency:op:garbage-2"] {
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg("not a record")
            .query_async(&mut inspector)
            .await
            .unwrap();
    }

    let compatible = Coordinator::new(redis.manager(), Policy::compatible());
    let done = compatible
        .coordinate(
            Request::new("op", "garbage", HOUR),
            counted(&runs, json!("fresh")),
        )
        .await
        .unwrap();
    assert!(matches!(
        done.source,
        Source::Unprotected(Unprotected::UnusableRecord(_))
    ));
    // As idempotency-kit: our result replaced the record, so the next retry replays it.
    let replay = compatible
        .coordinate(Request::new("op", "garbage", HOUR), never())
        .await
        .unwrap();
    assert!(matches!(replay.source, Source::Replayed));
    assert_eq!(replay.value, done.value);

    let hardened = Coordinator::new(redis.manager(), Policy::hardened());
    let refused = hardened
        .coordinate(Request::new("op", "garbage-2", HOUR), never())
        .await
        .unwrap_err();
    assert!(matches!(
        refused,
        Error::Storage(idem::StorageError {
            stage: Stage::Reserve,
            cause: StorageCause::Corrupt(_)
        })
    ));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

// ---- TTLs --------------------------------------------------------------------------------------

#[tokio::test]
async fn compatible_ttls_are_whole_minutes_as_in_the_reference_table() {
    let redis = RedisServer::start();
    let mut inspector = redis.inspector().await;
    let coordinator = Coordinator::new(redis.manager(), Policy::compatible());
    let runs = Arc::default();
    // Section 10 of the reference: requested seconds -> Redis TTL seconds.
    let table = [
        (3600, 3600),
        (90, 60),
        (30, 60),
        (59, 60),
        (60, 60),
        (119, 60),
        (120, 120),
        (0, 60),
        (2_592_000, 2_592_000),
    ];
    for (requested, stored) in table {
        let key = format!("ttl-{requested}");
        let ttl = Duration::from_secs(requested);
        coordinator
            .coordinate(
                Request::new("op", &key, ttl),
                counted(&runs, json!(requested)),
            )
            .await
            .unwrap();
        let left = pttl(&mut inspector, &coordinator.record_key("op", &key)).await;
        let stored_ms = stored * 1000;
        assert!(
            left <= stored_ms && left > stored_ms - 2000,
            "ttl {requested}: PTTL {left}"
        );
    }

    // Over 30 days: the action runs under the reservation, but nothing is stored.
    let done = coordinator
        .coordinate(
            Request::new("op", "ttl-2592060", Duration::from_secs(2_592_060)),
            counted(&runs, json!(0)),
        )
        .await
        .unwrap();
    assert!(matches!(
        done.source,
        Source::Unprotected(Unprotected::TtlOutOfRange { .. })
    ));
    assert_eq!(
        pttl(&mut inspector, "idempotency:op:ttl-2592060").await,
        -2,
        "not stored"
    );
}

#[tokio::test]
async fn hardened_ttls_are_exact() {
    let redis = RedisServer::start();
    let mut inspector = redis.inspector().await;
    let coordinator = Coordinator::new(redis.manager(), Policy::hardened());
    let runs = Arc::default();
    for (key, ttl) in [
        ("ninety", Duration::from_secs(90)),
        ("short", Duration::from_millis(1500)),
    ] {
        coordinator
            .coordinate(Request::new("op", key, ttl), counted(&runs, json!(key)))
            .await
            .unwrap();
        let left = pttl(&mut inspector, &coordinator.record_key("op", key)).await;
        let wanted = ttl.as_millis() as i64;
        assert!(left <= wanted && left > wanted - 2000, "{key}: PTTL {left}");
    }
}

#[tokio::test]
async fn a_result_without_a_json_form_is_returned_but_not_stored() {
    let redis = RedisServer::start();
    let mut inspector = redis.inspector().await;
    for policy in [Policy::compatible(), Policy::hardened()] {
        let coordinator = Coordinator::new(redis.manager(), policy);
        // JSON object keys are strings; serde_json refuses a map keyed by tuples.
        let value = std::collections::BTreeMap::from([((1u8, 2u8), 3u8)]);
        let done = coordinator
            .coordinate(Request::new("op", "unstorable", HOUR), |_| async move {
                Ok::<_, String>(value)
            })
            .await
            .unwrap();
        assert!(matches!(
            done.source,
            Source::Unprotected(Unprotected::UnstorableResult(_))
        ));
        assert_eq!(done.value[&(1, 2)], 3);
        assert_eq!(
            get(&mut inspector, "idempotency:op:unstorable").await,
            None,
            "released"
        );
    }
}

// ---- Leases, owners, fences --------------------------------------------------------------------

/// The reference's `lease-expiry[raise]`: a lapsed lease lets a second call run alongside the
/// first, and the first's plain SET overwrites the second's reservation.
#[tokio::test]
async fn compatible_a_lapsed_lease_runs_twice_and_the_stale_holder_overwrites() {
    let redis = RedisServer::start();
    let mut inspector = redis.inspector().await;
    let coordinator = Coordinator::new(
        redis.manager(),
        Policy::compatible().in_flight(InFlight::Raise),
    );
    let record_key = coordinator.record_key("payment.charge", "K");
    let runs = Arc::default();
    let call = |action| {
        let coordinator = coordinator.clone();
        tokio::spawn(async move {
            coordinator
                .coordinate(Request::new("payment.charge", "K", HOUR), action)
                .await
        })
    };

    let first = Hold::default();
    let a = call(first.action(&runs, json!("A"), Ok(())));
    first.started.notified().await;
    expire_now(&mut inspector, &record_key).await; // A's lease lapses; A is still running

    let second = Hold::default();
    let b = call(second.action(&runs, json!("B"), Ok(())));
    second.started.notified().await;
    assert_eq!(runs.load(Ordering::SeqCst), 2, "two actions run at once");

    first.finish.notify_one();
    assert!(matches!(within(a).await.unwrap().source, Source::Ran));
    // A's plain SET replaced B's reservation: a third caller replays A while B still runs.
    let third = coordinator
        .coordinate(Request::new("payment.charge", "K", HOUR), never())
        .await
        .unwrap();
    assert_eq!(third.value["value"], "A");

    second.finish.notify_one();
    assert!(matches!(within(b).await.unwrap().source, Source::Ran));
    let last = coordinator
        .read("payment.charge", "K")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        last.decode_result::<Value>().unwrap()["value"],
        "B",
        "the last writer wins"
    );
}

/// The same interleaving with owner tokens: the stale holder can neither complete over nor
/// delete the new reservation, and the new holder's fence is larger.
#[tokio::test]
async fn hardened_a_stale_holder_can_neither_complete_nor_release_the_new_reservation() {
    let redis = RedisServer::start();
    let mut inspector = redis.inspector().await;
    let journal = Journal::default();
    // No renewal here: the lapse is simulated, and a renewal would only report the loss earlier.
    let policy = Policy::hardened()
        .in_flight(InFlight::Raise)
        .renew_every(None);
    let coordinator = journal.observe(Coordinator::new(redis.manager(), policy));
    let runs = Arc::default();

    for (key, stale_outcome) in [
        ("complete", Ok(())),
        ("release", Err("declined".to_owned())),
    ] {
        let record_key = coordinator.record_key("payment.charge", key);
        let call = |action| {
            let coordinator = coordinator.clone();
            let key = key.to_owned();
            tokio::spawn(async move {
                coordinator
                    .coordinate(Request::new("payment.charge", &key, HOUR), action)
                    .await
            })
        };
        let stale = Hold::default();
        let a = call(stale.action(&runs, json!("A"), stale_outcome.clone()));
        stale.started.notified().await;
        expire_now(&mut inspector, &record_key).await;

        let fresh = Hold::default();
        let b = call(fresh.action(&runs, json!("B"), Ok(())));
        fresh.started.notified().await;
        let holder = coordinator
            .read("payment.charge", key)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            holder.fence,
            Some(2),
            "the new reservation's fence is larger"
        );

        stale.finish.notify_one();
        match within(a).await {
            Ok(done) => assert!(matches!(
                done.source,
                Source::Unprotected(Unprotected::LeaseLost)
            )),
            Err(error) => assert!(matches!(error, Error::Action(_))),
        }
        // B's reservation is untouched: same owner, still pending; a retry is refused.
        let after = coordinator
            .read("payment.charge", key)
            .await
            .unwrap()
            .unwrap();
        assert!(after.is_pending());
        assert_eq!(after.owner, holder.owner);
        let retry = coordinator
            .coordinate(Request::new("payment.charge", key, HOUR), never())
            .await
            .unwrap_err();
        assert!(matches!(retry, Error::InProgress { .. }));

        fresh.finish.notify_one();
        let done = within(b).await.unwrap();
        assert!(matches!(done.source, Source::Ran));
        assert_eq!(done.value, json!({"value": "B", "fence": 2}));
        let stored = coordinator
            .read("payment.charge", key)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((stored.is_pending(), stored.fence), (false, Some(2)));
    }
    let events = journal.take();
    assert!(
        events.contains(&"lease lost at Complete Some(1)".to_owned()),
        "{events:?}"
    );
    assert!(
        events.contains(&"lease lost at Release Some(1)".to_owned()),
        "{events:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 4);
}

/// A real lease running out: without renewal a second call runs (two charges); with renewal it
/// is refused (one charge). Only lower bounds on time matter here.
#[tokio::test]
async fn renewal_keeps_a_slow_action_reserved_past_its_lease() {
    let redis = RedisServer::start();
    let lease = Duration::from_millis(600);
    for (policy, second_runs) in [
        (Policy::compatible(), true),
        (
            Policy::hardened()
                .lease(lease)
                .renew_every(Some(Duration::from_millis(100))),
            false,
        ),
    ] {
        let journal = Journal::default();
        let policy = policy.in_flight(InFlight::Raise).lease(lease);
        let coordinator = journal.observe(Coordinator::new(redis.manager(), policy.clone()));
        let key = format!("slow-{:?}", policy.ownership);
        let runs = Arc::default();
        let slow = Hold::default();
        let first = {
            let (coordinator, action, key) = (
                coordinator.clone(),
                slow.action(&runs, json!(1), Ok(())),
                key.clone(),
            );
            tokio::spawn(async move {
                coordinator
                    .coordinate(Request::new("op", &key, HOUR), action)
                    .await
            })
        };
        slow.started.notified().await;
        tokio::time::sleep(lease * 2 + lease / 6).await; // the slow action outlives its lease

        let second = coordinator
            .coordinate(Request::new("op", &key, HOUR), counted(&runs, json!(2)))
            .await;
        slow.finish.notify_one();
        within(first).await.unwrap();
        if second_runs {
            assert!(matches!(second.unwrap().source, Source::Ran));
            assert_eq!(runs.load(Ordering::SeqCst), 2, "charges_after_lease_expiry");
        } else {
            assert!(matches!(second.unwrap_err(), Error::InProgress { .. }));
            assert_eq!(runs.load(Ordering::SeqCst), 1, "charges_hardened");
            assert!(journal.take().iter().any(|event| event == "renewed"));
        }
    }
}

#[tokio::test]
async fn fence_tokens_grow_per_key_and_outlive_the_record() {
    let redis = RedisServer::start();
    let mut inspector = redis.inspector().await;
    let coordinator = Coordinator::new(redis.manager(), Policy::hardened());
    let runs = Arc::default();
    let fence_of = |done: &idem::Coordinated<Value>| done.value["fence"].as_u64();

    let first = coordinator
        .coordinate(Request::new("op", "f", HOUR), counted(&runs, json!(1)))
        .await
        .unwrap();
    assert_eq!(fence_of(&first), Some(1));
    let record = coordinator.read("op", "f").await.unwrap().unwrap();
    assert_eq!(record.fence, Some(1));
    assert!(record.owner.is_some());
    let counter = coordinator.fence_key("op", "f");
    assert_eq!(counter, "idempotency:{idempotency:op:f}:fence");
    assert!(
        pttl(&mut inspector, &counter).await
            > pttl(&mut inspector, &coordinator.record_key("op", "f")).await
    );

    // The result expires; the counter does not, so the next holder's token is still larger.
    expire_now(&mut inspector, &coordinator.record_key("op", "f")).await;
    coordinator
        .coordinate(Request::new("op", "f", HOUR), failing(&runs))
        .await
        .unwrap_err();
    let third = coordinator
        .coordinate(Request::new("op", "f", HOUR), counted(&runs, json!(3)))
        .await
        .unwrap();
    assert_eq!(
        fence_of(&third),
        Some(3),
        "a released reservation used token 2"
    );

    let other = coordinator
        .coordinate(Request::new("op", "g", HOUR), counted(&runs, json!(1)))
        .await
        .unwrap();
    assert_eq!(fence_of(&other), Some(1), "counters are per key");
}

/// A holder that crashes (its call dropped mid-action) leaves its reservation: retries get
/// InProgress (the lab's 409) until the lease lapses, then one runs.
#[tokio::test]
async fn a_dropped_call_keeps_its_reservation_until_the_lease_lapses() {
    let redis = RedisServer::start();
    let mut inspector = redis.inspector().await;
    for policy in [Policy::compatible(), Policy::hardened()] {
        let coordinator =
            Coordinator::new(redis.manager(), policy.clone().in_flight(InFlight::Raise));
        let key = format!("crash-{:?}", policy.ownership);
        let runs = Arc::default();
        let crashed = Hold::default();
        let holder = {
            let (coordinator, action, key) = (
                coordinator.clone(),
                crashed.action(&runs, json!(1), Ok(())),
                key.clone(),
            );
            tokio::spawn(async move {
                coordinator
                    .coordinate(Request::new("op", &key, HOUR), action)
                    .await
            })
        };
        crashed.started.notified().await;
        holder.abort();
        assert!(holder.await.unwrap_err().is_cancelled());

        let left = coordinator.read("op", &key).await.unwrap().unwrap();
        assert!(left.is_pending(), "nothing cleaned up");
        let retry = coordinator
            .coordinate(Request::new("op", &key, HOUR), never())
            .await
            .unwrap_err();
        assert!(
            matches!(retry, Error::InProgress { .. }),
            "crashed_holder_status = 409"
        );

        expire_now(&mut inspector, &coordinator.record_key("op", &key)).await;
        let after = coordinator
            .coordinate(Request::new("op", &key, HOUR), counted(&runs, json!(2)))
            .await
            .unwrap();
        assert!(matches!(after.source, Source::Ran));
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }
}

#[tokio::test]
async fn wait_mode_times_out_behind_a_renewed_holder_and_takes_over_a_lapsed_one() {
    let redis = RedisServer::start();
    let runs = Arc::default();

    // Hardened: the holder renews, so the waiter gives up after its own lease.
    let journal = Journal::default();
    let lease = Duration::from_millis(300);
    let hardened = journal.observe(Coordinator::new(
        redis.manager(),
        Policy::hardened()
            .lease(lease)
            .renew_every(Some(Duration::from_millis(50))),
    ));
    let hold = Hold::default();
    let holder = {
        let (coordinator, action) = (hardened.clone(), hold.action(&runs, json!(1), Ok(())));
        tokio::spawn(async move {
            coordinator
                .coordinate(Request::new("op", "w1", HOUR), action)
                .await
        })
    };
    hold.started.notified().await;
    let started = Instant::now();
    let waited = hardened
        .coordinate(Request::new("op", "w1", HOUR), never())
        .await
        .unwrap_err();
    assert!(matches!(waited, Error::InProgress { .. }));
    assert!(started.elapsed() >= lease, "it waited a whole lease");
    assert!(journal.take().contains(&"wait timed out".to_owned()));
    hold.finish.notify_one();
    assert!(matches!(within(holder).await.unwrap().source, Source::Ran));

    // Compatible (the reference's `lease-expiry[wait]`): nothing renews the holder's short
    // lease, so a waiter with a longer one sees it lapse, reserves, and runs the action itself.
    let short = Coordinator::new(redis.manager(), Policy::compatible().lease(lease));
    let long = Coordinator::new(redis.manager(), Policy::compatible().lease(lease * 10));
    let hold = Hold::default();
    let holder = {
        let action = hold.action(&runs, json!("holder"), Ok(()));
        tokio::spawn(async move {
            short
                .coordinate(Request::new("op", "w2", HOUR), action)
                .await
        })
    };
    hold.started.notified().await;
    let waiter = long
        .coordinate(
            Request::new("op", "w2", HOUR),
            counted(&runs, json!("waiter")),
        )
        .await
        .unwrap();
    assert!(matches!(waiter.source, Source::Ran));
    hold.finish.notify_one();
    within(holder).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

// ---- Run mode ----------------------------------------------------------------------------------

/// The reference's `in-flight-run`: both calls run, both return the winner's result.
#[tokio::test]
async fn run_mode_runs_concurrent_duplicates_and_adopts_the_winner() {
    let redis = RedisServer::start();
    let coordinator = Coordinator::new(
        redis.manager(),
        Policy::compatible().in_flight(InFlight::Run),
    );
    let runs = Arc::new(AtomicUsize::new(0));
    // Both actions start (both reads found nothing) before either stores its result.
    let both_running = Arc::new(tokio::sync::Barrier::new(2));
    let calls: Vec<_> = ["first", "second"]
        .into_iter()
        .map(|by| {
            let (coordinator, runs, both_running) =
                (coordinator.clone(), runs.clone(), both_running.clone());
            tokio::spawn(async move {
                coordinator
                    .coordinate(Request::new("op", "run", HOUR), |_| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        both_running.wait().await;
                        Ok::<_, String>(json!(by))
                    })
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut sources = Vec::new();
    let mut values = Vec::new();
    for call in calls {
        let done = within(call).await;
        sources.push(format!("{:?}", done.source));
        values.push(done.value);
    }
    sources.sort();
    assert_eq!(sources, ["Ran", "Superseded"]);
    assert_eq!(values[0], values[1], "both return the winner's result");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "both ran");
}

// ---- Redis unavailable -------------------------------------------------------------------------

async fn redis_down(port: u16, black_hole: bool) {
    let runs = Arc::new(AtomicUsize::new(0));
    let journal = Journal::default();
    let compatible = journal.observe(Coordinator::new(
        manager(port),
        Policy::compatible().in_flight(InFlight::Raise),
    ));
    for _call in 0..2 {
        let started = Instant::now();
        let done = compatible
            .coordinate(
                Request::new("op", "K", HOUR),
                counted(&runs, json!("charged")),
            )
            .await
            .unwrap();
        let took = started.elapsed();
        // A generous safety bound only; `--nocapture` shows the real cost.
        assert!(
            took >= Duration::ZERO && took < Duration::from_secs(2),
            "took {took:?}"
        );
        eprintln!("redis down (black hole: {black_hole}): a fail-open call took {took:?}");
        let Source::Unprotected(Unprotected::Storage(error)) = done.source else {
            panic!("expected an unprotected run, got {:?}", done.source);
        };
        assert_eq!(error.stage, Stage::Reserve);
        if black_hole {
            assert!(matches!(error.cause, StorageCause::Timeout(_)), "{error}");
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2, "charges_fail_open");
    // What the lab narrates: the failure, then the unprotected run, for each call.
    let events = journal.take();
    assert_eq!(events.len(), 4, "{events:?}");
    assert_eq!(events[0], "storage error at Reserve");
    assert!(
        events[1].starts_with("unprotected: idempotency storage failed while reserving the key"),
        "{events:?}"
    );

    let hardened = Coordinator::new(manager(port), Policy::hardened());
    let started = Instant::now();
    let refused = hardened
        .coordinate(Request::new("op", "K", HOUR), never())
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(
        matches!(refused, Error::Storage(ref error) if error.stage == Stage::Reserve),
        "{refused}"
    );

    let run_mode = Coordinator::new(manager(port), Policy::compatible().in_flight(InFlight::Run));
    let done = run_mode
        .coordinate(
            Request::new("op", "K", HOUR),
            counted(&runs, json!("charged")),
        )
        .await
        .unwrap();
    assert!(
        matches!(done.source, Source::Unprotected(Unprotected::Storage(ref e)) if e.stage == Stage::Read)
    );
}

#[tokio::test]
async fn redis_black_holed_costs_one_command_timeout() {
    let port = black_hole().await;
    redis_down(port, true).await;
}

#[tokio::test]
async fn redis_refusing_connections_costs_little() {
    redis_down(closed_port(), false).await;
}

// ---- The observer ------------------------------------------------------------------------------

#[tokio::test]
async fn the_observer_narrates_each_path() {
    let redis = RedisServer::start();
    let journal = Journal::default();
    let coordinator = journal.observe(Coordinator::new(
        redis.manager(),
        Policy::hardened().ownership(Ownership::Fenced),
    ));
    let runs = Arc::default();

    coordinator
        .coordinate(Request::new("op", "n", HOUR), counted(&runs, json!(1)))
        .await
        .unwrap();
    assert_eq!(journal.take(), ["reserved Some(1)", "completed Some(1)"]);
    coordinator
        .coordinate(Request::new("op", "n", HOUR), never())
        .await
        .unwrap();
    assert_eq!(journal.take(), ["replayed"]);
    coordinator
        .coordinate(Request::new("op", "m", HOUR), failing(&runs))
        .await
        .unwrap_err();
    assert_eq!(journal.take(), ["reserved Some(1)", "released Some(1)"]);

    let compatible = journal.observe(Coordinator::new(redis.manager(), Policy::compatible()));
    compatible
        .coordinate(Request::new("op", "a:b", HOUR), counted(&runs, json!(1)))
        .await
        .unwrap();
    assert_eq!(
        journal.take(),
        [
            "unprotected: invalid key (the idempotency key contains ':', which separates the parts of the Redis key)"
        ]
    );
}
