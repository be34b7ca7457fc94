//! A start cut short leaves nothing: `Servers::start` dropped at any point (a timeout, an
//! aborted task — what Ctrl-C does in the CLI) leaves no server, no `initdb`, no copy of the
//! template under way and no temporary directory, and no half-built template in the cache;
//! and a finished start, shut down or just dropped, leaves nothing either.
//!
//! One test in its own binary: it points `TMPDIR` at a private directory, which is process-wide.

#[path = "it/common/mod.rs"]
mod common;

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
    // Made before `TMPDIR` points at `tmp`, where nothing but the servers' directories may be.
    let cache = tempfile::tempdir().unwrap();
    // SAFETY: set before any other thread of this test binary exists (the only test here, and
    // the runtime is built below), so nothing reads the environment concurrently.
    unsafe { std::env::set_var("TMPDIR", tmp.path()) };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // A private cache, empty: the first starts run initdb, the later ones copy the template.
    let options = ServerOptions {
        pg_template: TemplatePlace::In(cache.path().to_path_buf()),
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
            running_at_drop.extend(processes_in(tmp.path()));
            drop(start);
            if let Some(servers) = started {
                servers.unwrap().shutdown().await;
            }
            assert_nothing_left(tmp.path(), &format!("start dropped after {ms} ms"));
            only_templates(cache.path(), &format!("start dropped after {ms} ms"));
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
        assert_nothing_left(tmp.path(), "after a start that finished");
        assert_eq!(
            only_templates(cache.path(), "after the starts that finished"),
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
            copies_hit += usize::from(copy_under_way(tmp.path()));
            drop(start);
            if let Some(servers) = started {
                servers.unwrap().shutdown().await;
            }
            assert_nothing_left(tmp.path(), &format!("copy dropped after {ms} ms"));
            assert_eq!(only_templates(cache.path(), "after a dropped copy"), 1);
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
            assert_nothing_left(tmp.path(), &format!("start aborted after {ms} ms"));
            only_templates(cache.path(), &format!("start aborted after {ms} ms"));
        }

        // Started and dropped instead of shut down: `Drop` stops and removes everything too.
        let servers = Servers::start(&options, Needs::BOTH).await.unwrap();
        assert_eq!(servers.throwaway_pids().len(), 2);
        assert!(
            entries(tmp.path()).iter().any(|e| e.starts_with("lab-pg-")),
            "the servers are not in the private TMPDIR: {:?}",
            entries(tmp.path())
        );
        drop(servers);
        assert_nothing_left(tmp.path(), "servers dropped");

        // The normal way out.
        let servers = Servers::start(&options, Needs::BOTH).await.unwrap();
        servers.shutdown().await;
        assert_nothing_left(tmp.path(), "servers shut down");
    });
}
