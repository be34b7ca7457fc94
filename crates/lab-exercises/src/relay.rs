//! Exercise `relay` (the payments lesson, the chain): the learner's orders service, the hop in
//! the middle of a chain. It takes the client's payment on `POST /orders/pay` and calls the
//! lab's payment service with bounded retries. The lab owns both ends: its client calls the
//! relay through the fault proxy, the relay's calls reach the lab's payment service through
//! another, and the provider behind it counts the charges.
//!
//! ```text
//!   the lab's client ──► fault proxy ──► the learner's relay ──► fault proxy ──► the lab's payment
//!                                                                               service ──► provider
//! ```
//!
//! | check                | the schedule                                                              | the invariant                                   |
//! |----------------------|---------------------------------------------------------------------------|-------------------------------------------------|
//! | `pass-through`       | one payment, then the same again                                          | one charge; the Charge, then `Idempotent-Replayed: true` passed up |
//! | `key-unchanged`      | the payment service's answer lost on the way back to the relay            | the relay retries with the client's key: one charge, its provider key made of that key |
//! | `lost-both`          | the lesson's two cut connections: below the relay, then above it; the client retries | 2 calls in, 3 calls down, 1 charge, the replay passed up |
//! | `conflict-passed-up` | a duplicate while the first payment is held in the payment service        | 409 with `Retry-After` passed up, not retried   |
//! | `reuse-passed-up`    | the same key with another amount                                          | 422 passed up, not retried                      |
//! | `backoff`            | a payment service that answers 503 to everything, three payments          | at least 3 attempts, at most 10, pauses that grow, with jitter; a 5xx with JSON; nothing after it |
//! | `deadline`           | a payment service that never answers                                      | the relay answers within the deadline its manifest declares; nothing after it |
//!
//! `backoff` and `deadline` restart the relay with `PAYMENTS_URL` pointing at the lab's
//! recorder (a service that answers 503, or never, and notes when each attempt came): they come
//! last.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lab_core::{Checkpoints, Msg};
use lab_services::spec::{RunningService, ServiceEnv};
use lab_services::{payments, provider};
use parking_lot::Mutex;
use tokio::task::JoinHandle;

use crate::arena::send;
use crate::catalogue::{CheckSpec, Exercise};
use crate::error::ExerciseError;
use crate::guest::{Guest, Mark, NotReady};
use crate::manifest::Manifest;
use crate::payment_world::{
    AMOUNT, Intent, LabProvider, Reached, STAGING_LIMIT, charged, keys_of, launch, must_be_charged,
    payment_call, send_held, status_of,
};
use crate::verdict::{Exchange, Line, Verdict, fail};
use crate::world::World;

pub static EXERCISE: Exercise = Exercise {
    name: "relay",
    lesson: "payments",
    needs: lab_infra::Needs::REDIS,
    langs: &["python", "rust"],
    rust_uses_idem: false,
    checks: &[
        CheckSpec::new("pass-through"),
        CheckSpec::new("key-unchanged"),
        CheckSpec::new("lost-both"),
        CheckSpec::new("conflict-passed-up"),
        CheckSpec::new("reuse-passed-up"),
        CheckSpec::new("backoff").restarts(),
        CheckSpec::new("deadline").restarts(),
    ],
    starter_fails: &[
        "pass-through",
        "key-unchanged",
        "lost-both",
        "conflict-passed-up",
        "backoff",
        "deadline",
    ],
};

