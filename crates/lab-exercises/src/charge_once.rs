//! Exercise `charge-once` (the payments lesson): the learner's payment service, `POST /payments`
//! with an Idempotency-Key, on Redis and the lab's payment provider. The lab owns the external
//! effect: the provider counts every charge, so any implementation, in any language, is judged
//! by the one invariant that matters: one charge per payment intent. The oracle is the
//! provider's list of charges (and, for the stored result's lifetime, Redis itself), never the
//! service's own answers.
//!
//! ```text
//!   the lab's client ──► the learner's service ──► fault proxy ──► Redis (keys under KEY_PREFIX)
//!                                 └──────────────► fault proxy ──► the lab's provider (charges)
//! ```
//!
//! | check             | the schedule                                                             | the invariant                                  |
//! |-------------------|--------------------------------------------------------------------------|------------------------------------------------|
//! | `replay`          | one key, the same payment twice                                          | one charge; the same Charge, `Idempotent-Replayed: true` |
//! | `changed-payment` | one key, then the same key with another amount                           | 422, and no second charge                      |
//! | `new-key`         | a new key for a new payment with the same parameters                     | two charges: a key is an intent, not a body    |
//! | `invalid-keys`    | an empty key, one with a colon, one of 256 characters                    | 400 with a JSON body each; nothing charged     |
//! | `in-flight`       | the first call held inside the provider; the duplicate, then one with another amount | 409 with `Retry-After` (422 for the other amount); one charge |
//! | `lost-answer`     | the provider charges, its answer is lost on the way back; the client retries | one charge                                  |
//! | `tenants`         | two tenants, one client key                                              | two charges, each tenant its own Charge        |
//! | `result-ttl`      | one payment, its record read with `PTTL`                                 | it lives at least the manifest's retry window  |
//! | `redis-blip`      | the Redis link cut for a moment and restored; the next payment held in the provider, its duplicate sent | one charge: the next payment was protected |
//! | `redis-down`      | the Redis link cut; two calls with one key                               | 503 (fail closed) or one charge (a provider that deduplicates) |
//! | `slow-provider`   | the first call held in the provider past the learner's lease; its duplicate sent | one charge (renewal, or the provider's key) |
//!
//! The provider removes duplicates by key in the checks where the lesson's integration contract
//! counts on it (`lost-answer`, `redis-down`, `slow-provider`), unless the manifest says
//! `provider_dedup = false`; elsewhere it charges every request, so a duplicate the service
//! let through shows as a second charge.
//!
//! `redis-blip` and `redis-down` leave the service's Redis connections cut, and `slow-provider`
//! restarts the service with a short lease: they come last, in that order.

use std::time::{Duration, Instant};

use lab_core::{Checkpoints, Msg};
use lab_services::provider;
use redis::aio::MultiplexedConnection;
use tokio::task::JoinHandle;

use crate::arena::{Call, send};
use crate::catalogue::{CheckSpec, Exercise};
use crate::error::ExerciseError;
use crate::guest::{Guest, Mark, NotReady};
use crate::manifest::Manifest;
use crate::payment_world::{
    AMOUNT, Intent, LabProvider, OTHER_TENANT, Reached, STAGING_LIMIT, charged, glob_escape,
    keys_of, must_be_charged, payment_call, redis_error, scan, send_held, status_of,
};
use crate::verdict::{ChargeRow, CheckReport, Exchange, Line, Verdict, fail};
use crate::world::World;

pub static EXERCISE: Exercise = Exercise {
    name: "charge-once",
    lesson: "payments",
    needs: lab_infra::Needs::REDIS,
    langs: &["python", "rust"],
    rust_uses_idem: true,
    checks: &[
        CheckSpec::new("replay"),
        CheckSpec::new("changed-payment"),
        CheckSpec::new("new-key"),
        CheckSpec::new("invalid-keys"),
        CheckSpec::new("in-flight"),
        CheckSpec::new("lost-answer"),
        CheckSpec::new("tenants"),
        CheckSpec::new("result-ttl"),
        CheckSpec::new("redis-blip"),
        CheckSpec::new("redis-down"),
        CheckSpec::new("slow-provider").restarts(),
    ],
    starter_fails: &[
        "replay",
        "changed-payment",
        "invalid-keys",
        "in-flight",
        "lost-answer",
        "result-ttl",
        "redis-blip",
        "redis-down",
        "slow-provider",
    ],
};

