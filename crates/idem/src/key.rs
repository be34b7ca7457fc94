//! What makes a valid operation name and idempotency key, and how the two become Redis keys.
//!
//! The rules are idempotency-kit's (`IdempotencyIdentifiers`), so a key one side accepts the
//! other accepts too:
//!
//! * surrounding whitespace is trimmed first, and everything below applies to the trimmed text;
//! * the operation is 1–100 characters, the key 1–255 (characters, i.e. Unicode code points, not
//!   bytes: `"é"` is one);
//! * neither may contain `:`, because `:` separates the parts of the Redis key
//!   `<prefix><operation>:<key>`. Every other character is allowed (newlines, non-ASCII, `{`).
//!
//! # Trimming on every path
//!
//! idempotency-kit trims when it *writes* a record but builds the key from the raw string when it
//! *reads* or *deletes* one. A retry with `" k1 "` then finds nothing at `…: k1 `, collides with
//! `…:k1` on every reservation attempt, and spins for a whole lease before giving up with
//! "in progress", although the first call completed. Here [`validate`] returns the trimmed
//! strings and every read, write and delete uses those, so `" k1 "` and `"k1"` are one key, and a
//! record Python wrote for `" k1 "` (stored under `k1`) is found by us for `" k1 "`.
//!
//! "Whitespace" is Unicode's White_Space property ([`str::trim`]). That is exactly what pydantic
//! strips (its core is Rust and calls `trim` too); Python's own `str.strip` would also remove
//! `\x1c`–`\x1f`, and pydantic keeps those, so do we.
//!
//! # The fence counter's key, and Redis Cluster
//!
//! The hardened policy keeps a counter beside each record (see [`fence_key`]). A Lua script
//! touches both keys at once, and on a Redis Cluster a script may only touch keys of one hash
//! slot. The counter's name is therefore chosen to land in the record's slot without changing
//! the record's own name, which Python services share.

use std::fmt;

/// The longest operation name, in characters (idempotency-kit's `MAX_OPERATION_LENGTH`).
pub const MAX_OPERATION_CHARS: usize = 100;

/// The longest idempotency key, in characters (idempotency-kit's `MAX_KEY_LENGTH`).
pub const MAX_KEY_CHARS: usize = 255;

/// The key prefix idempotency-kit's Redis repository uses unless told otherwise. A Rust and a
/// Python service replay each other's results only if they use the same prefix.
pub const DEFAULT_PREFIX: &str = "idempotency:";

/// The number of hash slots of a Redis Cluster.
const CLUSTER_SLOTS: u16 = 16384;

/// An operation and a key that passed [`validate`], both trimmed.
///
/// They borrow from the caller's strings: trimming only narrows the slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identifiers<'a> {
    pub operation: &'a str,
    pub key: &'a str,
}

/// Which of the two identifiers a [`ValidationError`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Operation,
    Key,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Field::Operation => "operation",
            Field::Key => "idempotency key",
        })
    }
}

/// Why an operation or a key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    #[error("the {field} is empty (after trimming whitespace)")]
    Empty { field: Field },
    #[error(
        "the {field} is {chars} characters long (after trimming whitespace); at most {max} are allowed"
    )]
    TooLong {
        field: Field,
        chars: usize,
        max: usize,
    },
    #[error("the {field} contains ':', which separates the parts of the Redis key")]
    Colon { field: Field },
}

/// Trims an operation name or an idempotency key the way every read, write and delete does.
///
/// This is the whole normalisation: nothing is lower-cased or otherwise rewritten, so two keys
/// that differ in anything but surrounding whitespace stay two keys.
pub fn normalise_key(raw: &str) -> &str {
    raw.trim()
}

/// Checks an operation and a key against idempotency-kit's rules and returns them trimmed.
///
/// The operation is checked first, so a call with both wrong reports the operation.
pub fn validate<'a>(operation: &'a str, key: &'a str) -> Result<Identifiers<'a>, ValidationError> {
    let operation = check(Field::Operation, operation, MAX_OPERATION_CHARS)?;
    let key = check(Field::Key, key, MAX_KEY_CHARS)?;
    Ok(Identifiers { operation, key })
}

fn check(field: Field, raw: &str, max: usize) -> Result<&str, ValidationError> {
    let trimmed = normalise_key(raw);
    if trimmed.is_empty() {
        return Err(ValidationError::Empty { field });
    }
    // Characters, not bytes: pydantic's `max_length` counts code points.
    let chars = trimmed.chars().count();
    if chars > max {
        return Err(ValidationError::TooLong { field, chars, max });
    }
    if trimmed.contains(':') {
        return Err(ValidationError::Colon { field });
    }
    Ok(trimmed)
}

