//! `lab class` as a class uses it: the instructor starts the board, learners in folders of
//! their own run `lab exercise check NAME --class URL` at once, the board shows what each got,
//! and a board that is down changes no learner's verdict or exit code.
//!
//! The first test needs only the machine's `python3` (a program that answers every request with
//! 404s and 501s fails its checks quickly). The one with the lesson's Python stack is
//! `#[ignore]`d and run by `.ci/run` with `LAB_EXERCISE_VENV` set, as the exercise tests are.

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use common::{assert_code, lab, shared_tempdir, stderr, stdout};
use serde_json::Value;

/// A running `lab class`, and what it printed for the instructor and the learners.
pub struct ClassBoard {
    child: Child,
    /// The board's URL, as learners give it to `--class`.
    pub url: String,
    pub code: String,
    pub token: String,
    /// The instructor's URL, with the token after `#`.
    pub instructor_url: String,
}

impl ClassBoard {
    /// `lab class --bind 127.0.0.1:0` (TMPDIR `tmp`), once it has printed its lines.
    pub fn start(tmp: &Path, lang: &str) -> ClassBoard {
        ClassBoard::start_on(tmp, lang, "127.0.0.1:0")
    }

    /// `lab class --bind BIND`.
    pub fn start_on(tmp: &Path, lang: &str, bind: &str) -> ClassBoard {
        let mut child = lab(&["class", "--bind", bind, "--lang", lang])
            .env("TMPDIR", tmp)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (mut instructor_url, mut url, mut code) = (None, None, None);
        let deadline = Instant::now() + Duration::from_secs(120);
        while code.is_none() {
            assert!(
                Instant::now() < deadline,
                "lab class never printed its lines"
            );
            let line = lines.next().expect("lab class ended early").unwrap();
            let words: Vec<&str> = line.split_whitespace().collect();
            if let Some(at) = words.iter().find(|w| w.contains("/#token=")) {
                instructor_url = Some(at.to_string());
            }
            if let Some(i) = words.iter().position(|w| *w == "--class-code") {
                code = Some(words[i + 1].to_string());
                url = Some(words[i - 1].to_string());
            }
        }
        // The rest of its output is not read; it must not block on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        let instructor_url: String = instructor_url.expect("the instructor's URL");
        let token = instructor_url.split("#token=").nth(1).unwrap().to_string();
        ClassBoard {
            child,
            url: url.unwrap(),
            code: code.unwrap(),
            token,
            instructor_url,
        }
    }

    /// The grid, as the instructor's token shows it (asked on this machine's loopback).
    pub fn board(&self) -> Value {
        let base = self.instructor_url.split('#').next().unwrap();
        let url = format!("{base}api/board");
        let token = self.token.clone();
        get_json(&url, Some(&token))
    }

    /// SIGTERM: the board stops, exit 0, and says so.
    pub fn stop(mut self) -> String {
        common_signal(&self.child, nix::sys::signal::Signal::SIGTERM);
        let status = self.child.wait().unwrap();
        let mut err = String::new();
        std::io::Read::read_to_string(&mut self.child.stderr.take().unwrap(), &mut err).unwrap();
        assert_eq!(
            status.code(),
            Some(0),
            "lab class ended with {status}: {err}"
        );
        err
    }
}

impl Drop for ClassBoard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn common_signal(child: &Child, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
}

/// A GET of JSON, from a test that is not async.
pub fn get_json(url: &str, bearer: Option<&str>) -> Value {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut request = reqwest::Client::new().get(url);
        if let Some(token) = bearer {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), 200, "{url}");
        response.json().await.unwrap()
    })
}

/// A report-api project whose program is python3's own http.server: it answers every request
/// (404s and 501s), so the checks run, and fail.
fn answering_program(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("lab-exercise.toml"),
        "exercise = \"report-api\"\nlang = \"python\"\n\
         command = [\"sh\", \"-c\", \"exec python3 -m http.server --bind 127.0.0.1 \\\"$PORT\\\"\"]\n",
    )
    .unwrap();
}

/// `lab exercise check report-api DIR ARGS… --format json` (TMPDIR `tmp`).
fn check(dir: &Path, tmp: &Path, args: &[&str]) -> Output {
    let mut all = vec!["exercise", "check", "report-api", dir.to_str().unwrap()];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--format", "json", "--seed", "5"]);
    lab(&all).env("TMPDIR", tmp).output().unwrap()
}

