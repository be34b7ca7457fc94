//! The board over HTTP, on a throwaway PostgreSQL: what a class does to it (join, post, read),
//! what a hostile or careless client does (wrong codes, forged tokens, a learner posting as
//! another, bodies too big or malformed, a flood of posts), and what each may see.

use std::net::SocketAddr;

use lab_class::model::{Kind, Reason, VerdictPost};
use lab_class::{Board, Client, PageTexts, Store};
use lab_infra::{Needs, ServerOptions, Servers};
use serde_json::{Value, json};

/// A board on its own throwaway PostgreSQL, on a free loopback port.
struct Rig {
    servers: Servers,
    board: Board,
    code: String,
    token: String,
    http: reqwest::Client,
}

impl Rig {
    async fn start() -> Rig {
        let servers = Servers::start(&ServerOptions::default(), Needs::POSTGRES)
            .await
            .expect("a throwaway PostgreSQL");
        let store = Store::open(pool(&servers).await).await.unwrap();
        let (code, token) = (store.class_code.clone(), store.instructor_token.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let texts = PageTexts {
            lang: "en".into(),
            ui: json!({"en": {}, "ru": {}}),
            learners_url: None,
        };
        let board = Board::start(listener, store, texts).unwrap();
        Rig {
            servers,
            board,
            code,
            token,
            http: reqwest::Client::new(),
        }
    }

    fn addr(&self) -> SocketAddr {
        self.board.addr
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr())
    }

