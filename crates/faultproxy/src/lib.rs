//! An in-process TCP fault proxy with a Toxiproxy-compatible HTTP API.
//!
//! The lab shows why retries duplicate side effects. For that it must make real
//! connections to real servers (PostgreSQL, Redis, HTTP services) fail in
//! precise ways: a slow answer, a lost request, an answer lost *after* the server
//! committed. No Toxiproxy server can be installed on the lab's machines, so this
//! crate is one, embedded in the lab's own process.
//!
//! A proxy listens on an address and forwards every connection to its upstream:
//!
//! ```text
//! client ──upstream stream──▶ [proxy: toxics + faults] ──▶ server
//! client ◀──downstream stream── [proxy: toxics + faults] ◀── server
//! ```
//!
//! Two ways to break things:
//!
//! * **Toxics** ([`Toxic`]): Toxiproxy 2.x's long-lived conditions (noop, latency, timeout,
//!   reset_peer, limit_data, bandwidth, slow_close, slicer) on one stream of every
//!   connection, each with a probability (`toxicity`).
//! * **Faults** ([`Fault`]): deterministic one-shot failures named by what the learner
//!   sees (`ResponseLostAfterCommit`, `RequestLost`, ...), armed for the next N
//!   connections or fired by a [`Trigger`] at the exact moment a scenario chooses.
//!
//! Both can be driven over HTTP ([`FaultProxy::router`]): toxics through Toxiproxy's own API,
//! so that Toxiproxy's clients (Go, toxiproxy-python, toxiproxy-node-client, toxiproxy-cli,
//! curl) work unchanged, and faults through a lab extension under `/lab/`. How closely the
//! API follows Toxiproxy is checked by Toxiproxy's own test suite, ported test by test
//! (`tests/conformance_*.rs`), and by its Python and Node clients in CI (`clients/` at the
//! repository root); `CONFORMANCE.md` beside this crate's `Cargo.toml` lists every Go test and
//! every difference we keep on purpose.
//!
//! ```no_run
//! # async fn demo() -> Result<(), faultproxy::Error> {
//! use faultproxy::{Fault, FaultProxy};
//!
//! let proxies = FaultProxy::new();
//! let info = proxies.create("payments", "127.0.0.1:0", "127.0.0.1:8080").await?;
//! println!("point the client at {}", info.listen);
//!
//! let payments = proxies.get("payments").expect("just created");
//! let lost = payments.arm(Fault::ResponseLostAfterCommit, 1);
//! // ... the client sends a payment through the proxy and sees a reset ...
//! lost.fired().await; // the server charged, the client never heard
//! # Ok(()) }
//! ```
//!
//! Layout:
//!
//! * `proxy.rs`: [`Proxy`], its settings and its listener (the accept loop);
//! * `connection.rs`: one accepted connection: its two pumps, the faults aimed at
//!   it, how it ends; and the registry of a proxy's open connections;
//! * `toxic.rs`: the toxic types, their JSON, and how each transforms a stream;
//! * `fault.rs`: one-shot faults, [`ArmedFault`], [`Trigger`], and [`FaultInfo`] (a fault
//!   as the HTTP API shows it);
//! * `api.rs`: the Toxiproxy HTTP API and the lab's `/lab/` fault extension
//!   ([`FaultProxy::router`]), with Toxiproxy's browser refusal and request ids;
//! * `client.rs`: an async client of that API, for this proxy or a real Toxiproxy (the
//!   fault methods are the lab extension's);
//! * `error.rs`: [`Error`], its status codes and Toxiproxy's words for it; `rng.rs`: a tiny
//!   PRNG.
//!
//! Beside `src/`: `examples/serve_api.rs` serves the API on a given port until killed (what
//! the client checks in CI drive), `tests/` has the behaviour tests and the ports of
//! Toxiproxy's suite, and `CONFORMANCE.md` the map from Toxiproxy's tests to ours.

mod api;
pub mod client;
mod connection;
mod error;
mod fault;
mod proxy;
mod rng;
mod toxic;

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;

pub use api::{TOXIPROXY_VERSION, router};
pub use error::Error;
pub use fault::{ArmedFault, Arming, Fault, FaultInfo, Trigger};
pub use proxy::{Proxy, ProxyInfo};
pub use toxic::{Stream, Toxic, ToxicKind};