/// The lesson's lease, given to the program as `LEASE_SECONDS`.
const LEASE_SECONDS: u64 = 30;
/// The lease `slow-provider` gives the program instead: the provider is held longer than it.
const SHORT_LEASE_SECONDS: u64 = 2;
/// The lesson's retry window for a payment: its result is kept an hour.
const DEFAULT_RETRY_WINDOW_SECS: u64 = 3600;
/// How long a call may take while Redis is down: idempotency-kit fails open only after the
/// Redis client has given up, and redis-py's defaults retry for seconds.
const OUTAGE_PATIENCE: Duration = Duration::from_secs(40);
/// How long a patient call waits otherwise.
const PATIENT: Duration = Duration::from_secs(15);
/// How often Redis is read while the lab waits for a reservation to expire.
const EXPIRY_POLL: Duration = Duration::from_millis(100);
/// A stored result's lifetime is read a moment after it was written: this much less than the
/// window still counts as the window.
const TTL_SLACK_MS: i64 = 5_000;

type Checked = Result<Verdict, ExerciseError>;

/// What the charge-once checks work with.
pub struct Rig {
    pub run: String,
    /// `KEY_PREFIX`: every key of the learner's records must start with it.
    pub prefix: String,
    /// The lab's own connection to Redis, straight to the server (not through the proxy).
    pub redis: MultiplexedConnection,
    /// The proxies' registry: dropping it stops the proxies.
    pub proxies: faultproxy::FaultProxy,
    /// The learner's service → Redis.
    pub redis_hop: faultproxy::Proxy,
    /// The learner's service → the provider.
    pub provider_hop: faultproxy::Proxy,
    pub provider: LabProvider,
    pub checkpoints: Checkpoints,
    pub dir: std::path::PathBuf,
    pub manifest: Manifest,
    /// The program's environment but for PORT and LEASE_SECONDS.
    pub env: Vec<(String, String)>,
    pub guest: Option<Guest>,
    pub http: reqwest::Client,
    pub schedule: Vec<Line>,
}

/// Starts the rig: the provider, the two proxied links, and the learner's service (built before).
pub async fn open(
    run: &str,
    prefix: String,
    redis: MultiplexedConnection,
    redis_addr: &str,
    dir: std::path::PathBuf,
    manifest: Manifest,
    extra_env: Vec<(String, String)>,
) -> Result<Result<Rig, NotReady>, ExerciseError> {
    let checkpoints = Checkpoints::new();
    let provider = LabProvider::start(checkpoints.clone())?;
    let proxies = faultproxy::FaultProxy::new();
    let redis_info = proxies
        .create(&format!("exercise-{run}-redis"), "127.0.0.1:0", redis_addr)
        .await?;
    let provider_upstream = provider.url().trim_start_matches("http://").to_string();
    let provider_info = proxies
        .create(
            &format!("exercise-{run}-provider"),
            "127.0.0.1:0",
            &provider_upstream,
        )
        .await?;
    let env = vec![
        ("HOST".to_string(), "127.0.0.1".to_string()),
        (
            "REDIS_URL".to_string(),
            format!("redis://{}/0", redis_info.listen),
        ),
        ("KEY_PREFIX".to_string(), prefix.clone()),
        (
            "PROVIDER_URL".to_string(),
            format!("http://{}", provider_info.listen),
        ),
        ("LAB_RUN".to_string(), run.to_string()),
        // Python prints as it goes, so a program that never answers shows why.
        ("PYTHONUNBUFFERED".to_string(), "1".to_string()),
    ];
    let mut rig = Rig {
        run: run.to_string(),
        prefix,
        redis,
        redis_hop: proxies.get(&redis_info.name).expect("just created"),
        provider_hop: proxies.get(&provider_info.name).expect("just created"),
        proxies,
        provider,
        checkpoints,
        dir,
        manifest,
        env: env.into_iter().chain(extra_env).collect(),
        guest: None,
        // One connection per call: nothing of one call's connection is left for the next.
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .expect("a client without TLS builds"),
        schedule: Vec::new(),
    };
    if let Err(not_ready) = rig.start_service(LEASE_SECONDS).await? {
        rig.close().await;
        return Ok(Err(not_ready));
    }
    Ok(Ok(rig))
}

impl Rig {
    fn step(&mut self, msg: Msg) {
        self.schedule.push(Line::Step(msg));
    }

    fn manifest_dedup(&self) -> bool {
        self.manifest.provider_dedup.unwrap_or(true)
    }

    fn retry_window(&self) -> u64 {
        self.manifest
            .retry_window_secs
            .unwrap_or(DEFAULT_RETRY_WINDOW_SECS)
    }

