//! "Adding a scenario" in `docs/architecture.md`, followed step by step in a copy of the
//! workspace: each step builds and runs, and the scenario touches its module and its folder only.
//!
//! The module is the one printed in the documentation, so the documentation cannot drift from
//! what works. The copy lives under cargo's test scratch directory with a target directory of its
//! own, so later runs rebuild only the crates that change.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{assert_code, copy_tree, repo, shared_tempdir, stderr, stdout};

/// The Rust block of the "Adding a scenario" section of `docs/architecture.md`, unindented.
fn module_from_docs() -> String {
    let doc = std::fs::read_to_string(repo().join("docs/architecture.md")).unwrap();
    let section = doc
        .split("## Adding a scenario")
        .nth(1)
        .expect("the section exists");
    let block = section
        .split("```rust\n")
        .nth(1)
        .and_then(|rest| rest.split("   ```").next())
        .expect("the section has a Rust block");
    block
        .lines()
        .map(|line| line.strip_prefix("   ").unwrap_or(line))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The texts step 1 asks for.
fn texts(lang: &str) -> String {
    let (title, words) = match lang {
        "en" => ("Hello", "Worker A claims the task"),
        _ => ("Привет", "Воркер A забирает задачу"),
    };
    format!(
        r#"title = "{title}"
summary = "{words}."
story = "{words}."
reveal = "{words}."
explain = "{words}."
quiz = ["{words}?", "{words}!"]

[step]
seed = "Task {{task}}."
claim_a = "{words}: attempts = {{attempts}}."

[predict]
question = "{words}?"
options = ["1", "2"]
"#
    )
}

struct Copy {
    root: PathBuf,
    target: PathBuf,
    /// Every file as copied, to tell afterwards what the steps changed (the checkout itself may
    /// be edited while the test runs).
    original: BTreeMap<PathBuf, Vec<u8>>,
}

impl Copy {
    /// A fresh copy of the workspace's sources (not its target directory).
    fn new() -> Copy {
        let scratch = Path::new(env!("CARGO_TARGET_TMPDIR")).join("add-scenario");
        let root = scratch.join("workspace");
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        for file in ["Cargo.toml", "Cargo.lock"] {
            std::fs::copy(repo().join(file), root.join(file)).unwrap();
        }
        for dir in ["crates", "scenarios", "docs"] {
            copy_tree(&repo().join(dir), &root.join(dir));
        }
        let original = files(&root)
            .into_iter()
            .map(|rel| {
                let bytes = std::fs::read(root.join(&rel)).unwrap();
                (rel, bytes)
            })
            .collect();
        Copy {
            root,
            target: scratch.join("target"),
            original,
        }
    }

    fn build(&self) -> Output {
        let out = Command::new(env!("CARGO"))
            .args(["build", "--offline", "-p", "lab-cli"])
            .current_dir(&self.root)
            .env("CARGO_TARGET_DIR", &self.target)
            .env_remove("RUSTFLAGS")
            .output()
            .unwrap();
        assert_code(&out, 0);
        out
    }

    fn lab(&self, args: &[&str], tmp: &Path) -> Output {
        // From the top of the copy, as `cargo run --` is: it reads the copy's scenarios/.
        common::command(&self.target.join("debug/lab"), args)
            .current_dir(&self.root)
            .env("TMPDIR", tmp)
            .output()
            .unwrap()
    }
}

#[test]
fn the_documented_steps_add_a_scenario() {
    let copy = Copy::new();
    let tmp = shared_tempdir();
    let folder = copy.root.join("scenarios/hello");

    // 1. Its folder: it builds, warns that the module is missing, and lists no `hello`.
    std::fs::create_dir_all(&folder).unwrap();
    for lang in ["en", "ru"] {
        std::fs::write(folder.join(format!("{lang}.toml")), texts(lang)).unwrap();
    }
    let built = copy.build();
    assert!(
        stderr(&built).contains("scenarios/hello/ has no module yet"),
        "{}",
        stderr(&built)
    );
    let list = copy.lab(&["list"], tmp.path());
    assert_code(&list, 0);
    assert!(!stdout(&list).contains("hello"), "{}", stdout(&list));

    // 2. Its module, as the documentation prints it: it runs, and is drift until blessed.
    let module = copy.root.join("crates/lab-scenarios/src/reports/hello.rs");
    std::fs::write(&module, module_from_docs()).unwrap();
    // Written but not declared: left out, with a warning that says what to add.
    let built = copy.build();
    assert!(
        stderr(&built).contains("add `pub mod hello;` to src/reports/mod.rs"),
        "{}",
        stderr(&built)
    );
    let topic = copy.root.join("crates/lab-scenarios/src/reports/mod.rs");
    let declared = std::fs::read_to_string(&topic).unwrap().replace(
        "pub mod lease_stale;\n",
        "pub mod lease_stale;\npub mod hello;\n",
    );
    std::fs::write(&topic, declared).unwrap();
    copy.build();
    let run = copy.lab(&["run", "hello", "--lang", "en"], tmp.path());
    assert_code(&run, 1);
    assert!(stdout(&run).contains("task_attempts"), "{}", stdout(&run));

    // 3. Its expectations: --bless writes them, and then it checks clean.
    assert_code(&copy.lab(&["check", "hello", "--bless"], tmp.path()), 0);
    for file in ["expected.json", "expected.en.txt", "expected.ru.txt"] {
        assert!(folder.join(file).is_file(), "{file} not written");
    }
    let expected = std::fs::read_to_string(folder.join("expected.json")).unwrap();
    assert!(expected.contains("\"task_attempts\": 1"), "{expected}");
    let check = copy.lab(&["check", "hello"], tmp.path());
    assert_code(&check, 0);
    assert!(stdout(&check).contains("hello"), "{}", stdout(&check));
    let list = copy.lab(&["list", "--lang", "en"], tmp.path());
    assert!(stdout(&list).contains("hello "), "{}", stdout(&list));

    // Nothing outside its module, its declaration and its folder changed.
    let changed = copy.changed_files();
    assert_eq!(
        changed,
        [
            "crates/lab-scenarios/src/reports/hello.rs",
            "crates/lab-scenarios/src/reports/mod.rs",
            "scenarios/hello/en.toml",
            "scenarios/hello/expected.en.txt",
            "scenarios/hello/expected.json",
            "scenarios/hello/expected.ru.txt",
            "scenarios/hello/ru.toml",
        ]
    );
}

/// Every file under `dir`, relative to it.
fn files(dir: &Path) -> Vec<PathBuf> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(base, &path, out);
            } else {
                out.push(path.strip_prefix(base).unwrap().to_path_buf());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out
}

impl Copy {
    /// Files added or changed since the copy was made, relative and sorted.
    fn changed_files(&self) -> Vec<String> {
        let mut changed: Vec<String> = files(&self.root)
            .into_iter()
            .filter(|rel| {
                self.original.get(rel) != std::fs::read(self.root.join(rel)).ok().as_ref()
            })
            .map(|rel| rel.display().to_string())
            .collect();
        changed.sort();
        changed
    }
}
