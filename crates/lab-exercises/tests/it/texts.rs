//! The exercises' texts: both languages say the same things (the same keys, the same
//! placeholders), and every message a check can produce has its text.

use std::collections::BTreeSet;

use lab_core::Lang;

fn placeholders(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text.replace("{{", "").replace("}}", "");
    while let Some(start) = rest.find('{') {
        let Some(len) = rest[start..].find('}') else {
            break;
        };
        // A plural (`{n|charge|charges}`) is the placeholder `n`, whatever its forms.
        let inside = &rest[start + 1..start + len];
        names.insert(inside.split('|').next().unwrap_or(inside).to_string());
        rest = rest[start + len + 1..].to_string();
    }
    names
}

#[test]
fn both_languages_have_every_text_with_the_same_placeholders() {
    let texts = lab_exercises::texts().expect("the exercises' texts parse");
    let mut scopes = vec![lab_core::text::COMMON];
    scopes.extend(lab_exercises::EXERCISES.iter().map(|e| e.name));
    for scope in scopes {
        let en: BTreeSet<&str> = texts.keys(scope, Lang::En).into_iter().collect();
        let ru: BTreeSet<&str> = texts.keys(scope, Lang::Ru).into_iter().collect();
        assert!(!en.is_empty(), "{scope} has texts");
        assert_eq!(en, ru, "{scope}: the same keys in en and ru");
        for key in en {
            let en_text = texts.get(scope, Lang::En, key).unwrap();
            let ru_text = texts.get(scope, Lang::Ru, key).unwrap();
            assert_eq!(
                placeholders(en_text),
                placeholders(ru_text),
                "{scope}.{key}"
            );
        }
    }
}

#[test]
fn every_check_has_a_title_and_every_exercise_three_hints() {
    let texts = lab_exercises::texts().unwrap();
    for exercise in lab_exercises::EXERCISES {
        for lang in Lang::ALL {
            for check in exercise.checks() {
                let key = format!("check.{}.title", check.name);
                assert!(
                    texts.get(exercise.name, lang, &key).is_some(),
                    "{}: {key}",
                    exercise.name
                );
            }
            for level in 1..=3 {
                assert!(
                    texts
                        .get(exercise.name, lang, &format!("hint.{level}"))
                        .is_some()
                );
            }
            assert!(texts.get(exercise.name, lang, "summary").is_some());
        }
        for file in ["README.md", "README.ru.md"] {
            let text = lab_exercises::files::text(&format!("{}/common/{file}", exercise.name))
                .unwrap_or_else(|| panic!("{}: {file}", exercise.name));
            for check in exercise.checks() {
                assert!(
                    text.contains(&format!("`{}`", check.name)),
                    "{file} names {}",
                    check.name
                );
            }
        }
    }
}