/// Each check's (verdict, reason_key) from a run's JSON lines.
fn verdicts(out: &Output) -> Vec<(String, String, Option<String>)> {
    stdout(out)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v.get("check").is_some())
        .map(|v| {
            (
                v["check"].as_str().unwrap().to_string(),
                v["verdict"].as_str().unwrap().to_string(),
                v["reason_key"].as_str().map(str::to_string),
            )
        })
        .collect()
}

/// The cell of `learner` (by name) for `check`, from the instructor's grid.
pub fn cell<'b>(board: &'b Value, learner: &str, check: &str) -> Option<&'b Value> {
    let id = &board["learners"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == learner)?["id"];
    board["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| &c["learner"] == id && c["check"] == check)
}

#[test]
fn learners_checks_reach_the_board_and_a_board_that_is_down_changes_no_exit_code() {
    let tmp = shared_tempdir();
    // The learners' folders: beside TMPDIR, which must be empty at the end.
    let work = tempfile::tempdir().unwrap();
    let board = ClassBoard::start(tmp.path(), "en");
    let checks = ["--only", "replay", "--only", "no-key"];
    // Two learners at once, each in a folder of their own; a third with a wrong code.
    let runs: Vec<(PathBuf, std::thread::JoinHandle<Output>)> = ["Ann", "Bob", "Eve"]
        .into_iter()
        .map(|name| {
            let dir = work.path().join(name.to_lowercase());
            answering_program(&dir);
            let code = if name == "Eve" {
                "WRONG1".to_string()
            } else {
                board.code.clone()
            };
            let (url, tmp, thread_dir) = (board.url.clone(), tmp.path().to_path_buf(), dir.clone());
            let handle = std::thread::spawn(move || {
                let class = ["--class", &url, "--class-code", &code, "--class-name", name];
                let args: Vec<&str> = checks.iter().chain(class.iter()).copied().collect();
                check(&thread_dir, &tmp, &args)
            });
            (dir, handle)
        })
        .collect();
    let outs: Vec<(PathBuf, Output)> = runs
        .into_iter()
        .map(|(dir, handle)| (dir, handle.join().unwrap()))
        .collect();
    for (dir, out) in &outs {
        // The checks fail, with the board or without it.
        assert_code(out, 1);
        let said = stderr(out);
        if dir.ends_with("eve") {
            assert!(
                said.contains("could not join") && said.contains("wrong class code"),
                "{said}"
            );
            assert!(!said.contains("verdicts sent"), "{said}");
        } else {
            assert!(
                said.contains("joined") && said.contains("verdicts sent to"),
                "{said}"
            );
        }
    }

    // The board: Ann's and Bob's cells as their own runs reported them; no Eve.
    let grid = board.board();
    let names: Vec<&str> = grid["learners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "{grid}");
    assert!(names.contains(&"Ann") && names.contains(&"Bob"), "{grid}");
    for (dir, out) in &outs[..2] {
        let name = if dir.ends_with("ann") { "Ann" } else { "Bob" };
        let reported = verdicts(out);
        assert_eq!(reported.len(), 2);
        for (check, verdict, reason_key) in reported {
            let cell =
                cell(&grid, name, &check).unwrap_or_else(|| panic!("{name} {check}: {grid}"));
            assert_eq!(cell["verdict"], verdict.as_str(), "{cell}");
            assert_eq!(cell["source"], "self_reported");
            assert_eq!(cell["reason_key"].as_str(), reason_key.as_deref(), "{cell}");
            // The replay line names no folder: the board sees nothing of a learner's machine.
            let replay = cell["replay"].as_str().unwrap();
            assert_eq!(
                replay,
                format!("lab exercise check report-api --only {check}")
            );
        }
    }
    let replay = grid["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "replay")
        .unwrap();
    assert_eq!(replay["passing"], 0);
    assert_eq!(replay["reported"], 2);
    let ann_replay = cell(&grid, "Ann", "replay").unwrap();
    assert_eq!(
        replay["commonest_broken"]["reason_key"],
        ann_replay["reason_key"]
    );
    assert_eq!(replay["commonest_broken"]["count"], 2);
    // The example's schedule, as the learner's lab told it, in both languages.
    let schedule = &replay["commonest_broken"]["schedule"];
    for lang in ["en", "ru"] {
        let lines = schedule[lang]
            .as_array()
            .unwrap_or_else(|| panic!("{schedule}"));
        assert!(lines[0].as_str().unwrap().starts_with("1. "), "{schedule}");
    }
    assert_ne!(schedule["en"], schedule["ru"]);

    // The place on the board is remembered in the folder: Ann checks again with `--class` alone.
    let again = check(
        &outs[0].0,
        tmp.path(),
        &["--only", "replay", "--class", &board.url],
    );
    assert_code(&again, 1);
    assert!(
        stderr(&again).contains("verdicts sent to"),
        "{}",
        stderr(&again)
    );
    assert!(!stderr(&again).contains("joined"), "{}", stderr(&again));

    // The board stops mid-class: the learner's verdicts and exit code do not change.
    let said = board.stop();
    assert!(said.contains("the board stopped"), "{said}");
    let down = check(
        &outs[0].0,
        tmp.path(),
        &["--only", "replay", "--class", &grid_url(&outs)],
    );
    assert_code(&down, 1);
    assert_eq!(
        verdicts(&down).iter().map(|v| &v.1).collect::<Vec<_>>(),
        ["fail"]
    );
    let said = stderr(&down);
    assert_eq!(
        said.lines().filter(|l| l.contains("lab: class:")).count(),
        1,
        "one line about the board: {said}"
    );
    assert!(
        said.contains("did not get") && said.contains("unchanged"),
        "{said}"
    );
    common::assert_nothing_left(tmp.path());
}

#[test]
fn watch_sends_the_verdicts_again_after_every_save() {
    use std::io::Write as _;
    let tmp = shared_tempdir();
    let work = tempfile::tempdir().unwrap();
    let board = ClassBoard::start(tmp.path(), "en");
    let dir = work.path().join("watcher");
    answering_program(&dir);
    std::fs::write(dir.join("app.py"), "# v1\n").unwrap();
    let mut child = lab(&[
        "exercise",
        "watch",
        "report-api",
        dir.to_str().unwrap(),
        "--only",
        "replay",
        "--class",
        &board.url,
        "--class-code",
        &board.code,
        "--class-name",
        "Wendy",
    ])
    .env("TMPDIR", tmp.path())
    .stdin(Stdio::piped())
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let (lines, said) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let sent = |said: &std::sync::mpsc::Receiver<String>| loop {
        let line = said
            .recv_timeout(Duration::from_secs(60))
            .expect("a check run sends its verdicts");
        if line.contains("verdicts sent to") {
            return;
        }
    };
    sent(&said);
    // A save: checked again, and sent again.
    std::fs::write(dir.join("app.py"), "# v2\n").unwrap();
    sent(&said);
    child.stdin.take().unwrap().write_all(b"q\n").unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0));
    let grid = board.board();
    let id = grid["learners"][0]["id"].as_i64().unwrap();
    let history = get_json(
        &format!("{}api/learners/{id}/history", board.url),
        Some(&board.token),
    );
    assert_eq!(
        history["verdicts"].as_array().unwrap().len(),
        2,
        "{history}"
    );
    board.stop();
    common::assert_nothing_left(tmp.path());
}

