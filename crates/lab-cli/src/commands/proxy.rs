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
use clap::builder::{PossibleValue, PossibleValuesParser};
use clap::{ArgGroup, Args, Subcommand};
use colored::Colorize;
use faultproxy::client::{ClientError, ToxiproxyClient};
use faultproxy::{Fault, FaultInfo, ProxyInfo, Toxic};
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::cli::{DEFAULT_PORT_BASE, FormatArg, Global, exit};
use crate::session::{self, Failure};

const AFTER_HELP: &str = "\
The API: --toxiproxy-url URL (or TOXIPROXY_URL), else http://127.0.0.1:8474, where `lab serve`
puts it (with `lab serve --port-base BASE`, it is on BASE+4). Flags are toxiproxy-cli's.

Examples, with `lab serve` running in another terminal:
  lab proxy list                                        every proxy, its addresses and toxics
  lab proxy toxic add reports -t latency -a latency=900 -d
                                                        hold every answer of the report
                                                        service 900 ms on its way back
  lab proxy inspect reports                             the proxy and its toxics
  lab proxy toxic update reports -n latency_downstream -a latency=200
  lab proxy toxic remove reports -n latency_downstream
  lab proxy toggle reports                              refuse connections; again: accept
  lab proxy fault reports --kind response_lost_after_commit
                                                        the next request is done, its answer lost
  lab proxy fault reports --list                        armed faults, uses left, times fired
  lab proxy fault reports --clear                       disarm them
  lab proxy list --format json                          the API's JSON

Exit codes:
  0  done
  2  the command or the request is wrong: a malformed flag, an unknown proxy or toxic, a name
     that exists, an attribute or value the API refuses
  3  the API cannot be reached or fails, or (for `fault`) it is a Toxiproxy without the lab's
     one-shot faults";

const TOXIC_EXAMPLES: &str = "\
Examples:
  lab proxy toxic add reports -t latency -a latency=900 -d
  lab proxy toxic update reports -n latency_downstream -a latency=200
  lab proxy toxic remove reports -n latency_downstream";

/// `lab proxy`'s arguments: one of its subcommands.
#[derive(Debug, Args)]
#[command(after_help = AFTER_HELP, subcommand_required = true, arg_required_else_help = true)]
pub struct ProxyArgs {
    #[command(subcommand)]
    pub command: ProxyCommand,
}

