//! `lab exercise`: the learner writes the fix, and the lab attacks it.
//!
//! The lab's scenarios show failures on code the lab wrote. An exercise turns the same attacks
//! on the learner's own program, in any language: the lab starts throwaway PostgreSQL (lesson 6)
//! or Redis (the payments lesson), gives the program a schema or a key prefix of its own, starts
//! it from its manifest, and runs checks whose oracle is real state (the rows the lab reads
//! back; the charges and emails its own provider and mailer counted), never the program's own
//! answers. Each
//! check ends pass, fail (the invariant it broke, and the schedule that broke it, replayable by
//! seed) or unknown (the check could not decide).
//!
//! # Layout
//!
//! - [`catalogue`]: every exercise, its lesson, languages, checks, and what its starters fail.
//! - [`files`]: the starters, solutions and texts under `exercises/`, embedded at build time
//!   (`build.rs`), and writing a project out without ever overwriting one.
//! - [`manifest`]: `lab-exercise.toml`, how the learner's program is built and started.
//! - [`guest`]: the learner's program as a guest: its environment, its process group, its
//!   output kept aside.
//! - [`arena`]: what a check works with: the direct and the proxied way to the program, the
//!   oracle's connections, the schedule being recorded.
//! - [`verdict`]: pass / fail / unknown / skipped, and the schedule's lines.
//! - [`state`]: the learner's progress, kept beside their code.
//! - One module per exercise with its checks, in the course's order: [`report_api`] (the
//!   learner's service, attacked from outside), [`worker`] (the learner's worker, run against
//!   the lab's report service); the payments lesson's [`charge_once`] (the learner's payment
//!   service, on Redis and the lab's provider, through the fault proxy), [`relay`] (the
//!   learner's hop between the lab's client and the lab's payment service) and
//!   [`invoice_consumer`] (the learner's consumer of a Redis Stream, against the lab's mailer).
//! - [`payment_world`]: what the payments lesson's exercises share: the lab's provider (their
//!   oracle), the payment intents, calls held at a service's checkpoint.
//! - `world`: the one loop that runs an exercise's selected checks in its world, makes the
//!   world whole after each, and reports each as it ends.
//!
//! [`check`] is the whole of one `lab exercise check`: it takes servers the caller started
//! (and stops), and cleans up everything it started itself (the run's schema or key prefix,
//! the proxy, the lab's services, the program) on every way out; dropped halfway (Ctrl-C), the program's process group is killed
//! by [`guest::Guest`]'s drop and the schema by the servers' list of live runs.

pub mod arena;
pub mod catalogue;
pub mod charge_once;
pub mod error;
pub mod files;
pub mod guest;
pub mod invoice_consumer;
pub mod manifest;
pub mod payment_world;
pub mod relay;
pub mod report_api;
pub mod state;
pub mod verdict;
pub mod worker;
mod world;

use std::path::PathBuf;

use lab_core::{Lang, Texts};
use lab_infra::{Origin, RunSpace, Servers};
use sqlx::AssertSqlSafe;

pub use catalogue::{CheckSpec, EXERCISES, Exercise, find};
pub use error::ExerciseError;
pub use guest::NotReady;
pub use manifest::Manifest;
pub use verdict::{CheckReport, Line, Outcome, Verdict};

/// The texts' scope of the words every exercise shares (`exercises/common/*.toml`); each
/// exercise's own are under its name.
pub const COMMON: &str = "exercise";

/// Every exercise's texts, in both languages.
pub fn texts() -> Result<Texts, lab_core::text::TextError> {
    let mut texts = Texts::new();
    for lang in Lang::ALL {
        if let Some(source) = files::text(&format!("common/{}.toml", lang.code())) {
            texts.add(COMMON, lang, source)?;
        }
        for exercise in EXERCISES {
            if let Some(source) = files::text(&format!("{}/{}.toml", exercise.name, lang.code())) {
                texts.add(exercise.name, lang, source)?;
            }
        }
    }
    Ok(texts)
}

/// What is checked: a program the lab starts from its folder, or a service already running.
#[derive(Debug, Clone)]
pub enum Subject {
    Program {
        dir: PathBuf,
        manifest: Manifest,
    },
    /// A service at this base URL, writing to the database given with `--database-url`.
    Target {
        url: String,
    },
}

/// How a check run is tuned.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// Only these checks (all when empty).
    pub only: Vec<String>,
    /// The seed of the checks that explore timings and inputs.
    pub seed: u64,
    /// How many times those checks repeat their exploration (the bursts).
    pub repeat: u32,
    /// More environment for the learner's program (`verify` shares one Cargo target folder
    /// between a starter and its solution).
    pub guest_env: Vec<(String, String)>,
}

