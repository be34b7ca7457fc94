//! The checks of one call or a few in a row: `replay`, `changed-payment`, `new-key`,
//! `invalid-keys`, `lost-answer`, `tenants`, `result-ttl`, `redis-down`.

use lab_core::Msg;
use lab_services::provider::ChargeCall;

use super::records::{ResultRecords, outside_prefix, result_lives, result_records};
use super::staging::held;
use super::{ChargeOnce, OUTAGE_PATIENCE};
use crate::judgement::{Judged, broke, fail, undecided, unknown};
use crate::lab_side::{KeyRead, Reached, STAGING_LIMIT};
use crate::payment::{AMOUNT, Intent, OTHER_TENANT, charged, keys_of, must_be_charged};
use crate::verdict::{ChargeRow, Sent};

/// Why an intent was charged more than once, named by what the provider saw: no key, a key
/// that changed, or one stable key that a provider without deduplication could not use.
pub(super) fn charged_twice<T>(what: Msg, charges: &[ChargeRow], dedup: bool) -> Judged<T> {
    let why = if charges.iter().all(|c| c.key.is_none()) {
        Msg::new("why.no_provider_key")
    } else if charges.windows(2).any(|w| w[0].key != w[1].key) {
        Msg::new("why.provider_keys_differ")
    } else if dedup {
        Msg::new("why.charged_twice")
    } else {
        Msg::new("why.no_dedup")
    };
    fail(
        what.arg("count", charges.len())
            .arg("keys", keys_of(charges))
            .arg("why", why),
    )
}

pub(super) async fn replay(w: &mut ChargeOnce) -> Judged {
    w.provider_dedup(false).await?;
    let intent = Intent::new(1);
    w.step(Msg::new("step.replay"));
    let first = w.pay("client", &intent, "pay-1").await;
    must_be_charged(&first)?;
    let second = w.pay("client", &intent, "pay-1").await;
    let charges = w.charges(&intent).await?;
    if charges.len() > 1 {
        return fail(broke("replay_charged").arg("count", charges.len()));
    }
    if !charged(&second) || second.charge_id != first.charge_id {
        return fail(
            broke("replay_differs")
                .arg("status", second.status_arg())
                .arg("first", first.charge_id.clone().unwrap_or_default())
                .arg(
                    "second",
                    second.charge_id.clone().unwrap_or_else(|| "-".into()),
                ),
        );
    }
    if !second.replayed_header {
        return fail(broke("no_replay_header"));
    }
    Ok(())
}

pub(super) async fn changed_payment(w: &mut ChargeOnce) -> Judged {
    w.provider_dedup(false).await?;
    let intent = Intent::new(2);
    w.step(Msg::new("step.changed_payment"));
    let first = w.pay("client", &intent, "pay-2").await;
    must_be_charged(&first)?;
    // Each field of the payment changed on its own, under the one key.
    let changes = [
        (
            "amount",
            intent.with_amount(AMOUNT + 1000),
            AMOUNT.to_string(),
            (AMOUNT + 1000).to_string(),
        ),
        (
            "currency",
            intent.with_currency("USD"),
            intent.currency.to_string(),
            "USD".to_string(),
        ),
        (
            "order_id",
            intent.with_order(22),
            intent.order.clone(),
            intent.with_order(22).order,
        ),
    ];
    for (field, changed, was, now) in changes {
        w.step(Msg::new("step.changed_field").arg("field", field));
        let second = w.pay("client", &changed, "pay-2").await;
        let charges = w.charges(&intent).await?;
        // A changed order's charges are counted too: the second order may be the one charged.
        let elsewhere = if changed.order == intent.order {
            Vec::new()
        } else {
            w.charges(&changed).await?
        };
        if charges.len() + elsewhere.len() > 1 {
            return fail(
                broke("changed_charged")
                    .arg("field", field)
                    .arg("count", charges.len() + elsewhere.len()),
            );
        }
        if second.status != Some(422) {
            return fail(
                broke("changed_not_422")
                    .arg("field", field)
                    .arg("was", was)
                    .arg("now", now)
                    .arg("status", second.status_arg()),
            );
        }
        if !second.json_body {
            return fail(broke("not_json").arg("status", 422));
        }
    }
    Ok(())
}

pub(super) async fn new_key(w: &mut ChargeOnce) -> Judged {
    w.provider_dedup(false).await?;
    let intent = Intent::new(3);
    w.step(Msg::new("step.new_key"));
    let first = w.pay("client", &intent, "pay-3a").await;
    must_be_charged(&first)?;
    let second = w.pay("client", &intent, "pay-3b").await;
    let charges = w.charges(&intent).await?;
    if !charged(&second) || second.replayed_header || second.charge_id == first.charge_id {
        return fail(broke("new_key_replayed").arg("status", second.status_arg()));
    }
    if charges.len() != 2 {
        return fail(broke("new_key_charges").arg("count", charges.len()));
    }
    Ok(())
}