    /// Starts (or starts again) the learner's service with `lease` as its `LEASE_SECONDS`.
    async fn start_service(&mut self, lease: u64) -> Result<Result<(), NotReady>, ExerciseError> {
        if let Some(mut old) = self.guest.take() {
            old.stop().await;
        }
        let port = lab_infra::process::free_port().map_err(ExerciseError::io(&self.dir))?;
        let env = self
            .env
            .iter()
            .cloned()
            .chain([
                ("PORT".to_string(), port.to_string()),
                ("LEASE_SECONDS".to_string(), lease.to_string()),
            ])
            .collect();
        let mut guest = Guest::new(&self.dir, self.manifest.clone(), port, env)?;
        let started = guest.start().await?;
        self.guest = Some(guest);
        Ok(started.map(drop))
    }

    fn call(&self, who: &str, intent: &Intent, key: &str, timeout: Duration) -> Call {
        let base = self
            .guest
            .as_ref()
            .map_or_else(String::new, Guest::base_url);
        payment_call(&format!("{base}/payments"), who, intent, key, timeout)
    }

    /// Starts a second service beside the first, on the same Redis, prefix and provider.
    async fn start_beside(
        &self,
        dir: &std::path::Path,
        manifest: Manifest,
    ) -> Result<Result<Guest, NotReady>, ExerciseError> {
        let port = lab_infra::process::free_port().map_err(ExerciseError::io(dir))?;
        let env = self
            .env
            .iter()
            .cloned()
            .chain([
                ("PORT".to_string(), port.to_string()),
                ("LEASE_SECONDS".to_string(), LEASE_SECONDS.to_string()),
            ])
            .collect();
        let mut guest = Guest::new(dir, manifest, port, env)?;
        Ok(guest.start().await?.map(|_| guest))
    }

    /// Pays `intent` at the service at `base`, and records the exchange.
    async fn pay_at(&mut self, base: &str, intent: &Intent, key: &str) -> Exchange {
        let exchange = send(
            &self.http,
            payment_call(&format!("{base}/payments"), "client", intent, key, PATIENT),
        )
        .await;
        self.schedule.push(Line::Call(exchange.clone()));
        exchange
    }

    /// Pays `intent` with `key` as `who`, and records the exchange.
    async fn pay(&mut self, who: &str, intent: &Intent, key: &str) -> Exchange {
        self.pay_within(who, intent, key, PATIENT).await
    }

    async fn pay_within(
        &mut self,
        who: &str,
        intent: &Intent,
        key: &str,
        timeout: Duration,
    ) -> Exchange {
        let exchange = send(&self.http, self.call(who, intent, key, timeout)).await;
        self.schedule.push(Line::Call(exchange.clone()));
        exchange
    }

    /// Sends a payment that the provider holds once it has charged, before its answer goes
    /// out; returns once it is held there, or has answered without getting there.
    async fn pay_held(&mut self, who: &str, intent: &Intent, key: &str) -> Reached {
        let call = self.call(who, intent, key, STAGING_LIMIT * 2);
        let reached = send_held(&self.http, &self.checkpoints, provider::CHARGED, call).await;
        if let Reached::Answered(exchange) = &reached {
            self.schedule.push(Line::Call(exchange.clone()));
        }
        reached
    }

    /// Lets a held call go on, and records its answer.
    async fn let_go(
        &mut self,
        who: &str,
        hold: lab_core::checkpoint::Hold,
        call: JoinHandle<Exchange>,
    ) -> Option<Exchange> {
        self.step(Msg::new("step.let_go").arg("who", who));
        hold.release();
        let exchange = call.await.ok()?;
        self.schedule.push(Line::Call(exchange.clone()));
        Some(exchange)
    }

    /// Switches the provider's deduplication by key, and says so.
    async fn provider_dedup(&mut self, on: bool) -> Result<(), ExerciseError> {
        let said = self.provider.dedup(on).await?;
        self.schedule.push(said);
        Ok(())
    }

    /// The charges the provider made for `intent`'s order, recorded.
    async fn charges(&mut self, intent: &Intent) -> Result<Vec<ChargeRow>, ExerciseError> {
        let (charges, line) = self.provider.charges(intent).await?;
        self.schedule.push(line);
        Ok(charges)
    }

    /// Every Redis key whose name holds `client_key`, anywhere on the server, with its PTTL.
    async fn keys_naming(&mut self, client_key: &str) -> Result<Vec<(String, i64)>, ExerciseError> {
        let pattern = format!("*{}*", glob_escape(client_key));
        let mut found = Vec::new();
        for key in scan(&mut self.redis, &pattern).await? {
            let pttl: i64 = redis::cmd("PTTL")
                .arg(&key)
                .query_async(&mut self.redis)
                .await
                .map_err(redis_error)?;
            found.push((key, pttl));
        }
        found.sort();
        Ok(found)
    }

