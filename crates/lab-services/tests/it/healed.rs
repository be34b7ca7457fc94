//! A healed Redis protects the very next payment: after the services' link to Redis was cut and
//! restored (or Redis itself restarted on its port), the first command on the stale connection
//! fails, the coordinator sends it once more on a fresh one, and the payment is reserved and
//! stored as any other. On real Redis, through the fault proxy, under both policies; for each
//! case the provider's charges for the key and what the caller got.
//!
//! | case | what happens to the link | a retry of the same key |
//! |---|---|---|
//! | before a call | cut, restored, then a new key is paid | replays: one charge |
//! | during a call | the reserve reaches Redis, its reply is lost with the connection | the resent reserve finds its own record: one charge |
//! | between reserve and complete | cut and restored while the provider charges | the resent complete stores the result: one charge |
//! | Redis restarted | the server stops and starts again on its port | one charge |
//!
//! And the broken design: a coordinator that does not send again (`resend_on_dropped: false`)
//! runs the first payment after a blip unprotected, and its retry charges twice.

use std::net::SocketAddr;
use std::time::Duration;

use lab_core::Checkpoints;
use lab_infra::{Needs, RunSpace, ServerOptions, Servers};
use lab_services::faults::Faults;
use lab_services::payments::{self, IN_ACTION};
use lab_services::stage::{self, Hop, Ports, REDIS_HOP, Stage, StageConfig};
use lab_services::{ServiceSpec, provider};
use serde_json::{Value, json};
use tokio_util::task::TaskTracker;

const TENANT: &str = "6f1c2d3e-4a5b-4c6d-8e7f-0a1b2c3d4e5f";
const ORDER: &str = "0b7e4c1a-2d3f-4e5a-9b6c-7d8e9f0a1b2c";

/// The payment service and its provider on a run space, the services' Redis link through the
/// fault proxy.
struct Fixture {
    servers: Servers,
    space: Option<RunSpace>,
    stage: Option<Stage>,
    faults: Option<Faults>,
    checkpoints: Checkpoints,
    tasks: TaskTracker,
    http: reqwest::Client,
}

impl Fixture {
    async fn start(options: &ServerOptions, policy: &str, resend: bool) -> Fixture {
        let needs = Needs {
            postgres: false,
            redis: true,
        };
        let servers = Servers::start(options, needs).await.expect("servers start");
        let space = RunSpace::create(&servers, &stage::schemas(&[&payments::SPEC]))
            .await
            .expect("a run space");
        let tasks = TaskTracker::new();
        let faults = Faults::embedded(&space.run_id, &tasks)
            .await
            .expect("the fault proxy");
        let checkpoints = Checkpoints::new();
        let config = StageConfig {
            space: &space,
            narrator: None,
            checkpoints: checkpoints.clone(),
            tasks: tasks.clone(),
            faults: Some(&faults),
            hops: &[Hop::Redis],
        };
        let stage = Stage::start(&[&payments::SPEC], &config, Ports::Free)
            .await
            .expect("the services start");
        let fixture = Fixture {
            servers,
            space: Some(space),
            stage: Some(stage),
            faults: Some(faults),
            checkpoints,
            tasks,
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
        };
        let change = json!({"policy": policy, "resend_on_dropped": resend});
        let answer = fixture
            .http
            .put(format!("http://{}/config", fixture.direct(&payments::SPEC)))
            .json(&change)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200, "{change}");
        fixture
    }

    fn direct(&self, spec: &ServiceSpec) -> SocketAddr {
        self.stage
            .as_ref()
            .and_then(|s| s.get(spec))
            .expect("started")
            .direct
    }

    fn faults(&self) -> &Faults {
        self.faults.as_ref().expect("the fault proxy")
    }

    /// Pays with `key`: the status and the body.
    async fn pay(&self, key: &str) -> (u16, Value) {
        let body =
            json!({"tenant_id": TENANT, "order_id": ORDER, "amount": 1990, "currency": "RUB"});
        let answer = self
            .http
            .post(format!("http://{}/payments", self.direct(&payments::SPEC)))
            .header("Idempotency-Key", key)
            .json(&body)
            .send()
            .await
            .expect("an answer");
        let status = answer.status().as_u16();
        (status, answer.json().await.unwrap_or(Value::Null))
    }

    /// The provider's charges under the payment service's provider key for `key`.
    async fn charges(&self, key: &str) -> usize {
        let operation = format!("payment.charge.{}", TENANT.replace('-', ""));
        let url = format!(
            "http://{}/charges?key={operation}.{key}",
            self.direct(&provider::SPEC)
        );
        let list: Value = self
            .http
            .get(url)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        list["charges"].as_array().map_or(0, Vec::len)
    }

    /// Cuts the services' link to Redis (open connections too) for `outage`, then restores it.
    async fn blip(&self, outage: Duration) {
        self.faults().set_enabled(REDIS_HOP, false).await.unwrap();
        // The outage is the case itself: real time, not an ordering.
        tokio::time::sleep(outage).await;
        self.faults().set_enabled(REDIS_HOP, true).await.unwrap();
    }

    /// Waits until the run's Redis (read directly, past the proxy) holds a key with `needle`.
    async fn until_key(&self, needle: &str) {
        let space = self.space.as_ref().unwrap();
        let mut conn = space.redis.clone().unwrap();
        for _ in 0..2_000 {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{}*{needle}*", space.prefix))
                .query_async(&mut conn)
                .await
                .unwrap();
            if !keys.is_empty() {
                return;
            }
            // Polling Redis for a command already on its way.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("no key with {needle} reached Redis");
    }

    async fn finish(self) {
        let released = self.stop().await;
        released.expect("released");
    }

    /// Stops everything; whether the run's keys could be deleted.
    async fn stop(mut self) -> Result<(), lab_infra::InfraError> {
        if let Some(stage) = self.stage.take() {
            stage.stop().await;
        }
        if let Some(faults) = self.faults.take() {
            faults.release().await;
        }
        self.tasks.close();
        self.tasks.wait().await;
        let released = match self.space.take() {
            Some(space) => space.release(&self.servers, false).await,
            None => Ok(()),
        };
        self.servers.shutdown().await;
        released
    }
}

