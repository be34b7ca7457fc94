//! `lab class`: the board on the instructor's machine (`lab_class`), `lab class verify`, and the
//! learner's side of `lab exercise check --class URL`: joining once, then sending each finished
//! check's verdict.
//!
//! A learner's verdicts go to the board from a task of their own, one after another, while the
//! checks go on; the run waits for them only at its end. A board that is down costs the run
//! one deadline (the first post that fails ends the sending) and one line on stderr; it never
//! changes a verdict or the exit code.

use std::net::SocketAddr;
use std::path::Path;

use lab_class::{Board, Client, PageTexts, Store, VerdictPost};
use lab_core::Msg;
use lab_core::text::COMMON;
use lab_exercises::report::{Replay, Words};
use lab_exercises::state::{ClassMembership, State};
use lab_exercises::{CheckOptions, CheckReport, Checked, Exercise, Subject, Verdict};
use lab_infra::{Needs, Origin, Servers};
use lab_scenarios::Library;
use tokio::net::TcpListener;

use crate::cli::{ClassArgs, ClassCommand, ClassJoin};
use crate::exit::{self, Failure};
use crate::session::{Ended, Mode, Session, SessionOptions};
use crate::words::t;

/// Where the board listens unless `--bind` says: a fixed port, so the URL on a course's slides
/// stays right from one lesson to the next.
pub const DEFAULT_BIND: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8490);

/// The board's connections to its database: a class posts a few verdicts a second, the page
/// reads the grid once a second per browser.
const BOARD_POOL: u32 = 8;

/// Runs `lab class …`.
pub async fn class(
    options: SessionOptions,
    library: Library,
    args: &ClassArgs,
) -> Result<u8, Failure> {
    match &args.command {
        None => board(options, library, args.bind.unwrap_or(DEFAULT_BIND)).await,
        Some(ClassCommand::Verify {
            learner,
            exercise,
            target,
            board,
            token,
            only,
            seed,
        }) => {
            let verify = Verify {
                learner,
                target,
                board,
                token,
                only,
                seed: *seed,
            };
            verify.run(options, library, exercise).await
        }
    }
}

/// The page's words in both languages: every `class.` key of the common texts.
fn page_texts(library: &Library, lang: lab_core::Lang) -> PageTexts {
    let mut ui = serde_json::Map::new();
    for each in lab_core::Lang::ALL {
        let words: serde_json::Map<String, serde_json::Value> = library
            .texts
            .keys(COMMON, each)
            .into_iter()
            .filter(|key| key.starts_with("class."))
            .filter_map(|key| {
                let text = library.texts.get(COMMON, each, key)?;
                Some((key.to_string(), serde_json::Value::from(text)))
            })
            .collect();
        ui.insert(each.code().to_string(), serde_json::Value::Object(words));
    }
    PageTexts {
        lang: lang.code().to_string(),
        ui: serde_json::Value::Object(ui),
        learners_url: None,
    }
}

/// `lab class`: binds first (a taken port is said at once), then starts PostgreSQL (or connects
/// to `--database-url`), opens the board's tables, serves until Ctrl-C or SIGTERM.
async fn board(options: SessionOptions, library: Library, addr: SocketAddr) -> Result<u8, Failure> {
    let listener = TcpListener::bind(addr).await.map_err(|e| {
        Failure::environment(anyhow::anyhow!(t(Msg::new("class.cannot_listen")
            .arg("addr", addr.to_string())
            .arg("error", e.to_string()))))
    })?;
    let texts = page_texts(&library, options.lang);
    let session = Session::open(options, library, Mode::Headless);
    let served = session
        .with_servers(
            Needs::POSTGRES,
            async |servers| start(servers, listener, texts).await,
            async |_servers, ended| match ended {
                Ended::Finished(Ok(board)) => {
                    session.interrupted().await;
                    board.stop().await;
                    Ok(())
                }
                Ended::Finished(Err(failure)) => Err(failure),
                // Ctrl-C is how the board ends, whenever it comes.
                Ended::Interrupted(_) | Ended::Quit => Ok(()),
            },
        )
        .await;
    match served {
        Ok(()) => {
            eprintln!("{}", t("class.stopped"));
            Ok(exit::OK)
        }
        Err(failure) if matches!(failure.code, exit::INTERRUPTED | exit::TERMINATED) => {
            Ok(exit::OK)
        }
        Err(failure) => Err(failure),
    }
}

