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

use crate::cli::{FormatArg, Global, Protections, SoakTarget, exit};
use crate::session::{self, Failure, Guarded, Mode, Session};

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
    global: &Global,
    target: SoakTarget,
    iterations: u32,
    seed: Option<u64>,
    protections: Protections,
) -> Result<u8, Failure> {
    let SoakTarget::Chain = target;
    let session = Session::open(global, Mode::Headless)?;
    let seed = seed.unwrap_or_else(clock_seed);
    let on = protections == Protections::On;
    let servers = match session
        .start_servers(Needs {
            postgres: false,
            redis: true,
        })
        .await?
    {
        Ok(servers) => servers,
        Err(signal) => return Ok(session::interrupted(signal)),
    };

    // Escape codes, like the spinner: only on a terminal, and not with --color never.
    let bar = if session.color {
        ProgressBar::new(u64::from(iterations))
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} iterations · {msg} · {elapsed}")
            .expect("a valid template"),
    );
    bar.set_message("0 violations");
    bar.enable_steady_tick(Duration::from_millis(200));

    let json = session.format == FormatArg::Json;
    let work = async {
        let mut done: Vec<Iteration> = Vec::new();
        let mut next = seed;
        for number in 0..iterations {
            let iteration = soak::iteration(&servers, next, on).await?;
            if json {
                let mut line = serde_json::to_value(&iteration).unwrap_or_default();
                line["event"] = "soak_iteration".into();
                line["iteration"] = number.into();
                say!("{line}");
            }
            done.push(iteration);
            let violations = done.iter().filter(|i| i.violation.is_some()).count();
            bar.inc(1);
            bar.set_message(format!("{violations} violations"));
            next = soak::next_seed(next);
        }
        Ok::<_, ScenarioError>(done)
    };
    let outcome = session.guarded(work).await;
    bar.finish_and_clear();
    session.close(servers).await;
    let done = match outcome {
        Guarded::Finished(Ok(done)) => done,
        Guarded::Finished(Err(e)) => return Err(session::scenario_failure(e)),
        Guarded::Interrupted(signal) => return Ok(session::interrupted(signal)),
        Guarded::Quit => return Ok(session::quit()),
    };

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

fn print_summary(
    seed: u64,
    protections: Protections,
    done: &[Iteration],
    violations: &[(usize, &Iteration)],
) {
    let on = protections == Protections::On;
    say!(
        "lab soak chain: {} iterations from seed {seed}, protections {}",
        done.len(),
        protections_name(protections)
    );
    say!(
        "  {}",
        if on {
            "(orders passes the client's key down unchanged; the payment service guards keys; \
             the provider deduplicates by key)"
        } else {
            "(the broken design: orders mints a new key per attempt; no key guard; no \
             deduplication at the provider)"
        }
    );
    say!();
    let placed: usize = done.iter().map(|i| i.faults.len()).sum();
    let fired: usize = done.iter().map(|i| i.faults_fired).sum();
    let paid = done.iter().filter(|i| i.client_status == Some(200)).count();
    let calls: u64 = done.iter().map(|i| i.payments_calls).sum();
    let charges: usize = done.iter().map(|i| i.charges).sum();
    let rows = [
        (
            "iterations (one payment, one key each)",
            done.len().to_string(),
        ),
        ("faults placed / fired", format!("{placed} / {fired}")),
        ("client got 200", paid.to_string()),
        (
            "client gave up, outcome unknown",
            (done.len() - paid).to_string(),
        ),
        ("requests to the payment service", calls.to_string()),
        ("charges at the provider", charges.to_string()),
        (
            "violations (not one charge per key)",
            violations.len().to_string(),
        ),
    ];
    for (what, value) in rows {
        say!("  {what:<40} {value:>8}");
    }
    say!();
    if violations.is_empty() {
        say!("Every iteration kept one charge per key.");
        return;
    }
    for (number, iteration) in violations.iter().take(LISTED) {
        let faults: Vec<String> = iteration.faults.iter().map(ToString::to_string).collect();
        say!(
            "  iteration {number}, seed {}: {}",
            iteration.seed,
            iteration.violation.as_deref().unwrap_or_default()
        );
        say!("      faults: {}", faults.join("; "));
        say!(
            "      replay: lab soak chain --iterations 1 --seed {} --protections {}",
            iteration.seed,
            protections_name(protections)
        );
    }
    if violations.len() > LISTED {
        say!(
            "  … and {} more (--format json lists every one)",
            violations.len() - LISTED
        );
    }
    say!();
    say!(
        "{}",
        if on {
            "The invariant broke with the protections on: that is a bug (exit 1)."
        } else {
            "With the protections off these are the lesson's demonstration: a retry below a \
             lost answer charged again (exit 0)."
        }
    );
}