/// How a check run ended.
pub enum Checked {
    /// Every selected check ran.
    Reports(Vec<CheckReport>),
    /// The program never answered: nothing could be checked.
    NotReady(NotReady),
}

/// Runs the selected checks of `exercise` against `subject`, on `servers` (PostgreSQL started
/// or given by the caller), calling `on_report` as each check ends.
pub async fn check(
    exercise: &'static Exercise,
    subject: Subject,
    servers: &Servers,
    options: &CheckOptions,
    on_report: &mut dyn FnMut(&CheckReport),
) -> Result<Checked, ExerciseError> {
    if exercise.lesson == charge_once::EXERCISE.lesson {
        return check_payments(exercise, subject, servers, options, on_report).await;
    }
    let Some(postgres) = &servers.postgres else {
        return Err(ExerciseError::Target("PostgreSQL is needed".into()));
    };
    if exercise.name == worker::EXERCISE.name {
        return check_worker(exercise, subject, servers, options, on_report).await;
    }
    match subject {
        Subject::Program { dir, manifest } => {
            let space = RunSpace::create(servers, &[files::SCHEMA_TEXT]).await?;
            let result = async {
                let pool = space.pg.clone().expect("the run has PostgreSQL");
                let channel = format!("lab_{}_committed", space.run_id);
                install_commit_notice(&pool, &channel).await?;
                let port = lab_infra::process::free_port().map_err(ExerciseError::io(&dir))?;
                let env = vec![
                    ("PORT".to_string(), port.to_string()),
                    ("HOST".to_string(), "127.0.0.1".to_string()),
                    (
                        "DATABASE_URL".to_string(),
                        guest_database_url(servers, &space).await?,
                    ),
                    ("LAB_RUN".to_string(), space.run_id.clone()),
                    // Python prints as it goes, so a program that never answers shows why.
                    ("PYTHONUNBUFFERED".to_string(), "1".to_string()),
                ];
                let env = env
                    .into_iter()
                    .chain(options.guest_env.iter().cloned())
                    .collect();
                let mut guest = guest::Guest::new(&dir, manifest, port, env)?;
                guest.build().await?;
                if let Err(not_ready) = guest.start().await? {
                    return Ok(Checked::NotReady(not_ready));
                }
                let direct = guest.base_url();
                let arena = open_arena(
                    pool,
                    &space.run_id,
                    Some(channel),
                    direct,
                    Some(guest),
                    0,
                    options,
                )
                .await?;
                Ok(Checked::Reports(
                    world::run_checks(exercise, arena, &options.only, options.seed, on_report)
                        .await?,
                ))
            }
            .await;
            let schema = space.schema.clone();
            space.release(servers, false).await?;
            drop_guest_role(servers, &schema).await;
            result
        }
        Subject::Target { url } => {
            if postgres.origin != Origin::Given {
                return Err(ExerciseError::Target(
                    "--target needs --database-url: the database the service writes to, where the lab reads its reports".into(),
                ));
            }
            let run = lab_infra::space::new_run_id();
            // Far from any task id already in the service's table.
            let task_base = 1_000_000_000
                + i64::from(u32::from_str_radix(&run, 16).unwrap_or(0) % 1_000_000) * 1000;
            let arena = open_arena(
                postgres.admin.clone(),
                &run,
                None,
                url.trim_end_matches('/').to_string(),
                None,
                task_base,
                options,
            )
            .await?;
            Ok(Checked::Reports(
                world::run_checks(exercise, arena, &options.only, options.seed, on_report).await?,
            ))
        }
    }
}

/// The `worker` exercise: the lab's report service on the run's schema, and the learner's
/// worker started for each task a check needs.
async fn check_worker(
    exercise: &'static Exercise,
    subject: Subject,
    servers: &Servers,
    options: &CheckOptions,
    on_report: &mut dyn FnMut(&CheckReport),
) -> Result<Checked, ExerciseError> {
    let Subject::Program { dir, manifest } = subject else {
        return Err(ExerciseError::Target(
            "--target does not apply to a worker: the lab starts the worker for each task itself"
                .into(),
        ));
    };
    let space = RunSpace::create(servers, &[files::SCHEMA_TEXT]).await?;
    let result = async {
        let pool = space.pg.clone().expect("the run has PostgreSQL");
        let checkpoints = lab_core::Checkpoints::new();
        let service = worker::report_service(pool.clone(), checkpoints.clone())?;
        let build = guest::Guest::new(&dir, manifest.clone(), 0, options.guest_env.clone())?;
        build.build().await?;
        let yard = worker::Yard {
            database_url: guest_database_url(servers, &space).await?,
            pool,
            schema: space.schema.clone(),
            run: space.run_id.clone(),
            service,
            checkpoints,
            dir,
            manifest,
            extra_env: options.guest_env.clone(),
            schedule: Vec::new(),
            workers: Vec::new(),
        };
        Ok(Checked::Reports(
            world::run_checks(exercise, yard, &options.only, options.seed, on_report).await?,
        ))
    }
    .await;
    let schema = space.schema.clone();
    space.release(servers, false).await?;
    drop_guest_role(servers, &schema).await;
    result
}

