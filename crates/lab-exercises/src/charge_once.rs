//! Exercise `charge-once` (the payments lesson): the learner's payment service, `POST /payments`
//! with an Idempotency-Key, on Redis and the lab's payment provider. The lab owns the external
//! effect: the provider counts every charge, so any implementation, in any language, is judged
//! by the one invariant that matters: one charge per payment intent. The oracle is the
//! provider's list of charges and of the requests it got (and, for what the service keeps,
//! Redis itself), never the service's own answers.
//!
//! ```text
//!   the lab's client ──► the learner's service ──► fault proxy ──► Redis (keys under KEY_PREFIX)
//!                                 └──────────────► fault proxy ──► the lab's provider (charges)
//! ```
//!
//! | check             | the schedule                                                             | the invariant                                  |
//! |-------------------|--------------------------------------------------------------------------|------------------------------------------------|
//! | `replay`          | one key, the same payment twice                                          | one charge; the same Charge, `Idempotent-Replayed: true` |
//! | `changed-payment` | one key, then the same key with another amount, another currency, another order, each on its own | 422 each time, and no second charge (both orders counted) |
//! | `new-key`         | a new key for a new payment with the same parameters                     | two charges: a key is an intent, not a body    |
//! | `invalid-keys`    | an empty key, one with a colon, one of 256 characters                    | 400 with a JSON body each; nothing charged     |
//! | `in-flight`       | the first call held inside the provider; the duplicate and one with another amount sent beside it, not waited on | one charge; the duplicate 409 with `Retry-After`, or (having waited) the first Charge replayed; the other amount 422 or 409 |
//! | `lost-answer`     | the provider charges, its answer is lost on the way back; the client retries | one charge                                  |
//! | `tenants`         | two tenants, one client key, the manifest's provider                     | two charges, each tenant its own Charge        |
//! | `result-ttl`      | one payment; what it wrote under KEY_PREFIX (a SCAN before and after), read with `PTTL`; nothing written: the payment again | the record that holds the Charge lives the manifest's retry window (nothing written and not replayed: not stored) |
//! | `shared-records`  | a second instance beside the first: a payment at one replayed at the other; the first held in the provider, its duplicate at the other | one charge each; the replay, and 409 or the replay for the duplicate |
//! | `redis-blip`      | the Redis link cut for a moment and restored; the next payment held in the provider, its duplicate sent | one charge: the next payment was protected (blamed on the blip only when Redis held nothing of it) |
//! | `redis-down`      | the Redis link cut; two calls with one key                               | 503 (fail closed) or one charge (a provider that deduplicates) |
//! | `slow-provider`   | the first call held in the provider past the learner's lease (until its reservation is gone from Redis, or 1.5 leases); its duplicate sent | one charge (renewal, or the provider's key) |
//! | `redis-lost`      | the first call held in the provider, Redis cut, the call let go (its result cannot be stored), Redis back; the client retries for three leases | one charge, and the retries end in the Charge (a reservation without expiry is named) |
//! | `crash`           | the first call held in the provider, the service killed and started again; the client retries for three leases | one charge, and the retries end in the Charge (a reservation without expiry is named) |
//!
//! The provider removes duplicates by key where the lesson's integration contract counts on it
//! (`lost-answer`, `tenants`, `redis-down`, `slow-provider`, `redis-lost`, `crash`), unless the
//! manifest says `provider_dedup = false`; elsewhere it charges every request, so a duplicate
//! the service let through shows as a second charge.
//!
//! A held call is watched: when the service gives up on the provider while the lab holds its
//! answer (its own timeout closed the connection, and the provider's handler was dropped:
//! `Hold::abandoned`), the first call is no longer in flight, and `in-flight`, `shared-records`
//! and `redis-blip` say unknown, with that reason, instead of judging a moment that did not
//! happen. `slow-provider` adapts: a service that gives up before its lease runs out has ended
//! the slow call itself, and the duplicate is judged all the same.
//!
//! `slow-provider`, `redis-lost` and `crash` need a short lease (the service restarted with
//! `LEASE_SECONDS=2`); `redis-blip`, `redis-down` and `redis-lost` cut the service's link to
//! Redis. The checks run in any order (`watch` runs the failed ones first, `verify` shuffles
//! them), and each finds the service as it needs it: every other check as the lesson runs it,
//! started again when one of those left it changed (`World::before`).
//!
//! The checks are in [`checks`] (one call, or a few in a row) and [`moments`] (a call held in
//! the provider while something else happens); [`staging`] holds a call and sends beside it,
//! [`records`] finds what a payment wrote under KEY_PREFIX.

