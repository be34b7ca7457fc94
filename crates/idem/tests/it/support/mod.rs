//! What the integration tests share: throwaway Redis servers (single and cluster), dead
//! endpoints, connections, and the concurrency scenarios run against every topology.
//!
//! Nothing here assumes a Redis on 6379: every test starts its own `redis-server` on a free port
//! in a temporary directory, without persistence, and kills it when the handle is dropped.

// Each test binary uses a different part of this module.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem::{Coordinator, Error, EventKind, Policy, Request, Source};
use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::{Arg, Cmd, RedisFuture};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::sync::{Notify, Semaphore};

/// A `redis-server` of our own, killed on drop.
pub struct RedisServer {
    pub port: u16,
    child: Child,
    _dir: TempDir,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer::start_with(free_port, &[])
    }

    /// Starts a server on a port `pick_port` chooses, with extra arguments; retries on another
    /// port if the chosen one was taken in the meantime.
    pub fn start_with(pick_port: fn() -> u16, extra: &[&str]) -> RedisServer {
        for _attempt in 0..5 {
            let port = pick_port();
            let dir = tempfile::tempdir().expect("a temporary directory");
            let mut child = Command::new(redis_server())
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                // No persistence: nothing to clean up, nothing slow.
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(dir.path())
                .args(extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server runs (apt-get install redis-server, or lab servers install)");
            if wait_for_pong(port, Duration::from_secs(10)) {
                return RedisServer {
                    port,
                    child,
                    _dir: dir,
                };
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("redis-server did not start");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A plain multiplexed connection, for inspecting and manipulating keys from the test.
    pub async fn inspector(&self) -> MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// A connection manager configured as the crate docs recommend.
    pub fn manager(&self) -> ConnectionManager {
        manager(self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port nothing listens on right now, from below the kernel's ephemeral range (see
/// `lab_infra::process::free_port`): a port the kernel hands out for port 0 is soon a fault
/// proxy's or an outgoing connection's, here or in a program running beside the tests.
pub fn free_port() -> u16 {
    lab_infra::process::free_port().expect("a free port")
}

/// A port P with P + 10000 free too: a cluster node also listens on its bus port, P + 10000.
pub fn free_cluster_port() -> u16 {
    let seed = std::process::id() as u64
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
    for step in 0..10_000u64 {
        let port = 20_000 + ((seed.wrapping_mul(2_654_435_761) + step * 7919) % 10_000) as u16;
        let both_free = TcpListener::bind(("127.0.0.1", port)).is_ok()
            && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok();
        if both_free {
            return port;
        }
    }
    panic!("no free port pair for a cluster node");
}

fn wait_for_pong(port: u16, patience: Duration) -> bool {
    let deadline = Instant::now() + patience;
    while Instant::now() < deadline {
        if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) {
            let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
            let mut reply = [0u8; 7];
            if stream.write_all(b"PING\r\n").is_ok()
                && stream.read_exact(&mut reply).is_ok()
                && &reply == b"+PONG\r\n"
            {
                return true;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// A connection manager for `port` as the crate docs recommend: short connect and response
/// timeouts, few quick reconnection attempts, lazy (it works while Redis is down).
pub fn manager(port: u16) -> ConnectionManager {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_millis(250)))
        .set_response_timeout(Some(Duration::from_millis(250)))
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(100));
    ConnectionManager::new_lazy_with_config(client, config).unwrap()
}

/// A port where a listener accepts connections and never answers: Redis as a black hole (a
/// partition, a hung server). The listener lives as long as the test's runtime.
pub async fn black_hole() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket); // keep it open, read nothing, write nothing
        }
    });
    port
}

/// A port nobody listens on: Redis down, connections refused at once.
pub fn closed_port() -> u16 {
    free_port()
}

/// Three masters of a Redis Cluster on free ports, killed on drop.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                RedisServer::start_with(
                    free_cluster_port,
                    &[
                        "--cluster-enabled",
                        "yes",
                        // Relative to --dir, so each node has its own.
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "5000",
                    ],
                )
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        let status = Command::new(redis_cli())
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli runs");
        assert!(status.success(), "redis-cli --cluster create failed");
        let deadline = Instant::now() + Duration::from_secs(30);
        for node in &nodes {
            loop {
                let info = Command::new(redis_cli())
                    .args(["-p", &node.port.to_string(), "cluster", "info"])
                    .output()
                    .expect("redis-cli runs");
                if String::from_utf8_lossy(&info.stdout).contains("cluster_state:ok") {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "the cluster never reached cluster_state:ok"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        RedisCluster { nodes }
    }

    pub async fn connection(&self) -> redis::cluster_async::ClusterConnection {
        let urls: Vec<String> = self.nodes.iter().map(RedisServer::url).collect();
        redis::cluster::ClusterClient::builder(urls)
            .connection_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_secs(2))
            .retries(2)
            .build()
            .unwrap()
            .get_async_connection()
            .await
            .unwrap()
    }
}

/// A connection that records the name of every command it sends: one entry per round trip.
///
/// Counting on the client side is what "round trips" means; the server's own statistics also
/// count the commands a Lua script runs inside Redis. It also shows that any `ConnectionLike`
/// will do for the coordinator.
#[derive(Clone)]
pub struct Counting<C> {
    inner: C,
    sent: Arc<Mutex<Vec<String>>>,
}

impl<C> Counting<C> {
    pub fn new(inner: C) -> Counting<C> {
        Counting {
            inner,
            sent: Arc::default(),
        }
    }

    /// The commands sent since the last call, in order (`EVALSHA`, `SET`, ...).
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.sent.lock().unwrap())
    }
}

