//! `lab exercise`: the learner's program started, attacked and judged; everything it started
//! stopped on every way out.
//!
//! The tests that need the lesson's Python stack (FastAPI, SQLAlchemy, psycopg, uvicorn) are
//! `#[ignore]`d, so a machine without it shows them as ignored; `.ci/run` creates the venv and
//! runs them with `LAB_EXERCISE_VENV` set. The others use only the machine's `sh` and
//! `python3` (its standard library).

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{assert_code, lab, processes_in, shared_tempdir, stderr, stdout};

/// A folder with a manifest for `report-api` whose program is `command`.
fn project(dir: &Path, command: &[&str], extra: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let command: Vec<String> = command.iter().map(|c| format!("{c:?}")).collect();
    std::fs::write(
        dir.join("lab-exercise.toml"),
        format!(
            "exercise = \"report-api\"\nlang = \"python\"\ncommand = [{}]\n{extra}",
            command.join(", ")
        ),
    )
    .unwrap();
}

#[test]
fn start_writes_a_starter_and_never_writes_over_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("mine");
    let dir_arg = dir.to_str().unwrap();
    let out = lab(&["exercise", "start", "report-api", dir_arg])
        .output()
        .unwrap();
    assert_code(&out, 0);
    for file in [
        "app.py",
        "requirements.txt",
        "lab-exercise.toml",
        "README.md",
        "README.ru.md",
        "schema.sql",
    ] {
        assert!(dir.join(file).exists(), "{file} written");
    }
    let app = std::fs::read_to_string(dir.join("app.py")).unwrap();
    assert!(
        app.contains("TODO(1)") && app.contains("TODO(2)"),
        "the TODOs are where the lesson is"
    );
    assert!(
        stdout(&out).contains("pip install -r requirements.txt"),
        "{}",
        stdout(&out)
    );

    // Again into the same folder: refused, the learner's work untouched.
    std::fs::write(dir.join("app.py"), "# my work\n").unwrap();
    let again = lab(&["exercise", "start", "report-api", dir_arg])
        .output()
        .unwrap();
    assert_code(&again, 2);
    assert!(
        stderr(&again).contains("never writes over"),
        "{}",
        stderr(&again)
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("app.py")).unwrap(),
        "# my work\n"
    );

    // The solution goes beside it, and the Rust starter has its manifest and its TODOs.
    let solution = lab(&["exercise", "solution", "report-api", dir_arg])
        .output()
        .unwrap();
    assert_code(&solution, 0);
    let solved = std::fs::read_to_string(tmp.path().join("mine-solution/app.py")).unwrap();
    assert!(solved.contains("ON CONFLICT (idempotency_key) DO NOTHING"));
    assert_eq!(
        std::fs::read_to_string(dir.join("app.py")).unwrap(),
        "# my work\n"
    );
    let rust = tmp.path().join("rusty");
    let out = lab(&[
        "exercise",
        "start",
        "report-api",
        rust.to_str().unwrap(),
        "--in",
        "rust",
    ])
    .output()
    .unwrap();
    assert_code(&out, 0);
    assert!(
        std::fs::read_to_string(rust.join("src/main.rs"))
            .unwrap()
            .contains("TODO(2)")
    );
    assert!(
        std::fs::read_to_string(rust.join("lab-exercise.toml"))
            .unwrap()
            .contains("cargo")
    );
}

#[test]
fn usage_errors_are_clear() {
    let unknown = lab(&["exercise", "start", "no-such"]).output().unwrap();
    assert_code(&unknown, 2);
    assert!(
        stderr(&unknown).contains("no exercise named `no-such`"),
        "{}",
        stderr(&unknown)
    );
    let lang = lab(&["exercise", "start", "report-api", "--in", "cobol"])
        .output()
        .unwrap();
    assert_code(&lang, 2);
    assert!(stderr(&lang).contains("python, rust"), "{}", stderr(&lang));
    let tmp = tempfile::tempdir().unwrap();
    let empty = lab(&[
        "exercise",
        "check",
        "report-api",
        tmp.path().to_str().unwrap(),
    ])
    .output()
    .unwrap();
    assert_code(&empty, 2);
    assert!(
        stderr(&empty).contains("lab-exercise.toml"),
        "{}",
        stderr(&empty)
    );
    let keep = lab(&["exercise", "check", "report-api", "--keep"])
        .output()
        .unwrap();
    assert_code(&keep, 2);
    assert!(
        stderr(&keep).contains("`lab exercise` always removes its run's"),
        "{}",
        stderr(&keep)
    );
    let only = lab(&["exercise", "check", "report-api", "--only", "nope"])
        .output()
        .unwrap();
    assert_code(&only, 2);
    assert!(
        stderr(&only).contains("has no check `nope`"),
        "{}",
        stderr(&only)
    );
}

