//! The Russian texts speak with one voice, in the lesson seeds' terms.
//!
//! Every `scenarios/*/ru.toml` (found by reading the directory, `common` included) is checked
//! against a glossary: a forbidden form and the form to write instead. A failure names the file,
//! the key and the offending text. The rules are:
//!
//! - «аренда» and its forms → «lease» (срок lease, строгий lease); «арендатор» (a tenant, as the
//!   payments seed says) is not a lease and stays;
//! - «номер-ограждение» (any «огражд…») → «fencing token»;
//! - «постоянный ключ» (any form) → «стабильный ключ»;
//! - «джиттер» → «jitter», as the retry lesson writes it;
//! - the learner is «ты»: no «вы», «ваш…», and no plural imperatives («Предскажите»,
//!   «Проверьте», «Назовите»…; any word ending in «-йте»/«-ьте», and a sentence opening with a
//!   word ending in «-ите»);
//! - no Cyrillic capital right after a colon in prose («Ответ: всего…», not «Ответ: Всего…»), and
//!   none at the start of a text the renderer puts after a label and a colon (a prediction's
//!   question, a model answer, a knob, a service's message);
//! - the labels are the seeds' own: «Вопрос перед экспериментом», «Проверь понимание»,
//!   «Твой ответ»;
//! - a model answer (`quiz_answers`) starts with a capital: it also stands alone, under a folded
//!   «Ответ» on the handout pages;
//! - the calques and jargon an instructor's review found, with what to write instead
//!   ([`PHRASES`]): «удаление дублей», «таймаут видимости», «проверка на 400», «Сегодня…»,
//!   Toxiproxy's «toxic latency», «невалидный», «лаборатория» (the lab is «практикум»), the
//!   outcome labels quoted in English («unknown» → «неизвестно»).
//!
//! The English texts have their own short list ([`ENGLISH_PHRASES`]): one verb for a lease that
//! ends ("expires"), no SQS "visibility timeout" for Redis Streams, no "Today" for a run.
//!
//! Two lessons, two words (`payments_lessons_say_rezerv`): in lesson 6 (the reports lesson)
//! «lease» is the task's lease, fenced by `attempts`; in the payments lessons (every scenario of
//! another lesson, and the common texts of the payment service and the invoice worker) the
//! coordinator's reservation is «резерв» (срок резерва, продление резерва), glossed once as
//! «(lease, параметр `in_flight_lease_seconds`)». There the word «lease» appears only in that
//! gloss.
//!
//! A second test checks that every text uses the same placeholders in both languages.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use lab_core::{Lang, Texts};

/// Whole words of the «вы» form.
const YOU_PLURAL: &[&str] = &[
    "вы",
    "вас",
    "вам",
    "вами",
    "ваш",
    "ваша",
    "ваше",
    "ваши",
    "вашего",
    "вашей",
    "вашему",
    "вашим",
    "вашими",
    "вашу",
    "ваших",
    "вашем",
];

/// Plural imperatives that end in «-ите» and may stand anywhere in a sentence.
const IMPERATIVES: &[&str] = &[
    "предскажите",
    "назовите",
    "посмотрите",
    "обратите",
    "сравните",
    "объясните",
    "запустите",
    "выберите",
    "найдите",
    "опишите",
    "приведите",
    "запомните",
    "помните",
    "учтите",
    "решите",
    "спросите",
    "повторите",
    "отправьте",
];

/// Words that end in «-йте»/«-ьте» and are not imperatives.
const NOT_IMPERATIVES: &[&str] = &["сайте"];

/// Cyrillic words that may follow a colon with a capital: names.
const NAMES: &[&str] = &[];

/// Key prefixes whose texts the renderer puts right after a label or a name and a colon
/// (`Вопрос перед экспериментом: …`, `Ответ: …`, `--set x=1: …`, `⚙ сервис отчётов: …`).
const AFTER_A_COLON: &[&str] = &[
    "knobs.",
    "reports.",
    "provider.",
    "payments.",
    "relay.",
    "mailer.",
    "invoices.",
];