/// The relay's route, as the lab's own orders service has it.
const ROUTE: &str = "/orders/pay";
/// How long the lab's client waits for the relay: far longer than a relay with the lesson's
/// bounds takes (the `deadline` check waits longer when the manifest promises a longer one).
const PATIENT: Duration = Duration::from_secs(12);
/// The deadline a relay promises when its manifest says nothing (the lab's own relay's is 6 s).
const DEFAULT_DEADLINE_MS: u64 = 6000;
/// How much later than its deadline a relay's answer may come and still count (the lab's clock
/// and a loaded machine's scheduling, not the relay's).
const DEADLINE_SLACK: Duration = Duration::from_secs(2);
/// How long the lab keeps watching for attempts after the relay answered.
const AFTERWARDS: Duration = Duration::from_millis(500);
/// Payments `backoff` sends, each one a sequence of attempts to compare.
const BACKOFF_PAYMENTS: usize = 3;
/// The fewest and most attempts a bounded relay makes.
const FEWEST_ATTEMPTS: usize = 3;
const MOST_ATTEMPTS: usize = 10;
/// Pauses that grow: the pause before the last attempt, on average over the payments, at least
/// this many times the pause before the first retry. Exponential backoff with equal jitter
/// (between half and all of `base · 2ⁿ⁻¹`) has 2 on average and never less than 1; a fixed
/// pause has 1.
const GROWTH: f64 = 1.15;
/// Jitter: the pauses before one retry, across the payments, spread over at least this much.
const JITTER_SPREAD: Duration = Duration::from_millis(5);

type Checked = Result<Verdict, ExerciseError>;

/// What the lab's recorder does with every attempt that reaches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mood {
    /// 503 `{"error": "unavailable"}` at once.
    Refuse,
    /// No answer, ever (until the relay gives up on it).
    Silent,
}

/// The stand-in for a payment service that is down: it notes when each attempt came.
struct Recorder {
    service: JoinHandle<()>,
    url: String,
    seen: Arc<Mutex<Vec<Instant>>>,
    mood: Arc<Mutex<Mood>>,
}

impl Recorder {
    async fn start() -> Result<Recorder, ExerciseError> {
        use axum::routing::post;
        let seen: Arc<Mutex<Vec<Instant>>> = Arc::default();
        let mood = Arc::new(Mutex::new(Mood::Refuse));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(ExerciseError::io("127.0.0.1"))?;
        let url = format!(
            "http://{}",
            listener
                .local_addr()
                .map_err(ExerciseError::io("127.0.0.1"))?
        );
        let (noted, moody) = (seen.clone(), mood.clone());
        let app = axum::Router::new().route(
            "/payments",
            post(move || {
                let (noted, moody) = (noted.clone(), moody.clone());
                async move {
                    noted.lock().push(Instant::now());
                    let mood = *moody.lock();
                    if mood == Mood::Silent {
                        std::future::pending::<()>().await;
                    }
                    (
                        axum::http::StatusCode::SERVICE_UNAVAILABLE,
                        axum::Json(serde_json::json!({"error": "unavailable"})),
                    )
                }
            }),
        );
        let service = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Recorder {
            service,
            url,
            seen,
            mood,
        })
    }

    fn attempts(&self) -> Vec<Instant> {
        self.seen.lock().clone()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.service.abort();
    }
}

/// What the relay checks work with.
pub struct Chain {
    pub checkpoints: Checkpoints,
    pub provider: LabProvider,
    pub payments: RunningService,
    /// The proxies' registry: dropping it stops the proxies.
    pub proxies: faultproxy::FaultProxy,
    /// The lab's client → the relay.
    pub inbound: faultproxy::Proxy,
    /// The relay → the lab's payment service.
    pub down: faultproxy::Proxy,
    pub dir: std::path::PathBuf,
    pub manifest: Manifest,
    pub env: Vec<(String, String)>,
    pub guest: Option<Guest>,
    recorder: Option<Recorder>,
    pub http: reqwest::Client,
    pub schedule: Vec<Line>,
}

