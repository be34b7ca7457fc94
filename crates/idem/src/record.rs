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

use std::fmt::Write as _;
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

    /// A reservation written at `now`, lasting `lease`.
    pub(crate) fn pending(
        operation: &str,
        key: &str,
        fingerprint: Option<&str>,
        now: SystemTime,
        lease: Duration,
        owner: Option<&str>,
    ) -> Record {
        Record {
            operation: operation.to_owned(),
            idempotency_key: key.to_owned(),
            result: null(),
            created_at: utc_timestamp(now),
            expires_at: utc_timestamp(now + lease),
            status: Status::Pending,
            fingerprint: fingerprint.map(str::to_owned),
            owner: owner.map(str::to_owned),
            // The hardened reserve script appends the fence it draws (see `lua/reserve.lua`).
            fence: None,
        }
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
    // One buffer of the final size, written once: two of these are made for every call (the
    // pending record's created_at and expires_at), so this is on the hot path.
    let mut text = String::with_capacity(27);
    let _ = write!(
        text,
        "{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}"
    );
    if micros != 0 {
        let _ = write!(text, ".{micros:06}");
    }
    text.push('Z');
    text
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
        let record = Record::pending("op", "k", None, now, Duration::from_secs(30), None);
        assert_eq!(
            record.to_json(),
            r#"{"operation":"op","idempotency_key":"k","result":null,"created_at":"2026-11-30T02:00:38.338793Z","expires_at":"2026-11-30T02:01:08.338793Z","status":"pending","fingerprint":null}"#
        );
    }
}
