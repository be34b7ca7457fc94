//! `lab soak chain`: the chain of the `chain` scenario, paid through again and again with faults
//! placed at random (seeded) points, and the invariant "one charge per key" checked every time.
//!
//! One [`iteration`] is one payment on a fresh stage: its own run space (Redis key prefix), its
//! own fault proxies, and the gateway, orders, payment service and provider, every hop through
//! the embedded fault proxy. Its seed decides everything random in it: which hops get a fault,
//! which fault (the answer lost after the work was done, the request lost, the connection reset
//! or refused, the answer delayed) and for how many connections. The client then pays with one
//! key, retrying what gets no definite answer with the same key, as the lesson says a client
//! must, and the provider's own list of charges is read back:
//!
//! - more than one charge for the key is a **violation** (the money moved twice);
//! - so is a client told 200 with a charge the provider does not have.
//!
//! With the protections on (orders passes the client's key down unchanged, the payment service
//! guards its keys, the provider deduplicates by key) no iteration may break the invariant. With
//! them off (the broken design: orders mints a key per attempt, no key guard, no deduplication
//! at the provider), a lost answer below orders charges twice, and the soak counts how often.
//!
//! Seeds chain: iteration 0 uses the seed given, each next one [`next_seed`] of the one before,
//! so any iteration can be replayed alone with its own seed and one iteration.
//!
//! The payment service's key guard only matters for invalid keys, and the soak's keys are
//! valid: it is switched with the others so that "off" is the whole broken design, but it does
//! not change what this soak measures.

use std::time::Duration;

use faultproxy::{ArmedFault, Fault};
use lab_core::Checkpoints;
use lab_infra::{RunSpace, Servers};
use lab_services::admin::Admin;
use lab_services::payments::PaymentChange;
use lab_services::provider::ProviderConfig;
use lab_services::relay::RelayConfig;
use lab_services::{gateway, orders, payments, provider};
use rand::rngs::ChaCha8Rng;
use rand::{Rng as _, RngExt as _, SeedableRng as _};
use serde::Serialize;
use serde_json::Value;
use tokio_util::task::TaskTracker;

use crate::ScenarioError;
use crate::kit::payments::{AMOUNT, payment};
use crate::kit::{Answer, Caller};
use lab_services::faults::Faults;
use lab_services::stage::Hop;
use lab_services::stage::{Ports, Stage, StageConfig};

/// The hops a fault may be placed on, in the order of the chain.
const HOPS: [&lab_services::ServiceSpec; 4] = [
    &gateway::SPEC,
    &orders::SPEC,
    &payments::SPEC,
    &provider::SPEC,
];

/// How many times the client tries one payment before it gives up (the outcome then stays
/// unknown, which is allowed; two charges are not).
const CLIENT_ATTEMPTS: u32 = 6;

/// The client's pause before trying again. Shorter than the `Retry-After: 1` of a 409: a soak
/// that waited a second each time would spend its time sleeping.
const CLIENT_PAUSE: Duration = Duration::from_millis(150);

/// How long the client waits for one answer: longer than the gateway's whole retry deadline.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// The next seed of the chain of seeds: the first draw of ChaCha8 from this one (every seed,
/// zero included, has a next one, and nearby seeds lead to unrelated ones).
pub fn next_seed(seed: u64) -> u64 {
    ChaCha8Rng::seed_from_u64(seed).next_u64()
}

/// The generator of an iteration's choices: ChaCha8 from the iteration's seed, on a stream of
/// its own, so it never draws what the chain of seeds draws (the next iteration would otherwise
/// make this one's choices).
fn choices(seed: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(1);
    rng
}

/// A fault placed on one hop: the next `connections` connections to that service get it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Placed {
    pub hop: &'static str,
    /// The fault, named as the learner sees it.
    pub fault: String,
    pub connections: usize,
    #[serde(skip)]
    kind: Fault,
}

impl std::fmt::Display for Placed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} ×{}", self.hop, self.fault, self.connections)
    }
}

