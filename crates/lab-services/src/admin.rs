//! The lab's own calls to its services' side doors: the lists it reads its facts from (the
//! provider's charges and the calls it answered, the mailer's emails), the counters (`GET
//! /stats`) and the switches (`PUT /config`), typed by the very bodies the routes answer with.
//! A route's path and shape are written here and in its handler, nowhere else: the scenarios,
//! the soak and the exercises all read through [`Admin`].
//!
//! These are not calls a story is about (those go through [`crate::client`], judged ok, fail
//! or unknown): anything but a 2xx with the expected body is an error of the lab's own run.

use serde::de::DeserializeOwned;

use crate::api::{ConfigRequest, Stats};
use crate::mailer::{Email, EmailList};
use crate::provider::{Charge, ChargeCall, ChargeCallList, ChargeList};

/// One of the lab's services at `base` (`http://127.0.0.1:PORT`, its direct address, past any
/// fault proxy), through the caller's own HTTP client.
#[derive(Debug, Clone, Copy)]
pub struct Admin<'a> {
    http: &'a reqwest::Client,
    base: &'a str,
}

impl<'a> Admin<'a> {
    pub fn new(http: &'a reqwest::Client, base: &'a str) -> Admin<'a> {
        Admin { http, base }
    }

    /// The provider's charges: all of them, or those under one provider key.
    pub async fn charges(&self, key: Option<&str>) -> Result<Vec<Charge>, reqwest::Error> {
        // The key goes through the URL's own encoding: a provider key may carry any character.
        let mut url = format!("{}/charges", self.base);
        if let Some(key) = key {
            url.push_str("?key=");
            url.extend(url::form_urlencoded::byte_serialize(key.as_bytes()));
        }
        Ok(read::<ChargeList>(self.http.get(url)).await?.charges)
    }

    /// Every `POST /charges` the provider answered, oldest first: the key each caller sent and
    /// the charge it got back.
    pub async fn charge_calls(&self) -> Result<Vec<ChargeCall>, reqwest::Error> {
        let request = self.http.get(format!("{}/requests", self.base));
        Ok(read::<ChargeCallList>(request).await?.requests)
    }

    /// The emails the mailer sent, oldest first.
    pub async fn emails(&self) -> Result<Vec<Email>, reqwest::Error> {
        let request = self.http.get(format!("{}/emails", self.base));
        Ok(read::<EmailList>(request).await?.emails)
    }

    /// How many requests the payment service or a relay received.
    pub async fn requests_received(&self) -> Result<u64, reqwest::Error> {
        let request = self.http.get(format!("{}/stats", self.base));
        Ok(read::<Stats>(request).await?.requests)
    }

    /// Switches the service: only what `change` gives changes. Its switches after it.
    pub async fn configure<C: ConfigRequest>(
        &self,
        change: &C,
    ) -> Result<C::Config, reqwest::Error> {
        read(self.http.put(format!("{}/config", self.base)).json(change)).await
    }
}

async fn read<T: DeserializeOwned>(request: reqwest::RequestBuilder) -> Result<T, reqwest::Error> {
    request.send().await?.error_for_status()?.json().await
}