    /// Whether any key under the run's prefix names `client_key`.
    async fn reserved(&mut self, client_key: &str) -> Result<bool, ExerciseError> {
        let prefix = self.prefix.clone();
        Ok(self
            .keys_naming(client_key)
            .await?
            .iter()
            .any(|(key, pttl)| key.starts_with(&prefix) && *pttl != -2))
    }

    async fn close(mut self) {
        if let Some(mut guest) = self.guest.take() {
            guest.stop().await;
        }
        self.provider.stop().await;
    }
}

/// Why an intent was charged more than once, named by what the provider saw: no key, a key
/// that changed, or one stable key that a provider without deduplication could not use.
fn charged_twice(what: &str, charges: &[ChargeRow], dedup: bool) -> Verdict {
    let why = if charges.iter().all(|c| c.key.is_none()) {
        "no_provider_key"
    } else if charges.windows(2).any(|w| w[0].key != w[1].key) {
        "provider_keys_differ"
    } else if dedup {
        "charged_twice"
    } else {
        "no_dedup"
    };
    Verdict::Fail(
        fail(what)
            .arg("count", charges.len())
            .arg("keys", keys_of(charges))
            .arg("why", Msg::new(format!("why.{why}"))),
    )
}

/// Runs the check `name`.
pub async fn run(name: &str, rig: &mut Rig) -> Checked {
    match name {
        "replay" => replay(rig).await,
        "changed-payment" => changed_payment(rig).await,
        "new-key" => new_key(rig).await,
        "invalid-keys" => invalid_keys(rig).await,
        "in-flight" => in_flight(rig).await,
        "lost-answer" => lost_answer(rig).await,
        "tenants" => tenants(rig).await,
        "result-ttl" => result_ttl(rig).await,
        "redis-blip" => redis_blip(rig).await,
        "redis-down" => redis_down(rig).await,
        "slow-provider" => slow_provider(rig).await,
        other => unreachable!("charge-once has no check {other}"),
    }
}

macro_rules! judged {
    ($e:expr) => {
        if let Err(verdict) = $e {
            return Ok(verdict);
        }
    };
}

async fn replay(rig: &mut Rig) -> Checked {
    rig.provider_dedup(false).await?;
    let intent = Intent::new(1);
    rig.step(Msg::new("step.replay"));
    let first = rig.pay("client", &intent, "pay-1").await;
    judged!(must_be_charged(&first));
    let second = rig.pay("client", &intent, "pay-1").await;
    let charges = rig.charges(&intent).await?;
    if charges.len() > 1 {
        return Ok(Verdict::Fail(
            fail("replay_charged").arg("count", charges.len()),
        ));
    }
    if !charged(&second) || second.charge_id != first.charge_id {
        return Ok(Verdict::Fail(
            fail("replay_differs")
                .arg("status", status_of(&second))
                .arg("first", first.charge_id.clone().unwrap_or_default())
                .arg(
                    "second",
                    second.charge_id.clone().unwrap_or_else(|| "-".into()),
                ),
        ));
    }
    if !second.replayed_header {
        return Ok(Verdict::Fail(fail("no_replay_header")));
    }
    Ok(Verdict::Pass)
}

async fn changed_payment(rig: &mut Rig) -> Checked {
    rig.provider_dedup(false).await?;
    let intent = Intent::new(2);
    rig.step(Msg::new("step.changed_payment"));
    let first = rig.pay("client", &intent, "pay-2").await;
    judged!(must_be_charged(&first));
    let changed = intent.with_amount(AMOUNT + 1000);
    let second = rig.pay("client", &changed, "pay-2").await;
    let charges = rig.charges(&intent).await?;
    if charges.len() > 1 {
        return Ok(Verdict::Fail(
            fail("changed_charged").arg("count", charges.len()),
        ));
    }
    if second.status != Some(422) {
        return Ok(Verdict::Fail(
            fail("changed_not_422").arg("status", status_of(&second)),
        ));
    }
    if !second.json_body {
        return Ok(Verdict::Fail(fail("not_json").arg("status", 422)));
    }
    Ok(Verdict::Pass)
}

