//! `lab proxy`'s command line: toxiproxy-cli's subcommands, aliases and flags, and the lab's
//! one-shot faults (see `commands/proxy.rs` for what each does).

use clap::builder::{PossibleValue, PossibleValuesParser};
use clap::{ArgGroup, Args, Subcommand};
use faultproxy::Fault;
use serde_json::Value;

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
    pub proxy: String,
    /// The toxic's type
    #[arg(short = 't', long = "type", value_name = "TYPE",
          value_parser = PossibleValuesParser::new(toxic_types()))]
    pub toxic_type: String,
    /// The toxic's name [default: TYPE_STREAM, e.g. latency_downstream]
    #[arg(short = 'n', long = "toxicName", visible_alias = "toxic-name")]
    pub toxic_name: Option<String>,
    /// An attribute, e.g. latency=900 (repeat for several; see --type for each type's)
    #[arg(short = 'a', long = "attribute", value_name = "KEY=VALUE", value_parser = attribute)]
    pub attributes: Vec<(String, Value)>,
    /// On the upstream: the requests, client to server
    #[arg(short = 'u', long, conflicts_with = "downstream")]
    pub upstream: bool,
    /// On the downstream: the answers, server to client (the default)
    #[arg(short = 'd', long)]
    pub downstream: bool,
    /// The probability that the toxic applies to a connection, from 0 to 1 [default: 1]
    #[arg(long = "toxicity", visible_alias = "tox", value_name = "0..1", value_parser = toxicity)]
    pub toxicity: Option<f32>,
}

#[derive(Debug, Args)]
pub struct ToxicUpdate {
    /// The proxy, e.g. reports
    #[arg(value_name = "PROXY")]
    pub proxy: String,
    /// The toxic (`lab proxy inspect PROXY` shows them)
    #[arg(short = 'n', long = "toxicName", visible_alias = "toxic-name")]
    pub toxic_name: String,
    /// A new value for an attribute, e.g. latency=200 (repeat for several); the others stay
    #[arg(short = 'a', long = "attribute", value_name = "KEY=VALUE", value_parser = attribute)]
    pub attributes: Vec<(String, Value)>,
    /// A new probability that the toxic applies to a connection, from 0 to 1 [default: kept]
    #[arg(long = "toxicity", visible_alias = "tox", value_name = "0..1", value_parser = toxicity)]
    pub toxicity: Option<f32>,
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
    pub proxy: String,
    /// Arm this fault for the proxy's next --connections connections
    #[arg(long, value_name = "FAULT", value_parser = PossibleValuesParser::new(fault_kinds()))]
    pub kind: Option<String>,
    /// How many of the next connections get the fault
    #[arg(long, value_name = "N", default_value_t = 1, requires = "kind",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub connections: u32,
    /// slow_response's delay, in milliseconds (required there, refused elsewhere)
    #[arg(
        long,
        value_name = "MS",
        requires = "kind",
        required_if_eq("kind", "slow_response")
    )]
    pub delay_ms: Option<u64>,
    /// List the faults armed on the proxy, with their uses left and times fired
    #[arg(long)]
    pub list: bool,
    /// Disarm every fault of the proxy, those aimed at open connections included
    #[arg(long)]
    pub clear: bool,
}

/// The toxic types `-t` takes, with what they do and their attributes (as toxiproxy-cli's
/// `toxic` help lists them).
pub const TOXIC_TYPES: [(&str, &str); 8] = [
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
pub fn fault_about(name: &str) -> &'static str {
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

#[cfg(test)]
mod tests {
    use super::*;
    use faultproxy::Toxic;
    use serde_json::json;

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
}