    /// A raw request: its status and its JSON body (`Value::Null` if it had none).
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        bearer: Option<&str>,
        body: Option<String>,
    ) -> (u16, Value) {
        let mut request = self.http.request(method, self.url(path));
        if let Some(token) = bearer {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.body(body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn post(&self, path: &str, bearer: Option<&str>, body: Value) -> (u16, Value) {
        self.call(reqwest::Method::POST, path, bearer, Some(body.to_string()))
            .await
    }

    async fn board(&self, bearer: Option<&str>) -> Value {
        let (status, board) = self
            .call(reqwest::Method::GET, "/api/board", bearer, None)
            .await;
        assert_eq!(status, 200, "{board}");
        board
    }

    async fn join(&self, name: &str) -> String {
        let joined = Client::new(&self.url("/"))
            .unwrap()
            .join(&self.code, name)
            .await
            .unwrap();
        joined.token
    }

    async fn stop(self) {
        self.board.stop().await;
        self.servers.shutdown().await;
    }
}

async fn pool(servers: &Servers) -> sqlx::PgPool {
    let target = &servers.postgres.as_ref().unwrap().target;
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .connect_with(target.options().clone())
        .await
        .unwrap()
}

fn verdict(check: &str, kind: Kind, key: Option<&str>) -> VerdictPost {
    VerdictPost {
        exercise: "report-api".into(),
        check: check.into(),
        verdict: kind,
        reason_key: key.map(str::to_string),
        reason: key.map(|k| Reason {
            en: format!("the words of {k}"),
            ru: format!("слова {k}"),
        }),
        replay: key.map(|_| format!("lab exercise check report-api --only {check} --seed 7")),
        schedule: key.map(|_| lab_class::model::Schedule {
            en: vec![
                format!("1. {check}: two requests"),
                "   client → POST /reports".into(),
            ],
            ru: vec![
                format!("1. {check}: два запроса"),
                "   client → POST /reports".into(),
            ],
        }),
    }
}

fn cell<'b>(board: &'b Value, learner: &str, check: &str) -> Option<&'b Value> {
    let id = board["learners"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == learner || l["label"] == learner)?["id"]
        .clone();
    board["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["learner"] == id && c["check"] == check)
}

/// Every refusal is a 4xx whose body says why in `error`.
fn assert_refused(status: u16, body: &Value, expected: u16, what: &str) {
    assert_eq!(status, expected, "{what}: {body}");
    assert!(
        body["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{what}: no JSON error: {body}"
    );
}

#[tokio::test]
async fn a_class_posts_and_the_grid_shows_the_newest_verdict_per_cell() {
    let rig = Rig::start().await;
    let ann = rig.join("Ann").await;
    let bob = rig.join("Bob").await;
    let client = Client::new(&rig.url("/")).unwrap();
    client
        .send(
            &ann,
            &verdict("race", Kind::Fail, Some("fail.race.two_reports")),
        )
        .await
        .unwrap();
    client
        .send(&ann, &verdict("race", Kind::Pass, None))
        .await
        .unwrap();
    client
        .send(
            &bob,
            &verdict("race", Kind::Fail, Some("fail.race.two_reports")),
        )
        .await
        .unwrap();
    client
        .send(
            &bob,
            &verdict("replay", Kind::Unknown, Some("unknown.no_answer")),
        )
        .await
        .unwrap();

    // The instructor sees names; the newest verdict of each cell.
    let board = rig.board(Some(&rig.token)).await;
    assert_eq!(board["instructor"], true);
    assert_eq!(cell(&board, "Ann", "race").unwrap()["verdict"], "pass");
    assert_eq!(cell(&board, "Bob", "race").unwrap()["verdict"], "fail");
    assert_eq!(cell(&board, "Bob", "replay").unwrap()["verdict"], "unknown");
    assert!(cell(&board, "Ann", "replay").is_none());
    let race = board["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "race")
        .unwrap();
    assert_eq!(
        (race["passing"].as_u64(), race["reported"].as_u64()),
        (Some(1), Some(2))
    );
    assert_eq!(
        race["commonest_broken"]["reason_key"],
        "fail.race.two_reports"
    );
    assert_eq!(race["commonest_broken"]["count"], 1);
    assert_eq!(
        race["commonest_broken"]["replay"],
        "lab exercise check report-api --only race --seed 7"
    );
    assert_eq!(
        race["commonest_broken"]["schedule"]["ru"],
        json!(["1. race: два запроса", "   client → POST /reports"])
    );
    assert_eq!(board["join"]["code"], rig.code.as_str());

    // Anyone else, and the instructor in projector mode: numbers, no names, no code.
    for (bearer, query) in [(None, ""), (Some(rig.token.as_str()), "?projector=1")] {
        let (status, board) = rig
            .call(
                reqwest::Method::GET,
                &format!("/api/board{query}"),
                bearer,
                None,
            )
            .await;
        assert_eq!(status, 200);
        assert!(
            board["learners"]
                .as_array()
                .unwrap()
                .iter()
                .all(|l| l["name"].is_null()),
            "{board}"
        );
        assert!(!board.to_string().contains("Ann"), "{board}");
        assert_eq!(cell(&board, "#1", "race").unwrap()["verdict"], "pass");
    }
    let anonymous = rig.board(None).await;
    assert!(
        anonymous["join"].is_null(),
        "the class code is the projector's alone"
    );

    // The history: every verdict, newest first; the exports: the cells with names.
    let ann_id = board["learners"][0]["id"].as_i64().unwrap();
    let path = format!("/api/learners/{ann_id}/history");
    let (status, history) = rig
        .call(reqwest::Method::GET, &path, Some(&rig.token), None)
        .await;
    assert_eq!(status, 200);
    let verdicts: Vec<&str> = history["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["verdict"].as_str().unwrap())
        .collect();
    assert_eq!(verdicts, ["pass", "fail"]);
    assert!(history["verdicts"][0]["schedule"].is_null());
    assert_eq!(
        history["verdicts"][1]["schedule"]["en"][0],
        "1. race: two requests"
    );
    let (status, body) = rig.call(reqwest::Method::GET, &path, None, None).await;
    assert_refused(status, &body, 403, "a history without the token");
    let csv = rig
        .http
        .get(rig.url(&format!("/export.csv?token={}", rig.token)))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        csv.starts_with("learner,exercise,check,verdict,source"),
        "{csv}"
    );
    assert!(
        csv.contains("\nAnn,report-api,race,pass,self-reported,"),
        "{csv}"
    );
    assert_eq!(csv.lines().count(), 4, "a header and three cells: {csv}");
    let junit = rig
        .http
        .get(rig.url("/export.junit.xml"))
        .bearer_auth(&rig.token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(junit.contains("<testsuite name=\"Bob\""), "{junit}");
    assert!(junit.contains("<failure"), "{junit}");
    let (status, body) = rig
        .call(reqwest::Method::GET, "/export.csv", None, None)
        .await;
    assert_refused(status, &body, 403, "an export without the token");

    // A verified verdict is marked so, and becomes the cell's newest.
    client
        .send_verified(&rig.token, "bob", &verdict("race", Kind::Pass, None))
        .await
        .unwrap();
    let board = rig.board(Some(&rig.token)).await;
    let bobs = cell(&board, "Bob", "race").unwrap();
    assert_eq!(
        (bobs["verdict"].as_str(), bobs["source"].as_str()),
        (Some("pass"), Some("verified"))
    );
    rig.stop().await;
}

#[tokio::test]
async fn hostile_and_forged_requests_are_refused_with_a_json_reason() {
    let rig = Rig::start().await;
    let ann = rig.join("Ann").await;
    let bob = rig.join("Bob").await;
    let race = json!({"exercise": "report-api", "check": "race", "verdict": "pass"});

    // Joining: a wrong code, no code, a taken name (in any case), names that are not names.
    let cases = [
        (
            json!({"code": "WRONG1", "name": "Eve"}),
            403,
            "a wrong code",
        ),
        (json!({"name": "Eve"}), 400, "no code"),
        (
            json!({"code": rig.code, "name": "ann"}),
            409,
            "a taken name",
        ),
        (
            json!({"code": rig.code, "name": "   "}),
            400,
            "an empty name",
        ),
        (
            json!({"code": rig.code, "name": "x".repeat(41)}),
            400,
            "a long name",
        ),
        (
            json!({"code": rig.code, "name": "Eve\u{7}"}),
            400,
            "a control character",
        ),
        (
            json!({"code": rig.code, "name": "Eve", "admin": true}),
            400,
            "an unknown field",
        ),
    ];
    for (body, expected, what) in cases {
        let (status, body) = rig.post("/api/join", None, body).await;
        assert_refused(status, &body, expected, what);
    }

    // Posting: no token, a forged one, the instructor's in a learner's place.
    let (status, body) = rig.post("/api/verdicts", None, race.clone()).await;
    assert_refused(status, &body, 401, "no token");
    let (status, body) = rig.post("/api/verdicts", Some("f00d"), race.clone()).await;
    assert_refused(status, &body, 403, "a forged token");
    let (status, body) = rig
        .post(
            "/api/verified",
            Some(&ann),
            json!({"learner": "Bob", "verdict": race}),
        )
        .await;
    assert_refused(status, &body, 403, "a learner posting a verified verdict");

    // A learner posting as another: a post names no learner, and one that tries is refused;
    // Bob's cells stay empty whatever Ann sends.
    let as_bob =
        json!({"learner": "Bob", "exercise": "report-api", "check": "race", "verdict": "fail"});
    let (status, body) = rig.post("/api/verdicts", Some(&ann), as_bob).await;
    assert_refused(status, &body, 400, "a post naming a learner");
    let (status, _) = rig.post("/api/verdicts", Some(&ann), race.clone()).await;
    assert_eq!(status, 201);
    let board = rig.board(Some(&rig.token)).await;
    assert!(cell(&board, "Ann", "race").is_some());
    assert!(cell(&board, "Bob", "race").is_none(), "{board}");

    // Bodies the board will not keep.
    let posts = [
        (
            json!({"exercise": "rm -rf", "check": "race", "verdict": "pass"}),
            "an unknown exercise",
        ),
        (
            json!({"exercise": "report-api", "check": "<script>", "verdict": "pass"}),
            "an unknown check",
        ),
        (
            json!({"exercise": "report-api", "check": "race", "verdict": "skipped"}),
            "a verdict a cell has not",
        ),
        (
            json!({"exercise": "report-api", "check": "race", "verdict": "pass", "code": "import os"}),
            "code",
        ),
        (
            json!({"exercise": "report-api", "check": "race", "verdict": "fail", "reason": "x".repeat(1001)}),
            "a long reason",
        ),
        (
            json!({"exercise": "report-api", "check": "race", "verdict": "fail", "reason_key": "a b"}),
            "a key with a space",
        ),
        (
            json!({"exercise": "report-api", "check": "race", "verdict": "fail", "replay": "\u{1b}[2J"}),
            "an escape",
        ),
        (json!([1, 2, 3]), "not an object"),
    ];
    for (body, what) in posts {
        let (status, body) = rig.post("/api/verdicts", Some(&bob), body).await;
        assert_refused(status, &body, 400, what);
    }
    let (status, body) = rig
        .call(
            reqwest::Method::POST,
            "/api/verdicts",
            Some(&bob),
            Some("{not json".into()),
        )
        .await;
    assert_refused(status, &body, 400, "a body that is not JSON");
    let (status, body) = rig
        .call(
            reqwest::Method::POST,
            "/api/verdicts",
            Some(&bob),
            Some("x".repeat(lab_class::model::MAX_BODY_BYTES + 1)),
        )
        .await;
    assert_refused(status, &body, 413, "a body over 64 KiB");
    let (status, body) = rig
        .call(reqwest::Method::DELETE, "/api/board", None, None)
        .await;
    assert_refused(status, &body, 405, "a wrong method");
    let (status, body) = rig.call(reqwest::Method::GET, "/admin", None, None).await;
    assert_refused(status, &body, 404, "an unknown path");
    let (status, body) = rig
        .call(
            reqwest::Method::GET,
            "/api/learners/x/history",
            Some(&rig.token),
            None,
        )
        .await;
    assert_refused(status, &body, 400, "a learner id that is not a number");
    let (status, body) = rig
        .post(
            "/api/verified",
            Some(&rig.token),
            json!({"learner": "Nobody", "verdict": race}),
        )
        .await;
    assert_refused(status, &body, 404, "a verified verdict for nobody");
    let board = rig.board(Some(&rig.token)).await;
    assert!(
        cell(&board, "Bob", "race").is_none(),
        "nothing of Bob's was kept: {board}"
    );
    rig.stop().await;
}

#[tokio::test]
async fn a_flood_of_posts_is_slowed_and_the_class_goes_on() {
    let rig = Rig::start().await;
    let flooder = rig.join("Flood").await;
    let ann = rig.join("Ann").await;
    let client = Client::new(&rig.url("/")).unwrap();
    // 600 posts, 50 at a time, as fast as the machine sends them: well over a hundred a second.
    let started = std::time::Instant::now();
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for _ in 0..12 {
        let posts = (0..50).map(|_| {
            rig.post(
                "/api/verdicts",
                Some(&flooder),
                json!({"exercise": "report-api", "check": "burst", "verdict": "pass"}),
            )
        });
        for (status, body) in futures_util::future::join_all(posts).await {
            assert!(status == 201 || status == 429, "{status} {body}");
            if status == 429 {
                assert!(body["error"].is_string());
            }
            *statuses.entry(status).or_default() += 1;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    assert!(
        statuses.get(&429).copied().unwrap_or(0) > 0,
        "{statuses:?} in {elapsed:.2} s: the flood was never slowed"
    );
    // Forged tokens in a flood: refused, slowed, never a 5xx.
    let tokens: Vec<String> = (0..200).map(|i| format!("forged{i}")).collect();
    let forged = tokens.iter().map(|token| {
        rig.post(
            "/api/verdicts",
            Some(token),
            json!({"exercise": "report-api", "check": "burst", "verdict": "pass"}),
        )
    });
    for (status, body) in futures_util::future::join_all(forged).await {
        assert!(status == 403 || status == 429, "{status} {body}");
    }
    // Another learner is not slowed by it, and the grid still answers.
    client
        .send(&ann, &verdict("burst", Kind::Pass, None))
        .await
        .expect("another learner posts at once");
    let board = rig.board(Some(&rig.token)).await;
    assert_eq!(cell(&board, "Ann", "burst").unwrap()["verdict"], "pass");
    assert_eq!(cell(&board, "Flood", "burst").unwrap()["verdict"], "pass");
    rig.stop().await;
}

#[tokio::test]
async fn a_board_on_a_lasting_database_keeps_its_code_its_token_and_its_class() {
    let servers = Servers::start(&ServerOptions::default(), Needs::POSTGRES)
        .await
        .unwrap();
    let first = Store::open(pool(&servers).await).await.unwrap();
    let joined = first.join("Ann").await.unwrap();
    let again = Store::open(pool(&servers).await).await.unwrap();
    assert_eq!(again.class_code, first.class_code);
    assert_eq!(again.instructor_token, first.instructor_token);
    assert_eq!(
        again
            .learner_of(&joined.token)
            .await
            .unwrap()
            .map(|l| l.name),
        Some("Ann".to_string())
    );
    // The board keeps its own schema and nothing else.
    let schemas: Vec<String> = sqlx::query_scalar(
        "SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 'lab%' ORDER BY 1",
    )
    .fetch_all(&pool(&servers).await)
    .await
    .unwrap();
    assert_eq!(schemas, ["lab_class"]);
    servers.shutdown().await;
}
