//! The checks of a moment: a payment held in the provider once it has charged, while the lab
//! sends its duplicate (`in-flight`, `shared-records`, `redis-blip`), lets its lease run out
//! (`slow-provider`), cuts Redis (`redis-lost`) or kills the service (`crash`). How a call is
//! held and sent beside is [`super::staging`].

use std::time::{Duration, Instant};

use lab_core::Msg;

use super::checks::charged_twice;
use super::records::{Records, Watched, reserved_or_not, watch};
use super::staging::{Staged, changed_answered, duplicate_answered};
use super::{ChargeOnce, PATIENT, SHORT_LEASE_SECONDS, start_beside};
use crate::judgement::{Judged, broke, fail, undecided, unknown};
use crate::lab_side::Reached;
use crate::payment::{AMOUNT, Intent, charged, must_be_charged};
use crate::verdict::{ChargeRow, Sent};

/// How often Redis is read while the lab waits for a reservation to run out.
const EXPIRY_POLL: Duration = Duration::from_millis(100);

/// The charge the provider made, when it made exactly one.
fn the_charge(charges: &[ChargeRow]) -> Option<&str> {
    match charges {
        [one] => Some(one.charge_id.as_str()),
        _ => None,
    }
}

/// What a client's retries after a failure were about: the key's cause words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Failure {
    /// Redis was lost between the charge and its store (`redis-lost`).
    LostStore,
    /// The service was killed mid-charge (`crash`).
    Crash,
}

impl Failure {
    fn no_expiry(self) -> Msg {
        match self {
            Failure::LostStore => broke("lost_store_no_expiry"),
            Failure::Crash => broke("crash_no_expiry"),
        }
    }

    fn not_charged(self) -> Msg {
        match self {
            Failure::LostStore => broke("lost_store_not_charged"),
            Failure::Crash => broke("crash_not_charged"),
        }
    }
}

/// After a failure the client's retries end in the Charge the provider made: the last of
/// them, `last`, answered with it. `held` is what Redis held of the payment while its charge
/// was held, read again after the retries: a key without expiry there is why they never got
/// through. `after` is how long the client retried.
pub(super) fn retries_end_in_the_charge(
    failure: Failure,
    last: &Sent,
    charges: &[ChargeRow],
    held: &Records,
    after: Duration,
) -> Judged {
    if charged(last) && last.charge_id.as_deref() == the_charge(charges) {
        return Ok(());
    }
    let seconds = format!("{:.1}", after.as_secs_f64());
    if let Some(key) = held.without_expiry()
        && last.status == Some(409)
    {
        return fail(failure.no_expiry().arg("seconds", seconds).arg("key", key));
    }
    fail(
        failure
            .not_charged()
            .arg("status", last.status_arg())
            .arg("seconds", seconds),
    )
}

/// The first call's own answer when Redis was lost after its charge: the Charge the provider
/// made, or an answer the client retries (a 5xx, a 409, none); never a refusal that tells the
/// client to stop, nor another charge.
pub(super) fn answered_through_the_loss(first: Option<&Sent>, charges: &[ChargeRow]) -> Judged {
    let Some(first) = first else {
        return Ok(());
    };
    match first.status {
        None | Some(409) => Ok(()),
        Some(s) if s >= 500 => Ok(()),
        Some(_) if charged(first) && first.charge_id.as_deref() == the_charge(charges) => Ok(()),
        Some(_) => fail(broke("lost_store_status").arg("status", first.status_arg())),
    }
}