/// The Redis key of a record: `<prefix><operation>:<key>`, byte for byte what idempotency-kit's
/// repository builds (`f"{key_prefix}{operation}:{idempotency_key}"`).
///
/// The prefix is used verbatim: a prefix `"app"` gives `appop:key`, as in Python.
pub fn record_key(prefix: &str, ids: Identifiers<'_>) -> String {
    // Pushed into one buffer of the final size (built on every call: `format!` cost twice this).
    let mut key = String::with_capacity(prefix.len() + ids.operation.len() + 1 + ids.key.len());
    key.push_str(prefix);
    key.push_str(ids.operation);
    key.push(':');
    key.push_str(ids.key);
    key
}

/// The key of the fence counter that belongs to the record at `record_key`, whose keys all start
/// with `prefix`.
///
/// The counter must live in the record's hash slot (one Lua script touches both), the record key
/// itself cannot change (Python services read it), and the counter's key must start with the
/// coordinator's prefix too, so that whatever owns the prefix (an ACL key pattern, a cleanup by
/// `SCAN MATCH <prefix>*`, a lab run's key space) owns the counter as well. Redis hashes only the
/// *hash tag* of a key when it has one: the text between the first `{` and the first `}` after
/// it, if not empty. Three cases:
///
/// 1. The record key has a hash tag, e.g. `idempotency:pay:{tenant}x`: append to it,
///    `idempotency:pay:{tenant}x:fence`. The first `{…}` is unchanged, so the slot is too.
/// 2. It has no `}` at all (the usual case): the prefix, then the record key as the tag,
///    `idempotency:{idempotency:pay:k1}:fence`. The tag is the whole record key, and a key
///    without a tag is hashed whole: same slot.
/// 3. It has a `}` that closes no tag (`a}b`, `{}x`): as a tag it would be cut at that `}`.
///    Instead we look for a short tag with the record key's slot and put the record key after
///    it: `idempotency:{4711}:fence:<record key>`. Still one counter per record, in the record's
///    slot. The search tries about 16 thousand candidates on average, a fraction of a
///    millisecond, and only for such odd keys.
///
/// A prefix with a `{` of its own would open the tag too early in cases 2 and 3; there (and only
/// there) the counter's key starts with the tag instead of the prefix.
///
/// On a single Redis the slot does not matter and the names are simply distinct keys.
pub fn fence_key(prefix: &str, record_key: &str) -> String {
    let lead = if prefix.contains('{') { "" } else { prefix };
    if hash_tag(record_key).is_some() {
        format!("{record_key}:fence")
    } else if !record_key.contains('}') {
        // Pushed into one buffer: built on every fenced call, where `format!` cost twice this.
        let mut key = String::with_capacity(lead.len() + record_key.len() + 8);
        key.push_str(lead);
        key.push('{');
        key.push_str(record_key);
        key.push_str("}:fence");
        key
    } else {
        let tag = tag_for_slot(hash_slot(record_key));
        format!("{lead}{{{tag}}}:fence:{record_key}")
    }
}

/// The hash tag Redis Cluster would hash for `key`, if it has one.
pub fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let after_open = &key[open + 1..];
    let close = after_open.find('}')?;
    // `{}` is not a tag: Redis then hashes the whole key.
    (close > 0).then(|| &after_open[..close])
}

/// The Redis Cluster hash slot of `key` (what `CLUSTER KEYSLOT` answers).
pub fn hash_slot(key: &str) -> u16 {
    let hashed = hash_tag(key).unwrap_or(key);
    crc16_xmodem(hashed.as_bytes()) % CLUSTER_SLOTS
}

/// The first decimal number whose slot is `slot`. Every slot is hit below 200,000 (a unit test
/// checks all of them), so the loop always ends.
fn tag_for_slot(slot: u16) -> String {
    (0u32..)
        .map(|n| n.to_string())
        .find(|candidate| crc16_xmodem(candidate.as_bytes()) % CLUSTER_SLOTS == slot)
        .expect("every slot has a decimal tag")
}

