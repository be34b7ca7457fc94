//! What the payments lesson's exercises share: the payment intents their checks send, and the
//! judgements every one of them makes of a payment's answer and of the provider's charges.

use std::time::Duration;

use crate::call::Call;
use crate::judgement::{Judged, broke, fail};
use crate::verdict::{ChargeRow, Sent};

/// The tenants of the checks (the second only where two tenants meet).
pub const TENANT: &str = "6f1c2d3e-4a5b-4c6d-8e7f-0a1b2c3d4e5f";
pub const OTHER_TENANT: &str = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d";
/// The lesson's amount, in kopecks, and its currency.
pub const AMOUNT: i64 = 1990;
pub const CURRENCY: &str = "RUB";

/// A payment intent of a check: its tenant, its order, its amount and currency.
#[derive(Debug, Clone)]
pub struct Intent {
    pub tenant: &'static str,
    pub order: String,
    pub amount: i64,
    pub currency: &'static str,
}

impl Intent {
    /// Intent `n` of a check: order ids are readable UUIDs that end with the number.
    pub fn new(n: u32) -> Intent {
        Intent {
            tenant: TENANT,
            order: order_id(n),
            amount: AMOUNT,
            currency: CURRENCY,
        }
    }

    pub fn body(&self) -> String {
        serde_json::json!({
            "tenant_id": self.tenant,
            "order_id": self.order,
            "amount": self.amount,
            "currency": self.currency,
        })
        .to_string()
    }

    pub fn with_amount(&self, amount: i64) -> Intent {
        Intent {
            amount,
            ..self.clone()
        }
    }

    pub fn with_currency(&self, currency: &'static str) -> Intent {
        Intent {
            currency,
            ..self.clone()
        }
    }

    pub fn with_order(&self, n: u32) -> Intent {
        Intent {
            order: order_id(n),
            ..self.clone()
        }
    }

    /// A payment call of this intent with `key`, to `url` (the full URL of the route).
    pub fn call(&self, url: &str, who: &str, key: &str, timeout: Duration) -> Call {
        Call::post(who, url.to_string(), Some(key), self.body(), timeout)
    }
}

/// The order id of intent `n`.
pub fn order_id(n: u32) -> String {
    format!("0b7e4c1a-2d3f-4e5a-9b6c-{n:012}")
}

/// A 2xx answer that names a charge.
pub fn charged(sent: &Sent) -> bool {
    sent.succeeded() && sent.charge_id.is_some()
}

/// A payment's answer must be its Charge; the fail that says it was not.
pub fn must_be_charged(sent: &Sent) -> Judged {
    if charged(sent) {
        return Ok(());
    }
    fail(broke("not_charged").arg("status", sent.status_arg()))
}

/// The provider keys of some charges, for a message: `-` for a charge made without one.
pub fn keys_of(charges: &[ChargeRow]) -> String {
    charges
        .iter()
        .map(|c| c.key.clone().unwrap_or_else(|| "-".to_string()))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::judgement::{Stop, verdict_of};
    use crate::verdict::{Outcome, Verdict};

    pub(crate) fn answer(status: Option<u16>, charge: Option<&str>) -> Sent {
        Sent {
            who: "client".into(),
            path: "/payments".into(),
            key: Some("pay-1".into()),
            body: "{}".into(),
            status,
            answer: String::new(),
            no_answer: status.is_none().then_some("call.timed_out"),
            waited_ms: 1000,
            json_body: true,
            report_id: None,
            replayed: None,
            charge_id: charge.map(str::to_string),
            replayed_header: false,
            retry_after: None,
            outcome: if status.is_some_and(|s| s < 300) {
                Outcome::Ok
            } else {
                Outcome::Unknown
            },
        }
    }

    #[test]
    fn a_payments_answer_is_its_charge_or_the_fail_says_what_came() {
        assert!(must_be_charged(&answer(Some(201), Some("ch_1"))).is_ok());
        let Err(Stop::Verdict(Verdict::Fail(msg))) = must_be_charged(&answer(Some(201), None))
        else {
            panic!("a 201 without a charge is not a Charge")
        };
        assert_eq!(msg.key, "broke.not_charged");
        match verdict_of(must_be_charged(&answer(None, None))) {
            Ok(Verdict::Fail(msg)) => assert_eq!(
                msg.args[0].1,
                lab_core::Arg::Msg(lab_core::Msg::new("call.no_answer")),
                "no answer is said in words, not as `-`"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn each_field_of_an_intent_changes_on_its_own() {
        let intent = Intent::new(2);
        let body = |i: &Intent| -> serde_json::Value { serde_json::from_str(&i.body()).unwrap() };
        assert_eq!(body(&intent)["currency"], "RUB");
        let usd = intent.with_currency("USD");
        assert_eq!(body(&usd)["currency"], "USD");
        assert_eq!(body(&usd)["amount"], body(&intent)["amount"]);
        let other = intent.with_order(3);
        assert_ne!(body(&other)["order_id"], body(&intent)["order_id"]);
        assert_eq!(body(&other)["amount"], body(&intent)["amount"]);
    }
}