#[test]
fn list_and_hints_speak_both_languages() {
    let list = lab(&["exercise", "list"]).output().unwrap();
    assert_code(&list, 0);
    assert!(
        stdout(&list).contains("report-api") && stdout(&list).contains("lesson 6"),
        "{}",
        stdout(&list)
    );
    let ru = lab(&["exercise", "list", "--lang", "ru"]).output().unwrap();
    assert!(stdout(&ru).contains("урок 6"), "{}", stdout(&ru));
    for level in ["1", "2", "3"] {
        let hint = lab(&["exercise", "hint", "report-api", "--level", level])
            .output()
            .unwrap();
        assert_code(&hint, 0);
        assert!(
            !stdout(&hint).contains('⟦'),
            "hint {level}: {}",
            stdout(&hint)
        );
    }
    // The levels climb: the second names the idea, only the third spells the SQL.
    let hint = |level: &str, lang: &str| {
        let out = lab(&[
            "exercise",
            "hint",
            "report-api",
            "--level",
            level,
            "--lang",
            lang,
        ])
        .output()
        .unwrap();
        assert_code(&out, 0);
        stdout(&out)
    };
    let idea = hint("2", "en");
    assert!(
        idea.contains("UNIQUE index") && !idea.contains("ON CONFLICT"),
        "{idea}"
    );
    let sql = hint("3", "en");
    assert!(sql.contains("ON CONFLICT (idempotency_key)"), "{sql}");
    let idea_ru = hint("2", "ru");
    assert!(idea_ru.contains("уникальный индекс"), "{idea_ru}");
}

#[test]
fn a_program_that_exits_at_once_is_shown_and_undecided() {
    let tmp = shared_tempdir();
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("ex");
    project(
        &dir,
        &[
            "sh",
            "-c",
            "echo 'Traceback: no module named fastapi' >&2; exit 3",
        ],
        "",
    );
    let out = lab(&["exercise", "check", "report-api", dir.to_str().unwrap()])
        .env("TMPDIR", tmp.path())
        .output()
        .unwrap();
    assert_code(&out, 4);
    let said = stdout(&out);
    assert!(
        said.contains("exited") && said.contains("no module named fastapi"),
        "{said}"
    );
}

#[test]
fn a_program_that_never_answers_is_stopped_with_its_group() {
    let tmp = shared_tempdir();
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("ex");
    // A shell with a child: both must go when the lab gives up on them.
    project(
        &dir,
        &["sh", "-c", "sleep 600 & echo listening, honestly; wait"],
        "start_timeout_secs = 1\n",
    );
    let out = lab(&["exercise", "check", "report-api", dir.to_str().unwrap()])
        .env("TMPDIR", tmp.path())
        .output()
        .unwrap();
    assert_code(&out, 4);
    assert!(
        stdout(&out).contains("did not answer") && stdout(&out).contains("listening, honestly"),
        "{}",
        stdout(&out)
    );
    assert_eq!(
        processes_in(&dir),
        Vec::<String>::new(),
        "the program's group is gone"
    );
}

/// A program that answers every request (python3's own http.server: 404s and 501s), so the
/// checks run; with `--only crash` the lab waits for a commit that never comes.
fn answering_program(dir: &Path) {
    project(
        dir,
        &[
            "sh",
            "-c",
            "exec python3 -m http.server --bind 127.0.0.1 \"$PORT\"",
        ],
        "",
    );
}