/// CRC-16/XMODEM (polynomial 0x1021, initial value 0), the checksum Redis Cluster uses for slots.
fn crc16_xmodem(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rules_of_idempotency_identifiers() {
        // The probe's `[IdempotencyIdentifiers]` line, case by case.
        fn ok<'a>(op: &'a str, key: &'a str) -> Result<(&'a str, &'a str), ValidationError> {
            validate(op, key).map(|ids| (ids.operation, ids.key))
        }
        assert_eq!(
            ok("op", ""),
            Err(ValidationError::Empty { field: Field::Key })
        );
        assert_eq!(
            ok("op", "   "),
            Err(ValidationError::Empty { field: Field::Key })
        );
        assert_eq!(
            ok("op", "a:b"),
            Err(ValidationError::Colon { field: Field::Key })
        );
        assert_eq!(ok("op", &"k".repeat(255)).unwrap().1.len(), 255);
        assert_eq!(
            ok("op", &"k".repeat(256)),
            Err(ValidationError::TooLong {
                field: Field::Key,
                chars: 256,
                max: 255
            })
        );
        assert_eq!(ok("op", " k1 "), Ok(("op", "k1")));
        assert_eq!(ok("op", "ключ-é"), Ok(("op", "ключ-é")));
        assert_eq!(ok("op", "a\nb"), Ok(("op", "a\nb")));
        assert_eq!(
            ok("a:b", "k"),
            Err(ValidationError::Colon {
                field: Field::Operation
            })
        );
        assert_eq!(
            ok(&"o".repeat(101), "k"),
            Err(ValidationError::TooLong {
                field: Field::Operation,
                chars: 101,
                max: 100
            })
        );
        assert!(ok(&"o".repeat(100), "k").is_ok());
    }

    #[test]
    fn lengths_are_counted_in_characters_after_trimming() {
        // 255 two-byte characters are 510 bytes and still a valid key.
        assert!(validate("op", &"é".repeat(255)).is_ok());
        let padded = format!("  {}  ", "k".repeat(255));
        assert_eq!(validate("op", &padded).unwrap().key.len(), 255);
    }

    #[test]
    fn whitespace_is_unicode_white_space_like_pydantic() {
        // pydantic strips NBSP, NEL, ideographic space and LINE SEPARATOR ...
        assert_eq!(normalise_key("\u{a0}k\u{85}"), "k");
        assert_eq!(normalise_key("\u{3000}k\u{2028}"), "k");
        // ... but not the information separators Python's str.strip() would remove.
        assert_eq!(normalise_key("\u{1c}k"), "\u{1c}k");
        // A zero-width space is not whitespace for either.
        assert_eq!(normalise_key("\u{200b}k"), "\u{200b}k");
    }

    #[test]
    fn record_key_is_the_python_layout() {
        let ids = validate(" order.create ", " replay-1 ").unwrap();
        assert_eq!(
            record_key(DEFAULT_PREFIX, ids),
            "idempotency:order.create:replay-1"
        );
        assert_eq!(record_key("app", ids), "apporder.create:replay-1");
    }

    #[test]
    fn crc16_and_slots_match_redis() {
        // The CRC-16/XMODEM check value, and slots Redis documents or `CLUSTER KEYSLOT` gives.
        assert_eq!(crc16_xmodem(b"123456789"), 0x31c3);
        assert_eq!(hash_slot("foo"), 12182);
        assert_eq!(hash_slot("bar"), 5061);
        assert_eq!(
            hash_slot("{user1000}.following"),
            hash_slot("{user1000}.followers")
        );
        assert_eq!(
            hash_slot("foo{}{bar}"),
            crc16_xmodem(b"foo{}{bar}") % CLUSTER_SLOTS
        );
        assert_eq!(hash_slot("foo{{bar}}zap"), hash_slot("{bar"));
    }

    #[test]
    fn hash_tags() {
        assert_eq!(hash_tag("a{b}c"), Some("b"));
        assert_eq!(hash_tag("a{}c{d}"), None);
        assert_eq!(hash_tag("a}b{c"), None);
        assert_eq!(hash_tag("{{x}}"), Some("{x"));
        assert_eq!(hash_tag("plain"), None);
    }

    #[test]
    fn the_fence_key_shares_the_record_slot() {
        let cases = [
            "idempotency:payment.charge:k1",
            "idempotency:op:{tenant-7}rest",
            "lab:run1:op:{a}",
            "idempotency:op:a}b",
            "idempotency:op:{}x",
            "idempotency:op:x}{y",
            "idempotency:op:{{x}}",
        ];
        for prefix in ["idempotency:", "lab:run1:", "", "odd}prefix:"] {
            for record in cases {
                let record = format!("{prefix}{record}");
                let fence = fence_key(prefix, &record);
                assert_ne!(fence, record);
                assert!(
                    fence.starts_with(prefix),
                    "{fence} keeps the prefix {prefix}"
                );
                assert_eq!(hash_slot(&fence), hash_slot(&record), "{record} -> {fence}");
            }
        }
        // A prefix with its own `{`: the slot still matches.
        let record = "x{y:op:k1";
        assert_eq!(hash_slot(&fence_key("x{y:", record)), hash_slot(record));
        assert_eq!(
            fence_key("idempotency:", "idempotency:op:k1"),
            "idempotency:{idempotency:op:k1}:fence"
        );
        assert_eq!(
            fence_key("idempotency:", "idempotency:op:{t}k"),
            "idempotency:op:{t}k:fence"
        );
        let odd = fence_key("idempotency:", "idempotency:op:a}b");
        assert!(odd.starts_with("idempotency:{") && odd.ends_with(":fence:idempotency:op:a}b"));
    }

    #[test]
    fn every_slot_has_a_small_decimal_tag() {
        let mut seen = vec![false; usize::from(CLUSTER_SLOTS)];
        let mut missing = seen.len();
        let mut n = 0u32;
        while missing > 0 {
            let slot = usize::from(crc16_xmodem(n.to_string().as_bytes()) % CLUSTER_SLOTS);
            if !seen[slot] {
                seen[slot] = true;
                missing -= 1;
            }
            n += 1;
        }
        assert!(n < 200_000, "all slots covered only after {n} candidates");
    }
}
