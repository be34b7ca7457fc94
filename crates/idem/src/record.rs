//! The record stored under an idempotency key: idempotency-kit's wire format.
//!
//! A record is one Redis *string* holding compact JSON, with the fields in this order:
//!
//! ```text
//! {"operation":"order.create","idempotency_key":"replay-1","result":{"by":"a","run":1},
//!  "created_at":"2026-11-30T02:00:38.338793Z","expires_at":"2026-11-30T03:00:38.338793Z",
//!  "status":"completed","fingerprint":null}
//! ```
//!
//! (one line in Redis; wrapped here). Two kinds share the shape:
//!
//! * a **pending** record is a reservation: the key is taken and the action is running.
//!   `result` is `null` and `expires_at` is the end of the lease;
//! * a **completed** record holds the action's result until `expires_at`.
//!
//! The hardened policy adds two fields at the end, `owner` (whose reservation this is) and
//! `fence` (the fencing token it was given). Python's model ignores fields it does not know, so
//! it still reads these records.
//!
//! Timestamps are UTC with microseconds and a `Z`, as pydantic writes them; like pydantic we
//! leave the fraction out when it is zero (`…T02:00:38Z`). Redis's own TTL, set on every write
//! to the time left until `expires_at`, is what actually removes a record: this crate never
//! decides from its own clock that a record has expired (see the crate docs, "Clocks").

use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// Whether a record is a reservation or a stored result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// A reservation: the action is running (or its holder crashed and the lease has not run out).
    Pending,
    /// The action's result is stored. Records written before idempotency-kit had a status read
    /// as completed, hence the default.
    #[default]
    Completed,
}

/// One idempotency record, field for field idempotency-kit's `IdempotencyRecord`.
///
/// Serialising it gives the compact JSON above, in the same field order; parsing and
/// re-serialising a record gives back the same text (`result` is kept as raw JSON).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    /// The operation name, trimmed.
    pub operation: String,
    /// The idempotency key, trimmed.
    pub idempotency_key: String,
    /// The action's result as JSON, `null` while pending. Kept as the exact stored text: it is
    /// decoded into the caller's type only on a replay, and re-serialising never reorders it.
    pub result: Box<RawValue>,
    /// When this record was written (RFC 3339, UTC).
    pub created_at: String,
    /// When it stops counting: the end of the lease (pending) or of the TTL (completed).
    pub expires_at: String,
    /// Pending or completed; absent in very old records, which are completed.
    #[serde(default)]
    pub status: Status,
    /// The caller's fingerprint of the request, if it gave one (see [`crate::fingerprint_of`]).
    #[serde(default)]
    pub fingerprint: Option<String>,
    /// Hardened policy only: the owner token of the reservation that wrote this record. Only the
    /// holder of this token may complete, renew or release it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Hardened policy only: the fencing token handed to the action that wrote this record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
}

impl Record {
    /// Parses a stored record. Unknown fields are ignored, as pydantic does.
    pub fn from_json(text: &str) -> Result<Record, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// The compact JSON stored in Redis.
    pub fn to_json(&self) -> String {
        // Every field is a string, a number or raw JSON that already parsed: this cannot fail.
        serde_json::to_string(self).expect("a record always serialises")
    }

    /// Whether this is a reservation rather than a stored result.
    pub fn is_pending(&self) -> bool {
        self.status == Status::Pending
    }

