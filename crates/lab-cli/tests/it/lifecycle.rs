//! What a run leaves behind: nothing. Ctrl-C, `q` in step mode, two runs at once on one server,
//! and the same narrative every time.

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::Stdio;

use common::{
    assert_code, assert_nothing_left, catalogue, entries, lab, processes_in, shared_tempdir,
    signal, stderr, stdout,
};
use lab_infra::{Needs, ServerOptions, Servers};
use nix::sys::signal::Signal;

/// Runs each `lab` command line at the same time, each in a process of its own (its own
/// throwaway servers), and returns their outputs in order. At the same time on purpose: a loaded
/// machine must not change a story, and it takes the time of the longest, not of all.
fn all_at_once(calls: &[Vec<String>]) -> Vec<std::process::Output> {
    let commands = calls
        .iter()
        .map(|args| lab(&args.iter().map(String::as_str).collect::<Vec<_>>()))
        .collect();
    common::outputs_at_once(commands)
}

fn words(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

#[test]
fn two_runs_tell_the_same_story_byte_for_byte() {
    let calls: Vec<Vec<String>> = ["en", "en", "ru", "ru"]
        .iter()
        .map(|lang| words(&["run", "all", "--lang", lang]))
        .collect();
    let outs = all_at_once(&calls);
    for out in &outs {
        assert_code(out, 0);
    }
    assert_eq!(stdout(&outs[0]), stdout(&outs[1]), "en narratives differ");
    assert_eq!(stdout(&outs[2]), stdout(&outs[3]), "ru narratives differ");
}

/// Twenty runs of every scenario, two in each of ten `lab` calls at once (ten sets of servers,
/// on a machine they load together): the twenty narratives of a scenario are identical, races
/// and timeouts included. Ten calls of two, not four of five: most of a run is waiting (a
/// scenario's leases expire in real time), so more calls at once finish sooner and load the
/// machine more.
#[test]
fn twenty_runs_of_each_scenario_are_identical() {
    const CALLS: usize = 10;
    const RUNS: usize = 2;
    let names = catalogue();
    let mut args = words(&["run", "--lang", "en"]);
    for name in &names {
        args.extend(std::iter::repeat_n(name.clone(), RUNS));
    }
    let outs = all_at_once(&vec![args; CALLS]);
    // Each scenario's narrative starts with its title line; the runs of one scenario follow one
    // another in each call.
    let mut by_scenario: Vec<Vec<String>> = vec![Vec::new(); names.len()];
    for out in &outs {
        assert_code(out, 0);
        let text = stdout(out);
        let runs: Vec<&str> = text.split("\n━━ ").skip(1).collect();
        assert_eq!(runs.len(), names.len() * RUNS);
        for (i, chunk) in runs.chunks(RUNS).enumerate() {
            by_scenario[i].extend(chunk.iter().map(|run| run.to_string()));
        }
    }
    for (name, runs) in names.iter().zip(&by_scenario) {
        for (n, run) in runs.iter().enumerate() {
            assert_eq!(*run, runs[0], "{name}: run {} differs from run 1", n + 1);
        }
    }
}

#[test]
fn ctrl_c_mid_run_leaves_no_server_and_no_temp_dir() {
    stop_mid_run(Signal::SIGINT, 130);
}

#[test]
fn sigterm_mid_run_leaves_no_server_and_no_temp_dir() {
    stop_mid_run(Signal::SIGTERM, 143);
}

/// Sends `sig` while a run waits at its first pause, servers up; expects `code` and nothing
/// left behind.
fn stop_mid_run(sig: Signal, code: i32) {
    let tmp = shared_tempdir();
    let mut child = lab(&["run", "all", "--step", "--lang", "en", "--color", "never"])
        .env("TMPDIR", tmp.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Keep stdin open and silent: lab waits at the first pause, mid-run, servers up.
    let _stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut seen = String::new();
    while !seen.contains(" 1. ") {
        let mut line = String::new();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "lab ended early: {seen}"
        );
        seen.push_str(&line);
    }
    // The state line after step 1 is printed before the pause; now the servers run.
    assert!(
        entries(tmp.path()).iter().any(|e| e.starts_with("lab-pg-")),
        "no throwaway PostgreSQL dir in {:?}",
        entries(tmp.path())
    );
    assert!(
        !processes_in(tmp.path()).is_empty(),
        "no server process found"
    );

    signal(&child, sig);
    let status = child.wait().unwrap();
    let mut rest = String::new();
    let _ = out.read_to_string(&mut rest);
    let mut err = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    assert_eq!(status.code(), Some(code), "stderr: {err}");
    assert!(err.contains("interrupted"), "{err}");
    assert_nothing_left(tmp.path());
}

#[test]
fn quitting_step_mode_cleans_up() {
    let tmp = shared_tempdir();
    let mut child = lab(&["run", "duplicate", "--step"])
        .env("TMPDIR", tmp.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"\n\nq\n").unwrap();
    let out = child.wait_with_output().unwrap();
    // `q` is a stop before the facts: the interrupt's code, not "every fact as expected".
    assert_code(&out, 130);
    assert!(stderr(&out).contains("stopped"), "{}", stderr(&out));
    assert!(stdout(&out).contains(" 3. ") && !stdout(&out).contains(" 4. "));
    assert_nothing_left(tmp.path());
}

/// Two `lab run all` at once on one PostgreSQL and one Redis: both pass, tell the same story,
/// and leave the server as they found it, including data that looks like theirs but is not.
#[tokio::test(flavor = "multi_thread")]
async fn two_runs_at_once_on_one_server_are_isolated() {
    let servers = Servers::start(&ServerOptions::default(), Needs::BOTH)
        .await
        .unwrap();
    let pg = servers.postgres.as_ref().unwrap();
    let redis = servers.redis.as_ref().unwrap();
    let admin = &pg.admin;
    // Someone else's data, including a schema whose name starts like ours.
    for sql in [
        "CREATE TABLE public.someone_elses (id int)",
        "INSERT INTO public.someone_elses VALUES (1)",
        "CREATE SCHEMA lab_notarun",
        "CREATE TABLE lab_notarun.reports (id int)",
    ] {
        sqlx::query(sql).execute(admin).await.unwrap();
    }
    let mut conn = redis.conn.clone();
    redis::cmd("SET")
        .arg("someone:else")
        .arg("1")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    redis::cmd("SET")
        .arg("lab:notarun:key")
        .arg("1")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();

    let args = [
        "run",
        "all",
        "--lang",
        "en",
        "--database-url",
        pg.target.url(),
        "--redis-url",
        &redis.url,
    ];
    let first = lab(&args).stdout(Stdio::piped()).spawn().unwrap();
    let second = lab(&args).stdout(Stdio::piped()).spawn().unwrap();
    // The second run's output is read only once the first has ended, on purpose: its stdout
    // pipe fills and nobody reads it for the whole first run, as when a learner pipes into
    // `less` and stays on page one. Its story must not change (the narrative is queued, see
    // `output.rs`): before, its redis-down handler stopped mid-request on the full pipe while
    // the client's 10 s ran out.
    let (first, second) = tokio::task::spawn_blocking(move || {
        (
            first.wait_with_output().unwrap(),
            second.wait_with_output().unwrap(),
        )
    })
    .await
    .unwrap();
    assert_code(&first, 0);
    assert_code(&second, 0);
    assert_eq!(stdout(&first), stdout(&second));

    let run_schemas: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.schemata WHERE schema_name ~ '^lab_[0-9a-f]{8}$'",
    )
    .fetch_one(admin)
    .await
    .unwrap();
    assert_eq!(run_schemas, 0, "a run schema was left behind");
    let theirs: i64 = sqlx::query_scalar("SELECT count(*) FROM public.someone_elses")
        .fetch_one(admin)
        .await
        .unwrap();
    assert_eq!(theirs, 1);
    sqlx::query("SELECT * FROM lab_notarun.reports")
        .execute(admin)
        .await
        .expect("a schema that is not a run's is untouched");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut keys = keys;
    keys.sort();
    assert_eq!(keys, ["lab:notarun:key", "someone:else"]);
    servers.shutdown().await;
}

