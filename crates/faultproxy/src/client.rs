//! An async client of the Toxiproxy HTTP API.
//!
//! The lab configures every proxy and toxic through this client, whether the server is the
//! embedded proxy (its API served on a loopback port) or a real Toxiproxy (`--toxiproxy-url`).
//! One code path for both keeps the embedded API honest: whatever the scenarios need from it,
//! a real Toxiproxy must be able to do too.
//!
//! The deterministic one-shot faults ([`crate::Fault`]) are a **lab extension**: the embedded
//! API serves them under `/lab/` ([`ToxiproxyClient::arm_fault`], [`ToxiproxyClient::faults`],
//! [`ToxiproxyClient::disarm_faults`]), and a real Toxiproxy, which has no such thing, answers
//! those calls with a 404 ([`ClientError::Status`]).
//!
//! Unlike the `toxiproxy_rust` crate, every call checks the status code and turns Toxiproxy's
//! error body (`{"error": …, "status": …}`) into a [`ClientError`].

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::Method;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use crate::{Fault, FaultInfo, ProxyInfo, Toxic};

/// Why a call to a Toxiproxy API failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the Toxiproxy API at {url}: {source}")]
    Unreachable {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("Toxiproxy API {method} {url} answered {status}: {message}")]
    Status {
        method: String,
        url: String,
        status: u16,
        message: String,
    },
    #[error("Toxiproxy API {url} sent an unexpected body: {reason}")]
    Body { url: String, reason: String },
}

/// A client of one Toxiproxy API server.
#[derive(Debug, Clone)]
pub struct ToxiproxyClient {
    base: String,
    http: reqwest::Client,
}

