//! Request fingerprints: what makes two calls under one key *the same request*.
//!
//! A client reuses its idempotency key for every retry of one payment. If the same key arrives
//! with a different amount, it is not a retry but a bug (or an attack), and replaying the first
//! payment's result would be wrong. So the record stores a fingerprint of the request's
//! parameters, and a call whose fingerprint differs gets [`Error::KeyReused`](crate::Error)
//! instead of a replay.
//!
//! [`fingerprint_of`] gives the same SHA-256 hex digest as idempotency-kit's
//! `fingerprint_of(**values)` for the same values, so a Python and a Rust service sharing a
//! Redis agree on what "the same request" means. Python computes
//! `sha256(json.dumps(values, sort_keys=True, separators=(",", ":"), ensure_ascii=False))`;
//! [`canonical_json`] writes that exact text:
//!
//! * object keys sorted, at every depth, by code point (UTF-8 byte order is the same order);
//! * no spaces: `,` between items and `:` after keys;
//! * non-ASCII characters as themselves; only `"`, `\` and control characters are escaped, with
//!   Python's escapes (`\n`, `\u001f`, lowercase hex);
//! * numbers as Python prints them: an integer as itself, a float with Python's `repr`, so
//!   `1.0` stays `1.0` (not `1`), `1e16` is `1e+16` and `0.00001` is `1e-05`.
//!
//! Python converts some values before hashing them (`pydantic_core.to_jsonable_python`); pass
//! their JSON form: a UUID as its hyphenated lowercase string (`str(uuid)`), a `Decimal` as its
//! string (`"19.90"`, and `"1.0"` is not `"1.00"`), a datetime as its ISO 8601 string, a tuple or a
//! set as an array. `1` and `1.0` are different fingerprints in both languages.
//!
//! Do not rely on `serde_json::Map`'s own order: with serde_json's `preserve_order` feature (which
//! a workspace may turn on for another crate) a map keeps insertion order. The key sort here is
//! explicit.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The fingerprint of a request: the SHA-256 hex digest (64 lowercase characters) of
/// [`canonical_json`]`(values)`.
///
/// `values` is a JSON object of named values, as Python's keyword arguments:
///
/// ```
/// let fp = idem::fingerprint_of(&serde_json::json!({
///     "order_id": "0b5e6a2c-1f0e-4d55-9a43-5d6a1c1f0e2b",
///     "amount": 1990,
///     "currency": "RUB",
/// }));
/// assert_eq!(fp.len(), 64);
/// // The order of the names does not matter.
/// assert_eq!(fp, idem::fingerprint_of(&serde_json::json!({
///     "currency": "RUB", "amount": 1990, "order_id": "0b5e6a2c-1f0e-4d55-9a43-5d6a1c1f0e2b",
/// })));
/// // Python's `fingerprint_of()` with no values hashes `{}`.
/// assert_eq!(
///     idem::fingerprint_of(&serde_json::json!({})),
///     "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
/// );
/// ```
pub fn fingerprint_of(values: &Value) -> String {
    let digest = Sha256::digest(canonical_json(values).as_bytes());
    // Lowercase hex written into one string (a `format!` per byte cost more than the hash).
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut hex = String::with_capacity(digest.len() * 2);
    for byte in digest {
        hex.push(char::from(HEX[usize::from(byte >> 4)]));
        hex.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    hex
}

/// The text [`fingerprint_of`] hashes: Python's
/// `json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_value(value, &mut out);
    out
}

fn write_value(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(number) => {
            // serde_json keeps integers and floats apart (`1` vs `1.0`), as Python does.
            match number.as_f64() {
                Some(float) if number.is_f64() => out.push_str(&python_float_repr(float)),
                _ => out.push_str(&number.to_string()),
            }
        }
        Value::String(text) => write_string(text, out),
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_value(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            // The explicit sort: `sort_keys=True`. `str` ordering in Rust is byte order, and
            // UTF-8 byte order is code point order, which is how Python compares strings.
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by_key(|(name, _)| *name);
            out.push('{');
            for (index, (name, item)) in entries.into_iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_string(name, out);
                out.push(':');
                write_value(item, out);
            }
            out.push('}');
        }
    }
}

