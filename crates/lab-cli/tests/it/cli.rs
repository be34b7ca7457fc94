//! The command line as a user meets it: flags, exit codes, languages, colours, JSON, step mode.

use crate::common;

use std::io::Write;
use std::process::Stdio;

use common::{assert_code, catalogue, lab, run, scenarios_dir, stderr, stdout};
use serde_json::Value;

#[test]
fn list_names_every_scenario_with_a_summary() {
    let out = run(&["list", "--lang", "en"]);
    assert_code(&out, 0);
    let text = stdout(&out);
    let names = catalogue();
    assert!(names.len() >= 6, "{names:?}");
    for (line, name) in text.lines().zip(&names) {
        assert!(line.starts_with(&format!("{name} ")), "{line}");
        assert!(line.len() > name.len() + 10, "no summary: {line}");
    }
    assert_eq!(text.lines().count(), names.len(), "{text}");
    assert!(!text.contains('⟦'), "a text is missing: {text}");
}

#[test]
fn usage_errors_exit_2_with_a_message() {
    let out = run(&["run", "no-such-scenario"]);
    assert_code(&out, 2);
    assert!(
        stderr(&out).contains("unknown scenario `no-such-scenario`"),
        "{}",
        stderr(&out)
    );

    assert_code(&run(&["run"]), 2);
    assert_code(&run(&["--no-such-flag", "list"]), 2);
    assert_code(&run(&["list", "--lang", "fr"]), 2);

    let out = run(&["run", "duplicate", "--database-url", "mysql://localhost/x"]);
    assert_code(&out, 2);
    assert!(
        stderr(&out).contains("invalid PostgreSQL URL"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn help_documents_the_exit_codes() {
    let out = run(&["--help"]);
    assert_code(&out, 0);
    let help = stdout(&out);
    for line in ["Exit codes:", "  0 ", "  1 ", "  2 ", "  3 ", "  130 "] {
        assert!(help.contains(line), "--help lacks `{line}`:\n{help}");
    }
}

/// The subcommands a `--help` lists under "Commands:" (without clap's own `help`).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        // A visible alias is listed as `list, ls`.
        .map(|name| name.trim_end_matches(',').to_string())
        .filter(|name| name != "help")
        .collect()
}

/// Every command's `--help`, and every subcommand's under it (`lab proxy toxic add`), ends with
/// examples: what to type, and what it does.
#[test]
fn every_command_has_examples_in_its_help() {
    let mut queue: Vec<Vec<String>> = vec![vec![]];
    let mut seen = 0;
    while let Some(path) = queue.pop() {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let out = run(&args);
        assert_code(&out, 0);
        let help = stdout(&out);
        assert!(
            help.lines().any(|l| l.starts_with("Examples")),
            "`lab {}` has no Examples section:\n{help}",
            args.join(" ")
        );
        let example = format!("  lab {}", path.join(" "));
        assert!(
            help.contains(example.trim_end()),
            "`lab {}`'s examples do not show it:\n{help}",
            args.join(" ")
        );
        for sub in subcommands(&help) {
            queue.push(path.iter().cloned().chain([sub]).collect());
        }
        seen += 1;
    }
    // lab, 9 commands, proxy's 7, toxic's 3.
    assert!(seen >= 20, "only {seen} commands found");
}

/// Every scenario's JSON output ends with its summary, whose facts are the ones its
/// `expected.json` (the single copy of its contract) names, measured.
#[test]
fn json_output_ends_with_the_summary_of_expected_json() {
    let names = catalogue();
    let out = run(&["run", "all", "--format", "json"]);
    assert_code(&out, 0);
    let lines: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line is JSON"))
        .collect();
    // One scenario's events run from its "start" to its "summary".
    let runs: Vec<&[Value]> = lines.split_inclusive(|l| l["event"] == "summary").collect();
    assert_eq!(runs.len(), names.len());
    for (name, events) in names.iter().zip(runs) {
        let summary = events.last().unwrap();
        assert_eq!(summary["event"], "summary");
        assert_eq!(summary["scenario"], name.as_str());
        assert_eq!(summary["passed"], true);
        let file = scenarios_dir().join(name).join("expected.json");
        let expected: Value =
            serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        let expected = &expected["facts"];
        assert!(
            !expected.as_object().unwrap().is_empty(),
            "{name}: no facts"
        );
        assert_eq!(&summary["expected"], expected, "{name}");
        assert_eq!(&summary["facts"], expected, "{name}");
        let keys: Vec<&String> = summary.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["event", "scenario", "facts", "expected", "passed"]);
        assert!(events.iter().any(|l| l["event"] == "predict"), "{name}");
        assert!(events.iter().any(|l| l["event"] == "reveal"), "{name}");
    }
}

/// Every text and argument of every scenario is there in both languages. `lab check` (see
/// `check.rs`) proves that today's runs render exactly the expected narratives, so reading those
/// is reading the runs.
#[test]
fn both_languages_render_without_missing_texts() {
    let narrative = |name: &str, lang: &str| {
        let file = scenarios_dir()
            .join(name)
            .join(format!("expected.{lang}.txt"));
        std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
    };
    for name in catalogue() {
        let (en, ru) = (narrative(&name, "en"), narrative(&name, "ru"));
        assert!(en.contains("Check your understanding"), "{name}: {en}");
        assert!(ru.contains("Проверь понимание"), "{name}: {ru}");
        for text in [&en, &ru] {
            assert!(
                !text.contains('⟦'),
                "{name}: a text or argument is missing:\n{text}"
            );
        }
    }
    // LAB_LANG and LANG choose the default.
    let by_env = stdout(&lab(&["list"]).env("LANG", "ru_RU.UTF-8").output().unwrap());
    assert!(by_env.contains("отчёт"), "{by_env}");
    let by_lab_lang = stdout(
        &lab(&["list"])
            .env("LANG", "ru_RU.UTF-8")
            .env("LAB_LANG", "en")
            .output()
            .unwrap(),
    );
    assert!(by_lab_lang.contains("report"), "{by_lab_lang}");
}

#[test]
fn colour_follows_flags_and_no_color() {
    let escape = "\x1b[";
    let always = stdout(&run(&["run", "duplicate", "--color", "always"]));
    assert!(always.contains(escape), "--color always must colour");
    let never = stdout(&run(&["run", "duplicate", "--color", "never"]));
    assert!(!never.contains(escape));
    // auto, not a terminal, NO_COLOR set: no escape codes anywhere.
    let out = lab(&["run", "duplicate"])
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    assert!(!stdout(&out).contains(escape) && !stderr(&out).contains(escape));
    assert_eq!(stdout(&out), never, "auto without a terminal is plain text");
}

#[test]
fn step_mode_with_piped_enters_completes_and_says_the_same() {
    let plain = stdout(&run(&["run", "duplicate", "--lang", "en"]));
    let mut child = lab(&["run", "duplicate", "--lang", "en", "--step"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // What `yes '' | lab run duplicate --step` sends: more Enters than there are pauses.
    let mut stdin = child.stdin.take().unwrap();
    let _ = stdin.write_all("\n".repeat(500).as_bytes());
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert_code(&out, 0);
    assert_eq!(
        stdout(&out),
        plain,
        "prompts go to stderr; the narrative is unchanged"
    );
    let prompts = stderr(&out).matches("Enter").count();
    assert!(prompts >= 10, "step mode paused only {prompts} times");
}

#[test]
fn step_mode_records_the_learners_prediction() {
    let mut child = lab(&[
        "run",
        "duplicate",
        "--lang",
        "en",
        "--step",
        "--format",
        "json",
    ])
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    // Six steps and one pause inside the report service, then the prediction: answer b.
    let mut stdin = child.stdin.take().unwrap();
    let _ = stdin.write_all(b"\n\n\n\n\n\n\nb\n");
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert_code(&out, 0);
    assert!(
        stdout(&out).contains(r#"{"event":"learner_answer","answer":"b"}"#),
        "{}",
        stdout(&out)
    );
}

#[test]
fn missing_server_programs_give_one_line_and_exit_3() {
    // Without a terminal nothing is offered: the error, its one command, and exit 3 before
    // anything ran.
    let out = lab(&["run", "duplicate"])
        .env("PATH", "/nonexistent")
        .env("LAB_SERVERS_DIR", "/nonexistent")
        .output()
        .unwrap();
    assert_code(&out, 3);
    let err = stderr(&out);
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains("not found"), "{err}");
    assert!(
        err.contains("--database-url") && err.contains("docker compose up -d"),
        "{err}"
    );
    // No python3 or uv on this PATH: the OS's package is the advice.
    assert!(err.contains("`apt-get install postgresql`"), "{err}");
}

#[test]
fn an_unreachable_server_is_an_environment_error() {
    // Port 1 on loopback: nothing listens there.
    let out = run(&[
        "run",
        "duplicate",
        "--database-url",
        "postgresql://postgres@127.0.0.1:1/x",
    ]);
    assert_code(&out, 3);
    assert!(
        stderr(&out).contains("cannot reach PostgreSQL"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn doctor_reports_what_would_be_used() {
    let out = run(&["doctor"]);
    assert_code(&out, 0);
    let text = stdout(&out);
    assert!(
        text.contains("PostgreSQL") && text.contains("throwaway"),
        "{text}"
    );
    assert!(text.contains("duplicate"), "{text}");

    // No server anywhere: none on PATH, none installed by `lab servers install`.
    let out = lab(&["doctor"])
        .env("PATH", "/nonexistent")
        .env("LAB_SERVERS_DIR", "/nonexistent")
        .output()
        .unwrap();
    assert_code(&out, 3);
    assert!(stdout(&out).contains("MISSING"), "{}", stdout(&out));
}

/// Where doctor finds Redis, in order: `LAB_REDIS_SERVER` (the only place when set), then
/// `redis-server` or Valkey's `valkey-server` on `PATH`; and each server it lacks gets the one
/// command that brings it. (The Python environment's servers, which come between, are tested on
/// an installed wheel by scripts/test-wheel.)
#[test]
fn doctor_says_where_each_server_comes_from_and_how_to_get_a_missing_one() {
    let redis = lab_infra::binaries::redis_program()
        .expect("a Redis server program")
        .path;
    let dir = tempfile::tempdir().unwrap();
    let valkey = dir.path().join("valkey-server");
    std::os::unix::fs::symlink(&redis, &valkey).unwrap();

    let doctor = |path: &std::ffi::OsStr, variable: Option<&std::path::Path>| {
        let mut command = lab(&["doctor"]);
        // Nothing from `lab servers install`: only PATH and the variable.
        command
            .env("PATH", path)
            .env("LAB_SERVERS_DIR", "/nonexistent");
        if let Some(program) = variable {
            command.env("LAB_REDIS_SERVER", program);
        }
        command.output().unwrap()
    };
    let line = |out: &std::process::Output, server: &str| {
        stdout(out)
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(server))
            .unwrap_or_default()
            .to_string()
    };

    // Valkey under its own name on PATH; no PostgreSQL anywhere.
    let out = doctor(dir.path().as_os_str(), None);
    assert_code(&out, 3);
    let found = line(&out, "Redis");
    assert!(
        found.starts_with("  ok")
            && found.contains(&format!("{}", valkey.display()))
            && found.ends_with("from PATH"),
        "{found}"
    );
    assert!(
        line(&out, "PostgreSQL").contains("MISSING"),
        "{}",
        stdout(&out)
    );
    assert!(
        stdout(&out).contains("No PostgreSQL to use: `apt-get install postgresql` gets one"),
        "{}",
        stdout(&out)
    );

    // The variable names the program, PATH has none.
    let out = doctor("/nonexistent".as_ref(), Some(&redis));
    let found = line(&out, "Redis");
    assert!(
        found.starts_with("  ok") && found.ends_with("from LAB_REDIS_SERVER"),
        "{found}"
    );

    // When set, the variable is the only place looked at: a wrong one is not papered over by
    // PATH, and the hint says how to get one.
    let out = doctor(
        dir.path().as_os_str(),
        Some(&dir.path().join("nothing-here")),
    );
    assert!(line(&out, "Redis").contains("MISSING"), "{}", stdout(&out));
    assert!(
        stdout(&out).contains(
            "No Redis to use: `apt-get install redis-server` gets one, or pass --redis-url"
        ),
        "{}",
        stdout(&out)
    );
}

/// `--quiz` asks each prediction, reads a letter from stdin, grades it, and prints the score;
/// the reveal says which option was right and whether the learner's was.
#[test]
fn a_quiz_with_piped_answers_prints_a_score() {
    let mut child = lab(&[
        "run",
        "duplicate",
        "lease",
        "--quiz",
        "--lang",
        "en",
        "--color",
        "never",
    ])
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    // duplicate's right answer is c; lease asks two predictions: d is right, then b is wrong.
    child.stdin.take().unwrap().write_all(b"c\nd\nb\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_code(&out, 0);
    let text = stdout(&out);
    assert!(text.contains("Your answer, c: right."), "{text}");
    assert!(text.contains("Your answer, b: not this one."), "{text}");
    assert!(text.contains("Predictions: 2 of 3 right."), "{text}");
}

/// `--set` runs with a knob changed, and says which facts differ from the default run.
#[test]
fn a_knob_changes_facts_and_says_so() {
    let out = run(&[
        "run",
        "timeout",
        "--set",
        "client_timeout_ms=2000",
        "--lang",
        "en",
        "--format",
        "json",
    ]);
    assert_code(&out, 0);
    let summary: Value = serde_json::from_str(stdout(&out).lines().last().unwrap()).unwrap();
    assert_eq!(summary["settings"]["client_timeout_ms"], "2000");
    assert_eq!(
        summary["facts"]["first_outcome"], "ok",
        "no timeout with a patient client"
    );
    assert_eq!(summary["expected"]["first_outcome"], "unknown");
    let text = stdout(&run(&[
        "run",
        "timeout",
        "--set",
        "client_timeout_ms=2000",
        "--lang",
        "en",
    ]));
    assert!(text.contains("differ from the default run"), "{text}");
    assert_code(&run(&["run", "timeout", "--set", "no_such_knob=1"]), 2);
    assert_code(
        &run(&["run", "timeout", "--set", "client_timeout_ms=soon"]),
        2,
    );
    let knobs = stdout(&run(&["list", "--knobs", "--lang", "en"]));
    assert!(knobs.contains("--set client_timeout_ms=150"), "{knobs}");
}

/// Shell completions come from the same command definition as `--help`.
#[test]
fn completions_are_printed_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let out = run(&["completions", shell]);
        assert_code(&out, 0);
        assert!(stdout(&out).contains("check"), "{shell}");
    }
    assert_code(&run(&["completions", "tcsh"]), 2);
}
