//! The scenario kit: what every lesson needs and no lesson owns. A script reaches all of it
//! through its [`Ctx`](crate::Ctx), the only door.
//!
//! | need                                    | in the kit                                     | through the `Ctx`          |
//! |-----------------------------------------|------------------------------------------------|----------------------------|
//! | a knob a class may change (`--set`)     | [`knob::Knob`], declared once, typed           | `ctx.knob(&CLIENT_TIMEOUT)?` |
//! | a call held inside a service            | [`hold::Hold`] → [`hold::Held`], bounded       | `ctx.hold(IN_ACTION)`      |
//! | "the service got that far"              | [`hold::Notice`], bounded                      | `ctx.notice(ANSWERED)`     |
//! | a call, and whether it was ok, fail or unknown | [`call::Caller`], [`call::Answer`], [`call::classify`] | —                |
//! | the run's Redis, a record and its TTL   | [`redis`]                                      | `ctx.redis()?`             |
//! | a service's switches (`PUT /config`)    | the service's typed change                     | `ctx.configure(&SPEC, &change)` |
//! | the payment, the provider's charges, the services' counters | [`payments`]               | —                          |
//!
//! A lesson's own folder keeps only what is its own: its tables, its actors (workers, queues),
//! the way it shows its rows.

pub mod call;
pub mod hold;
pub mod knob;
pub mod payments;
pub mod redis;

pub use call::{Answer, Caller};
pub use hold::{Held, Hold, Notice};
pub use knob::{Knob, KnobKind, KnobSpec, KnobValue, Settings};