/// Starts `lab` with `args` (TMPDIR `tmp`) and returns once `program` (a name and arguments)
/// runs in `dir`: not merely a shell whose script names it, nor the lab, whose command line
/// names the folder too.
fn lab_with_program_up(
    args: &[&str],
    tmp: &Path,
    dir: &Path,
    program: &str,
) -> std::process::Child {
    let child = lab(args)
        .env("TMPDIR", tmp)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    // "<pid> <command line>": the program's name (a shim such as pyenv's execs it by its whole
    // path), then its arguments.
    let (name, args) = program.split_once(' ').unwrap_or((program, ""));
    let runs = |process: &String| {
        let command = process.split_once(' ').map_or("", |(_, command)| command);
        let (path, rest) = command.split_once(' ').unwrap_or((command, ""));
        Path::new(path).file_name().is_some_and(|n| n == name) && rest.starts_with(args)
    };
    while !processes_in(dir).iter().any(runs) {
        assert!(Instant::now() < deadline, "the program never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

#[test]
fn a_check_can_fail_and_say_how_in_json_and_junit() {
    let tmp = shared_tempdir();
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("ex");
    answering_program(&dir);
    let out = lab(&[
        "exercise",
        "check",
        "report-api",
        dir.to_str().unwrap(),
        "--only",
        "replay",
        "--only",
        "no-key",
        "--format",
        "json",
    ])
    .env("TMPDIR", tmp.path())
    .output()
    .unwrap();
    assert_code(&out, 1);
    let lines: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(
        lines.len(),
        3,
        "one object per check, and one that ends the run"
    );
    assert_eq!(lines[2]["ended"], "done");
    assert_eq!(lines[2]["summary"]["failed"], 2);
    assert_eq!(lines[0]["check"], "replay");
    assert_eq!(lines[0]["verdict"], "fail");
    assert!(
        lines[0]["reason"].as_str().unwrap().contains("501"),
        "{}",
        lines[0]
    );
    assert!(
        lines[0]["replay"]
            .as_str()
            .unwrap()
            .ends_with("--only replay")
    );
    let state = std::fs::read_to_string(dir.join(".lab-exercise-state.json")).unwrap();
    assert!(state.contains("\"replay\": \"fail\""), "{state}");

    let junit = lab(&[
        "exercise",
        "check",
        "report-api",
        dir.to_str().unwrap(),
        "--only",
        "replay",
        "--format",
        "junit",
    ])
    .env("TMPDIR", tmp.path())
    .output()
    .unwrap();
    assert_code(&junit, 1);
    let xml = stdout(&junit);
    assert!(
        xml.contains("<testcase name=\"replay\"") && xml.contains("<failure"),
        "{xml}"
    );
    assert_eq!(processes_in(&dir), Vec::<String>::new());
}

#[test]
fn ctrl_c_in_the_middle_of_a_check_leaves_nothing_running() {
    let tmp = shared_tempdir();
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("ex");
    answering_program(&dir);
    let args = [
        "exercise",
        "check",
        "report-api",
        dir.to_str().unwrap(),
        "--only",
        "crash",
    ];
    // The program is up (the lab is waiting for a commit that never comes): interrupt now.
    let mut child = lab_with_program_up(&args, tmp.path(), &dir, "python3 -m http.server");
    common::interrupt(&child);
    assert_eq!(child.wait().unwrap().code(), Some(130));
    assert_eq!(
        processes_in(&dir),
        Vec::<String>::new(),
        "the program is gone"
    );
    lab_testkit::assert_nothing_left(tmp.path(), "after Ctrl-C");
}

// ─── With the lesson's Python stack ─────────────────────────────────────────────────────────

/// The venv with the exercise's requirements (`.ci/run` makes it).
fn venv() -> PathBuf {
    PathBuf::from(std::env::var("LAB_EXERCISE_VENV").expect(
        "LAB_EXERCISE_VENV: a venv with exercises/report-api/python/*/requirements.txt installed",
    ))
}

/// The reference solution (or the starter) written out, with the venv linked in.
fn python_project(tmp: &Path, side: &str) -> PathBuf {
    let dir = tmp.join(side);
    let verb = if side == "solution" {
        "solution"
    } else {
        "start"
    };
    let base = tmp.join("report-api");
    let out = lab(&["exercise", verb, "report-api", base.to_str().unwrap()])
        .output()
        .unwrap();
    assert_code(&out, 0);
    let written = if side == "solution" {
        tmp.join("report-api-solution")
    } else {
        base
    };
    std::fs::rename(&written, &dir).unwrap();
    std::os::unix::fs::symlink(venv(), dir.join(".venv")).unwrap();
    dir
}

fn check_verdicts(dir: &Path, tmp: &Path, extra: &[&str]) -> (i32, Vec<(String, String)>, String) {
    let mut args = vec![
        "exercise",
        "check",
        "report-api",
        dir.to_str().unwrap(),
        "--format",
        "json",
        "--seed",
        "11",
    ];
    args.extend_from_slice(extra);
    let out = lab(&args).env("TMPDIR", tmp).output().unwrap();
    let verdicts = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("check").is_some())
        .map(|v| {
            (
                v["check"].as_str().unwrap().to_string(),
                v["verdict"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    (out.status.code().unwrap_or(-1), verdicts, stdout(&out))
}

/// `lab exercise watch report-api DIR --only CHECK...` (TMPDIR `tmp`), its keys on a pipe, and
/// the lines of its stdout as they come.
fn watching(
    dir: &Path,
    tmp: &Path,
    only: &[&str],
) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    let mut args = vec!["exercise", "watch", "report-api", dir.to_str().unwrap()];
    for check in only {
        args.extend(["--only", check]);
    }
    let mut child = lab(&args)
        .env("TMPDIR", tmp)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (lines, seen) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    (child, seen)
}

/// The report-api solution with its INSERT ... ON CONFLICT replaced by the classic check first:
/// a SELECT for the key, then an INSERT. It passes everything but `race`.
fn select_then_insert(work: &Path) -> PathBuf {
    let dir = python_project(work, "solution");
    let app = std::fs::read_to_string(dir.join("app.py")).unwrap();
    let start = app.find("        # The UNIQUE index decides").unwrap();
    let end = app.find("    if stored.payload_hash != digest:").unwrap();
    let naive = "        stored = conn.execute(\n            text(\"SELECT id, payload_hash FROM reports WHERE idempotency_key = :key\"), {\"key\": key}\n        ).one_or_none()\n        if stored is None:\n            report_id = conn.execute(\n                text(\"INSERT INTO reports (task_id, report_type, idempotency_key, payload_hash) VALUES (:task, :type, :key, :hash) RETURNING id\"),\n                {\"task\": body.task_id, \"type\": body.report_type, \"key\": key, \"hash\": digest},\n            ).scalar_one()\n            return JSONResponse(status_code=201, content={\"report_id\": report_id, \"replayed\": False})\n\n";
    std::fs::write(
        dir.join("app.py"),
        format!("{}{naive}{}", &app[..start], &app[end..]),
    )
    .unwrap();
    dir
}

#[test]
#[ignore = "needs LAB_EXERCISE_VENV (the lesson's Python stack); .ci/run sets it"]
fn watch_runs_the_check_that_failed_last_first() {
    use std::io::Write as _;
    let tmp = shared_tempdir();
    let work = tempfile::tempdir().unwrap();
    let dir = select_then_insert(work.path());
    let (mut child, seen) = watching(&dir, tmp.path(), &["replay", "race"]);
    // The verdict lines of one run, in the order they came ("  pass replay ...").
    let verdicts = |seen: &std::sync::mpsc::Receiver<String>| {
        let mut order = Vec::new();
        loop {
            let line = seen
                .recv_timeout(Duration::from_secs(90))
                .expect("a check run ends");
            if line.contains("passed,") {
                return order;
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            if let [verdict, name, ..] = words[..]
                && line.starts_with("  ")
                && !line.starts_with("   ")
                && (name == "replay" || name == "race")
            {
                order.push(format!("{verdict} {name}"));
            }
        }
    };
    // The exercise's order first: replay passes, race fails.
    assert_eq!(verdicts(&seen), vec!["pass replay", "fail race"]);
    // A save: the check that failed runs first now, and still fails; replay still passes.
    let app = std::fs::read_to_string(dir.join("app.py")).unwrap();
    std::fs::write(dir.join("app.py"), format!("{app}\n# saved again\n")).unwrap();
    assert_eq!(verdicts(&seen), vec!["fail race", "pass replay"]);
    let mut keys = child.stdin.take().unwrap();
    keys.write_all(b"q\n").unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0));
    lab_testkit::assert_nothing_left(tmp.path(), "after watch");
}

#[test]
#[ignore = "needs LAB_EXERCISE_VENV (the lesson's Python stack); .ci/run sets it"]
fn a_select_then_insert_is_caught_with_its_name() {
    let tmp = shared_tempdir();
    let work = tempfile::tempdir().unwrap();
    let dir = select_then_insert(work.path());
    let (code, verdicts, said) = check_verdicts(&dir, tmp.path(), &["--only", "race"]);
    assert_eq!(code, 1, "{said}");
    assert_eq!(verdicts, vec![("race".to_string(), "fail".to_string())]);
    // The loser's 500 is named, with what its answer said, and the race was forced: both
    // requests waited for the lab's transaction. Which client loses is the database's choice
    // once the lab lets go (both go on at the same instant), so either may be named.
    assert!(
        said.contains("client 1 got 500") || said.contains("client 2 got 500"),
        "{said}"
    );
    assert!(
        said.contains("2 sessions of your service wait for the lab"),
        "the race was forced: {said}"
    );
    lab_testkit::assert_nothing_left(tmp.path(), "after the check");
}

#[test]
#[ignore = "needs LAB_EXERCISE_VENV (the lesson's Python stack); .ci/run sets it"]
fn a_key_kept_in_memory_survives_everything_but_the_crash() {
    let tmp = shared_tempdir();
    let work = tempfile::tempdir().unwrap();
    let dir = python_project(work.path(), "starter");
    // The classic shortcut: a dict of keys in the process, no key in the database.
    let app = std::fs::read_to_string(dir.join("app.py")).unwrap();
    let app = app.replace(
        "    digest = payload_hash(body)\n",
        "    digest = payload_hash(body)\n    if idempotency_key is not None and idempotency_key in SEEN:\n        report_id, stored = SEEN[idempotency_key]\n        if stored != digest:\n            return error(409, \"idempotency_key_reused\", \"other content\")\n        return JSONResponse(status_code=200, content={\"report_id\": report_id, \"replayed\": True})\n",
    );
    let app = app.replace(
        "    return JSONResponse(status_code=201, content={\"report_id\": report_id, \"replayed\": False})\n\n\nif __name__",
        "    if idempotency_key is not None:\n        SEEN[idempotency_key] = (report_id, digest)\n    return JSONResponse(status_code=201, content={\"report_id\": report_id, \"replayed\": False})\n\n\nif __name__",
    );
    let app = app.replace(
        "MAX_KEY_LENGTH = 255\n",
        "MAX_KEY_LENGTH = 255\nSEEN = {}\n",
    );
    std::fs::write(dir.join("app.py"), app).unwrap();
    let (code, verdicts, said) = check_verdicts(
        &dir,
        tmp.path(),
        &["--only", "lost-answer", "--only", "crash"],
    );
    assert_eq!(code, 1, "{said}");
    assert_eq!(
        verdicts,
        vec![
            ("lost-answer".to_string(), "pass".to_string()),
            ("crash".to_string(), "fail".to_string())
        ],
        "{said}"
    );
    // The restarted service made a second report for the key it had forgotten.
    assert!(said.contains("made report #3 beside #2"), "{said}");
}

#[test]
#[ignore = "needs LAB_EXERCISE_VENV (the lesson's Python stack); .ci/run sets it"]
fn the_python_solution_passes_and_the_starter_fails_its_todos() {
    let tmp = shared_tempdir();
    let work = tempfile::tempdir().unwrap();
    let solution = python_project(work.path(), "solution");
    let (code, verdicts, said) = check_verdicts(&solution, tmp.path(), &[]);
    assert_eq!(code, 0, "{said}");
    assert!(verdicts.iter().all(|(_, v)| v == "pass"), "{said}");
    assert_eq!(verdicts.len(), 10);
    let list = lab(&["exercise", "list"])
        .current_dir(tmp.path())
        .output()
        .unwrap();
    assert!(
        stdout(&list).contains("not started"),
        "the default folder is ./lab-exercises/NAME"
    );

    let starter = python_project(work.path(), "starter");
    let (code, verdicts, said) = check_verdicts(&starter, tmp.path(), &[]);
    assert_eq!(code, 1, "{said}");
    let passed: Vec<&str> = verdicts
        .iter()
        .filter(|(_, v)| v == "pass")
        .map(|(c, _)| c.as_str())
        .collect();
    assert_eq!(passed, ["no-key", "hostile"], "{said}");
    lab_testkit::assert_nothing_left(tmp.path(), "after the checks");
}

/// Every exercise, in the course's order.
fn lab_exercises_names() -> Vec<&'static str> {
    lab_exercises::EXERCISES.iter().map(|e| e.name).collect()
}

/// `docs/exercise-ci.yml`, the workflow a course copies to grade its learners' pushes: valid
/// YAML, its venv step is the README's one install, and its check line, run here on the
/// reference solution laid out as a learner's repository, passes with one test case per check.
#[test]
#[ignore = "needs LAB_EXERCISE_VENV (the lesson's Python stack); .ci/run sets it"]
fn the_course_workflow_grades_a_learners_push() {
    use yaml_rust2::YamlLoader;
    let text = std::fs::read_to_string(common::repo().join("docs/exercise-ci.yml")).unwrap();
    let docs = YamlLoader::load_from_str(&text).expect("docs/exercise-ci.yml is valid YAML");
    let steps = docs[0]["jobs"]["grade"]["steps"]
        .as_vec()
        .expect("a grade job with steps");
    let runs: Vec<&str> = steps.iter().filter_map(|s| s["run"].as_str()).collect();
    assert!(
        runs.iter()
            .any(|r| r.contains("pip install -q -r requirements.txt")),
        "{runs:?}"
    );
    let check = runs
        .iter()
        .find(|r| r.starts_with("lab exercise check"))
        .expect("a check step");
    let (command, report) = check.split_once('>').expect("the report goes to a file");
    assert_eq!(report.trim(), "lab-exercise.xml");
    let exercises = docs[0]["jobs"]["grade"]["strategy"]["matrix"]["exercise"]
        .as_vec()
        .unwrap();
    let listed: Vec<&str> = exercises.iter().filter_map(|e| e.as_str()).collect();
    assert_eq!(
        listed,
        lab_exercises_names(),
        "the matrix grades every exercise, in the course's order"
    );
    let command = command.replace("${{ matrix.exercise }}", "report-api");
    let args: Vec<String> = command
        .split_whitespace()
        .skip(1)
        .map(str::to_string)
        .collect();

    // A learner's repository: lab-exercises/report-api, as `lab exercise start` lays it out.
    let tmp = shared_tempdir();
    let work = tempfile::tempdir().unwrap();
    let learner = work.path().join("lab-exercises");
    std::fs::create_dir_all(&learner).unwrap();
    let solution = python_project(work.path(), "solution");
    std::fs::rename(&solution, learner.join("report-api")).unwrap();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = lab(&args)
        .current_dir(work.path())
        .env("TMPDIR", tmp.path())
        .output()
        .unwrap();
    assert_code(&out, 0);
    let xml = stdout(&out);
    assert_eq!(xml.matches("<testcase ").count(), 10, "{xml}");
    assert!(!xml.contains("<failure"), "{xml}");
}

#[test]
fn a_program_that_is_not_installed_says_so() {
    let tmp = shared_tempdir();
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("ex");
    project(&dir, &[".venv/bin/python", "app.py"], "");
    let out = lab(&["exercise", "check", "report-api", dir.to_str().unwrap()])
        .env("TMPDIR", tmp.path())
        .output()
        .unwrap();
    assert_code(&out, 3);
    assert!(
        stderr(&out).contains("one install command"),
        "{}",
        stderr(&out)
    );
    lab_testkit::assert_nothing_left(tmp.path(), "after a program that could not start");
}

#[test]
fn after_a_sigkill_the_next_lab_ends_what_the_program_left() {
    let tmp = shared_tempdir();
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("ex");
    // A child in the program's group, which the kernel does not end with `lab`.
    project(
        &dir,
        &[
            "sh",
            "-c",
            "sleep 900 & exec python3 -m http.server --bind 127.0.0.1 \"$PORT\"",
        ],
        "",
    );
    let args = [
        "exercise",
        "check",
        "report-api",
        dir.to_str().unwrap(),
        "--only",
        "crash",
    ];
    // Python runs once the shell has started its child and exec'd.
    let mut child = lab_with_program_up(&args, tmp.path(), &dir, "python3 -m http.server");
    common::signal(&child, nix::sys::signal::Signal::SIGKILL);
    child.wait().unwrap();
    // The leader dies with `lab`; its child lives on until the next `lab` starts.
    let deadline = Instant::now() + Duration::from_secs(10);
    while processes_in(&dir).iter().any(|p| p.contains("http.server")) {
        assert!(Instant::now() < deadline, "the leader outlived lab");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        processes_in(&dir).iter().any(|p| p.contains("sleep 900")),
        "the child is left"
    );
    let next = lab(&["doctor"]).env("TMPDIR", tmp.path()).output().unwrap();
    assert_code(&next, 0);
    assert_eq!(
        processes_in(&dir),
        Vec::<String>::new(),
        "the next lab ended it"
    );
    lab_testkit::assert_nothing_left(tmp.path(), "after the next lab");
}

#[test]
fn watch_checks_again_on_a_save_and_quits_on_q() {
    use std::io::Write as _;
    let tmp = shared_tempdir();
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("ex");
    answering_program(&dir);
    std::fs::write(dir.join("app.py"), "# v1\n").unwrap();
    let (mut child, seen) = watching(&dir, tmp.path(), &["replay"]);
    let summary = |seen: &std::sync::mpsc::Receiver<String>| loop {
        let line = seen
            .recv_timeout(Duration::from_secs(60))
            .expect("a check run ends");
        if line.contains("passed,") {
            return;
        }
    };
    summary(&seen);
    // A save: the exercise is checked again.
    std::fs::write(dir.join("app.py"), "# v2\n").unwrap();
    summary(&seen);
    // A hint, then quit.
    let mut keys = child.stdin.take().unwrap();
    keys.write_all(b"h\n").unwrap();
    let hint = seen.recv_timeout(Duration::from_secs(30)).unwrap();
    assert!(hint.contains("database"), "the first hint: {hint}");
    keys.write_all(b"q\n").unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0));
    assert_eq!(processes_in(&dir), Vec::<String>::new());
    lab_testkit::assert_nothing_left(tmp.path(), "after watch");
}

/// A save that goes on (a second write within watch's settling time) gets one run, of what was
/// saved last: the run the first write began is told nothing, though its program had started.
#[test]
fn watch_tells_only_the_run_of_the_last_write_of_a_save() {
    use std::io::Write as _;
    let tmp = shared_tempdir();
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("ex");
    // A program that exits at once while app.py says so: a run of that version could not check.
    project(
        &dir,
        &[
            "sh",
            "-c",
            "grep -q broken app.py && exit 3; exec python3 -m http.server --bind 127.0.0.1 \"$PORT\"",
        ],
        "",
    );
    std::fs::write(dir.join("app.py"), "# v1\n").unwrap();
    let (mut child, seen) = watching(&dir, tmp.path(), &["replay"]);
    // Every line up to a run's ending (its summary, or why it could not check).
    let run = |seen: &std::sync::mpsc::Receiver<String>| {
        let mut lines = Vec::new();
        loop {
            let line = seen
                .recv_timeout(Duration::from_secs(60))
                .expect("a check run ends");
            let ended = line.contains("passed,") || line.contains("could not");
            lines.push(line);
            if ended {
                return lines;
            }
        }
    };
    run(&seen);
    std::fs::write(dir.join("app.py"), "# broken\n").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    std::fs::write(dir.join("app.py"), "# v2\n").unwrap();
    let told = run(&seen);
    let headings = told
        .iter()
        .filter(|l| l.starts_with("lab exercise check"))
        .count();
    assert_eq!(headings, 1, "one run told: {told:#?}");
    assert!(
        told.last().unwrap().contains("passed,"),
        "the run told is the last write's: {told:#?}"
    );
    let mut keys = child.stdin.take().unwrap();
    keys.write_all(b"q\n").unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0));
    // Nothing more was said: the untold run did not come after.
    let rest: Vec<String> = seen.try_iter().collect();
    assert!(
        !rest.iter().any(|l| l.starts_with("lab exercise check")),
        "{rest:#?}"
    );
    assert_eq!(processes_in(&dir), Vec::<String>::new());
    lab_testkit::assert_nothing_left(tmp.path(), "after watch");
}

