//! Given URLs with a query, run spaces built from several scripts, and `lab doctor`'s plan,
//! against throwaway servers.

use lab_infra::{Needs, Origin, RunSpace, ServerOptions, Servers, TemplatePlace};

/// A run's schema on a server given as `...?sslmode=disable`: the run's pool and its psql URL
/// both work, and releasing the run drops its schema.
#[tokio::test(flavor = "multi_thread")]
async fn a_given_url_with_a_query_works_for_a_run() {
    // Without a template: this test is about URLs, and must not touch the user's cache.
    let no_template = ServerOptions {
        pg_template: TemplatePlace::Off,
        ..ServerOptions::default()
    };
    let throwaway = Servers::start(&no_template, Needs::POSTGRES).await.unwrap();
    let base = throwaway
        .postgres
        .as_ref()
        .unwrap()
        .target
        .url()
        .to_string();
    // The form learners export, with a query.
    let given = format!(
        "{}?sslmode=disable",
        base.replace("postgresql://", "postgresql+psycopg://")
    );
    let servers = Servers::start(
        &ServerOptions::new(Some(given), None).unwrap(),
        Needs::POSTGRES,
    )
    .await
    .unwrap();
    let pg = servers.postgres.as_ref().unwrap();
    assert_eq!(pg.origin, Origin::Given);
    assert_eq!(pg.target.url(), format!("{base}?sslmode=disable"));

    let space = RunSpace::create(
        &servers,
        &[
            "CREATE TABLE first (id int PRIMARY KEY)",
            "CREATE TABLE second (first_id int REFERENCES first (id))",
            "INSERT INTO first VALUES (1); INSERT INTO second VALUES (1)",
        ],
    )
    .await
    .unwrap();
    let pool = space.pg.as_ref().unwrap();
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = $1 \
         ORDER BY table_name",
    )
    .bind(&space.schema)
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(tables, ["first", "second"]);
    let joined: i64 = sqlx::query_scalar("SELECT count(*) FROM first JOIN second ON id = first_id")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(joined, 1);

    // The psql URL keeps the query and adds the schema as a query pair of its own.
    let pg_url = space.pg_url.clone().unwrap();
    assert_eq!(
        pg_url,
        format!(
            "{base}?sslmode=disable&options=-csearch_path%3D{}",
            space.schema
        )
    );
    // sqlx reads it...
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&pg_url)
        .await
        .unwrap();
    let search_path: String = sqlx::query_scalar("SHOW search_path")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(search_path, space.schema);
    drop(conn);
    // ...and so does psql, which is what the URL is for (when psql is installed).
    if lab_infra::binaries::on_path("psql").is_some() {
        let out = tokio::process::Command::new("psql")
            .args([pg_url.as_str(), "-XAtc", "SELECT count(*) FROM second"])
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1");
    }

    let schema = space.schema.clone();
    space.release(&servers, false).await.unwrap();
    let left: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.schemata WHERE schema_name = $1",
    )
    .bind(&schema)
    .fetch_one(&pg.admin)
    .await
    .unwrap();
    assert_eq!(left, 0, "the run's schema is dropped");

    servers.shutdown().await;
    throwaway.shutdown().await;
}

/// The plan names the programs and their versions, asked without blocking the runtime.
#[tokio::test(flavor = "current_thread")]
async fn the_plan_names_programs_and_versions() {
    let plan = Servers::plan(&ServerOptions::default()).await;
    let postgres = plan.postgres.unwrap();
    assert!(postgres.starts_with("throwaway: "), "{postgres}");
    assert!(postgres.contains("(postgres (PostgreSQL) "), "{postgres}");
    let redis = plan.redis.unwrap();
    // Redis says "Redis server v=…", Valkey "Valkey server v=…".
    assert!(redis.contains(" server v="), "{redis}");

    let given = ServerOptions::new(
        Some("postgresql://lab:secret@db.example/lab?sslmode=require".into()),
        Some("redis://127.0.0.1:6379".into()),
    )
    .unwrap();
    let plan = Servers::plan(&given).await;
    assert_eq!(
        plan.postgres.unwrap(),
        "given: postgresql://lab:***@db.example/lab?sslmode=require"
    );
    assert_eq!(plan.redis.unwrap(), "given: redis://127.0.0.1:6379");
}
