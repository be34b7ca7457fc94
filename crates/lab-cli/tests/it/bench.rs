//! `lab bench`: the rows have their shape, the bench cleans up exactly its own keys, and the
//! report service makes exactly one report per key however many requests carry it.
//!
//! No timing is asserted: CI machines are loaded, and speed is what the bench prints, not what
//! a test can promise. Small `--ops` keep these quick.

use crate::common;
// idem's own throwaway servers, a three-node cluster among them: one copy of that set-up.
use crate::idem_support;

use common::{assert_code, run, stderr, stdout};
use serde_json::Value;

/// The JSON lines of a command's stdout.
fn rows(out: &std::process::Output) -> Vec<Value> {
    stdout(out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line is JSON"))
        .collect()
}

/// A Redis of the test's own, started as `lab` starts a throwaway one, so the test can put keys
/// of its own there and look at everything afterwards.
struct OwnRedis {
    server: Option<lab_infra::process::ThrowawayServer>,
    runtime: tokio::runtime::Runtime,
}

impl OwnRedis {
    fn start() -> OwnRedis {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let program = lab_infra::binaries::redis_program()
            .expect("a Redis server program")
            .path;
        let server = runtime
            .block_on(lab_infra::redis_server::start(&program))
            .expect("a throwaway Redis");
        OwnRedis {
            server: Some(server),
            runtime,
        }
    }

    fn url(&self) -> String {
        self.server.as_ref().unwrap().url.clone()
    }

    fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            self.runtime.block_on(server.stop());
        }
    }
}

#[test]
fn coordinator_rows_have_their_shape_and_only_the_bench_keys_go() {
    let redis = OwnRedis::start();
    let mut conn = redis.connection();
    // Keys that are not the bench's, one of them with a look-alike prefix.
    redis::cmd("SET")
        .arg("app:order:1")
        .arg("keep me")
        .exec(&mut conn)
        .unwrap();
    redis::cmd("SET")
        .arg("lab:bench:not-ours")
        .arg("keep me too")
        .exec(&mut conn)
        .unwrap();

    let url = redis.url();
    let out = run(&[
        "bench",
        "coordinator",
        "--ops",
        "30",
        "--concurrency",
        "1,4",
        "--format",
        "json",
        "--redis-url",
        &url,
    ]);
    assert_code(&out, 0);
    let rows = rows(&out);
    // path × policy × concurrency.
    assert_eq!(rows.len(), 2 * 2 * 2, "{}", stdout(&out));
    let mut seen = Vec::new();
    for row in &rows {
        let fields: Vec<&str> = row
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            fields,
            [
                "bench",
                "path",
                "policy",
                "concurrency",
                "ops",
                "ops_per_sec",
                "p50_us",
                "p99_us",
                "raw_ops_per_sec",
                "ratio_to_raw"
            ],
            "{row}"
        );
        assert_eq!(row["bench"], "idem");
        assert_eq!(row["ops"], 30);
        let ops_per_sec = row["ops_per_sec"].as_f64().unwrap();
        let raw = row["raw_ops_per_sec"].as_f64().unwrap();
        let ratio = row["ratio_to_raw"].as_f64().unwrap();
        assert!(ops_per_sec > 0.0 && raw > 0.0, "{row}");
        assert!(
            (ratio - ops_per_sec / raw).abs() <= 1e-9 * ratio.max(1.0),
            "{row}"
        );
        let p50 = row["p50_us"].as_f64().unwrap();
        let p99 = row["p99_us"].as_f64().unwrap();
        assert!(p50 > 0.0 && p50 <= p99, "{row}");
        seen.push(format!(
            "{} {} {}",
            row["path"].as_str().unwrap(),
            row["policy"].as_str().unwrap(),
            row["concurrency"]
        ));
    }
    seen.sort();
    assert_eq!(
        seen,
        [
            "new compatible 1",
            "new compatible 4",
            "new hardened 1",
            "new hardened 4",
            "replay compatible 1",
            "replay compatible 4",
            "replay hardened 1",
            "replay hardened 4",
        ]
    );

    // Nothing of the bench is left; everything else is as it was.
    let mut left: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    left.sort();
    assert_eq!(left, ["app:order:1", "lab:bench:not-ours"]);
    let kept: String = redis::cmd("GET")
        .arg("app:order:1")
        .query(&mut conn)
        .unwrap();
    assert_eq!(kept, "keep me");
}