mod checks;
mod moments;
mod records;
mod staging;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use lab_core::Msg;
use lab_services::provider;
use lab_services::spec::ServiceEnv;
use redis::aio::MultiplexedConnection;

use crate::error::ExerciseError;
use crate::exercise::{Check, CheckOptions, CheckSpec, Checked, Checks, Exercise, Setup, Subject};
use crate::guest::{Guest, NotReady};
use crate::judgement::{Judged, broke, fail, undecided, unknown, verdict_of};
use crate::lab_side::{LabProvider, scan};
use crate::manifest::Manifest;
use crate::payment::{Intent, must_be_charged};
use crate::rig::{Program, Rig, World, run_checks};
use crate::verdict::{ChargeRow, CheckReport, Sent};

use records::Records;

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
    Check::new("replay", |w| Box::pin(checks::replay(w))).starter_fails(),
    Check::new("changed-payment", |w| Box::pin(checks::changed_payment(w))).starter_fails(),
    Check::new("new-key", |w| Box::pin(checks::new_key(w))),
    Check::new("invalid-keys", |w| Box::pin(checks::invalid_keys(w))).starter_fails(),
    Check::new("in-flight", |w| Box::pin(moments::in_flight(w))).starter_fails(),
    Check::new("lost-answer", |w| Box::pin(checks::lost_answer(w))).starter_fails(),
    Check::new("tenants", |w| Box::pin(checks::tenants(w))),
    Check::new("result-ttl", |w| Box::pin(checks::result_ttl(w))).starter_fails(),
    Check::new("shared-records", |w| Box::pin(moments::shared_records(w))).starter_fails(),
    Check::new("redis-blip", |w| Box::pin(moments::redis_blip(w))).starter_fails(),
    Check::new("redis-down", |w| Box::pin(checks::redis_down(w))).starter_fails(),
    Check::new("slow-provider", |w| Box::pin(moments::slow_provider(w)))
        .restarts()
        .starter_fails(),
    Check::new("redis-lost", |w| Box::pin(moments::redis_lost(w)))
        .restarts()
        .starter_fails(),
    Check::new("crash", |w| Box::pin(moments::crash(w)))
        .restarts()
        .starter_fails(),
]);

/// The lesson's lease, given to the program as `LEASE_SECONDS`.
const LEASE_SECONDS: u64 = 30;
/// The lease the checks about a lease give the program instead (`slow-provider`, `redis-lost`,
/// `crash`): the lesson's 30 s would make each of them wait that long.
const SHORT_LEASE_SECONDS: u64 = 2;
/// The lesson's retry window for a payment: its result is kept an hour.
const DEFAULT_RETRY_WINDOW_SECS: u64 = 3600;
/// How long a call may take while Redis is down: idempotency-kit fails open only after the
/// Redis client has given up, and redis-py's defaults retry for seconds.
const OUTAGE_PATIENCE: Duration = Duration::from_secs(40);
/// How long a patient call waits otherwise.
const PATIENT: Duration = Duration::from_secs(15);
/// How long the lab's probe of the service's Redis link waits for a `PONG`.
const LINK_PROBE: Duration = Duration::from_secs(1);