/// Phrases that must not appear in Russian (matched in lower case), and what to write instead.
const PHRASES: &[(&str, &str)] = &[
    ("удаление дублей", "«убирать дубли»"),
    ("удаления дублей", "«убирать дубли»"),
    ("удалению дублей", "«убирать дубли»"),
    (
        "таймаут видимости",
        "min-idle-time в XAUTOCLAIM (в Redis Streams нет таймаута видимости)",
    ),
    ("таймаута видимости", "min-idle-time в XAUTOCLAIM"),
    (
        "проверка на 400",
        "«проверка ключа до координатора (та, что отвечает 400)»",
    ),
    (
        "проверки на 400",
        "«проверка ключа до координатора (та, что отвечает 400)»",
    ),
    (
        "проверку на 400",
        "«проверка ключа до координатора (та, что отвечает 400)»",
    ),
    ("toxic latency", "«задержка (Toxiproxy)»"),
    (
        "на потоке downstream",
        "«на направлении downstream — от сервиса к клиенту»",
    ),
    ("невалидн", "«недопустимый»"),
    ("лаборатори", "«практикум»"),
    ("«unknown»", "«неизвестно»"),
    ("«fail»", "«ошибка»"),
    ("«ok»", "«успех»"),
    ("удаляет дубли", "«убирает дубли»"),
];

/// Words that must not open a Russian sentence: a run is not a day.
const SENTENCE_OPENERS: &[(&str, &str)] = &[("сегодня", "«В этом прогоне» / «На этот раз»")];

/// Phrases that must not appear in English (matched in lower case), and what to write instead.
const ENGLISH_PHRASES: &[(&str, &str)] = &[
    ("lapse", "\"expires\" (one verb for a lease that ends)"),
    ("runs out", "\"expires\""),
    ("ran out", "\"expired\""),
    ("lease is over", "\"the lease has expired\""),
    (
        "visibility timeout",
        "XAUTOCLAIM's min-idle-time (Redis Streams has no visibility timeout)",
    ),
    (
        "provider_unreachable",
        "provider_outcome_unknown (the provider may have charged)",
    ),
    ("today", "\"in this run\""),
];

/// The labels that must read as the seeds write them.
const LABELS: &[(&str, &str)] = &[
    ("label.predict", "Вопрос перед экспериментом"),
    ("label.quiz", "Проверь понимание"),
    ("label.your_answer", "Твой ответ"),
];

fn scenarios_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios")
}

/// Every folder of `scenarios/` with texts in `file`, as (folder name, path), sorted.
fn text_files(file: &str) -> Vec<(String, PathBuf)> {
    let mut files: Vec<(String, PathBuf)> = std::fs::read_dir(scenarios_dir())
        .expect("scenarios/ is readable")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|dir| dir.join(file).is_file())
        .map(|dir| {
            let name = dir.file_name().unwrap().to_string_lossy().into_owned();
            (name, dir.join(file))
        })
        .collect();
    files.sort();
    assert!(
        files.len() > 1,
        "scenarios/ should hold `common` and the scenarios"
    );
    files
}

/// One folder's catalogue in one language: (key, text) in key order.
fn catalogue(scope: &str, lang: Lang, path: &Path) -> Vec<(String, String)> {
    let source = std::fs::read_to_string(path).unwrap();
    let mut texts = Texts::new();
    texts
        .add(scope, lang, &source)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    texts
        .keys(scope, lang)
        .into_iter()
        .map(|key| {
            (
                key.to_string(),
                texts.get(scope, lang, key).unwrap().to_string(),
            )
        })
        .collect()
}

fn lower(c: char) -> char {
    c.to_lowercase().next().unwrap_or(c)
}

fn is_cyrillic_capital(c: char) -> bool {
    ('А'..='Я').contains(&c) || c == 'Ё'
}

/// The text around `start..end` (in chars), on one line, for a failure message.
fn excerpt(chars: &[char], start: usize, end: usize) -> String {
    let from = start.saturating_sub(30);
    let to = (end + 30).min(chars.len());
    let text: String = chars[from..to].iter().collect();
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    format!(
        "{}{text}{}",
        if from > 0 { "…" } else { "" },
        if to < chars.len() { "…" } else { "" }
    )
}