/// Starts the chain around the learner's relay (built before): the provider, the lab's payment
/// service on Redis under the run's prefix, the two proxies, the relay.
pub async fn open(
    run: &str,
    key_prefix: &str,
    redis_url: &str,
    dir: std::path::PathBuf,
    manifest: Manifest,
    extra_env: Vec<(String, String)>,
) -> Result<Result<Chain, NotReady>, ExerciseError> {
    let checkpoints = Checkpoints::new();
    let provider = LabProvider::start(checkpoints.clone())?;
    let env = ServiceEnv::default()
        .with_redis(redis_url)
        .with_key_prefix(key_prefix)
        .with_peer(provider::NAME, provider.url())
        .with_checkpoints(checkpoints.clone());
    let payments = launch(&payments::SPEC, env)?;
    let proxies = faultproxy::FaultProxy::new();
    let down = proxies
        .create(
            &format!("exercise-{run}-payments"),
            "127.0.0.1:0",
            payments.url().trim_start_matches("http://"),
        )
        .await?;
    let env = vec![
        ("HOST".to_string(), "127.0.0.1".to_string()),
        ("LAB_RUN".to_string(), run.to_string()),
        ("PYTHONUNBUFFERED".to_string(), "1".to_string()),
    ];
    let mut chain = Chain {
        checkpoints,
        provider,
        payments,
        down: proxies.get(&down.name).expect("just created"),
        // Made when the relay has a port.
        inbound: proxies.get(&down.name).expect("just created"),
        proxies,
        dir,
        manifest,
        env: env.into_iter().chain(extra_env).collect(),
        guest: None,
        recorder: None,
        // One connection per call: a fault armed on the next connection is aimed at the call.
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .expect("a client without TLS builds"),
        schedule: Vec::new(),
    };
    let below = format!("http://{}", down.listen);
    if let Err(not_ready) = chain.start_relay(&below).await? {
        chain.close().await;
        return Ok(Err(not_ready));
    }
    Ok(Ok(chain))
}

impl Chain {
    fn step(&mut self, msg: Msg) {
        self.schedule.push(Line::Step(msg));
    }

    fn deadline(&self) -> Duration {
        Duration::from_millis(self.manifest.deadline_ms.unwrap_or(DEFAULT_DEADLINE_MS))
    }

    /// Starts (or starts again) the relay with `payments_url` as its `PAYMENTS_URL`, and the
    /// inbound proxy in front of it.
    async fn start_relay(
        &mut self,
        payments_url: &str,
    ) -> Result<Result<(), NotReady>, ExerciseError> {
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
                ("PAYMENTS_URL".to_string(), payments_url.to_string()),
            ])
            .collect();
        let mut guest = Guest::new(&self.dir, self.manifest.clone(), port, env)?;
        let started = guest.start().await?;
        self.guest = Some(guest);
        if started.is_ok() {
            let name = format!("{}-in-{port}", self.down.name());
            let info = self
                .proxies
                .create(&name, "127.0.0.1:0", &format!("127.0.0.1:{port}"))
                .await?;
            self.inbound = self.proxies.get(&info.name).expect("just created");
        }
        Ok(started.map(drop))
    }

    fn through_proxy(&self) -> String {
        format!("http://{}{ROUTE}", self.inbound.listen_addr())
    }

    /// Pays `intent` with `key` through the inbound proxy, and records the exchange.
    async fn pay(&mut self, intent: &Intent, key: &str) -> Exchange {
        self.pay_within(intent, key, PATIENT).await
    }

    async fn pay_within(&mut self, intent: &Intent, key: &str, patience: Duration) -> Exchange {
        let call = payment_call(&self.through_proxy(), "client", intent, key, patience);
        let exchange = send(&self.http, call).await;
        self.schedule.push(Line::Call(exchange.clone()));
        exchange
    }

    /// How many requests the lab's payment service has received.
    async fn payments_requests(&self) -> Result<u64, ExerciseError> {
        let stats: serde_json::Value = self
            .http
            .get(format!("{}/stats", self.payments.url()))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|e| ExerciseError::Target(format!("the payment service's stats: {e}")))?
            .json()
            .await
            .map_err(|e| ExerciseError::Target(format!("the payment service's stats: {e}")))?;
        Ok(stats["requests"].as_u64().unwrap_or(0))
    }

    async fn charges(
        &mut self,
        intent: &Intent,
    ) -> Result<Vec<crate::verdict::ChargeRow>, ExerciseError> {
        let (charges, line) = self.provider.charges(intent).await?;
        self.schedule.push(line);
        Ok(charges)
    }

    /// A payment held in the lab's payment service (its key reserved, the provider not called
    /// yet), sent through the inbound proxy.
    async fn pay_held(&mut self, intent: &Intent, key: &str) -> Reached {
        let call = payment_call(&self.through_proxy(), "client.A", intent, key, PATIENT);
        let reached = send_held(&self.http, &self.checkpoints, payments::IN_ACTION, call).await;
        if let Reached::Answered(exchange) = &reached {
            self.schedule.push(Line::Call(exchange.clone()));
        }
        reached
    }

    async fn let_go(
        &mut self,
        hold: lab_core::checkpoint::Hold,
        call: JoinHandle<Exchange>,
    ) -> Option<Exchange> {
        hold.release();
        let exchange = call.await.ok()?;
        self.schedule.push(Line::Call(exchange.clone()));
        Some(exchange)
    }

    /// Points the relay at the recorder (restarting it the first time), in `mood`.
    async fn at_recorder(&mut self, mood: Mood) -> Result<bool, ExerciseError> {
        if self.recorder.is_none() {
            let recorder = Recorder::start().await?;
            let url = recorder.url.clone();
            self.recorder = Some(recorder);
            self.step(Msg::new("step.restart_at_recorder"));
            if self.start_relay(&url).await?.is_err() {
                return Ok(false);
            }
        }
        let recorder = self.recorder.as_ref().expect("started above");
        *recorder.mood.lock() = mood;
        recorder.seen.lock().clear();
        Ok(true)
    }

    /// The attempts the recorder saw, as milliseconds since `from`, as a step.
    fn told_attempts(&mut self, from: Instant, seen: &[Instant]) {
        let at: Vec<String> = seen
            .iter()
            .map(|t| format!("{}", t.saturating_duration_since(from).as_millis()))
            .collect();
        self.step(
            Msg::new("step.attempts")
                .arg("count", seen.len())
                .arg("at", at.join(", ")),
        );
    }

    async fn close(mut self) {
        if let Some(mut guest) = self.guest.take() {
            guest.stop().await;
        }
        self.recorder = None;
        self.payments.stop().await;
        self.provider.stop().await;
    }
}