async fn new_key(rig: &mut Rig) -> Checked {
    rig.provider_dedup(false).await?;
    let intent = Intent::new(3);
    rig.step(Msg::new("step.new_key"));
    let first = rig.pay("client", &intent, "pay-3a").await;
    judged!(must_be_charged(&first));
    let second = rig.pay("client", &intent, "pay-3b").await;
    let charges = rig.charges(&intent).await?;
    if !charged(&second) || second.replayed_header || second.charge_id == first.charge_id {
        return Ok(Verdict::Fail(
            fail("new_key_replayed").arg("status", status_of(&second)),
        ));
    }
    if charges.len() != 2 {
        return Ok(Verdict::Fail(
            fail("new_key_charges").arg("count", charges.len()),
        ));
    }
    Ok(Verdict::Pass)
}

async fn invalid_keys(rig: &mut Rig) -> Checked {
    rig.provider_dedup(false).await?;
    rig.step(Msg::new("step.invalid_keys"));
    let keys = [String::new(), "order:4".to_string(), "k".repeat(256)];
    let mut intents = Vec::new();
    let mut wrong = None;
    for (n, key) in keys.iter().enumerate() {
        let intent = Intent::new(40 + n as u32);
        let answer = rig.pay("client", &intent, key).await;
        if wrong.is_none() && (answer.status != Some(400) || !answer.json_body) {
            wrong = Some((key.clone(), answer));
        }
        intents.push(intent);
    }
    let mut charged_count = 0;
    for intent in &intents {
        charged_count += rig.charges(intent).await?.len();
    }
    if charged_count > 0 {
        return Ok(Verdict::Fail(
            fail("invalid_key_charged").arg("count", charged_count),
        ));
    }
    if let Some((key, answer)) = wrong {
        let shown = match key.chars().count() {
            0 => Msg::new("key.empty"),
            n if n > 40 => Msg::new("key.long").arg("n", n),
            _ => Msg::new("key.quoted").arg("key", key),
        };
        let why = if answer.status == Some(400) {
            fail("not_json").arg("status", 400)
        } else {
            fail("invalid_key_status")
                .arg("key", shown)
                .arg("status", status_of(&answer))
        };
        return Ok(Verdict::Fail(why));
    }
    Ok(Verdict::Pass)
}

async fn in_flight(rig: &mut Rig) -> Checked {
    rig.provider_dedup(false).await?;
    let intent = Intent::new(5);
    rig.step(Msg::new("step.hold_first").arg("who", "A"));
    let (hold, first) = match rig.pay_held("client.A", &intent, "pay-5").await {
        Reached::Held { hold, call } => (hold, call),
        Reached::Answered(answer) => {
            return Ok(Verdict::Fail(
                fail("not_charged").arg("status", status_of(&answer)),
            ));
        }
        Reached::Never => return Ok(Verdict::Unknown(Msg::new("unknown.never_held"))),
    };
    rig.step(Msg::new("step.duplicate"));
    let duplicate = rig.pay("client.B", &intent, "pay-5").await;
    rig.step(Msg::new("step.duplicate_changed"));
    let changed = rig
        .pay("client.C", &intent.with_amount(AMOUNT + 1000), "pay-5")
        .await;
    let answered = rig.let_go("A", hold, first).await;
    let charges = rig.charges(&intent).await?;
    if charges.len() > 1 {
        return Ok(Verdict::Fail(
            fail("duplicate_charged").arg("count", charges.len()),
        ));
    }
    if duplicate.status != Some(409) {
        return Ok(Verdict::Fail(
            fail("no_conflict").arg("status", status_of(&duplicate)),
        ));
    }
    if duplicate.retry_after.is_none() {
        return Ok(Verdict::Fail(fail("no_retry_after")));
    }
    if !matches!(changed.status, Some(409 | 422)) {
        return Ok(Verdict::Fail(
            fail("changed_in_flight").arg("status", status_of(&changed)),
        ));
    }
    match answered {
        Some(answer) if charged(&answer) => {}
        Some(answer) => {
            return Ok(Verdict::Fail(
                fail("not_charged").arg("status", status_of(&answer)),
            ));
        }
        None => return Ok(Verdict::Unknown(Msg::new("unknown.never_held"))),
    }
    rig.step(Msg::new("step.retry_after_first"));
    let retry = rig.pay("client.B", &intent, "pay-5").await;
    if !charged(&retry) || Some(&charges[0].charge_id) != retry.charge_id.as_ref() {
        return Ok(Verdict::Fail(
            fail("replay_differs")
                .arg("status", status_of(&retry))
                .arg("first", charges[0].charge_id.as_str())
                .arg(
                    "second",
                    retry.charge_id.clone().unwrap_or_else(|| "-".into()),
                ),
        ));
    }
    Ok(Verdict::Pass)
}

