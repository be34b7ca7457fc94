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

use lab_core::Msg;
use lab_services::spec::ServiceEnv;
use lab_services::{payments, provider};
use parking_lot::Mutex;
use tokio::task::JoinHandle;

use crate::error::ExerciseError;
use crate::exercise::{Check, CheckOptions, Checked, Checks, Exercise, Setup, Subject};
use crate::guest::NotReady;
use crate::judgement::{Judged, broke, fail, undecided, unknown};
use crate::lab_side::{LabProvider, Reached, STAGING_LIMIT, send_held};
use crate::payment::{AMOUNT, Intent, charged, keys_of, must_be_charged};
use crate::rig::{Program, Rig, World, run_checks};
use crate::verdict::{ChargeRow, Line, Sent};

pub static EXERCISE: Exercise = Exercise {
    name: "relay",
    lesson: "payments",
    needs: lab_infra::Needs::REDIS,
    langs: &["python", "rust"],
    rust_uses_idem: false,
    checks: &CHECKS,
    open: |setup| Box::pin(open(setup)),
};

static CHECKS: Checks<Relay> = Checks(&[
    Check::new("pass-through", |w| Box::pin(pass_through(w))).starter_fails(),
    Check::new("key-unchanged", |w| Box::pin(key_unchanged(w))).starter_fails(),
    Check::new("lost-both", |w| Box::pin(lost_both(w))).starter_fails(),
    Check::new("conflict-passed-up", |w| Box::pin(conflict_passed_up(w))).starter_fails(),
    Check::new("reuse-passed-up", |w| Box::pin(reuse_passed_up(w))),
    Check::new("backoff", |w| Box::pin(backoff(w)))
        .restarts()
        .starter_fails(),
    Check::new("deadline", |w| Box::pin(deadline(w)))
        .restarts()
        .starter_fails(),
]);

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
pub struct Relay {
    rig: Rig,
    provider: LabProvider,
    /// The lab's payment service, below the relay (its own URL: the lab reads its counters).
    payments: String,
    /// The lab's client → the relay; made once the relay has a port.
    inbound: Option<faultproxy::Proxy>,
    /// The relay → the lab's payment service.
    down: faultproxy::Proxy,
    recorder: Option<Recorder>,
    /// The one deadline the manifest promises.
    deadline: Duration,
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
    /// payment service on Redis under the run's prefix, the two proxies, the relay.
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
        let down = rig
            .proxy("payments", payments.trim_start_matches("http://"))
            .await?;
        let mut world = Relay {
            rig,
            provider,
            payments,
            inbound: None,
            down,
            recorder: None,
            deadline,
        };
        let below = format!("http://{}", world.down.listen_addr());
        if let Err(not_ready) = world.start_relay(&below).await? {
            world.rig.close().await;
            return Ok(Err(not_ready));
        }
        Ok(Ok(world))
    }

    fn step(&mut self, msg: Msg) {
        self.rig.step(msg);
    }

    /// Starts (or starts again) the relay with `payments_url` as its `PAYMENTS_URL`, and the
    /// inbound proxy in front of it.
    async fn start_relay(
        &mut self,
        payments_url: &str,
    ) -> Result<Result<(), NotReady>, ExerciseError> {
        let env = crate::guest_env::GuestEnv {
            payments_url: Some(payments_url.to_string()),
            ..self.rig.env()
        };
        let started = self.rig.start_service(env).await?;
        if started.is_ok() {
            let port = self.rig.guest.as_ref().map_or(0, |g| g.port);
            let inbound = self
                .rig
                .proxy(&format!("in-{port}"), &format!("127.0.0.1:{port}"))
                .await?;
            self.inbound = Some(inbound);
        }
        Ok(started)
    }

    fn inbound(&self) -> &faultproxy::Proxy {
        self.inbound.as_ref().expect("made when the relay started")
    }

    fn through_proxy(&self) -> String {
        format!("http://{}{ROUTE}", self.inbound().listen_addr())
    }

    /// Pays `intent` with `key` through the inbound proxy, and records the exchange.
    async fn pay(&mut self, intent: &Intent, key: &str) -> Sent {
        self.pay_within(intent, key, PATIENT).await
    }

    async fn pay_within(&mut self, intent: &Intent, key: &str, patience: Duration) -> Sent {
        let call = intent.call(&self.through_proxy(), "client", key, patience);
        self.rig.send(call).await
    }

    /// How many requests the lab's payment service has received.
    async fn payments_requests(&self) -> Result<u64, ExerciseError> {
        let stats: serde_json::Value = self
            .rig
            .http
            .get(format!("{}/stats", self.payments))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(ExerciseError::http("payment service's stats"))?
            .json()
            .await
            .map_err(ExerciseError::http("payment service's stats"))?;
        stats["requests"].as_u64().ok_or(ExerciseError::Service {
            service: "payment service",
            reason: "its stats have no `requests`".into(),
        })
    }

    async fn charges(&mut self, intent: &Intent) -> Result<Vec<ChargeRow>, ExerciseError> {
        let (charges, line) = self.provider.charges(&intent.order).await?;
        self.rig.record(line);
        Ok(charges)
    }

    /// A payment held in the lab's payment service (its key reserved, the provider not called
    /// yet), sent through the inbound proxy.
    async fn pay_held(&mut self, intent: &Intent, key: &str) -> Reached {
        let call = intent.call(&self.through_proxy(), "client.A", key, PATIENT);
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

    async fn let_go(
        &mut self,
        hold: lab_core::checkpoint::Hold,
        call: JoinHandle<Sent>,
    ) -> Option<Sent> {
        hold.release();
        let sent = call.await.ok()?;
        self.rig.record(Line::Call(sent.clone()));
        Some(sent)
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

    /// The recorder the relay calls in `backoff` and `deadline`.
    fn recorder(&self) -> &Recorder {
        self.recorder.as_ref().expect("at the recorder")
    }
}

impl World for Relay {
    fn rig(&mut self) -> &mut Rig {
        &mut self.rig
    }

    async fn after(&mut self) {
        self.down.disarm_all_faults();
        if let Some(inbound) = &self.inbound {
            inbound.disarm_all_faults();
        }
    }

    async fn close(mut self) {
        self.recorder = None;
        self.rig.close().await;
    }
}

/// One charge for the intent, made with the client's key; the fail that says otherwise.
fn one_charge_with_key(charges: &[ChargeRow], key: &str) -> Judged {
    let minted = charges.iter().any(|c| {
        !c.key
            .as_deref()
            .is_some_and(|k| k.ends_with(&format!(".{key}")))
    });
    if minted {
        return fail(
            broke("key_changed")
                .arg("key", key)
                .arg("keys", keys_of(charges)),
        );
    }
    if charges.len() > 1 {
        return fail(broke("charged_twice").arg("count", charges.len()));
    }
    Ok(())
}

/// A payment held below the relay, or the verdict that says why it could not be.
fn held(reached: Reached) -> Judged<(lab_core::checkpoint::Hold, JoinHandle<Sent>)> {
    match reached {
        Reached::Held { hold, call } => Ok((hold, call)),
        Reached::Answered(answer) => {
            fail(broke("never_reached").arg("status", answer.status_arg()))
        }
        Reached::Never => unknown(undecided("never_held")),
    }
}

/// An answer passed up from below must be the one below gave: its status, its body's error,
/// and for a 409 its `Retry-After`; and the refusal is not sent down again.
fn passed_up(answer: &Sent, status: u16, error: &str, calls_down: u64) -> Judged {
    if answer.status != Some(status) {
        return fail(
            broke("not_passed_up")
                .arg("expected", i64::from(status))
                .arg("status", answer.status_arg()),
        );
    }
    if status == 409 && answer.retry_after.is_none() {
        return fail(broke("retry_after_dropped"));
    }
    if !answer.answer.contains(error) {
        return fail(broke("body_changed").arg("expected", error));
    }
    if calls_down != 1 {
        return fail(
            broke("refusal_retried")
                .arg("status", i64::from(status))
                .arg("count", calls_down)
                .arg("retries", calls_down.saturating_sub(1)),
        );
    }
    Ok(())
}

async fn pass_through(w: &mut Relay) -> Judged {
    let intent = Intent::new(1);
    w.step(Msg::new("step.pass_through"));
    let first = w.pay(&intent, "pay-1").await;
    must_be_charged(&first)?;
    let again = w.pay(&intent, "pay-1").await;
    let charges = w.charges(&intent).await?;
    one_charge_with_key(&charges, "pay-1")?;
    must_be_charged(&again)?;
    if !again.replayed_header {
        return fail(broke("replay_header_dropped"));
    }
    Ok(())
}

/// Sends `intent` with `key` through the relay, with the payment service's first answer lost on
/// its way back to the relay; the client's answer.
async fn lose_below(w: &mut Relay, intent: &Intent, key: &str) -> Judged<Sent> {
    let reached = w.pay_held(intent, key).await;
    let (hold, call) = held(reached)?;
    // Aimed at the connections open now: the relay's call is the first to get an answer back.
    let (lost, trigger) = w
        .down
        .arm_on_trigger(faultproxy::Fault::ResponseLostAfterCommit, 1);
    trigger.fire();
    let sent = w.let_go(hold, call).await;
    if tokio::time::timeout(STAGING_LIMIT, lost.fired())
        .await
        .is_err()
    {
        return unknown(undecided("fault_not_fired"));
    }
    match sent {
        Some(sent) => Ok(sent),
        None => unknown(undecided("never_held")),
    }
}

async fn key_unchanged(w: &mut Relay) -> Judged {
    let intent = Intent::new(2);
    w.step(Msg::new("step.lost_below"));
    let answer = lose_below(w, &intent, "pay-2").await?;
    let charges = w.charges(&intent).await?;
    one_charge_with_key(&charges, "pay-2")?;
    if !charged(&answer) {
        return fail(broke("no_retry").arg("status", answer.status_arg()));
    }
    Ok(())
}

async fn lost_both(w: &mut Relay) -> Judged {
    let intent = Intent::new(3);
    let before = w.payments_requests().await?;
    w.step(Msg::new("step.lost_both"));
    // The relay's answer to the client's first call is dropped as soon as it starts.
    let above = w
        .inbound()
        .arm(faultproxy::Fault::ResponseLostAfterCommit, 1);
    let first = lose_below(w, &intent, "pay-3").await?;
    if tokio::time::timeout(STAGING_LIMIT, above.fired())
        .await
        .is_err()
        || first.status.is_some()
    {
        return unknown(undecided("fault_not_fired"));
    }
    w.step(Msg::new("step.client_retries"));
    let retry = w.pay(&intent, "pay-3").await;
    let down = w.payments_requests().await? - before;
    w.step(
        Msg::new("step.counted")
            .arg("calls_in", 2)
            .arg("calls_down", down),
    );
    let charges = w.charges(&intent).await?;
    one_charge_with_key(&charges, "pay-3")?;
    must_be_charged(&retry)?;
    if !retry.replayed_header {
        return fail(broke("replay_header_dropped"));
    }
    if down != 3 {
        return fail(broke("calls_down").arg("count", down));
    }
    Ok(())
}

async fn conflict_passed_up(w: &mut Relay) -> Judged {
    let intent = Intent::new(4);
    w.step(Msg::new("step.hold_first"));
    let reached = w.pay_held(&intent, "pay-4").await;
    let (hold, call) = held(reached)?;
    let before = w.payments_requests().await?;
    w.step(Msg::new("step.duplicate"));
    let duplicate = w.pay(&intent, "pay-4").await;
    let seen = w.payments_requests().await? - before;
    w.step(Msg::new("step.seen_below").arg("count", seen));
    w.step(Msg::new("step.let_go"));
    w.let_go(hold, call).await;
    let charges = w.charges(&intent).await?;
    one_charge_with_key(&charges, "pay-4")?;
    passed_up(&duplicate, 409, "payment_in_progress", seen)
}

async fn reuse_passed_up(w: &mut Relay) -> Judged {
    let intent = Intent::new(5);
    w.step(Msg::new("step.reuse"));
    let first = w.pay(&intent, "pay-5").await;
    must_be_charged(&first)?;
    let before = w.payments_requests().await?;
    let changed = w.pay(&intent.with_amount(AMOUNT + 1000), "pay-5").await;
    let seen = w.payments_requests().await? - before;
    w.step(Msg::new("step.seen_below").arg("count", seen));
    let charges = w.charges(&intent).await?;
    one_charge_with_key(&charges, "pay-5")?;
    passed_up(&changed, 422, "idempotency_key_reused", seen)
}

/// The pauses between the attempts of one payment.
fn pauses(seen: &[Instant]) -> Vec<Duration> {
    seen.windows(2).map(|w| w[1] - w[0]).collect()
}

/// How a relay that gave up answered, and whether it stopped: a 5xx with a JSON body, and no
/// attempt after it.
fn gave_up_well(answer: &Sent, answered: usize, seen: usize) -> Judged {
    if !matches!(answer.status, Some(500..=599)) || !answer.json_body {
        return fail(broke("gave_up_badly").arg("status", answer.status_arg()));
    }
    if seen > answered {
        return fail(broke("after_answer").arg("count", seen - answered));
    }
    Ok(())
}

/// A bounded number of attempts for one payment.
fn bounded(attempts: usize) -> Judged {
    if attempts < FEWEST_ATTEMPTS {
        return fail(broke("too_few").arg("count", attempts));
    }
    if attempts > MOST_ATTEMPTS {
        return fail(broke("too_many").arg("count", attempts));
    }
    Ok(())
}

/// The attempts of several payments judged: bounded in number, pauses that grow, with jitter.
fn judge_backoff(sequences: &[Vec<Duration>]) -> Judged {
    for pauses in sequences {
        bounded(pauses.len() + 1)?;
    }
    let mean = |pick: &dyn Fn(&Vec<Duration>) -> Duration| {
        sequences.iter().map(|s| pick(s).as_secs_f64()).sum::<f64>() / sequences.len() as f64
    };
    let first = mean(&|s| s[0]);
    let last = mean(&|s| *s.last().expect("two pauses at least"));
    if last < first * GROWTH {
        return fail(
            broke("no_growth")
                .arg("first", format!("{:.0}", first * 1000.0))
                .arg("last", format!("{:.0}", last * 1000.0)),
        );
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
        return fail(broke("no_jitter"));
    }
    Ok(())
}

async fn backoff(w: &mut Relay) -> Judged {
    if !w.at_recorder(Mood::Refuse).await? {
        return unknown(undecided("no_restart"));
    }
    w.step(Msg::new("step.backoff").arg("count", BACKOFF_PAYMENTS));
    let mut sequences = Vec::new();
    for n in 0..BACKOFF_PAYMENTS {
        let started = Instant::now();
        let answer = w
            .pay(&Intent::new(60 + n as u32), &format!("pay-6{n}"))
            .await;
        let answered = w.recorder().attempts();
        tokio::time::sleep(AFTERWARDS).await;
        let seen = w.recorder().attempts();
        w.recorder().seen.lock().clear();
        w.told_attempts(started, &seen);
        gave_up_well(&answer, answered.len(), seen.len())?;
        bounded(seen.len())?;
        sequences.push(pauses(&seen));
    }
    judge_backoff(&sequences)
}

async fn deadline(w: &mut Relay) -> Judged {
    if !w.at_recorder(Mood::Silent).await? {
        return unknown(undecided("no_restart"));
    }
    let promised = w.deadline;
    w.step(Msg::new("step.deadline").arg("ms", promised));
    let started = Instant::now();
    let patience = PATIENT.max(promised + DEADLINE_SLACK * 2);
    let answer = w.pay_within(&Intent::new(70), "pay-70", patience).await;
    let took = started.elapsed();
    let answered = w.recorder().attempts();
    tokio::time::sleep(AFTERWARDS).await;
    let seen = w.recorder().attempts();
    w.told_attempts(started, &seen);
    w.step(Msg::new("step.answered_after").arg("ms", took));
    if answer.status.is_none() {
        return fail(broke("never_answered").arg("seconds", patience.as_secs()));
    }
    if took > promised + DEADLINE_SLACK {
        return fail(
            broke("past_deadline")
                .arg("ms", took)
                .arg("deadline", promised),
        );
    }
    gave_up_well(&answer, answered.len(), seen.len())?;
    if seen.len() > MOST_ATTEMPTS {
        return fail(broke("too_many").arg("count", seen.len()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judgement::verdict_of;
    use crate::verdict::Verdict;

    fn key_of(judged: Judged) -> Option<String> {
        match verdict_of(judged).unwrap() {
            Verdict::Pass => None,
            other => Some(other.reason().unwrap().key.clone()),
        }
    }

    fn charge(key: Option<&str>) -> ChargeRow {
        ChargeRow {
            charge_id: "ch_1".into(),
            amount: AMOUNT,
            currency: "RUB".into(),
            key: key.map(str::to_string),
        }
    }

    fn ms(values: &[u64]) -> Vec<Duration> {
        values.iter().map(|v| Duration::from_millis(*v)).collect()
    }

    #[test]
    fn the_clients_key_must_reach_the_provider_once() {
        let tenant_scoped = format!("{}.pay-1", crate::payment::TENANT);
        assert_eq!(
            key_of(one_charge_with_key(
                &[charge(Some(&tenant_scoped))],
                "pay-1"
            )),
            None
        );
        assert_eq!(
            key_of(one_charge_with_key(&[charge(Some("x.minted-9"))], "pay-1")).as_deref(),
            Some("broke.key_changed")
        );
        assert_eq!(
            key_of(one_charge_with_key(
                &[charge(Some(&tenant_scoped)), charge(Some(&tenant_scoped))],
                "pay-1"
            ))
            .as_deref(),
            Some("broke.charged_twice")
        );
    }

    #[test]
    fn a_refusal_retried_counts_the_retries_apart_from_the_call() {
        let mut answer = crate::payment::tests::answer(Some(409), None);
        answer.retry_after = Some("1".into());
        answer.answer = r#"{"error":"payment_in_progress"}"#.into();
        assert_eq!(
            key_of(passed_up(&answer, 409, "payment_in_progress", 1)),
            None
        );
        let Err(crate::judgement::Stop::Verdict(Verdict::Fail(msg))) =
            passed_up(&answer, 409, "payment_in_progress", 5)
        else {
            panic!("a retried refusal passed")
        };
        assert_eq!(msg.key, "broke.refusal_retried");
        assert!(
            msg.args
                .contains(&("retries".into(), lab_core::Arg::Int(4)))
        );
        answer.retry_after = None;
        assert_eq!(
            key_of(passed_up(&answer, 409, "payment_in_progress", 1)).as_deref(),
            Some("broke.retry_after_dropped")
        );
    }

    #[test]
    fn backoff_is_bounded_grows_and_jitters() {
        let good = [
            ms(&[110, 260, 390]),
            ms(&[140, 220, 430]),
            ms(&[120, 240, 350]),
        ];
        assert_eq!(key_of(judge_backoff(&good)), None);
        let fixed = [
            ms(&[200, 200, 200]),
            ms(&[210, 190, 205]),
            ms(&[195, 205, 200]),
        ];
        assert_eq!(
            key_of(judge_backoff(&fixed)).as_deref(),
            Some("broke.no_growth")
        );
        let lockstep = [
            ms(&[100, 200, 400]),
            ms(&[100, 200, 400]),
            ms(&[100, 200, 400]),
        ];
        assert_eq!(
            key_of(judge_backoff(&lockstep)).as_deref(),
            Some("broke.no_jitter")
        );
        assert_eq!(
            key_of(judge_backoff(&[ms(&[100])])).as_deref(),
            Some("broke.too_few")
        );
        assert_eq!(
            key_of(judge_backoff(&[ms(&[10; 12])])).as_deref(),
            Some("broke.too_many")
        );
    }
}