#[test]
fn on_a_terminal_the_code_and_the_name_are_asked_once() {
    use std::io::Write as _;
    let tmp = shared_tempdir();
    let work = tempfile::tempdir().unwrap();
    let board = ClassBoard::start(tmp.path(), "en");
    let dir = work.path().join("asked");
    answering_program(&dir);
    // `script` gives lab a terminal (a pty) whose keyboard is this test's pipe.
    let line = format!(
        "'{}' exercise check report-api '{}' --only replay --class '{}'",
        common::lab_path(),
        dir.display(),
        board.url
    );
    let run = |keys: &[u8]| {
        let mut child = common::command(Path::new("script"), &["-qec", &line, "/dev/null"])
            .env("TMPDIR", tmp.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut keyboard = child.stdin.take().unwrap();
        keyboard.write_all(keys).unwrap();
        let out = child.wait_with_output().unwrap();
        drop(keyboard);
        out
    };
    let asked = run(format!("{}\nPat\n", board.code).as_bytes());
    let said = stdout(&asked);
    assert_eq!(asked.status.code(), Some(1), "{said}");
    assert!(
        said.contains("Class code") && said.contains("Your name"),
        "{said}"
    );
    assert!(said.contains("joined") && said.contains("as Pat"), "{said}");
    // The second time nothing is asked: the place is remembered in the folder.
    let again = run(b"");
    let said = stdout(&again);
    assert_eq!(again.status.code(), Some(1), "{said}");
    assert!(!said.contains("Class code"), "{said}");
    assert!(said.contains("verdicts sent to"), "{said}");
    let grid = board.board();
    let id = grid["learners"][0]["id"].as_i64().unwrap();
    assert_eq!(grid["learners"][0]["name"], "Pat");
    let history = get_json(
        &format!("{}api/learners/{id}/history", board.url),
        Some(&board.token),
    );
    assert_eq!(
        history["verdicts"].as_array().unwrap().len(),
        2,
        "{history}"
    );
    board.stop();
    common::assert_nothing_left(tmp.path());
}

#[test]
fn a_board_on_every_address_gives_the_learners_this_machines_address() {
    let tmp = shared_tempdir();
    let board = ClassBoard::start_on(tmp.path(), "ru", "0.0.0.0:0");
    // The instructor's own view is on loopback; the learners' line names the address the
    // classroom reaches (or says to put it in, on a machine with no route).
    assert!(
        board.instructor_url.starts_with("http://127.0.0.1:"),
        "{}",
        board.instructor_url
    );
    if !board.url.contains('<') {
        let url = url::Url::parse(&board.url).unwrap();
        let ip: std::net::IpAddr = url.host_str().unwrap().parse().unwrap();
        assert!(!ip.is_loopback() && !ip.is_unspecified(), "{}", board.url);
        // The page shows the instructor the same line, though its browser came in on loopback.
        assert_eq!(board.board()["join"]["url"], board.url.as_str());
    }
    let said = board.stop();
    assert!(
        said.contains("0.0.0.0"),
        "the warning names the address: {said}"
    );
    common::assert_nothing_left(tmp.path());
}

/// The board's URL as Ann's folder remembers it.
fn grid_url(outs: &[(PathBuf, Output)]) -> String {
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(outs[0].0.join(".lab-exercise-state.json")).unwrap(),
    )
    .unwrap();
    state["class"]["board"].as_str().unwrap().to_string()
}