async fn start(
    servers: &Servers,
    listener: TcpListener,
    texts: PageTexts,
) -> Result<Board, Failure> {
    let postgres = servers
        .postgres
        .as_ref()
        .ok_or_else(|| Failure::environment(anyhow::anyhow!("no PostgreSQL was started")))?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(BOARD_POOL)
        .connect_with(postgres.target.options().clone())
        .await
        .map_err(Failure::environment)?;
    let store = Store::open(pool).await.map_err(Failure::environment)?;
    let (code, token) = (store.class_code.clone(), store.instructor_token.clone());
    let addr = listener.local_addr().map_err(Failure::environment)?;
    // The URL this machine opens; the learners' is the machine's address on their network.
    let here = if addr.ip().is_unspecified() {
        SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), addr.port())
    } else {
        addr
    };
    let learners_url = if addr.ip().is_loopback() {
        Some(format!("http://{here}/"))
    } else if addr.ip().is_unspecified() {
        lan_address().map(|ip| format!("http://{}/", SocketAddr::new(ip, addr.port())))
    } else {
        Some(format!("http://{addr}/"))
    };
    let theirs = learners_url
        .clone()
        .unwrap_or_else(|| format!("http://<{}>:{}/", t("class.this_machine"), addr.port()));
    let texts = PageTexts {
        learners_url,
        ..texts
    };
    let board = Board::start(listener, store, texts).map_err(Failure::environment)?;
    let store_line = match postgres.origin {
        Origin::Throwaway => t("class.store_throwaway"),
        Origin::Given => t(Msg::new("class.store_given").arg("url", postgres.target.redacted())),
    };
    say!("{}", t(Msg::new("class.up").arg("store", store_line)));
    say!(
        "{}",
        t(Msg::new("class.yours").arg("url", format!("http://{here}/#token={token}")))
    );
    say!("{}", t("class.projector"));
    say!(
        "{}",
        t(Msg::new("class.learners")
            .arg("url", theirs.as_str())
            .arg("code", code.as_str()))
    );
    say!(
        "{}",
        t(Msg::new("class.verify")
            .arg("url", format!("http://{here}/"))
            .arg("token", token.as_str()))
    );
    if !addr.ip().is_loopback() {
        eprintln!(
            "{}",
            t(Msg::new("class.exposed").arg("addr", addr.to_string()))
        );
    }
    say!("{}", t("class.stop"));
    crate::output::drained().await;
    Ok(board)
}

/// This machine's address on the network its default route leads to: what a board bound to
/// every address (`0.0.0.0`) is reached at from the classroom. A UDP socket "connected" to an
/// address of the documentation range (RFC 5737) sends nothing; the kernel only chooses the
/// source address it would use. `None` without a route (no network), or when that is loopback.
fn lan_address() -> Option<std::net::IpAddr> {
    let socket = std::net::UdpSocket::bind((std::net::Ipv4Addr::UNSPECIFIED, 0)).ok()?;
    socket
        .connect((std::net::Ipv4Addr::new(192, 0, 2, 1), 9))
        .ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// `lab class verify`.
struct Verify<'a> {
    learner: &'a str,
    target: &'a str,
    board: &'a str,
    token: &'a str,
    only: &'a [String],
    seed: Option<u64>,
}

impl Verify<'_> {
    async fn run(
        &self,
        options: SessionOptions,
        library: Library,
        exercise: &str,
    ) -> Result<u8, Failure> {
        let words = Words::new(options.lang, options.color).map_err(Failure::environment)?;
        let exercise = super::exercise::find(exercise)?;
        exercise
            .known_checks(self.only)
            .map_err(super::exercise::failure)?;
        let client = Client::new(self.board).map_err(|e| Failure::usage(e.to_string()))?;
        // The learner must be on the board, and the token the instructor's, before any check.
        let names = client
            .learner_names(self.token)
            .await
            .map_err(Failure::environment)?;
        let Some(learner) = names
            .iter()
            .find(|name| name.to_lowercase() == self.learner.to_lowercase())
        else {
            return Err(Failure::usage(t(Msg::new("class.no_learner")
                .arg("name", self.learner)
                .arg("names", names.join(", ")))));
        };
        let subject = Subject::Target {
            url: self.target.to_string(),
        };
        let check_options = CheckOptions {
            only: self.only.to_vec(),
            seed: self.seed.unwrap_or_else(super::exercise::clock_seed),
            repeat: CheckOptions::REPEAT,
            guest_env: Vec::new(),
            first: Vec::new(),
            restarts_beside: false,
        };
        let database_url = options
            .servers
            .database_url
            .as_ref()
            .map(|t| t.url().to_string());
        let replay = Replay::new(
            exercise,
            &subject,
            database_url.as_deref(),
            check_options.repeat,
        );
        let portable = Replay::portable(exercise, check_options.repeat);
        let languages = BothLanguages::new()?;
        let session = Session::open(options, library, Mode::Headless);
        session
            .run_with_servers(exercise.needs, async |servers| {
                let mut reports: Vec<CheckReport> = Vec::new();
                say!(
                    "{}",
                    lab_exercises::report::text::heading(&words, exercise, &subject)
                );
                let checked = lab_exercises::check(
                    exercise,
                    subject.clone(),
                    servers,
                    &check_options,
                    &mut |report: &CheckReport| {
                        for line in
                            lab_exercises::report::text::check(&words, exercise, report, &replay)
                        {
                            say!("{line}");
                        }
                        reports.push(report.clone());
                    },
                )
                .await
                .map_err(super::exercise::failure)?;
                if let Checked::NotReady(not_ready) = &checked {
                    for line in lab_exercises::report::text::not_ready(&words, not_ready) {
                        say!("{line}");
                    }
                }
                let mut marked = 0;
                for report in &reports {
                    if let Some(post) = languages.verdict_post(exercise, report, &portable) {
                        client
                            .send_verified(self.token, learner, &post)
                            .await
                            .map_err(Failure::environment)?;
                        marked += 1;
                    }
                }
                say!(
                    "{}",
                    t(Msg::new("class.verified")
                        .arg("count", marked)
                        .arg("name", learner.as_str())
                        .arg("board", client.url()))
                );
                Ok(match checked {
                    Checked::Reports(_) => super::exercise::exit_code(&reports),
                    Checked::NotReady(_) => exit::UNDECIDED,
                })
            })
            .await
    }
}