async fn lost_answer(rig: &mut Rig) -> Checked {
    let dedup = rig.manifest_dedup();
    rig.provider_dedup(dedup).await?;
    let intent = Intent::new(6);
    rig.step(Msg::new("step.lost_armed"));
    let (hold, first) = match rig.pay_held("client", &intent, "pay-6").await {
        Reached::Held { hold, call } => (hold, call),
        Reached::Answered(answer) => {
            return Ok(Verdict::Fail(
                fail("not_charged").arg("status", status_of(&answer)),
            ));
        }
        Reached::Never => return Ok(Verdict::Unknown(Msg::new("unknown.never_held"))),
    };
    // Aimed at the connections open now: the one carrying the charge is the first to get an
    // answer back (the service's idle ones, if it keeps any, carry none).
    let (lost, trigger) = rig
        .provider_hop
        .arm_on_trigger(faultproxy::Fault::ResponseLostAfterCommit, 1);
    trigger.fire();
    hold.release();
    let fired = tokio::time::timeout(STAGING_LIMIT, lost.fired()).await;
    let exchange = first.await.ok();
    if let Some(exchange) = &exchange {
        rig.schedule.push(Line::Call(exchange.clone()));
    }
    if fired.is_err() {
        return Ok(Verdict::Unknown(Msg::new("unknown.fault_not_fired")));
    }
    rig.step(Msg::new("step.retry"));
    let retry = rig.pay("client", &intent, "pay-6").await;
    let charges = rig.charges(&intent).await?;
    if charges.len() > 1 {
        return Ok(charged_twice("lost_charged_twice", &charges, dedup));
    }
    if !charged(&retry) {
        return Ok(Verdict::Fail(
            fail("retry_not_charged").arg("status", status_of(&retry)),
        ));
    }
    Ok(Verdict::Pass)
}

async fn tenants(rig: &mut Rig) -> Checked {
    rig.provider_dedup(false).await?;
    let first = Intent::new(7);
    let second = Intent {
        tenant: OTHER_TENANT,
        order: Intent::new(8).order,
        amount: AMOUNT + 500,
    };
    rig.step(Msg::new("step.tenants"));
    let a = rig.pay("tenant_1", &first, "pay-7").await;
    judged!(must_be_charged(&a));
    let b = rig.pay("tenant_2", &second, "pay-7").await;
    let charges_b = rig.charges(&second).await?;
    if !charged(&b) || b.replayed_header || b.charge_id == a.charge_id || charges_b.len() != 1 {
        return Ok(Verdict::Fail(
            fail("tenant_sees_other")
                .arg("status", status_of(&b))
                .arg("count", charges_b.len()),
        ));
    }
    rig.step(Msg::new("step.tenants_replay"));
    let a_again = rig.pay("tenant_1", &first, "pay-7").await;
    let b_again = rig.pay("tenant_2", &second, "pay-7").await;
    // Each tenant's retry is the replay check's business; here, neither may get the other's.
    if a_again.charge_id == b.charge_id || b_again.charge_id == a.charge_id {
        return Ok(Verdict::Fail(fail("tenant_replay_mixed")));
    }
    Ok(Verdict::Pass)
}

async fn result_ttl(rig: &mut Rig) -> Checked {
    rig.provider_dedup(false).await?;
    let window = rig.retry_window();
    let intent = Intent::new(9);
    rig.step(Msg::new("step.result_ttl").arg("window", window as i64));
    let first = rig.pay("client", &intent, "pay-9").await;
    judged!(must_be_charged(&first));
    let found = rig.keys_naming("pay-9").await?;
    let prefix = rig.prefix.clone();
    // Another run's keys on a shared Redis (`lab:<its run>:…`) are not this program's.
    let found: Vec<(String, i64)> = found
        .into_iter()
        .filter(|(key, _)| key.starts_with(&prefix) || !key.starts_with("lab:"))
        .collect();
    for (key, pttl) in &found {
        rig.step(
            Msg::new("step.redis_key")
                .arg("key", key.as_str())
                .arg("pttl", *pttl),
        );
    }
    if let Some((key, _)) = found.iter().find(|(key, _)| !key.starts_with(&prefix)) {
        return Ok(Verdict::Fail(
            fail("outside_prefix")
                .arg("key", key.as_str())
                .arg("prefix", prefix.as_str()),
        ));
    }
    let Some(&(ref key, shortest)) = found
        .iter()
        .filter(|(_, pttl)| *pttl != -1)
        .min_by_key(|(_, pttl)| *pttl)
        .or_else(|| found.first())
    else {
        return Ok(Verdict::Fail(
            fail("no_record").arg("prefix", prefix.as_str()),
        ));
    };
    // -1: no expiry at all; the window is covered (for ever).
    if shortest != -1 && shortest < window as i64 * 1000 - TTL_SLACK_MS {
        return Ok(Verdict::Fail(
            fail("ttl_short")
                .arg("key", key.as_str())
                .arg("seconds", shortest / 1000)
                .arg("window", window as i64),
        ));
    }
    Ok(Verdict::Pass)
}