#[test]
fn class_flags_are_checked_and_explained() {
    // --class-code without --class is a usage error; a URL that is not one too.
    let out = lab(&["exercise", "check", "report-api", "--class-code", "X"])
        .output()
        .unwrap();
    assert_code(&out, 2);
    let tmp = shared_tempdir();
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("p");
    answering_program(&dir);
    let out = check(
        &dir,
        tmp.path(),
        &["--only", "replay", "--class", "not a url"],
    );
    assert_code(&out, 2);
    assert!(
        stderr(&out).contains("is not a board's URL"),
        "{}",
        stderr(&out)
    );
    // No code and no terminal to ask on: one line, and the checks run as usual.
    let out = check(
        &dir,
        tmp.path(),
        &["--only", "replay", "--class", "http://127.0.0.1:9/"],
    );
    assert_code(&out, 1);
    assert!(stderr(&out).contains("--class-code"), "{}", stderr(&out));
    // `lab class verify` against a board that is not there: the environment (exit 3).
    let out = lab(&[
        "class",
        "verify",
        "Ann",
        "report-api",
        "--target",
        "http://127.0.0.1:9",
        "--board",
        "http://127.0.0.1:9/",
        "--token",
        "t",
    ])
    .output()
    .unwrap();
    assert_code(&out, 3);
    common::assert_nothing_left(tmp.path());
}

fn venv() -> PathBuf {
    PathBuf::from(std::env::var("LAB_EXERCISE_VENV").expect(
        "LAB_EXERCISE_VENV: a venv with exercises/report-api/python/*/requirements.txt installed",
    ))
}

/// The Python solution or starter of report-api in `tmp/NAME`, the venv linked in.
fn python_project(tmp: &Path, name: &str, side: &str) -> PathBuf {
    let dir = tmp.join(name);
    let verb = if side == "solution" {
        "solution"
    } else {
        "start"
    };
    let base = tmp.join(format!("{name}-base"));
    let out = lab(&["exercise", verb, "report-api", base.to_str().unwrap()])
        .output()
        .unwrap();
    assert_code(&out, 0);
    let written = if side == "solution" {
        tmp.join(format!("{name}-base-solution"))
    } else {
        base
    };
    std::fs::rename(&written, &dir).unwrap();
    std::os::unix::fs::symlink(venv(), dir.join(".venv")).unwrap();
    dir
}

