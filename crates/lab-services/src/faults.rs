//! The fault plane of a scenario run: the proxies on the hops it breaks.
//!
//! Every hop a scenario breaks goes through a proxy. By default the proxies are the lab's own
//! (`faultproxy`, in this process); with `--toxiproxy-url` they are created on that Toxiproxy
//! server instead. Either way they are configured through the same Toxiproxy HTTP client: the
//! embedded proxy serves its Toxiproxy API on a loopback port for this run. Proxy names carry the
//! run id, so runs sharing one Toxiproxy never touch each other's proxies, and the run deletes
//! the proxies it created when it ends.

use std::net::SocketAddr;
use std::sync::Arc;

use faultproxy::client::{ClientError, ToxiproxyClient};
use faultproxy::{ArmedFault, FaultProxy, Stream, Toxic, ToxicKind};
use lab_core::{Fault, Narrator};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Proxies created on a given Toxiproxy and not yet deleted, across the runs of one `lab`
/// call. A run deletes its own when it ends; a run cancelled by Ctrl-C cannot, so the CLI
/// deletes what is left here before it exits. (The embedded proxy dies with the process.)
#[derive(Debug, Clone, Default)]
pub struct ProxyLedger {
    open: Arc<Mutex<Vec<(ToxiproxyClient, String)>>>,
}

impl ProxyLedger {
    fn add(&self, client: &ToxiproxyClient, name: &str) {
        self.open.lock().push((client.clone(), name.to_string()));
    }

    /// Deletes the proxies whose names start with `prefix` (one run's), and forgets them.
    async fn delete(&self, prefix: &str) {
        let mine: Vec<_> = {
            let mut open = self.open.lock();
            let (mine, others) = std::mem::take(&mut *open)
                .into_iter()
                .partition(|(_, name)| name.starts_with(prefix));
            *open = others;
            mine
        };
        for (client, name) in mine {
            let _ = client.delete_proxy(&name).await;
        }
    }

    /// Deletes every proxy still on the ledger.
    pub async fn delete_left_over(&self) {
        self.delete("").await;
    }
}

/// The embedded proxy, and its API server.
struct Embedded {
    proxies: FaultProxy,
    /// Stops the API server (gracefully, in [`Faults::release`]).
    stop: CancellationToken,
    api: JoinHandle<()>,
}

/// The proxies of one run (or of `lab serve`), and the API that configures them.
pub struct Faults {
    client: ToxiproxyClient,
    /// `None` with an external Toxiproxy.
    embedded: Option<Embedded>,
    /// Prefixed to every proxy name: `lab_<run>_` (empty in `lab serve`, whose proxies carry the
    /// services' own names).
    prefix: String,
    /// Where proxies on a given Toxiproxy are recorded until deleted (`None`: embedded, whose
    /// proxies stop when this `Faults` is dropped).
    ledger: Option<ProxyLedger>,
    /// Told of every fault put on or taken off a hop ([`lab_core::Event::Fault`]), so the
    /// pictures of a run mark it. `None` in `lab serve`, where the class breaks hops by hand.
    narrator: Option<Narrator>,
}

/// A toxic added to a hop, to be removed again.
pub struct ToxicHandle {
    /// The hop as the scenario names it (the service's name), for the narrator.
    hop: String,
    proxy: String,
    name: String,
}

