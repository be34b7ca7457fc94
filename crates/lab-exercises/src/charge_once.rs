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
//! | `changed-payment` | one key, then the same key with another amount, another currency, another order, each on its own | 422 each time, and no second charge |
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

use std::path::Path;
use std::time::{Duration, Instant};

use lab_core::Msg;
use lab_services::provider;
use lab_services::spec::ServiceEnv;
use redis::aio::MultiplexedConnection;
use tokio::task::JoinHandle;

use crate::error::ExerciseError;
use crate::exercise::{Check, CheckOptions, Checked, Checks, Exercise, Setup, Subject};
use crate::guest::{Guest, NotReady};
use crate::judgement::{Judged, broke, fail, undecided, unknown, verdict_of};
use crate::lab_side::{LabProvider, Reached, STAGING_LIMIT, glob_escape, scan, send_held};
use crate::manifest::Manifest;
use crate::payment::{AMOUNT, Intent, OTHER_TENANT, charged, keys_of, must_be_charged};
use crate::rig::{Program, Rig, World, run_checks};
use crate::verdict::{ChargeRow, CheckReport, Line, Sent};

pub static EXERCISE: Exercise = Exercise {
    name: "charge-once",
    lesson: "payments",
    needs: lab_infra::Needs::REDIS,
    langs: &["python", "rust"],
    rust_uses_idem: true,
    checks: &CHECKS,
    open: |setup| Box::pin(open(setup)),
};

static CHECKS: Checks<ChargeOnce> = Checks(&[
    Check::new("replay", |w| Box::pin(replay(w))).starter_fails(),
    Check::new("changed-payment", |w| Box::pin(changed_payment(w))).starter_fails(),
    Check::new("new-key", |w| Box::pin(new_key(w))),
    Check::new("invalid-keys", |w| Box::pin(invalid_keys(w))).starter_fails(),
    Check::new("in-flight", |w| Box::pin(in_flight(w))).starter_fails(),
    Check::new("lost-answer", |w| Box::pin(lost_answer(w))).starter_fails(),
    Check::new("tenants", |w| Box::pin(tenants(w))),
    Check::new("result-ttl", |w| Box::pin(result_ttl(w))).starter_fails(),
    Check::new("redis-blip", |w| Box::pin(redis_blip(w))).starter_fails(),
    Check::new("redis-down", |w| Box::pin(redis_down(w))).starter_fails(),
    Check::new("slow-provider", |w| Box::pin(slow_provider(w)))
        .restarts()
        .starter_fails(),
]);

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

/// What the charge-once checks work with.
pub struct ChargeOnce {
    rig: Rig,
    /// `KEY_PREFIX`: every key of the learner's records must start with it.
    prefix: String,
    /// The lab's own connection to Redis, straight to the server (not through the proxy).
    redis: MultiplexedConnection,
    /// The learner's service → Redis.
    redis_hop: faultproxy::Proxy,
    /// The learner's service → the provider.
    provider_hop: faultproxy::Proxy,
    provider: LabProvider,
    /// The manifest's integration contract: whether the provider removes duplicates by key.
    provider_dedup: bool,
    /// The manifest's retry window, in seconds.
    retry_window: u64,
}

async fn open(setup: Setup<'_>) -> Result<Checked, ExerciseError> {
    let Setup {
        subject,
        servers,
        options,
        on_report,
    } = setup;
    let Subject::Program { dir, manifest } = subject else {
        return Err(ExerciseError::TargetNotApplicable {
            exercise: "charge-once",
            why: "with its Redis and its provider behind the fault proxy",
        });
    };
    with_payments_space(servers, async |space, redis, redis_addr| {
        let world = ChargeOnce::open(
            &space.run_id,
            format!("{}idempotency:", space.prefix),
            redis,
            redis_addr,
            Program { dir, manifest },
            options,
        )
        .await?;
        match world {
            Ok(world) => Ok(Checked::Reports(
                run_checks(&CHECKS, world, options, on_report).await?,
            )),
            Err(not_ready) => Ok(Checked::NotReady(not_ready)),
        }
    })
    .await
}

