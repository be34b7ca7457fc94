//! Every exercise, in the course's order: the one list. Each exercise declares itself in its
//! own module (its lesson, languages, checks and how it opens its world, in [`Exercise`]); this
//! list only says which exist and in what order.

use crate::exercise::Exercise;

/// The exercises, in the course's order: lesson 6's, then the payments lesson's.
pub static EXERCISES: &[&Exercise] = &[
    &crate::report_api::EXERCISE,
    &crate::worker::EXERCISE,
    &crate::charge_once::EXERCISE,
    &crate::relay::EXERCISE,
    &crate::invoice_consumer::EXERCISE,
];

/// The exercise called `name`.
pub fn find(name: &str) -> Option<&'static Exercise> {
    EXERCISES.iter().copied().find(|e| e.name == name)
}