async fn redis_blip(rig: &mut Rig) -> Checked {
    rig.provider_dedup(false).await?;
    let warm = Intent::new(10);
    rig.step(Msg::new("step.warm"));
    let answer = rig.pay("client", &warm, "pay-10").await;
    judged!(must_be_charged(&answer));
    rig.step(Msg::new("step.blip"));
    rig.redis_hop.set_enabled(false).await?;
    rig.redis_hop.set_enabled(true).await?;
    let intent = Intent::new(11);
    rig.step(Msg::new("step.hold_first").arg("who", "A"));
    // A service that fails closed on its dead connection answers 503 without charging: the
    // client retries, as it would (a few times at most).
    let mut held = None;
    for _ in 0..3 {
        match rig.pay_held("client.A", &intent, "pay-11").await {
            Reached::Held { hold, call } => {
                held = Some((hold, call));
                break;
            }
            Reached::Answered(answer) if answer.status == Some(503) => {
                rig.step(Msg::new("step.retry"));
            }
            Reached::Answered(answer) => {
                return Ok(Verdict::Fail(
                    fail("not_charged").arg("status", status_of(&answer)),
                ));
            }
            Reached::Never => return Ok(Verdict::Unknown(Msg::new("unknown.never_held"))),
        }
    }
    let Some((hold, first)) = held else {
        return Ok(Verdict::Fail(fail("blip_refused")));
    };
    rig.step(Msg::new("step.duplicate"));
    rig.pay("client.B", &intent, "pay-11").await;
    rig.let_go("A", hold, first).await;
    let charges = rig.charges(&intent).await?;
    if charges.len() > 1 {
        return Ok(Verdict::Fail(
            fail("blip_unprotected").arg("count", charges.len()),
        ));
    }
    Ok(Verdict::Pass)
}

async fn redis_down(rig: &mut Rig) -> Checked {
    let dedup = rig.manifest_dedup();
    rig.provider_dedup(dedup).await?;
    let intent = Intent::new(12);
    rig.step(Msg::new("step.redis_down"));
    rig.redis_hop.set_enabled(false).await?;
    let first = rig
        .pay_within("client", &intent, "pay-12", OUTAGE_PATIENCE)
        .await;
    rig.step(Msg::new("step.retry"));
    let second = rig
        .pay_within("client", &intent, "pay-12", OUTAGE_PATIENCE)
        .await;
    rig.redis_hop.set_enabled(true).await?;
    rig.step(Msg::new("step.redis_back"));
    let charges = rig.charges(&intent).await?;
    if charges.len() > 1 {
        let why = if dedup {
            charged_twice("fail_open_keys", &charges, true)
        } else {
            Verdict::Fail(fail("fail_open_no_dedup").arg("count", charges.len()))
        };
        return Ok(why);
    }
    for answer in [&first, &second] {
        let fine = match answer.status {
            Some(503) => true,
            Some(s) if (200..300).contains(&s) => charged(answer),
            _ => false,
        };
        if !fine {
            return Ok(Verdict::Fail(
                fail("down_status").arg("status", status_of(answer)),
            ));
        }
    }
    if charges.is_empty() && [&first, &second].iter().any(|a| charged(a)) {
        return Ok(Verdict::Fail(fail("down_made_up")));
    }
    Ok(Verdict::Pass)
}

