//! The project README's "Exercises" section tells an instructor what each check attacks; it must
//! name every check there is, so a check added to an exercise cannot go unmentioned there.

#[test]
fn the_project_readme_names_every_check_of_every_exercise() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let start = readme
        .find("\n## Exercises")
        .expect("README.md has an Exercises section");
    let length = readme[start + 1..]
        .find("\n## ")
        .unwrap_or(readme.len() - start - 1);
    let section = &readme[start..start + 1 + length];
    let mut missing = Vec::new();
    for exercise in lab_exercises::EXERCISES {
        for check in exercise.checks() {
            // A check is named in a table's first column (alone or beside others of its kind).
            let named = section.lines().any(|line| {
                line.starts_with("| ")
                    && line
                        .split('|')
                        .nth(1)
                        .is_some_and(|cell| cell.contains(&format!("`{}`", check.name)))
            });
            if !named {
                missing.push(format!("{}: {}", exercise.name, check.name));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "README.md's Exercises section does not name these checks in a table: {missing:?}"
    );
}