/// The payments lesson's exercises, on Redis: the lab's services around the learner's program
/// (the provider for `charge-once`; the provider and the payment service for `relay`; the
/// mailer for `invoice-consumer`), the program's links through the fault proxy, every key under
/// the run's prefix. The lab starts the program itself, so `--target` does not apply.
async fn check_payments(
    exercise: &'static Exercise,
    subject: Subject,
    servers: &Servers,
    options: &CheckOptions,
    on_report: &mut dyn FnMut(&CheckReport),
) -> Result<Checked, ExerciseError> {
    let Subject::Program { dir, manifest } = subject else {
        return Err(ExerciseError::Target(format!(
            "--target does not apply to {}: the lab starts your program itself, with its services and Redis behind the fault proxy",
            exercise.name
        )));
    };
    let Some(redis) = &servers.redis else {
        return Err(ExerciseError::Target("Redis is needed".into()));
    };
    let redis_addr = redis_address(&redis.url)?;
    let space = RunSpace::create(servers, &[]).await?;
    let result = async {
        guest::Guest::new(&dir, manifest.clone(), 0, options.guest_env.clone())?
            .build()
            .await?;
        let env = options.guest_env.clone();
        let (only, seed) = (&options.only, options.seed);
        let reports = match exercise.name {
            "charge-once" => {
                let prefix = format!("{}idempotency:", space.prefix);
                let conn = redis.conn.clone();
                match charge_once::open(
                    &space.run_id,
                    prefix,
                    conn,
                    &redis_addr,
                    dir,
                    manifest,
                    env,
                )
                .await?
                {
                    Ok(rig) => world::run_checks(exercise, rig, only, seed, on_report).await?,
                    Err(not_ready) => return Ok(Checked::NotReady(not_ready)),
                }
            }
            "relay" => {
                match relay::open(&space.run_id, &space.prefix, &redis.url, dir, manifest, env)
                    .await?
                {
                    Ok(chain) => world::run_checks(exercise, chain, only, seed, on_report).await?,
                    Err(not_ready) => return Ok(Checked::NotReady(not_ready)),
                }
            }
            "invoice-consumer" => {
                let conn = redis.conn.clone();
                let depot = invoice_consumer::open(
                    &space.run_id,
                    &space.prefix,
                    conn,
                    &redis_addr,
                    dir,
                    manifest,
                    env,
                )
                .await?;
                world::run_checks(exercise, depot, only, seed, on_report).await?
            }
            other => unreachable!("{other} is not one of the payments lesson's exercises"),
        };
        Ok(Checked::Reports(reports))
    }
    .await;
    space.release(servers, false).await?;
    result
}

/// `lab exercise verify`'s proof that `idem` is wire-compatible with idempotency-kit: the
/// charge-once solutions in two languages, on one Redis, one prefix and one provider, replay
/// each other's Charges ([`charge_once::cross_replay`]).
pub async fn cross_replay(
    servers: &Servers,
    first: (PathBuf, Manifest),
    second: (PathBuf, Manifest),
    guest_env: &[(String, String)],
) -> Result<Checked, ExerciseError> {
    let Some(redis) = &servers.redis else {
        return Err(ExerciseError::Target("Redis is needed".into()));
    };
    let redis_addr = redis_address(&redis.url)?;
    for (dir, manifest) in [&first, &second] {
        guest::Guest::new(dir, manifest.clone(), 0, guest_env.to_vec())?
            .build()
            .await?;
    }
    let space = RunSpace::create(servers, &[]).await?;
    let result = async {
        let rig = charge_once::open(
            &space.run_id,
            format!("{}idempotency:", space.prefix),
            redis.conn.clone(),
            &redis_addr,
            first.0,
            first.1,
            guest_env.to_vec(),
        )
        .await?;
        match rig {
            Ok(rig) => Ok(Checked::Reports(vec![
                charge_once::cross_replay(rig, &second.0, second.1).await?,
            ])),
            Err(not_ready) => Ok(Checked::NotReady(not_ready)),
        }
    }
    .await;
    space.release(servers, false).await?;
    result
}

