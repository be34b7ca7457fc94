//! The exercises' page (`docs/exercises.md`, linked from the README) tells an instructor what
//! each check attacks; it must name every check there is, so a check added to an exercise cannot
//! go unmentioned there.

#[test]
fn the_exercises_page_names_every_check_of_every_exercise() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/exercises.md");
    let section = std::fs::read_to_string(&path).unwrap();
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
        "docs/exercises.md does not name these checks in a table: {missing:?}"
    );
}
