//! `hostile`'s sample: what a careless or malicious client sends. Each bound of the README's
//! contract is crossed on its own, with a task of its own, so a report the service stores is
//! told by its task; then seeded junk.

use rand::RngExt as _;
use rand::rngs::ChaCha8Rng;

use super::report_body;

/// One request of the hostile sample: what a careless or malicious client sends.
pub(super) struct Hostile {
    /// Its name in the texts (`who.<label>`).
    pub label: &'static str,
    pub body: String,
    pub key: Option<String>,
    /// The task its body names, when a report of it could be stored.
    pub task: Option<i64>,
    /// `hostile` holds it to its refusal: a 4xx, and no report. The others need only never be
    /// a 5xx (and a 4xx of theirs has a JSON body): an unknown field, which the contract leaves
    /// open, and an overlong key, whose refusal is `invalid-key`'s to judge.
    pub refused: bool,
}

/// The hostile sample: the README's bounds crossed one by one, each with a task of its own (so
/// a report it made is its own), then junk. Tasks `first_task..` are the sample's.
pub(super) fn hostile_sample(first_task: i64, rng: &mut ChaCha8Rng) -> Vec<Hostile> {
    let mut next = first_task;
    let mut task = || {
        next += 1;
        next - 1
    };
    let with_type = |task: i64, report_type: &str| report_body(task, report_type);
    // A control character, from the seed: none is printable, whatever a design counts as such.
    let control = ['\t', '\n', '\u{7}', '\u{1b}', '\u{7f}'][rng.random_range(0..5)];
    let mut sample = vec![];
    let mut push = |label, body: String, key: Option<String>, task: Option<i64>, refused| {
        sample.push(Hostile {
            label,
            body,
            key,
            task,
            refused,
        });
    };
    push("not_json", "{\"task_id\": ".to_string(), None, None, true);
    push("json_array", "[1, 2, 3]".to_string(), None, None, true);
    push("null", "null".to_string(), None, None, true);
    let t = task();
    push(
        "field_missing",
        format!("{{\"task_id\": {t}}}"),
        None,
        Some(t),
        true,
    );
    push(
        "task_id_text",
        "{\"task_id\": \"7x\", \"report_type\": \"monthly\"}".to_string(),
        None,
        None,
        true,
    );
    push(
        "task_id_huge",
        "{\"task_id\": 99999999999999999999999, \"report_type\": \"monthly\"}".to_string(),
        None,
        None,
        true,
    );
    push(
        "task_id_negative",
        with_type(-1, "monthly"),
        None,
        Some(-1),
        true,
    );
    push("task_id_zero", with_type(0, "monthly"), None, Some(0), true);
    let t = task();
    push("report_type_empty", with_type(t, ""), None, Some(t), true);
    let t = task();
    push(
        "report_type_65",
        with_type(t, &"x".repeat(65)),
        None,
        Some(t),
        true,
    );
    let t = task();
    push(
        "long_report_type",
        with_type(t, &"x".repeat(10_000)),
        None,
        Some(t),
        true,
    );
    let t = task();
    push("nul_byte", with_type(t, "a\u{0}b"), None, Some(t), true);
    let t = task();
    push(
        "control_char",
        with_type(t, &format!("month{control}ly")),
        None,
        Some(t),
        true,
    );
    // A header far beyond any key: whatever refuses it (the service, its server's header
    // limit), never with a 5xx.
    let t = task();
    push(
        "long_key",
        with_type(t, "monthly"),
        Some("k".repeat(10_000)),
        Some(t),
        false,
    );
    // The contract leaves an unknown field open: refused or ignored, either is right.
    let t = task();
    push(
        "unknown_field",
        format!("{{\"task_id\": {t}, \"report_type\": \"monthly\", \"admin\": true}}"),
        None,
        Some(t),
        false,
    );
    // A few seeded byte soups: printable junk of random lengths.
    for _ in 0..3 {
        let len = rng.random_range(1..200);
        let junk: String = (0..len)
            .map(|_| char::from(rng.random_range(0x20u8..0x7f)))
            .collect();
        push("random_bytes", junk, None, None, true);
    }
    sample
}