/// The registry of named proxies. Cheap to clone (all clones share the proxies).
///
/// Dropping the last clone stops every proxy: their listeners close and their
/// connections are cut, even if [`Proxy`] handles are still around.
#[derive(Clone, Default)]
pub struct FaultProxy {
    registry: Arc<Registry>,
}

#[derive(Default)]
struct Registry {
    /// Sorted by name, so listings come out in a stable order.
    proxies: Mutex<BTreeMap<String, Proxy>>,
    /// The ports the disabled proxies keep: the registry's proxies may take them over.
    kept: Arc<proxy::KeptPorts>,
}

impl Drop for Registry {
    fn drop(&mut self) {
        // Each proxy's accept loop is a task holding its own reference to the
        // proxy; without this, they would keep listening until the runtime ends.
        for proxy in self.proxies.get_mut().values() {
            proxy.shutdown_now();
        }
    }
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.proxies()).finish()
    }
}

impl FaultProxy {
    pub fn new() -> FaultProxy {
        FaultProxy::default()
    }

    /// Creates an enabled proxy. `listen` may use port 0; the returned info (like
    /// Toxiproxy's answer) carries the real address.
    pub async fn create(
        &self,
        name: &str,
        listen: &str,
        upstream: &str,
    ) -> Result<ProxyInfo, Error> {
        let proxy = self.add(name, listen, upstream, true).await?;
        Ok(proxy.info())
    }

    pub(crate) async fn add(
        &self,
        name: &str,
        listen: &str,
        upstream: &str,
        enabled: bool,
    ) -> Result<Proxy, Error> {
        if self.get(name).is_some() {
            return Err(Error::ProxyAlreadyExists(name.to_owned()));
        }
        let proxy =
            Proxy::start(name, listen, upstream, enabled, self.registry.kept.clone()).await?;
        let lost_race = {
            let mut proxies = self.registry.proxies.lock();
            // Somebody may have created the same name while we were binding.
            let lost_race = proxies.contains_key(name);
            if !lost_race {
                proxies.insert(name.to_owned(), proxy.clone());
            }
            lost_race
        };
        if lost_race {
            proxy.shutdown().await;
            return Err(Error::ProxyAlreadyExists(name.to_owned()));
        }
        Ok(proxy)
    }

    pub fn get(&self, name: &str) -> Option<Proxy> {
        self.registry.proxies.lock().get(name).cloned()
    }

    /// All proxies, sorted by name.
    pub fn proxies(&self) -> Vec<Proxy> {
        self.registry.proxies.lock().values().cloned().collect()
    }

    /// Stops a proxy (closing its listener and connections) and forgets it.
    pub async fn remove(&self, name: &str) -> Result<(), Error> {
        let removed = self.registry.proxies.lock().remove(name);
        let proxy = removed.ok_or_else(|| Error::ProxyNotFound(name.to_owned()))?;
        proxy.shutdown().await;
        Ok(())
    }

    /// As `POST /reset`: re-enables every proxy, removes every toxic (closing the
    /// connections a timeout toxic held, as Toxiproxy does), and (beyond Toxiproxy) disarms
    /// every fault. A proxy that cannot listen again (its port
    /// was taken meanwhile) stays disabled; [`Self::try_reset`] reports that.
    pub async fn reset(&self) {
        let _ = self.try_reset().await;
    }

    /// [`Self::reset`], reporting the first proxy that could not be re-enabled.
    pub async fn try_reset(&self) -> Result<(), Error> {
        let mut first_error = None;
        for proxy in self.proxies() {
            proxy.remove_all_toxics();
            proxy.disarm_all_faults();
            if let Err(error) = proxy.set_enabled(true).await {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// The Toxiproxy-compatible HTTP API over this registry, with the lab's fault extension
    /// under `/lab/` (see the `api` module's table of routes in the crate's source).
    pub fn router(&self) -> axum::Router {
        api::router(self.clone())
    }

    /// Serves [`Self::router`] on `listener`; runs until the future is dropped.
    pub async fn serve_api(&self, listener: tokio::net::TcpListener) -> std::io::Result<()> {
        axum::serve(listener, self.router()).await
    }
}