macro_rules! judged {
    ($e:expr) => {
        if let Err(verdict) = $e {
            return Ok(verdict);
        }
    };
}

/// One charge for the intent, made with the client's key; the verdict that says otherwise.
fn one_charge_with_key(charges: &[crate::verdict::ChargeRow], key: &str) -> Result<(), Verdict> {
    let minted = charges.iter().any(|c| {
        !c.key
            .as_deref()
            .is_some_and(|k| k.ends_with(&format!(".{key}")))
    });
    if minted {
        return Err(Verdict::Fail(
            fail("key_changed")
                .arg("key", key)
                .arg("keys", keys_of(charges)),
        ));
    }
    if charges.len() > 1 {
        return Err(Verdict::Fail(
            fail("charged_twice").arg("count", charges.len()),
        ));
    }
    Ok(())
}

/// Runs the check `name`.
pub async fn run(name: &str, chain: &mut Chain) -> Checked {
    match name {
        "pass-through" => pass_through(chain).await,
        "key-unchanged" => key_unchanged(chain).await,
        "lost-both" => lost_both(chain).await,
        "conflict-passed-up" => conflict_passed_up(chain).await,
        "reuse-passed-up" => reuse_passed_up(chain).await,
        "backoff" => backoff(chain).await,
        "deadline" => deadline(chain).await,
        other => unreachable!("relay has no check {other}"),
    }
}

async fn pass_through(chain: &mut Chain) -> Checked {
    let intent = Intent::new(1);
    chain.step(Msg::new("step.pass_through"));
    let first = chain.pay(&intent, "pay-1").await;
    judged!(must_be_charged(&first));
    let again = chain.pay(&intent, "pay-1").await;
    let charges = chain.charges(&intent).await?;
    judged!(one_charge_with_key(&charges, "pay-1"));
    judged!(must_be_charged(&again));
    if !again.replayed_header {
        return Ok(Verdict::Fail(fail("replay_header_dropped")));
    }
    Ok(Verdict::Pass)
}