/// Where an iteration's faults go, drawn from its seed alone.
pub fn plan(seed: u64) -> Vec<Placed> {
    let mut draw = choices(seed);
    let mut placed = Vec::new();
    for spec in HOPS {
        // About half the hops of an iteration get a fault.
        if draw.random_bool(0.5) {
            continue;
        }
        let (kind, name) = match draw.random_range(0..40) {
            0..=7 => (
                Fault::ResponseLostAfterCommit,
                "answer lost after the work".into(),
            ),
            8..=15 => (Fault::Reset, "connection reset while the work runs".into()),
            16..=20 => (Fault::RequestLost, "request lost".into()),
            21..=25 => (Fault::ConnectionRefused, "connection refused".into()),
            // Rarely (each costs seconds), longer than a relay waits for one call (2 s): the
            // relay retries while the first call is still running below it.
            26..=27 => {
                let ms = draw.random_range(2_100..2_500);
                (
                    Fault::SlowResponse(Duration::from_millis(ms)),
                    format!("answer delayed {ms} ms"),
                )
            }
            _ => {
                let ms = draw.random_range(5..205);
                (
                    Fault::SlowResponse(Duration::from_millis(ms)),
                    format!("answer delayed {ms} ms"),
                )
            }
        };
        placed.push(Placed {
            hop: spec.name,
            fault: name,
            connections: draw.random_range(1..=2),
            kind,
        });
    }
    placed
}

/// What one iteration measured.
#[derive(Debug, Clone, Serialize)]
pub struct Iteration {
    pub seed: u64,
    pub faults: Vec<Placed>,
    /// How many of the placed faults did their damage at least once.
    pub faults_fired: usize,
    /// The client's last answer (`None`: no answer at all), after its retries.
    pub client_status: Option<u16>,
    pub client_attempts: u32,
    /// Requests the payment service received (each relay's retries included).
    pub payments_calls: u64,
    /// Charges at the provider for the one key.
    pub charges: usize,
    /// Why the invariant broke, if it did.
    pub violation: Option<String>,
}

/// Runs one iteration from `seed` on `servers` (which must have Redis), with the protections on
/// or off. Everything it starts is stopped, and its keys deleted, however it ends.
pub async fn iteration(
    servers: &Servers,
    seed: u64,
    protections: bool,
) -> Result<Iteration, ScenarioError> {
    let space = RunSpace::create(servers, &[]).await?;
    let tasks = TaskTracker::new();
    let result = run_on(&space, &tasks, seed, protections).await;
    tasks.close();
    let _ = tokio::time::timeout(Duration::from_secs(5), tasks.wait()).await;
    let released = space.release(servers, false).await;
    let report = result?;
    released?;
    Ok(report)
}

async fn run_on(
    space: &RunSpace,
    tasks: &TaskTracker,
    seed: u64,
    protections: bool,
) -> Result<Iteration, ScenarioError> {
    let faults = Faults::embedded(&space.run_id, tasks).await?;
    let hops = HOPS.map(Hop::Service);
    let config = StageConfig {
        space,
        narrator: None,
        checkpoints: Checkpoints::new(),
        tasks: tasks.clone(),
        faults: Some(&faults),
        hops: &hops,
    };
    let stage = match Stage::start(&[&gateway::SPEC], &config, Ports::Free).await {
        Ok(stage) => stage,
        Err(e) => {
            faults.release().await;
            return Err(e.into());
        }
    };
    let paid = pay_under_faults(&stage, &faults, seed, protections).await;
    // A relay call abandoned after its timeout may still be running below when the client is
    // done. Cutting every hop first means nothing reaches a service after this point, so the
    // count below is what the provider has once the client is done (with the protections off
    // a later charge could be missed: the soak may undercount violations, never invent one).
    faults.release().await;
    let measured = match paid {
        Ok(paid) => measure(&stage, paid).await,
        Err(e) => Err(e),
    };
    stage.stop().await;
    measured
}

/// A service's own address, past its hop (the lab's switches and reads never meet a fault).
fn direct(stage: &Stage, spec: &lab_services::ServiceSpec) -> Result<String, ScenarioError> {
    stage
        .get(spec)
        .map(|s| format!("http://{}", s.direct))
        .ok_or_else(|| ScenarioError::Broken(format!("the {} service is not started", spec.name)))
}

