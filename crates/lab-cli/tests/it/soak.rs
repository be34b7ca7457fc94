//! `lab soak chain`: with the protections on no iteration charges twice (exit 0); with them off
//! some do, each with a seed that replays it alone; bad flags are usage errors.
//!
//! The iterations' faults come from the seed alone, so a fixed seed places the same faults every
//! run: seed 7's first 20 iterations include lost answers below orders, which the broken design
//! turns into second charges whatever the timing (a retry with a new key is a new payment).

use crate::common;

use common::{assert_code, run, stderr, stdout};
use serde_json::Value;

/// The JSON lines of a soak: its iterations, then its summary.
fn soak(args: &[&str]) -> (Vec<Value>, Value, std::process::Output) {
    let mut all = vec!["soak", "chain", "--format", "json"];
    all.extend_from_slice(args);
    let out = run(&all);
    let mut lines: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line is JSON"))
        .collect();
    let summary = lines.pop().expect("a summary line");
    assert_eq!(summary["event"], "soak_summary", "{}", stderr(&out));
    (lines, summary, out)
}

#[test]
fn with_the_protections_on_no_iteration_charges_twice() {
    let (iterations, summary, out) = soak(&["--iterations", "20", "--seed", "7"]);
    assert_code(&out, 0);
    assert_eq!(iterations.len(), 20);
    assert_eq!(summary["protections"], "on");
    assert_eq!(summary["violations"], 0, "{summary}");
    let fired: u64 = iterations
        .iter()
        .map(|i| i["faults_fired"].as_u64().unwrap())
        .sum();
    assert!(fired > 0, "faults really happened");
    for iteration in &iterations {
        assert!(iteration["charges"].as_u64().unwrap() <= 1, "{iteration}");
    }
}

#[test]
fn with_the_protections_off_some_iterations_charge_twice_and_replay_alone() {
    let (iterations, summary, out) =
        soak(&["--iterations", "20", "--seed", "7", "--protections", "off"]);
    assert_code(&out, 0);
    assert_eq!(iterations.len(), 20);
    let seeds: Vec<u64> = summary["violating_seeds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_u64().unwrap())
        .collect();
    assert!(!seeds.is_empty(), "the broken design broke: {summary}");
    assert_eq!(summary["violations"], seeds.len());

    // The first violating iteration, alone from its seed: the same faults, the same violation.
    let seed = seeds[0].to_string();
    let (alone, replay, out) =
        soak(&["--iterations", "1", "--seed", &seed, "--protections", "off"]);
    assert_code(&out, 0);
    assert_eq!(replay["violations"], 1, "{replay}");
    let original = iterations
        .iter()
        .find(|i| i["seed"].as_u64() == Some(seeds[0]))
        .unwrap();
    assert_eq!(alone[0]["faults"], original["faults"]);

    // The text summary names the seed and the line that replays it.
    let out = run(&[
        "soak",
        "chain",
        "--iterations",
        "1",
        "--seed",
        &seed,
        "--protections",
        "off",
    ]);
    assert_code(&out, 0);
    let text = stdout(&out);
    assert!(
        text.contains(&format!(
            "replay: lab soak chain --iterations 1 --seed {seed} --protections off"
        )),
        "{text}"
    );
}

#[test]
fn bad_soak_flags_are_usage_errors() {
    for args in [
        &["soak", "chain", "--iterations", "0"][..],
        &["soak", "chain", "--seed", "-1"],
        &["soak", "chain", "--protections", "maybe"],
        &["soak", "nothing"],
    ] {
        assert_code(&run(args), 2);
    }
}