/// Runs `work` in a run space of its own on the servers' Redis (its key prefix released on
/// every way out), with the lab's connection and the address a fault proxy reaches Redis at.
pub(crate) async fn with_payments_space(
    servers: &lab_infra::Servers,
    work: impl AsyncFnOnce(
        &lab_infra::RunSpace,
        MultiplexedConnection,
        &str,
    ) -> Result<Checked, ExerciseError>,
) -> Result<Checked, ExerciseError> {
    let redis = servers
        .redis
        .as_ref()
        .ok_or(ExerciseError::ServerMissing("Redis"))?;
    let redis_addr = crate::lab_side::redis_address(&redis.url, "the payments lesson")?;
    let space = lab_infra::RunSpace::create(servers, &[]).await?;
    let result = work(&space, redis.conn.clone(), &redis_addr).await;
    space.release(servers, false).await?;
    result
}

impl ChargeOnce {
    /// Starts the provider, the two proxied links, and the learner's service (built first).
    async fn open(
        run: &str,
        prefix: String,
        redis: MultiplexedConnection,
        redis_addr: &str,
        program: Program,
        options: &CheckOptions,
    ) -> Result<Result<ChargeOnce, NotReady>, ExerciseError> {
        let provider_dedup = program.manifest.provider_dedup.unwrap_or(true);
        let retry_window = program
            .manifest
            .retry_window_secs
            .unwrap_or(DEFAULT_RETRY_WINDOW_SECS);
        let mut rig = Rig::new(run, options, Some(program));
        rig.build().await?;
        let env = ServiceEnv::default().with_checkpoints(rig.checkpoints.clone());
        let provider = LabProvider::at(rig.launch(&provider::SPEC, env)?);
        let redis_hop = rig.proxy("redis", redis_addr).await?;
        let provider_hop = rig
            .proxy("provider", provider.url().trim_start_matches("http://"))
            .await?;
        let mut world = ChargeOnce {
            rig,
            prefix,
            redis,
            redis_hop,
            provider_hop,
            provider,
            provider_dedup,
            retry_window,
        };
        if let Err(not_ready) = world.start_service(LEASE_SECONDS).await? {
            world.rig.close().await;
            return Ok(Err(not_ready));
        }
        Ok(Ok(world))
    }

    fn step(&mut self, msg: Msg) {
        self.rig.step(msg);
    }

    /// The environment of the learner's service with `lease` as its `LEASE_SECONDS`.
    fn env(&self, lease: u64) -> crate::guest_env::GuestEnv {
        crate::guest_env::GuestEnv {
            redis_url: Some(format!("redis://{}/0", self.redis_hop.listen_addr())),
            key_prefix: Some(self.prefix.clone()),
            provider_url: Some(format!("http://{}", self.provider_hop.listen_addr())),
            lease_seconds: Some(lease),
            ..self.rig.env()
        }
    }

    /// Starts (or starts again) the learner's service with `lease` as its `LEASE_SECONDS`.
    async fn start_service(&mut self, lease: u64) -> Result<Result<(), NotReady>, ExerciseError> {
        let env = self.env(lease);
        self.rig.start_service(env).await
    }

    /// Pays `intent` with `key` as `who`, and records the exchange.
    async fn pay(&mut self, who: &str, intent: &Intent, key: &str) -> Sent {
        self.pay_within(who, intent, key, PATIENT).await
    }

    async fn pay_within(
        &mut self,
        who: &str,
        intent: &Intent,
        key: &str,
        timeout: Duration,
    ) -> Sent {
        let url = format!("{}/payments", self.rig.service_url());
        self.rig.send(intent.call(&url, who, key, timeout)).await
    }

    /// Sends a payment that the provider holds once it has charged, before its answer goes
    /// out; returns once it is held there, or has answered without getting there.
    async fn pay_held(&mut self, who: &str, intent: &Intent, key: &str) -> Reached {
        let url = format!("{}/payments", self.rig.service_url());
        let call = intent.call(&url, who, key, STAGING_LIMIT * 2);
        let reached = send_held(
            &self.rig.http,
            &self.rig.checkpoints,
            provider::CHARGED,
            call,
        )
        .await;
        if let Reached::Answered(sent) = &reached {
            self.rig.record(Line::Call(sent.clone()));
        }
        reached
    }

