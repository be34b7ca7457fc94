//! Measured facts and their comparison with the expected ones kept under `scenarios/`.

use std::collections::BTreeMap;

use serde_json::Value;

/// Facts by name. A `BTreeMap` so every rendering lists them in the same order.
pub type Facts = BTreeMap<String, Value>;

/// One row of the comparison of measured and expected facts.
#[derive(Debug, Clone, PartialEq)]
pub struct FactCheck {
    pub name: String,
    pub actual: Option<Value>,
    pub expected: Option<Value>,
}

impl FactCheck {
    pub fn ok(&self) -> bool {
        self.actual.is_some() && self.actual == self.expected
    }
}

/// Compares every fact either side names. A fact measured but not expected is drift too: the
/// expected file is the whole contract.
pub fn compare(actual: &Facts, expected: &Facts) -> Vec<FactCheck> {
    let mut names: Vec<&String> = actual.keys().chain(expected.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .map(|name| FactCheck {
            name: name.clone(),
            actual: actual.get(name).cloned(),
            expected: expected.get(name).cloned(),
        })
        .collect()
}

/// True when every fact agrees.
pub fn all_ok(actual: &Facts, expected: &Facts) -> bool {
    compare(actual, expected).iter().all(FactCheck::ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn facts(v: Value) -> Facts {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn equal_facts_pass() {
        let a = facts(json!({"reports_total": 2, "task_status": "completed"}));
        assert!(all_ok(&a, &a.clone()));
    }

    #[test]
    fn a_different_missing_or_extra_fact_fails() {
        let expected = facts(json!({"reports_total": 1}));
        assert!(!all_ok(&facts(json!({"reports_total": 2})), &expected));
        assert!(!all_ok(&facts(json!({})), &expected));
        assert!(!all_ok(
            &facts(json!({"reports_total": 1, "extra": true})),
            &expected
        ));
    }
}