#[test]
#[ignore = "needs LAB_EXERCISE_VENV (the lesson's Python stack); .ci/run sets it"]
fn a_solution_and_a_starter_on_one_board_then_one_verified_from_the_instructors_side() {
    let tmp = shared_tempdir();
    let work = tempfile::tempdir().unwrap();
    let board = ClassBoard::start(tmp.path(), "ru");
    let ann = python_project(work.path(), "ann", "solution");
    let bob = python_project(work.path(), "bob", "starter");
    let run = |dir: PathBuf, name: &'static str| {
        let (url, code, tmp) = (
            board.url.clone(),
            board.code.clone(),
            tmp.path().to_path_buf(),
        );
        std::thread::spawn(move || {
            check(
                &dir,
                &tmp,
                &["--class", &url, "--class-code", &code, "--class-name", name],
            )
        })
    };
    let (ann_run, bob_run) = (run(ann.clone(), "Аня"), run(bob, "Bob"));
    let (ann_out, bob_out) = (ann_run.join().unwrap(), bob_run.join().unwrap());
    assert_code(&ann_out, 0);
    assert_code(&bob_out, 1);
    let grid = board.board();
    let exercise = lab_exercises::find("report-api").unwrap();
    for check in exercise.checks() {
        let ann_cell = cell(&grid, "Аня", check.name).unwrap();
        assert_eq!(ann_cell["verdict"], "pass", "{ann_cell}");
        let bob_cell = cell(&grid, "Bob", check.name).unwrap();
        let expected = if check.starter_fails { "fail" } else { "pass" };
        assert_eq!(bob_cell["verdict"], expected, "{}: {bob_cell}", check.name);
        if check.starter_fails {
            // Bob's broken invariant is the check's commonest, in his words (Russian: his lab's).
            let summary = grid["checks"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["check"] == check.name)
                .unwrap();
            assert_eq!(
                summary["commonest_broken"]["reason_key"],
                bob_cell["reason_key"]
            );
            assert_eq!(summary["passing"], 1);
        }
    }

    // Ann's service, run by hand on a database of its own, checked from the instructor's side.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let servers = runtime
        .block_on(lab_infra::Servers::start(
            &lab_infra::ServerOptions::default(),
            lab_infra::Needs::POSTGRES,
        ))
        .unwrap();
    let database_url = servers.postgres.as_ref().unwrap().target.url().to_string();
    let schema = std::fs::read_to_string(ann.join("schema.sql")).unwrap();
    runtime.block_on(async {
        let pool = sqlx::PgPool::connect(&database_url).await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(schema))
            .execute(&pool)
            .await
            .unwrap();
    });
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut service = std::process::Command::new(ann.join(".venv/bin/python"))
        .arg("app.py")
        .current_dir(&ann)
        .env("PORT", port.to_string())
        .env("DATABASE_URL", &database_url)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let target = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "Ann's service never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
    let verified = lab(&[
        "class",
        "verify",
        "аня",
        "report-api",
        "--target",
        &target,
        "--database-url",
        &database_url,
        "--board",
        &board.url,
        "--token",
        &board.token,
        "--lang",
        "en",
    ])
    .env("TMPDIR", tmp.path())
    .output()
    .unwrap();
    let _ = service.kill();
    let _ = service.wait();
    runtime.block_on(servers.shutdown());
    assert_code(&verified, 0);
    assert!(
        stdout(&verified).contains("marked verified"),
        "{}",
        stdout(&verified)
    );
    let grid = board.board();
    for check in exercise.checks() {
        let ann_cell = cell(&grid, "Аня", check.name).unwrap();
        // A check that must restart the service cannot be verified from outside: it stays
        // self-reported.
        let source = if check.restarts {
            "self_reported"
        } else {
            "verified"
        };
        assert_eq!(ann_cell["source"], source, "{}: {ann_cell}", check.name);
        assert_eq!(ann_cell["verdict"], "pass");
    }
    // A wrong token verifies nothing.
    let refused = lab(&[
        "class",
        "verify",
        "Аня",
        "report-api",
        "--target",
        &target,
        "--board",
        &board.url,
        "--token",
        "not-the-token",
    ])
    .output()
    .unwrap();
    assert_code(&refused, 3);
    assert!(
        stderr(&refused).contains("not this board's instructor token"),
        "{}",
        stderr(&refused)
    );
    board.stop();
    common::assert_nothing_left(tmp.path());
}
