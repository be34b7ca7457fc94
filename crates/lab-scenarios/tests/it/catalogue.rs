//! "Adding a scenario" in `docs/architecture.md`, as the catalogue generator sees it: the steps
//! on a made-up tree (a scenario folder, a topic with its `mod.rs`, the module), run through the
//! very code `build.rs` runs, without building anything. What the folder and the module must
//! say is checked here; that the documented module compiles and runs is checked by the crate's
//! own test of it (`reports::hello_example`).

use std::path::Path;

#[path = "../../build/catalogue.rs"]
mod generator;

/// A tree as a lab checkout has it: `scenarios/common`, a `reports` topic with one scenario
/// already, and nothing of `hello` yet.
fn tree(root: &Path) {
    let write = |path: &str, text: &str| {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    for lang in ["en", "ru"] {
        write(&format!("scenarios/common/{lang}.toml"), "");
        write(
            &format!("scenarios/lease/{lang}.toml"),
            "title = \"Lease\"\n",
        );
    }
    write("src/reports/mod.rs", "pub mod tasks;\npub mod lease;\n");
    write("src/reports/lease.rs", "");
    write("src/reports/tasks.rs", "");
}

fn generate(root: &Path) -> generator::Generated {
    generator::generate(&root.join("scenarios"), &root.join("src"))
}

fn listed(generated: &generator::Generated, name: &str) -> bool {
    generated
        .catalogue
        .contains(&format!("Entry {{ name: {name:?}"))
}

#[test]
fn a_scenario_is_listed_once_it_has_its_texts_its_module_and_its_declaration() {
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    tree(root);
    let before = generate(root);
    assert!(listed(&before, "lease"), "{}", before.catalogue);
    assert!(before.warnings.is_empty(), "{:?}", before.warnings);

    // 1. Its folder, with one text: left out, and said so.
    std::fs::create_dir_all(root.join("scenarios/hello")).unwrap();
    std::fs::write(root.join("scenarios/hello/en.toml"), "title = \"Hello\"\n").unwrap();
    let one_text = generate(root);
    assert!(!listed(&one_text, "hello"));
    assert_eq!(
        one_text.warnings,
        ["scenarios/hello/ has no ru.toml: it is left out until it has both texts"]
    );

    // Both texts, no module yet.
    std::fs::write(root.join("scenarios/hello/ru.toml"), "title = \"Привет\"\n").unwrap();
    let no_module = generate(root);
    assert!(!listed(&no_module, "hello"));
    assert!(
        no_module.warnings[0].starts_with("scenarios/hello/ has no module yet"),
        "{:?}",
        no_module.warnings
    );

    // 2. Its module, not yet declared in its topic's mod.rs.
    std::fs::write(root.join("src/reports/hello.rs"), "").unwrap();
    let undeclared = generate(root);
    assert!(!listed(&undeclared, "hello"));
    assert_eq!(
        undeclared.warnings,
        [
            "src/reports/hello.rs is not declared: add `pub mod hello;` to src/reports/mod.rs; \
             scenario `hello` is left out until then"
        ]
    );

    // Declared: listed in its lesson, and its files embedded (the expected ones as None until
    // the first `lab check hello --bless`).
    std::fs::write(
        root.join("src/reports/mod.rs"),
        "pub mod tasks;\npub mod lease;\npub mod hello;\n",
    )
    .unwrap();
    let added = generate(root);
    assert!(added.warnings.is_empty(), "{:?}", added.warnings);
    assert!(added.catalogue.contains(
        "Entry { name: \"hello\", source: \"crates/lab-scenarios/src/reports/hello.rs\", \
         lesson: &crate::reports::LESSON, scenario: &crate::reports::hello::SCENARIO }"
    ));
    assert!(
        added.embedded.contains("Embedded { name: \"hello\"")
            && added.embedded.contains("expected: None"),
        "{}",
        added.embedded
    );

    // 3. Its expectations, once blessed, are embedded too.
    for file in ["expected.json", "expected.en.txt", "expected.ru.txt"] {
        std::fs::write(root.join("scenarios/hello").join(file), "{}").unwrap();
    }
    let blessed = generate(root);
    let hello = blessed
        .embedded
        .lines()
        .find(|l| l.contains("name: \"hello\""))
        .unwrap();
    assert!(!hello.contains("None"), "{hello}");
}

/// A module without a folder is a helper of its topic, not a scenario.
#[test]
fn a_module_without_a_folder_is_not_a_scenario() {
    let root = tempfile::tempdir().unwrap();
    tree(root.path());
    let generated = generate(root.path());
    assert!(!listed(&generated, "tasks"));
    assert!(generated.warnings.is_empty(), "{:?}", generated.warnings);
}
