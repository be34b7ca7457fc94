//! The external-URL path, against servers that are already running: the machine's own, as a
//! learner's would be. Ignored by default (a developer's machine may not have them); `.ci/run`
//! prepares a role and a database and runs it with `cargo test -- --ignored`, giving the URLs in
//! `LAB_TEST_DATABASE_URL` and `LAB_TEST_REDIS_URL`.

use crate::common;

use common::{assert_code, lab, stdout};
use sqlx::Connection;

/// The given PostgreSQL, in the lesson's SQLAlchemy form and with a query string, as learners
/// copy it.
fn database_url() -> String {
    std::env::var("LAB_TEST_DATABASE_URL").unwrap_or_else(|_| {
        "postgresql+psycopg://postgres@127.0.0.1:5432/test?sslmode=disable".to_string()
    })
}

fn redis_url() -> String {
    std::env::var("LAB_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_string())
}

/// The same server as sqlx takes it.
fn sqlx_url() -> String {
    let url = database_url();
    let (_, rest) = url.split_once("://").unwrap();
    format!("postgresql://{rest}")
}

/// Our run schemas and keys on the shared server, to compare before and after.
async fn lab_traces() -> (Vec<String>, Vec<String>) {
    let mut pg = sqlx::PgConnection::connect(&sqlx_url()).await.unwrap();
    let schemas: Vec<String> = sqlx::query_scalar(
        "SELECT schema_name::text FROM information_schema.schemata
          WHERE schema_name ~ '^lab_[0-9a-f]{8}$' ORDER BY 1",
    )
    .fetch_all(&mut pg)
    .await
    .unwrap();
    let client = redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg("lab:*")
        .query_async(&mut conn)
        .await
        .unwrap();
    keys.sort();
    (schemas, keys)
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a running PostgreSQL and Redis; .ci/run runs it with --ignored"]
async fn runs_on_given_servers_and_leaves_nothing_behind() {
    let before = lab_traces().await;
    let out = tokio::task::spawn_blocking(|| {
        lab(&["run", "all", "--format", "json"])
            .env("DATABASE_URL", database_url())
            .env("REDIS_URL", redis_url())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_code(&out, 0);
    let last: serde_json::Value =
        serde_json::from_str(stdout(&out).lines().last().unwrap()).unwrap();
    assert_eq!(last["passed"], true);
    assert_eq!(
        lab_traces().await,
        before,
        "a run schema or key was left behind"
    );

    // --log on a URL with a password: the lines tie the ids together, and the password is
    // nowhere in them.
    let out = tokio::task::spawn_blocking(|| {
        lab(&["run", "duplicate", "--log", "--color", "never"])
            .env("DATABASE_URL", database_url())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_code(&out, 0);
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(log.contains("report created"), "{log}");
    if let Some(password) =
        url::Url::parse(&database_url().replace("postgresql+psycopg", "postgresql"))
            .ok()
            .and_then(|u| u.password().map(str::to_string))
    {
        assert!(
            !log.contains(&format!(":{password}@")),
            "a password in the log: {log}"
        );
    }

    // The same with --keep: the schema stays, and lab says how to look at it.
    let out = tokio::task::spawn_blocking(|| {
        lab(&["run", "duplicate", "--keep"])
            .env("DATABASE_URL", database_url())
            .env("REDIS_URL", redis_url())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_code(&out, 0);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let schema = err
        .split_whitespace()
        .find(|w| w.starts_with("lab_"))
        .unwrap_or_else(|| panic!("no kept schema named: {err}"))
        .to_string();
    assert!(err.contains("psql '"), "{err}");
    let mut pg = sqlx::PgConnection::connect(&sqlx_url()).await.unwrap();
    let reports: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {schema}.reports"
    )))
    .fetch_one(&mut pg)
    .await
    .unwrap();
    assert_eq!(reports, 2, "the kept schema holds the run's reports");
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&mut pg)
        .await
        .unwrap();
}
