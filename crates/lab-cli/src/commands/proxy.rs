//! `lab proxy`: drive the fault proxies of a running `lab serve` (or of any Toxiproxy) from the
//! command line, the way `toxiproxy-cli` does, plus the lab's one-shot faults.
//!
//! A class breaks the bundled services live: `lab serve` in one terminal, `lab proxy toxic add
//! reports -t latency -a latency=900 -d` in another, then a client that times out while the
//! report is created anyway. The subcommands, their aliases and their flags are
//! `toxiproxy-cli`'s where it has them (`list`, `inspect`, `create -l -u`, `toggle`, `delete`,
//! `toxic add|update|remove` with `-t -n -a -u -d --tox`), so what a learner types here also
//! works against a real Toxiproxy with its own CLI, and the output has the same shape (a table
//! for `list`, the proxy and its toxics by stream for `inspect`, one sentence per change).
//! `--format json` prints the API's answer instead, one object per line.
//!
//! `fault` is ours: it arms a deterministic one-shot fault (`response_lost_after_commit`, ...)
//! through the embedded API's `/lab/` extension. A real Toxiproxy has none, and says 404; that
//! is reported as such rather than as a wrong proxy name.
//!
//! Every call goes through [`ToxiproxyClient`], the client the scenarios use, so there is one
//! code path to the API. Where we differ from `toxiproxy-cli` on purpose:
//!
//! * a malformed `-a` (no `=`) or an attribute the toxic does not have is an error (exit 2)
//!   instead of being dropped silently: a typo (`-a latecny=900`) would otherwise add a toxic
//!   that does nothing, the worst outcome in a class;
//! * `toxic update` without `--tox` keeps the toxicity (toxiproxy-cli resets it to 1.0);
//! * `-n` is required by `update` and `remove` (toxiproxy-cli sends an empty name);
//! * the API is `--toxiproxy-url` (global; env `TOXIPROXY_URL`, as toxiproxy-cli reads it),
//!   not `-h`, which is `--help` here.
//!
//! Exit codes: 0 done; 2 the command line or the request is wrong (a malformed flag, an unknown
//! proxy or toxic, a name that exists, a value the API refuses); 3 the API cannot be reached,
//! fails, or (for `fault`) is a Toxiproxy without the lab's extension.

use std::collections::BTreeMap;
use std::io::IsTerminal;

use anyhow::anyhow;
use colored::Colorize;
use faultproxy::client::{ClientError, ToxiproxyClient};
use faultproxy::{Fault, FaultInfo, ProxyInfo, Toxic};
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::cli::DEFAULT_PORT_BASE;
use crate::cli::proxy::{
    FaultArgs, ProxyArgs, ProxyCommand, ToxicAdd, ToxicCommand, ToxicUpdate, fault_about,
};
use crate::exit::{self, Failure};
use crate::session::{Format, SessionOptions};
use crate::words::t;
use lab_core::Msg;

/// Runs `lab proxy ...`.
pub async fn proxy(options: &SessionOptions, args: &ProxyArgs) -> Result<u8, Failure> {
    let url = options
        .toxiproxy_url
        .clone()
        .unwrap_or_else(|| format!("http://127.0.0.1:{}", DEFAULT_PORT_BASE + 4));
    let api = Api {
        client: ToxiproxyClient::new(&url),
        json: options.format == Format::Json,
        color: options.color,
        hints: std::io::stdout().is_terminal(),
    };
    match &args.command {
        ProxyCommand::List => api.list().await?,
        ProxyCommand::Inspect { name } => api.inspect(name).await?,
        ProxyCommand::Create {
            name,
            listen,
            upstream,
        } => api.create(name, listen, upstream).await?,
        ProxyCommand::Toggle { name } => api.toggle(name).await?,
        ProxyCommand::Delete { name } => api.delete(name).await?,
        ProxyCommand::Toxic { command } => match command {
            ToxicCommand::Add(add) => api.add_toxic(add).await?,
            ToxicCommand::Update(update) => api.update_toxic(update).await?,
            ToxicCommand::Remove { proxy, toxic_name } => {
                api.remove_toxic(proxy, toxic_name).await?
            }
        },
        ProxyCommand::Fault(fault) => api.fault(fault).await?,
    }
    Ok(exit::OK)
}