async fn slow_provider(rig: &mut Rig) -> Checked {
    let dedup = rig.manifest_dedup();
    rig.step(
        Msg::new("step.short_lease")
            .arg("lease", SHORT_LEASE_SECONDS as i64)
            .arg("usual", LEASE_SECONDS as i64),
    );
    if rig.start_service(SHORT_LEASE_SECONDS).await?.is_err() {
        return Ok(Verdict::Unknown(Msg::new("unknown.no_restart")));
    }
    rig.provider_dedup(dedup).await?;
    let intent = Intent::new(13);
    rig.step(Msg::new("step.hold_first").arg("who", "A"));
    let (hold, first) = match rig.pay_held("client.A", &intent, "pay-13").await {
        Reached::Held { hold, call } => (hold, call),
        Reached::Answered(answer) => {
            return Ok(Verdict::Fail(
                fail("not_charged").arg("status", status_of(&answer)),
            ));
        }
        Reached::Never => return Ok(Verdict::Unknown(Msg::new("unknown.never_held"))),
    };
    // The provider stays slow until the reservation is gone from Redis (the lease ran out),
    // or for three leases, whichever comes first: a service that renews its lease keeps it.
    let started = Instant::now();
    let longest = Duration::from_secs(SHORT_LEASE_SECONDS * 3);
    while started.elapsed() < longest && rig.reserved("pay-13").await? {
        tokio::time::sleep(EXPIRY_POLL).await;
    }
    let still = rig.reserved("pay-13").await?;
    rig.step(
        Msg::new(if still {
            "step.reservation_kept"
        } else {
            "step.reservation_gone"
        })
        .arg("seconds", format!("{:.1}", started.elapsed().as_secs_f64())),
    );
    rig.step(Msg::new("step.duplicate"));
    rig.pay("client.B", &intent, "pay-13").await;
    rig.let_go("A", hold, first).await;
    let charges = rig.charges(&intent).await?;
    if charges.len() > 1 {
        return Ok(charged_twice("slow_charged_twice", &charges, dedup));
    }
    Ok(Verdict::Pass)
}

/// The name of the check `lab exercise verify` runs on two solutions at once.
pub const CROSS_REPLAY: &str = "cross-replay";

/// Two services on one Redis, one prefix and one provider (the rig's, and `other`, started
/// beside it) replay each other's Charges: what `idem` being wire-compatible with
/// idempotency-kit means. Each pays a payment the other then replays; one charge each.
pub async fn cross_replay(
    mut rig: Rig,
    other_dir: &std::path::Path,
    other: Manifest,
) -> Result<CheckReport, ExerciseError> {
    let first_lang = rig.manifest.lang.clone();
    let second_lang = other.lang.clone();
    let verdict: Checked = async {
        let mut second = match rig.start_beside(other_dir, other).await? {
            Ok(guest) => guest,
            Err(_) => return Ok(Verdict::Unknown(Msg::new("unknown.no_restart"))),
        };
        let first = rig.guest.as_ref().expect("started").base_url();
        let verdict: Checked = async {
            rig.provider_dedup(false).await?;
            let pairs = [
                (
                    Intent::new(20),
                    "pay-20",
                    &first,
                    &second.base_url(),
                    &first_lang,
                    &second_lang,
                ),
                (
                    Intent::new(21),
                    "pay-21",
                    &second.base_url(),
                    &first,
                    &second_lang,
                    &first_lang,
                ),
            ];
            for (intent, key, payer, replayer, paid_in, replayed_in) in pairs {
                rig.step(
                    Msg::new("step.cross")
                        .arg("paid", paid_in.as_str())
                        .arg("replayed", replayed_in.as_str()),
                );
                let paid = rig.pay_at(payer, &intent, key).await;
                judged!(must_be_charged(&paid));
                let replayed = rig.pay_at(replayer, &intent, key).await;
                let charges = rig.charges(&intent).await?;
                if charges.len() != 1
                    || !replayed.replayed_header
                    || replayed.charge_id != paid.charge_id
                {
                    return Ok(Verdict::Fail(
                        fail("cross_replay")
                            .arg("paid", paid_in.as_str())
                            .arg("replayed", replayed_in.as_str())
                            .arg("status", status_of(&replayed))
                            .arg("count", charges.len()),
                    ));
                }
            }
            Ok(Verdict::Pass)
        }
        .await;
        second.stop().await;
        verdict
    }
    .await;
    let schedule = std::mem::take(&mut rig.schedule);
    rig.close().await;
    Ok(CheckReport {
        name: CROSS_REPLAY,
        verdict: verdict?,
        schedule,
        seed: None,
        output: None,
    })
}

impl World for Rig {
    fn schedule(&mut self) -> &mut Vec<Line> {
        &mut self.schedule
    }

    fn mark(&self) -> Mark {
        self.guest.as_ref().map(Guest::mark).unwrap_or_default()
    }

    async fn check(&mut self, name: &str) -> Checked {
        run(name, self).await
    }

    async fn after(&mut self) {
        self.provider_hop.disarm_all_faults();
        let _ = self.redis_hop.set_enabled(true).await;
    }

    async fn output(&self, mark: &Mark) -> Option<String> {
        self.guest.as_ref()?.said_since(mark).await
    }

    async fn close(self) {
        Rig::close(self).await;
    }
}
