//! The throwaway servers die with the `lab` process, even when it is killed with SIGKILL (no
//! `Drop`, no shutdown), and not before: not when the thread that asked for them ends.
//!
//! The test runs this same test binary again as the "lab" process (the ignored test below,
//! which does nothing unless `LAB_INFRA_CHILD` is set), kills it with SIGKILL and watches its
//! servers go.

use crate::common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{processes_in, runs, shared_tempdir};
use lab_infra::{Needs, ServerOptions, Servers};

const CHILD: &str = "LAB_INFRA_CHILD";

/// The child "lab" process, killed if the test fails before it does.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn servers_die_with_the_lab_process_and_only_then() {
    let tmp = shared_tempdir();
    // The template goes to a private cache, not the user's.
    let cache = tempfile::tempdir().unwrap();
    let mut child = Killed(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "parent_death::child_lab_process",
                "--ignored",
                "--nocapture",
            ])
            .args(["--test-threads", "1"])
            .env(CHILD, "1")
            .env("TMPDIR", tmp.path())
            .env("LAB_CACHE_DIR", cache.path())
            // Its end of this pipe closes when this process dies: the child then ends too.
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    let pids: Vec<u32> = loop {
        let line = lines
            .next()
            .expect("the child ended without a word")
            .unwrap();
        // The line starts with libtest's "test child_lab_process ... ".
        if let Some((_, pids)) = line.split_once("READY ") {
            break pids.split(' ').map(|p| p.parse().unwrap()).collect();
        }
        assert!(!line.contains("DEAD"), "{line}");
    };
    assert_eq!(pids.len(), 2, "a PostgreSQL and a Redis");
    assert!(!processes_in(tmp.path()).is_empty());

    child.0.kill().unwrap();
    child.0.wait().unwrap();

    // SIGKILL from the kernel ends the postmaster and redis-server at once; PostgreSQL's own
    // children notice their postmaster is gone and exit within moments.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let left = processes_in(tmp.path());
        if left.is_empty() && !pids.iter().any(|&p| runs(p)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "servers outlived the lab process: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Nobody was left to remove the directories (the process was killed): `tmp` goes with
    // them when dropped.
}

/// The "lab" process of the test above: starts servers from a thread that then ends, checks
/// that they outlive that thread, reports their pids and waits to be killed.
#[test]
#[ignore = "run by servers_die_with_the_lab_process_and_only_then"]
fn child_lab_process() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let pids = std::thread::spawn(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let servers = runtime
            .block_on(Servers::start(&ServerOptions::default(), Needs::BOTH))
            .unwrap();
        let pids = servers.throwaway_pids();
        // Only the kernel may stop them now.
        std::mem::forget(servers);
        pids
    })
    .join()
    .unwrap();
    // The thread that started them, and its runtime, are gone: with PR_SET_PDEATHSIG tied to
    // it, the servers would be dead by now.
    std::thread::sleep(Duration::from_millis(500));
    let words: Vec<String> = pids.iter().map(u32::to_string).collect();
    if pids.iter().all(|&p| runs(p)) {
        println!("READY {}", words.join(" "));
    } else {
        println!("DEAD: a server died with the thread that started it: {words:?}");
    }
    // Until killed, or until the test is gone (its end of stdin closes).
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}