/// The words of a text: (start, end) in chars, a word being a run of letters and hyphens.
fn words(chars: &[char]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in chars.iter().enumerate() {
        let in_word = c.is_alphabetic() || (*c == '-' && start.is_some());
        match (in_word, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, chars.len()));
    }
    out
}

/// Whether the word at `start` opens a sentence: nothing but spaces, quotes or brackets between
/// it and the start of the text or a `.`, `!`, `?`.
fn opens_sentence(chars: &[char], start: usize) -> bool {
    for c in chars[..start].iter().rev() {
        match c {
            ' ' | '\n' | '«' | '"' | '(' => continue,
            '.' | '!' | '?' => return true,
            _ => return false,
        }
    }
    true
}

/// Every glossary violation in one text, as "forbidden → required: «excerpt»".
fn violations(key: &str, text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let low: Vec<char> = chars.iter().map(|&c| lower(c)).collect();
    let mut found = Vec::new();
    let mut flag = |start: usize, end: usize, rule: &str| {
        found.push(format!("{rule}: «{}»", excerpt(&chars, start, end)));
    };

    for (start, end) in words(&low) {
        let word: String = low[start..end].iter().collect();
        if word.contains("аренд") && !word.contains("арендатор") {
            flag(start, end, "«аренда» → «lease» (срок lease)");
        }
        if word.contains("огражд") {
            flag(start, end, "«номер-ограждение» → «fencing token»");
        }
        if word.contains("джиттер") {
            flag(start, end, "«джиттер» → «jitter»");
        }
        if word.starts_with("постоянн") && low[end..].iter().copied().take(5).eq(" ключ".chars())
        {
            flag(start, end + 5, "«постоянный ключ» → «стабильный ключ»");
        }
        if YOU_PLURAL.contains(&word.as_str()) {
            flag(start, end, "«вы» → «ты»");
        }
        let plural_imperative = IMPERATIVES.contains(&word.as_str())
            || ((word.ends_with("йте") || word.ends_with("ьте"))
                && !NOT_IMPERATIVES.contains(&word.as_str()))
            || (word.chars().count() > 4
                && word.ends_with("ите")
                && is_cyrillic_capital(chars[start])
                && opens_sentence(&chars, start));
        if plural_imperative {
            flag(
                start,
                end,
                "«Предскажите/Проверьте…» → «Предскажи/Проверь…» (ты)",
            );
        }
    }

    // A capital right after a colon: `: ` or a colon that ends a prose line.
    for (i, c) in chars.iter().enumerate() {
        if *c != ':' {
            continue;
        }
        let rest = &chars[i + 1..];
        let gap = rest.iter().take_while(|c| **c == ' ').count();
        // A line that starts with spaces is kept as written (SQL), not joined to the colon's.
        let at = match rest.first() {
            Some(' ') => i + 1 + gap,
            Some('\n') if rest.get(1) != Some(&' ') => i + 2,
            _ => continue,
        };
        let Some(&next) = chars.get(at) else { continue };
        let word: String = chars[at..]
            .iter()
            .take_while(|c| c.is_alphabetic())
            .collect();
        if is_cyrillic_capital(next) && !NAMES.contains(&word.as_str()) {
            flag(
                i,
                at + word.chars().count(),
                "a capital after a colon → lower case",
            );
        }
    }

    let text_low: String = low.iter().collect();
    for (phrase, instead) in PHRASES {
        if let Some(at) = text_low.find(phrase) {
            let start = text_low[..at].chars().count();
            flag(
                start,
                start + phrase.chars().count(),
                &format!("«{phrase}» → {instead}"),
            );
        }
    }
    for (start, end) in words(&low) {
        let word: String = low[start..end].iter().collect();
        if let Some((_, instead)) = SENTENCE_OPENERS.iter().find(|(w, _)| *w == word)
            && opens_sentence(&chars, start)
        {
            flag(
                start,
                end,
                &format!("«{word}…» at a sentence's start → {instead}"),
            );
        }
    }
    if key.starts_with("quiz_answers.")
        && let Some(first) = text.trim_start().chars().next()
        && first.is_lowercase()
        && first.is_alphabetic()
    {
        flag(
            0,
            1,
            "a model answer stands alone (under «Ответ»): a capital first",
        );
    }

    // Texts shown right after a label and a colon start in lower case.
    let after_a_colon = AFTER_A_COLON.iter().any(|p| key.starts_with(p))
        || (key.starts_with("predict") && key.ends_with(".question"));
    let first = text.trim_start();
    if after_a_colon && first.chars().next().is_some_and(is_cyrillic_capital) {
        let word: String = first.chars().take_while(|c| c.is_alphabetic()).collect();
        if !NAMES.contains(&word.as_str()) {
            let at = chars.len() - first.chars().count();
            flag(
                at,
                at + word.chars().count(),
                "shown after «Label: », so it starts in lower case",
            );
        }
    }
    found
}