#[test]
fn coordinator_prints_a_table_in_the_learners_language() {
    let out = run(&[
        "bench",
        "coordinator",
        "--ops",
        "5",
        "--concurrency",
        "2",
        "--lang",
        "ru",
    ]);
    assert_code(&out, 0);
    let text = stdout(&out);
    assert!(text.contains("оп/с"), "{text}");
    assert!(text.contains("replay"), "{text}");
    // No colour and no progress bar when neither stream is a terminal.
    assert!(!text.contains('\u{1b}'), "{text}");
    assert!(!stderr(&out).contains('\u{1b}'), "{}", stderr(&out));
}

#[test]
fn an_unreachable_redis_is_the_environment() {
    // Port 1 on loopback: nothing listens there.
    let out = run(&[
        "bench",
        "coordinator",
        "--ops",
        "5",
        "--redis-url",
        "redis://127.0.0.1:1",
    ]);
    assert_code(&out, 3);
    assert!(stderr(&out).contains("Redis"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
}

#[test]
fn report_api_makes_exactly_one_report_per_key() {
    let out = run(&[
        "bench",
        "report-api",
        "--requests",
        "200",
        "--keys",
        "20",
        "--concurrency",
        "8",
        "--format",
        "json",
    ]);
    assert_code(&out, 0);
    let rows = rows(&out);
    let via: Vec<&str> = rows.iter().map(|r| r["via"].as_str().unwrap()).collect();
    assert_eq!(via, ["http", "sqlx"], "{}", stdout(&out));
    for row in &rows {
        assert_eq!(row["bench"], "report-api");
        assert_eq!(row["reports"], 20, "{row}");
        assert_eq!(row["expected_reports"], 20, "{row}");
        assert_eq!(row["created"], 20, "{row}");
        assert_eq!(row["replayed"], 180, "{row}");
        assert!(row["requests_per_sec"].as_f64().unwrap() > 0.0, "{row}");
        assert!(
            row["p50_us"].as_f64().unwrap() <= row["p99_us"].as_f64().unwrap(),
            "{row}"
        );
        // The sides take turns; each tells its CPU per request: the lab's own (measured to the
        // microsecond, so never 0 for a request that went through it), and the throwaway
        // server's (read in clock ticks, so a short run may round it to 0).
        assert_eq!(row["rounds"], 3, "{row}");
        assert!(row["cpu_own_us"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["cpu_postgres_us"].as_f64().unwrap() >= 0.0, "{row}");
    }
}

/// `--pgbench`: the same statements through PostgreSQL's own client on the same server, a third
/// row (`.ci/run`'s machine has pgbench with PostgreSQL's client programs).
#[test]
fn report_api_sends_the_same_statements_through_pgbench() {
    let out = run(&[
        "bench",
        "report-api",
        "--requests",
        "200",
        "--keys",
        "20",
        "--concurrency",
        "4",
        "--pgbench",
        "--format",
        "json",
    ]);
    assert_code(&out, 0);
    let rows = rows(&out);
    let via: Vec<&str> = rows.iter().map(|r| r["via"].as_str().unwrap()).collect();
    assert_eq!(via, ["http", "sqlx", "pgbench"], "{}", stdout(&out));
    let pgbench = &rows[2];
    // 4 clients × 50 transactions, over keys drawn at random from 20.
    let reports = pgbench["reports"].as_u64().unwrap();
    assert!((1..=20).contains(&reports), "{pgbench}");
    assert_eq!(
        pgbench["created"].as_u64().unwrap() + pgbench["replayed"].as_u64().unwrap(),
        200
    );
    assert!(
        pgbench["requests_per_sec"].as_f64().unwrap() > 0.0,
        "{pgbench}"
    );
    assert!(
        pgbench["p50_us"].as_f64().unwrap() <= pgbench["p99_us"].as_f64().unwrap(),
        "{pgbench}"
    );
    for row in &rows {
        assert!(row["ratio_to_pgbench"].as_f64().unwrap() > 0.0, "{row}");
    }
    // pgbench's own CPU is its process's, waited for at the end of each of its rounds.
    assert!(pgbench["cpu_own_us"].as_f64().unwrap() > 0.0, "{pgbench}");
}

#[test]
fn report_api_refuses_a_target_that_is_not_a_url() {
    let out = run(&["bench", "report-api", "--target", "localhost:8480"]);
    assert_code(&out, 2);
}

/// The load generator speaks plain HTTP/1.1, as wrk does: an https target is refused up front
/// (exit 2), not failed on its first request.
#[test]
fn report_api_refuses_an_https_target() {
    let out = run(&["bench", "report-api", "--target", "https://127.0.0.1:8480"]);
    assert_code(&out, 2);
    assert!(stderr(&out).contains("plain HTTP/1.1"), "{}", stderr(&out));
}

#[test]
fn report_api_says_when_the_target_does_not_answer() {
    // Port 1 on loopback: nothing listens there.
    let out = run(&[
        "bench",
        "report-api",
        "--requests",
        "5",
        "--keys",
        "1",
        "--target",
        "http://127.0.0.1:1",
    ]);
    assert_code(&out, 3);
    assert!(stderr(&out).contains("report service"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
}

#[test]
fn coordinator_runs_on_a_cluster_and_cleans_every_master() {
    let cluster = idem_support::RedisCluster::start();
    let node = |i: usize| cluster.nodes[i].url();
    let clients: Vec<redis::Client> = (0..3)
        .map(|i| redis::Client::open(node(i)).unwrap())
        .collect();
    // Keys of someone else's, in three different slots (their hash tags pick them).
    let cluster_client = redis::cluster::ClusterClient::new(vec![node(0)]).unwrap();
    let mut conn = cluster_client.get_connection().unwrap();
    for key in ["{a}other", "{b}other", "{c}other"] {
        redis::cmd("SET")
            .arg(key)
            .arg("keep")
            .exec(&mut conn)
            .unwrap();
    }

    let url = node(1);
    let out = run(&[
        "bench",
        "coordinator",
        "--ops",
        "20",
        "--concurrency",
        "1,4",
        "--format",
        "json",
        "--redis-url",
        &url,
    ]);
    assert_code(&out, 0);
    assert_eq!(rows(&out).len(), 8, "{}", stdout(&out));

    let mut left = Vec::new();
    for client in &clients {
        let mut node = client.get_connection().unwrap();
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut node).unwrap();
        left.extend(keys);
    }
    left.sort();
    assert_eq!(left, ["{a}other", "{b}other", "{c}other"]);
}

/// `--python`: idempotency-kit 0.4.1's rows beside idem's, on the same Redis, and its keys
/// deleted with the bench's. Needs a venv with `idempotency-kit[redis]==0.4.1` named by
/// IDEM_PYTHON (`.ci/run` makes one in target/idem-py).
#[test]
#[ignore = "drives the Python idempotency-kit 0.4.1: set IDEM_PYTHON to a venv's python"]
fn coordinator_adds_idempotency_kits_rows() {
    let python = std::env::var("IDEM_PYTHON").expect("IDEM_PYTHON names a venv's python");
    let redis = OwnRedis::start();
    let url = redis.url();
    let out = run(&[
        "bench",
        "coordinator",
        "--ops",
        "20",
        "--concurrency",
        "1,4",
        "--format",
        "json",
        "--redis-url",
        &url,
        "--python",
        &python,
    ]);
    assert_code(&out, 0);
    let rows = rows(&out);
    let python_rows: Vec<&Value> = rows
        .iter()
        .filter(|r| r["bench"] == "idempotency-kit")
        .collect();
    assert_eq!(python_rows.len(), 2 * 2, "{}", stdout(&out));
    for row in python_rows {
        assert_eq!(row["policy"], "0.4.1 wait");
        assert_eq!(row["ops"], 20);
        let ratio = row["ratio_to_raw"].as_f64().unwrap();
        let expected =
            row["ops_per_sec"].as_f64().unwrap() / row["raw_ops_per_sec"].as_f64().unwrap();
        assert!((ratio - expected).abs() <= 1e-9 * ratio.max(1.0), "{row}");
    }
    let mut conn = redis.connection();
    let left: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    assert_eq!(left, Vec::<String>::new());
}
