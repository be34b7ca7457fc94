//! Exercise `relay` (the payments lesson, the chain): the learner's orders service, the hop in
//! the middle of a chain. It takes the client's payment on `POST /orders/pay` and calls the
//! lab's payment service with bounded retries. The lab owns both ends: its client calls the
//! relay through a fault proxy; the relay's calls go through another to the lab's recorder,
//! which notes each attempt (its payment, its key, when it came, what it was answered) and
//! passes it on to the lab's payment service, or answers in its place where a check stages a
//! payment service that refuses, fails or keeps silent; the provider behind counts the charges.
//!
//! ```text
//!   the lab's client ──► fault proxy ──► the learner's relay ──► fault proxy ──► the lab's recorder
//!                                                                                        │
//!                                          provider ◄── the lab's payment service ◄──────┘
//! ```
//!
//! | check                    | the schedule                                                     | the invariant                                   |
//! |--------------------------|------------------------------------------------------------------|-------------------------------------------------|
//! | `pass-through`           | one payment, then the same again                                 | the client's key on every attempt; one charge; the Charge, then `Idempotent-Replayed: true` passed up |
//! | `key-unchanged`          | the payment service's answer lost on the way back to the relay   | a retry with the client's key: one charge, the Charge passed up |
//! | `lost-both`              | the lesson's two cut connections: below the relay, then above it; the client retries | 3 attempts down, 1 charge, the replay passed up |
//! | `conflict-passed-up`     | the payment service answers 409 `payment_in_progress` with `Retry-After` to every attempt | the 409 passed up whole (status, body, `Retry-After`), sent down once |
//! | `reuse-passed-up`        | … 422 `idempotency_key_reused` to every attempt                  | the 422 passed up whole, sent down once          |
//! | `bad-request-passed-up`  | … 400 `invalid_payment` to every attempt                         | the 400 passed up whole, sent down once          |
//! | `gateway-errors-retried` | … 502 to the first attempt, 504 to the second, then charges      | both retried with the client's key: the Charge, one charge |
//! | `timeout-retried`        | the first attempt kept unanswered until the relay gives up on it (hangs up, or sends another), then charged | a retry with the client's key: the Charge (replayed), one charge; unknown if the relay never gives up |
//! | `deadline`               | a payment service that never answers                             | the relay answers within its manifest's `deadline_ms`, 502/503/504 with a JSON `error`; nothing after it |
//! | `backoff`                | a payment service that answers 503 to everything; payments 4 at a time, 12 to 72 of them, until the pauses decide | 3 to 10 attempts each, 502/503/504 with a JSON `error`, pauses that grow, with jitter (read as [`backoff`] says); nothing after the answer |
//!
//! Every attempt is counted for its own payment (the recorder knows it by its `order_id`), and
//! every check that sees attempts judges the keys they carried as the relay sent them. "Nothing
//! after the answer" is judged by time: an attempt that reaches the recorder more than
//! [`AFTER_ANSWER_MARGIN`] after the client had the relay's answer came after it; the lab
//! watches each payment until its deadline has passed since its first attempt, and at least
//! [`WATCH_SLACK`] after its answer. A payment watched once stays watched for the rest of the
//! run: a relay that resends behind the client's back may still be busy with `backoff`'s
//! payments when `deadline`'s own comes due, and is caught on those, whatever order the checks
//! run in.
//!
//! The layout: this file has the checks and their judgements (every text they name is the
//! exercise's); [`world`] the chain around the relay and the lab's client's calls into it;
//! [`recorder`] the stand-in in front of the payment service; [`backoff`] the reading of the
//! pauses, with the simulation that measures its error rates.

mod backoff;
mod recorder;
mod world;

use std::time::{Duration, Instant};

use lab_core::Msg;
use tokio::task::JoinHandle;

use crate::error::ExerciseError;
use crate::exercise::{Check, Checks, Exercise};
use crate::judgement::{Judged, broke, fail, undecided, unknown};
use crate::lab_side::{Reached, STAGING_LIMIT};
use crate::payment::{Intent, charged, must_be_charged};
use crate::verdict::{ChargeRow, Line, Sent};
use recorder::{Attempt, Canned, HoldEnd, Mode, Recorder};
use world::{Paid, Relay, Watched, pay_relay};

pub static EXERCISE: Exercise = Exercise {
    name: "relay",
    lesson: "payments",
    needs: lab_infra::Needs::REDIS,
    langs: &["python", "rust"],
    rust_uses_idem: false,
    checks: &CHECKS,
    open: |setup| Box::pin(world::open(setup)),
};

