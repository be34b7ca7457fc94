//! The `keys` scenario's last side: idempotency-kit's three in-flight modes on one held call.
//!
//! Each run holds a first call inside the charge (the payment service's `payments.in_action`
//! checkpoint, before it calls the provider) and sends a duplicate with the same key meanwhile:
//!
//! | mode                               | the duplicate                                   | charges |
//! |------------------------------------|-------------------------------------------------|---------|
//! | `raise` (the lesson's, run above)  | 409 `payment_in_progress` at once               | 1       |
//! | `wait`, the first call finishes    | waits, then gets the stored Charge (a replay)   | 1       |
//! | `wait`, the first call's lease expires while it is held | reserves the freed key, charges itself | 2 |
//! | `run`                              | no reservation: charges beside the first        | 2       |
//!
//! "The duplicate is waiting" is a checkpoint the service reaches when a call meets a reserved
//! key (`payments.met_in_flight`), never a sleep. The expiry is simulated as in `ttl-expiry`:
//! the reservation's remaining life is cut to 1 ms. Two calls finish close together here, so
//! the service's own lines are muted during the overlap (their order would be the machine's)
//! and the story says what each call got from the answers and the provider's list.
//!
//! Facts: `wait_duplicate_replayed` = true, `wait_charges` = 1, `wait_lease_expired_charges` =
//! 2, `run_charges` = 2, `run_answers_show_one_charge` = true.

use lab_core::Msg;
use lab_services::payments::{self, IN_ACTION, InFlightName, MET_IN_FLIGHT, PaymentChange};

use super::{AMOUNT, Paid, configure_payments, pay_msg, provider_charges, provider_key, send_pay};
use crate::kit::payments::record_key;
use crate::kit::redis::expire_now;
use crate::kit::{Caller, Held};
use crate::{Ctx, ScenarioError, ScenarioResult};

const K4: &str = "K4";
const K5: &str = "K5";
const K6: &str = "K6";

/// What the first call does while the duplicate is out.
enum Meanwhile {
    /// Nothing: it is released as soon as the duplicate is seen waiting.
    Finishes,
    /// Its reservation expires (simulated) while it is still held.
    LeaseExpires,
}

pub async fn side(ctx: &Ctx) -> ScenarioResult {
    let n = &ctx.narrator;
    n.side("side.in_flight_modes");

    mode(ctx, InFlightName::Wait).await?;
    n.step(Msg::new("step.wait_finishes").arg("key", K4))
        .await?;
    let (first, duplicate) = overlap(ctx, K4, Meanwhile::Finishes).await?;
    let charges = provider_charges(ctx, Some(&provider_key(K4))).await?.len();
    let replayed = duplicate.answer.replayed
        && duplicate.charge_id().is_some()
        && duplicate.charge_id() == first.charge_id();
    n.fact("wait_duplicate_replayed", replayed);
    n.fact("wait_charges", charges);
    n.note(
        Msg::new(if replayed {
            "note.wait_replayed"
        } else {
            "note.wait_not_replayed"
        })
        .arg("status", duplicate.answer.status_or_zero())
        .arg("charges", charges),
    );

    n.step(Msg::new("step.wait_lease_expires").arg("key", K5))
        .await?;
    n.predict("predict_modes").await?;
    let (_, duplicate) = overlap(ctx, K5, Meanwhile::LeaseExpires).await?;
    let charges = provider_charges(ctx, Some(&provider_key(K5))).await?.len();
    n.fact("wait_lease_expired_charges", charges);
    n.reveal(
        Msg::new("reveal_modes")
            .arg("status", duplicate.answer.status_or_zero())
            .arg("charges", charges),
    )
    .await?;

    mode(ctx, InFlightName::Run).await?;
    n.step(Msg::new("step.run_mode").arg("key", K6)).await?;
    let (first, duplicate) = overlap(ctx, K6, Meanwhile::Finishes).await?;
    let charges = provider_charges(ctx, Some(&provider_key(K6))).await?.len();
    n.fact("run_charges", charges);
    n.fact(
        "run_answers_show_one_charge",
        first.charge_id().is_some() && first.charge_id() == duplicate.charge_id(),
    );
    n.note(Msg::new("note.run_charges").arg("charges", charges));
    super::show_charges(ctx).await?;
    mode(ctx, InFlightName::Raise).await?;
    Ok(())
}

async fn mode(ctx: &Ctx, in_flight: InFlightName) -> Result<(), ScenarioError> {
    configure_payments(
        ctx,
        PaymentChange {
            in_flight: Some(in_flight),
            ..PaymentChange::default()
        },
    )
    .await
}

/// A first call with `key` held inside the charge, a duplicate sent meanwhile, and what each
/// got: `(first, duplicate)`.
async fn overlap(
    ctx: &Ctx,
    key: &str,
    meanwhile: Meanwhile,
) -> Result<(Paid, Paid), ScenarioError> {
    let n = &ctx.narrator;
    let url = ctx.service(&payments::SPEC)?.url.clone();
    let voice = ctx.service(&payments::SPEC)?.voice().clone();
    n.call("who.first", payments::NAME, pay_msg("first", key, AMOUNT));
    // Patient: it waits inside the charge for as long as the learner reads.
    let first_caller = Caller::patient();
    let mut first: Held<_> = ctx
        .hold(IN_ACTION)
        .call(send_pay(&first_caller, &url, key, AMOUNT))
        .await?;
    n.call("who.second", payments::NAME, pay_msg("second", key, AMOUNT));
    voice.mute(true);
    let waiting = ctx.notice(MET_IN_FLIGHT);
    let duplicate_caller = Caller::new();
    let mut duplicate = std::pin::pin!(send_pay(&duplicate_caller, &url, key, AMOUNT));
    let result = async {
        match meanwhile {
            Meanwhile::Finishes => {
                // Release the first once the duplicate has met its reservation (under `run`
                // there is none to meet: the duplicate charges and answers first).
                let duplicate_done = first
                    .meanwhile(async {
                        tokio::select! {
                            seen = waiting.passed() => seen.map(|()| None),
                            paid = &mut duplicate => Ok(Some(paid)),
                        }
                    })
                    .await??;
                let first = first.release().await;
                Ok::<_, ScenarioError>(match duplicate_done {
                    Some(paid) => (paid, first, Order::DuplicateFirst),
                    None => (first, duplicate.await, Order::FirstFirst),
                })
            }
            Meanwhile::LeaseExpires => {
                let duplicate = first
                    .meanwhile(async {
                        tokio::select! {
                            seen = waiting.passed() => seen?,
                            _ = &mut duplicate => return Err(ScenarioError::Broken(
                                "the duplicate ended without waiting for the first call".into(),
                            )),
                        }
                        expire_now(&mut ctx.redis()?, &record_key(ctx, key)).await?;
                        Ok::<_, ScenarioError>(duplicate.await)
                    })
                    .await??;
                Ok((duplicate, first.release().await, Order::DuplicateFirst))
            }
        }
    }
    .await;
    voice.mute(false);
    // Each answer is told in the order the calls ended, which the script fixed.
    let (earlier, later, order) = result?;
    n.response(earlier.view());
    n.response(later.view());
    Ok(match order {
        Order::FirstFirst => (earlier, later),
        Order::DuplicateFirst => (later, earlier),
    })
}

/// Which call of an overlap ended first.
enum Order {
    FirstFirst,
    DuplicateFirst,
}
