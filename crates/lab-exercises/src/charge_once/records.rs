//! What a payment wrote in Redis, found by what changed under KEY_PREFIX (a SCAN of the prefix
//! before and after), never by the client key's text: a design may hash its key names, keep a
//! lock beside its record, or keep every record in one hash. The record that holds a payment's
//! result is the key whose value names its charge; a lock beside it is not.

use std::collections::{BTreeMap, BTreeSet};

use lab_core::Msg;

use crate::judgement::{Judged, broke, fail, undecided, unknown};
use crate::lab_side::KeyRead;

/// A stored result's lifetime is read a moment after it was written: this much less than the
/// window still counts as the window.
pub(super) const TTL_SLACK_MS: i64 = 5_000;

/// Keys under KEY_PREFIX at one moment, each as read then.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Records(pub BTreeMap<String, KeyRead>);

impl Records {
    /// The keys here that were not in `before`: what was written since.
    pub fn new_since(&self, before: &Records) -> Records {
        Records(
            self.0
                .iter()
                .filter(|(key, _)| !before.0.contains_key(*key))
                .map(|(key, read)| (key.clone(), read.clone()))
                .collect(),
        )
    }

    /// The keys whose value names the charge `charge_id`.
    pub fn holding(&self, charge_id: &str) -> Records {
        Records(
            self.0
                .iter()
                .filter(|(_, read)| names_charge(&read.value, charge_id))
                .map(|(key, read)| (key.clone(), read.clone()))
                .collect(),
        )
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn names(&self) -> impl Iterator<Item = String> + '_ {
        self.0.keys().cloned()
    }

    /// The names, for a message: `a, b`.
    pub fn listed(&self) -> String {
        self.0.keys().cloned().collect::<Vec<_>>().join(", ")
    }

    /// The first key that has no expiry (PTTL -1).
    pub fn without_expiry(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|(_, read)| read.pttl == -1)
            .map(|(key, _)| key.as_str())
    }
}

/// Whether `text` names the charge `id` as a whole word (`ch_1` is not in `ch_12`).
pub(super) fn names_charge(text: &str, id: &str) -> bool {
    if id.is_empty() {
        return false;
    }
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(id).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + id.len()..].chars().next();
        !before.is_some_and(word) && !after.is_some_and(word)
    })
}

/// Which keys hold a payment's result, and how the lab knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ResultRecords {
    /// Their values name the payment's charge.
    HoldingCharge(Records),
    /// No value names the charge (not readable as text); these are the keys the payment
    /// created.
    Written(Records),
    /// The payment wrote nothing under KEY_PREFIX, and no key there names its charge.
    Nothing,
}

/// The records of a payment's result: the keys under KEY_PREFIX whose value names its charge
/// (written or rewritten by the payment: one record in a hash of many counts), else the keys the
/// payment created.
pub(super) fn result_records(before: &Records, after: &Records, charge_id: &str) -> ResultRecords {
    let holding = after.holding(charge_id);
    if !holding.is_empty() {
        return ResultRecords::HoldingCharge(holding);
    }
    let written = after.new_since(before);
    if !written.is_empty() {
        return ResultRecords::Written(written);
    }
    ResultRecords::Nothing
}

/// The stored result lives at least the retry window (`window` seconds): the longest-lived of
/// its records does (no expiry at all counts as for ever).
pub(super) fn result_lives(found: &ResultRecords, window: u64, prefix: &str) -> Judged {
    let (records, key) = match found {
        ResultRecords::HoldingCharge(records) => (records, broke("ttl_short")),
        ResultRecords::Written(records) => (records, broke("ttl_short_written")),
        ResultRecords::Nothing => {
            return unknown(undecided("nothing_written").arg("prefix", prefix));
        }
    };
    if records.without_expiry().is_some() {
        return Ok(());
    }
    let Some((longest, read)) = records.0.iter().max_by_key(|(_, read)| read.pttl) else {
        return unknown(undecided("nothing_written").arg("prefix", prefix));
    };
    let window_ms = i64::try_from(window.saturating_mul(1000)).unwrap_or(i64::MAX);
    if read.pttl < window_ms - TTL_SLACK_MS {
        // What was seen, when it is that: the window cut down to whole minutes.
        let key = if in_whole_minutes_below(read.pttl, window) {
            broke("ttl_whole_minutes")
        } else {
            key
        };
        return fail(
            key.arg("key", longest.as_str())
                .arg("seconds", read.pttl.max(0) / 1000)
                .arg("window", window),
        );
    }
    Ok(())
}

/// Whether a record living `pttl` ms is one of `window` seconds rounded down to whole minutes
/// (read a moment after it was written): a window that is not whole minutes, and a life of the
/// whole minutes below it.
pub(super) fn in_whole_minutes_below(pttl: i64, window: u64) -> bool {
    let minutes_ms = i64::try_from(window / 60 * 60_000).unwrap_or(i64::MAX);
    !window.is_multiple_of(60)
        && minutes_ms > 0
        && pttl <= minutes_ms
        && pttl > minutes_ms - TTL_SLACK_MS
}