/// The lab's texts in both of its languages: a reason goes to the board in both, and the board
/// shows it in its own, whatever the learner's is.
pub struct BothLanguages {
    en: Words,
    ru: Words,
}

impl BothLanguages {
    pub fn new() -> Result<BothLanguages, Failure> {
        let words = |lang| Words::new(lang, false).map_err(Failure::environment);
        Ok(BothLanguages {
            en: words(lab_core::Lang::En)?,
            ru: words(lab_core::Lang::Ru)?,
        })
    }

    /// What the board gets of one check: never the learner's code, nor their program's output,
    /// nor their folder or database URL (the replay line is the portable one). A skipped check
    /// is not a result about the code, so it is not sent.
    pub fn verdict_post(
        &self,
        exercise: &Exercise,
        report: &CheckReport,
        replay: &Replay,
    ) -> Option<VerdictPost> {
        let verdict = match report.verdict {
            Verdict::Pass => lab_class::Kind::Pass,
            Verdict::Fail(_) => lab_class::Kind::Fail,
            Verdict::Unknown(_) => lab_class::Kind::Unknown,
            Verdict::Skipped(_) => return None,
        };
        Some(VerdictPost {
            exercise: exercise.name.to_string(),
            check: report.name.to_string(),
            verdict,
            reason_key: report.verdict.reason().map(|m| m.key.clone()),
            reason: report.verdict.reason().map(|msg| lab_class::model::Reason {
                en: self.en.of(exercise, msg),
                ru: self.ru.of(exercise, msg),
            }),
            replay: (verdict != lab_class::Kind::Pass).then(|| replay.line(report)),
            schedule: (verdict != lab_class::Kind::Pass).then(|| lab_class::model::Schedule {
                en: board_lines(lab_exercises::report::text::schedule(
                    &self.en, exercise, report,
                )),
                ru: board_lines(lab_exercises::report::text::schedule(
                    &self.ru, exercise, report,
                )),
            }),
        })
    }
}

/// A schedule's lines as the board takes them: one line each, each and all within its limits
/// (a longer schedule is cut, and says so in its last line).
fn board_lines(lines: Vec<String>) -> Vec<String> {
    use lab_class::model::{MAX_SCHEDULE_LINE_CHARS, MAX_SCHEDULE_LINES};
    let mut out: Vec<String> = lines
        .iter()
        .flat_map(|line| line.lines())
        .map(|line| {
            line.chars()
                .filter(|c| !c.is_control())
                .take(MAX_SCHEDULE_LINE_CHARS)
                .collect()
        })
        .collect();
    if out.len() > MAX_SCHEDULE_LINES {
        out.truncate(MAX_SCHEDULE_LINES - 1);
        out.push("…".to_string());
    }
    out
}

/// A learner's link to a board: where, and as whom.
pub struct ClassLink {
    client: Client,
    token: String,
    pub languages: BothLanguages,
}