// ─── Exercise `worker`, with the lesson's Python stack ──────────────────────────────────────

/// The worker's reference solution, written out with the venv linked in, its worker.py
/// rewritten by `edit`.
fn worker_variant(work: &Path, edit: impl Fn(String) -> String) -> PathBuf {
    let base = work.join("w");
    let out = lab(&["exercise", "solution", "worker", base.to_str().unwrap()])
        .output()
        .unwrap();
    assert_code(&out, 0);
    let dir = work.join("w-solution");
    std::os::unix::fs::symlink(venv(), dir.join(".venv")).unwrap();
    let source = std::fs::read_to_string(dir.join("worker.py")).unwrap();
    let edited = edit(source.clone());
    assert!(
        edited != source || edit(String::new()).is_empty(),
        "the edit applies"
    );
    std::fs::write(dir.join("worker.py"), edited).unwrap();
    dir
}

fn worker_verdicts(dir: &Path, tmp: &Path, only: &str) -> (String, String) {
    let out = lab(&[
        "exercise",
        "check",
        "worker",
        dir.to_str().unwrap(),
        "--only",
        only,
        "--format",
        "json",
    ])
    .env("TMPDIR", tmp)
    .output()
    .unwrap();
    let line = stdout(&out);
    let first = line.lines().next().unwrap_or_default();
    let value: serde_json::Value =
        serde_json::from_str(first).unwrap_or_else(|e| panic!("{e}: {line}"));
    (value["verdict"].as_str().unwrap().to_string(), line)
}