pub(super) async fn in_flight(w: &mut ChargeOnce) -> Judged {
    w.provider_dedup(false).await?;
    let intent = Intent::new(5);
    let before = w.records().await?;
    let held = w.hold_first("A", &intent, "pay-5").await?;
    let reserved = w.records().await?.new_since(&before);
    w.step(Msg::new("step.duplicates_sent"));
    let url = w.payments_url();
    let window = w
        .while_held(
            &held,
            vec![
                intent.call(&url, "client.B", "pay-5", PATIENT),
                intent
                    .with_amount(AMOUNT + 1000)
                    .call(&url, "client.C", "pay-5", PATIENT),
            ],
        )
        .await;
    let staged = w.let_go(held, window).await;
    staged.in_flight("A")?;
    let charges = w.charges(&intent).await?;
    if charges.len() > 1 {
        return fail(
            broke("duplicate_charged")
                .arg("count", charges.len())
                .arg("why", reserved_or_not(&reserved)),
        );
    }
    duplicate_answered(staged.beside[0].as_ref(), the_charge(&charges))?;
    changed_answered(staged.beside[1].as_ref())?;
    match &staged.first {
        Some(answer) => must_be_charged(answer)?,
        None => return unknown(undecided("never_held")),
    }
    w.step(Msg::new("step.retry_after_first"));
    let retry = w.pay("client.B", &intent, "pay-5").await;
    let first = the_charge(&charges).unwrap_or("-");
    if !charged(&retry) || Some(first) != retry.charge_id.as_deref() {
        return fail(
            broke("replay_differs")
                .arg("status", retry.status_arg())
                .arg("first", first)
                .arg(
                    "second",
                    retry.charge_id.clone().unwrap_or_else(|| "-".into()),
                ),
        );
    }
    Ok(())
}

pub(super) async fn shared_records(w: &mut ChargeOnce) -> Judged {
    let program = w.program.clone();
    w.step(Msg::new("step.second_instance"));
    let Ok(mut second) = start_beside(w, &program.dir, program.manifest).await? else {
        return unknown(undecided("no_second"));
    };
    let other = format!("{}/payments", second.base_url());
    let judged = shared_between(w, &other).await;
    second.stop().await;
    judged
}

/// `shared-records` once the second instance answers at `other` (its payments URL).
async fn shared_between(w: &mut ChargeOnce, other: &str) -> Judged {
    w.provider_dedup(false).await?;
    let intent = Intent::new(14);
    w.step(Msg::new("step.shared_replay"));
    let paid = w.pay("instance_1", &intent, "pay-14").await;
    must_be_charged(&paid)?;
    let replayed = w
        .rig
        .send(intent.call(other, "instance_2", "pay-14", PATIENT))
        .await;
    let charges = w.charges(&intent).await?;
    if charges.len() > 1 {
        return fail(broke("shared_charged_again").arg("count", charges.len()));
    }
    if !charged(&replayed) || replayed.charge_id != paid.charge_id || !replayed.replayed_header {
        return fail(broke("shared_not_replayed").arg("status", replayed.status_arg()));
    }
    let intent = Intent::new(15);
    let before = w.records().await?;
    let held = w.hold_first("A", &intent, "pay-15").await?;
    let reserved = w.records().await?.new_since(&before);
    w.step(Msg::new("step.shared_duplicate"));
    let window = w
        .while_held(
            &held,
            vec![intent.call(other, "instance_2", "pay-15", PATIENT)],
        )
        .await;
    let staged = w.let_go(held, window).await;
    staged.in_flight("A")?;
    let charges = w.charges(&intent).await?;
    if charges.len() > 1 {
        return fail(
            broke("shared_in_flight_charged")
                .arg("count", charges.len())
                .arg("why", reserved_or_not(&reserved)),
        );
    }
    duplicate_answered(staged.beside[0].as_ref(), the_charge(&charges))
}