/// Every English glossary violation in one text.
fn english_violations(text: &str) -> Vec<String> {
    let low = text.to_lowercase();
    ENGLISH_PHRASES
        .iter()
        .filter(|(phrase, _)| {
            low.match_indices(phrase).any(|(at, _)| {
                // Whole words only: "lapse" is not "collapse".
                let before = low[..at].chars().next_back();
                !before.is_some_and(char::is_alphabetic)
            })
        })
        .map(|(phrase, instead)| format!("\"{phrase}\" → {instead}"))
        .collect()
}

#[test]
fn english_texts_follow_the_glossary() {
    let mut problems = Vec::new();
    for (name, path) in text_files("en.toml") {
        for (key, text) in catalogue(&name, Lang::En, &path) {
            for problem in english_violations(&text) {
                problems.push(format!("scenarios/{name}/en.toml: `{key}`: {problem}"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} glossary problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn russian_texts_follow_the_glossary() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for (name, path) in text_files("ru.toml") {
        for (key, text) in catalogue(&name, Lang::Ru, &path) {
            checked += 1;
            for problem in violations(&key, &text) {
                problems.push(format!("scenarios/{name}/ru.toml: `{key}`: {problem}"));
            }
            if name == "common"
                && let Some((_, label)) = LABELS.iter().find(|(k, _)| *k == key)
                && text != *label
            {
                problems.push(format!(
                    "scenarios/{name}/ru.toml: `{key}`: «{text}» → «{label}»"
                ));
            }
        }
    }
    assert!(checked > 100, "only {checked} Russian texts found");
    assert!(
        problems.is_empty(),
        "{} glossary problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The one place the payments lessons may say «lease»: the gloss of «резерв».
const LEASE_GLOSS: &str = "(lease, параметр `in_flight_lease_seconds`)";

/// The common texts the payments lessons print: the payment service's and the invoice worker's
/// lines (and their folded forms).
const PAYMENTS_COMMON: &[&str] = &[
    "payments.",
    "invoices.",
    "folded.payments.",
    "folded.invoices.",
];

/// «lease» as a word of a Russian text of the payments lessons, outside the gloss: not
/// `in_flight_lease_seconds`, not `strict_lease`, not a `{lease}` placeholder.
fn says_lease(text: &str) -> bool {
    let word = |c: char| c.is_alphanumeric() || matches!(c, '_' | '{' | '}');
    text.replace(LEASE_GLOSS, "")
        .split(|c: char| !word(c))
        .any(|w| w.eq_ignore_ascii_case("lease"))
}

/// Whether a scenario folder belongs to the reports lesson (lesson 6), where «lease» is the
/// task's lease.
fn is_reports_lesson(name: &str) -> bool {
    lab_scenarios::catalogue::find(name)
        .is_some_and(|e| e.lesson.id == lab_scenarios::reports::LESSON.id)
}

#[test]
fn payments_lessons_say_rezerv() {
    let mut problems = Vec::new();
    let mut glossed = 0;
    for (name, path) in text_files("ru.toml") {
        if name != "common" && is_reports_lesson(&name) {
            continue;
        }
        for (key, text) in catalogue(&name, Lang::Ru, &path) {
            if name == "common" && !PAYMENTS_COMMON.iter().any(|p| key.starts_with(p)) {
                continue;
            }
            glossed += text.matches(LEASE_GLOSS).count();
            if says_lease(&text) {
                problems.push(format!(
                    "scenarios/{name}/ru.toml: `{key}`: «lease» for the coordinator's reservation: \
                     «резерв», «срок резерва», «продление резерва» (lesson 6 keeps «lease» for the \
                     task's lease)"
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
    assert!(glossed >= 1, "«резерв» is glossed nowhere as {LEASE_GLOSS}");
    assert!(says_lease("запись pending на срок lease"));
    assert!(says_lease("Lease на 30 с истекает"));
    assert!(!says_lease("на {lease} мс, strict_lease, released"));
    assert!(!says_lease(&format!("резерв {LEASE_GLOSS}")));
}

/// `{name}` placeholders of a text (`{{` and `}}` are literal braces).
fn placeholders(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
            }
            '{' => {
                out.insert(chars.by_ref().take_while(|&c| c != '}').collect());
            }
            _ => {}
        }
    }
    out
}

#[test]
fn both_languages_use_the_same_placeholders() {
    let mut problems = Vec::new();
    for (name, ru_path) in text_files("ru.toml") {
        let en_path = ru_path.with_file_name("en.toml");
        let en = catalogue(&name, Lang::En, &en_path);
        for (key, ru_text) in catalogue(&name, Lang::Ru, &ru_path) {
            let Some((_, en_text)) = en.iter().find(|(k, _)| *k == key) else {
                continue; // the library test reports keys that one language lacks
            };
            let (ru_names, en_names) = (placeholders(&ru_text), placeholders(en_text));
            if ru_names != en_names {
                problems.push(format!(
                    "scenarios/{name}: `{key}`: ru has {ru_names:?}, en has {en_names:?}"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_glossary_catches_what_it_forbids() {
    let caught = |key: &str, text: &str| !violations(key, text).is_empty();
    assert!(caught("story", "Срок аренды истёк."));
    assert!(caught("explain", "Аренда решает, когда…"));
    assert!(caught("story", "attempts — номер-ограждение"));
    assert!(caught("side.stable", "Постоянный ключ report-task-42"));
    assert!(caught("explain", "паузы с джиттером"));
    assert!(caught("quiz.0", "Когда вы выберете строгую политику?"));
    assert!(caught("quiz.0", "Назовите три варианта."));
    assert!(caught("quiz.0", "Проверьте себя"));
    assert!(caught("label.your_answer", "Ваш ответ"));
    assert!(caught("reveal", "Ответ: Всего отчётов 2."));
    assert!(caught("predict.question", "Что получит воркер B?"));
    assert!(caught("quiz_answers.0", "нет: attempts считает попытки."));
    assert!(!caught("quiz_answers.0", "Нет: attempts считает попытки."));
    assert!(caught("explain", "Провайдер переходит на удаление дублей."));
    assert!(caught("explain", "когда истекает таймаут видимости"));
    assert!(caught("explain", "Сегодня два ответа потеряются."));
    assert!(!caught("explain", "Было это не сегодня."));
    assert!(caught("step.x", "(toxic latency на потоке downstream)"));
    assert!(caught("explain", "исход — «unknown», а не «fail»"));
    assert!(caught("docs.x", "Диаграмму рисует лаборатория."));
    assert!(
        !english_violations("The lease expires.")
            .iter()
            .any(|_| true)
    );
    assert!(!english_violations("the lease lapsed").is_empty());
    assert!(!english_violations("a visibility timeout").is_empty());
    assert!(english_violations("a collapse").is_empty());
    assert!(!caught("story", "Клиент одного арендатора платит."));
    assert!(!caught(
        "reveal",
        "Ответ: всего отчётов 2. Ответ: Redis жив."
    ));
    assert!(!caught("explain", "Ответ: «нет». На сайте написано так."));
    assert!(!caught("predict.question", "что получит воркер B?"));
}
