//! A call held in the provider, and calls sent beside it: how the moments of `in-flight`,
//! `shared-records`, `redis-blip`, `slow-provider`, `redis-lost` and `crash` are staged.
//!
//! The first call is held once the provider has charged, before its answer goes out
//! ([`ChargeOnce::hold_first`]). Its duplicates are sent beside it and never waited on while it
//! is held ([`ChargeOnce::while_held`]): a service may answer a duplicate at once (409) or make
//! it wait for the first call's Charge, and a lab that waited for that answer before letting
//! the first call go would wait on itself. The lab waits until each duplicate has answered, or
//! for long enough that one still unanswered is waiting inside the service (three times as long
//! as the first call took to get to the provider, and at least a second), and lets the first
//! call go ([`ChargeOnce::let_go`]).
//!
//! All the while it watches the held call: a service that gives up on the provider (its own
//! timeout closes the connection, and the provider's handler is dropped) has ended the moment,
//! and the lab says when ([`Staged::gave_up`]).

use std::time::{Duration, Instant};

use lab_core::Msg;
use lab_core::checkpoint::Hold;
use lab_services::provider;
use tokio::task::JoinHandle;

use super::{ChargeOnce, PATIENT};
use crate::call::{Call, send};
use crate::judgement::{Judged, broke, fail, undecided, unknown};
use crate::lab_side::{Reached, STAGING_LIMIT, send_held};
use crate::payment::{Intent, charged};
use crate::verdict::{Line, Sent};

/// The shortest time the lab gives a duplicate to answer while the first call is held.
const DUPLICATE_PATIENCE_MIN: Duration = Duration::from_secs(1);
/// How often the lab looks at the duplicates (and at the held call) while it waits.
const LOOK: Duration = Duration::from_millis(25);
/// The longest pause between a client's retries (a `Retry-After` longer than this is cut to
/// it: the header is advice, and the check waits for a lease to run out, not a second more),
/// and the pause when the answer gives none.
const RETRY_PAUSE_MAX: Duration = Duration::from_millis(500);
const RETRY_PAUSE: Duration = Duration::from_millis(250);
/// The shortest pause (a `Retry-After: 0` does not make the client spin).
const RETRY_PAUSE_MIN: Duration = Duration::from_millis(50);

/// The first call of a moment, held in the provider once it has charged.
pub(super) struct Held {
    pub who: &'static str,
    hold: Hold,
    call: JoinHandle<Sent>,
    sent_at: Instant,
    /// How long it took to get there.
    reached_in: Duration,
}

impl Held {
    /// Whether the service has given up on the held call (its handler dropped) within
    /// `limit`; when, counted from the call.
    pub async fn gave_up_within(&self, limit: Duration) -> Option<Duration> {
        self.hold
            .abandoned(limit)
            .await
            .ok()
            .map(|()| self.sent_at.elapsed())
    }

    /// How long ago the call was sent.
    pub fn age(&self) -> Duration {
        self.sent_at.elapsed()
    }
}

/// Calls sent while a call was held.
pub(super) struct Window {
    calls: Vec<(String, JoinHandle<Sent>)>,
    waited: Duration,
    gave_up: Option<Duration>,
}

/// A held call let go, and the answers of every call of its moment.
pub(super) struct Staged {
    /// The held call's own answer.
    pub first: Option<Sent>,
    /// The calls sent beside it, in their order.
    pub beside: Vec<Option<Sent>>,
    /// When the service gave up on the held call (counted from it), if it did.
    pub gave_up: Option<Duration>,
}

impl Staged {
    /// The unknown of a moment that ended early: the service gave up on the held call.
    pub fn in_flight(&self, who: &str) -> Judged {
        match self.gave_up {
            Some(after) => unknown(
                undecided("provider_gave_up")
                    .arg("seconds", format!("{:.1}", after.as_secs_f64()))
                    .arg("who", who),
            ),
            None => Ok(()),
        }
    }
}

/// A call sent at `sent_at` and held just now (`send_held` returns the moment it is held).
pub(super) fn held(
    who: &'static str,
    hold: Hold,
    call: JoinHandle<Sent>,
    sent_at: Instant,
) -> Held {
    Held {
        who,
        hold,
        call,
        sent_at,
        reached_in: sent_at.elapsed(),
    }
}