/// The API and how to print what it answers.
struct Api {
    client: ToxiproxyClient,
    json: bool,
    color: bool,
    /// Hints on what to type next, as toxiproxy-cli prints them: on a terminal only.
    hints: bool,
}

/// What a call was about, to name it in an error.
#[derive(Clone, Copy)]
struct About<'a> {
    proxy: &'a str,
    toxic: Option<&'a str>,
}

impl<'a> About<'a> {
    fn proxy(proxy: &'a str) -> About<'a> {
        About { proxy, toxic: None }
    }

    fn toxic(proxy: &'a str, toxic: &'a str) -> About<'a> {
        About {
            proxy,
            toxic: Some(toxic),
        }
    }
}

impl Api {
    fn base(&self) -> &str {
        self.client.base()
    }

    /// A failed call, as the learner needs to hear it, with its exit code.
    fn failure(&self, error: ClientError, about: Option<About>) -> Failure {
        let api = self.base();
        match error {
            ClientError::Unreachable { source, .. } if source.is_timeout() => {
                Failure::environment(anyhow!(t(Msg::new("proxy.stuck").arg("api", api))))
            }
            ClientError::Unreachable { .. } => {
                Failure::environment(anyhow!(t(Msg::new("proxy.unreachable").arg("api", api))))
            }
            ClientError::Status {
                status, message, ..
            } => {
                let (proxy, toxic) = match about {
                    Some(about) => (about.proxy, about.toxic.unwrap_or("")),
                    None => ("", ""),
                };
                let said = |key: &str| {
                    t(Msg::new(format!("proxy.{key}"))
                        .arg("api", api)
                        .arg("proxy", proxy)
                        .arg("toxic", toxic)
                        .arg("status", status)
                        .arg("message", message.as_str()))
                };
                match (status, message.as_str()) {
                    (404, "proxy not found") => Failure::usage(said("no_proxy")),
                    (404, "toxic not found") => Failure::usage(said("no_toxic")),
                    (409, "proxy already exists") => Failure::usage(said("proxy_exists")),
                    (409, "toxic already exists") => Failure::usage(said("toxic_exists")),
                    (400..=499, _) => Failure::usage(said("refused")),
                    _ => Failure::environment(anyhow!(said("failed"))),
                }
            }
            ClientError::Body { reason, .. } => {
                Failure::environment(anyhow!(t(Msg::new("proxy.not_the_api")
                    .arg("api", api)
                    .arg("reason", reason))))
            }
        }
    }

    /// A failed call to the lab's `/lab/` extension: a 404 other than "proxy not found" means
    /// a server without it, a real Toxiproxy.
    fn fault_failure(&self, error: ClientError, proxy: &str) -> Failure {
        match &error {
            ClientError::Status {
                status: 404,
                message,
                ..
            } if message != "proxy not found" => Failure::environment(anyhow!(t(Msg::new(
                "proxy.no_faults"
            )
            .arg("api", self.base())))),
            _ => self.failure(error, Some(About::proxy(proxy))),
        }
    }

    fn print_json<T: Serialize>(&self, value: &T) {
        say!(
            "{}",
            serde_json::to_string(value).expect("API values serialise")
        );
    }

    fn hint(&self, hint: &str) {
        if self.hints {
            say!();
            say!("Hint: {hint}");
        }
    }

    /// "enabled"/"disabled", padded to `width` before colouring (escape codes have no width).
    fn state(&self, enabled: bool, width: usize) -> String {
        let text = format!("{:<width$}", if enabled { "enabled" } else { "disabled" });
        match (self.color, enabled) {
            (false, _) => text,
            (true, true) => text.green().to_string(),
            (true, false) => text.red().to_string(),
        }
    }

