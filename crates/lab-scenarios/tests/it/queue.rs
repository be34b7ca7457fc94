//! The at-least-once queue on a real Redis: delivery, acknowledgement, redelivery of what was
//! not acknowledged (with its delivery count), dead letters, the isolation of a run's keys, and a
//! consumer that carries on after its Redis link was cut.

use std::time::Duration;

use lab_infra::{Needs, ServerOptions, Servers};
use lab_scenarios::chain::queue::{CLAIM_MIN_IDLE, InvoiceJob, Queue};

fn job(version: u32) -> InvoiceJob {
    InvoiceJob {
        tenant_id: "6f1c2d3e-4a5b-4c6d-8e7f-0a1b2c3d4e5f".into(),
        order_id: "0b7e4c1a-2d3f-4e5a-9b6c-7d8e9f0a1b2c".into(),
        invoice_version: version,
        email: "anna@example.com".into(),
    }
}

async fn redis() -> (Servers, redis::aio::MultiplexedConnection) {
    let servers = Servers::start(
        &ServerOptions::default(),
        Needs {
            postgres: false,
            redis: true,
        },
    )
    .await
    .unwrap();
    let conn = servers.redis.as_ref().unwrap().conn.clone();
    (servers, conn)
}

#[tokio::test(flavor = "multi_thread")]
async fn what_is_not_acknowledged_comes_back_with_its_delivery_count() {
    let (servers, conn) = redis().await;
    let queue = Queue::open(conn.clone(), "lab:q1:", "invoices")
        .await
        .unwrap();
    // Opening again (another worker) is fine: the group exists.
    let again = Queue::open(conn.clone(), "lab:q1:", "invoices")
        .await
        .unwrap();

    let first = queue.publish(&job(1)).await.unwrap();
    let delivered = queue.receive("a").await.unwrap().expect("a delivery");
    assert_eq!(
        (delivered.entry.as_str(), delivered.count),
        (first.as_str(), 1)
    );
    assert_eq!(delivered.job, job(1));
    assert!(
        again.receive("b").await.unwrap().is_none(),
        "delivered once"
    );

    // Not acknowledged: pending, and not yet claimable before the visibility timeout.
    let pending = queue.pending().await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!((pending[0].consumer.as_str(), pending[0].count), ("a", 1));
    assert!(
        again.reclaim("b").await.unwrap().is_none(),
        "not idle long enough"
    );

    // The timeout passes (simulated): the entry is redelivered to b, count 2, same entry.
    queue
        .age(&pending[0], CLAIM_MIN_IDLE + Duration::from_secs(1))
        .await
        .unwrap();
    let redelivered = again.reclaim("b").await.unwrap().expect("a redelivery");
    assert_eq!(
        (redelivered.entry.as_str(), redelivered.count),
        (first.as_str(), 2)
    );
    assert_ne!(redelivered.delivery_id(), delivered.delivery_id());
    assert_eq!(queue.pending().await.unwrap()[0].consumer, "b");

    again.ack(&redelivered.entry).await.unwrap();
    assert!(queue.pending().await.unwrap().is_empty());
    assert_eq!(queue.undelivered().await.unwrap(), 0);
    servers.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_letter_keeps_its_job_and_reason_and_is_acknowledged() {
    let (servers, conn) = redis().await;
    let queue = Queue::open(conn.clone(), "lab:q2:", "invoices")
        .await
        .unwrap();
    queue.publish(&job(1)).await.unwrap();
    queue.publish(&job(2)).await.unwrap();
    assert_eq!(queue.undelivered().await.unwrap(), 2);
    let delivery = queue.receive("a").await.unwrap().unwrap();
    queue
        .dead_letter(&delivery, "another recipient")
        .await
        .unwrap();
    assert!(queue.pending().await.unwrap().is_empty(), "acknowledged");
    assert_eq!(
        queue.dead_letters().await.unwrap(),
        vec![(job(1), "another recipient".to_string())]
    );
    assert_eq!(queue.undelivered().await.unwrap(), 1, "v2 still waits");

    // Every key the queue made is under the prefix.
    let mut conn = conn;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(keys.iter().all(|k| k.starts_with("lab:q2:")), "{keys:?}");
    servers.shutdown().await;
}

/// A consumer whose connection was cut and restored since its last command (a blip, a failover)
/// reads, acknowledges and claims as before: its first command is sent once more on the fresh
/// connection. A plain command on a connection cut the same way fails, which is what the queue
/// would otherwise hand the worker.
#[tokio::test(flavor = "multi_thread")]
async fn a_consumer_carries_on_after_its_redis_link_was_cut_and_restored() {
    let (servers, direct) = redis().await;
    // The run's Redis through a proxy of the test's own, user, password and database kept.
    let direct_url = servers.redis.as_ref().unwrap().url.clone();
    let upstream = lab_services::stage::redis_addr(&direct_url).unwrap();
    let proxies = faultproxy::FaultProxy::new();
    let hop = proxies
        .create("redis", "127.0.0.1:0", &upstream.to_string())
        .await
        .unwrap();
    let through_hop =
        lab_services::stage::with_addr(&direct_url, hop.listen.parse().unwrap()).unwrap();
    let link = lab_services::spec::redis_connection(&through_hop).unwrap();
    let mut plain = lab_services::spec::redis_connection(&through_hop).unwrap();

    let producer = Queue::open(direct.clone(), "lab:q4:", "invoices")
        .await
        .unwrap();
    let consumer = producer.on(link);
    // Both links are up and have been used once.
    assert!(consumer.pending().await.unwrap().is_empty());
    let _: String = redis::cmd("PING").query_async(&mut plain).await.unwrap();

    let entry = producer.publish(&job(1)).await.unwrap();
    let hop = proxies.get("redis").unwrap();
    hop.set_enabled(false).await.unwrap();
    hop.set_enabled(true).await.unwrap();

    let cut: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut plain).await;
    assert!(cut.is_err(), "the cut dropped the connection: {cut:?}");
    let delivered = consumer.receive("a").await.unwrap().expect("a delivery");
    assert_eq!(delivered.entry, entry);

    hop.set_enabled(false).await.unwrap();
    hop.set_enabled(true).await.unwrap();
    consumer.ack(&delivered.entry).await.unwrap();
    assert!(producer.pending().await.unwrap().is_empty());

    let mut direct = direct;
    let _: () = redis::cmd("DEL")
        .arg(&producer.stream)
        .query_async(&mut direct)
        .await
        .unwrap();
    servers.shutdown().await;
}
