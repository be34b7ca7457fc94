//! The orders service of the chain lesson: between the gateway and the payment service.
//!
//! `POST /orders/pay` takes a payment with its Idempotency-Key and relays it to the payment
//! service's `POST /payments`, keeping the key on every retry and passing every answer back
//! unchanged ([`crate::relay`]). `GET /stats` counts the requests it received; `PUT /config
//! {"mint_keys": true}` switches on the broken design: a new key for every attempt.

use lab_infra::Needs;

use crate::payments;
use crate::relay::{Relay, RelayRoute};
use crate::spec::ServiceSpec;

/// The service's name: in narration, and the name of its fault-proxy hop.
pub const NAME: &str = "orders";

const PLACE: RelayRoute = RelayRoute {
    name: NAME,
    route: "/orders/pay",
    next: payments::NAME,
    next_route: "/payments",
};

/// The orders service, as the lab starts it.
pub static SPEC: ServiceSpec = ServiceSpec {
    name: NAME,
    title: "orders service",
    needs: Needs {
        postgres: false,
        redis: false,
    },
    schema: "",
    calls: &[&payments::SPEC],
    checkpoints: &[],
    demo: r#"  # the orders service relays a payment to the payment service, key unchanged
  curl -s {direct}/stats"#,
    router: |env| Ok(Relay::from_env(PLACE, env)?.router()),
};