pub(super) async fn invalid_keys(w: &mut ChargeOnce) -> Judged {
    w.provider_dedup(false).await?;
    w.step(Msg::new("step.invalid_keys"));
    let keys = [String::new(), "order:4".to_string(), "k".repeat(256)];
    let mut intents = Vec::new();
    let mut wrong = None;
    for (n, key) in keys.iter().enumerate() {
        let intent = Intent::new(40 + n as u32);
        let answer = w.pay("client", &intent, key).await;
        if wrong.is_none() && (answer.status != Some(400) || !answer.json_body) {
            wrong = Some((key.clone(), answer));
        }
        intents.push(intent);
    }
    let mut charged_count = 0;
    for intent in &intents {
        charged_count += w.charges(intent).await?.len();
    }
    if charged_count > 0 {
        return fail(broke("invalid_key_charged").arg("count", charged_count));
    }
    if let Some((key, answer)) = wrong {
        let shown = match key.chars().count() {
            0 => Msg::new("key.empty"),
            n if n > 40 => Msg::new("key.long").arg("n", n),
            _ => Msg::new("key.quoted").arg("key", key),
        };
        if answer.status == Some(400) {
            return fail(broke("not_json").arg("status", 400));
        }
        return fail(
            broke("invalid_key_status")
                .arg("key", shown)
                .arg("status", answer.status_arg()),
        );
    }
    Ok(())
}

pub(super) async fn lost_answer(w: &mut ChargeOnce) -> Judged {
    let dedup = w.provider_dedup;
    w.provider_dedup(dedup).await?;
    let intent = Intent::new(6);
    w.step(Msg::new("step.lost_armed"));
    let sent_at = std::time::Instant::now();
    let held = match w.try_hold("client", &intent, "pay-6").await {
        Reached::Held { hold, call } => held("client", hold, call, sent_at),
        Reached::Answered(answer) => {
            return fail(broke("not_charged").arg("status", answer.status_arg()));
        }
        Reached::Never => return unknown(undecided("never_held")),
    };
    // Aimed at the connections open now: the one carrying the charge is the first to get an
    // answer back (the service's idle ones, if it keeps any, carry none).
    let (lost, trigger) = w
        .provider_hop
        .arm_on_trigger(faultproxy::Fault::ResponseLostAfterCommit, 1);
    trigger.fire();
    let answered = w.answer_of(held).await;
    let fired = tokio::time::timeout(STAGING_LIMIT, lost.fired()).await;
    if fired.is_err() || answered.is_none() {
        return unknown(undecided("fault_not_fired"));
    }
    w.step(Msg::new("step.retry"));
    let retry = w.pay("client", &intent, "pay-6").await;
    let charges = w.charges(&intent).await?;
    if charges.len() > 1 {
        return charged_twice(broke("lost_charged_twice"), &charges, dedup);
    }
    if !charged(&retry) {
        return fail(broke("retry_not_charged").arg("status", retry.status_arg()));
    }
    Ok(())
}

/// Two tenants paid with one client key (`first` for tenant 1, `second` for tenant 2, each its
/// own order): each got a Charge of its own. `second_charges` are the provider's charges of
/// tenant 2's order, and `requests` every request the provider got: a provider key without
/// the tenant shows there as tenant 2's request answered with tenant 1's charge.
pub(super) fn tenants_apart(
    first: &Sent,
    second: &Sent,
    second_order: &str,
    second_charges: &[ChargeRow],
    requests: &[ChargeCall],
) -> Judged {
    if charged(second) && second.charge_id == first.charge_id {
        let given = second.charge_id.as_deref().unwrap_or_default();
        if let Some(shared) = requests
            .iter()
            .find(|r| r.order_id == second_order && r.charge_id == given && r.replayed)
        {
            return fail(
                broke("tenant_provider_key")
                    .arg("charge", given)
                    .arg("key", shared.key.clone().unwrap_or_default()),
            );
        }
    }
    if !charged(second)
        || second.replayed_header
        || second.charge_id == first.charge_id
        || second_charges.len() != 1
    {
        return fail(
            broke("tenant_sees_other")
                .arg("status", second.status_arg())
                .arg("count", second_charges.len()),
        );
    }
    Ok(())
}