/// A JSON string as Python's `json.dumps(..., ensure_ascii=False)` writes it.
fn write_string(text: &str, out: &mut String) {
    out.push('"');
    for ch in text.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            // The other control characters; DEL (0x7f) and everything above pass through.
            ch if u32::from(ch) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(ch))),
            ch => out.push(ch),
        }
    }
    out.push('"');
}

/// A float as Python's `repr(float)` writes it (what `json.dumps` uses).
///
/// Both languages pick the shortest digits that read back as the same float; they differ only in
/// layout. Python writes the digits in plain notation when the decimal exponent is in a middle
/// range and in scientific notation otherwise, with a signed, at least two-digit exponent.
fn python_float_repr(value: f64) -> String {
    if value == 0.0 {
        return if value.is_sign_negative() {
            "-0.0"
        } else {
            "0.0"
        }
        .to_string();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "-1.5e-7", "1e16".
    let scientific = format!("{value:e}");
    let (mantissa, exponent) = scientific
        .split_once('e')
        .expect("`{:e}` always writes an exponent");
    let exponent: i32 = exponent.parse().expect("`{:e}` writes a decimal exponent");
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();

    // Python's `decpt`: the value is 0.<digits> × 10^decpt.
    let decpt = exponent + 1;
    let mut out = String::new();
    if negative {
        out.push('-');
    }
    // CPython's float_repr_style "short", mode 'r': scientific iff decpt <= -4 or decpt > 16.
    if decpt <= -4 || decpt > 16 {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let sign = if exponent < 0 { '-' } else { '+' };
        out.push_str(&format!("e{sign}{:02}", exponent.abs()));
    } else if decpt <= 0 {
        // 0.000ddd
        out.push_str("0.");
        out.push_str(&"0".repeat(decpt.unsigned_abs() as usize));
        out.push_str(&digits);
    } else {
        let decpt = decpt as usize;
        if decpt >= digits.len() {
            // An integral value: Python adds ".0" so it still reads as a float.
            out.push_str(&digits);
            out.push_str(&"0".repeat(decpt - digits.len()));
            out.push_str(".0");
        } else {
            out.push_str(&digits[..decpt]);
            out.push('.');
            out.push_str(&digits[decpt..]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn floats_are_written_as_python_repr() {
        // Each right-hand side is what CPython 3.11 prints for `json.dumps(x)`.
        let cases = [
            (1.0, "1.0"),
            (-0.0, "-0.0"),
            (0.0, "0.0"),
            (0.5, "0.5"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (9999999999999998.0, "9999999999999998.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e300, "1.5e+300"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (0.1 + 0.2, "0.30000000000000004"),
            (123.456, "123.456"),
            (-2.5e-7, "-2.5e-07"),
            (123456789.125, "123456789.125"),
        ];
        for (value, python) in cases {
            assert_eq!(python_float_repr(value), python, "{value:?}");
        }
    }

    #[test]
    fn canonical_text_sorts_keys_at_every_depth_whatever_the_map_order() {
        // With `preserve_order` these maps keep the order written here; the output must not.
        let value = json!({"b": {"z": 1, "a": [true, null]}, "a": 1.0, "é": "x", "Z": -3});
        assert_eq!(
            canonical_json(&value),
            r#"{"Z":-3,"a":1.0,"b":{"a":[true,null],"z":1},"é":"x"}"#
        );
    }

    #[test]
    fn strings_are_escaped_as_python_with_ensure_ascii_false() {
        let value = json!("\u{0}\u{1f}\u{7f}\u{2028}\"\\/é😀\n\t\r\u{8}\u{c}");
        assert_eq!(
            canonical_json(&value),
            "\"\\u0000\\u001f\u{7f}\u{2028}\\\"\\\\/é😀\\n\\t\\r\\b\\f\""
        );
    }

    #[test]
    fn integers_and_floats_differ() {
        assert_ne!(
            fingerprint_of(&json!({"a": 1})),
            fingerprint_of(&json!({"a": 1.0}))
        );
        assert_eq!(
            canonical_json(&json!({"big": u64::MAX, "neg": i64::MIN})),
            r#"{"big":18446744073709551615,"neg":-9223372036854775808}"#
        );
    }
}