/// Every message key the crate's source names (`Msg::new("…")`, `broke("…")`,
/// `undecided("…")`) has a text in both languages, in the scope that renders it: an exercise's
/// module in its own (or the shared words), the payments lesson's shared modules in each
/// exercise that uses them, everything else in the shared words. Keys built with `format!` are
/// listed by hand below; `lab exercise verify` also fails on any rendered line with a missing
/// text (`⟦key⟧`).
#[test]
fn every_message_the_source_names_has_a_text() {
    let texts = lab_exercises::texts().unwrap();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    let mut dirs = vec![src.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    let mut checked = 0;
    for path in files {
        let stem = path
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .replace('_', "-");
        // A private submodule of an exercise's module (`src/charge_once/moments.rs`) speaks
        // in that exercise's scope.
        let folder = path
            .parent()
            .and_then(|p| p.file_name())
            .map(|f| f.to_string_lossy().replace('_', "-"))
            .filter(|f| lab_exercises::find(f).is_some());
        let name = folder.unwrap_or(stem);
        let scopes: Vec<&str> = match name.as_str() {
            exercise if lab_exercises::find(exercise).is_some() => {
                vec![lab_exercises::find(exercise).unwrap().name]
            }
            "payment" => vec!["charge-once", "relay"],
            "lab-side" => vec!["charge-once", "relay"],
            _ => vec![lab_core::text::COMMON],
        };
        // The documentation's example exercise says its words in the recipe, not here.
        if name == "hello-example" {
            continue;
        }
        let source = std::fs::read_to_string(&path).unwrap();
        // Test modules make up keys of their own.
        let source = source.split("#[cfg(test)]").next().unwrap();
        let mut keys = source_keys(source);
        if name == "report-api" {
            for label in [
                "not_json",
                "json_array",
                "null",
                "field_missing",
                "task_id_text",
                "task_id_huge",
                "task_id_negative",
                "nul_byte",
                "long_report_type",
                "long_key",
                "unknown_field",
                "random_bytes",
                "client",
                "client_n",
            ] {
                keys.insert(format!("who.{label}"));
            }
        }
        if name == "relay" {
            for who in ["client", "client_n"] {
                keys.insert(format!("who.{who}"));
            }
        }
        if name == "charge-once" {
            for why in [
                "no_provider_key",
                "provider_keys_differ",
                "charged_twice",
                "no_dedup",
            ] {
                keys.insert(format!("why.{why}"));
            }
            for who in [
                "client",
                "client_n",
                "tenant_1",
                "tenant_2",
                "instance_1",
                "instance_2",
            ] {
                keys.insert(format!("who.{who}"));
            }
        }
        for scope in scopes {
            for key in &keys {
                for lang in Lang::ALL {
                    assert!(
                        texts.get(scope, lang, key).is_some(),
                        "{} ({scope}, {lang:?}): {key}",
                        path.display()
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 200, "the keys were found: {checked}");
}

/// The keys a source names literally.
fn source_keys(source: &str) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    for (marker, prefix) in [
        ("Msg::new(\"", ""),
        ("broke(\"", "broke."),
        ("undecided(\"", "unknown."),
    ] {
        for piece in source.split(marker).skip(1) {
            if let Some(end) = piece.find('"') {
                keys.insert(format!("{prefix}{}", &piece[..end]));
            }
        }
    }
    keys
}

/// The Russian texts speak as the lessons' labs do: «ты», and the lab is «практикум»; none of
/// the calques the scenarios' glossary test forbids.
#[test]
fn the_russian_texts_keep_the_courses_voice() {
    const FORBIDDEN: &[&str] = &[
        "лаборатор",
        "невалидн",
        "удаление дублей",
        "таймаут видимости",
        "в полёте",
    ];
    const YOU_PLURAL: &[&str] = &[
        "вы",
        "вас",
        "вам",
        "ваш",
        "ваша",
        "ваше",
        "ваши",
        "вашу",
        "ваших",
    ];
    let texts = lab_exercises::texts().unwrap();
    let mut sources: Vec<(String, String)> = Vec::new();
    let mut scopes = vec![lab_core::text::COMMON];
    scopes.extend(lab_exercises::EXERCISES.iter().map(|e| e.name));
    for scope in scopes {
        for key in texts.keys(scope, Lang::Ru) {
            sources.push((
                format!("{scope}.{key}"),
                texts.get(scope, Lang::Ru, key).unwrap().to_string(),
            ));
        }
    }
    for exercise in lab_exercises::EXERCISES {
        let path = format!("{}/common/README.ru.md", exercise.name);
        sources.push((
            path.clone(),
            lab_exercises::files::text(&path).unwrap().to_string(),
        ));
    }
    for (name, text) in sources {
        let lower = text.to_lowercase();
        for phrase in FORBIDDEN {
            assert!(!lower.contains(phrase), "{name}: «{phrase}»");
        }
        for word in lower.split(|c: char| !c.is_alphabetic()) {
            assert!(
                !YOU_PLURAL.contains(&word),
                "{name}: «{word}» (the learner is «ты»)"
            );
        }
    }
}

/// The words of each exercise's fix: what its third hint shows. A starter's TODO says what must
/// hold and which checks attack it; the how is the hints' (rustlings' way), so no TODO may
/// carry these, in either language's starter.
const HOW: &[(&str, &[&str])] = &[
    (
        "report-api",
        &[
            "on conflict",
            "do nothing",
            "returning",
            "advisory",
            "for update",
            "serializable",
            "unique",
        ],
    ),
    (
        "worker",
        &[
            "clock_timestamp",
            "lease_until >",
            "skip locked",
            "attempts =",
            "where ",
        ],
    ),
    (
        "charge-once",
        &[
            "retry_on_error",
            "set_number_of_retries",
            "coordinate(",
            "in_flight",
            "fingerprint_of",
        ],
    ),
    (
        "relay",
        &[
            "jitter",
            "exponential",
            "kept_headers",
            "random",
            "asyncio.sleep",
        ],
    ),
    (
        "invoice-consumer",
        &[
            "xautoclaim",
            "send_invoice_once",
            "IdempotencyInProgressError",
            "Error::InProgress",
            "IdempotencyKeyReuseError",
            "Error::KeyReused",
            "min_idle",
        ],
    ),
];

/// The comment lines of each TODO in a starter's source: the `TODO(` line and the comment
/// lines that follow it.
fn todos(source: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut current: Option<String> = None;
    for line in source.lines() {
        let trimmed = line.trim_start();
        let comment = trimmed
            .strip_prefix("//")
            .or_else(|| trimmed.strip_prefix('#'));
        match (comment, current.as_mut()) {
            (Some(text), _) if text.trim_start().starts_with("TODO(") => {
                found.extend(current.take());
                current = Some(text.to_string());
            }
            (Some(text), Some(todo)) => {
                todo.push(' ');
                todo.push_str(text);
            }
            _ => found.extend(current.take()),
        }
    }
    found.extend(current);
    found
}

#[test]
fn starters_say_what_must_hold_and_leave_the_how_to_the_hints() {
    for exercise in lab_exercises::EXERCISES {
        let Some((_, how)) = HOW.iter().find(|(name, _)| *name == exercise.name) else {
            panic!("{}: say in HOW what its fix is made of", exercise.name);
        };
        let mut seen = 0;
        for (path, bytes) in lab_exercises::files::under(exercise.name) {
            if !path.contains("starter/") || !(path.ends_with(".py") || path.ends_with(".rs")) {
                continue;
            }
            let source = std::str::from_utf8(bytes).unwrap();
            for todo in todos(source) {
                seen += 1;
                let lower = todo.to_lowercase().replace(['_', ' '], "");
                for word in *how {
                    let word_lower = word.to_lowercase();
                    let squeezed = word_lower.replace(['_', ' '], "");
                    assert!(
                        !todo.to_lowercase().contains(&word_lower) && !lower.contains(&squeezed),
                        "{path}: a TODO spells the fix ({word:?}): {todo}"
                    );
                }
            }
        }
        assert!(seen >= 2, "{}: its starters have TODOs", exercise.name);
    }
}