impl Faults {
    /// The embedded proxy of a scenario run, its API on a free loopback port.
    pub async fn embedded(run_id: &str, tasks: &TaskTracker) -> std::io::Result<Faults> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        Faults::embedded_on(listener, &format!("lab_{run_id}_"), tasks)
    }

    /// The embedded proxy with its Toxiproxy API served on `listener`; proxy names get `prefix`.
    pub fn embedded_on(
        listener: TcpListener,
        prefix: &str,
        tasks: &TaskTracker,
    ) -> std::io::Result<Faults> {
        let proxies = FaultProxy::new();
        let client = ToxiproxyClient::new(&format!("http://{}", listener.local_addr()?));
        let router = proxies.router();
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let api = tasks.spawn(crate::http::serve(
            listener,
            router,
            stopped,
            crate::http::Limits::default(),
        ));
        Ok(Faults {
            client,
            embedded: Some(Embedded { proxies, stop, api }),
            prefix: prefix.to_string(),
            ledger: None,
            narrator: None,
        })
    }

    /// A Toxiproxy server somewhere else (`--toxiproxy-url`); checked with `GET /version`.
    pub async fn external(
        url: &str,
        run_id: &str,
        ledger: &ProxyLedger,
    ) -> Result<Faults, ClientError> {
        let client = ToxiproxyClient::new(url);
        client.version().await?;
        Ok(Faults {
            client,
            embedded: None,
            prefix: format!("lab_{run_id}_"),
            ledger: Some(ledger.clone()),
            narrator: None,
        })
    }

    /// Tells `narrator` of every fault put on or taken off a hop from now on.
    pub fn narrated(mut self, narrator: Narrator) -> Faults {
        self.narrator = Some(narrator);
        self
    }

    fn mark(&self, hop: &str, fault: Fault) {
        if let Some(narrator) = &self.narrator {
            narrator.fault(hop, fault);
        }
    }

    /// Whether the proxies are the lab's own (needed for one-shot faults).
    pub fn is_embedded(&self) -> bool {
        self.embedded.is_some()
    }

    fn full_name(&self, hop: &str) -> String {
        format!("{}{hop}", self.prefix)
    }

    /// The URL of the Toxiproxy API that configures these proxies.
    pub fn api_url(&self) -> &str {
        self.client.base()
    }

    /// Puts a proxy in front of `upstream` on a free port; returns the address clients must use
    /// instead.
    pub async fn hop(&self, hop: &str, upstream: SocketAddr) -> Result<SocketAddr, ClientError> {
        self.hop_at(hop, "127.0.0.1:0", upstream).await
    }

    /// Puts a proxy listening on `listen` in front of `upstream`.
    pub async fn hop_at(
        &self,
        hop: &str,
        listen: &str,
        upstream: SocketAddr,
    ) -> Result<SocketAddr, ClientError> {
        let name = self.full_name(hop);
        let info = self
            .client
            .create_proxy(&name, listen, &upstream.to_string())
            .await?;
        if let Some(ledger) = &self.ledger {
            ledger.add(&self.client, &name);
        }
        info.listen.parse().map_err(|e| ClientError::Body {
            url: self.client.base().to_string(),
            reason: format!("listen address {:?}: {e}", info.listen),
        })
    }

    /// Holds every response on `hop` for `delay` on its way back (a downstream latency toxic,
    /// whole milliseconds).
    pub async fn slow_responses(
        &self,
        hop: &str,
        delay: std::time::Duration,
    ) -> Result<ToxicHandle, ClientError> {
        let millis = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        let proxy = self.full_name(hop);
        let toxic = Toxic::new(
            ToxicKind::Latency {
                latency: millis,
                jitter: 0,
            },
            Stream::Downstream,
        );
        let created = self.client.add_toxic(&proxy, &toxic).await?;
        self.mark(hop, Fault::Held { millis });
        Ok(ToxicHandle {
            hop: hop.to_string(),
            proxy,
            name: created.name,
        })
    }

    /// Adds any toxic to a hop (not marked in pictures: the caller knows what it means).
    pub async fn add_toxic(&self, hop: &str, toxic: &Toxic) -> Result<ToxicHandle, ClientError> {
        let proxy = self.full_name(hop);
        let created = self.client.add_toxic(&proxy, toxic).await?;
        Ok(ToxicHandle {
            hop: hop.to_string(),
            proxy,
            name: created.name,
        })
    }

    /// Cuts a hop without closing it: nothing gets through either way and nothing answers, so
    /// every caller waits for its own timeout (a `timeout` toxic of 0 on both streams: Toxiproxy
    /// holds the data until the toxic is removed). Returns the two toxics.
    pub async fn black_hole(&self, hop: &str) -> Result<[ToxicHandle; 2], ClientError> {
        let toxic = |stream| {
            Toxic::new(ToxicKind::Timeout { timeout: 0 }, stream)
                .named(format!("black_hole_{}", stream.as_str()))
        };
        let toxics = [
            self.add_toxic(hop, &toxic(Stream::Upstream)).await?,
            self.add_toxic(hop, &toxic(Stream::Downstream)).await?,
        ];
        self.mark(hop, Fault::Cut);
        Ok(toxics)
    }

    /// Takes a hop off the network (refused connections, open ones cut) or puts it back.
    pub async fn set_enabled(&self, hop: &str, enabled: bool) -> Result<(), ClientError> {
        self.client
            .set_enabled(&self.full_name(hop), enabled)
            .await?;
        self.mark(hop, if enabled { Fault::Healed } else { Fault::Cut });
        Ok(())
    }

    /// Removes a toxic: the hop is healthy again.
    pub async fn remove(&self, toxic: ToxicHandle) -> Result<(), ClientError> {
        self.client.remove_toxic(&toxic.proxy, &toxic.name).await?;
        self.mark(&toxic.hop, Fault::Healed);
        Ok(())
    }

    /// The embedded proxy of a hop, for one-shot faults. `None` with an external Toxiproxy.
    pub fn embedded_proxy(&self, hop: &str) -> Option<faultproxy::Proxy> {
        let embedded = self.embedded.as_ref()?;
        embedded.proxies.get(&self.full_name(hop))
    }

    /// Arms "the answer is lost after the work was done" for the next connection to `hop` (a
    /// one-shot fault of the embedded proxy). `None` with an external Toxiproxy.
    pub fn drop_next_answer(&self, hop: &str) -> Option<ArmedFault> {
        let armed = self
            .embedded_proxy(hop)?
            .arm(faultproxy::Fault::ResponseLostAfterCommit, 1);
        self.mark(hop, Fault::Dropped);
        Some(armed)
    }

    /// Ends the run's fault plane: deletes the proxies this run created on a given Toxiproxy (it
    /// keeps them otherwise); stops the embedded API and proxies.
    pub async fn release(mut self) {
        if let Some(ledger) = &self.ledger {
            ledger.delete(&self.prefix).await;
        }
        self.stop_api().await;
        // Dropping the last handle of the registry stops every proxy and its connections.
        drop(self.embedded.take());
    }

    /// Stops the embedded API server, and only it: the proxies keep carrying what is in flight.
    /// A run calls it when its scenario is over (nobody configures faults any more) and before
    /// it waits for its spawned work, which the API server, serving until it is stopped, would
    /// otherwise be part of. Idempotent.
    pub async fn stop_api(&mut self) {
        let Some(embedded) = &mut self.embedded else {
            return;
        };
        if embedded.api.is_finished() {
            return;
        }
        embedded.stop.cancel();
        // Idle keep-alive connections are closed by the graceful shutdown; a request still in
        // flight gets a moment, then is cut.
        if tokio::time::timeout(std::time::Duration::from_secs(1), &mut embedded.api)
            .await
            .is_err()
        {
            embedded.api.abort();
        }
    }
}

impl Drop for Faults {
    fn drop(&mut self) {
        // Not released (the run was cancelled): stop the API server at once.
        if let Some(embedded) = &self.embedded {
            embedded.stop.cancel();
            embedded.api.abort();
        }
    }
}
