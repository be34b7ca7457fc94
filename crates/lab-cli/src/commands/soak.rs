//! `lab soak chain`: many payments through the chain under seeded random faults, and how many
//! broke "one charge per key" (see `lab_scenarios::soak`).
//!
//! Every iteration is a fresh stage on one Redis (throwaway unless `--redis-url`), so iterations
//! cannot leak into each other and any one of them can be replayed alone from its seed. A
//! progress bar runs on stderr (on a terminal only); the summary table, and the seed and replay
//! line of every iteration that broke the invariant, go to stdout. With `--format json` each
//! iteration is a line of its own, then the summary.
//!
//! Exit codes: 0 when no iteration broke the invariant with the protections on, or whatever
//! happened with them off (there the violations are the demonstration); 1 (drift) when an
//! iteration charged twice with the protections on; 3 when Redis cannot be started or reached.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use indicatif::{ProgressBar, ProgressStyle};
use lab_infra::Needs;
use lab_scenarios::ScenarioError;
use lab_scenarios::soak::{self, Iteration};
use serde_json::json;

use lab_core::Msg;
use lab_scenarios::Library;

use crate::cli::{Protections, SoakTarget};
use crate::exit::{self, Failure};
use crate::session::{Format, Mode, Session, SessionOptions};
use crate::words::t;

/// How many violating iterations the text summary lists one by one.
const LISTED: usize = 20;

/// A seed when none is given: different on every call, and printed so the call can be repeated.
fn clock_seed() -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    soak::next_seed(now.as_nanos() as u64)
}

fn protections_name(protections: Protections) -> &'static str {
    match protections {
        Protections::On => "on",
        Protections::Off => "off",
    }
}

pub async fn soak(
    options: SessionOptions,
    library: Library,
    target: SoakTarget,
    iterations: u32,
    seed: Option<u64>,
    protections: Protections,
) -> Result<u8, Failure> {
    let SoakTarget::Chain = target;
    let session = Session::open(options, library, Mode::Headless);
    let seed = seed.unwrap_or_else(clock_seed);
    let on = protections == Protections::On;
    let needs = Needs {
        postgres: false,
        redis: true,
    };
    let bar = progress_bar(&session, iterations);
    let json = session.format() == Format::Json;
    let done = session
        .with_servers(
            needs,
            async |servers| Ok(iterate(servers, seed, iterations, on, json, &bar).await?),
            async |_, ended| {
                bar.finish_and_clear();
                ended.into_result()
            },
        )
        .await?;

    let violations: Vec<(usize, &Iteration)> = done
        .iter()
        .enumerate()
        .filter(|(_, i)| i.violation.is_some())
        .collect();
    if json {
        let seeds: Vec<u64> = violations.iter().map(|(_, i)| i.seed).collect();
        say!(
            "{}",
            json!({
                "event": "soak_summary",
                "target": "chain",
                "protections": protections_name(protections),
                "seed": seed,
                "iterations": done.len(),
                "violations": violations.len(),
                "violating_seeds": seeds,
            })
        );
    } else {
        print_summary(seed, protections, &done, &violations);
    }
    Ok(if on && !violations.is_empty() {
        exit::DRIFT
    } else {
        exit::OK
    })
}

/// Escape codes, like the spinner: only on a terminal, and not with --color never.
fn progress_bar(session: &Session, iterations: u32) -> ProgressBar {
    let bar = if session.color() {
        ProgressBar::new(u64::from(iterations))
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} · {msg} · {elapsed}")
            .expect("a valid template"),
    );
    bar.set_message(t(Msg::new("soak.violations").arg("count", 0usize)));
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// The iterations, one after the other, each from the seed after the last one's.
async fn iterate(
    servers: &lab_infra::Servers,
    seed: u64,
    iterations: u32,
    on: bool,
    json: bool,
    bar: &ProgressBar,
) -> Result<Vec<Iteration>, ScenarioError> {
    let mut done: Vec<Iteration> = Vec::new();
    let mut next = seed;
    for number in 0..iterations {
        let iteration = soak::iteration(servers, next, on).await?;
        if json {
            let mut line = serde_json::to_value(&iteration).unwrap_or_default();
            line["event"] = "soak_iteration".into();
            line["iteration"] = number.into();
            say!("{line}");
        }
        done.push(iteration);
        let violations = done.iter().filter(|i| i.violation.is_some()).count();
        bar.inc(1);
        bar.set_message(t(Msg::new("soak.violations").arg("count", violations)));
        next = soak::next_seed(next);
    }
    Ok(done)
}

fn print_summary(
    seed: u64,
    protections: Protections,
    done: &[Iteration],
    violations: &[(usize, &Iteration)],
) {
    let on = protections == Protections::On;
    let name = protections_name(protections);
    say!(
        "{}",
        t(Msg::new("soak.title")
            .arg("iterations", done.len())
            .arg("seed", seed.to_string())
            .arg("protections", name))
    );
    say!(
        "  {}",
        t(if on {
            "soak.design_on"
        } else {
            "soak.design_off"
        })
    );
    say!();
    let placed: usize = done.iter().map(|i| i.faults.len()).sum();
    let fired: usize = done.iter().map(|i| i.faults_fired).sum();
    let paid = done.iter().filter(|i| i.client_status == Some(200)).count();
    let calls: u64 = done.iter().map(|i| i.payments_calls).sum();
    let charges: usize = done.iter().map(|i| i.charges).sum();
    let rows = [
        ("soak.row_iterations", done.len().to_string()),
        ("soak.row_faults", format!("{placed} / {fired}")),
        ("soak.row_paid", paid.to_string()),
        ("soak.row_gave_up", (done.len() - paid).to_string()),
        ("soak.row_calls", calls.to_string()),
        ("soak.row_charges", charges.to_string()),
        ("soak.row_violations", violations.len().to_string()),
    ];
    for (what, value) in rows {
        say!("  {:<40} {value:>8}", t(what));
    }
    say!();
    if violations.is_empty() {
        say!("{}", t("soak.kept"));
        return;
    }
    print_violations(name, violations);
    say!();
    say!(
        "{}",
        t(if on {
            "soak.broke_on"
        } else {
            "soak.broke_off"
        })
    );
}

/// Each violating iteration (the first [`LISTED`]): its seed, its faults, and how to replay it.
fn print_violations(protections: &str, violations: &[(usize, &Iteration)]) {
    for (number, iteration) in violations.iter().take(LISTED) {
        let faults: Vec<String> = iteration.faults.iter().map(ToString::to_string).collect();
        say!(
            "  {}",
            t(Msg::new("soak.violation")
                .arg("number", *number)
                .arg("seed", iteration.seed.to_string())
                .arg(
                    "violation",
                    iteration.violation.as_deref().unwrap_or_default()
                ))
        );
        say!(
            "      {}",
            t(Msg::new("soak.faults").arg("faults", faults.join("; ")))
        );
        say!(
            "      {}",
            t(Msg::new("soak.replay")
                .arg("seed", iteration.seed.to_string())
                .arg("protections", protections))
        );
    }
    if violations.len() > LISTED {
        say!(
            "  {}",
            t(Msg::new("soak.more").arg("count", violations.len() - LISTED))
        );
    }
}