static CHECKS: Checks<Relay> = Checks(&[
    Check::new("pass-through", |w| Box::pin(pass_through(w))).starter_fails(),
    Check::new("key-unchanged", |w| Box::pin(key_unchanged(w))).starter_fails(),
    Check::new("lost-both", |w| Box::pin(lost_both(w))).starter_fails(),
    Check::new("conflict-passed-up", |w| Box::pin(conflict_passed_up(w))).starter_fails(),
    Check::new("reuse-passed-up", |w| Box::pin(reuse_passed_up(w))),
    Check::new("bad-request-passed-up", |w| {
        Box::pin(bad_request_passed_up(w))
    }),
    Check::new("gateway-errors-retried", |w| {
        Box::pin(gateway_errors_retried(w))
    })
    .starter_fails(),
    Check::new("timeout-retried", |w| Box::pin(timeout_retried(w))).starter_fails(),
    Check::new("deadline", |w| Box::pin(deadline(w))).starter_fails(),
    Check::new("backoff", |w| Box::pin(backoff(w))).starter_fails(),
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
/// How long after the relay's answer the lab watches, at least, for attempts after it (and
/// until the payment's deadline has passed, when that is later): a relay that resends a second
/// after its answer, or keeps trying in the background, is caught.
const WATCH_SLACK: Duration = Duration::from_secs(2);
/// An attempt that reaches the recorder this long after the client had the relay's answer was
/// sent after that answer. Less than that may be an attempt the relay gave up on just before it
/// answered, still on its way (both travel through the lab's proxies on one loaded machine).
const AFTER_ANSWER_MARGIN: Duration = Duration::from_millis(50);
/// How long after a relay's answer the lab waits to see it hang up on the attempt it gave up
/// on (the recorder reads the closed connection a moment after the relay closed it).
const HANG_UP_SEEN: Duration = Duration::from_secs(1);
/// `backoff`'s payments: at most 4 at once, each started at least 50 ms after the one before.
/// The pauses are measured at the recorder, so they carry the relay's own queueing too: a burst
/// of payments at once would lengthen the first pauses most (all first attempts come together)
/// and hide the growth.
const BACKOFF_IN_FLIGHT: usize = 4;
const BACKOFF_SPACING: Duration = Duration::from_millis(50);
/// The fewest and most attempts a bounded relay makes.
const FEWEST_ATTEMPTS: usize = 3;
const MOST_ATTEMPTS: usize = 10;

/// The step that tells a payment's attempts: how many, and when (milliseconds from `from`).
fn told_attempts(attempts: &[Attempt], from: Instant) -> Msg {
    let at: Vec<String> = attempts
        .iter()
        .map(|a| a.at.saturating_duration_since(from).as_millis().to_string())
        .collect();
    Msg::new("step.attempts")
        .arg("count", attempts.len())
        .arg("at", at.join(", "))
}

/// Every attempt carried the client's key, as the relay sent it; the fail that names the first
/// other key.
fn keys_sent(attempts: &[Attempt], key: &str) -> Judged {
    match attempts.iter().find(|a| a.key.as_deref() != Some(key)) {
        None => Ok(()),
        Some(other) => fail(
            broke("key_changed")
                .arg("key", key)
                .arg("sent", other.key.clone().unwrap_or_else(|| "-".into())),
        ),
    }
}

/// At most one charge for the payment.
fn one_charge(charges: &[ChargeRow]) -> Judged {
    if charges.len() > 1 {
        return fail(broke("charged_twice").arg("count", charges.len()));
    }
    Ok(())
}

/// The relay called down at all; the fail that says what it answered instead.
fn reached(attempts: &[Attempt], answer: &Sent) -> Judged<()> {
    if attempts.is_empty() {
        return fail(broke("never_reached").arg("status", answer.status_arg()));
    }
    Ok(())
}

/// Two bodies the same: the same JSON value (a relay may write it out again), else the same
/// bytes.
fn same_body(up: &str, below: &str) -> bool {
    match (
        serde_json::from_str::<serde_json::Value>(up),
        serde_json::from_str::<serde_json::Value>(below),
    ) {
        (Ok(up), Ok(below)) => up == below,
        _ => up == below,
    }
}

/// The `error` of a JSON body, for a message (the body itself, cut, when it has none).
fn error_of(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| Some(v.get("error")?.as_str()?.to_string()))
        .unwrap_or_else(|| crate::call::cut(body))
}

/// An answer from below passed up whole (its status, its `Retry-After`, its body), and the
/// payment sent down once: the attempts all belong to the one call (the recorder gave each of
/// them the same refusal).
fn passed_up(paid: &Paid, attempts: &[Attempt]) -> Judged {
    let answer = &paid.sent;
    reached(attempts, answer)?;
    let Some(reply) = attempts.iter().rev().find_map(|a| a.reply.as_ref()) else {
        return unknown(undecided("never_refused"));
    };
    let status = i64::from(reply.status);
    if answer.status != Some(reply.status) {
        return fail(
            broke("not_passed_up")
                .arg("expected", status)
                .arg("status", answer.status_arg()),
        );
    }
    if let Some(expected) = &reply.retry_after
        && answer.retry_after.as_ref() != Some(expected)
    {
        return fail(match &answer.retry_after {
            None => broke("retry_after_dropped")
                .arg("status", status)
                .arg("expected", expected),
            Some(got) => broke("retry_after_changed")
                .arg("status", status)
                .arg("expected", expected)
                .arg("got", got),
        });
    }
    let body = paid.body.as_deref().unwrap_or_default();
    if !same_body(body, &reply.body) {
        return fail(
            broke("body_changed")
                .arg("expected", error_of(&reply.body))
                .arg("got", error_of(body)),
        );
    }
    if attempts.len() != 1 {
        return fail(
            broke("refusal_retried")
                .arg("status", status)
                .arg("count", attempts.len())
                .arg("retries", attempts.len() - 1),
        );
    }
    Ok(())
}

/// The Charge the client got is the one the payment service answered the relay's last attempt
/// with.
fn charge_passed_up(answer: &Sent, attempts: &[Attempt]) -> Judged {
    let below = attempts
        .iter()
        .rev()
        .filter_map(|a| a.reply.as_ref())
        .find(|r| r.status == 200)
        .and_then(|r| {
            let v: serde_json::Value = serde_json::from_str(&r.body).ok()?;
            Some(v.get("charge_id")?.as_str()?.to_string())
        });
    match below {
        Some(charge) if answer.charge_id.as_deref() != Some(charge.as_str()) => {
            fail(broke("charge_changed").arg("expected", charge).arg(
                "got",
                answer.charge_id.clone().unwrap_or_else(|| "-".into()),
            ))
        }
        _ => Ok(()),
    }
}

async fn pass_through(w: &mut Relay) -> Judged {
    let intent = Intent::new(1);
    w.step(Msg::new("step.pass_through"));
    let started = Instant::now();
    let first = w.pay(&intent, "pay-1").await;
    let again = w.pay(&intent, "pay-1").await;
    let attempts = w.attempts(&intent, started);
    let charges = w.charges(&intent).await?;
    keys_sent(&attempts, "pay-1")?;
    one_charge(&charges)?;
    must_be_charged(&first.sent)?;
    must_be_charged(&again.sent)?;
    charge_passed_up(&again.sent, &attempts)?;
    if !again.sent.replayed_header {
        return fail(broke("replay_header_dropped"));
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
    let started = Instant::now();
    let answer = lose_below(w, &intent, "pay-2").await?;
    let attempts = w.attempts(&intent, started);
    let charges = w.charges(&intent).await?;
    keys_sent(&attempts, "pay-2")?;
    one_charge(&charges)?;
    if !charged(&answer) {
        return fail(broke("no_retry").arg("status", answer.status_arg()));
    }
    charge_passed_up(&answer, &attempts)
}

async fn lost_both(w: &mut Relay) -> Judged {
    let intent = Intent::new(3);
    w.step(Msg::new("step.lost_both"));
    let started = Instant::now();
    // The relay's answer to the client's first call is dropped as soon as it starts.
    let above = w.inbound.arm(faultproxy::Fault::ResponseLostAfterCommit, 1);
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
    let attempts = w.attempts(&intent, started);
    let charges = w.charges(&intent).await?;
    keys_sent(&attempts, "pay-3")?;
    one_charge(&charges)?;
    must_be_charged(&retry.sent)?;
    if !retry.sent.replayed_header {
        return fail(broke("replay_header_dropped"));
    }
    if attempts.len() != 3 {
        return fail(broke("calls_down").arg("count", attempts.len()));
    }
    Ok(())
}

/// Has every attempt of `intent`'s payment answered with `canned`, pays once, and judges that
/// the answer came up whole and was sent down once.
async fn refused_below(w: &mut Relay, intent: &Intent, key: &str, canned: Canned) -> Judged {
    w.recorder.stage(&intent.order, Mode::Answer(canned));
    let started = Instant::now();
    let paid = w.pay(intent, key).await;
    let attempts = w.attempts(intent, started);
    keys_sent(&attempts, key)?;
    passed_up(&paid, &attempts)
}

async fn conflict_passed_up(w: &mut Relay) -> Judged {
    w.step(Msg::new("step.conflict"));
    refused_below(w, &Intent::new(4), "pay-4", Canned::InProgress).await
}

async fn reuse_passed_up(w: &mut Relay) -> Judged {
    w.step(Msg::new("step.reuse"));
    refused_below(w, &Intent::new(5), "pay-5", Canned::Reused).await
}

async fn bad_request_passed_up(w: &mut Relay) -> Judged {
    w.step(Msg::new("step.bad_request"));
    refused_below(w, &Intent::new(6), "pay-6", Canned::BadRequest).await
}

/// The relay got past the payment service's 502 and 504 to the Charge; the fail that says
/// where it stopped instead.
fn gateway_errors(answer: &Sent, attempts: &[Attempt]) -> Judged {
    let last = attempts.last().and_then(|a| a.reply.as_ref());
    if !charged(answer)
        && let Some(last) = last
        && matches!(last.status, 502 | 504)
    {
        return fail(
            broke("gateway_error_not_retried")
                .arg("status", last.status)
                .arg("count", attempts.len())
                .arg("got", answer.status_arg()),
        );
    }
    must_be_charged(answer)?;
    charge_passed_up(answer, attempts)
}

async fn gateway_errors_retried(w: &mut Relay) -> Judged {
    let intent = Intent::new(8);
    w.recorder.stage(&intent.order, Mode::GatewayErrors);
    w.step(Msg::new("step.gateway_errors"));
    let started = Instant::now();
    let paid = w.pay(&intent, "pay-8").await;
    let attempts = w.attempts(&intent, started);
    let charges = w.charges(&intent).await?;
    keys_sent(&attempts, "pay-8")?;
    reached(&attempts, &paid.sent)?;
    one_charge(&charges)?;
    gateway_errors(&paid.sent, &attempts)
}

/// How long the lab waits for a relay to answer a payment whose attempts go unanswered: its
/// deadline and twice the slack, and never less than [`PATIENT`].
fn patience(deadline: Duration) -> Duration {
    PATIENT.max(deadline + DEADLINE_SLACK * 2)
}

/// What a relay whose first attempt went unanswered did: it gave up on that attempt (the
/// hold's end) and retried with the client's key; the payment was charged once and the Charge
/// came up.
fn retried_after_timeout(
    answer: &Sent,
    answered: Instant,
    attempts: &[Attempt],
    end: Option<HoldEnd>,
    charges: &[ChargeRow],
) -> Judged {
    let Some(first) = attempts.first() else {
        return fail(broke("never_reached").arg("status", answer.status_arg()));
    };
    let gave_up = match end {
        Some(end) => end.at(),
        // It answered while its attempt still waited, and sent no other.
        None if answer.status.is_some() => answered,
        None => {
            return unknown(undecided("never_gave_up").arg("seconds", answer.waited_ms / 1000));
        }
    };
    if attempts.len() == 1 {
        return fail(
            broke("timeout_not_retried")
                .arg("ms", gave_up.saturating_duration_since(first.at))
                .arg("status", answer.status_arg()),
        );
    }
    one_charge(charges)?;
    must_be_charged(answer)?;
    charge_passed_up(answer, attempts)
}

async fn timeout_retried(w: &mut Relay) -> Judged {
    let intent = Intent::new(9);
    w.recorder.stage(&intent.order, Mode::HoldFirst);
    w.step(Msg::new("step.timeout_hold"));
    let started = Instant::now();
    let call = w.call(&intent, "pay-9", patience(w.deadline));
    let http = w.rig.http.clone();
    let mut paying = tokio::spawn(async move { pay_relay(&http, call).await });
    // Until the relay gives up on its first attempt, or answers the client, or the client's
    // patience runs out: whichever comes first.
    let order = intent.order.clone();
    let paid = tokio::select! {
        paid = &mut paying => Some(paid),
        _ = w.recorder.wait_for(patience(w.deadline), |r| r.hold_end(&order).is_some()) => None,
    };
    // A relay that answers because it gave up on its attempt has closed that connection just
    // before: the recorder sees it a moment later.
    if paid.is_some() {
        let ended = |r: &Recorder| r.hold_end(&order).is_some();
        w.recorder.wait_for(HANG_UP_SEEN, ended).await;
    }
    let end = w.recorder.hold_end(&intent.order);
    if let Some(end) = end {
        let first = w.recorder.attempts(&intent.order)[0].at;
        let ms = end.at().saturating_duration_since(first);
        w.step(match end {
            HoldEnd::HungUp(_) => Msg::new("step.hung_up").arg("ms", ms),
            HoldEnd::Overtaken(_) => Msg::new("step.overtaken").arg("ms", ms),
        });
    }
    let paid = match paid {
        Some(paid) => paid,
        None => paying.await,
    };
    let Ok(paid) = paid else {
        return Err(ExerciseError::Service {
            service: "the lab's client",
            reason: "its call to the relay panicked".into(),
        }
        .into());
    };
    w.rig.record(Line::Call(paid.sent.clone()));
    // The first attempt, given up on, went on to the payment service: its charge is made (or
    // refused) before the lab counts the charges.
    if end.is_some() {
        let passed = |r: &Recorder| r.first_passed(&order).is_some();
        if !w.recorder.wait_for(STAGING_LIMIT, passed).await {
            return unknown(undecided("first_not_passed"));
        }
    }
    let attempts = w.attempts(&intent, started);
    let charges = w.charges(&intent).await?;
    keys_sent(&attempts, "pay-9")?;
    retried_after_timeout(&paid.sent, paid.at, &attempts, end, &charges)
}

/// How a relay that gave up answered: 502, 503 or 504 (the outcome is unknown) with a JSON
/// object that has an `error`.
fn gave_up_well(paid: &Paid) -> Judged {
    let object_with_error = paid
        .body
        .as_deref()
        .and_then(|b| serde_json::from_str::<serde_json::Value>(b).ok())
        .is_some_and(|v| v.get("error").is_some());
    if !matches!(paid.sent.status, Some(502..=504)) || !object_with_error {
        return fail(broke("gave_up_badly").arg("status", paid.sent.status_arg()));
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

/// The attempts that came before the answer (within [`AFTER_ANSWER_MARGIN`] of it), and those
/// after.
fn split_at_answer(attempts: &[Attempt], answered: Instant) -> (Vec<Attempt>, Vec<Attempt>) {
    attempts
        .iter()
        .cloned()
        .partition(|a| a.at <= answered + AFTER_ANSWER_MARGIN)
}

/// Until when the lab watches a payment for attempts after its answer: until its deadline has
/// passed since its first attempt (a relay that keeps trying "within its deadline" behind the
/// client's back), and at least [`WATCH_SLACK`] after its answer (one that resends soon after).
fn watched_until(attempts: &[Attempt], answered: Instant, deadline: Duration) -> Instant {
    let first = attempts.first().map_or(answered, |a| a.at);
    (first + deadline).max(answered + WATCH_SLACK)
}

/// No attempt came after the answer.
fn nothing_after(attempts: &[Attempt], answered: Instant, key: &str) -> Judged {
    let (_, after) = split_at_answer(attempts, answered);
    if after.is_empty() {
        return Ok(());
    }
    let at: Vec<String> = after
        .iter()
        .map(|a| {
            a.at.saturating_duration_since(answered)
                .as_millis()
                .to_string()
        })
        .collect();
    fail(
        broke("after_answer")
            .arg("count", after.len())
            .arg("key", key)
            .arg("at", at.join(", ")),
    )
}

async fn deadline(w: &mut Relay) -> Judged {
    let intent = Intent::new(70);
    w.recorder.stage(&intent.order, Mode::Silent);
    let promised = w.deadline;
    w.step(Msg::new("step.deadline").arg("ms", promised));
    let started = Instant::now();
    let patience = patience(promised);
    let paid = w.pay_within(&intent, "pay-70", patience).await;
    let took = paid.at - started;
    w.step(Msg::new("step.answered_after").arg("ms", took));
    if paid.sent.status.is_none() {
        w.attempts(&intent, started);
        return fail(broke("never_answered").arg("seconds", patience.as_secs()));
    }
    w.watched.push(Watched {
        order: intent.order.clone(),
        key: "pay-70".into(),
        answered: paid.at,
    });
    if took > promised + DEADLINE_SLACK {
        w.attempts(&intent, started);
        return fail(
            broke("past_deadline")
                .arg("ms", took)
                .arg("deadline", promised),
        );
    }
    reached(&w.recorder.attempts(&intent.order), &paid.sent)?;
    gave_up_well(&paid)?;
    let until = watched_until(&w.recorder.attempts(&intent.order), paid.at, promised);
    tokio::time::sleep_until(until.into()).await;
    let attempts = w.attempts(&intent, started);
    keys_sent(&attempts, "pay-70")?;
    let (before, _) = split_at_answer(&attempts, paid.at);
    if before.len() > MOST_ATTEMPTS {
        return fail(broke("too_many").arg("count", before.len()));
    }
    nothing_after(&attempts, paid.at, "pay-70")?;
    nothing_after_any(w)
}

/// No attempt came after its answer for any payment the lab has watched so far in this run
/// (`deadline`'s and `backoff`'s; see [`world::Watched`]), told for the first that had one. A
/// relay that resends behind the client's back may be busy with an earlier check's payments
/// when the check that watches comes: it is caught on those, so the verdict does not depend on
/// which checks ran before (`watch` runs the failing ones first, `verify` shuffles them).
fn nothing_after_any(w: &mut Relay) -> Judged {
    let now = Instant::now();
    for watched in w.watched.clone() {
        let attempts = w.recorder.attempts(&watched.order);
        let judged = nothing_after(&attempts, watched.answered, &watched.key);
        if judged.is_err() {
            let (_, after) = split_at_answer(&attempts, watched.answered);
            w.step(
                Msg::new("step.earlier_payment")
                    .arg("key", &watched.key)
                    .arg("ago", now.saturating_duration_since(watched.answered))
                    .arg("count", after.len()),
            );
            return judged;
        }
    }
    Ok(())
}

/// One payment of `backoff`: its intent and key, when it was sent, the relay's answer.
struct Refused {
    intent: Intent,
    key: String,
    started: Instant,
    paid: Paid,
}

/// `backoff`'s payment number `n` (from 0), with its own key, staged and ready to send.
fn pay_refused(w: &Relay, n: usize) -> impl Future<Output = Refused> + use<> {
    let number = 100 + u32::try_from(n).unwrap_or(0);
    let intent = Intent::new(number);
    let key = format!("pay-{number}");
    w.recorder
        .stage(&intent.order, Mode::Answer(Canned::Unavailable));
    // A relay that takes one payment at a time is slow here, not wrong: each waits its turn.
    let patience = patience(w.deadline) * BACKOFF_IN_FLIGHT as u32;
    let call = w.call(&intent, &key, patience);
    let http = w.rig.http.clone();
    async move {
        let started = Instant::now();
        let paid = pay_relay(&http, call).await;
        Refused {
            intent,
            key,
            started,
            paid,
        }
    }
}

/// Tells one payment of `backoff` (its call and its attempts), for a verdict about it.
fn tell_payment(w: &mut Relay, payment: &Refused) {
    w.rig.record(Line::Call(payment.paid.sent.clone()));
    let attempts = w.recorder.attempts(&payment.intent.order);
    w.step(told_attempts(&attempts, payment.started));
}

/// One payment of `backoff` judged on its own: the relay gave up well, kept the client's key,
/// made a bounded number of attempts before its answer; the pauses between those.
fn judge_refused(payment: &Refused, attempts: &[Attempt]) -> Judged<Vec<Duration>> {
    gave_up_well(&payment.paid)?;
    keys_sent(attempts, &payment.key)?;
    let (before, _) = split_at_answer(attempts, payment.paid.at);
    bounded(before.len())?;
    Ok(before.windows(2).map(|w| w[1].at - w[0].at).collect())
}

/// What the pauses say, as a verdict (`Ok` when they grow and jitter).
fn pauses_judged(reading: &backoff::Reading) -> Judged {
    let spread = &reading.spread;
    match (reading.growth, spread.jitter) {
        (backoff::Growth::Flat, _) => fail(
            broke("no_growth")
                .arg("first", reading.first_ms)
                .arg("second", reading.second_ms)
                .arg("count", reading.payments),
        ),
        (backoff::Growth::Undecided, _) => unknown(
            undecided("pauses_undecided")
                .arg("count", reading.payments)
                .arg("first", reading.first_ms)
                .arg("second", reading.second_ms),
        ),
        (backoff::Growth::Grows, backoff::Jitter::Steady) => fail(
            broke("no_jitter")
                .arg("position", spread.position)
                .arg("low", spread.low_ms)
                .arg("high", spread.high_ms)
                .arg("quartiles", spread.quartiles_ms)
                .arg("count", reading.payments),
        ),
        (backoff::Growth::Grows, backoff::Jitter::Undecided) => unknown(
            undecided("jitter_undecided")
                .arg("position", spread.position)
                .arg("quartiles", spread.quartiles_ms)
                .arg("median", spread.median_ms)
                .arg("count", reading.payments),
        ),
        (backoff::Growth::Grows, backoff::Jitter::Jitters) => Ok(()),
    }
}

async fn backoff(w: &mut Relay) -> Judged {
    w.step(
        Msg::new("step.backoff")
            .arg("at_once", BACKOFF_IN_FLIGHT)
            .arg("first", backoff::FIRST_LOOK)
            .arg("most", backoff::MOST_PAYMENTS),
    );
    let mut flying: tokio::task::JoinSet<Refused> = tokio::task::JoinSet::new();
    let (mut sent, mut last_sent) = (0, None::<Instant>);
    let mut payments: Vec<Refused> = Vec::new();
    let mut sequences = Vec::new();
    let mut reading: Option<backoff::Reading> = None;
    loop {
        let decided = reading.as_ref().is_some_and(backoff::Reading::decided);
        if !decided && sent < backoff::MOST_PAYMENTS && flying.len() < BACKOFF_IN_FLIGHT {
            if let Some(last) = last_sent {
                tokio::time::sleep_until((last + BACKOFF_SPACING).into()).await;
            }
            flying.spawn(pay_refused(w, sent));
            (sent, last_sent) = (sent + 1, Some(Instant::now()));
            continue;
        }
        let Some(done) = flying.join_next().await else {
            break;
        };
        let Ok(payment) = done else {
            return Err(ExerciseError::Service {
                service: "the lab's client",
                reason: "a payment into the relay panicked".into(),
            }
            .into());
        };
        if payment.paid.sent.status.is_some() {
            w.watched.push(Watched {
                order: payment.intent.order.clone(),
                key: payment.key.clone(),
                answered: payment.paid.at,
            });
        }
        let attempts = w.recorder.attempts(&payment.intent.order);
        match judge_refused(&payment, &attempts) {
            Ok(pauses) => sequences.push(pauses),
            Err(stop) => {
                tell_payment(w, &payment);
                return Err(stop);
            }
        }
        payments.push(payment);
        if !decided && backoff::reads_at(sequences.len()) {
            reading = Some(backoff::read(&sequences));
        }
    }
    let reading = reading.expect("read at the first look at least");
    w.step(
        Msg::new("step.pauses")
            .arg("count", reading.payments)
            .arg("first", reading.first_ms)
            .arg("second", reading.second_ms),
    );
    if reading.decided() {
        pauses_judged(&reading)?;
    }
    let until = payments
        .iter()
        .map(|p| watched_until(&w.recorder.attempts(&p.intent.order), p.paid.at, w.deadline))
        .max();
    if let Some(until) = until {
        tokio::time::sleep_until(until.into()).await;
    }
    for payment in &payments {
        let attempts = w.recorder.attempts(&payment.intent.order);
        if let Err(stop) = nothing_after(&attempts, payment.paid.at, &payment.key) {
            tell_payment(w, payment);
            return Err(stop);
        }
    }
    nothing_after_any(w)?;
    pauses_judged(&reading)
}

#[cfg(test)]
mod tests {
    use super::recorder::Reply;
    use super::*;
    use crate::judgement::verdict_of;
    use crate::verdict::Verdict;

    fn key_of(judged: Judged) -> Option<String> {
        match verdict_of(judged).unwrap() {
            Verdict::Pass => None,
            other => Some(other.reason().unwrap().key.clone()),
        }
    }

    fn msg_of(judged: Judged) -> Msg {
        verdict_of(judged).unwrap().reason().unwrap().clone()
    }

    fn charge(id: &str) -> ChargeRow {
        ChargeRow {
            charge_id: id.into(),
            amount: crate::payment::AMOUNT,
            currency: "RUB".into(),
            key: Some("payment.charge.x.pay-1".into()),
        }
    }

    fn attempt(key: &str, at: Instant, reply: Option<Reply>) -> Attempt {
        Attempt {
            order: Some("o".into()),
            key: Some(key.into()),
            at,
            reply,
            hung_up: None,
        }
    }

    fn paid(status: Option<u16>, body: &str, at: Instant) -> Paid {
        let mut sent = crate::payment::tests::answer(status, None);
        sent.answer = body.into();
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(body) {
            sent.charge_id = v
                .get("charge_id")
                .and_then(|c| c.as_str())
                .map(str::to_string);
        }
        Paid {
            sent,
            body: status.map(|_| body.to_string()),
            at,
        }
    }

    const CHARGE: &str = r#"{"charge_id":"ch_1","amount":1990}"#;

    fn charged_reply(replayed: bool) -> Reply {
        Reply {
            status: 200,
            body: CHARGE.into(),
            retry_after: None,
            replayed,
        }
    }

    #[test]
    fn the_key_judged_is_the_one_the_relay_sent_down() {
        let now = Instant::now();
        let same = [attempt("pay-1", now, None), attempt("pay-1", now, None)];
        assert_eq!(key_of(keys_sent(&same, "pay-1")), None);
        // A prefix of the relay's own is another key, whatever the provider's key ends with.
        let prefixed = [
            attempt("pay-1", now, None),
            attempt("retry2.pay-1", now, None),
        ];
        let msg = msg_of(keys_sent(&prefixed, "pay-1"));
        assert_eq!(msg.key, "broke.key_changed");
        assert!(msg.args.contains(&("sent".into(), "retry2.pay-1".into())));
        let mut keyless = attempt("pay-1", now, None);
        keyless.key = None;
        assert_eq!(
            key_of(keys_sent(&[keyless], "pay-1")).as_deref(),
            Some("broke.key_changed")
        );
        assert_eq!(
            key_of(one_charge(&[charge("a"), charge("b")])).as_deref(),
            Some("broke.charged_twice")
        );
    }

    #[test]
    fn a_refusal_comes_up_whole_and_is_sent_down_once() {
        let now = Instant::now();
        let refusal = Canned::InProgress.reply();
        let once = [attempt("pay-4", now, Some(refusal.clone()))];
        let mut up = paid(Some(409), &refusal.body, now);
        up.sent.retry_after = Some("1".into());
        assert_eq!(key_of(passed_up(&up, &once)), None);
        // Written out again with other spacing: the same JSON, the same answer.
        let mut respaced = paid(
            Some(409),
            r#"{ "message": "a payment with this key is being charged right now; retry in a second", "error": "payment_in_progress" }"#,
            now,
        );
        respaced.sent.retry_after = Some("1".into());
        assert_eq!(key_of(passed_up(&respaced, &once)), None);
        // Three attempts of the one call: the refusal retried twice.
        let thrice = [
            attempt("pay-4", now, Some(refusal.clone())),
            attempt("pay-4", now, Some(refusal.clone())),
            attempt("pay-4", now, Some(refusal.clone())),
        ];
        let msg = msg_of(passed_up(&up, &thrice));
        assert_eq!(msg.key, "broke.refusal_retried");
        assert!(msg.args.contains(&("count".into(), lab_core::Arg::Int(3))));
        assert!(
            msg.args
                .contains(&("retries".into(), lab_core::Arg::Int(2)))
        );
        up.sent.retry_after = None;
        assert_eq!(
            key_of(passed_up(&up, &once)).as_deref(),
            Some("broke.retry_after_dropped")
        );
        up.sent.retry_after = Some("5".into());
        assert_eq!(
            key_of(passed_up(&up, &once)).as_deref(),
            Some("broke.retry_after_changed")
        );
        let bad = Canned::BadRequest.reply();
        let below = [attempt("pay-6", now, Some(bad))];
        let rewritten = paid(Some(400), r#"{"error":"bad_request"}"#, now);
        let msg = msg_of(passed_up(&rewritten, &below));
        assert_eq!(msg.key, "broke.body_changed");
        assert!(
            msg.args
                .contains(&("expected".into(), "invalid_payment".into()))
        );
        let gateway = paid(Some(502), r#"{"error":"upstream"}"#, now);
        assert_eq!(
            key_of(passed_up(&gateway, &below)).as_deref(),
            Some("broke.not_passed_up")
        );
        assert_eq!(
            key_of(passed_up(&gateway, &[])).as_deref(),
            Some("broke.never_reached")
        );
        // Every attempt closed before the refusal could be given: nothing was passed up.
        assert_eq!(
            key_of(passed_up(&gateway, &[attempt("pay-6", now, None)])).as_deref(),
            Some("unknown.never_refused")
        );
    }

    #[test]
    fn a_gateway_error_passed_up_is_named_and_a_charge_passes() {
        let now = Instant::now();
        let first = [attempt("pay-8", now, Some(Canned::BadGateway.reply()))];
        let up = paid(Some(502), &Canned::BadGateway.reply().body, now);
        let msg = msg_of(gateway_errors(&up.sent, &first));
        assert_eq!(msg.key, "broke.gateway_error_not_retried");
        assert!(
            msg.args
                .contains(&("status".into(), lab_core::Arg::Int(502)))
        );
        let all = [
            attempt("pay-8", now, Some(Canned::BadGateway.reply())),
            attempt("pay-8", now, Some(Canned::GatewayTimeout.reply())),
            attempt("pay-8", now, Some(charged_reply(false))),
        ];
        let charged = paid(Some(200), CHARGE, now);
        assert_eq!(key_of(gateway_errors(&charged.sent, &all)), None);
        // Its own 504 after the 502, without a retry: the 502 was not retried.
        let own = paid(Some(504), r#"{"error":"upstream_unavailable"}"#, now);
        let msg = msg_of(gateway_errors(&own.sent, &first));
        assert_eq!(msg.key, "broke.gateway_error_not_retried");
        assert!(
            msg.args
                .contains(&("status".into(), lab_core::Arg::Int(502)))
        );
        assert!(msg.args.contains(&("got".into(), lab_core::Arg::Int(504))));
        // Retried both, and its third attempt went unanswered: not about the gateway errors.
        let retried = [
            attempt("pay-8", now, Some(Canned::BadGateway.reply())),
            attempt("pay-8", now, Some(Canned::GatewayTimeout.reply())),
            attempt("pay-8", now, None),
        ];
        assert_eq!(
            key_of(gateway_errors(&own.sent, &retried)).as_deref(),
            Some("broke.not_charged")
        );
        let other = paid(Some(200), r#"{"charge_id":"ch_2"}"#, now);
        assert_eq!(
            key_of(gateway_errors(&other.sent, &all)).as_deref(),
            Some("broke.charge_changed")
        );
    }

    #[test]
    fn a_timed_out_attempt_must_be_retried_once_the_relay_gives_up_on_it() {
        let t0 = Instant::now();
        let hung_up = t0 + Duration::from_millis(1000);
        let one = [attempt("pay-9", t0, None)];
        let gave_up = paid(Some(504), r#"{"error":"upstream_unavailable"}"#, hung_up);
        let msg = msg_of(retried_after_timeout(
            &gave_up.sent,
            gave_up.at,
            &one,
            Some(HoldEnd::HungUp(hung_up)),
            &[],
        ));
        assert_eq!(msg.key, "broke.timeout_not_retried");
        assert!(msg.args.contains(&("ms".into(), lab_core::Arg::Int(1000))));
        // It answered while its attempt still waited: no retry either.
        assert_eq!(
            key_of(retried_after_timeout(
                &gave_up.sent,
                gave_up.at,
                &one,
                None,
                &[]
            ))
            .as_deref(),
            Some("broke.timeout_not_retried")
        );
        // It never gave up, and never answered: nothing to judge.
        let silent = paid(None, "", t0 + Duration::from_secs(12));
        assert_eq!(
            key_of(retried_after_timeout(
                &silent.sent,
                silent.at,
                &one,
                None,
                &[]
            ))
            .as_deref(),
            Some("unknown.never_gave_up")
        );
        let two = [
            attempt("pay-9", t0, None),
            attempt("pay-9", hung_up, Some(charged_reply(true))),
        ];
        let replayed = paid(Some(200), CHARGE, hung_up);
        for end in [HoldEnd::HungUp(hung_up), HoldEnd::Overtaken(hung_up)] {
            assert_eq!(
                key_of(retried_after_timeout(
                    &replayed.sent,
                    replayed.at,
                    &two,
                    Some(end),
                    &[charge("ch_1")]
                )),
                None
            );
        }
        assert_eq!(
            key_of(retried_after_timeout(
                &gave_up.sent,
                gave_up.at,
                &two,
                Some(HoldEnd::HungUp(hung_up)),
                &[charge("ch_1")]
            ))
            .as_deref(),
            Some("broke.not_charged")
        );
    }

    #[test]
    fn giving_up_is_a_gateway_status_with_a_json_error() {
        let now = Instant::now();
        for status in [502, 503, 504] {
            let up = paid(Some(status), r#"{"error":"upstream_unavailable"}"#, now);
            assert_eq!(key_of(gave_up_well(&up)), None, "{status}");
        }
        for (status, body) in [
            (Some(500), r#"{"error":"payment_failed"}"#),
            (Some(504), "null"),
            (Some(504), r#"["upstream_unavailable"]"#),
            (Some(504), "upstream unavailable"),
            (None, ""),
        ] {
            assert_eq!(
                key_of(gave_up_well(&paid(status, body, now))).as_deref(),
                Some("broke.gave_up_badly"),
                "{status:?} {body}"
            );
        }
    }

    #[test]
    fn attempts_after_the_answer_are_told_apart_by_time() {
        let answered = Instant::now();
        let early = answered - Duration::from_millis(300);
        let in_flight = answered + Duration::from_millis(10);
        let late = answered + Duration::from_millis(1000);
        let attempts = [
            attempt("pay-70", early, None),
            attempt("pay-70", in_flight, None),
        ];
        assert_eq!(key_of(nothing_after(&attempts, answered, "pay-70")), None);
        let attempts = [
            attempt("pay-70", early, None),
            attempt("pay-70", in_flight, None),
            attempt("pay-70", late, None),
        ];
        let msg = msg_of(nothing_after(&attempts, answered, "pay-70"));
        assert_eq!(msg.key, "broke.after_answer");
        assert!(msg.args.contains(&("count".into(), lab_core::Arg::Int(1))));
        assert!(msg.args.contains(&("at".into(), "1000".into())));
        // Watched until the deadline from the first attempt, and the slack after the answer.
        let deadline = Duration::from_secs(3);
        assert_eq!(
            watched_until(&attempts, answered, deadline),
            early + deadline
        );
        let late_answer = early + Duration::from_millis(2900);
        assert_eq!(
            watched_until(&attempts, late_answer, deadline),
            late_answer + WATCH_SLACK
        );
        assert_eq!(key_of(bounded(2)).as_deref(), Some("broke.too_few"));
        assert_eq!(key_of(bounded(3)), None);
        assert_eq!(key_of(bounded(11)).as_deref(), Some("broke.too_many"));
    }

    #[test]
    fn the_pauses_reading_becomes_a_verdict() {
        let reading = |growth, jitter| backoff::Reading {
            payments: 24,
            growth,
            first_ms: 75,
            second_ms: 150,
            spread: backoff::Spread {
                position: 2,
                low_ms: 101,
                high_ms: 198,
                quartiles_ms: 50,
                median_ms: 150,
                jitter,
            },
        };
        use backoff::{Growth, Jitter};
        let cases = [
            (Growth::Grows, Jitter::Jitters, None),
            (Growth::Grows, Jitter::Steady, Some("broke.no_jitter")),
            (
                Growth::Grows,
                Jitter::Undecided,
                Some("unknown.jitter_undecided"),
            ),
            (Growth::Flat, Jitter::Jitters, Some("broke.no_growth")),
            (Growth::Flat, Jitter::Steady, Some("broke.no_growth")),
            (
                Growth::Undecided,
                Jitter::Jitters,
                Some("unknown.pauses_undecided"),
            ),
        ];
        for (growth, jitter, key) in cases {
            assert_eq!(
                key_of(pauses_judged(&reading(growth, jitter))).as_deref(),
                key,
                "{growth:?} {jitter:?}"
            );
        }
    }
}