    async fn list(&self) -> Result<(), Failure> {
        let proxies: BTreeMap<String, ProxyInfo> = self
            .client
            .proxies()
            .await
            .map_err(|e| self.failure(e, None))?;
        if self.json {
            self.print_json(&proxies);
            return Ok(());
        }
        if proxies.is_empty() {
            say!("no proxies on {}", self.base());
            self.hint("create a proxy with `lab proxy create NAME -l ADDR -u ADDR`");
            return Ok(());
        }
        let width = |title: &str, field: fn(&ProxyInfo) -> &str| {
            proxies
                .values()
                .map(|p| field(p).len())
                .chain([title.len()])
                .max()
                .unwrap_or(0)
        };
        let name = width("Name", |p| &p.name);
        let listen = width("Listen", |p| &p.listen);
        let upstream = width("Upstream", |p| &p.upstream);
        let enabled = "disabled".len();
        say!(
            "{:<name$}  {:<listen$}  {:<upstream$}  {:<enabled$}  Toxics",
            "Name",
            "Listen",
            "Upstream",
            "Enabled"
        );
        say!("{}", "=".repeat(name + listen + upstream + enabled + 14));
        for proxy in proxies.values() {
            let toxics = match proxy.toxics.len() {
                0 => "None".to_string(),
                n => n.to_string(),
            };
            say!(
                "{:<name$}  {:<listen$}  {:<upstream$}  {}  {toxics}",
                proxy.name,
                proxy.listen,
                proxy.upstream,
                self.state(proxy.enabled, enabled)
            );
        }
        self.hint("inspect toxics with `lab proxy inspect PROXY`");
        Ok(())
    }

    async fn inspect(&self, name: &str) -> Result<(), Failure> {
        let proxy = self
            .client
            .proxy(name)
            .await
            .map_err(|e| self.failure(e, Some(About::proxy(name))))?;
        if self.json {
            self.print_json(&proxy);
            return Ok(());
        }
        say!(
            "Name: {}  Listen: {}  Upstream: {}  {}",
            proxy.name,
            proxy.listen,
            proxy.upstream,
            self.state(proxy.enabled, 0)
        );
        say!("{}", "=".repeat(70));
        if proxy.toxics.is_empty() {
            say!("Proxy has no toxics enabled.");
        } else {
            for (title, stream) in [("Upstream", "upstream"), ("Downstream", "downstream")] {
                if stream == "downstream" {
                    say!();
                }
                say!("{title} toxics:");
                let toxics: Vec<&Toxic> = proxy
                    .toxics
                    .iter()
                    .filter(|t| t.stream.as_str() == stream)
                    .collect();
                if toxics.is_empty() {
                    say!("  Proxy has no {title} toxics enabled.");
                }
                for toxic in toxics {
                    say!("  {}", toxic_line(toxic));
                }
            }
        }
        // The one-shot faults, where the API has them; a real Toxiproxy has none to show.
        if let Ok(faults) = self.client.faults(name).await {
            say!();
            say!("One-shot faults (lab extension):");
            if faults.is_empty() {
                say!("  none armed");
            }
            for fault in &faults {
                say!("  {}", fault_line(fault));
            }
        }
        self.hint("add a toxic with `lab proxy toxic add`");
        Ok(())
    }

    async fn create(&self, name: &str, listen: &str, upstream: &str) -> Result<(), Failure> {
        let proxy = self
            .client
            .create_proxy(name, listen, upstream)
            .await
            .map_err(|e| self.failure(e, Some(About::proxy(name))))?;
        if self.json {
            self.print_json(&proxy);
        } else {
            say!(
                "Created new proxy {name}: {} -> {}",
                proxy.listen,
                proxy.upstream
            );
        }
        Ok(())
    }

    async fn toggle(&self, name: &str) -> Result<(), Failure> {
        let about = Some(About::proxy(name));
        let proxy = self
            .client
            .proxy(name)
            .await
            .map_err(|e| self.failure(e, about))?;
        let proxy = self
            .client
            .set_enabled(name, !proxy.enabled)
            .await
            .map_err(|e| self.failure(e, about))?;
        if self.json {
            self.print_json(&proxy);
        } else {
            say!("Proxy {name} is now {}", self.state(proxy.enabled, 0));
        }
        Ok(())
    }

