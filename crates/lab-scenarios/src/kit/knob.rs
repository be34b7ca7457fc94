//! Knobs: what a class may change in a scenario (`lab run NAME --set name=value`), declared once
//! and typed from the command line to the script.
//!
//! ```text
//! pub const CLIENT_TIMEOUT: Knob<Duration> = Knob::millis("client_timeout_ms", 150, 1..=600_000);
//!
//! Scenario { knobs: &[CLIENT_TIMEOUT.spec], … }      what `lab list --knobs` shows
//! --set client_timeout_ms=2000 ── KnobSpec::parse ──▶ KnobValue::Millis(2 s), once, or exit 2
//!                              ── Settings ──▶ the runner: the knobs this scenario declares
//! ctx.knob(&CLIENT_TIMEOUT)?  ──▶ Duration (the value set, or the default)
//! ```
//!
//! The name is written once, in the declaration; the script reads the knob through the same
//! constant, so a typo does not compile. What a knob means, in both languages, is the
//! scenario's text `knobs.<name>` (a test checks that every declared knob has one). The expected
//! facts and narratives are the defaults'; a run with a knob set says which facts differ, and
//! why.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::ops::RangeInclusive;
use std::time::Duration;

/// What kind of value a knob takes, with its default and what is allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KnobKind {
    /// A duration in milliseconds, from `min` to `max`.
    Millis { default: u64, min: u64, max: u64 },
    /// On (`true`) or off (`false`).
    Switch { default: bool },
}

/// A knob as a scenario declares it: what `lab list --knobs` and `--set` work from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnobSpec {
    pub name: &'static str,
    pub kind: KnobKind,
}

/// A knob's value, typed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KnobValue {
    Millis(Duration),
    Switch(bool),
}

impl fmt::Display for KnobValue {
    /// As `--set` writes it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KnobValue::Millis(d) => write!(f, "{}", d.as_millis()),
            KnobValue::Switch(on) => write!(f, "{on}"),
        }
    }
}

/// A `--set` value that does not fit its knob.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KnobError {
    #[error("{name} takes milliseconds from {min} to {max}, not `{given}`")]
    NotMillis {
        name: &'static str,
        min: u64,
        max: u64,
        given: String,
    },
    #[error("{name} is true or false, not `{given}`")]
    NotSwitch { name: &'static str, given: String },
}

impl KnobSpec {
    /// The default, typed.
    pub fn default_value(&self) -> KnobValue {
        match self.kind {
            KnobKind::Millis { default, .. } => KnobValue::Millis(Duration::from_millis(default)),
            KnobKind::Switch { default } => KnobValue::Switch(default),
        }
    }

    /// Checks a value given with `--set`. The one place a knob's text becomes a value.
    pub fn parse(&self, given: &str) -> Result<KnobValue, KnobError> {
        let text = given.trim();
        match self.kind {
            KnobKind::Millis { min, max, .. } => text
                .parse::<u64>()
                .ok()
                .filter(|ms| (min..=max).contains(ms))
                .map(|ms| KnobValue::Millis(Duration::from_millis(ms)))
                .ok_or_else(|| KnobError::NotMillis {
                    name: self.name,
                    min,
                    max,
                    given: given.to_string(),
                }),
            KnobKind::Switch { .. } => match text {
                "true" | "on" | "yes" | "1" => Ok(KnobValue::Switch(true)),
                "false" | "off" | "no" | "0" => Ok(KnobValue::Switch(false)),
                _ => Err(KnobError::NotSwitch {
                    name: self.name,
                    given: given.to_string(),
                }),
            },
        }
    }
}

/// A knob of type `T`, as a constant of the scenario that declares it.
#[derive(Debug)]
pub struct Knob<T> {
    pub spec: KnobSpec,
    value: PhantomData<fn() -> T>,
}

impl Knob<Duration> {
    /// A duration knob: `default` milliseconds, `--set` may choose any in `range`.
    pub const fn millis(name: &'static str, default: u64, range: RangeInclusive<u64>) -> Self {
        Knob {
            spec: KnobSpec {
                name,
                kind: KnobKind::Millis {
                    default,
                    min: *range.start(),
                    max: *range.end(),
                },
            },
            value: PhantomData,
        }
    }
}