/// What the charge-once checks work with.
pub struct ChargeOnce {
    rig: Rig,
    /// The run's own key space (`lab:<run>:`): another run's keys on a shared Redis are not
    /// this program's.
    run_prefix: String,
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
    /// The `LEASE_SECONDS` the running service was started with.
    lease: u64,
    /// A check cut the running service's link to Redis: its pooled connections were reset.
    redis_was_cut: bool,
    /// The learner's program, to start a second instance of it beside the first.
    program: Program,
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
        let world =
            ChargeOnce::open(space, redis, redis_addr, Program { dir, manifest }, options).await?;
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
        space: &lab_infra::RunSpace,
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
        let mut rig = Rig::new(&space.run_id, options, Some(program.clone()));
        rig.build().await?;
        let env = ServiceEnv::default().with_checkpoints(rig.checkpoints.clone());
        let provider = LabProvider::at(rig.launch(&provider::SPEC, env)?);
        let redis_hop = rig.proxy("redis", redis_addr).await?;
        let provider_hop = rig
            .proxy("provider", provider.url().trim_start_matches("http://"))
            .await?;
        let mut world = ChargeOnce {
            rig,
            run_prefix: space.prefix.clone(),
            prefix: format!("{}idempotency:", space.prefix),
            redis,
            redis_hop,
            provider_hop,
            provider,
            provider_dedup,
            retry_window,
            lease: LEASE_SECONDS,
            redis_was_cut: false,
            program,
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
        let started = self.rig.start_service(env).await?;
        if started.is_ok() {
            // A new process: the lease it was given, and connections of its own.
            self.lease = lease;
            self.redis_was_cut = false;
        }
        Ok(started)
    }

    /// The service runs with the short lease: started again with it, unless it already is.
    async fn with_short_lease(&mut self) -> Judged {
        if self.lease == SHORT_LEASE_SECONDS && !self.redis_was_cut {
            self.step(Msg::new("step.lease_is_short").arg("lease", SHORT_LEASE_SECONDS));
            return Ok(());
        }
        self.step(
            Msg::new("step.short_lease")
                .arg("lease", SHORT_LEASE_SECONDS)
                .arg("usual", LEASE_SECONDS),
        );
        if self.start_service(SHORT_LEASE_SECONDS).await?.is_err() {
            return unknown(undecided("no_restart"));
        }
        Ok(())
    }