pub(super) async fn tenants(w: &mut ChargeOnce) -> Judged {
    // The manifest's provider: a provider key without the tenant does its harm only where the
    // provider removes duplicates by key.
    let dedup = w.provider_dedup;
    w.provider_dedup(dedup).await?;
    let first = Intent::new(7);
    let second = Intent {
        tenant: OTHER_TENANT,
        amount: AMOUNT + 500,
        ..Intent::new(8)
    };
    w.step(Msg::new("step.tenants"));
    let a = w.pay("tenant_1", &first, "pay-7").await;
    must_be_charged(&a)?;
    let b = w.pay("tenant_2", &second, "pay-7").await;
    let charges_b = w.charges(&second).await?;
    let requests = w.provider.requests().await?;
    tenants_apart(&a, &b, &second.order, &charges_b, &requests)?;
    w.step(Msg::new("step.tenants_replay"));
    let a_again = w.pay("tenant_1", &first, "pay-7").await;
    let b_again = w.pay("tenant_2", &second, "pay-7").await;
    // Each tenant's retry is the replay check's business; here, neither may get the other's.
    if a_again.charge_id == b.charge_id || b_again.charge_id == a.charge_id {
        return fail(broke("tenant_replay_mixed"));
    }
    Ok(())
}

pub(super) async fn result_ttl(w: &mut ChargeOnce) -> Judged {
    w.provider_dedup(false).await?;
    let window = w.retry_window;
    let intent = Intent::new(9);
    w.step(Msg::new("step.result_ttl").arg("window", window));
    let before = w.records().await?;
    let server_before = w.server_keys().await?;
    let first = w.pay("client", &intent, "pay-9").await;
    must_be_charged(&first)?;
    let charge_id = first.charge_id.clone().unwrap_or_default();
    let after = w.records().await?;
    let server_after = w.server_keys().await?;
    let prefix = w.prefix.clone();
    let mut written = std::collections::BTreeMap::<String, KeyRead>::new();
    for key in super::records::written_between(&server_before, &server_after) {
        if !key.starts_with(&prefix) {
            let read = crate::lab_side::read_key(&mut w.redis, &key).await?;
            written.insert(key, read);
        }
    }
    if let Some(key) = outside_prefix(&written, &prefix, &w.run_prefix, "pay-9", &charge_id) {
        return fail(
            broke("outside_prefix")
                .arg("key", key)
                .arg("prefix", prefix.as_str()),
        );
    }
    let found = result_records(&before, &after, &charge_id);
    match &found {
        ResultRecords::HoldingCharge(records) => {
            w.step(Msg::new("step.result_records").arg("charge", charge_id.as_str()));
            w.show(records);
        }
        ResultRecords::Written(records) => {
            w.step(Msg::new("step.written_records").arg("charge", charge_id.as_str()));
            w.show(records);
        }
        ResultRecords::Nothing => {
            // Nothing in Redis to read: whether the result is stored at all is what a retry
            // tells (stored elsewhere, it is replayed, and the lab cannot read its lifetime).
            w.step(Msg::new("step.nothing_written_retry"));
            let retry = w.pay("client", &intent, "pay-9").await;
            let charges = w.charges(&intent).await?;
            stored_somewhere(&first, &retry, charges.len(), &prefix)?;
        }
    }
    result_lives(&found, window, &prefix)
}

/// A payment of which nothing was written in Redis: its result is stored somewhere if its retry
/// was the same Charge and charged nothing more; else it is not stored at all.
pub(super) fn stored_somewhere(first: &Sent, retry: &Sent, charges: usize, prefix: &str) -> Judged {
    if charges > 1 || !charged(retry) || retry.charge_id != first.charge_id {
        return fail(
            broke("result_not_stored")
                .arg("prefix", prefix)
                .arg("status", retry.status_arg())
                .arg("count", charges),
        );
    }
    Ok(())
}

