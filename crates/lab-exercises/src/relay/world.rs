//! The relay's world: the chain around the learner's relay (the lab's provider and payment
//! service, the recorder in front of them, the two fault proxies), and the lab's client's calls
//! into the relay.

use std::time::{Duration, Instant};

use lab_core::Msg;
use lab_services::spec::ServiceEnv;
use lab_services::{payments, provider};
use tokio::task::JoinHandle;

use super::recorder::{Attempt, Recorder};
use super::{CHECKS, DEFAULT_DEADLINE_MS, PATIENT, ROUTE, told_attempts};
use crate::call::Call;
use crate::error::ExerciseError;
use crate::exercise::{CheckOptions, Checked, Setup, Subject};
use crate::guest::NotReady;
use crate::lab_side::{LabProvider, Reached, send_held};
use crate::payment::Intent;
use crate::rig::{Program, Rig, World, run_checks};
use crate::verdict::{ChargeRow, Line, Sent};

/// What the relay checks work with.
pub struct Relay {
    pub(super) rig: Rig,
    provider: LabProvider,
    /// Where the relay's calls go, through the down proxy.
    pub(super) recorder: Recorder,
    /// The lab's client → the relay.
    pub(super) inbound: faultproxy::Proxy,
    /// The relay → the recorder.
    pub(super) down: faultproxy::Proxy,
    /// The one deadline the manifest promises.
    pub(super) deadline: Duration,
    /// The payments the lab has watched for attempts after their answer (`deadline`'s and
    /// `backoff`'s), in the order they were answered: they stay watched for the rest of the run
    /// (see [`super::nothing_after_any`]).
    pub(super) watched: Vec<Watched>,
}

/// A payment the relay answered, watched for attempts after that answer: its order, the key the
/// lab's client sent, and when the answer came.
#[derive(Clone, Debug)]
pub(super) struct Watched {
    pub(super) order: String,
    pub(super) key: String,
    pub(super) answered: Instant,
}

/// The exercise's `open`: the relay's world on the caller's servers (its own key prefix on
/// Redis, released on every way out), the selected checks run in it.
pub(super) async fn open(setup: Setup<'_>) -> Result<Checked, ExerciseError> {
    let Setup {
        subject,
        servers,
        options,
        on_report,
    } = setup;
    let Subject::Program { dir, manifest } = subject else {
        return Err(ExerciseError::TargetNotApplicable {
            exercise: "relay",
            why: "between its own client and its own payment service, behind the fault proxy",
        });
    };
    let redis_url = servers
        .redis
        .as_ref()
        .ok_or(ExerciseError::ServerMissing("Redis"))?
        .url
        .clone();
    let space = lab_infra::RunSpace::create(servers, &[]).await?;
    let result = async {
        match Relay::open(&space, &redis_url, Program { dir, manifest }, options).await? {
            Ok(world) => Ok(Checked::Reports(
                run_checks(&CHECKS, world, options, on_report).await?,
            )),
            Err(not_ready) => Ok(Checked::NotReady(not_ready)),
        }
    }
    .await;
    space.release(servers, false).await?;
    result
}

impl Relay {
    /// Starts the chain around the learner's relay (built first): the provider, the lab's
    /// payment service on Redis under the run's prefix, the recorder in front of it, the two
    /// proxies, the relay.
    async fn open(
        space: &lab_infra::RunSpace,
        redis_url: &str,
        program: Program,
        options: &CheckOptions,
    ) -> Result<Result<Relay, NotReady>, ExerciseError> {
        let deadline =
            Duration::from_millis(program.manifest.deadline_ms.unwrap_or(DEFAULT_DEADLINE_MS));
        let mut rig = Rig::new(&space.run_id, options, Some(program));
        rig.build().await?;
        let provider_env = ServiceEnv::default().with_checkpoints(rig.checkpoints.clone());
        let provider = LabProvider::at(rig.launch(&provider::SPEC, provider_env)?);
        let env = ServiceEnv::default()
            .with_redis(redis_url)
            .with_key_prefix(&space.prefix)
            .with_peer(provider::NAME, provider.url().to_string())
            .with_checkpoints(rig.checkpoints.clone());
        let payments = rig.launch(&payments::SPEC, env)?;
        let recorder = Recorder::start(&payments).await?;
        let down = rig.proxy("payments", recorder.address()).await?;
        let env = crate::guest_env::GuestEnv {
            payments_url: Some(format!("http://{}", down.listen_addr())),
            ..rig.env()
        };
        if let Err(not_ready) = rig.start_service(env).await? {
            rig.close().await;
            return Ok(Err(not_ready));
        }
        let port = rig.guest.as_ref().map_or(0, |g| g.port);
        let inbound = rig
            .proxy(&format!("in-{port}"), &format!("127.0.0.1:{port}"))
            .await?;
        Ok(Ok(Relay {
            rig,
            provider,
            recorder,
            inbound,
            down,
            deadline,
            watched: Vec::new(),
        }))
    }