impl Knob<bool> {
    /// A switch, `default` unless set.
    pub const fn switch(name: &'static str, default: bool) -> Self {
        Knob {
            spec: KnobSpec {
                name,
                kind: KnobKind::Switch { default },
            },
            value: PhantomData,
        }
    }
}

/// A type a knob can have.
pub trait KnobType: Sized {
    /// The value, if it is of this type.
    fn from_value(value: KnobValue) -> Option<Self>;
}

impl KnobType for Duration {
    fn from_value(value: KnobValue) -> Option<Self> {
        match value {
            KnobValue::Millis(d) => Some(d),
            KnobValue::Switch(_) => None,
        }
    }
}

impl KnobType for bool {
    fn from_value(value: KnobValue) -> Option<Self> {
        match value {
            KnobValue::Switch(on) => Some(on),
            KnobValue::Millis(_) => None,
        }
    }
}

/// Knob values set for a `lab` call (`--set`), by knob name: parsed once, typed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    values: BTreeMap<&'static str, KnobValue>,
}

impl Settings {
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Sets a knob (a later `--set` of the same knob wins).
    pub fn set(&mut self, spec: &KnobSpec, value: KnobValue) {
        self.values.insert(spec.name, value);
    }

    /// The value set for a knob, if any.
    pub fn get(&self, spec: &KnobSpec) -> Option<KnobValue> {
        self.values.get(spec.name).copied()
    }

    /// The settings a scenario with these knobs takes: those it declares, set away from their
    /// defaults.
    pub fn for_knobs(&self, knobs: &[KnobSpec]) -> Settings {
        let values = knobs
            .iter()
            .filter_map(|spec| {
                let value = self.get(spec)?;
                (value != spec.default_value()).then_some((spec.name, value))
            })
            .collect();
        Settings { values }
    }

    /// Each knob set, with its value as `--set` writes it (for the run's summary).
    pub fn shown(&self) -> Vec<(String, String)> {
        self.values
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Knob<Duration> = Knob::millis("client_timeout_ms", 150, 1..=600_000);
    const KEY: Knob<bool> = Knob::switch("idempotency_key", false);

    #[test]
    fn a_value_is_parsed_once_into_its_type_or_refused_with_the_range() {
        assert_eq!(
            TIMEOUT.spec.parse(" 2000 "),
            Ok(KnobValue::Millis(Duration::from_secs(2)))
        );
        for bad in ["0", "600001", "fast", "-1", ""] {
            let error = TIMEOUT.spec.parse(bad).unwrap_err();
            assert_eq!(
                error.to_string(),
                format!("client_timeout_ms takes milliseconds from 1 to 600000, not `{bad}`")
            );
        }
        assert_eq!(KEY.spec.parse("on"), Ok(KnobValue::Switch(true)));
        assert_eq!(KEY.spec.parse("0"), Ok(KnobValue::Switch(false)));
        assert!(matches!(
            KEY.spec.parse("maybe"),
            Err(KnobError::NotSwitch {
                name: "idempotency_key",
                ..
            })
        ));
    }

    #[test]
    fn a_scenario_takes_only_its_knobs_set_away_from_their_defaults() {
        let mut settings = Settings::default();
        settings.set(&TIMEOUT.spec, KnobValue::Millis(Duration::from_millis(150)));
        settings.set(&KEY.spec, KnobValue::Switch(true));
        let mine = settings.for_knobs(&[TIMEOUT.spec]);
        assert!(mine.is_empty(), "the default is no setting: {mine:?}");
        let mine = settings.for_knobs(&[TIMEOUT.spec, KEY.spec]);
        assert_eq!(mine.shown(), [("idempotency_key".into(), "true".into())]);
        assert_eq!(
            mine.get(&KEY.spec).and_then(bool::from_value),
            Some(true),
            "typed on the way out"
        );
        assert_eq!(mine.get(&KEY.spec).and_then(Duration::from_value), None);
    }
}