/// `q` in step mode on a given server: the run's schema is dropped, every time (the quit and the
/// release race; the release must win or leave the run to the abandoned-run cleanup).
#[tokio::test(flavor = "multi_thread")]
async fn quitting_on_a_given_server_leaves_no_schema() {
    let servers = Servers::start(&ServerOptions::default(), Needs::BOTH)
        .await
        .unwrap();
    let pg_url = servers.postgres.as_ref().unwrap().target.url().to_string();
    let redis_url = servers.redis.as_ref().unwrap().url.clone();
    for answers in ["q\n", "\nq\n", "\n\n\nq\n", "\n\n\n\n\n\n\n\nq\n"] {
        let (pg_url, redis_url) = (pg_url.clone(), redis_url.clone());
        let out = tokio::task::spawn_blocking(move || {
            let mut child = lab(&["run", "duplicate", "--step"])
                .args(["--database-url", &pg_url, "--redis-url", &redis_url])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            child
                .stdin
                .take()
                .unwrap()
                .write_all(answers.as_bytes())
                .unwrap();
            child.wait_with_output().unwrap()
        })
        .await
        .unwrap();
        assert_code(&out, 130);
        let left: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM information_schema.schemata WHERE schema_name ~ '^lab_[0-9a-f]{8}$'",
        )
        .fetch_one(&servers.postgres.as_ref().unwrap().admin)
        .await
        .unwrap();
        assert_eq!(left, 0, "a schema was left after answers {answers:?}");
    }
    servers.shutdown().await;
}