pub(super) async fn redis_blip(w: &mut ChargeOnce) -> Judged {
    w.provider_dedup(false).await?;
    let warm = Intent::new(10);
    w.step(Msg::new("step.warm"));
    let answer = w.pay("client", &warm, "pay-10").await;
    must_be_charged(&answer)?;
    w.step(Msg::new("step.blip"));
    w.blip_redis().await?;
    let intent = Intent::new(11);
    let before = w.records().await?;
    w.step(Msg::new("step.hold_first").arg("who", "A"));
    // A service that fails closed on its dead connection answers 503 without charging: the
    // client retries, as it would (a few times at most).
    let mut held = None;
    for _ in 0..3 {
        let sent_at = Instant::now();
        match w.try_hold("client.A", &intent, "pay-11").await {
            Reached::Held { hold, call } => {
                held = Some(super::staging::held("A", hold, call, sent_at));
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
    let Some(held) = held else {
        return fail(broke("blip_refused"));
    };
    let reserved = w.records().await?.new_since(&before);
    w.step(Msg::new("step.duplicate"));
    let url = w.payments_url();
    let window = w
        .while_held(
            &held,
            vec![intent.call(&url, "client.B", "pay-11", PATIENT)],
        )
        .await;
    let staged = w.let_go(held, window).await;
    staged.in_flight("A")?;
    let charges = w.charges(&intent).await?;
    if charges.len() > 1 {
        // Blamed on the blip only when Redis held nothing of the payment while it charged.
        if reserved.is_empty() {
            return fail(broke("blip_unprotected").arg("count", charges.len()));
        }
        return fail(
            broke("blip_charged_twice")
                .arg("count", charges.len())
                .arg("keys", reserved.listed()),
        );
    }
    Ok(())
}

pub(super) async fn slow_provider(w: &mut ChargeOnce) -> Judged {
    let dedup = w.provider_dedup;
    w.with_short_lease().await?;
    w.provider_dedup(dedup).await?;
    let intent = Intent::new(13);
    let before = w.records().await?;
    let held = w.hold_first("A", &intent, "pay-13").await?;
    let reserved = w.records().await?.new_since(&before);
    // The provider stays slow until the payment's reservation is gone from Redis (its lease ran
    // out), or for a lease and a half (a renewed lease, or a longer one, is still there); and
    // stops being slow when the service gives up on it (its own timeout ended the slow call).
    let longest = Duration::from_millis(SHORT_LEASE_SECONDS * 1500);
    let mut outcome = Watched::Kept;
    let mut gave_up = None;
    while held.age() < longest {
        if let Some(after) = held.gave_up_within(EXPIRY_POLL).await {
            gave_up = Some(after);
            break;
        }
        if reserved.is_empty() {
            continue;
        }
        let now = w.reread(reserved.names()).await?;
        outcome = watch(&reserved, &now);
        if outcome != Watched::Kept {
            break;
        }
    }
    let seconds = format!("{:.1}", held.age().as_secs_f64());
    let said = match (&gave_up, &outcome) {
        (Some(after), _) => {
            Msg::new("step.provider_given_up").arg("seconds", format!("{:.1}", after.as_secs_f64()))
        }
        (None, Watched::Gone(key)) => Msg::new("step.reservation_gone")
            .arg("seconds", seconds)
            .arg("key", key.as_str()),
        (None, Watched::Kept) if reserved.is_empty() => {
            Msg::new("step.nothing_reserved").arg("seconds", seconds)
        }
        (None, Watched::Kept) => Msg::new("step.reservation_kept")
            .arg("seconds", seconds)
            .arg("keys", reserved.listed()),
    };
    w.step(said);
    w.step(Msg::new("step.duplicate"));
    let url = w.payments_url();
    let window = w
        .while_held(
            &held,
            vec![intent.call(&url, "client.B", "pay-13", PATIENT)],
        )
        .await;
    let _: Staged = w.let_go(held, window).await;
    let charges = w.charges(&intent).await?;
    if charges.len() > 1 {
        return charged_twice(broke("slow_charged_twice"), &charges, dedup);
    }
    Ok(())
}

pub(super) async fn redis_lost(w: &mut ChargeOnce) -> Judged {
    let dedup = w.provider_dedup;
    w.with_short_lease().await?;
    w.provider_dedup(dedup).await?;
    let intent = Intent::new(16);
    let before = w.records().await?;
    let held = w.hold_first("A", &intent, "pay-16").await?;
    let reserved = w.records().await?.new_since(&before);
    w.step(Msg::new("step.redis_lost"));
    w.cut_redis().await?;
    let first = w.release(held).await;
    w.restore_redis().await?;
    w.step(Msg::new("step.redis_back_retry"));
    let (last, after) = w
        .retry_until_charged(&intent, "pay-16", retry_bound(w.lease))
        .await;
    let charges = w.charges(&intent).await?;
    if charges.len() > 1 {
        return charged_twice(broke("lost_store_charged_twice"), &charges, dedup);
    }
    answered_through_the_loss(first.as_ref(), &charges)?;
    let held_now = w.reread(reserved.names()).await?;
    retries_end_in_the_charge(Failure::LostStore, &last, &charges, &held_now, after)
}

pub(super) async fn crash(w: &mut ChargeOnce) -> Judged {
    let dedup = w.provider_dedup;
    w.with_short_lease().await?;
    w.provider_dedup(dedup).await?;
    let intent = Intent::new(17);
    let before = w.records().await?;
    let held = w.hold_first("A", &intent, "pay-17").await?;
    let reserved = w.records().await?.new_since(&before);
    w.step(Msg::new("step.crash"));
    w.rig.kill_service().await;
    if w.answers_health().await {
        return unknown(undecided("not_killed"));
    }
    // The held handler's caller is gone with the process; let it end.
    drop(w.answer_of(held).await);
    w.step(Msg::new("step.restart"));
    if w.rig.restart_service().await?.is_err() {
        return unknown(undecided("no_restart"));
    }
    w.step(Msg::new("step.restarted_retry"));
    let (last, after) = w
        .retry_until_charged(&intent, "pay-17", retry_bound(w.lease))
        .await;
    let charges = w.charges(&intent).await?;
    if charges.len() > 1 {
        return charged_twice(broke("crash_charged_twice"), &charges, dedup);
    }
    let held_now = w.reread(reserved.names()).await?;
    retries_end_in_the_charge(Failure::Crash, &last, &charges, &held_now, after)
}

/// How long a client retries after a failure: three leases and a second, so a reservation the
/// failure left behind has run out well before.
fn retry_bound(lease: u64) -> Duration {
    Duration::from_secs(lease * 3 + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judgement::verdict_of;
    use crate::lab_side::KeyRead;
    use crate::payment::tests::answer;
    use crate::verdict::Verdict;

    fn key_of(judged: Judged) -> String {
        match verdict_of(judged) {
            Ok(Verdict::Pass) => "pass".into(),
            Ok(Verdict::Fail(msg)) | Ok(Verdict::Unknown(msg)) => msg.key,
            other => panic!("{other:?}"),
        }
    }

    fn row(id: &str) -> ChargeRow {
        ChargeRow {
            charge_id: id.into(),
            amount: 1990,
            currency: "RUB".into(),
            key: Some("k".into()),
        }
    }

    fn held(pttl: i64) -> Records {
        Records(
            [(
                "p:payment:t:pay-17".to_string(),
                KeyRead {
                    pttl,
                    value: "{}".into(),
                },
            )]
            .into_iter()
            .collect(),
        )
    }

    #[test]
    fn the_retries_end_in_the_charge_or_say_what_blocked_them() {
        let charges = [row("ch_17")];
        let after = Duration::from_secs(7);
        assert_eq!(
            key_of(retries_end_in_the_charge(
                Failure::Crash,
                &answer(Some(200), Some("ch_17")),
                &charges,
                &held(-2),
                after
            )),
            "pass"
        );
        // Still in progress, and the reservation has no expiry: blocked for ever.
        let conflict = answer(Some(409), None);
        assert_eq!(
            key_of(retries_end_in_the_charge(
                Failure::Crash,
                &conflict,
                &charges,
                &held(-1),
                after
            )),
            "broke.crash_no_expiry"
        );
        // Still in progress, but nothing in Redis says why: the answer is what is told.
        assert_eq!(
            key_of(retries_end_in_the_charge(
                Failure::Crash,
                &conflict,
                &charges,
                &held(-2),
                after
            )),
            "broke.crash_not_charged"
        );
        // A Charge that is not the one the provider made is not the Charge.
        assert_eq!(
            key_of(retries_end_in_the_charge(
                Failure::LostStore,
                &answer(Some(200), Some("ch_99")),
                &charges,
                &held(-2),
                after
            )),
            "broke.lost_store_not_charged"
        );
        assert_eq!(
            key_of(retries_end_in_the_charge(
                Failure::LostStore,
                &answer(Some(503), None),
                &[],
                &held(-1),
                after
            )),
            "broke.lost_store_not_charged"
        );
    }

    #[test]
    fn the_first_calls_answer_through_a_lost_redis_is_the_charge_or_one_the_client_retries() {
        let charges = [row("ch_16")];
        for fine in [
            answer(Some(200), Some("ch_16")),
            answer(Some(503), None),
            answer(Some(500), None),
            answer(Some(409), None),
            answer(None, None),
        ] {
            assert_eq!(
                key_of(answered_through_the_loss(Some(&fine), &charges)),
                "pass"
            );
        }
        for wrong in [
            answer(Some(422), None),
            answer(Some(400), None),
            answer(Some(200), Some("ch_99")),
        ] {
            assert_eq!(
                key_of(answered_through_the_loss(Some(&wrong), &charges)),
                "broke.lost_store_status"
            );
        }
    }

    #[test]
    fn a_client_retries_for_three_leases_and_a_second() {
        assert_eq!(retry_bound(2), Duration::from_secs(7));
    }
}
