//! `lab run NAME... --web`: the same runs, shown on a page and driven from it.
//!
//! The run is a small state machine, because a class moves through it out of order:
//!
//! ```text
//!            ┌──────────── Restart (the page) ─────────────┐
//!            ▼                                             │
//! Play { scenario i, wait for Next first? } ── ran ──▶ Play { i + 1, no wait } … ──▶ Done
//!                                                                                  │
//!            Play { the last one, wait } ◀─────────── Restart ────────────────────┤
//!                                        exit with the runs' verdict ◀── Ctrl-C ───┘
//! ```
//!
//! Each scenario waits for the driver's Next before it starts (unless the driver has just
//! pressed Next on the end of the one before), and pauses at every step as with `--step`. A
//! restart drops the scenario's run (as Ctrl-C would: its services stop, its connections close;
//! what it left in its schema is removed at the end) and runs it again on the same servers.
//! When every scenario has run, the page stays up, showing the last one, until Ctrl-C or
//! SIGTERM; the exit code is then the runs' (0, or 1 for drift). A signal before that is an
//! interruption (130 or 143), as in the terminal.

use std::net::SocketAddr;
use std::sync::Arc;

use lab_core::narrator::SharedSink;
use lab_core::{Gate, Lang, Msg, Narrator};
use lab_infra::Servers;
use lab_scenarios::{Entry, Library, RunReport};

use super::run::{Pictures, Selection, after_each};
use crate::exit::Failure;
use crate::select;
use crate::session::{Mode, Session, SessionOptions};
use crate::web::hub::{Hub, PauseKind, WebSink};
use crate::web::{self, WebServer};
use crate::words::t;

/// `--web`: where the page listens, and whether to open it in the default browser.
pub struct Web {
    pub bind: SocketAddr,
    pub open: bool,
}

/// Where the web run is.
enum State {
    /// Running scenario `index`; `wait`: first wait at its title for the driver's Next.
    Play { index: usize, wait: bool },
    /// Every scenario has run; the page shows the end.
    Done,
}

/// What one play of a scenario came to.
enum Played {
    /// It ran to its end (and, when another follows, the driver pressed Next).
    Ran(Box<RunReport>),
    /// The driver asked for a restart first.
    Restart,
    /// Its epoch ended before it began (the page moved on).
    Abandoned,
}

pub async fn run(
    options: SessionOptions,
    library: Library,
    selection: Selection,
    pictures: &Pictures,
    web: &Web,
) -> Result<u8, Failure> {
    let session =
        Session::open(options, library, Mode::Live).with_settings(selection.settings.clone());
    let token = uuid::Uuid::new_v4().simple().to_string();
    let hub = Hub::new(&session.library.texts, session.lang(), token);
    let server = WebServer::start(web.bind, hub.clone()).await.map_err(|e| {
        Failure::environment(anyhow::anyhow!(t(Msg::new("web.cannot_serve")
            .arg("addr", web.bind.to_string())
            .arg("error", e.to_string()))))
    })?;
    let page = WebRun {
        session: &session,
        hub: &hub,
        selection: &selection,
        pictures,
        terminal: session.sink(),
    };
    page.announce(server.addr, web.open);
    let needs = select::needs(&selection.scenarios);
    // No hold for `--keep` afterwards: the page itself held the run for as long as the class
    // looked.
    let ended = session
        .with_servers(
            needs,
            async |servers| page.drive(servers).await,
            async |_, ended| ended.into_result(),
        )
        .await;
    server.stop().await;
    ended
}

/// One web run: the session, the page's hub, and what to show.
struct WebRun<'a> {
    session: &'a Session,
    hub: &'a Arc<Hub>,
    selection: &'a Selection,
    pictures: &'a Pictures,
    /// The narrative on the terminal too, one renderer for every run.
    terminal: SharedSink,
}

