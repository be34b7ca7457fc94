//! The gateway of the chain lesson: where a client's payment enters.
//!
//! `POST /checkout` takes a payment with its Idempotency-Key and relays it to the orders
//! service's `POST /orders/pay`, keeping the key on every retry and passing every answer back
//! unchanged ([`crate::relay`]). `GET /stats` counts the requests it received.

use lab_infra::Needs;

use crate::orders;
use crate::relay::{Relay, RelayRoute};
use crate::spec::ServiceSpec;

/// The service's name: in narration, and the name of its fault-proxy hop.
pub const NAME: &str = "gateway";

const PLACE: RelayRoute = RelayRoute {
    name: NAME,
    route: "/checkout",
    next: orders::NAME,
    next_route: "/orders/pay",
};

/// The gateway, as the lab starts it.
pub static SPEC: ServiceSpec = ServiceSpec {
    name: NAME,
    title: "gateway",
    needs: Needs {
        postgres: false,
        redis: false,
    },
    schema: "",
    calls: &[&orders::SPEC],
    checkpoints: &[],
    demo: r#"  # a payment through the whole chain: gateway → orders → payments → provider
  curl -i -X POST {url}/checkout -H 'Content-Type: application/json' -H 'Idempotency-Key: C1' \
       -d '{"tenant_id":"6f1c2d3e-4a5b-4c6d-8e7f-0a1b2c3d4e5f","order_id":"0b7e4c1a-2d3f-4e5a-9b6c-7d8e9f0a1b2c","amount":1990,"currency":"RUB"}'"#,
    router: |env| Ok(Relay::from_env(PLACE, env)?.router()),
};
