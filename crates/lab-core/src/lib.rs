//! The shared vocabulary of every lab scenario.
//!
//! A scenario never prints. It tells a [`Narrator`] what happened, as [`Event`]s: a step of the
//! story, an HTTP call and its outcome (`ok`, `fail` or `unknown`), a snapshot of the rows and
//! keys that matter, a measured fact, a prediction question and its answer. Renderers turn the
//! same stream into coloured text (Russian or English) or JSON lines, and `lab check` renders a
//! recorded stream in both languages to compare it with the expected narratives.
//!
//! # Layout
//!
//! - [`lang`]: the two languages and how the default one is chosen.
//! - [`text`]: message catalogues (TOML files written by us) and [`Msg`], a key plus arguments.
//! - [`event`]: the events and their parts ([`Outcome`], [`Table`]).
//! - [`narrator`]: the handle scenarios and services emit events through; it also records them.
//! - [`gate`]: step mode: pause after every step and before each answer, read Enter from stdin.
//! - [`checkpoint`]: named points inside services where a scenario can hold or order requests
//!   (a barrier for N callers, a bounded hold of the first, a notice that one passed).
//! - [`facts`]: measured facts, expected facts, and their comparison.
//! - [`render`]: text and JSON-lines renderers.
//! - [`trace`]: the SQL statements and Redis commands a run executed, caught from `tracing`;
//!   what the lab does backstage (its own reads) is left out.
//! - [`wire`]: what one HTTP call did on the wire, and the one judgement of it (ok, fail or
//!   unknown) that the scenarios and the exercises share.

mod backstage;
pub mod checkpoint;
pub mod event;
pub mod facts;
pub mod gate;
pub mod lang;
pub mod narrator;
pub mod render;
pub mod text;
pub mod trace;
pub mod wire;

pub use checkpoint::{Checkpoints, Hold, HoldAll, NotReached, Notice};
pub use event::{CodePlace, Event, Executed, Fault, Outcome, Server, Table};
pub use facts::{FactCheck, Facts};
pub use gate::{Gate, Quit};
pub use lang::Lang;
pub use narrator::{Bounds, Narrator};
pub use text::{Arg, Msg, Texts};
pub use wire::{Answer, Wire, classify};