/// The protections on (the design the lesson builds) or off (the broken one), service by
/// service, set directly (past the proxies, which carry the faults).
async fn switch_protections(stage: &Stage, protections: bool) -> Result<(), ScenarioError> {
    let caller = Caller::new();
    let relay = RelayConfig {
        mint_keys: !protections,
    };
    Admin::new(caller.http(), &direct(stage, &orders::SPEC)?)
        .configure(&relay)
        .await?;
    let guard = PaymentChange {
        key_guard: Some(protections),
        ..PaymentChange::default()
    };
    Admin::new(caller.http(), &direct(stage, &payments::SPEC)?)
        .configure(&guard)
        .await?;
    let dedup = ProviderConfig {
        dedup_by_key: protections,
    };
    Admin::new(caller.http(), &direct(stage, &provider::SPEC)?)
        .configure(&dedup)
        .await?;
    Ok(())
}

async fn pay_under_faults(
    stage: &Stage,
    faults: &Faults,
    seed: u64,
    protections: bool,
) -> Result<Paid, ScenarioError> {
    switch_protections(stage, protections).await?;
    let placed = plan(seed);
    let mut armed: Vec<ArmedFault> = Vec::new();
    for fault in &placed {
        let proxy = faults.embedded_proxy(fault.hop).ok_or_else(|| {
            ScenarioError::Broken(format!("no embedded proxy on the {} hop", fault.hop))
        })?;
        armed.push(proxy.arm(fault.kind.clone(), fault.connections));
    }
    let gateway_url = stage
        .get(&gateway::SPEC)
        .map(|s| s.url.clone())
        .ok_or_else(|| ScenarioError::Broken("the gateway is not started".into()))?;
    let (answer, attempts) = pay_until_definite(&gateway_url, &format!("soak-{seed:016x}")).await;
    Ok(Paid {
        seed,
        faults_fired: armed.iter().filter(|a| a.fired_count() > 0).count(),
        placed,
        status: answer.status,
        told: (answer.status == Some(200))
            .then(|| answer.json())
            .flatten(),
        attempts,
    })
}

/// The client pays once, with one key, and retries with it until it gets a definite answer (or
/// gives up): the last answer, and how many calls it took.
async fn pay_until_definite(gateway_url: &str, key: &str) -> (Answer, u32) {
    let caller = Caller::waiting(CLIENT_TIMEOUT);
    let body = payment(AMOUNT);
    let mut attempts = 0;
    loop {
        attempts += 1;
        let answer = caller
            .post(&format!("{gateway_url}/checkout"), Some(key), &body)
            .await;
        // No answer, 409 (still in progress), 502–504 (unknown outcome): the same key again,
        // later. Anything else is definite.
        let again = answer
            .status
            .is_none_or(|code| matches!(code, 409 | 502..=504));
        if !again || attempts == CLIENT_ATTEMPTS {
            return (answer, attempts);
        }
        tokio::time::sleep(CLIENT_PAUSE).await;
    }
}

/// What the client did and saw, before the count.
struct Paid {
    seed: u64,
    placed: Vec<Placed>,
    faults_fired: usize,
    status: Option<u16>,
    told: Option<Value>,
    attempts: u32,
}

/// Reads the provider's charges and the payment service's request count, and checks the
/// invariant.
async fn measure(stage: &Stage, paid: Paid) -> Result<Iteration, ScenarioError> {
    let caller = Caller::new();
    let charges = Admin::new(caller.http(), &direct(stage, &provider::SPEC)?)
        .charges(None)
        .await?;
    let payments_calls = Admin::new(caller.http(), &direct(stage, &payments::SPEC)?)
        .requests_received()
        .await?;

    let violation = if charges.len() > 1 {
        Some(format!("{} charges for one key", charges.len()))
    } else if let Some(told) = &paid.told {
        let ours = charges.first().map(|c| Value::from(c.charge_id.as_str()));
        (ours.as_ref() != Some(&told["charge_id"])).then(|| {
            format!(
                "the client was told charge {}, the provider has {}",
                told["charge_id"],
                ours.map_or("none".to_string(), |id| id.to_string())
            )
        })
    } else {
        None
    };
    Ok(Iteration {
        seed: paid.seed,
        faults_fired: paid.faults_fired,
        faults: paid.placed,
        client_status: paid.status,
        client_attempts: paid.attempts,
        payments_calls,
        charges: charges.len(),
        violation,
    })
}