    pub(super) fn step(&mut self, msg: Msg) {
        self.rig.step(msg);
    }

    fn through_proxy(&self) -> String {
        format!("http://{}{ROUTE}", self.inbound.listen_addr())
    }

    pub(super) fn call(&self, intent: &Intent, key: &str, patience: Duration) -> Call {
        intent.call(&self.through_proxy(), "client", key, patience)
    }

    /// Pays `intent` with `key` through the inbound proxy, and records the exchange.
    pub(super) async fn pay(&mut self, intent: &Intent, key: &str) -> Paid {
        self.pay_within(intent, key, PATIENT).await
    }

    pub(super) async fn pay_within(
        &mut self,
        intent: &Intent,
        key: &str,
        patience: Duration,
    ) -> Paid {
        let paid = pay_relay(&self.rig.http, self.call(intent, key, patience)).await;
        self.rig.record(Line::Call(paid.sent.clone()));
        paid
    }

    pub(super) async fn charges(
        &mut self,
        intent: &Intent,
    ) -> Result<Vec<ChargeRow>, ExerciseError> {
        let (charges, line) = self.provider.charges(&intent.order).await?;
        self.rig.record(line);
        Ok(charges)
    }

    /// The attempts of `intent`'s payment, told as a step (times from `from`).
    pub(super) fn attempts(&mut self, intent: &Intent, from: Instant) -> Vec<Attempt> {
        let attempts = self.recorder.attempts(&intent.order);
        self.step(told_attempts(&attempts, from));
        attempts
    }

    /// A payment held in the lab's payment service (its key reserved, the provider not called
    /// yet), sent through the inbound proxy.
    pub(super) async fn pay_held(&mut self, intent: &Intent, key: &str) -> Reached {
        let call = intent.call(&self.through_proxy(), "client", key, PATIENT);
        let reached = send_held(
            &self.rig.http,
            &self.rig.checkpoints,
            payments::IN_ACTION,
            call,
        )
        .await;
        if let Reached::Answered(sent) = &reached {
            self.rig.record(Line::Call(sent.clone()));
        }
        reached
    }

    pub(super) async fn let_go(
        &mut self,
        hold: lab_core::checkpoint::Hold,
        call: JoinHandle<Sent>,
    ) -> Option<Sent> {
        hold.release();
        let sent = call.await.ok()?;
        self.rig.record(Line::Call(sent.clone()));
        Some(sent)
    }
}

impl World for Relay {
    fn rig(&mut self) -> &mut Rig {
        &mut self.rig
    }

    async fn after(&mut self) {
        self.down.disarm_all_faults();
        self.inbound.disarm_all_faults();
        self.recorder.let_go();
    }

    async fn close(self) {
        drop(self.recorder);
        self.rig.close().await;
    }
}

/// One call into the relay as the lab's client made it: its record, the whole body of its
/// answer, and when the answer had come (an upper bound of when the relay sent it).
pub(super) struct Paid {
    pub(super) sent: Sent,
    pub(super) body: Option<String>,
    pub(super) at: Instant,
}

/// Sends `call` to the relay. The same as [`crate::call::send`], keeping what the relay checks
/// judge and a [`Sent`] cuts: the whole body, and the moment the answer came.
pub(super) async fn pay_relay(http: &reqwest::Client, call: Call) -> Paid {
    let mut request = http
        .post(&call.url)
        .timeout(call.timeout)
        .header("content-type", call.content_type)
        .body(call.body.clone());
    if let Some(key) = &call.key {
        request = request.header("idempotency-key", key.as_str());
    }
    let answer = lab_services::client::call(request).await;
    let at = Instant::now();
    let body = answer.body.clone().unwrap_or_default();
    let parsed: Option<serde_json::Value> = serde_json::from_str(&body).ok();
    let sent = Sent {
        who: call.who,
        path: ROUTE.to_string(),
        key: call.key,
        body: crate::call::cut(&call.body),
        status: answer.status,
        answer: crate::call::cut(&body),
        no_answer: answer.detail,
        waited_ms: u64::try_from(call.timeout.as_millis()).unwrap_or(u64::MAX),
        json_body: parsed.is_some(),
        report_id: None,
        replayed: None,
        charge_id: parsed
            .as_ref()
            .and_then(|v| Some(v.get("charge_id")?.as_str()?.to_string())),
        replayed_header: answer.replayed,
        retry_after: answer.retry_after,
        outcome: answer.outcome,
    };
    Paid {
        sent,
        body: answer.body,
        at,
    }
}