    /// Lets a held call go on, and records its answer.
    async fn let_go(
        &mut self,
        who: &str,
        hold: lab_core::checkpoint::Hold,
        call: JoinHandle<Sent>,
    ) -> Option<Sent> {
        self.step(Msg::new("step.let_go").arg("who", who));
        hold.release();
        let sent = call.await.ok()?;
        self.rig.record(Line::Call(sent.clone()));
        Some(sent)
    }

    /// Switches the provider's deduplication by key, and says so.
    async fn provider_dedup(&mut self, on: bool) -> Result<(), ExerciseError> {
        let said = self.provider.dedup(on).await?;
        self.rig.record(said);
        Ok(())
    }

    /// The charges the provider made for `intent`'s order, recorded.
    async fn charges(&mut self, intent: &Intent) -> Result<Vec<ChargeRow>, ExerciseError> {
        let (charges, line) = self.provider.charges(&intent.order).await?;
        self.rig.record(line);
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
                .await?;
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
}

impl World for ChargeOnce {
    fn rig(&mut self) -> &mut Rig {
        &mut self.rig
    }

    async fn after(&mut self) {
        self.provider_hop.disarm_all_faults();
        let _ = self.redis_hop.set_enabled(true).await;
    }

    async fn close(self) {
        self.rig.close().await;
    }
}

/// Why an intent was charged more than once, named by what the provider saw: no key, a key
/// that changed, or one stable key that a provider without deduplication could not use.
fn charged_twice<T>(what: &str, charges: &[ChargeRow], dedup: bool) -> Judged<T> {
    let why = if charges.iter().all(|c| c.key.is_none()) {
        "no_provider_key"
    } else if charges.windows(2).any(|w| w[0].key != w[1].key) {
        "provider_keys_differ"
    } else if dedup {
        "charged_twice"
    } else {
        "no_dedup"
    };
    fail(
        broke(what)
            .arg("count", charges.len())
            .arg("keys", keys_of(charges))
            .arg("why", Msg::new(format!("why.{why}"))),
    )
}

/// A payment that could not be held in the provider: the verdict that says what came instead.
fn held(reached: Reached) -> Judged<(lab_core::checkpoint::Hold, JoinHandle<Sent>)> {
    match reached {
        Reached::Held { hold, call } => Ok((hold, call)),
        Reached::Answered(answer) => fail(broke("not_charged").arg("status", answer.status_arg())),
        Reached::Never => unknown(undecided("never_held")),
    }
}

async fn replay(w: &mut ChargeOnce) -> Judged {
    w.provider_dedup(false).await?;
    let intent = Intent::new(1);
    w.step(Msg::new("step.replay"));
    let first = w.pay("client", &intent, "pay-1").await;
    must_be_charged(&first)?;
    let second = w.pay("client", &intent, "pay-1").await;
    let charges = w.charges(&intent).await?;
    if charges.len() > 1 {
        return fail(broke("replay_charged").arg("count", charges.len()));
    }
    if !charged(&second) || second.charge_id != first.charge_id {
        return fail(
            broke("replay_differs")
                .arg("status", second.status_arg())
                .arg("first", first.charge_id.clone().unwrap_or_default())
                .arg(
                    "second",
                    second.charge_id.clone().unwrap_or_else(|| "-".into()),
                ),
        );
    }
    if !second.replayed_header {
        return fail(broke("no_replay_header"));
    }
    Ok(())
}

async fn changed_payment(w: &mut ChargeOnce) -> Judged {
    w.provider_dedup(false).await?;
    let intent = Intent::new(2);
    w.step(Msg::new("step.changed_payment"));
    let first = w.pay("client", &intent, "pay-2").await;
    must_be_charged(&first)?;
    // Each field of the payment changed on its own, under the one key.
    let changes = [
        ("amount", intent.with_amount(AMOUNT + 1000)),
        ("currency", intent.with_currency("USD")),
        ("order_id", intent.with_order(22)),
    ];
    for (field, changed) in changes {
        w.step(Msg::new("step.changed_field").arg("field", field));
        let second = w.pay("client", &changed, "pay-2").await;
        let charges = w.charges(&intent).await?;
        let elsewhere = if changed.order == intent.order {
            Vec::new()
        } else {
            w.charges(&changed).await?
        };
        if charges.len() + elsewhere.len() > 1 {
            return fail(
                broke("changed_charged")
                    .arg("field", field)
                    .arg("count", charges.len() + elsewhere.len()),
            );
        }
        if second.status != Some(422) {
            return fail(
                broke("changed_not_422")
                    .arg("field", field)
                    .arg("status", second.status_arg()),
            );
        }
        if !second.json_body {
            return fail(broke("not_json").arg("status", 422));
        }
    }
    Ok(())
}

async fn new_key(w: &mut ChargeOnce) -> Judged {
    w.provider_dedup(false).await?;
    let intent = Intent::new(3);
    w.step(Msg::new("step.new_key"));
    let first = w.pay("client", &intent, "pay-3a").await;
    must_be_charged(&first)?;
    let second = w.pay("client", &intent, "pay-3b").await;
    let charges = w.charges(&intent).await?;
    if !charged(&second) || second.replayed_header || second.charge_id == first.charge_id {
        return fail(broke("new_key_replayed").arg("status", second.status_arg()));
    }
    if charges.len() != 2 {
        return fail(broke("new_key_charges").arg("count", charges.len()));
    }
    Ok(())
}

async fn invalid_keys(w: &mut ChargeOnce) -> Judged {
    w.provider_dedup(false).await?;
    w.step(Msg::new("step.invalid_keys"));
    let keys = [String::new(), "order:4".to_string(), "k".repeat(256)];
    let mut intents = Vec::new();
    let mut wrong = None;
    for (n, key) in keys.iter().enumerate() {
        let intent = Intent::new(40 + n as u32);
        let answer = w.pay("client", &intent, key).await;
        if wrong.is_none() && (answer.status != Some(400) || !answer.json_body) {
            wrong = Some((key.clone(), answer));
        }
        intents.push(intent);
    }
    let mut charged_count = 0;
    for intent in &intents {
        charged_count += w.charges(intent).await?.len();
    }
    if charged_count > 0 {
        return fail(broke("invalid_key_charged").arg("count", charged_count));
    }
    if let Some((key, answer)) = wrong {
        let shown = match key.chars().count() {
            0 => Msg::new("key.empty"),
            n if n > 40 => Msg::new("key.long").arg("n", n),
            _ => Msg::new("key.quoted").arg("key", key),
        };
        if answer.status == Some(400) {
            return fail(broke("not_json").arg("status", 400));
        }
        return fail(
            broke("invalid_key_status")
                .arg("key", shown)
                .arg("status", answer.status_arg()),
        );
    }
    Ok(())
}

async fn in_flight(w: &mut ChargeOnce) -> Judged {
    w.provider_dedup(false).await?;
    let intent = Intent::new(5);
    w.step(Msg::new("step.hold_first").arg("who", "A"));
    let reached = w.pay_held("client.A", &intent, "pay-5").await;
    let (hold, first) = held(reached)?;
    w.step(Msg::new("step.duplicate"));
    let duplicate = w.pay("client.B", &intent, "pay-5").await;
    w.step(Msg::new("step.duplicate_changed"));
    let changed = w
        .pay("client.C", &intent.with_amount(AMOUNT + 1000), "pay-5")
        .await;
    let answered = w.let_go("A", hold, first).await;
    let charges = w.charges(&intent).await?;
    if charges.len() > 1 {
        return fail(broke("duplicate_charged").arg("count", charges.len()));
    }
    if duplicate.status != Some(409) {
        return fail(broke("no_conflict").arg("status", duplicate.status_arg()));
    }
    if duplicate.retry_after.is_none() {
        return fail(broke("no_retry_after"));
    }
    if !matches!(changed.status, Some(409 | 422)) {
        return fail(broke("changed_in_flight").arg("status", changed.status_arg()));
    }
    match answered {
        Some(answer) => must_be_charged(&answer)?,
        None => return unknown(undecided("never_held")),
    }
    w.step(Msg::new("step.retry_after_first"));
    let retry = w.pay("client.B", &intent, "pay-5").await;
    if !charged(&retry) || Some(&charges[0].charge_id) != retry.charge_id.as_ref() {
        return fail(
            broke("replay_differs")
                .arg("status", retry.status_arg())
                .arg("first", charges[0].charge_id.as_str())
                .arg(
                    "second",
                    retry.charge_id.clone().unwrap_or_else(|| "-".into()),
                ),
        );
    }
    Ok(())
}

async fn lost_answer(w: &mut ChargeOnce) -> Judged {
    let dedup = w.provider_dedup;
    w.provider_dedup(dedup).await?;
    let intent = Intent::new(6);
    w.step(Msg::new("step.lost_armed"));
    let reached = w.pay_held("client", &intent, "pay-6").await;
    let (hold, first) = held(reached)?;
    // Aimed at the connections open now: the one carrying the charge is the first to get an
    // answer back (the service's idle ones, if it keeps any, carry none).
    let (lost, trigger) = w
        .provider_hop
        .arm_on_trigger(faultproxy::Fault::ResponseLostAfterCommit, 1);
    trigger.fire();
    hold.release();
    let fired = tokio::time::timeout(STAGING_LIMIT, lost.fired()).await;
    if let Ok(sent) = first.await {
        w.rig.record(Line::Call(sent));
    }
    if fired.is_err() {
        return unknown(undecided("fault_not_fired"));
    }
    w.step(Msg::new("step.retry"));
    let retry = w.pay("client", &intent, "pay-6").await;
    let charges = w.charges(&intent).await?;
    if charges.len() > 1 {
        return charged_twice("lost_charged_twice", &charges, dedup);
    }
    if !charged(&retry) {
        return fail(broke("retry_not_charged").arg("status", retry.status_arg()));
    }
    Ok(())
}

async fn tenants(w: &mut ChargeOnce) -> Judged {
    w.provider_dedup(false).await?;
    let first = Intent::new(7);
    let second = Intent {
        tenant: OTHER_TENANT,
        amount: AMOUNT + 500,
        ..Intent::new(8)
    };
    w.step(Msg::new("step.tenants"));
    let a = w.pay("tenant_1", &first, "pay-7").await;
    must_be_charged(&a)?;
    let b = w.pay("tenant_2", &second, "pay-7").await;
    let charges_b = w.charges(&second).await?;
    if !charged(&b) || b.replayed_header || b.charge_id == a.charge_id || charges_b.len() != 1 {
        return fail(
            broke("tenant_sees_other")
                .arg("status", b.status_arg())
                .arg("count", charges_b.len()),
        );
    }
    w.step(Msg::new("step.tenants_replay"));
    let a_again = w.pay("tenant_1", &first, "pay-7").await;
    let b_again = w.pay("tenant_2", &second, "pay-7").await;
    // Each tenant's retry is the replay check's business; here, neither may get the other's.
    if a_again.charge_id == b.charge_id || b_again.charge_id == a.charge_id {
        return fail(broke("tenant_replay_mixed"));
    }
    Ok(())
}

async fn result_ttl(w: &mut ChargeOnce) -> Judged {
    w.provider_dedup(false).await?;
    let window = w.retry_window;
    let intent = Intent::new(9);
    w.step(Msg::new("step.result_ttl").arg("window", window));
    let first = w.pay("client", &intent, "pay-9").await;
    must_be_charged(&first)?;
    let found = w.keys_naming("pay-9").await?;
    let prefix = w.prefix.clone();
    // Another run's keys on a shared Redis (`lab:<its run>:…`) are not this program's.
    let found: Vec<(String, i64)> = found
        .into_iter()
        .filter(|(key, _)| key.starts_with(&prefix) || !key.starts_with("lab:"))
        .collect();
    for (key, pttl) in &found {
        w.step(
            Msg::new("step.redis_key")
                .arg("key", key.as_str())
                .arg("pttl", *pttl),
        );
    }
    if let Some((key, _)) = found.iter().find(|(key, _)| !key.starts_with(&prefix)) {
        return fail(
            broke("outside_prefix")
                .arg("key", key.as_str())
                .arg("prefix", prefix.as_str()),
        );
    }
    let Some(&(ref key, shortest)) = found
        .iter()
        .filter(|(_, pttl)| *pttl != -1)
        .min_by_key(|(_, pttl)| *pttl)
        .or_else(|| found.first())
    else {
        return fail(broke("no_record").arg("prefix", prefix.as_str()));
    };
    // -1: no expiry at all; the window is covered (for ever).
    if shortest != -1 && shortest < window as i64 * 1000 - TTL_SLACK_MS {
        return fail(
            broke("ttl_short")
                .arg("key", key.as_str())
                .arg("seconds", shortest / 1000)
                .arg("window", window),
        );
    }
    Ok(())
}

async fn redis_blip(w: &mut ChargeOnce) -> Judged {
    w.provider_dedup(false).await?;
    let warm = Intent::new(10);
    w.step(Msg::new("step.warm"));
    let answer = w.pay("client", &warm, "pay-10").await;
    must_be_charged(&answer)?;
    w.step(Msg::new("step.blip"));
    w.redis_hop.set_enabled(false).await?;
    w.redis_hop.set_enabled(true).await?;
    let intent = Intent::new(11);
    w.step(Msg::new("step.hold_first").arg("who", "A"));
    // A service that fails closed on its dead connection answers 503 without charging: the
    // client retries, as it would (a few times at most).
    let mut held = None;
    for _ in 0..3 {
        match w.pay_held("client.A", &intent, "pay-11").await {
            Reached::Held { hold, call } => {
                held = Some((hold, call));
                break;
            }
            Reached::Answered(answer) if answer.status == Some(503) => {
                w.step(Msg::new("step.retry"));
            }
            Reached::Answered(answer) => {
                return fail(broke("not_charged").arg("status", answer.status_arg()));
            }
            Reached::Never => return unknown(undecided("never_held")),
        }
    }
    let Some((hold, first)) = held else {
        return fail(broke("blip_refused"));
    };
    w.step(Msg::new("step.duplicate"));
    w.pay("client.B", &intent, "pay-11").await;
    w.let_go("A", hold, first).await;
    let charges = w.charges(&intent).await?;
    if charges.len() > 1 {
        return fail(broke("blip_unprotected").arg("count", charges.len()));
    }
    Ok(())
}

async fn redis_down(w: &mut ChargeOnce) -> Judged {
    let dedup = w.provider_dedup;
    w.provider_dedup(dedup).await?;
    let intent = Intent::new(12);
    w.step(Msg::new("step.redis_down"));
    w.redis_hop.set_enabled(false).await?;
    let first = w
        .pay_within("client", &intent, "pay-12", OUTAGE_PATIENCE)
        .await;
    w.step(Msg::new("step.retry"));
    let second = w
        .pay_within("client", &intent, "pay-12", OUTAGE_PATIENCE)
        .await;
    w.redis_hop.set_enabled(true).await?;
    w.step(Msg::new("step.redis_back"));
    let charges = w.charges(&intent).await?;
    if charges.len() > 1 {
        if dedup {
            return charged_twice("fail_open_keys", &charges, true);
        }
        return fail(broke("fail_open_no_dedup").arg("count", charges.len()));
    }
    for answer in [&first, &second] {
        let fine = match answer.status {
            Some(503) => true,
            Some(s) if (200..300).contains(&s) => charged(answer),
            _ => false,
        };
        if !fine {
            return fail(broke("down_status").arg("status", answer.status_arg()));
        }
    }
    if charges.is_empty() && [&first, &second].iter().any(|a| charged(a)) {
        return fail(broke("down_made_up"));
    }
    Ok(())
}

async fn slow_provider(w: &mut ChargeOnce) -> Judged {
    let dedup = w.provider_dedup;
    w.step(
        Msg::new("step.short_lease")
            .arg("lease", SHORT_LEASE_SECONDS)
            .arg("usual", LEASE_SECONDS),
    );
    if w.start_service(SHORT_LEASE_SECONDS).await?.is_err() {
        return unknown(undecided("no_restart"));
    }
    w.provider_dedup(dedup).await?;
    let intent = Intent::new(13);
    w.step(Msg::new("step.hold_first").arg("who", "A"));
    let reached = w.pay_held("client.A", &intent, "pay-13").await;
    let (hold, first) = held(reached)?;
    // The provider stays slow until the reservation is gone from Redis (the lease ran out),
    // or for three leases, whichever comes first: a service that renews its lease keeps it.
    let started = Instant::now();
    let longest = Duration::from_secs(SHORT_LEASE_SECONDS * 3);
    while started.elapsed() < longest && w.reserved("pay-13").await? {
        tokio::time::sleep(EXPIRY_POLL).await;
    }
    let still = w.reserved("pay-13").await?;
    w.step(
        Msg::new(if still {
            "step.reservation_kept"
        } else {
            "step.reservation_gone"
        })
        .arg("seconds", format!("{:.1}", started.elapsed().as_secs_f64())),
    );
    w.step(Msg::new("step.duplicate"));
    w.pay("client.B", &intent, "pay-13").await;
    w.let_go("A", hold, first).await;
    let charges = w.charges(&intent).await?;
    if charges.len() > 1 {
        return charged_twice("slow_charged_twice", &charges, dedup);
    }
    Ok(())
}

/// The name of the check `lab exercise verify` runs on two solutions at once.
pub const CROSS_REPLAY: &str = "cross-replay";

/// `lab exercise verify`'s proof that `idem` is wire-compatible with idempotency-kit: two
/// services on one Redis, one prefix and one provider (`first`, and `second` started beside
/// it) replay each other's Charges. Each pays a payment the other then replays; one charge
/// each.
pub async fn cross_replay(
    servers: &lab_infra::Servers,
    first: Program,
    second: Program,
    options: &CheckOptions,
) -> Result<Checked, ExerciseError> {
    Guest::new(
        &second.dir,
        second.manifest.clone(),
        0,
        options.guest_env.clone(),
    )?
    .build()
    .await?;
    with_payments_space(servers, async |space, redis, redis_addr| {
        let world = ChargeOnce::open(
            &space.run_id,
            format!("{}idempotency:", space.prefix),
            redis,
            redis_addr,
            first,
            options,
        )
        .await?;
        match world {
            Ok(world) => Ok(Checked::Reports(vec![
                replay_each_other(world, &second.dir, second.manifest).await?,
            ])),
            Err(not_ready) => Ok(Checked::NotReady(not_ready)),
        }
    })
    .await
}

async fn replay_each_other(
    mut w: ChargeOnce,
    other_dir: &Path,
    other: Manifest,
) -> Result<CheckReport, ExerciseError> {
    let first_lang = w.rig.manifest().map(|m| m.lang.clone()).unwrap_or_default();
    let second_lang = other.lang.clone();
    let judged: Judged = async {
        let mut env = w.env(LEASE_SECONDS);
        let port = lab_infra::process::free_port().map_err(ExerciseError::io(other_dir))?;
        env.port = Some(port);
        let mut second = Guest::new(other_dir, other, port, env.vars())?;
        if second.start().await?.is_err() {
            return unknown(undecided("no_restart"));
        }
        let first = w.rig.service_url();
        let judged: Judged = async {
            w.provider_dedup(false).await?;
            let pairs = [
                (20, &first, &second.base_url(), &first_lang, &second_lang),
                (21, &second.base_url(), &first, &second_lang, &first_lang),
            ];
            for (n, payer, replayer, paid_in, replayed_in) in pairs {
                let intent = Intent::new(n);
                let key = format!("pay-{n}");
                w.step(
                    Msg::new("step.cross")
                        .arg("paid", paid_in.as_str())
                        .arg("replayed", replayed_in.as_str()),
                );
                let url = |base: &str| format!("{base}/payments");
                let paid = w
                    .rig
                    .send(intent.call(&url(payer), "client", &key, PATIENT))
                    .await;
                must_be_charged(&paid)?;
                let replayed = w
                    .rig
                    .send(intent.call(&url(replayer), "client", &key, PATIENT))
                    .await;
                let charges = w.charges(&intent).await?;
                if charges.len() != 1
                    || !replayed.replayed_header
                    || replayed.charge_id != paid.charge_id
                {
                    return fail(
                        broke("cross_replay")
                            .arg("paid", paid_in.as_str())
                            .arg("replayed", replayed_in.as_str())
                            .arg("status", replayed.status_arg())
                            .arg("count", charges.len()),
                    );
                }
            }
            Ok(())
        }
        .await;
        second.stop().await;
        judged
    }
    .await;
    let schedule = std::mem::take(&mut w.rig.schedule);
    w.rig.close().await;
    Ok(CheckReport {
        name: CROSS_REPLAY,
        verdict: verdict_of(judged)?,
        schedule,
        seed: None,
        output: None,
    })
}