/// The first key outside KEY_PREFIX, among the keys written on the server during a payment,
/// that is the payment's own: named after its client key, or holding its charge. Another run's
/// keys on a shared Redis (`lab:…` but not `run_prefix`) are not looked at.
pub(super) fn outside_prefix<'a>(
    written: &'a BTreeMap<String, KeyRead>,
    prefix: &str,
    run_prefix: &str,
    client_key: &str,
    charge_id: &str,
) -> Option<&'a str> {
    written
        .iter()
        .filter(|(key, _)| !key.starts_with(prefix))
        .filter(|(key, _)| !key.starts_with("lab:") || key.starts_with(run_prefix))
        .find(|(key, read)| key.contains(client_key) || names_charge(&read.value, charge_id))
        .map(|(key, _)| key.as_str())
}

/// The names in `after` that are not in `before`.
pub(super) fn written_between(before: &BTreeSet<String>, after: &BTreeSet<String>) -> Vec<String> {
    after.difference(before).cloned().collect()
}

/// What became of a payment's keys while the provider held its charge, as the lab watched
/// them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Watched {
    /// This key is gone from Redis: its lease ran out (or it was deleted).
    Gone(String),
    /// They are all still there.
    Kept,
}

/// Of the keys `held` (read while the charge was held), the first that `now` reads as gone.
pub(super) fn watch(held: &Records, now: &Records) -> Watched {
    held.0
        .keys()
        .find(|key| now.0.get(*key).is_none_or(|read| read.pttl == -2))
        .map_or(Watched::Kept, |key| Watched::Gone(key.clone()))
}