#[test]
#[ignore = "needs LAB_EXERCISE_VENV (the lesson's Python stack); .ci/run sets it"]
fn a_key_from_the_attempt_number_is_caught_and_named() {
    let tmp = shared_tempdir();
    let work = tempfile::tempdir().unwrap();
    let dir = worker_variant(work.path(), |s| {
        s.replace(
            "def create_report(task_id: int) -> int:",
            "def create_report(task_id: int, attempt: int) -> int:",
        )
        .replace(
            "f\"report-task-{task_id}\"",
            "f\"report-task-{task_id}-attempt-{attempt}\"",
        )
        .replace(
            "report_id = create_report(TASK_ID)",
            "report_id = create_report(TASK_ID, attempt)",
        )
    });
    let (verdict, said) = worker_verdicts(&dir, tmp.path(), "crash-after-commit");
    assert_eq!(verdict, "fail", "{said}");
    assert!(
        said.contains("different keys") && said.contains("changed from one attempt to the next"),
        "{said}"
    );
    lab_testkit::assert_nothing_left(tmp.path(), "after the check");
}

#[test]
#[ignore = "needs LAB_EXERCISE_VENV (the lesson's Python stack); .ci/run sets it"]
fn a_transaction_held_across_the_call_is_caught() {
    let tmp = shared_tempdir();
    let work = tempfile::tempdir().unwrap();
    // The claim's transaction left open until the call has returned.
    let dir = worker_variant(work.path(), |s| {
        s.replace(
            "    with engine.begin() as conn:\n        return conn.execute(\n            text(\n                \"UPDATE tasks SET status = 'processing'",
            "    if True:\n        conn = HELD\n        return conn.execute(\n            text(\n                \"UPDATE tasks SET status = 'processing'",
        )
        .replace("\n\n\ndef claim_task", "\nHELD = engine.connect()\n\n\ndef claim_task")
        .replace(
            "    report_id = create_report(TASK_ID)\n",
            "    report_id = create_report(TASK_ID)\n    HELD.commit()\n",
        )
    });
    let (verdict, said) = worker_verdicts(&dir, tmp.path(), "no-open-transaction");
    assert_eq!(verdict, "fail", "{said}");
    assert!(said.contains("idle in transaction"), "{said}");
}

