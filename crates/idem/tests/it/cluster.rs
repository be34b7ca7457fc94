//! The coordinator on a three-node Redis Cluster of our own.
//!
//! A cluster refuses a script whose keys live in different hash slots (`CROSSSLOT`), so the
//! hardened policy works here only if every fence counter shares its record's slot. These tests
//! check that against the cluster itself (`CLUSTER KEYSLOT`) and run the concurrency scenarios
//! through a cluster connection, for keys of every shape `fence_key` distinguishes.

use crate::support;

use std::time::Duration;

use idem::{Coordinator, Policy, Request, Source};
use serde_json::json;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordinator_runs_on_a_cluster() {
    let cluster = RedisCluster::start();
    let conn = cluster.connection().await;

    // Keys of the three shapes: no braces, a hash tag, and a stray '}' with no tag.
    let keys = ["plain-key", "{tenant-7}order-1", "odd}key"];
    for key in keys {
        let coordinator = Coordinator::new(conn.clone(), Policy::hardened());
        let record_key = coordinator.record_key("payment.charge", key);
        let fence_key = coordinator.fence_key("payment.charge", key);
        let node = cluster.nodes[0].port.to_string();
        let slot_of = |name: &str| {
            let out = std::process::Command::new(support::redis_cli())
                .args(["-p", &node, "cluster", "keyslot", name])
                .output()
                .unwrap();
            String::from_utf8(out.stdout)
                .unwrap()
                .trim()
                .parse::<u16>()
                .unwrap()
        };
        assert_eq!(
            slot_of(&record_key),
            idem::key::hash_slot(&record_key),
            "{record_key}"
        );
        assert_eq!(
            slot_of(&fence_key),
            slot_of(&record_key),
            "{fence_key} vs {record_key}"
        );

        // Each shape works end to end: reserve.lua and complete.lua touch both keys.
        let request = Request::new("payment.charge", key, Duration::from_secs(3600));
        let first = coordinator
            .coordinate(request, |fence| async move {
                Ok::<_, String>(json!({"fence": fence.token}))
            })
            .await
            .unwrap();
        assert!(
            matches!(first.source, Source::Ran),
            "{key}: {:?}",
            first.source
        );
        assert_eq!(first.value, json!({"fence": 1}));
        let replay = coordinator
            .coordinate(request, |_| async {
                Err::<serde_json::Value, _>("must replay".to_owned())
            })
            .await
            .unwrap();
        assert!(matches!(replay.source, Source::Replayed));
    }

    // The concurrency scenarios, through the cluster connection, on keys in different slots.
    hundred_concurrent_raise(conn.clone(), Policy::hardened(), "raise-hardened").await;
    hundred_concurrent_raise(conn.clone(), Policy::compatible(), "raise-compatible").await;
    hundred_concurrent_wait(conn.clone(), Policy::hardened(), "{wait}hardened").await;
    hundred_concurrent_wait(conn.clone(), Policy::compatible(), "wait-compatible").await;
}