    async fn delete(&self, name: &str) -> Result<(), Failure> {
        self.client
            .delete_proxy(name)
            .await
            .map_err(|e| self.failure(e, Some(About::proxy(name))))?;
        if self.json {
            self.print_json(&json!({"proxy": name, "deleted": true}));
        } else {
            say!("Deleted proxy {name}");
        }
        Ok(())
    }

    async fn add_toxic(&self, add: &ToxicAdd) -> Result<(), Failure> {
        let stream = if add.upstream {
            "upstream"
        } else {
            "downstream"
        };
        let attributes: Map<String, Value> = add.attributes.iter().cloned().collect();
        let mut wanted = json!({
            "type": add.toxic_type,
            "stream": stream,
            "attributes": attributes,
        });
        if let Some(name) = &add.toxic_name {
            wanted["name"] = json!(name);
        }
        if let Some(toxicity) = add.toxicity {
            wanted["toxicity"] = json!(toxicity);
        }
        // Checked here, with the proxy's own rules, so that a mistake is named before
        // anything is sent, even to a real Toxiproxy (which would ignore an unknown attribute).
        let toxic: Toxic = serde_json::from_value(wanted).map_err(|e| {
            Failure::usage(t(Msg::new("proxy.cannot_add")
                .arg("type", add.toxic_type.as_str())
                .arg("error", e.to_string())))
        })?;
        check_attribute_names(&toxic, &attributes)?;
        let added = self
            .client
            .add_toxic(&add.proxy, &toxic)
            .await
            .map_err(|e| self.failure(e, Some(About::toxic(&add.proxy, &toxic.name))))?;
        if self.json {
            self.print_json(&added);
        } else {
            say!(
                "Added {} {} toxic '{}' on proxy '{}'",
                added.stream.as_str(),
                added.kind.type_name(),
                added.name,
                add.proxy
            );
        }
        Ok(())
    }

    async fn update_toxic(&self, update: &ToxicUpdate) -> Result<(), Failure> {
        if update.attributes.is_empty() && update.toxicity.is_none() {
            return Err(Failure::usage(t("proxy.nothing_to_update")));
        }
        let about = Some(About::toxic(&update.proxy, &update.toxic_name));
        let attributes: Map<String, Value> = update.attributes.iter().cloned().collect();
        // The toxic's type says which attributes it has.
        let proxy = self
            .client
            .proxy(&update.proxy)
            .await
            .map_err(|e| self.failure(e, about))?;
        let Some(current) = proxy.toxics.iter().find(|t| t.name == update.toxic_name) else {
            return Err(Failure::usage(t(Msg::new("proxy.no_toxic")
                .arg("proxy", update.proxy.as_str())
                .arg("toxic", update.toxic_name.as_str()))));
        };
        check_attribute_names(current, &attributes)?;
        let updated = self
            .client
            .update_toxic(
                &update.proxy,
                &update.toxic_name,
                &attributes,
                update.toxicity,
            )
            .await
            .map_err(|e| self.failure(e, about))?;
        if self.json {
            self.print_json(&updated);
        } else {
            say!(
                "Updated toxic '{}' on proxy '{}'",
                updated.name,
                update.proxy
            );
        }
        Ok(())
    }

    async fn remove_toxic(&self, proxy: &str, toxic: &str) -> Result<(), Failure> {
        self.client
            .remove_toxic(proxy, toxic)
            .await
            .map_err(|e| self.failure(e, Some(About::toxic(proxy, toxic))))?;
        if self.json {
            self.print_json(&json!({"proxy": proxy, "toxic": toxic, "removed": true}));
        } else {
            say!("Removed toxic '{toxic}' on proxy '{proxy}'");
        }
        Ok(())
    }

