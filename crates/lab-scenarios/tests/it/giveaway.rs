//! No answer on the screen before its question.
//!
//! Every prediction of a scenario (a table of its texts with `question`, `options` and
//! `answer`) declares, in each language, `gives_away`: what would give its answer away, the
//! words of its right option and the mechanism it turns on. A phrase is a few words; each of its
//! words matches any word that begins with it, so Russian endings need no listing («нов
//! операц» matches «новая операция» and «новой операции»). Case, and ё against е, do not count.
//!
//! The test reads the real rendered run: `scenarios/<name>/expected.<lang>.txt`, which `lab
//! check` holds every run to, byte for byte. It finds the question there and fails when a
//! phrase occurs in anything printed before it (the title, the story, the steps, the calls, the
//! services' lines, the tables and the notes, an earlier part and its reveal), or in the
//! summary (which `lab list` and the handouts print above the questions). It also fails when a
//! phrase occurs nowhere after the question (the right option, the reveal, the services' lines
//! unfolded under it): a phrase the answer never says guards nothing. A prediction the default
//! run does not ask (one behind a knob) is checked against the title, the summary and the story,
//! and its phrases against its right option.
//!
//! The services' lines that say why are folded until the reveal (`lab_core::render::fold`): what
//! this test reads before a question is what a class sees.

use std::path::{Path, PathBuf};

use lab_core::{Lang, Msg, Texts};

fn scenarios_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios")
}

/// The words of a text, lowercased, ё as е: runs of letters, digits and `_`.
fn words(text: &str) -> Vec<String> {
    text.to_lowercase()
        .replace('ё', "е")
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

/// Where `phrase` first occurs in `haystack` (each phrase word a prefix of a haystack word, in
/// a row), as an index into `haystack`.
fn find(haystack: &[String], phrase: &[String]) -> Option<usize> {
    if phrase.is_empty() || phrase.len() > haystack.len() {
        return None;
    }
    (0..=haystack.len() - phrase.len()).find(|&i| {
        phrase
            .iter()
            .zip(&haystack[i..])
            .all(|(p, w)| w.starts_with(p.as_str()))
    })
}

/// Where the word sequence `needle` first occurs in `haystack`, exactly.
fn find_exact(haystack: &[String], needle: &[String]) -> Option<usize> {
    if needle.is_empty() || needle.len() > haystack.len() {
        return None;
    }
    (0..=haystack.len() - needle.len()).find(|&i| haystack[i..i + needle.len()] == *needle)
}

/// A scenario's catalogue in one language.
fn texts(name: &str, lang: Lang) -> Texts {
    let mut texts = Texts::new();
    let path = scenarios_dir()
        .join(name)
        .join(format!("{}.toml", lang.code()));
    let source = std::fs::read_to_string(&path).unwrap();
    texts.add(name, lang, &source).unwrap();
    texts
}

/// The prefixes of a scenario's predictions: every `P` with `P.answer` and `P.options.0`.
fn predictions(name: &str, texts: &Texts, lang: Lang) -> Vec<String> {
    texts
        .keys(name, lang)
        .into_iter()
        .filter_map(|key| key.strip_suffix(".answer").map(str::to_string))
        .filter(|prefix| {
            texts
                .get(name, lang, &format!("{prefix}.options.0"))
                .is_some()
        })
        .collect()
}

fn scenario_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(scenarios_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|dir| dir.join("expected.en.txt").is_file())
        .map(|dir| dir.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(names.len() > 5, "scenarios/ should hold the scenarios");
    names
}

/// What is wrong with one scenario's predictions in one language.
fn problems(name: &str, lang: Lang) -> Vec<String> {
    let texts = texts(name, lang);
    let narrative = std::fs::read_to_string(
        scenarios_dir()
            .join(name)
            .join(format!("expected.{}.txt", lang.code())),
    )
    .unwrap();
    let run = words(&narrative);
    let own = |key: &str| texts.get(name, lang, key).unwrap_or_default().to_string();
    let summary = words(&own("summary"));
    let opening = words(&format!(
        "{} {} {}",
        own("title"),
        own("summary"),
        own("story")
    ));
    let mut out = Vec::new();
    for prefix in predictions(name, &texts, lang) {
        let here = format!("{name} ({lang:?}) {prefix}");
        let phrases = texts.list(name, lang, &format!("{prefix}.gives_away"));
        if phrases.is_empty() {
            out.push(format!(
                "{here}: declares no `gives_away` (what would give its answer away)"
            ));
            continue;
        }
        let right = texts
            .prediction(name, lang, &prefix)
            .map(|(_, option)| option)
            .unwrap_or_default();
        let question = words(&texts.render(name, lang, &Msg::new(format!("{prefix}.question"))));
        let (before, after): (Vec<String>, Vec<String>) = match find_exact(&run, &question) {
            Some(at) => {
                let mut before = run[..at].to_vec();
                before.extend(summary.iter().cloned());
                (before, run[at + question.len()..].to_vec())
            }
            // Not asked by the default run: what is printed before every question, and the
            // right option.
            None => (opening.clone(), words(&right)),
        };
        for phrase in &phrases {
            let phrase_words = words(phrase);
            if let Some(at) = find(&before, &phrase_words) {
                let from = at.saturating_sub(8);
                let to = (at + phrase_words.len() + 8).min(before.len());
                out.push(format!(
                    "{here}: «{phrase}» is on the screen before the question: …{}…",
                    before[from..to].join(" ")
                ));
            }
            if find(&after, &phrase_words).is_none() {
                out.push(format!(
                    "{here}: «{phrase}» occurs nowhere after the question (not in the right \
                     option, the reveal or the lines unfolded under it): it guards nothing"
                ));
            }
        }
    }
    out
}

#[test]
fn no_prediction_is_answered_on_the_screen_before_it_is_asked() {
    let mut all = Vec::new();
    for name in scenario_names() {
        for lang in Lang::ALL {
            all.extend(problems(&name, lang));
        }
    }
    assert!(
        all.is_empty(),
        "{} problem(s) with what gives predictions away:\n{}",
        all.len(),
        all.join("\n")
    );
}

#[test]
fn a_phrase_matches_word_beginnings_in_a_row() {
    let hay = words("Idempotency-Key нет, значит, это новая операция: вставлен отчёт 1");
    assert!(find(&hay, &words("нов операц")).is_some());
    assert!(find(&hay, &words("это новой операции")).is_none());
    assert!(find(&hay, &words("вставлен отчет")).is_some(), "ё is е");
    assert!(find(&hay, &words("операция нет")).is_none(), "in a row");
}