pub(super) async fn redis_down(w: &mut ChargeOnce) -> Judged {
    let dedup = w.provider_dedup;
    w.provider_dedup(dedup).await?;
    let intent = Intent::new(12);
    w.step(Msg::new("step.redis_down"));
    w.cut_redis().await?;
    let first = w
        .pay_within("client", &intent, "pay-12", OUTAGE_PATIENCE)
        .await;
    w.step(Msg::new("step.retry"));
    let second = w
        .pay_within("client", &intent, "pay-12", OUTAGE_PATIENCE)
        .await;
    w.restore_redis().await?;
    w.step(Msg::new("step.redis_back"));
    let charges = w.charges(&intent).await?;
    if charges.len() > 1 {
        if dedup {
            return charged_twice(broke("fail_open_keys"), &charges, true);
        }
        return fail(broke("fail_open_no_dedup").arg("count", charges.len()));
    }
    for answer in [&first, &second] {
        let fine = match answer.status {
            Some(503) => true,
            Some(s) if (200..300).contains(&s) => charged(answer),
            _ => false,
        };
        if !fine {
            return fail(broke("down_status").arg("status", answer.status_arg()));
        }
    }
    if charges.is_empty() && [&first, &second].iter().any(|a| charged(a)) {
        return fail(broke("down_made_up"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judgement::verdict_of;
    use crate::payment::tests::answer;
    use crate::verdict::Verdict;

    fn key_of(judged: Judged) -> String {
        match verdict_of(judged) {
            Ok(Verdict::Pass) => "pass".into(),
            Ok(Verdict::Fail(msg)) | Ok(Verdict::Unknown(msg)) => msg.key,
            other => panic!("{other:?}"),
        }
    }

    fn row(id: &str, key: Option<&str>) -> ChargeRow {
        ChargeRow {
            charge_id: id.into(),
            amount: 1990,
            currency: "RUB".into(),
            key: key.map(str::to_string),
        }
    }

    fn request(order: &str, key: &str, charge: &str, replayed: bool) -> ChargeCall {
        ChargeCall {
            key: Some(key.into()),
            order_id: order.into(),
            amount: 1990,
            currency: "RUB".into(),
            charge_id: charge.into(),
            replayed,
        }
    }

    #[test]
    fn a_second_charge_is_named_by_the_keys_the_provider_saw() {
        let key = |judged: Judged| match verdict_of(judged) {
            Ok(Verdict::Fail(msg)) => match &msg.args[2].1 {
                lab_core::Arg::Msg(why) => why.key.clone(),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        };
        let none = [row("ch_1", None), row("ch_2", None)];
        assert_eq!(
            key(charged_twice(broke("x"), &none, true)),
            "why.no_provider_key"
        );
        let differ = [row("ch_1", Some("a")), row("ch_2", Some("b"))];
        assert_eq!(
            key(charged_twice(broke("x"), &differ, true)),
            "why.provider_keys_differ"
        );
        let same = [row("ch_1", Some("a")), row("ch_2", Some("a"))];
        assert_eq!(key(charged_twice(broke("x"), &same, false)), "why.no_dedup");
        assert_eq!(
            key(charged_twice(broke("x"), &same, true)),
            "why.charged_twice"
        );
    }

    #[test]
    fn a_result_not_in_redis_is_stored_somewhere_only_if_its_retry_replays_it() {
        let first = answer(Some(200), Some("ch_9"));
        let replayed = Sent {
            replayed_header: true,
            ..answer(Some(200), Some("ch_9"))
        };
        assert_eq!(key_of(stored_somewhere(&first, &replayed, 1, "p:")), "pass");
        let again = answer(Some(200), Some("ch_10"));
        assert_eq!(
            key_of(stored_somewhere(&first, &again, 2, "p:")),
            "broke.result_not_stored"
        );
        assert_eq!(
            key_of(stored_somewhere(&first, &answer(Some(500), None), 1, "p:")),
            "broke.result_not_stored"
        );
    }

    #[test]
    fn each_tenant_gets_its_own_charge() {
        let a = answer(Some(200), Some("ch_11"));
        let b = answer(Some(200), Some("ch_12"));
        let requests = [
            request("o7", "payment.t1.pay-7", "ch_11", false),
            request("o8", "payment.t2.pay-7", "ch_12", false),
        ];
        assert_eq!(
            key_of(tenants_apart(
                &a,
                &b,
                "o8",
                &[row("ch_12", Some("payment.t2.pay-7"))],
                &requests
            )),
            "pass"
        );
    }

    #[test]
    fn a_provider_key_without_the_tenant_is_named_by_the_request_that_shared_it() {
        // Tenant 2's request went out under tenant 1's provider key, and the provider, which
        // removes duplicates, answered with tenant 1's charge.
        let a = answer(Some(200), Some("ch_11"));
        let b = answer(Some(200), Some("ch_11"));
        let requests = [
            request("o7", "payment.pay-7", "ch_11", false),
            request("o8", "payment.pay-7", "ch_11", true),
        ];
        let judged = tenants_apart(&a, &b, "o8", &[], &requests);
        let Err(crate::judgement::Stop::Verdict(Verdict::Fail(msg))) = judged else {
            panic!("tenant 2 got tenant 1's charge")
        };
        assert_eq!(msg.key, "broke.tenant_provider_key");
        assert_eq!(msg.args[1].1, lab_core::Arg::Str("payment.pay-7".into()));
    }

    #[test]
    fn a_record_shared_by_tenants_is_seen_in_the_answer() {
        // The record has no tenant: tenant 2's other payment under the same key is refused
        // (422), or replayed from tenant 1's record; it never reaches the provider.
        let a = answer(Some(200), Some("ch_11"));
        let refused = answer(Some(422), None);
        assert_eq!(
            key_of(tenants_apart(&a, &refused, "o8", &[], &[])),
            "broke.tenant_sees_other"
        );
        let replayed = Sent {
            replayed_header: true,
            ..answer(Some(200), Some("ch_11"))
        };
        assert_eq!(
            key_of(tenants_apart(&a, &replayed, "o8", &[], &[])),
            "broke.tenant_sees_other"
        );
    }
}