#[test]
#[ignore = "needs LAB_EXERCISE_VENV (the lesson's Python stack); .ci/run sets it"]
fn a_completion_without_fencing_is_caught() {
    let tmp = shared_tempdir();
    let work = tempfile::tempdir().unwrap();
    let dir = worker_variant(work.path(), |s| {
        s.replace(
            " AND status = 'processing' AND attempts = :attempt\" + lease + \"",
            "\" + lease + \"",
        )
    });
    let (verdict, said) = worker_verdicts(&dir, tmp.path(), "stale-completion");
    assert_eq!(verdict, "fail", "{said}");
    assert!(
        said.contains("complete_task must check that the task is still the attempt's"),
        "{said}"
    );
}

#[test]
fn sigterm_in_the_middle_of_a_check_leaves_nothing_running() {
    let tmp = shared_tempdir();
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("ex");
    answering_program(&dir);
    let args = [
        "exercise",
        "check",
        "report-api",
        dir.to_str().unwrap(),
        "--only",
        "crash",
    ];
    let mut child = lab_with_program_up(&args, tmp.path(), &dir, "python3 -m http.server");
    common::signal(&child, nix::sys::signal::Signal::SIGTERM);
    assert_eq!(child.wait().unwrap().code(), Some(143));
    assert_eq!(
        processes_in(&dir),
        Vec::<String>::new(),
        "the program is gone"
    );
    lab_testkit::assert_nothing_left(tmp.path(), "after SIGTERM");
}

