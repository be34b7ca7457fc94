//! claim_task / complete_task: the lease and the fencing token, on a real PostgreSQL.

use lab_infra::{Needs, RunSpace, ServerOptions, Servers};
use lab_scenarios::reports::{
    LESSON,
    tasks::{self, LEASE},
};

#[tokio::test(flavor = "multi_thread")]
async fn lease_and_attempts_decide_who_may_complete() {
    let servers = Servers::start(&ServerOptions::default(), Needs::POSTGRES)
        .await
        .unwrap();
    let space = RunSpace::create(&servers, &[LESSON.schema]).await.unwrap();
    let pg = space.pg.clone().unwrap();

    tasks::create_task(&pg, 42).await.unwrap();
    assert_eq!(tasks::claim_task(&pg, 42, LEASE).await.unwrap(), Some(1));
    assert_eq!(
        tasks::claim_task(&pg, 42, LEASE).await.unwrap(),
        None,
        "a live lease cannot be claimed again"
    );

    tasks::expire_lease(&pg, 42).await.unwrap();
    assert!(
        !tasks::complete_task(&pg, 42, 1, 7, true).await.unwrap(),
        "strict: expired"
    );
    assert_eq!(tasks::task(&pg, 42).await.unwrap().status, "processing");

    assert_eq!(tasks::claim_task(&pg, 42, LEASE).await.unwrap(), Some(2));
    assert!(
        !tasks::complete_task(&pg, 42, 1, 7, false).await.unwrap(),
        "a stale attempt is refused even without the lease check"
    );
    assert!(tasks::complete_task(&pg, 42, 2, 8, true).await.unwrap());
    let row = tasks::task(&pg, 42).await.unwrap();
    assert_eq!(
        (row.status.as_str(), row.attempts, row.report_id, row.lease),
        ("completed", 2, Some(8), None)
    );
    assert_eq!(tasks::claim_task(&pg, 42, LEASE).await.unwrap(), None);

    space.release(&servers, false).await.unwrap();
    servers.shutdown().await;
}