    async fn fault(&self, args: &FaultArgs) -> Result<(), Failure> {
        let proxy = args.proxy.as_str();
        if args.list {
            let faults = self
                .client
                .faults(proxy)
                .await
                .map_err(|e| self.fault_failure(e, proxy))?;
            if self.json {
                self.print_json(&faults);
            } else if faults.is_empty() {
                say!("No one-shot faults armed on proxy '{proxy}'");
            } else {
                say!("One-shot faults on proxy '{proxy}':");
                for fault in &faults {
                    say!("  {}", fault_line(fault));
                }
            }
        } else if args.clear {
            self.client
                .disarm_faults(proxy)
                .await
                .map_err(|e| self.fault_failure(e, proxy))?;
            if self.json {
                self.print_json(&json!({"proxy": proxy, "disarmed": true}));
            } else {
                say!("Disarmed every one-shot fault on proxy '{proxy}'");
            }
        } else if let Some(kind) = &args.kind {
            // clap has checked the name and that slow_response has its delay; a delay given
            // to another fault is refused here, by the same rule the API applies.
            let fault = Fault::from_name(kind, args.delay_ms).map_err(|e| {
                Failure::usage(t(Msg::new("proxy.bad_kind")
                    .arg("kind", kind.as_str())
                    .arg("error", e.to_string())))
            })?;
            let connections = args.connections as usize;
            let armed = self
                .client
                .arm_fault(proxy, &fault, connections)
                .await
                .map_err(|e| self.fault_failure(e, proxy))?;
            if self.json {
                self.print_json(&armed);
            } else {
                let next = match connections {
                    1 => "the next connection".to_string(),
                    n => format!("each of the next {n} connections"),
                };
                let about = match fault.delay_ms() {
                    Some(ms) => fault_about(kind).replace("--delay-ms", &format!("{ms} ms")),
                    None => fault_about(kind).to_string(),
                };
                say!(
                    "Armed {kind} on proxy '{proxy}' (fault {}) for {next}: {about}",
                    armed.id
                );
            }
        }
        Ok(())
    }
}

/// Refuses attributes the toxic does not have: the API would ignore them, and a typo would
/// leave a toxic that does not do what the class expects.
fn check_attribute_names(toxic: &Toxic, given: &Map<String, Value>) -> Result<(), Failure> {
    let known = toxic_attributes(toxic);
    for name in given.keys() {
        if !known.contains_key(name) {
            let takes = if known.is_empty() {
                t("proxy.no_attributes")
            } else {
                known.keys().cloned().collect::<Vec<_>>().join(", ")
            };
            return Err(Failure::usage(t(Msg::new("proxy.unknown_attribute")
                .arg("type", toxic.kind.type_name())
                .arg("name", name.as_str())
                .arg("takes", takes))));
        }
    }
    Ok(())
}

/// A toxic's attributes as the API shows them, sorted by name.
fn toxic_attributes(toxic: &Toxic) -> BTreeMap<String, Value> {
    let json = serde_json::to_value(toxic).expect("a toxic serialises");
    json["attributes"]
        .as_object()
        .map(|a| a.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default()
}

/// One toxic as toxiproxy-cli's `inspect` shows it.
fn toxic_line(toxic: &Toxic) -> String {
    let attributes: Vec<String> = toxic_attributes(toxic)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    format!(
        "{}: type={} stream={} toxicity={:.2} attributes=[{}]",
        toxic.name,
        toxic.kind.type_name(),
        toxic.stream.as_str(),
        toxic.toxicity,
        attributes.join(" ")
    )
}

/// One armed fault.
fn fault_line(fault: &FaultInfo) -> String {
    let delay = fault
        .fault
        .delay_ms()
        .map(|ms| format!(" delay_ms={ms}"))
        .unwrap_or_default();
    let arming = serde_json::to_value(fault.arming)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    format!(
        "{}: {}{delay} arming={arming} uses_left={} fired={}",
        fault.id,
        fault.fault.name(),
        fault.uses_left,
        fault.fired
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_attributes_are_refused() {
        let library = lab_scenarios::Library::load().expect("the scenario files");
        crate::words::init(lab_core::Lang::En, Some(library.texts));
        let toxic: Toxic = serde_json::from_value(json!({"type": "latency"})).unwrap();
        let mut given = Map::new();
        given.insert("latency".into(), json!(900));
        assert!(check_attribute_names(&toxic, &given).is_ok());
        given.insert("latecny".into(), json!(900));
        let error = check_attribute_names(&toxic, &given).unwrap_err();
        assert_eq!(error.code, exit::USAGE);
        assert!(error.message().contains("jitter, latency"));
    }
}