#[derive(Debug, Subcommand)]
pub enum ProxyCommand {
    /// List every proxy: its listen address, upstream, state and number of toxics
    #[command(visible_alias = "ls", aliases = ["l", "li"], after_help = "\
Examples:
  lab proxy list                            every proxy of `lab serve` on 127.0.0.1:8474
  lab proxy list --format json              the API's JSON
  lab proxy list --toxiproxy-url http://127.0.0.1:8475
                                            the proxies of a real Toxiproxy")]
    List,
    /// Show one proxy, its toxics by stream and (on `lab serve`) its armed one-shot faults
    #[command(
        visible_alias = "i",
        alias = "ins",
        after_help = "\
Examples:
  lab proxy inspect reports                 the report service's proxy, toxics and faults
  lab proxy inspect reports --format json   the API's JSON"
    )]
    Inspect {
        /// The proxy, e.g. reports
        #[arg(value_name = "PROXY")]
        name: String,
    },
    /// Create a proxy that listens on ADDR and forwards to ADDR
    #[command(
        visible_alias = "new",
        alias = "c",
        after_help = "\
Examples:
  lab proxy create pg -l 127.0.0.1:5433 -u 127.0.0.1:5432
                                            a proxy in front of a PostgreSQL
  lab proxy create pg -l 127.0.0.1:0 -u 127.0.0.1:5432
                                            on any free port (`lab proxy inspect pg` shows it)"
    )]
    Create {
        /// The new proxy's name
        #[arg(value_name = "PROXY")]
        name: String,
        /// Where the proxy listens, e.g. 127.0.0.1:5000 (port 0: any free port)
        #[arg(short, long, value_name = "ADDR")]
        listen: String,
        /// Where it forwards to, e.g. 127.0.0.1:5432
        #[arg(short, long, value_name = "ADDR")]
        upstream: String,
    },
    /// Disable an enabled proxy (it refuses connections and cuts open ones), or enable a
    /// disabled one
    #[command(
        visible_alias = "tog",
        after_help = "\
Examples:
  lab proxy toggle reports                  refuse connections and cut the open ones
  lab proxy toggle reports                  again: accept connections"
    )]
    Toggle {
        /// The proxy, e.g. reports
        #[arg(value_name = "PROXY")]
        name: String,
    },
    /// Delete a proxy: its port closes and its connections are cut
    #[command(
        alias = "d",
        after_help = "\
Examples:
  lab proxy delete pg                       its port closes, its connections are cut"
    )]
    Delete {
        /// The proxy to delete
        #[arg(value_name = "PROXY")]
        name: String,
    },
    /// Add, update or remove a toxic: a lasting condition on every connection of a proxy
    #[command(
        visible_alias = "t",
        subcommand_required = true,
        arg_required_else_help = true,
        after_help = TOXIC_EXAMPLES
    )]
    Toxic {
        #[command(subcommand)]
        command: ToxicCommand,
    },
    /// Arm a one-shot fault for a proxy's next connections, list or clear them (a lab
    /// extension: `lab serve`'s API has it, a real Toxiproxy does not)
    Fault(FaultArgs),
}

#[derive(Debug, Subcommand)]
pub enum ToxicCommand {
    /// Add a toxic to a proxy, on the downstream (the answers) unless -u
    #[command(
        visible_alias = "a",
        after_help = "\
Examples:
  lab proxy toxic add reports -t latency -a latency=900 -d
                                            every answer held 900 ms on its way back
  lab proxy toxic add reports -t latency -a latency=500 -a jitter=100 -u --tox 0.5
                                            half the requests late on their way in
  lab proxy toxic add reports -t timeout -a timeout=0
                                            the data stops: connections hang until removed
  lab proxy toxic add reports -t reset_peer -a timeout=100
                                            connections reset after 100 ms"
    )]
    Add(ToxicAdd),
    /// Change a toxic's attributes or toxicity (its type and stream stay)
    #[command(
        visible_alias = "u",
        after_help = "\
Examples:
  lab proxy toxic update reports -n latency_downstream -a latency=200
  lab proxy toxic update reports -n latency_downstream --tox 0.1"
    )]
    Update(ToxicUpdate),
    /// Remove a toxic from a proxy
    #[command(visible_alias = "r", aliases = ["delete", "d"], after_help = "\
Examples:
  lab proxy toxic remove reports -n latency_downstream
                                            (`lab proxy inspect reports` names the toxics)")]
    Remove {
        /// The proxy, e.g. reports
        #[arg(value_name = "PROXY")]
        proxy: String,
        /// The toxic (`lab proxy inspect PROXY` shows them)
        #[arg(short = 'n', long = "toxicName", visible_alias = "toxic-name")]
        toxic_name: String,
    },
}

#[derive(Debug, Args)]
pub struct ToxicAdd {
    /// The proxy, e.g. reports
    #[arg(value_name = "PROXY")]
    proxy: String,
    /// The toxic's type
    #[arg(short = 't', long = "type", value_name = "TYPE",
          value_parser = PossibleValuesParser::new(toxic_types()))]
    toxic_type: String,
    /// The toxic's name [default: TYPE_STREAM, e.g. latency_downstream]
    #[arg(short = 'n', long = "toxicName", visible_alias = "toxic-name")]
    toxic_name: Option<String>,
    /// An attribute, e.g. latency=900 (repeat for several; see --type for each type's)
    #[arg(short = 'a', long = "attribute", value_name = "KEY=VALUE", value_parser = attribute)]
    attributes: Vec<(String, Value)>,
    /// On the upstream: the requests, client to server
    #[arg(short = 'u', long, conflicts_with = "downstream")]
    upstream: bool,
    /// On the downstream: the answers, server to client (the default)
    #[arg(short = 'd', long)]
    downstream: bool,
    /// The probability that the toxic applies to a connection, from 0 to 1 [default: 1]
    #[arg(long = "toxicity", visible_alias = "tox", value_name = "0..1", value_parser = toxicity)]
    toxicity: Option<f32>,
}

