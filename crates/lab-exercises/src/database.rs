//! The learner's program on PostgreSQL: the run's schema with the lessons' tables, and the role
//! the program logs in as.
//!
//! On a throwaway server the program gets a role of the run's own that **owns** the run's schema
//! and its tables: it may create, alter and drop tables there (a service that runs its
//! migrations, `CREATE TABLE IF NOT EXISTS` or SQLAlchemy's `create_all` at start-up works), and
//! it may not touch anything outside it: no other schema, no new schema, no database, no
//! superuser. On a server the learner gave, the lab cannot count on making roles: the program
//! gets the given login, confined by its search path only.

use lab_infra::{Origin, RunSpace, Servers};
use sqlx::AssertSqlSafe;

use crate::error::ExerciseError;

/// The run's schema, with `schema.sql`'s tables in it.
pub async fn open_space(servers: &Servers) -> Result<RunSpace, ExerciseError> {
    if servers.postgres.is_none() {
        return Err(ExerciseError::ServerMissing("PostgreSQL"));
    }
    Ok(RunSpace::create(servers, &[crate::files::SCHEMA_TEXT]).await?)
}

/// The URL the learner's program connects with: the run's schema as its search path, and (on a
/// throwaway server) the run's own role, made the owner of the schema and of everything the lab
/// put in it.
pub async fn guest_database_url(
    servers: &Servers,
    space: &RunSpace,
) -> Result<String, ExerciseError> {
    let postgres = servers
        .postgres
        .as_ref()
        .ok_or(ExerciseError::ServerMissing("PostgreSQL"))?;
    let url = postgres.target.guest_url(&space.schema)?;
    if postgres.origin != Origin::Throwaway {
        return Ok(url);
    }
    let role = &space.schema;
    // The schema's name is `lab_` and eight hex digits: nothing else reaches this SQL. The
    // tables the lab created (and their sequences, which follow them) change hands too, so a
    // migration may alter them; the lab still reads and writes them as the server's superuser.
    let sql = format!(
        "CREATE ROLE {role} LOGIN;
         ALTER SCHEMA {role} OWNER TO {role};
         DO $$ DECLARE t text; BEGIN
           FOR t IN SELECT tablename FROM pg_tables WHERE schemaname = '{role}' LOOP
             EXECUTE format('ALTER TABLE {role}.%I OWNER TO {role}', t);
           END LOOP;
         END $$;"
    );
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(&postgres.admin)
        .await?;
    let mut url = reqwest::Url::parse(&url).map_err(|e| ExerciseError::Service {
        service: "run's database URL",
        reason: e.to_string(),
    })?;
    url.set_username(role)
        .map_err(|()| ExerciseError::Service {
            service: "run's database URL",
            reason: "it has no user".into(),
        })?;
    Ok(url.into())
}

/// Releases the run's schema (with everything in it, whoever owns it) and then its role.
pub async fn release(servers: &Servers, space: RunSpace) -> Result<(), ExerciseError> {
    let schema = space.schema.clone();
    space.release(servers, false).await?;
    if let Some(postgres) = &servers.postgres
        && postgres.origin == Origin::Throwaway
    {
        let sql = format!("DROP ROLE IF EXISTS {schema}");
        let _ = sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&postgres.admin)
            .await;
    }
    Ok(())
}
