//! `lab class`: the whole class's exercise verdicts on the instructor's screen.
//!
//! Twenty learners run `lab exercise check NAME --class URL` on their laptops; each finished
//! check's verdict (the exercise, the check, pass/fail/unknown, the invariant's words and the
//! replay line, never the learner's code) goes to the board the instructor started with `lab
//! class`, which keeps it in PostgreSQL and shows the grid live, on a page for the projector.
//!
//! - [`model`]: what a post carries, and the rules it must keep (the catalogue's names only,
//!   lengths, plain-text names).
//! - [`store`]: the board's tables, in the schema `lab_class`.
//! - [`grid`]: the grid, the counts and the commonest broken invariant per check, the exports.
//! - [`board`]: the HTTP server: the page, the posts, the instructor's views.
//! - [`client`]: how a `lab` posts to a board (short deadlines; a board that is down never
//!   changes a verdict).
//!
//! Trust is stated plainly: a verdict a learner's own `lab` sent is *self-reported* (the board
//! cannot know what ran on the laptop); one the instructor's `lab class verify` reached against
//! the learner's running service is *verified*.

pub mod board;
pub mod client;
pub mod grid;
pub mod model;
pub mod store;

pub use board::{Board, PageTexts};
pub use client::{Client, ClientError};
pub use model::{Joined, Kind, VerdictPost};
pub use store::{Store, StoreError};