#[derive(Debug, Args)]
pub struct ToxicUpdate {
    /// The proxy, e.g. reports
    #[arg(value_name = "PROXY")]
    proxy: String,
    /// The toxic (`lab proxy inspect PROXY` shows them)
    #[arg(short = 'n', long = "toxicName", visible_alias = "toxic-name")]
    toxic_name: String,
    /// A new value for an attribute, e.g. latency=200 (repeat for several); the others stay
    #[arg(short = 'a', long = "attribute", value_name = "KEY=VALUE", value_parser = attribute)]
    attributes: Vec<(String, Value)>,
    /// A new probability that the toxic applies to a connection, from 0 to 1 [default: kept]
    #[arg(long = "toxicity", visible_alias = "tox", value_name = "0..1", value_parser = toxicity)]
    toxicity: Option<f32>,
}

#[derive(Debug, Args)]
#[command(
    group(ArgGroup::new("action").required(true).args(["kind", "list", "clear"])),
    after_help = "\
Examples, with `lab serve` running:
  lab proxy fault reports --kind response_lost_after_commit
  lab proxy fault reports --kind slow_response --delay-ms 2000 --connections 3
  lab proxy fault reports --list
  lab proxy fault reports --clear

A fault strikes the proxy's next connections, once each, then is spent; toxics (`lab proxy
toxic`) stay until removed. A real Toxiproxy has no one-shot faults: against one, this ends
with exit 3."
)]
pub struct FaultArgs {
    /// The proxy, e.g. reports
    #[arg(value_name = "PROXY")]
    proxy: String,
    /// Arm this fault for the proxy's next --connections connections
    #[arg(long, value_name = "FAULT", value_parser = PossibleValuesParser::new(fault_kinds()))]
    kind: Option<String>,
    /// How many of the next connections get the fault
    #[arg(long, value_name = "N", default_value_t = 1, requires = "kind",
          value_parser = clap::value_parser!(u32).range(1..))]
    connections: u32,
    /// slow_response's delay, in milliseconds (required there, refused elsewhere)
    #[arg(
        long,
        value_name = "MS",
        requires = "kind",
        required_if_eq("kind", "slow_response")
    )]
    delay_ms: Option<u64>,
    /// List the faults armed on the proxy, with their uses left and times fired
    #[arg(long)]
    list: bool,
    /// Disarm every fault of the proxy, those aimed at open connections included
    #[arg(long)]
    clear: bool,
}

/// The toxic types `-t` takes, with what they do and their attributes (as toxiproxy-cli's
/// `toxic` help lists them).
const TOXIC_TYPES: [(&str, &str); 8] = [
    (
        "latency",
        "delay all data by latency=MS, plus or minus jitter=MS",
    ),
    ("bandwidth", "limit to rate=KB/s"),
    ("slow_close", "delay the close by delay=MS"),
    (
        "timeout",
        "stop all data, close after timeout=MS (0: never)",
    ),
    (
        "reset_peer",
        "reset the connection (RST) timeout=MS after the first data",
    ),
    (
        "slicer",
        "slice data into average_size=BYTES, size_variation=BYTES, delay=MICROSECONDS apart",
    ),
    ("limit_data", "close the connection after bytes=BYTES"),
    ("noop", "do nothing (to check that a client can add toxics)"),
];

fn toxic_types() -> Vec<PossibleValue> {
    TOXIC_TYPES
        .iter()
        .map(|(name, about)| PossibleValue::new(*name).help(*about))
        .collect()
}

/// What each one-shot fault does to the connection it strikes.
fn fault_about(name: &str) -> &'static str {
    match name {
        "response_lost_after_commit" => {
            "the request reaches the server, which does the work; its answer is swallowed and \
             the client's connection reset"
        }
        "request_lost" => {
            "the request never reaches the server; the client's connection is then closed"
        }
        "slow_response" => "the answer is held back --delay-ms, then delivered in full",
        "connection_refused" => "the connection is cut (RST) before any byte reaches the server",
        "reset" => {
            "the request reaches the server, and the client's connection is reset at once, \
             while the server works on"
        }
        _ => "",
    }
}

fn fault_kinds() -> Vec<PossibleValue> {
    Fault::NAMES
        .iter()
        .map(|name| PossibleValue::new(*name).help(fault_about(name)))
        .collect()
}

/// `-a KEY=VALUE`. Numbers become JSON numbers (integers when they are), as toxiproxy-cli sends
/// them; anything else stays a string, for the API to judge.
fn attribute(given: &str) -> Result<(String, Value), String> {
    let (key, value) = given
        .split_once('=')
        .filter(|(key, _)| !key.trim().is_empty())
        .ok_or_else(|| format!("expected KEY=VALUE, e.g. latency=900, not `{given}`"))?;
    let (key, value) = (key.trim().to_string(), value.trim());
    let value = if let Ok(n) = value.parse::<u64>() {
        Value::from(n)
    } else if let Ok(n) = value.parse::<i64>() {
        Value::from(n)
    } else if let Some(n) = value.parse::<f64>().ok().filter(|n| n.is_finite()) {
        Value::from(n)
    } else {
        Value::from(value)
    };
    Ok((key, value))
}

/// `--toxicity`: a probability.
fn toxicity(given: &str) -> Result<f32, String> {
    given
        .parse::<f32>()
        .ok()
        .filter(|t| (0.0..=1.0).contains(t))
        .ok_or_else(|| format!("toxicity should be a number between 0 and 1, not `{given}`"))
}

/// Runs `lab proxy ...`.
pub async fn proxy(global: &Global, args: &ProxyArgs) -> Result<u8, Failure> {
    let url = session::toxiproxy_url(global)?
        .unwrap_or_else(|| format!("http://127.0.0.1:{}", DEFAULT_PORT_BASE + 4));
    let api = Api {
        client: ToxiproxyClient::new(&url),
        json: global.format == FormatArg::Json,
        color: session::color(global),
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
            ClientError::Unreachable { source, .. } if source.is_timeout() => Failure::environment(
                anyhow!("the Toxiproxy API at {api} did not answer in time; is it stuck?"),
            ),
            ClientError::Unreachable { .. } => Failure::environment(anyhow!(
                "cannot reach the Toxiproxy API at {api}: is `lab serve` running? Start it in \
                 another terminal (its API is on 127.0.0.1:8474, or on BASE+4 with --port-base \
                 BASE), or point --toxiproxy-url (or TOXIPROXY_URL) at a running Toxiproxy"
            )),
            ClientError::Status {
                status, message, ..
            } => {
                let (proxy, toxic) = match about {
                    Some(about) => (about.proxy, about.toxic.unwrap_or("")),
                    None => ("", ""),
                };
                match (status, message.as_str()) {
                    (404, "proxy not found") => Failure::usage(format!(
                        "no proxy `{proxy}` on {api} (`lab proxy list` shows them)"
                    )),
                    (404, "toxic not found") => Failure::usage(format!(
                        "proxy `{proxy}` has no toxic `{toxic}` (`lab proxy inspect {proxy}` \
                         shows them)"
                    )),
                    (409, "proxy already exists") => {
                        Failure::usage(format!("a proxy named `{proxy}` already exists on {api}"))
                    }
                    (409, "toxic already exists") => Failure::usage(format!(
                        "proxy `{proxy}` already has a toxic named `{toxic}`: change it with \
                         `lab proxy toxic update {proxy} -n {toxic} ...`, or name another with -n"
                    )),
                    (400..=499, _) => {
                        Failure::usage(format!("the Toxiproxy API at {api} refused: {message}"))
                    }
                    _ => Failure::environment(anyhow!(
                        "the Toxiproxy API at {api} failed ({status}): {message}"
                    )),
                }
            }
            ClientError::Body { reason, .. } => Failure::environment(anyhow!(
                "{api} answered something that is not the Toxiproxy API's: {reason}"
            )),
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
            } if message != "proxy not found" => Failure::environment(anyhow!(
                "{} has no one-shot faults: they are a lab extension, which `lab serve`'s API \
                 has and a real Toxiproxy does not (toxics work on both)",
                self.base()
            )),
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
        let toxic: Toxic = serde_json::from_value(wanted)
            .map_err(|e| Failure::usage(format!("cannot add a {} toxic: {e}", add.toxic_type)))?;
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
            return Err(Failure::usage(
                "nothing to update: give -a KEY=VALUE (repeatable) or --toxicity",
            ));
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
            return Err(Failure::usage(format!(
                "proxy `{}` has no toxic `{}` (`lab proxy inspect {}` shows them)",
                update.proxy, update.toxic_name, update.proxy
            )));
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
            let fault = Fault::from_name(kind, args.delay_ms)
                .map_err(|e| Failure::usage(format!("--kind {kind}: {e}")))?;
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
                "none".to_string()
            } else {
                known.keys().cloned().collect::<Vec<_>>().join(", ")
            };
            return Err(Failure::usage(format!(
                "a {} toxic has no attribute `{name}` (its attributes: {takes})",
                toxic.kind.type_name()
            )));
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
    fn attributes_are_numbers_when_numeric() {
        assert_eq!(
            attribute("latency=900").unwrap(),
            ("latency".into(), json!(900))
        );
        assert_eq!(
            attribute("jitter=-5").unwrap(),
            ("jitter".into(), json!(-5))
        );
        assert_eq!(attribute("rate=0.5").unwrap(), ("rate".into(), json!(0.5)));
        assert_eq!(
            attribute("mode=x=y").unwrap(),
            ("mode".into(), json!("x=y"))
        );
        assert!(attribute("latency").is_err());
        assert!(attribute("=900").is_err());
    }

    #[test]
    fn toxicity_is_a_probability() {
        assert_eq!(toxicity("0.5").unwrap(), 0.5);
        assert!(toxicity("1.5").is_err());
        assert!(toxicity("half").is_err());
    }

    /// Every type `-t` offers is one the proxy knows, and every fault has a description.
    #[test]
    fn offered_types_and_faults_exist() {
        for (name, _) in TOXIC_TYPES {
            let toxic: Toxic = serde_json::from_value(json!({"type": name})).unwrap();
            assert_eq!(toxic.kind.type_name(), name);
        }
        for name in Fault::NAMES {
            assert!(!fault_about(name).is_empty(), "{name} has no description");
        }
    }

    #[test]
    fn unknown_attributes_are_refused() {
        let toxic: Toxic = serde_json::from_value(json!({"type": "latency"})).unwrap();
        let mut given = Map::new();
        given.insert("latency".into(), json!(900));
        assert!(check_attribute_names(&toxic, &given).is_ok());
        given.insert("latecny".into(), json!(900));
        let error = check_attribute_names(&toxic, &given).unwrap_err();
        assert_eq!(error.code, exit::USAGE);
        assert!(error.error.to_string().contains("jitter, latency"));
    }
}