    /// Decodes the stored result into the caller's type.
    pub fn decode_result<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.result.get())
    }

    /// A reservation with these times.
    pub(crate) fn pending_at(
        operation: &str,
        key: &str,
        fingerprint: Option<&str>,
        times: PendingTimes,
        owner: Option<&str>,
    ) -> Record {
        Record {
            operation: operation.to_owned(),
            idempotency_key: key.to_owned(),
            result: null(),
            created_at: times.created_at,
            expires_at: times.expires_at,
            status: Status::Pending,
            fingerprint: fingerprint.map(str::to_owned),
            owner: owner.map(str::to_owned),
            // The hardened reserve script appends the fence it draws (see `lua/reserve.lua`).
            fence: None,
        }
    }

    /// The JSON of [`Record::pending_at`]'s record, byte for byte what [`Record::to_json`] gives
    /// for it (a test holds them equal), written straight into one string: every call sends
    /// one, and most of them (every replay) never need the record itself.
    pub(crate) fn pending_json(
        operation: &str,
        key: &str,
        fingerprint: Option<&str>,
        times: &PendingTimes,
        owner: Option<&str>,
    ) -> String {
        let mut json = String::with_capacity(
            160 + operation.len() + key.len() + fingerprint.map_or(0, str::len) + 48,
        );
        json.push_str(r#"{"operation":"#);
        push_json_str(&mut json, operation);
        json.push_str(r#","idempotency_key":"#);
        push_json_str(&mut json, key);
        // The timestamps are our own digits, `-`, `:`, `.`, `T` and `Z`: nothing to escape.
        json.push_str(r#","result":null,"created_at":""#);
        json.push_str(&times.created_at);
        json.push_str(r#"","expires_at":""#);
        json.push_str(&times.expires_at);
        json.push_str(r#"","status":"pending","fingerprint":"#);
        match fingerprint {
            Some(fingerprint) => push_json_str(&mut json, fingerprint),
            None => json.push_str("null"),
        }
        if let Some(owner) = owner {
            json.push_str(r#","owner":"#);
            push_json_str(&mut json, owner);
        }
        json.push('}');
        json
    }

    /// A stored result written at `now`, kept for `ttl`.
    pub(crate) fn completed(
        operation: &str,
        key: &str,
        fingerprint: Option<&str>,
        result: Box<RawValue>,
        now: SystemTime,
        ttl: Duration,
    ) -> Record {
        Record {
            operation: operation.to_owned(),
            idempotency_key: key.to_owned(),
            result,
            created_at: utc_timestamp(now),
            expires_at: utc_timestamp(now + ttl),
            status: Status::Completed,
            fingerprint: fingerprint.map(str::to_owned),
            owner: None,
            fence: None,
        }
    }
}

/// A stored record read in place: the same fields, required and typed as [`Record`]'s (so the
/// same values are refused as "not an idempotency record"), borrowed from the bytes Redis sent
/// instead of copied into strings of their own. A replay reads one on every call; copying its
/// strings and the raw result was most of the cost of reading it. (The fields with a `_` are
/// read only so that a record without them is refused.)
#[derive(Debug, Deserialize)]
pub(crate) struct StoredRecord<'a> {
    #[serde(borrow, rename = "operation")]
    _operation: Cow<'a, str>,
    #[serde(borrow, rename = "idempotency_key")]
    _idempotency_key: Cow<'a, str>,
    #[serde(borrow)]
    pub(crate) result: &'a RawValue,
    #[serde(borrow, rename = "created_at")]
    _created_at: Cow<'a, str>,
    #[serde(borrow, rename = "expires_at")]
    _expires_at: Cow<'a, str>,
    #[serde(default)]
    pub(crate) status: Status,
    #[serde(default, borrow)]
    pub(crate) fingerprint: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub(crate) owner: Option<Cow<'a, str>>,
    #[serde(default)]
    pub(crate) fence: Option<u64>,
}

impl<'a> StoredRecord<'a> {
    /// Reads a stored record. Unknown fields are ignored, as pydantic does.
    pub(crate) fn from_json(text: &'a str) -> Result<StoredRecord<'a>, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// Whether this is a reservation rather than a stored result.
    pub(crate) fn is_pending(&self) -> bool {
        self.status == Status::Pending
    }

    /// Decodes the stored result into the caller's type.
    pub(crate) fn decode_result<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.result.get())
    }
}

/// When a reservation was written and when its lease ends, as the record writes them.
#[derive(Debug, Clone)]
pub(crate) struct PendingTimes {
    created_at: String,
    expires_at: String,
}

impl PendingTimes {
    pub(crate) fn starting(now: SystemTime, lease: Duration) -> PendingTimes {
        PendingTimes {
            created_at: utc_timestamp(now),
            expires_at: utc_timestamp(now + lease),
        }
    }
}

/// Appends `text` as a JSON string, escaped exactly as serde_json escapes it. Most strings here
/// (operations, keys, timestamps, hex tokens) need no escape at all and are copied whole.
fn push_json_str(json: &mut String, text: &str) {
    // serde_json escapes `"`, `\` and the control characters below 0x20, nothing else. The test
    // folds over every byte rather than stopping at the first: branch-free, so it vectorises.
    let needs_escape = text.bytes().fold(false, |found, b| {
        found | (b < 0x20) | (b == b'"') | (b == b'\\')
    });
    if !needs_escape {
        json.push('"');
        json.push_str(text);
        json.push('"');
    } else {
        json.push_str(&serde_json::to_string(text).expect("a string always serialises"));
    }
}

fn null() -> Box<RawValue> {
    RawValue::from_string("null".to_owned()).expect("null is JSON")
}

/// `t` as pydantic writes an aware UTC datetime: `2026-11-30T02:00:38.338793Z`, without the
/// fraction when it is zero.
pub(crate) fn utc_timestamp(t: SystemTime) -> String {
    // Times before 1970 do not occur here (they would come from a clock set far back).
    let since_epoch = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let seconds = since_epoch.as_secs();
    let micros = since_epoch.subsec_micros();
    let (year, month, day) = civil_from_days((seconds / 86_400) as i64);
    let second_of_day = seconds % 86_400;
    let (hour, minute, second) = (
        second_of_day / 3600,
        second_of_day % 3600 / 60,
        second_of_day % 60,
    );
    // Written digit by digit into one buffer of the final size: two of these are made for
    // every call (the pending record's created_at and expires_at), and `write!` with its padded
    // integers was a sixth of a replay's instructions.
    let mut text = String::with_capacity(27);
    push_digits(&mut text, year.clamp(0, 9999) as u64, 4);
    text.push('-');
    push_digits(&mut text, month.into(), 2);
    text.push('-');
    push_digits(&mut text, day.into(), 2);
    text.push('T');
    push_digits(&mut text, hour, 2);
    text.push(':');
    push_digits(&mut text, minute, 2);
    text.push(':');
    push_digits(&mut text, second, 2);
    if micros != 0 {
        text.push('.');
        push_digits(&mut text, micros.into(), 6);
    }
    text.push('Z');
    text
}

/// Appends the last `width` decimal digits of `n`, zero-padded.
fn push_digits(text: &mut String, n: u64, width: u32) {
    for place in (0..width).rev() {
        let digit = (n / 10u64.pow(place)) % 10;
        text.push(char::from(b'0' + digit as u8));
    }
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`), so that no date crate is needed for one timestamp format.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153; // March = 0
    let day = (day_of_year - (153 * shifted_month + 2) / 5 + 1) as u32;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The probe's record, verbatim (`[record-layout]` in the reference).
    const PROBE_RECORD: &str = r#"{"operation":"order.create","idempotency_key":"replay-1","result":{"by":"a","run":1},"created_at":"2026-11-30T02:00:38.338793Z","expires_at":"2026-11-30T03:00:38.338793Z","status":"completed","fingerprint":null}"#;

    #[test]
    fn the_probe_record_round_trips_byte_for_byte() {
        let record = Record::from_json(PROBE_RECORD).unwrap();
        assert_eq!(record.operation, "order.create");
        assert_eq!(record.idempotency_key, "replay-1");
        assert_eq!(record.status, Status::Completed);
        assert_eq!(record.fingerprint, None);
        assert_eq!(record.result.get(), r#"{"by":"a","run":1}"#);
        assert_eq!(record.to_json(), PROBE_RECORD);
    }

    #[test]
    fn result_keeps_its_key_order_and_hardened_fields_go_last() {
        let text = r#"{"operation":"o","idempotency_key":"k","result":{"z":1,"a":[1.0,2]},"created_at":"2026-11-30T02:00:38Z","expires_at":"2026-11-30T02:00:39Z","status":"pending","fingerprint":"ab","owner":"f00d","fence":7}"#;
        let record = Record::from_json(text).unwrap();
        assert_eq!(record.fence, Some(7));
        assert!(record.is_pending());
        assert_eq!(record.to_json(), text);
    }

    #[test]
    fn old_records_without_status_read_as_completed_and_unknown_fields_are_ignored() {
        let text = r#"{"operation":"o","idempotency_key":"k","result":5,"created_at":"2026-11-30T02:00:38Z","expires_at":"2026-11-30T02:00:39Z","extra":true}"#;
        let record = Record::from_json(text).unwrap();
        assert_eq!(record.status, Status::Completed);
        assert_eq!(record.decode_result::<u32>().unwrap(), 5);
    }

    /// Read in place, a record gives what [`Record`] gives, and refuses what it refuses.
    #[test]
    fn a_stored_record_reads_as_a_record_does() {
        let texts = [
            PROBE_RECORD,
            r#"{"operation":"o","idempotency_key":"k","result":{"z":1},"created_at":"t","expires_at":"t","status":"pending","fingerprint":"a\"b","owner":"f00d","fence":7}"#,
            r#"{"operation":"o","idempotency_key":"k","result":5,"created_at":"t","expires_at":"t","extra":true}"#,
        ];
        for text in texts {
            let owned = Record::from_json(text).unwrap();
            let stored = StoredRecord::from_json(text).unwrap();
            assert_eq!(stored.status, owned.status, "{text}");
            assert_eq!(stored.fingerprint.as_deref(), owned.fingerprint.as_deref());
            assert_eq!(stored.owner.as_deref(), owned.owner.as_deref());
            assert_eq!(stored.fence, owned.fence);
            assert_eq!(stored.result.get(), owned.result.get());
        }
        let refused = [
            r#"{"idempotency_key":"k","result":5,"created_at":"t","expires_at":"t"}"#,
            r#"{"operation":"o","idempotency_key":"k","created_at":"t","expires_at":"t"}"#,
            r#"{"operation":"o","idempotency_key":"k","result":5,"created_at":1,"expires_at":"t"}"#,
            r#"{"operation":"o","idempotency_key":"k","result":5,"created_at":"t","expires_at":"t","status":"lost"}"#,
            r#"[1,2]"#,
        ];
        for text in refused {
            assert!(Record::from_json(text).is_err(), "{text}");
            assert!(StoredRecord::from_json(text).is_err(), "{text}");
        }
    }

    /// The pending record written straight is the one serde writes, escapes and all.
    #[test]
    fn the_pending_json_is_the_records_json() {
        let now = UNIX_EPOCH + Duration::from_micros(1_796_004_038_338_793);
        let texts = [
            "op",
            "k1",
            "",
            "quote\"d",
            "back\\slash",
            "line\nbreak\t\u{1}\u{1f}",
            "del\u{7f}",
            "юникод ключ ✓",
            "{tenant}x",
        ];
        for operation in texts {
            for key in texts {
                for fingerprint in [None, Some("ab12"), Some(key)] {
                    for owner in [None, Some("0123456789abcdef0123456789abcdef")] {
                        let times = PendingTimes::starting(now, Duration::from_secs(30));
                        let written =
                            Record::pending_json(operation, key, fingerprint, &times, owner);
                        let record = Record::pending_at(operation, key, fingerprint, times, owner);
                        assert_eq!(written, record.to_json(), "{operation:?} {key:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn timestamps_are_pydantics() {
        let at = |secs: u64, micros: u32| {
            utc_timestamp(
                UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(micros.into()),
            )
        };
        // Vectors from Python's `datetime.fromtimestamp(ts, UTC)`.
        assert_eq!(at(1_796_004_038, 338_793), "2026-11-30T02:00:38.338793Z");
        assert_eq!(at(0, 0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400, 0), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_709_164_800, 1), "2024-02-29T00:00:00.000001Z");
        assert_eq!(at(4_102_444_799, 999_999), "2099-12-31T23:59:59.999999Z");
    }

    #[test]
    fn a_pending_record_has_the_python_shape() {
        let now = UNIX_EPOCH + Duration::from_micros(1_796_004_038_338_793);
        let times = PendingTimes::starting(now, Duration::from_secs(30));
        let record = Record::pending_at("op", "k", None, times, None);
        assert_eq!(
            record.to_json(),
            r#"{"operation":"op","idempotency_key":"k","result":null,"created_at":"2026-11-30T02:00:38.338793Z","expires_at":"2026-11-30T02:01:08.338793Z","status":"pending","fingerprint":null}"#
        );
    }
}