/// The why of a second charge of a call whose duplicate came while it was held: what Redis
/// held of the payment then.
pub(super) fn reserved_or_not(held: &Records) -> Msg {
    if held.is_empty() {
        Msg::new("why.nothing_reserved")
    } else {
        Msg::new("why.reserved_yet_charged").arg("keys", held.listed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judgement::{Stop, verdict_of};
    use crate::verdict::Verdict;

    fn read(pttl: i64, value: &str) -> KeyRead {
        KeyRead {
            pttl,
            value: value.to_string(),
        }
    }

    fn records(keys: &[(&str, i64, &str)]) -> Records {
        Records(
            keys.iter()
                .map(|(key, pttl, value)| (key.to_string(), read(*pttl, value)))
                .collect(),
        )
    }

    fn verdict(judged: Judged) -> (String, String) {
        match verdict_of(judged) {
            Ok(Verdict::Pass) => ("pass".into(), String::new()),
            Ok(Verdict::Fail(msg)) => ("fail".into(), msg.key),
            Ok(Verdict::Unknown(msg)) => ("unknown".into(), msg.key),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_charge_is_named_as_a_whole_word() {
        assert!(names_charge(
            r#"{"charge_id":"ch_1","amount":1990}"#,
            "ch_1"
        ));
        assert!(!names_charge(r#"{"charge_id":"ch_12"}"#, "ch_1"));
        assert!(!names_charge(r#"{"charge_id":"xch_1"}"#, "ch_1"));
        assert!(names_charge("ch_1", "ch_1"));
        assert!(!names_charge("anything", ""));
    }

    #[test]
    fn the_record_that_holds_the_charge_is_judged_not_the_lock_beside_it() {
        // lock-left-to-expire: a lock of one lease beside the record of an hour.
        let before = records(&[("p:old", 3_000_000, r#"{"charge":"ch_3"}"#)]);
        let after = records(&[
            ("p:old", 3_000_000, r#"{"charge":"ch_3"}"#),
            ("p:lock:t:pay-9", 29_000, "a1b2c3"),
            (
                "p:payment:t:pay-9",
                3_599_990,
                r#"{"charge":{"charge_id":"ch_9"}}"#,
            ),
        ]);
        let found = result_records(&before, &after, "ch_9");
        assert_eq!(
            found,
            ResultRecords::HoldingCharge(records(&[(
                "p:payment:t:pay-9",
                3_599_990,
                r#"{"charge":{"charge_id":"ch_9"}}"#
            )]))
        );
        assert_eq!(verdict(result_lives(&found, 3600, "p:")).0, "pass");
    }

    #[test]
    fn a_hashed_key_name_is_found_by_what_it_holds() {
        let after = records(&[("p:payment:9f86d081884c7d65", 3_599_000, r#"["ch_4"]"#)]);
        let found = result_records(&Records::default(), &after, "ch_4");
        assert!(matches!(found, ResultRecords::HoldingCharge(_)));
        assert_eq!(verdict(result_lives(&found, 3600, "p:")).0, "pass");
    }

    #[test]
    fn a_short_lived_record_fails_naming_it_and_nothing_written_is_unknown() {
        let after = records(&[("p:payment:t:pay-9", 89_000, r#"{"charge_id":"ch_9"}"#)]);
        let found = result_records(&Records::default(), &after, "ch_9");
        let Err(Stop::Verdict(Verdict::Fail(msg))) = result_lives(&found, 3600, "p:") else {
            panic!("89 s is shorter than an hour")
        };
        assert_eq!(msg.key, "broke.ttl_short");
        assert_eq!(msg.args[1].1, lab_core::Arg::Int(89));
        // A record that does not expire covers any window.
        let forever = records(&[("p:r", -1, "ch_9")]);
        let found = result_records(&Records::default(), &forever, "ch_9");
        assert_eq!(verdict(result_lives(&found, 3600, "p:")).0, "pass");
        // A value the lab cannot read as text: the keys the payment created.
        let opaque = records(&[("p:r", 60_000, "\u{fffd}\u{fffd}")]);
        let found = result_records(&Records::default(), &opaque, "ch_9");
        assert!(matches!(found, ResultRecords::Written(_)));
        assert_eq!(
            verdict(result_lives(&found, 3600, "p:")),
            ("fail".into(), "broke.ttl_short_written".into())
        );
        assert_eq!(
            verdict(result_lives(&ResultRecords::Nothing, 3600, "p:")),
            ("unknown".into(), "unknown.nothing_written".into())
        );
    }

    #[test]
    fn a_window_cut_down_to_whole_minutes_is_named_only_when_that_is_what_was_seen() {
        // 90 s kept as one minute, read a moment later.
        assert!(in_whole_minutes_below(59_870, 90));
        assert!(
            !in_whole_minutes_below(59_870, 3600),
            "an hour is whole minutes"
        );
        assert!(
            !in_whole_minutes_below(30_000, 90),
            "30 s is not 90 s rounded down"
        );
        assert!(
            !in_whole_minutes_below(20_000, 30),
            "no whole minute below 30 s"
        );
        let after = records(&[("p:r", 59_870, "ch_9")]);
        let found = result_records(&Records::default(), &after, "ch_9");
        assert_eq!(
            verdict(result_lives(&found, 90, "p:")),
            ("fail".into(), "broke.ttl_whole_minutes".into())
        );
        let after = records(&[("p:r", 29_870, "ch_9")]);
        let found = result_records(&Records::default(), &after, "ch_9");
        assert_eq!(
            verdict(result_lives(&found, 90, "p:")),
            ("fail".into(), "broke.ttl_short".into())
        );
    }

    #[test]
    fn only_the_payments_own_keys_outside_the_prefix_are_blamed() {
        let written: BTreeMap<String, KeyRead> = [
            ("lab:other:idempotency:x".to_string(), read(10, "ch_9")),
            ("unrelated".to_string(), read(10, "hello")),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            outside_prefix(&written, "lab:me:idempotency:", "lab:me:", "pay-9", "ch_9"),
            None
        );
        let mut written = written;
        written.insert("idempotency:pay-9".to_string(), read(10, "{}"));
        written.insert("lab:me:stray".to_string(), read(10, r#"{"id":"ch_9"}"#));
        assert_eq!(
            outside_prefix(&written, "lab:me:idempotency:", "lab:me:", "pay-9", "ch_9"),
            Some("idempotency:pay-9")
        );
    }

    #[test]
    fn a_watched_reservation_is_gone_or_kept() {
        let held = records(&[("p:lock", 1500, "t"), ("p:attempt", 3_599_000, "{}")]);
        let now = records(&[("p:lock", -2, ""), ("p:attempt", 3_598_000, "{}")]);
        assert_eq!(watch(&held, &now), Watched::Gone("p:lock".into()));
        let renewed = records(&[("p:lock", 1900, "t"), ("p:attempt", 3_598_000, "{}")]);
        assert_eq!(watch(&held, &renewed), Watched::Kept);
        assert_eq!(
            watch(&held, &records(&[("p:attempt", 1, "{}")])),
            Watched::Gone("p:lock".into())
        );
    }

    #[test]
    fn a_second_charge_is_told_with_what_redis_held() {
        assert_eq!(
            reserved_or_not(&Records::default()).key,
            "why.nothing_reserved"
        );
        let held = reserved_or_not(&records(&[("p:pay-5", 29_000, "{}")]));
        assert_eq!(held.key, "why.reserved_yet_charged");
        assert_eq!(held.args[0].1, lab_core::Arg::Str("p:pay-5".into()));
    }

    #[test]
    fn what_was_written_is_what_is_new() {
        let before: BTreeSet<String> = ["a", "b"].iter().map(|s| s.to_string()).collect();
        let after: BTreeSet<String> = ["b", "c"].iter().map(|s| s.to_string()).collect();
        assert_eq!(written_between(&before, &after), vec!["c".to_string()]);
        let old = records(&[("a", 1, "")]);
        let new = records(&[("a", 1, ""), ("b", 2, "")]);
        assert_eq!(new.new_since(&old), records(&[("b", 2, "")]));
    }
}