impl WebRun<'_> {
    /// Says where the page is (the driver's URL, with the token, and the watchers'), and opens
    /// the driver's in the default browser when asked to.
    fn announce(&self, addr: SocketAddr, open: bool) {
        // An unspecified address (0.0.0.0) is not one to browse to: this machine is 127.0.0.1.
        let ip = if addr.ip().is_unspecified() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            addr.ip()
        };
        let local = SocketAddr::new(ip, addr.port());
        let drive = format!("http://{local}/?drive={}", self.hub.token());
        eprintln!("{}", t(Msg::new("web.drive").arg("url", drive.as_str())));
        if web::is_exposed(&addr) {
            eprintln!(
                "{}",
                t(Msg::new("web.watch_exposed").arg("port", addr.port()))
            );
            eprintln!(
                "{}",
                t(Msg::new("web.exposed").arg("addr", addr.to_string()))
            );
        } else {
            let watch = format!("http://{local}/");
            eprintln!("{}", t(Msg::new("web.watch").arg("url", watch.as_str())));
        }
        if open {
            web::open_browser(&drive);
        }
    }

    /// The state machine, until Ctrl-C once every scenario has run (the exit code: the runs'
    /// verdict). A failure of a scenario or of its pictures ends it.
    async fn drive(&self, servers: &Servers) -> Result<u8, Failure> {
        let scenarios = &self.selection.scenarios;
        let mut passed = vec![true; scenarios.len()];
        let mut epoch = 0;
        let mut state = State::Play {
            index: 0,
            wait: true,
        };
        loop {
            state = match state {
                State::Play { index, wait } => {
                    let (run_epoch, played) = self.play(servers, index, wait).await?;
                    epoch = run_epoch;
                    match played {
                        Played::Ran(report) => {
                            after_each(self.session, self.pictures, &report).await?;
                            passed[index] = report.passed;
                            match index + 1 {
                                next if next < scenarios.len() => State::Play {
                                    index: next,
                                    wait: false,
                                },
                                _ => State::Done,
                            }
                        }
                        Played::Restart => {
                            let name = scenarios[index].name;
                            eprintln!("{}", t(Msg::new("web.restarting").arg("name", name)));
                            State::Play { index, wait: true }
                        }
                        Played::Abandoned => State::Play { index, wait: true },
                    }
                }
                State::Done => {
                    let all_passed = passed.iter().all(|p| *p);
                    self.hub.finished(epoch, all_passed);
                    // Ctrl-C now closes the page with the verdict: it is no interruption.
                    self.session.signal_ends_the_work(true);
                    tokio::select! {
                        _ = self.hub.restart_requested() => {
                            self.session.signal_ends_the_work(false);
                            let last = scenarios.len() - 1;
                            let name = scenarios[last].name;
                            eprintln!("{}", t(Msg::new("web.restarting").arg("name", name)));
                            State::Play { index: last, wait: true }
                        }
                        // The page was the point: closing it is how the class ends, and the
                        // runs' verdict is the exit code.
                        _ = self.session.interrupted() => {
                            eprintln!("{}", t("web.closed"));
                            return Ok(self.selection.verdict(all_passed));
                        }
                    }
                }
            };
        }
    }

    /// Plays scenario `index` once, on a new epoch of the page: its epoch and what came of it.
    async fn play(
        &self,
        servers: &Servers,
        index: usize,
        wait: bool,
    ) -> Result<(u64, Played), Failure> {
        let scenarios = &self.selection.scenarios;
        let entry = scenarios[index];
        let texts = &self.session.library.texts;
        let title = |lang: Lang| texts.render(entry.name, lang, &Msg::new("title"));
        let (epoch, input) = self.hub.begin(serde_json::json!({
            "scenario": entry.name,
            "n": index + 1,
            "of": scenarios.len(),
            "title": {"en": title(Lang::En), "ru": title(Lang::Ru)},
        }));
        let narrator = self.narrator(epoch, input);
        let more = index + 1 < scenarios.len();
        let attempt = async {
            if wait && !self.hub.wait_for_next(epoch, PauseKind::Start).await {
                return Ok(Played::Abandoned);
            }
            let report = self.run_one(entry, servers, narrator).await?;
            // Another scenario follows: this one stays on the page until Next.
            if more {
                self.hub.wait_for_next(epoch, PauseKind::Next).await;
            }
            Ok::<_, Failure>(Played::Ran(Box::new(report)))
        };
        tokio::select! {
            played = attempt => Ok((epoch, played?)),
            _ = self.hub.restart_requested() => Ok((epoch, Played::Restart)),
        }
    }

    /// A narrator for epoch `epoch`: it renders for the page (and the terminal), and its gate
    /// reads the page's Next and answers; the gate's prompt is where the page learns that the
    /// run waits.
    fn narrator(&self, epoch: u64, input: crate::web::input::LineReader) -> Narrator {
        let gate = Gate::stepping(input, {
            let hub = self.hub.clone();
            Box::new(move |place: lab_core::gate::Place| {
                hub.gate_paused(epoch, place.pause);
                String::new()
            })
        });
        let sink: SharedSink = Arc::new(parking_lot::Mutex::new(WebSink::new(
            self.session.library.texts.clone(),
            self.session.options.answers,
            self.hub.clone(),
            epoch,
            Some(self.terminal.clone()),
        )));
        Narrator::new(Some(sink), gate)
    }

    async fn run_one(
        &self,
        entry: Entry,
        servers: &Servers,
        narrator: Narrator,
    ) -> Result<RunReport, Failure> {
        Ok(lab_scenarios::run(
            entry,
            servers,
            narrator,
            &self.session.library,
            &self.session.config,
        )
        .await?)
    }
}