/// How long the lab waits for the calls beside a held one before it takes an unanswered call
/// to be waiting inside the service: three times as long as the held call took to get to the
/// provider (a call that charges again takes that long to get there too), at least
/// [`DUPLICATE_PATIENCE_MIN`]. A loaded machine makes it longer, never shorter.
pub(super) fn duplicate_patience(reached_in: Duration) -> Duration {
    (reached_in * 3).max(DUPLICATE_PATIENCE_MIN)
}

/// How long a client waits before it retries, after `answer`: its `Retry-After` (whole
/// seconds) within [`RETRY_PAUSE_MIN`] and [`RETRY_PAUSE_MAX`]; [`RETRY_PAUSE`] when it gives
/// none (or one the lab cannot read).
pub(super) fn retry_pause(answer: &Sent) -> Duration {
    answer
        .retry_after
        .as_deref()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map_or(RETRY_PAUSE, |secs| {
            Duration::from_secs(secs).clamp(RETRY_PAUSE_MIN, RETRY_PAUSE_MAX)
        })
}

/// Whether a client retries after `answer`: no answer, a 409 (in progress) or a 5xx.
pub(super) fn retries_after(answer: &Sent) -> bool {
    match answer.status {
        None => true,
        Some(status) => status == 409 || status >= 500,
    }
}

impl ChargeOnce {
    /// Pays `intent` as client `who`, held in the provider once it has charged. A payment that
    /// answered without getting there fails naming its answer; one that did neither within
    /// [`STAGING_LIMIT`] is an unknown.
    pub(super) async fn hold_first(
        &mut self,
        who: &'static str,
        intent: &Intent,
        key: &str,
    ) -> Judged<Held> {
        self.step(Msg::new("step.hold_first").arg("who", who));
        let sent_at = Instant::now();
        match self.try_hold(&format!("client.{who}"), intent, key).await {
            Reached::Held { hold, call } => Ok(held(who, hold, call, sent_at)),
            Reached::Answered(answer) => {
                fail(broke("not_charged").arg("status", answer.status_arg()))
            }
            Reached::Never => unknown(undecided("never_held")),
        }
    }