impl ToxiproxyClient {
    /// A client for the API at `base`, e.g. `http://127.0.0.1:8474`.
    pub fn new(base: &str) -> ToxiproxyClient {
        let http = reqwest::Client::builder()
            // Configuration calls are local and quick; a hung API must not hang a lesson.
            .timeout(Duration::from_secs(5))
            .build()
            .expect("a plain HTTP client builds");
        ToxiproxyClient {
            base: base.trim_end_matches('/').to_string(),
            http,
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Option<T>, ClientError> {
        let url = format!("{}{path}", self.base);
        let mut request = self.http.request(method.clone(), &url);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request
            .send()
            .await
            .map_err(|source| ClientError::Unreachable {
                url: url.clone(),
                source,
            })?;
        let status = response.status().as_u16();
        let text = response
            .text()
            .await
            .map_err(|source| ClientError::Unreachable {
                url: url.clone(),
                source,
            })?;
        if !(200..300).contains(&status) {
            let message = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_string))
                .unwrap_or(text);
            return Err(ClientError::Status {
                method: method.to_string(),
                url,
                status,
                message,
            });
        }
        if text.trim().is_empty() {
            return Ok(None);
        }
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| ClientError::Body {
                url,
                reason: e.to_string(),
            })
    }

    fn expect<T>(&self, path: &str, value: Option<T>) -> Result<T, ClientError> {
        value.ok_or_else(|| ClientError::Body {
            url: format!("{}{path}", self.base),
            reason: "empty body".to_string(),
        })
    }

    /// The server's version (`GET /version`): Toxiproxy 2.x answers `{"version": "2.x.y"}`,
    /// older ones a bare string.
    pub async fn version(&self) -> Result<String, ClientError> {
        let value: Option<Value> = self.call(Method::GET, "/version", None).await?;
        Ok(match value {
            Some(Value::Object(map)) => map
                .get("version")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            Some(Value::String(s)) => s,
            other => other.map(|v| v.to_string()).unwrap_or_default(),
        })
    }

    /// Creates a proxy (`POST /proxies`); `listen` may use port 0.
    pub async fn create_proxy(
        &self,
        name: &str,
        listen: &str,
        upstream: &str,
    ) -> Result<ProxyInfo, ClientError> {
        let body = json!({"name": name, "listen": listen, "upstream": upstream, "enabled": true});
        let info = self.call(Method::POST, "/proxies", Some(body)).await?;
        self.expect("/proxies", info)
    }

    /// Every proxy, by name (`GET /proxies`).
    pub async fn proxies(&self) -> Result<BTreeMap<String, ProxyInfo>, ClientError> {
        let proxies = self.call(Method::GET, "/proxies", None).await?;
        self.expect("/proxies", proxies)
    }

    /// Reads a proxy (`GET /proxies/{name}`).
    pub async fn proxy(&self, name: &str) -> Result<ProxyInfo, ClientError> {
        let path = format!("/proxies/{name}");
        let info = self.call(Method::GET, &path, None).await?;
        self.expect(&path, info)
    }

    /// Enables or disables a proxy (`POST /proxies/{name}` with `{"enabled": …}`).
    pub async fn set_enabled(&self, name: &str, enabled: bool) -> Result<ProxyInfo, ClientError> {
        let path = format!("/proxies/{name}");
        let info = self
            .call(Method::POST, &path, Some(json!({"enabled": enabled})))
            .await?;
        self.expect(&path, info)
    }

    /// Deletes a proxy (`DELETE /proxies/{name}`).
    pub async fn delete_proxy(&self, name: &str) -> Result<(), ClientError> {
        self.call::<Value>(Method::DELETE, &format!("/proxies/{name}"), None)
            .await
            .map(drop)
    }

    /// Adds a toxic to a proxy (`POST /proxies/{name}/toxics`).
    pub async fn add_toxic(&self, proxy: &str, toxic: &Toxic) -> Result<Toxic, ClientError> {
        let path = format!("/proxies/{proxy}/toxics");
        let body = serde_json::to_value(toxic).expect("a toxic serialises");
        let created = self.call(Method::POST, &path, Some(body)).await?;
        self.expect(&path, created)
    }

    /// Updates a toxic (`POST /proxies/{name}/toxics/{toxic}`): each attribute given replaces
    /// the old one, the others stay; `toxicity`, if given, replaces the old one. Name, type and
    /// stream never change (remove the toxic and add another for that).
    pub async fn update_toxic(
        &self,
        proxy: &str,
        toxic: &str,
        attributes: &Map<String, Value>,
        toxicity: Option<f32>,
    ) -> Result<Toxic, ClientError> {
        let path = format!("/proxies/{proxy}/toxics/{toxic}");
        let mut body = json!({"attributes": attributes});
        if let Some(toxicity) = toxicity {
            body["toxicity"] = json!(toxicity);
        }
        let updated = self.call(Method::POST, &path, Some(body)).await?;
        self.expect(&path, updated)
    }

    /// Removes a toxic (`DELETE /proxies/{name}/toxics/{toxic}`).
    pub async fn remove_toxic(&self, proxy: &str, toxic: &str) -> Result<(), ClientError> {
        self.call::<Value>(
            Method::DELETE,
            &format!("/proxies/{proxy}/toxics/{toxic}"),
            None,
        )
        .await
        .map(drop)
    }

    /// Re-enables every proxy and removes every toxic (`POST /reset`).
    pub async fn reset(&self) -> Result<(), ClientError> {
        self.call::<Value>(Method::POST, "/reset", None)
            .await
            .map(drop)
    }

    /// **Lab extension** (a real Toxiproxy answers 404): arms a one-shot `fault` on `proxy`
    /// for its next `connections` connections (`POST /lab/proxies/{name}/faults`).
    pub async fn arm_fault(
        &self,
        proxy: &str,
        fault: &Fault,
        connections: usize,
    ) -> Result<FaultInfo, ClientError> {
        let path = format!("/lab/proxies/{proxy}/faults");
        let mut body = json!({"fault": fault.name(), "connections": connections});
        if let Some(delay_ms) = fault.delay_ms() {
            body["delay_ms"] = json!(delay_ms);
        }
        let armed = self.call(Method::POST, &path, Some(body)).await?;
        self.expect(&path, armed)
    }

    /// **Lab extension** (a real Toxiproxy answers 404): the faults armed on `proxy`, with
    /// their uses left and fired counts (`GET /lab/proxies/{name}/faults`).
    pub async fn faults(&self, proxy: &str) -> Result<Vec<FaultInfo>, ClientError> {
        let path = format!("/lab/proxies/{proxy}/faults");
        let faults = self.call(Method::GET, &path, None).await?;
        self.expect(&path, faults)
    }

    /// **Lab extension** (a real Toxiproxy answers 404): disarms every fault of `proxy`
    /// (`DELETE /lab/proxies/{name}/faults`).
    pub async fn disarm_faults(&self, proxy: &str) -> Result<(), ClientError> {
        self.call::<Value>(
            Method::DELETE,
            &format!("/lab/proxies/{proxy}/faults"),
            None,
        )
        .await
        .map(drop)
    }
}