/// Sends `intent` with `key` through the relay, with the payment service's first answer lost on
/// its way back to the relay; the client's exchange, or the verdict that says the loss was not
/// staged.
async fn lose_below(
    chain: &mut Chain,
    intent: &Intent,
    key: &str,
) -> Result<Result<Exchange, Verdict>, ExerciseError> {
    let (hold, call) = match chain.pay_held(intent, key).await {
        Reached::Held { hold, call } => (hold, call),
        Reached::Answered(answer) => {
            return Ok(Err(Verdict::Fail(
                fail("never_reached").arg("status", status_of(&answer)),
            )));
        }
        Reached::Never => return Ok(Err(Verdict::Unknown(Msg::new("unknown.never_held")))),
    };
    // Aimed at the connections open now: the relay's call is the first to get an answer back.
    let (lost, trigger) = chain
        .down
        .arm_on_trigger(faultproxy::Fault::ResponseLostAfterCommit, 1);
    trigger.fire();
    let exchange = chain.let_go(hold, call).await;
    if tokio::time::timeout(STAGING_LIMIT, lost.fired())
        .await
        .is_err()
    {
        return Ok(Err(Verdict::Unknown(Msg::new("unknown.fault_not_fired"))));
    }
    match exchange {
        Some(exchange) => Ok(Ok(exchange)),
        None => Ok(Err(Verdict::Unknown(Msg::new("unknown.never_held")))),
    }
}

async fn key_unchanged(chain: &mut Chain) -> Checked {
    let intent = Intent::new(2);
    chain.step(Msg::new("step.lost_below"));
    let answer = match lose_below(chain, &intent, "pay-2").await? {
        Ok(answer) => answer,
        Err(verdict) => return Ok(verdict),
    };
    let charges = chain.charges(&intent).await?;
    judged!(one_charge_with_key(&charges, "pay-2"));
    if !charged(&answer) {
        return Ok(Verdict::Fail(
            fail("no_retry").arg("status", status_of(&answer)),
        ));
    }
    Ok(Verdict::Pass)
}

async fn lost_both(chain: &mut Chain) -> Checked {
    let intent = Intent::new(3);
    let before = chain.payments_requests().await?;
    chain.step(Msg::new("step.lost_both"));
    // The relay's answer to the client's first call is dropped as soon as it starts.
    let above = chain
        .inbound
        .arm(faultproxy::Fault::ResponseLostAfterCommit, 1);
    let first = match lose_below(chain, &intent, "pay-3").await? {
        Ok(answer) => answer,
        Err(verdict) => return Ok(verdict),
    };
    if tokio::time::timeout(STAGING_LIMIT, above.fired())
        .await
        .is_err()
        || first.status.is_some()
    {
        return Ok(Verdict::Unknown(Msg::new("unknown.fault_not_fired")));
    }
    chain.step(Msg::new("step.client_retries"));
    let retry = chain.pay(&intent, "pay-3").await;
    let down = chain.payments_requests().await? - before;
    chain.step(
        Msg::new("step.counted")
            .arg("calls_in", 2)
            .arg("calls_down", down as i64),
    );
    let charges = chain.charges(&intent).await?;
    judged!(one_charge_with_key(&charges, "pay-3"));
    judged!(must_be_charged(&retry));
    if !retry.replayed_header {
        return Ok(Verdict::Fail(fail("replay_header_dropped")));
    }
    if down != 3 {
        return Ok(Verdict::Fail(fail("calls_down").arg("count", down as i64)));
    }
    Ok(Verdict::Pass)
}

