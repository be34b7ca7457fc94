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
use lab_services::{gateway, orders, payments, provider};
use serde::Serialize;
use serde_json::{Value, json};
use tokio_util::task::TaskTracker;

use crate::ScenarioError;
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

/// The next seed of the chain of seeds (splitmix64: every seed, zero included, has a next one,
/// and nearby seeds lead to unrelated ones).
pub fn next_seed(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A small generator for an iteration's choices, seeded by the iteration's seed. Its stream
/// starts elsewhere than the chain of seeds (which also steps with [`next_seed`]): otherwise the
/// next iteration would draw this one's choices shifted by one.
struct Draw(u64);

impl Draw {
    fn new(seed: u64) -> Draw {
        Draw(seed ^ 0x6a09_e667_f3bc_c909)
    }

    fn next(&mut self) -> u64 {
        self.0 = next_seed(self.0);
        self.0
    }

    /// A number in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
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
    let mut draw = Draw::new(seed);
    let mut placed = Vec::new();
    for spec in HOPS {
        // About half the hops of an iteration get a fault.
        if draw.below(2) == 0 {
            continue;
        }
        let (kind, name) = match draw.below(40) {
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
                let ms = 2_100 + draw.below(400);
                (
                    Fault::SlowResponse(Duration::from_millis(ms)),
                    format!("answer delayed {ms} ms"),
                )
            }
            _ => {
                let ms = 5 + draw.below(200);
                (
                    Fault::SlowResponse(Duration::from_millis(ms)),
                    format!("answer delayed {ms} ms"),
                )
            }
        };
        placed.push(Placed {
            hop: spec.name,
            fault: name,
            connections: 1 + draw.below(2) as usize,
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

/// A client of the soak: one connection per call, so a fault breaks exactly one.
fn client() -> Result<reqwest::Client, ScenarioError> {
    Ok(reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(CLIENT_TIMEOUT)
        .build()?)
}

fn direct(stage: &Stage, spec: &lab_services::ServiceSpec) -> Result<String, ScenarioError> {
    stage
        .get(spec)
        .map(|s| format!("http://{}", s.direct))
        .ok_or_else(|| ScenarioError::Broken(format!("the {} service is not started", spec.name)))
}

async fn configure(
    http: &reqwest::Client,
    url: String,
    change: Value,
) -> Result<(), ScenarioError> {
    http.put(format!("{url}/config"))
        .json(&change)
        .send()
        .await?
        .error_for_status()?;
    Ok(())
}

async fn get_json(http: &reqwest::Client, url: String) -> Result<Value, ScenarioError> {
    Ok(http
        .get(url)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?)
}

async fn pay_under_faults(
    stage: &Stage,
    faults: &Faults,
    seed: u64,
    protections: bool,
) -> Result<Paid, ScenarioError> {
    let http = client()?;
    // The switches, set directly (past the proxies, which carry the faults).
    configure(
        &http,
        direct(stage, &orders::SPEC)?,
        json!({"mint_keys": !protections}),
    )
    .await?;
    configure(
        &http,
        direct(stage, &payments::SPEC)?,
        json!({"key_guard": protections}),
    )
    .await?;
    configure(
        &http,
        direct(stage, &provider::SPEC)?,
        json!({"dedup_by_key": protections}),
    )
    .await?;

    let placed = plan(seed);
    let mut armed: Vec<ArmedFault> = Vec::new();
    for fault in &placed {
        let proxy = faults.embedded_proxy(fault.hop).ok_or_else(|| {
            ScenarioError::Broken(format!("no embedded proxy on the {} hop", fault.hop))
        })?;
        armed.push(proxy.arm(fault.kind.clone(), fault.connections));
    }

    // The client pays once, with one key, and retries with it until it gets a definite answer.
    let key = format!("soak-{seed:016x}");
    let gateway_url = stage
        .get(&gateway::SPEC)
        .map(|s| s.url.clone())
        .ok_or_else(|| ScenarioError::Broken("the gateway is not started".into()))?;
    let body = json!({
        "tenant_id": crate::payments::TENANT,
        "order_id": crate::payments::ORDER,
        "amount": crate::payments::AMOUNT,
        "currency": crate::payments::CURRENCY,
    });
    let mut status = None;
    let mut told: Option<Value> = None;
    let mut attempts = 0;
    while attempts < CLIENT_ATTEMPTS {
        attempts += 1;
        let sent = http
            .post(format!("{gateway_url}/checkout"))
            .header("Idempotency-Key", &key)
            .json(&body)
            .send()
            .await;
        if let Ok(response) = sent {
            let code = response.status().as_u16();
            status = Some(code);
            let answer: Value = response.json().await.unwrap_or(Value::Null);
            if code == 200 {
                told = Some(answer);
                break;
            }
            // 409 (still in progress), 502–504 (unknown outcome): the same key again, later.
            // Anything else is a definite refusal.
            if !matches!(code, 409 | 502..=504) {
                break;
            }
        } else {
            status = None;
        }
        tokio::time::sleep(CLIENT_PAUSE).await;
    }

    Ok(Paid {
        seed,
        faults_fired: armed.iter().filter(|a| a.fired_count() > 0).count(),
        placed,
        status,
        told,
        attempts,
    })
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
    let http = client()?;
    let charges = get_json(
        &http,
        format!("{}/charges", direct(stage, &provider::SPEC)?),
    )
    .await?;
    let charges: Vec<Value> = charges["charges"].as_array().cloned().unwrap_or_default();
    let payments_calls = get_json(&http, format!("{}/stats", direct(stage, &payments::SPEC)?))
        .await?["requests"]
        .as_u64()
        .unwrap_or_default();

    let violation = if charges.len() > 1 {
        Some(format!("{} charges for one key", charges.len()))
    } else if let Some(told) = &paid.told {
        let ours = charges.first().map(|c| &c["charge_id"]);
        (ours != Some(&told["charge_id"])).then(|| {
            format!(
                "the client was told charge {}, the provider has {}",
                told["charge_id"],
                ours.map_or("none".to_string(), Value::to_string)
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