    /// The URL of the service's payments route.
    fn payments_url(&self) -> String {
        format!("{}/payments", self.rig.service_url())
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
        let url = self.payments_url();
        self.rig.send(intent.call(&url, who, key, timeout)).await
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

    /// Every key under KEY_PREFIX now, each read (PTTL and value).
    async fn records(&mut self) -> Result<Records, ExerciseError> {
        let pattern = format!("{}*", crate::lab_side::glob_escape(&self.prefix));
        let keys = scan(&mut self.redis, &pattern).await?;
        self.reread(keys).await
    }

    /// `keys` read again now (a key that is gone reads PTTL -2).
    async fn reread(
        &mut self,
        keys: impl IntoIterator<Item = String>,
    ) -> Result<Records, ExerciseError> {
        let mut read = Records::default();
        for key in keys {
            let state = crate::lab_side::read_key(&mut self.redis, &key).await?;
            read.0.insert(key, state);
        }
        Ok(read)
    }

    /// Every key on the Redis server now, by name.
    async fn server_keys(&mut self) -> Result<BTreeSet<String>, ExerciseError> {
        Ok(scan(&mut self.redis, "*").await?.into_iter().collect())
    }

    /// Says each of `records` in the schedule: its name and PTTL.
    fn show(&mut self, records: &Records) {
        for (key, read) in &records.0 {
            self.step(
                Msg::new("step.redis_key")
                    .arg("key", key.as_str())
                    .arg("pttl", read.pttl),
            );
        }
    }

    /// Whether the learner's service answers `GET /health` now.
    async fn answers_health(&self) -> bool {
        let url = format!("{}/health", self.rig.service_url());
        self.rig
            .http
            .get(url)
            .timeout(LINK_PROBE)
            .send()
            .await
            .is_ok()
    }

    /// Whether a new connection through the service's Redis link answers `PING` now.
    async fn link_answers(&self) -> bool {
        let url = format!("redis://{}/0", self.redis_hop.listen_addr());
        let Ok(client) = redis::Client::open(url) else {
            return false;
        };
        let ping = async {
            let mut conn = client.get_multiplexed_async_connection().await?;
            redis::cmd("PING").query_async::<String>(&mut conn).await
        };
        matches!(tokio::time::timeout(LINK_PROBE, ping).await, Ok(Ok(_)))
    }

    /// Cuts the service's Redis link (connections reset and refused), and makes sure it is cut.
    async fn cut_redis(&mut self) -> Judged {
        self.redis_was_cut = true;
        self.redis_hop.set_enabled(false).await?;
        if self.link_answers().await {
            return unknown(undecided("link_not_cut"));
        }
        Ok(())
    }

    /// Cuts the service's Redis link (every connection reset) and restores it at once.
    async fn blip_redis(&mut self) -> Result<(), ExerciseError> {
        self.redis_was_cut = true;
        self.redis_hop.set_enabled(false).await?;
        self.redis_hop.set_enabled(true).await?;
        Ok(())
    }

    /// Restores the service's Redis link, and makes sure it answers again.
    async fn restore_redis(&mut self) -> Judged {
        self.redis_hop.set_enabled(true).await?;
        let started = std::time::Instant::now();
        while !self.link_answers().await {
            if started.elapsed() > crate::lab_side::STAGING_LIMIT {
                return unknown(undecided("link_not_restored"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }
}

impl World for ChargeOnce {
    fn rig(&mut self) -> &mut Rig {
        &mut self.rig
    }

    /// A check that does not start the service itself (with the short lease) finds it as the
    /// lesson runs it, whatever ran before: started again when an earlier check shortened its
    /// lease or cut its link to Redis. With two seconds, a loaded machine can let a held call's
    /// reservation run out before its duplicate arrives, and a correct service charges twice
    /// (`verify` saw it in `redis-blip` after `slow-provider`); a service whose pooled
    /// connections were reset is `redis-blip`'s to judge, not every later check's.
    async fn before(&mut self, spec: &CheckSpec) -> Judged {
        let changed = self.lease != LEASE_SECONDS || self.redis_was_cut;
        if spec.restarts || !changed || !self.rig.owns_program() {
            return Ok(());
        }
        self.step(Msg::new("step.as_in_the_lesson").arg("lease", LEASE_SECONDS));
        if self.start_service(LEASE_SECONDS).await?.is_err() {
            return unknown(undecided("no_restart"));
        }
        Ok(())
    }

    async fn after(&mut self) {
        self.provider_hop.disarm_all_faults();
        let _ = self.redis_hop.set_enabled(true).await;
    }

    async fn close(self) {
        self.rig.close().await;
    }
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
        let world = ChargeOnce::open(space, redis, redis_addr, first, options).await?;
        match world {
            Ok(world) => Ok(Checked::Reports(vec![
                replay_each_other(world, &second.dir, second.manifest).await?,
            ])),
            Err(not_ready) => Ok(Checked::NotReady(not_ready)),
        }
    })
    .await
}

/// Starts another instance of a program in `dir` beside the world's service: the same
/// environment (one Redis, one KEY_PREFIX, one provider), a port of its own. `Err` if it
/// never answered.
async fn start_beside(
    w: &ChargeOnce,
    dir: &Path,
    manifest: Manifest,
) -> Result<Result<Guest, NotReady>, ExerciseError> {
    let (beside, started) = Guest::start_on_a_free_port(dir, manifest, w.env(w.lease)).await?;
    Ok(started.map(|_| beside))
}

async fn replay_each_other(
    mut w: ChargeOnce,
    other_dir: &Path,
    other: Manifest,
) -> Result<CheckReport, ExerciseError> {
    let first_lang = w.rig.manifest().map(|m| m.lang.clone()).unwrap_or_default();
    let second_lang = other.lang.clone();
    let judged: Judged = async {
        let Ok(mut second) = start_beside(&w, other_dir, other).await? else {
            return unknown(undecided("no_restart"));
        };
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