async fn conflict_passed_up(chain: &mut Chain) -> Checked {
    let intent = Intent::new(4);
    chain.step(Msg::new("step.hold_first"));
    let (hold, call) = match chain.pay_held(&intent, "pay-4").await {
        Reached::Held { hold, call } => (hold, call),
        Reached::Answered(answer) => {
            return Ok(Verdict::Fail(
                fail("never_reached").arg("status", status_of(&answer)),
            ));
        }
        Reached::Never => return Ok(Verdict::Unknown(Msg::new("unknown.never_held"))),
    };
    let before = chain.payments_requests().await?;
    chain.step(Msg::new("step.duplicate"));
    let duplicate = chain.pay(&intent, "pay-4").await;
    let seen = chain.payments_requests().await? - before;
    chain.step(Msg::new("step.seen_below").arg("count", seen as i64));
    chain.step(Msg::new("step.let_go"));
    chain.let_go(hold, call).await;
    let charges = chain.charges(&intent).await?;
    judged!(one_charge_with_key(&charges, "pay-4"));
    if duplicate.status != Some(409) {
        return Ok(Verdict::Fail(
            fail("not_passed_up")
                .arg("expected", 409)
                .arg("status", status_of(&duplicate)),
        ));
    }
    if duplicate.retry_after.is_none() {
        return Ok(Verdict::Fail(fail("retry_after_dropped")));
    }
    if !duplicate.answer.contains("payment_in_progress") {
        return Ok(Verdict::Fail(
            fail("body_changed").arg("expected", "payment_in_progress"),
        ));
    }
    if seen != 1 {
        return Ok(Verdict::Fail(
            fail("refusal_retried")
                .arg("status", 409)
                .arg("count", seen as i64),
        ));
    }
    Ok(Verdict::Pass)
}

async fn reuse_passed_up(chain: &mut Chain) -> Checked {
    let intent = Intent::new(5);
    chain.step(Msg::new("step.reuse"));
    let first = chain.pay(&intent, "pay-5").await;
    judged!(must_be_charged(&first));
    let before = chain.payments_requests().await?;
    let changed = chain.pay(&intent.with_amount(AMOUNT + 1000), "pay-5").await;
    let seen = chain.payments_requests().await? - before;
    chain.step(Msg::new("step.seen_below").arg("count", seen as i64));
    let charges = chain.charges(&intent).await?;
    judged!(one_charge_with_key(&charges, "pay-5"));
    if changed.status != Some(422) {
        return Ok(Verdict::Fail(
            fail("not_passed_up")
                .arg("expected", 422)
                .arg("status", status_of(&changed)),
        ));
    }
    if !changed.answer.contains("idempotency_key_reused") {
        return Ok(Verdict::Fail(
            fail("body_changed").arg("expected", "idempotency_key_reused"),
        ));
    }
    if seen != 1 {
        return Ok(Verdict::Fail(
            fail("refusal_retried")
                .arg("status", 422)
                .arg("count", seen as i64),
        ));
    }
    Ok(Verdict::Pass)
}

/// The pauses between the attempts of one payment.
fn pauses(seen: &[Instant]) -> Vec<Duration> {
    seen.windows(2).map(|w| w[1] - w[0]).collect()
}