/// The `host:port` of a Redis URL: the fault proxy's upstream.
fn redis_address(url: &str) -> Result<String, ExerciseError> {
    reqwest::Url::parse(url)
        .ok()
        .and_then(|u| Some(format!("{}:{}", u.host_str()?, u.port().unwrap_or(6379))))
        .ok_or_else(|| {
            ExerciseError::Target(format!(
                "charge-once reaches Redis through the fault proxy, so it needs Redis over TCP, not {url}"
            ))
        })
}

/// The URL the learner's program connects with: the run's schema as its search path and, on a
/// throwaway server, a role of the run's own that may use that schema and nothing else (no
/// other schema, no new schema, no superuser). On a server the learner gave, the lab cannot
/// count on making roles there: the program gets the given login, confined by its search path
/// only.
async fn guest_database_url(servers: &Servers, space: &RunSpace) -> Result<String, ExerciseError> {
    let postgres = servers.postgres.as_ref().expect("checked by the caller");
    let url = postgres.target.guest_url(&space.schema)?;
    if postgres.origin != Origin::Throwaway {
        return Ok(url);
    }
    let role = &space.schema;
    // The schema's name is `lab_` and eight hex digits: nothing else reaches this SQL.
    let sql = format!(
        "CREATE ROLE {role} LOGIN;
         GRANT USAGE ON SCHEMA {role} TO {role};
         GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {role} TO {role};
         GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA {role} TO {role};"
    );
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(&postgres.admin)
        .await?;
    let mut url = reqwest::Url::parse(&url)
        .map_err(|e| ExerciseError::Target(format!("the run's URL: {e}")))?;
    url.set_username(role)
        .map_err(|()| ExerciseError::Target("the run's URL has no user".into()))?;
    Ok(url.into())
}

/// Drops the run's guest role (after its schema: the grants went with the tables).
async fn drop_guest_role(servers: &Servers, space_schema: &str) {
    if let Some(postgres) = &servers.postgres
        && postgres.origin == Origin::Throwaway
    {
        let sql = format!("DROP ROLE IF EXISTS {space_schema}");
        let _ = sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&postgres.admin)
            .await;
    }
}

/// The trigger that tells the lab when a report is committed: PostgreSQL delivers a
/// notification only once its transaction has committed, so the `crash` check can kill the
/// program right after the COMMIT. It changes nothing the program sees.
async fn install_commit_notice(pool: &sqlx::PgPool, channel: &str) -> Result<(), ExerciseError> {
    // `channel` is made of the run id (hex digits) only.
    let sql = format!(
        "CREATE FUNCTION lab_report_committed() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN PERFORM pg_notify('{channel}', NEW.task_id::text); RETURN NEW; END $$;
         CREATE TRIGGER lab_report_committed AFTER INSERT ON reports
             FOR EACH ROW EXECUTE FUNCTION lab_report_committed();"
    );
    sqlx::raw_sql(AssertSqlSafe(sql)).execute(pool).await?;
    Ok(())
}

async fn open_arena(
    pool: sqlx::PgPool,
    run: &str,
    commit_channel: Option<String>,
    direct: String,
    guest: Option<guest::Guest>,
    task_base: i64,
    options: &CheckOptions,
) -> Result<arena::Arena, ExerciseError> {
    let upstream = reqwest::Url::parse(&direct)
        .ok()
        .and_then(|u| Some(format!("{}:{}", u.host_str()?, u.port_or_known_default()?)))
        .ok_or_else(|| ExerciseError::Target(format!("not an http URL: {direct}")))?;
    let proxies = faultproxy::FaultProxy::new();
    let info = proxies
        .create(&format!("exercise-{run}"), "127.0.0.1:0", &upstream)
        .await?;
    let proxy = proxies.get(&info.name).expect("just created");
    let client = reqwest::Client::builder()
        // One connection per call: a fault armed on the proxy's next connection is aimed at
        // exactly the call that follows.
        .pool_max_idle_per_host(0)
        .build()
        .expect("a client without TLS builds");
    Ok(arena::Arena {
        pool,
        run: run.to_string(),
        commit_channel,
        proxied: format!("http://{}", info.listen),
        direct,
        proxy,
        proxies,
        guest,
        task_base,
        seed: options.seed,
        repeat: options.repeat,
        client,
        schedule: Vec::new(),
    })
}