#[test]
#[ignore = "needs LAB_EXERCISE_VENV (the lesson's Python stack); .ci/run sets it"]
fn the_program_may_use_its_schema_and_nothing_else() {
    let tmp = shared_tempdir();
    let work = tempfile::tempdir().unwrap();
    let dir = python_project(work.path(), "solution");
    // Before serving, the program tries to step outside: a schema of its own, the catalogue of
    // roles' passwords. Either one succeeding ends it with a word the lab would show.
    let app = std::fs::read_to_string(dir.join("app.py")).unwrap();
    let probe = "\nfor attempt in (\"CREATE SCHEMA escaped\", \"SELECT rolpassword FROM pg_authid\", \"SET search_path = public; CREATE TABLE escaped (x int)\"):\n    try:\n        with engine.begin() as conn:\n            conn.execute(text(attempt))\n    except Exception:\n        continue\n    raise SystemExit(f\"ESCAPED: {attempt}\")\n\n\nif __name__ == \"__main__\":";
    std::fs::write(
        dir.join("app.py"),
        app.replacen("\n\nif __name__ == \"__main__\":", probe, 1),
    )
    .unwrap();
    let out = lab(&[
        "exercise",
        "check",
        "report-api",
        dir.to_str().unwrap(),
        "--only",
        "replay",
    ])
    .env("TMPDIR", tmp.path())
    .output()
    .unwrap();
    assert_code(&out, 0);
    assert!(!stdout(&out).contains("ESCAPED"), "{}", stdout(&out));
}