/// A warm-up payment, so the service's connection to Redis exists before the blip.
async fn warm(f: &Fixture) {
    assert_eq!(f.pay("warm").await.0, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn cut_and_restored_before_a_call_the_next_payment_is_protected() {
    for policy in ["compatible", "hardened"] {
        for outage in [Duration::from_millis(100), Duration::from_millis(600)] {
            let f = Fixture::start(&ServerOptions::default(), policy, true).await;
            warm(&f).await;
            f.blip(outage).await;
            let (first, charge) = f.pay("after-blip").await;
            let (again, replay) = f.pay("after-blip").await;
            let case = format!("{policy}, cut {outage:?}");
            assert_eq!((first, again), (200, 200), "{case}: {charge} {replay}");
            assert_eq!(charge, replay, "{case}: the retry replays the charge");
            assert_eq!(f.charges("after-blip").await, 1, "{case}");
            f.finish().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reserve_whose_reply_is_lost_finds_its_own_reservation() {
    for policy in ["compatible", "hardened"] {
        let f = Fixture::start(&ServerOptions::default(), policy, true).await;
        warm(&f).await;
        // Replies from Redis are held on their way back, so the reserve reaches Redis and its
        // reply is still on the way when the link is cut.
        let held = f
            .faults()
            .slow_responses(REDIS_HOP, Duration::from_secs(2))
            .await
            .unwrap();
        let (status, charge) = {
            let first = f.pay("lost-reply");
            tokio::pin!(first);
            tokio::select! {
                _ = f.until_key("lost-reply") => {}
                _ = &mut first => panic!("{policy}: paid before the reserve reached Redis"),
            }
            // The link is cut while the reply is still held, so it is lost with the connection;
            // the hold goes before the link comes back, for the calls that follow. (Taking the
            // hold away first let the reply through on a loaded machine, and the cut met the
            // completion's write instead.)
            let cut = async {
                f.faults().set_enabled(REDIS_HOP, false).await.unwrap();
                f.faults().remove(held).await.unwrap();
                f.faults().set_enabled(REDIS_HOP, true).await.unwrap();
            };
            tokio::join!(first, cut).0
        };
        assert_eq!(status, 200, "{policy}: {charge}");
        let (again, replay) = f.pay("lost-reply").await;
        assert_eq!((again, &replay), (200, &charge), "{policy}");
        assert_eq!(f.charges("lost-reply").await, 1, "{policy}");
        f.finish().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn cut_and_restored_between_reserve_and_complete_the_result_is_stored() {
    for policy in ["compatible", "hardened"] {
        let f = Fixture::start(&ServerOptions::default(), policy, true).await;
        warm(&f).await;
        let hold = f.checkpoints.hold(IN_ACTION);
        let (status, charge) = {
            let first = f.pay("mid-call");
            tokio::pin!(first);
            tokio::select! {
                inside = hold.entered(Duration::from_secs(10)) => inside.expect("reserved"),
                _ = &mut first => panic!("{policy}: paid before the charge"),
            }
            f.blip(Duration::from_millis(300)).await;
            hold.release();
            first.await
        };
        assert_eq!(status, 200, "{policy}: {charge}");
        let (again, replay) = f.pay("mid-call").await;
        assert_eq!((again, &replay), (200, &charge), "{policy}");
        assert_eq!(f.charges("mid-call").await, 1, "{policy}");
        f.finish().await;
    }
}

/// A redis-server of the test's own, on a fixed port, that can be stopped and started again.
struct OwnRedis {
    port: u16,
    dir: tempfile::TempDir,
    child: std::process::Child,
}

impl OwnRedis {
    fn start() -> OwnRedis {
        // From below the ephemeral range: a port the kernel hands out for port 0 is soon a fault
        // proxy's or an outgoing connection's (see `lab_infra::process::free_port`).
        let port = lab_infra::process::free_port().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let child = Self::spawn(port, dir.path());
        OwnRedis { port, dir, child }
    }

    fn spawn(port: u16, dir: &std::path::Path) -> std::process::Child {
        // The program lab itself would use: the OS's, or `lab servers install`'s.
        let program = lab_infra::binaries::redis_program().expect("a Redis server program");
        let mut child = std::process::Command::new(program.path)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server on PATH");
        // Up when it answers.
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
        for _ in 0..500 {
            if let Ok(mut conn) = client.get_connection()
                && redis::cmd("PING").query::<String>(&mut conn).is_ok()
            {
                return child;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("redis-server did not start on {port}");
    }

    fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = Self::spawn(self.port, self.dir.path());
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_restarted_on_its_port_the_next_payment_is_protected() {
    for policy in ["compatible", "hardened"] {
        let mut redis = OwnRedis::start();
        let options = ServerOptions::new(None, Some(redis.url())).unwrap();
        let f = Fixture::start(&options, policy, true).await;
        warm(&f).await;
        redis.restart();
        let (first, charge) = f.pay("after-restart").await;
        let (again, replay) = f.pay("after-restart").await;
        assert_eq!((first, again), (200, 200), "{policy}: {charge} {replay}");
        assert_eq!(charge, replay, "{policy}");
        assert_eq!(f.charges("after-restart").await, 1, "{policy}");
        // The fixture's own connection to that Redis (a plain one, not the services') broke with
        // the restart, and the restarted server kept nothing: there are no keys to delete.
        let _ = f.stop().await;
    }
}

/// The broken design: a coordinator that does not send again. The first payment after a blip
/// runs unprotected (compatible) and its retry charges again; the hardened policy refuses it
/// (503) although Redis is back.
#[tokio::test(flavor = "multi_thread")]
async fn without_resending_the_first_payment_after_a_blip_is_unprotected_or_refused() {
    let f = Fixture::start(&ServerOptions::default(), "compatible", false).await;
    warm(&f).await;
    f.blip(Duration::from_millis(100)).await;
    let (first, _) = f.pay("no-resend").await;
    let (again, _) = f.pay("no-resend").await;
    assert_eq!((first, again), (200, 200));
    assert_eq!(f.charges("no-resend").await, 2, "two charges for one key");
    f.finish().await;

    let f = Fixture::start(&ServerOptions::default(), "hardened", false).await;
    warm(&f).await;
    f.blip(Duration::from_millis(100)).await;
    assert_eq!(
        f.pay("no-resend").await.0,
        503,
        "refused although Redis is back"
    );
    assert_eq!(f.pay("no-resend").await.0, 200, "the next one works");
    assert_eq!(f.charges("no-resend").await, 1);
    f.finish().await;
}