    /// One attempt at holding a payment, sent as `label` (`client.A`), in the provider; an
    /// answer that came instead is recorded.
    pub(super) async fn try_hold(&mut self, label: &str, intent: &Intent, key: &str) -> Reached {
        let call = intent.call(&self.payments_url(), label, key, STAGING_LIMIT * 2);
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

    /// Sends `calls` while `held` is held, without waiting on them: returns once each has
    /// answered, or [`duplicate_patience`] has passed (a call still unanswered is waiting
    /// inside the service), or the service gave up on the held call.
    pub(super) async fn while_held(&mut self, held: &Held, calls: Vec<Call>) -> Window {
        let patience = duplicate_patience(held.reached_in);
        let started = Instant::now();
        let calls: Vec<(String, JoinHandle<Sent>)> = calls
            .into_iter()
            .map(|call| {
                let http = self.rig.http.clone();
                (
                    call.who.clone(),
                    tokio::spawn(async move { send(&http, call).await }),
                )
            })
            .collect();
        let mut gave_up = None;
        while !calls.iter().all(|(_, call)| call.is_finished()) && started.elapsed() < patience {
            // The pause between looks is the wait for the held call's abandonment.
            if let Some(after) = held.gave_up_within(LOOK).await {
                gave_up = Some(after);
                break;
            }
        }
        Window {
            calls,
            waited: started.elapsed(),
            gave_up,
        }
    }

    /// Lets `held` go, and records every answer: the calls beside it that answered while it
    /// was held, then its own, then those that were waiting for it.
    pub(super) async fn let_go(&mut self, held: Held, window: Window) -> Staged {
        let mut waiting = Vec::new();
        let mut beside = Vec::new();
        for (index, (who, call)) in window.calls.into_iter().enumerate() {
            if call.is_finished() {
                let sent = call.await.ok();
                if let Some(sent) = &sent {
                    self.rig.record(Line::Call(sent.clone()));
                }
                beside.push(sent);
            } else {
                // Unanswered through the whole window, it waits inside the service; a window the
                // service's giving up cut short says only that no answer came yet.
                let said = if window.gave_up.is_none() {
                    Msg::new("step.still_waiting")
                } else {
                    Msg::new("step.not_yet_answered")
                };
                self.step(
                    said.arg("who", crate::verdict::who(&who))
                        .arg("ms", window.waited),
                );
                waiting.push((index, call));
                beside.push(None);
            }
        }
        // The service may have given up in the last moment of the window.
        let gave_up = match window.gave_up {
            Some(after) => Some(after),
            None => held.gave_up_within(Duration::ZERO).await,
        };
        let first = self.release(held).await;
        for (index, call) in waiting {
            let sent = call.await.ok();
            if let Some(sent) = &sent {
                self.rig.record(Line::Call(sent.clone()));
            }
            beside[index] = sent;
        }
        Staged {
            first,
            beside,
            gave_up,
        }
    }

    /// Lets `held` go on, and records its answer.
    pub(super) async fn release(&mut self, held: Held) -> Option<Sent> {
        self.step(Msg::new("step.let_go").arg("who", held.who));
        self.answer_of(held).await
    }

    /// Lets `held` go on, and records its answer, without a step of its own (the check has
    /// said what happens to it).
    pub(super) async fn answer_of(&mut self, held: Held) -> Option<Sent> {
        held.hold.release();
        let sent = held.call.await.ok()?;
        self.rig.record(Line::Call(sent.clone()));
        Some(sent)
    }

    /// A client's retries of one payment after a failure: the same call until it answers with
    /// a Charge (or a 4xx other than 409), or `bound` has passed, each after the pause its last
    /// answer asked for. The first and the last tries are recorded, and how many came between.
    pub(super) async fn retry_until_charged(
        &mut self,
        intent: &Intent,
        key: &str,
        bound: Duration,
    ) -> (Sent, Duration) {
        let started = Instant::now();
        let call = intent.call(&self.payments_url(), "client", key, PATIENT);
        let mut tries = 0;
        loop {
            let answer = send(&self.rig.http, call.clone()).await;
            tries += 1;
            let done = charged(&answer) || !retries_after(&answer) || started.elapsed() >= bound;
            if tries == 1 || done {
                if done && tries > 2 {
                    self.step(
                        Msg::new("step.retried")
                            .arg("count", tries - 2)
                            .arg("seconds", format!("{:.1}", started.elapsed().as_secs_f64())),
                    );
                }
                self.rig.record(Line::Call(answer.clone()));
            }
            if done {
                return (answer, started.elapsed());
            }
            tokio::time::sleep(retry_pause(&answer)).await;
        }
    }
}

/// The duplicate of a call in flight: 409 with `Retry-After` at once, or, having waited, the
/// first call's Charge (`first_charge`, the one the provider made) with `Idempotent-Replayed`.
pub(super) fn duplicate_answered(duplicate: Option<&Sent>, first_charge: Option<&str>) -> Judged {
    let Some(duplicate) = duplicate else {
        return fail(broke("no_conflict").arg("status", Msg::new("call.no_answer")));
    };
    match duplicate.status {
        Some(409) if duplicate.retry_after.is_some() => Ok(()),
        Some(409) => fail(broke("no_retry_after")),
        Some(_) if charged(duplicate) && duplicate.charge_id.as_deref() == first_charge => {
            if duplicate.replayed_header {
                Ok(())
            } else {
                fail(broke("duplicate_not_replayed"))
            }
        }
        _ => fail(broke("no_conflict").arg("status", duplicate.status_arg())),
    }
}

/// A duplicate with another amount while the first call runs: 422 (or 409), at once or once
/// the first call has answered.
pub(super) fn changed_answered(changed: Option<&Sent>) -> Judged {
    match changed.and_then(|c| c.status) {
        Some(409 | 422) => Ok(()),
        _ => fail(broke("changed_in_flight").arg(
            "status",
            changed.map_or_else(|| Msg::new("call.no_answer").into(), Sent::status_arg),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judgement::{Stop, verdict_of};
    use crate::payment::tests::answer;
    use crate::verdict::Verdict;

    fn key_of(judged: Judged) -> String {
        match verdict_of(judged) {
            Ok(Verdict::Pass) => "pass".into(),
            Ok(Verdict::Fail(msg)) | Ok(Verdict::Unknown(msg)) => msg.key,
            other => panic!("{other:?}"),
        }
    }

    fn conflict(retry_after: Option<&str>) -> Sent {
        Sent {
            retry_after: retry_after.map(str::to_string),
            ..answer(Some(409), None)
        }
    }

    fn replayed(charge: &str, header: bool) -> Sent {
        Sent {
            replayed_header: header,
            ..answer(Some(200), Some(charge))
        }
    }

    #[test]
    fn a_duplicate_in_flight_is_refused_with_retry_after_or_waits_and_replays() {
        assert_eq!(
            key_of(duplicate_answered(Some(&conflict(Some("1"))), Some("ch_5"))),
            "pass"
        );
        assert_eq!(
            key_of(duplicate_answered(Some(&conflict(None)), Some("ch_5"))),
            "broke.no_retry_after"
        );
        assert_eq!(
            key_of(duplicate_answered(
                Some(&replayed("ch_5", true)),
                Some("ch_5")
            )),
            "pass"
        );
        assert_eq!(
            key_of(duplicate_answered(
                Some(&replayed("ch_5", false)),
                Some("ch_5")
            )),
            "broke.duplicate_not_replayed"
        );
        assert_eq!(
            key_of(duplicate_answered(
                Some(&replayed("ch_6", true)),
                Some("ch_5")
            )),
            "broke.no_conflict"
        );
        assert_eq!(
            key_of(duplicate_answered(
                Some(&answer(Some(500), None)),
                Some("ch_5")
            )),
            "broke.no_conflict"
        );
    }

    #[test]
    fn a_duplicate_that_never_answered_is_said_in_words() {
        let Err(Stop::Verdict(Verdict::Fail(msg))) = duplicate_answered(None, Some("ch_5")) else {
            panic!("no answer is not a conflict")
        };
        assert_eq!(msg.key, "broke.no_conflict");
        assert_eq!(
            msg.args[0].1,
            lab_core::Arg::Msg(Msg::new("call.no_answer"))
        );
        let timed_out = answer(None, None);
        let Err(Stop::Verdict(Verdict::Fail(msg))) =
            duplicate_answered(Some(&timed_out), Some("ch_5"))
        else {
            panic!("a timeout is not a conflict")
        };
        assert_eq!(
            msg.args[0].1,
            lab_core::Arg::Msg(Msg::new("call.no_answer"))
        );
    }

    #[test]
    fn a_changed_duplicate_in_flight_is_refused() {
        assert_eq!(
            key_of(changed_answered(Some(&answer(Some(422), None)))),
            "pass"
        );
        assert_eq!(
            key_of(changed_answered(Some(&answer(Some(409), None)))),
            "pass"
        );
        assert_eq!(
            key_of(changed_answered(Some(&answer(Some(200), Some("ch_5"))))),
            "broke.changed_in_flight"
        );
        assert_eq!(key_of(changed_answered(None)), "broke.changed_in_flight");
    }

    #[test]
    fn the_lab_waits_longer_for_a_slower_service_never_shorter() {
        assert_eq!(duplicate_patience(Duration::ZERO), DUPLICATE_PATIENCE_MIN);
        assert_eq!(
            duplicate_patience(Duration::from_millis(100)),
            DUPLICATE_PATIENCE_MIN
        );
        assert_eq!(
            duplicate_patience(Duration::from_millis(800)),
            Duration::from_millis(2400)
        );
    }

    #[test]
    fn a_client_retries_an_answer_that_asks_for_it_at_the_pace_it_asks() {
        assert!(retries_after(&conflict(Some("1"))));
        assert!(retries_after(&answer(Some(503), None)));
        assert!(retries_after(&answer(None, None)));
        assert!(!retries_after(&answer(Some(200), Some("ch_1"))));
        assert!(!retries_after(&answer(Some(422), None)));
        assert_eq!(retry_pause(&conflict(Some("0"))), RETRY_PAUSE_MIN);
        assert_eq!(retry_pause(&conflict(Some("1"))), RETRY_PAUSE_MAX);
        assert_eq!(retry_pause(&conflict(Some("30"))), RETRY_PAUSE_MAX);
        assert_eq!(retry_pause(&conflict(None)), RETRY_PAUSE);
        assert_eq!(retry_pause(&conflict(Some("soon"))), RETRY_PAUSE);
    }

    #[test]
    fn a_moment_the_service_ended_itself_is_an_unknown_that_says_when() {
        let staged = Staged {
            first: None,
            beside: Vec::new(),
            gave_up: Some(Duration::from_millis(5020)),
        };
        let Err(Stop::Verdict(Verdict::Unknown(msg))) = staged.in_flight("A") else {
            panic!("the moment ended early")
        };
        assert_eq!(msg.key, "unknown.provider_gave_up");
        assert_eq!(msg.args[0].1, lab_core::Arg::Str("5.0".into()));
        let whole = Staged {
            gave_up: None,
            ..staged
        };
        assert!(whole.in_flight("A").is_ok());
    }
}