/// Joins the board `join.url` names (or finds the place remembered in `dir`'s state): `None`,
/// said in one line, when it cannot, and the checks go on without it. A URL that is not one is
/// the learner's mistake (exit 2).
pub async fn link(join: &ClassJoin, dir: Option<&Path>) -> Result<Option<ClassLink>, Failure> {
    let Some(url) = &join.url else {
        return Ok(None);
    };
    let client = Client::new(url).map_err(|e| Failure::usage(e.to_string()))?;
    let board = client.url().to_string();
    if let Some(dir) = dir
        && let Some(State {
            class: Some(membership),
            ..
        }) = State::read(dir)
        && membership.board == board
        && join
            .class_name
            .as_ref()
            .is_none_or(|n| n.trim() == membership.name)
    {
        return Ok(Some(ClassLink {
            client,
            token: membership.token,
            languages: BothLanguages::new()?,
        }));
    }
    let interactive = std::io::IsTerminal::is_terminal(&std::io::stdin());
    let code = match &join.class_code {
        Some(code) => Some(code.clone()),
        None if interactive => ask(t("class.ask_code")).await,
        None => None,
    };
    let name = match &join.class_name {
        Some(name) => Some(name.clone()),
        None if interactive => ask(t("class.ask_name")).await,
        None => None,
    };
    let (Some(code), Some(name)) = (code, name) else {
        eprintln!(
            "{}",
            t(Msg::new("class.needs_code").arg("board", board.as_str()))
        );
        return Ok(None);
    };
    match client.join(&code, &name).await {
        Ok(joined) => {
            eprintln!(
                "{}",
                t(Msg::new("class.joined")
                    .arg("board", board.as_str())
                    .arg("name", joined.name.as_str()))
            );
            if let Some(dir) = dir {
                let membership = ClassMembership {
                    board,
                    name: joined.name,
                    token: joined.token.clone(),
                };
                // Remembering is a convenience: a read-only folder joins again next time.
                let _ = State::remember_class(dir, membership);
            }
            Ok(Some(ClassLink {
                client,
                token: joined.token,
                languages: BothLanguages::new()?,
            }))
        }
        Err(e) => {
            eprintln!(
                "{}",
                t(Msg::new("class.join_failed")
                    .arg("board", board.as_str())
                    .arg("reason", e.to_string()))
            );
            Ok(None)
        }
    }
}

/// One line read from the terminal after `prompt` (on stderr); `None` if nothing was typed.
async fn ask(prompt: String) -> Option<String> {
    use std::io::Write as _;
    eprint!("{prompt}");
    let _ = std::io::stderr().flush();
    let line = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    })
    .await
    .ok()?
    .ok()?;
    let line = line.trim().to_string();
    (!line.is_empty()).then_some(line)
}

impl ClassLink {
    /// A sender for one check run's verdicts.
    pub fn sender(&self) -> Sender {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<VerdictPost>();
        let client = self.client.clone();
        let token = self.token.clone();
        let task = tokio::spawn(async move {
            let mut delivery = Delivery::default();
            while let Some(post) = rx.recv().await {
                // After a board that cannot be reached, the rest are not tried: one deadline
                // is all a board that is down may cost.
                if delivery.unreachable {
                    delivery.failed += 1;
                    continue;
                }
                match client.send(&token, &post).await {
                    Ok(()) => delivery.sent += 1,
                    Err(e) => {
                        delivery.failed += 1;
                        delivery.unreachable = e.status().is_none();
                        delivery.reason = Some(e.to_string());
                    }
                }
            }
            delivery
        });
        Sender {
            tx,
            task,
            board: self.client.url().to_string(),
        }
    }
}

#[derive(Default)]
struct Delivery {
    sent: usize,
    failed: usize,
    unreachable: bool,
    reason: Option<String>,
}

/// The verdicts of one check run on their way to the board.
pub struct Sender {
    tx: tokio::sync::mpsc::UnboundedSender<VerdictPost>,
    task: tokio::task::JoinHandle<Delivery>,
    board: String,
}

impl Sender {
    pub fn send(&self, post: VerdictPost) {
        let _ = self.tx.send(post);
    }

    /// Waits for the verdicts sent so far to reach the board (or not), and says which, in one
    /// line on stderr.
    pub async fn finish(self) {
        drop(self.tx);
        let Ok(delivery) = self.task.await else {
            return;
        };
        if delivery.failed > 0 {
            eprintln!(
                "{}",
                t(Msg::new("class.not_sent")
                    .arg("count", delivery.failed)
                    .arg("board", self.board.as_str())
                    .arg("reason", delivery.reason.unwrap_or_default()))
            );
        } else if delivery.sent > 0 {
            eprintln!(
                "{}",
                t(Msg::new("class.sent")
                    .arg("count", delivery.sent)
                    .arg("board", self.board.as_str()))
            );
        }
    }
}