impl<C: ConnectionLike + Send> ConnectionLike for Counting<C> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, redis::Value> {
        let name = match cmd.args_iter().next() {
            Some(Arg::Simple(name)) => String::from_utf8_lossy(name).to_uppercase(),
            _ => "?".to_owned(),
        };
        self.sent.lock().unwrap().push(name);
        self.inner.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<redis::Value>> {
        self.sent.lock().unwrap().push("PIPELINE".to_owned());
        self.inner.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

/// The policies of the concurrency scenarios: a healthy Redis, but a busy machine (100 calls on
/// two cores), so commands get a generous timeout: a timeout would make a compatible call run
/// unprotected, which is a different test.
pub fn patient(policy: Policy) -> Policy {
    policy.command_timeout(Duration::from_secs(5))
}

/// 100 concurrent calls with one key in Raise mode: exactly one runs the action, the 99 others
/// get InProgress at once, and a call afterwards replays the one result.
///
/// The holder's action does not finish until all 99 others have returned, so every one of them
/// meets the reservation: no sleeps decide the interleaving.
pub async fn hundred_concurrent_raise<C>(conn: C, policy: Policy, key: &str)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    const CALLS: usize = 100;
    let coordinator = Arc::new(Coordinator::new(
        conn,
        patient(policy.in_flight(idem::InFlight::Raise)),
    ));
    let runs = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(Semaphore::new(0));
    let mut calls = Vec::new();
    for caller in 0..CALLS {
        let (coordinator, runs, refused) = (coordinator.clone(), runs.clone(), refused.clone());
        let key = key.to_owned();
        calls.push(tokio::spawn(async move {
            let request = Request::new("payment.charge", &key, Duration::from_secs(3600));
            let turned_away = refused.clone();
            let outcome = coordinator
                .coordinate(request, |fence| async move {
                    let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    // Hold the key until every other caller has been turned away.
                    let everyone = turned_away.acquire_many((CALLS - 1) as u32).await.unwrap();
                    everyone.forget();
                    Ok::<_, String>(json!({"caller": caller, "run": run, "fence": fence.token}))
                })
                .await;
            if let Err(Error::InProgress { .. }) = &outcome {
                refused.add_permits(1);
            }
            outcome
        }));
    }
    let mut ran = Vec::new();
    let mut in_progress = 0;
    for call in calls {
        match within(call).await {
            Ok(done) => {
                assert!(matches!(done.source, Source::Ran), "{:?}", done.source);
                ran.push(done.value);
            }
            Err(Error::InProgress { .. }) => in_progress += 1,
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the action ran once");
    assert_eq!((ran.len(), in_progress), (1, CALLS - 1));

    let again = coordinator
        .coordinate(
            Request::new("payment.charge", key, Duration::from_secs(3600)),
            |_| async { Err::<Value, _>("a replay must not run the action".to_owned()) },
        )
        .await
        .unwrap();
    assert!(matches!(again.source, Source::Replayed));
    assert_eq!(again.value, ran[0]);
}

/// 100 concurrent calls with one key in Wait mode: one runs the action, the 99 others wait and
/// replay its result.
///
/// The holder's action finishes only once the observer has seen all 99 others meet the
/// reservation (each reports `InFlight` once), so all of them really wait.
pub async fn hundred_concurrent_wait<C>(conn: C, policy: Policy, key: &str)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    const CALLS: usize = 100;
    let waiting = Arc::new(AtomicUsize::new(0));
    let all_waiting = Arc::new(Notify::new());
    let (seen, notify) = (waiting.clone(), all_waiting.clone());
    let coordinator = Arc::new(
        Coordinator::new(conn, patient(policy.in_flight(idem::InFlight::Wait))).with_observer(
            move |event| {
                if let EventKind::InFlight = event.kind
                    && seen.fetch_add(1, Ordering::SeqCst) + 1 == CALLS - 1
                {
                    notify.notify_one();
                }
            },
        ),
    );
    let runs = Arc::new(AtomicUsize::new(0));
    let mut calls = Vec::new();
    for caller in 0..CALLS {
        let (coordinator, runs, all_waiting) =
            (coordinator.clone(), runs.clone(), all_waiting.clone());
        let key = key.to_owned();
        calls.push(tokio::spawn(async move {
            let request = Request::new("payment.charge", &key, Duration::from_secs(3600));
            coordinator
                .coordinate(request, |fence| async move {
                    let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    all_waiting.notified().await;
                    Ok::<_, String>(json!({"caller": caller, "run": run, "fence": fence.token}))
                })
                .await
        }));
    }
    let mut values = Vec::new();
    let mut replayed = 0;
    for call in calls {
        let done = within(call).await.expect("every call succeeds");
        match done.source {
            Source::Ran => {}
            Source::Replayed => replayed += 1,
            other => panic!("unexpected source {other:?}"),
        }
        values.push(done.value);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the action ran once");
    assert_eq!(replayed, CALLS - 1);
    assert_eq!(waiting.load(Ordering::SeqCst), CALLS - 1);
    assert!(
        values.iter().all(|value| *value == values[0]),
        "all got one result"
    );
}

/// Awaits a spawned call, failing the test instead of hanging if a bug lets two callers hold
/// the key (each would then wait forever for the others).
pub async fn within<T>(task: tokio::task::JoinHandle<T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .expect("the call finished")
        .expect("the call did not panic")
}

/// The Redis server program lab itself would start: the OS's, or `lab servers install`'s.
pub fn redis_server() -> std::path::PathBuf {
    lab_infra::binaries::redis_program()
        .expect("a Redis server program (apt-get install redis-server, or lab servers install)")
        .path
}

/// The client beside [`redis_server`] (`redis-cli`, or Valkey's `valkey-cli`).
pub fn redis_cli() -> std::path::PathBuf {
    lab_infra::binaries::redis_cli_beside(&redis_server()).expect("redis-cli beside the server")
}
