//! The PostgreSQL template: made by the first start and used by the next ones (which run no
//! `initdb`), made once by two starts racing on an empty cache, rebuilt when damaged or when
//! its copy does not start, left alone when off, skipped when the cache cannot be written, and
//! found through `LAB_CACHE_DIR`. Every start is shut down, leaving nothing in `TMPDIR`.
//!
//! It points `TMPDIR` and `LAB_CACHE_DIR` at private directories, which is process-wide: the
//! test runs in a process of its own ([`crate::alone`]).

use crate::alone::{is_child, run_alone};
use crate::common;

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};

use common::{assert_nothing_left, entries, shared_tempdir};
use lab_infra::postgres::Cluster;
use lab_infra::{Needs, ServerOptions, Servers, TemplatePlace};

/// Options for throwaway servers with the template in `cache`.
fn in_cache(cache: &Path) -> ServerOptions {
    ServerOptions {
        pg_template: TemplatePlace::In(cache.to_path_buf()),
        ..ServerOptions::default()
    }
}

/// The templates in `cache`: what is there apart from them (a build, a thrown-away template)
/// fails the test, since every start is over when this is called.
#[track_caller]
fn templates(cache: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for name in entries(cache) {
        assert!(name.starts_with("postgres-"), "left in the cache: {name}");
        found.push(cache.join(name));
    }
    found
}

/// Whether `initdb` ran for the server that is up now: it leaves its log in the server's
/// directory, the only `lab-pg-*` in the private `TMPDIR`. (Observed, not timed.)
#[track_caller]
fn initdb_ran(tmp: &Path) -> bool {
    let dirs: Vec<String> = entries(tmp)
        .into_iter()
        .filter(|e| e.starts_with("lab-pg-"))
        .collect();
    assert_eq!(dirs.len(), 1, "one server, in the private TMPDIR: {dirs:?}");
    tmp.join(&dirs[0]).join("initdb.log").exists()
}

/// Starts a throwaway PostgreSQL, checks it answers, and returns how its cluster was made and
/// whether `initdb` ran; shuts it down and checks that nothing is left.
async fn start_once(options: &ServerOptions, tmp: &Path) -> (Cluster, bool) {
    let servers = Servers::start(options, Needs::POSTGRES).await.unwrap();
    let pg = servers.postgres.as_ref().unwrap();
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&pg.admin)
        .await
        .unwrap();
    assert_eq!(one, 1);
    let made = (pg.cluster.unwrap(), initdb_ran(tmp));
    servers.shutdown().await;
    assert_nothing_left(tmp, "after a shutdown");
    made
}

#[test]
fn the_template_is_made_once_reused_and_rebuilt_when_broken() {
    let tmp = shared_tempdir();
    let caches = tempfile::tempdir().unwrap();
    run_alone(
        "template::in_a_process_of_its_own",
        [
            ("TMPDIR", tmp.path().as_os_str()),
            ("LAB_CACHE_DIR", caches.path().join("from-env").as_os_str()),
            // Empty counts as unset: the default options keep a template.
            ("LAB_NO_TEMPLATE", OsStr::new("")),
        ],
    );
}

/// The test itself, in the child process of the one above: `TMPDIR` and `LAB_CACHE_DIR` are
/// private folders there (`from-env`, inside the folder of the other caches).
#[test]
#[ignore = "run in a process of its own by the_template_is_made_once_reused_and_rebuilt_when_broken"]
fn in_a_process_of_its_own() {
    if !is_child() {
        return;
    }
    let tmp = std::env::temp_dir();
    let tmp = tmp.as_path();
    let from_env = PathBuf::from(std::env::var_os("LAB_CACHE_DIR").unwrap());
    let caches = from_env.parent().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    runtime.block_on(async {
        // Two starts at once on an empty cache: both succeed, and one template is left.
        let cache = caches.join("race");
        let options = in_cache(&cache);
        let (first, second) = tokio::join!(
            Servers::start(&options, Needs::POSTGRES),
            Servers::start(&options, Needs::POSTGRES)
        );
        let (first, second) = (first.unwrap(), second.unwrap());
        for servers in [&first, &second] {
            let pg = servers.postgres.as_ref().unwrap();
            let one: i32 = sqlx::query_scalar("SELECT 1")
                .fetch_one(&pg.admin)
                .await
                .unwrap();
            assert_eq!(one, 1);
        }
        tokio::join!(first.shutdown(), second.shutdown());
        assert_nothing_left(tmp, "two starts at once");
        let made = templates(&cache);
        assert_eq!(made.len(), 1, "one template: {made:?}");
        let template = made[0].clone();
        assert!(template.join("PG_VERSION").is_file());

        // The next start copies it: no initdb.
        assert_eq!(start_once(&options, tmp).await, (Cluster::Template, false));
        assert_eq!(templates(&cache), std::slice::from_ref(&template));

        // A file deleted from the template: noticed, the template is rebuilt by initdb...
        fs::remove_file(template.join("PG_VERSION")).unwrap();
        assert_eq!(start_once(&options, tmp).await, (Cluster::Initdb, true));
        assert_eq!(templates(&cache), std::slice::from_ref(&template));
        assert!(template.join("PG_VERSION").is_file(), "rebuilt whole");
        // ...and used again.
        assert_eq!(start_once(&options, tmp).await, (Cluster::Template, false));

        // A template that passes the checks but whose copy does not start (its control file
        // zeroed, same size): thrown away and rebuilt.
        let control = template.join("global/pg_control");
        let size = fs::metadata(&control).unwrap().len();
        fs::write(&control, vec![0u8; size as usize]).unwrap();
        assert_eq!(start_once(&options, tmp).await, (Cluster::Initdb, true));
        assert_eq!(start_once(&options, tmp).await, (Cluster::Template, false));
        assert_eq!(templates(&cache), std::slice::from_ref(&template));

        // Templates off: initdb, and the cache is not touched.
        let off = ServerOptions {
            pg_template: TemplatePlace::Off,
            ..ServerOptions::default()
        };
        let before = fs::metadata(&template).unwrap().modified().unwrap();
        assert_eq!(start_once(&off, tmp).await, (Cluster::Initdb, true));
        assert_eq!(templates(&cache), std::slice::from_ref(&template));
        assert_eq!(fs::metadata(&template).unwrap().modified().unwrap(), before);

        // A cache that cannot be made (under a file, so even root cannot): initdb, no error.
        let file = caches.join("a-file");
        fs::write(&file, "").unwrap();
        assert_eq!(
            start_once(&in_cache(&file.join("cache")), tmp).await,
            (Cluster::Initdb, true)
        );

        // The default options find the cache through LAB_CACHE_DIR.
        assert!(!from_env.exists());
        assert_eq!(
            start_once(&ServerOptions::default(), tmp).await,
            (Cluster::Initdb, true)
        );
        assert_eq!(templates(&from_env).len(), 1);
        assert_eq!(
            start_once(&ServerOptions::default(), tmp).await,
            (Cluster::Template, false)
        );
    });
}
