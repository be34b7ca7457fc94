//! A start cut short leaves nothing: `Servers::start` dropped at any point (a timeout, an
//! aborted task — what Ctrl-C does in the CLI) leaves no server, no `initdb`, no copy of the
//! template under way and no temporary directory, and no half-built template in the cache;
//! and a finished start, shut down or just dropped, leaves nothing either.
//!
//! It points `TMPDIR` at a private directory, which is process-wide: the test runs in a process
//! of its own ([`crate::alone`]).

use crate::alone::{is_child, run_alone};
use crate::common;

use std::path::Path;
use std::time::Duration;

use common::{assert_nothing_left, entries, processes_in, shared_tempdir};
use lab_infra::{Needs, ServerOptions, Servers, TemplatePlace};

/// Asserts that the cache holds nothing but templates: no build, nothing thrown away.
#[track_caller]
fn only_templates(cache: &Path, when: &str) -> usize {
    let left = entries(cache);
    let stray: Vec<&String> = left
        .iter()
        .filter(|e| !e.starts_with("postgres-"))
        .collect();
    assert!(stray.is_empty(), "{when}: left in the cache: {stray:?}");
    left.len()
}

/// A throwaway PostgreSQL's directory in `tmp` with a data directory that is being copied:
/// there, but no server started on it yet (it would have a log) and no initdb at work.
fn copy_under_way(tmp: &Path) -> bool {
    entries(tmp).iter().any(|e| {
        let dir = tmp.join(e);
        e.starts_with("lab-pg-")
            && dir.join("data").exists()
            && !dir.join("postgres.log").exists()
            && !dir.join("initdb.log").exists()
    })
}

#[test]
fn a_dropped_start_leaves_nothing() {
    let tmp = shared_tempdir();
    // Made outside `tmp`, where nothing but the servers' directories may be.
    let cache = tempfile::tempdir().unwrap();
    run_alone(
        "cancel::in_a_process_of_its_own",
        [
            ("TMPDIR", tmp.path().as_os_str()),
            (CACHE, cache.path().as_os_str()),
        ],
    );
}

/// Where the child finds the private cache (not `LAB_CACHE_DIR`: the options name it).
const CACHE: &str = "LAB_INFRA_CANCEL_CACHE";

/// The test itself, in the child process of the one above, whose `TMPDIR` is a private folder.
#[test]
#[ignore = "run in a process of its own by a_dropped_start_leaves_nothing"]
fn in_a_process_of_its_own() {
    if !is_child() {
        return;
    }
    let tmp = std::env::temp_dir();
    let tmp = tmp.as_path();
    let cache = std::path::PathBuf::from(std::env::var_os(CACHE).unwrap());
    let cache = cache.as_path();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // A private cache, empty: the first starts run initdb, the later ones copy the template.
    let options = ServerOptions {
        pg_template: TemplatePlace::In(cache.to_path_buf()),
        ..ServerOptions::default()
    };

    runtime.block_on(async {
        // Dropped after a timeout, on whichever thread polls it: before initdb, during initdb
        // (about a second here), while the servers start, and after they are up. What runs at
        // the moment of the drop is noted, to show that the drops hit initdb at work.
        let mut running_at_drop = Vec::new();
        for ms in [
            0, 1, 5, 20, 50, 100, 200, 350, 500, 750, 1000, 1500, 2000, 3000,
        ] {
            let mut start = Box::pin(Servers::start(&options, Needs::BOTH));
            let started = tokio::select! {
                started = &mut start => Some(started),
                _ = tokio::time::sleep(Duration::from_millis(ms)) => None,
            };
            running_at_drop.extend(processes_in(tmp));
            drop(start);
            if let Some(servers) = started {
                servers.unwrap().shutdown().await;
            }
            assert_nothing_left(tmp, &format!("start dropped after {ms} ms"));
            only_templates(cache, &format!("start dropped after {ms} ms"));
        }
        assert!(
            running_at_drop.iter().any(|p| p.contains("initdb")),
            "no drop happened while initdb ran: {running_at_drop:?}"
        );
        // One start to its end, however slow the machine is (on a loaded one, initdb alone can
        // outlast every delay above): it leaves the template the copies below start from.
        Servers::start(&options, Needs::BOTH)
            .await
            .expect("a start left to finish")
            .shutdown()
            .await;
        assert_nothing_left(tmp, "after a start that finished");
        assert_eq!(
            only_templates(cache, "after the starts that finished"),
            1,
            "no template was made"
        );

        // With the template: dropped before, during and after the copy (a thousand files, on
        // the disk `TMPDIR` is on), and while the server starts.
        let mut copies_hit = 0;
        for ms in (0..=100).step_by(5).chain([150, 200, 300, 500]) {
            let mut start = Box::pin(Servers::start(&options, Needs::BOTH));
            let started = tokio::select! {
                started = &mut start => Some(started),
                _ = tokio::time::sleep(Duration::from_millis(ms)) => None,
            };
            copies_hit += usize::from(copy_under_way(tmp));
            drop(start);
            if let Some(servers) = started {
                servers.unwrap().shutdown().await;
            }
            assert_nothing_left(tmp, &format!("copy dropped after {ms} ms"));
            assert_eq!(only_templates(cache, "after a dropped copy"), 1);
        }
        assert!(
            copies_hit > 0,
            "no drop happened while the template was copied"
        );

        // Aborted as a task: dropped on a worker thread, as a cancelled run is.
        for ms in [0, 30, 150, 400, 800, 1200] {
            let options = options.clone();
            let task = tokio::spawn(async move { Servers::start(&options, Needs::BOTH).await });
            tokio::time::sleep(Duration::from_millis(ms)).await;
            task.abort();
            // Once the handle reports the task cancelled, its future has been dropped.
            match task.await {
                Ok(servers) => servers.unwrap().shutdown().await,
                Err(e) => assert!(e.is_cancelled()),
            }
            assert_nothing_left(tmp, &format!("start aborted after {ms} ms"));
            only_templates(cache, &format!("start aborted after {ms} ms"));
        }

        // Started and dropped instead of shut down: `Drop` stops and removes everything too.
        let servers = Servers::start(&options, Needs::BOTH).await.unwrap();
        assert_eq!(servers.throwaway_pids().len(), 2);
        assert!(
            entries(tmp).iter().any(|e| e.starts_with("lab-pg-")),
            "the servers are not in the private TMPDIR: {:?}",
            entries(tmp)
        );
        drop(servers);
        assert_nothing_left(tmp, "servers dropped");

        // The normal way out.
        let servers = Servers::start(&options, Needs::BOTH).await.unwrap();
        servers.shutdown().await;
        assert_nothing_left(tmp, "servers shut down");
    });
}