async fn backoff(chain: &mut Chain) -> Checked {
    if !chain.at_recorder(Mood::Refuse).await? {
        return Ok(Verdict::Unknown(Msg::new("unknown.no_restart")));
    }
    chain.step(Msg::new("step.backoff").arg("count", BACKOFF_PAYMENTS));
    let mut sequences = Vec::new();
    for n in 0..BACKOFF_PAYMENTS {
        let started = Instant::now();
        let answer = chain
            .pay(&Intent::new(60 + n as u32), &format!("pay-6{n}"))
            .await;
        let answered = chain.recorder.as_ref().expect("at the recorder").attempts();
        tokio::time::sleep(AFTERWARDS).await;
        let seen = chain.recorder.as_ref().expect("at the recorder").attempts();
        chain
            .recorder
            .as_ref()
            .expect("at the recorder")
            .seen
            .lock()
            .clear();
        chain.told_attempts(started, &seen);
        if !matches!(answer.status, Some(500..=599)) || !answer.json_body {
            return Ok(Verdict::Fail(
                fail("gave_up_badly").arg("status", status_of(&answer)),
            ));
        }
        if seen.len() > answered.len() {
            return Ok(Verdict::Fail(
                fail("after_answer").arg("count", (seen.len() - answered.len()) as i64),
            ));
        }
        if seen.len() < FEWEST_ATTEMPTS {
            return Ok(Verdict::Fail(fail("too_few").arg("count", seen.len())));
        }
        if seen.len() > MOST_ATTEMPTS {
            return Ok(Verdict::Fail(fail("too_many").arg("count", seen.len())));
        }
        sequences.push(pauses(&seen));
    }
    let mean = |pick: &dyn Fn(&Vec<Duration>) -> Duration| {
        sequences.iter().map(|s| pick(s).as_secs_f64()).sum::<f64>() / sequences.len() as f64
    };
    let first = mean(&|s| s[0]);
    let last = mean(&|s| *s.last().expect("two pauses at least"));
    if last < first * GROWTH {
        return Ok(Verdict::Fail(
            fail("no_growth")
                .arg("first", format!("{:.0}", first * 1000.0))
                .arg("last", format!("{:.0}", last * 1000.0)),
        ));
    }
    let firsts: Vec<Duration> = sequences.iter().map(|s| s[0]).collect();
    let lasts: Vec<Duration> = sequences
        .iter()
        .map(|s| *s.last().expect("checked"))
        .collect();
    let spread = |all: &[Duration]| {
        all.iter().max().copied().unwrap_or_default()
            - all.iter().min().copied().unwrap_or_default()
    };
    if spread(&firsts) < JITTER_SPREAD && spread(&lasts) < JITTER_SPREAD {
        return Ok(Verdict::Fail(fail("no_jitter")));
    }
    Ok(Verdict::Pass)
}

async fn deadline(chain: &mut Chain) -> Checked {
    if !chain.at_recorder(Mood::Silent).await? {
        return Ok(Verdict::Unknown(Msg::new("unknown.no_restart")));
    }
    let promised = chain.deadline();
    chain.step(Msg::new("step.deadline").arg("ms", promised.as_millis() as i64));
    let started = Instant::now();
    let patience = PATIENT.max(promised + DEADLINE_SLACK * 2);
    let answer = chain.pay_within(&Intent::new(70), "pay-70", patience).await;
    let took = started.elapsed();
    let answered = chain.recorder.as_ref().expect("at the recorder").attempts();
    tokio::time::sleep(AFTERWARDS).await;
    let seen = chain.recorder.as_ref().expect("at the recorder").attempts();
    chain.told_attempts(started, &seen);
    chain.step(Msg::new("step.answered_after").arg("ms", took.as_millis() as i64));
    if answer.status.is_none() {
        return Ok(Verdict::Fail(
            fail("never_answered").arg("seconds", patience.as_secs() as i64),
        ));
    }
    if took > promised + DEADLINE_SLACK {
        return Ok(Verdict::Fail(
            fail("past_deadline")
                .arg("ms", took.as_millis() as i64)
                .arg("deadline", promised.as_millis() as i64),
        ));
    }
    if !matches!(answer.status, Some(500..=599)) || !answer.json_body {
        return Ok(Verdict::Fail(
            fail("gave_up_badly").arg("status", status_of(&answer)),
        ));
    }
    if seen.len() > answered.len() {
        return Ok(Verdict::Fail(
            fail("after_answer").arg("count", (seen.len() - answered.len()) as i64),
        ));
    }
    if seen.len() > MOST_ATTEMPTS {
        return Ok(Verdict::Fail(fail("too_many").arg("count", seen.len())));
    }
    Ok(Verdict::Pass)
}

impl World for Chain {
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
        self.down.disarm_all_faults();
        self.inbound.disarm_all_faults();
    }

    async fn output(&self, mark: &Mark) -> Option<String> {
        self.guest.as_ref()?.said_since(mark).await
    }

    async fn close(self) {
        Chain::close(self).await;
    }
}
