//! The scenario files: both languages say the same things, and the embedded copies load.

use lab_core::text::COMMON;
use lab_core::{Lang, Texts};
use lab_scenarios::{CATALOGUE, Library};

fn scopes() -> Vec<&'static str> {
    std::iter::once(COMMON)
        .chain(CATALOGUE.iter().map(|s| s.name))
        .collect()
}

fn assert_same_keys(texts: &Texts) {
    for scope in scopes() {
        let en = texts.keys(scope, Lang::En);
        let ru = texts.keys(scope, Lang::Ru);
        assert!(!en.is_empty(), "{scope}: no texts");
        assert_eq!(
            en, ru,
            "{scope}: English and Russian texts have different keys"
        );
    }
}

#[test]
fn every_text_exists_in_both_languages() {
    let dir = Library::from_dir(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios"),
    )
    .unwrap();
    assert_same_keys(&dir.texts);
    for scenario in CATALOGUE.iter() {
        for key in [
            "title",
            "summary",
            "story",
            "explain",
            "predict.question",
            "reveal",
        ] {
            assert!(
                dir.texts.get(scenario.name, Lang::En, key).is_some(),
                "{}: missing `{key}`",
                scenario.name
            );
        }
        let quiz = dir.texts.list(scenario.name, Lang::En, "quiz");
        assert!(
            (2..=3).contains(&quiz.len()),
            "{}: 2-3 quiz questions",
            scenario.name
        );
        assert!(
            dir.texts
                .list(scenario.name, Lang::En, "predict.options")
                .len()
                >= 2
        );
        assert!(
            !dir.expected_facts(scenario.name).is_empty(),
            "{}: no expected facts",
            scenario.name
        );
    }
}

#[test]
fn the_embedded_copies_load_and_match_the_files() {
    let embedded = Library::embedded().unwrap();
    assert_same_keys(&embedded.texts);
    let dir = Library::from_dir(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios"),
    )
    .unwrap();
    for scenario in CATALOGUE.iter() {
        assert_eq!(
            embedded.expected_facts(scenario.name),
            dir.expected_facts(scenario.name)
        );
        for lang in Lang::ALL {
            assert_eq!(
                embedded.expected_narrative(scenario.name, lang),
                dir.expected_narrative(scenario.name, lang)
            );
        }
    }
}

/// A knob is declared once, in its scenario's module; what it means is the scenario's text
/// `knobs.<name>`, in both languages, and nothing else names a knob that is not declared.
#[test]
fn every_declared_knob_is_described_in_both_languages_and_only_those() {
    let library = Library::load().unwrap();
    for scenario in CATALOGUE.iter() {
        let declared: Vec<String> = scenario
            .scenario
            .knobs
            .iter()
            .map(|k| format!("knobs.{}", k.name))
            .collect();
        for lang in Lang::ALL {
            let described: Vec<String> = library
                .texts
                .keys(scenario.name, lang)
                .into_iter()
                .filter(|key| key.starts_with("knobs."))
                .map(str::to_string)
                .collect();
            let mut sorted = declared.clone();
            sorted.sort();
            assert_eq!(
                described,
                sorted,
                "{} ({}): the knobs described are not the knobs declared",
                scenario.name,
                lang.code()
            );
        }
        for knob in scenario.scenario.knobs {
            assert!(
                knob.parse(&knob.default_value().to_string()).ok() == Some(knob.default_value()),
                "{}: the default of {} is not a value it accepts",
                scenario.name,
                knob.name
            );
        }
    }
}