/// The lines of `--format json`, each parsed (a line that is not JSON fails the test).
fn json_lines(out: &str) -> Vec<serde_json::Value> {
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// The test cases of a `--format junit` document, parsed as XML: (name, what it holds:
/// "failure", "error", "skipped" or "" for a success).
fn junit_cases(xml: &str) -> Vec<(String, String)> {
    let doc = roxmltree::Document::parse(xml).unwrap_or_else(|e| panic!("{e}: {xml}"));
    doc.descendants()
        .filter(|n| n.has_tag_name("testcase"))
        .map(|case| {
            let kind = case
                .children()
                .find(|c| c.is_element())
                .map(|c| c.tag_name().name().to_string())
                .unwrap_or_default();
            (case.attribute("name").unwrap_or_default().to_string(), kind)
        })
        .collect()
}

/// Whatever ends a run, JSON is JSON lines with every selected check in them and a last line
/// that says how the run ended, and JUnit is one document with every selected check.
#[test]
fn json_and_junit_are_whole_documents_whatever_ends_the_run() {
    let tmp = shared_tempdir();
    let work = tempfile::tempdir().unwrap();
    let only = ["--only", "replay", "--only", "race"];

    // The program never answers.
    let silent = work.path().join("silent");
    project(
        &silent,
        &["sh", "-c", "echo 'no module named fastapi' >&2; exit 3"],
        "",
    );
    for format in ["json", "junit"] {
        let mut args = vec![
            "exercise",
            "check",
            "report-api",
            silent.to_str().unwrap(),
            "--format",
            format,
        ];
        args.extend(only);
        let out = lab(&args).env("TMPDIR", tmp.path()).output().unwrap();
        assert_code(&out, 4);
        if format == "json" {
            let lines = json_lines(&stdout(&out));
            assert_eq!(lines.len(), 3, "{lines:?}");
            for (line, check) in lines.iter().zip(["replay", "race"]) {
                assert_eq!(line["check"], check);
                assert_eq!(line["verdict"], "unknown");
                assert!(
                    line["reason"].as_str().unwrap().contains("exited"),
                    "{line}"
                );
            }
            assert_eq!(lines[2]["ended"], "not_ready");
            assert!(
                lines[2]["output"]
                    .as_str()
                    .unwrap()
                    .contains("no module named fastapi")
            );
        } else {
            assert_eq!(
                junit_cases(&stdout(&out)),
                [
                    ("replay".into(), "error".into()),
                    ("race".into(), "error".into())
                ]
            );
        }
    }

    // The environment fails: nothing listens where the database should be.
    let answering = work.path().join("answering");
    answering_program(&answering);
    for format in ["json", "junit"] {
        let mut args = vec![
            "exercise",
            "check",
            "report-api",
            answering.to_str().unwrap(),
            "--database-url",
            "postgresql://lab@127.0.0.1:1/lab",
            "--format",
            format,
        ];
        args.extend(only);
        let out = lab(&args).env("TMPDIR", tmp.path()).output().unwrap();
        assert_code(&out, 3);
        assert!(stderr(&out).contains("127.0.0.1:1"), "{}", stderr(&out));
        if format == "json" {
            let lines = json_lines(&stdout(&out));
            assert_eq!(lines.len(), 3, "{lines:?}");
            assert_eq!(lines[2]["ended"], "environment_error");
            assert_eq!(lines[2]["summary"]["not_run"], 2);
        } else {
            let cases = junit_cases(&stdout(&out));
            assert_eq!(cases.len(), 2, "{cases:?}");
            assert!(cases.iter().all(|(_, kind)| kind == "error"), "{cases:?}");
        }
    }

    // Interrupted while the lab waits for a commit that never comes (`crash`), after `replay`
    // ended: JSON lines stream, so the test reads until `replay`'s line has come.
    let args = [
        "exercise",
        "check",
        "report-api",
        answering.to_str().unwrap(),
        "--only",
        "replay",
        "--only",
        "crash",
        "--format",
    ];
    let mut child = lab(&[&args[..], &["json"]].concat())
        .env("TMPDIR", tmp.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(first["check"], "replay");
    common::interrupt(&child);
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    assert_eq!(child.wait().unwrap().code(), Some(130));
    let rest = json_lines(&rest.join("\n"));
    assert_eq!(rest.len(), 2, "{rest:?}");
    assert_eq!(rest[0]["check"], "crash");
    assert_eq!(rest[0]["verdict"], "unknown");
    assert_eq!(rest[1]["ended"], "interrupted");
    // The same as one JUnit document, interrupted once the program is up: `replay` may or may
    // not have ended by then; `crash` never has, and both are in the document.
    let child = lab(&[&args[..], &["junit"]].concat())
        .env("TMPDIR", tmp.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !processes_in(&answering)
        .iter()
        .any(|p| p.contains("http.server"))
    {
        assert!(Instant::now() < deadline, "the program never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    common::interrupt(&child);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130));
    let cases = junit_cases(&stdout(&out));
    assert_eq!(cases.len(), 2, "{cases:?}");
    assert_eq!(cases[0].0, "replay");
    assert!(
        ["failure", "error"].contains(&cases[0].1.as_str()),
        "{cases:?}"
    );
    assert_eq!(cases[1], ("crash".into(), "error".into()));
    assert_eq!(processes_in(&answering), Vec::<String>::new());
    lab_testkit::assert_nothing_left(tmp.path(), "after the runs");
}

/// Every replay line the lab prints runs as printed (with this build's `lab` for `lab`), and
/// gets the verdict it replays.
#[test]
fn a_replay_line_runs_as_printed_and_replays_its_verdict() {
    let tmp = shared_tempdir();
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("with space");
    answering_program(&dir);
    let out = lab(&[
        "exercise",
        "check",
        "report-api",
        dir.to_str().unwrap(),
        "--only",
        "replay",
        "--only",
        "burst",
        "--seed",
        "7",
        "--repeat",
        "2",
        "--format",
        "json",
    ])
    .env("TMPDIR", tmp.path())
    .output()
    .unwrap();
    assert_code(&out, 1);
    let lines = json_lines(&stdout(&out));
    let checks: Vec<&serde_json::Value> =
        lines.iter().filter(|l| l.get("check").is_some()).collect();
    assert_eq!(checks.len(), 2);
    for line in checks {
        let replay = line["replay"].as_str().unwrap();
        assert!(
            replay.starts_with("lab exercise check report-api '"),
            "{replay}"
        );
        if line["check"] == "burst" {
            assert!(
                replay.ends_with("--only burst --seed 7 --repeat 2"),
                "{replay}"
            );
        }
        let command = format!(
            "{} --format json",
            replay.replacen("lab", common::lab_path(), 1)
        );
        let again = std::process::Command::new("sh")
            .arg("-c")
            .arg(&command)
            .current_dir(common::repo())
            .env("TMPDIR", tmp.path())
            .output()
            .unwrap();
        let replayed = json_lines(&stdout(&again));
        assert_eq!(replayed[0]["check"], line["check"], "{command}");
        assert_eq!(replayed[0]["verdict"], line["verdict"], "{command}");
        assert_eq!(replayed[0]["reason_key"], line["reason_key"], "{command}");
    }
    lab_testkit::assert_nothing_left(tmp.path(), "after the replays");
}
