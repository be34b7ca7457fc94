//! Step mode: the lab pauses after every step, inside services, and before each answer is
//! revealed, until the learner presses Enter.
//!
//! Input is read line by line from any async reader (stdin in the CLI), so
//! `yes '' | lab run duplicate --step` works without a terminal. A line `q` quits: the pause
//! returns [`Quit`], and [`Gate::quit_requested`] resolves so the CLI can cancel whatever is still
//! running (a service handler paused inside a request cannot return an error to the scenario)
//! and clean up. End of input means "no more pauses": the run goes on to the end.
//!
//! # The footer and the looks
//!
//! At each pause the gate prints a footer built by the CLI from a [`Place`] (which pause, which
//! step of how many): `step 3/8 · Enter next · s state · d diagram so far · b back · q quit`.
//! Besides Enter and `q`, a learner (or an instructor at a projector) may take a [`Look`] at the
//! run so far without going on: `s` the tables and Redis keys shown so far, read again now
//! (see [`crate::Narrator::state_view`]), `d` the diagram of the calls so far, `b` the last step
//! again (and the one before it, on the next `b`). The gate prints the
//! look and pauses again. At a prediction the letters are answers, so there are no looks there.
//!
//! Looks and footers go to stderr, never stdout: stdout carries the narrative (maybe JSON, maybe
//! redirected to a file), and `lab run x --step > run.txt` must write the same file as without
//! `--step`. How a footer leaves the screen depends on the [`Screen`]: on a terminal it is erased
//! once answered, so it never shares a line with what comes next; elsewhere (a pipe, a file) it
//! ends its line.

use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncBufRead, AsyncBufReadExt};
use tokio::sync::{Mutex, watch};

/// The learner asked to stop (typed `q` at a pause).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stopped by the learner")]
pub struct Quit;

/// Where a pause happens; the prompt may differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pause {
    /// After a step of the story.
    Step,
    /// Inside a bundled service.
    Service,
    /// After a prediction question: the learner may type an answer.
    Predict,
    /// Before the answer is revealed.
    Reveal,
}

/// Where the run is at a pause: what the footer tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    pub pause: Pause,
    /// The number of the last step shown (0: none yet).
    pub step: u32,
    /// How many steps the scenario has, when that is known for sure (see
    /// [`crate::Narrator::expect_steps`]); `None` rather than a guess.
    pub of: Option<u32>,
}

impl Place {
    /// A pause with no progress to tell (a gate used without a narrator).
    pub fn bare(pause: Pause) -> Place {
        Place {
            pause,
            step: 0,
            of: None,
        }
    }
}

/// Builds the footer shown at a pause (the CLI renders it in the learner's language).
pub type Prompt = Box<dyn Fn(Place) -> String + Send + Sync>;

/// A look at the run so far, asked for at a pause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Look {
    /// `s`: the tables and Redis keys shown so far, read again now where they can be.
    State,
    /// `d`: the diagram of the calls so far.
    Diagram,
    /// `b`: a step again; `Back(1)` is the last one shown, `Back(2)` the one before it, …
    Back(usize),
}

impl Look {
    /// The key that asks for a look (`b` counts from 1 at each pause).
    fn parse(line: &str, backs: usize) -> Option<Look> {
        match line {
            "s" | "S" => Some(Look::State),
            "d" | "D" => Some(Look::Diagram),
            "b" | "B" => Some(Look::Back(backs + 1)),
            _ => None,
        }
    }
}

/// What a look is made of.
#[derive(Debug, Clone, Default)]
pub struct Sofar {
    /// Every event of the run so far.
    pub events: Vec<crate::Event>,
    /// For `s`: the scenario's state views read again now (those that can be; the others are
    /// shown as last read).
    pub now: Vec<crate::Table>,
}

/// Gathers what a look is made of (the narrator: its events, its state views read again).
pub type SofarFuture<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Sofar> + Send + 'a>>;

/// Renders a look (the CLI renders text in the learner's language, with the renderers the
/// narrative uses).
pub type Viewer = Box<dyn Fn(Look, &Sofar) -> String + Send + Sync>;

/// Where the footer is shown, which decides how it leaves the screen.
#[derive(Debug, Clone, Copy, Default)]
pub enum Screen {
    /// Not a terminal (a pipe, a file, a test): each footer ends its line, so the next step's
    /// text never runs into it.
    #[default]
    Lines,
    /// A terminal: the footer is erased once answered. `echo`: the answer is typed on the same
    /// terminal, so its Enter has moved the cursor to the next line already. `columns` tells the
    /// terminal's width, to erase a footer that wrapped.
    Terminal { echo: bool, columns: fn() -> usize },
}

/// Waits until what was written before a pause is out (the CLI's queued stdout), so a footer
/// on stderr comes after the step it follows.
pub type Flush =
    Box<dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + Sync>;

/// How a stepping gate shows itself, besides its prompt.
#[derive(Default)]
pub struct Options {
    /// What `s`, `d` and `b` show; without one, those lines are answers like any other.
    pub viewer: Option<Viewer>,
    pub screen: Screen,
    /// Awaited before each footer is shown.
    pub flush: Option<Flush>,
}

/// The step gate of one `lab` call. Cheap to clone; `Gate::default()` never pauses.
#[derive(Clone, Default)]
pub struct Gate {
    stepper: Option<Arc<Stepper>>,
}

struct Stepper {
    /// Pause only at these (`None`: everywhere). A quiz pauses only at predictions.
    only: Option<Pause>,
    /// One reader for every pause: concurrent pauses (two requests inside a service) each take
    /// their own line, in turn.
    input: Mutex<Box<dyn AsyncBufRead + Send + Unpin>>,
    prompt: Prompt,
    options: Options,
    /// Set at end of input: from then on pauses return at once.
    exhausted: AtomicBool,
    quit: watch::Sender<bool>,
}

impl Gate {
    /// A gate that pauses, reading answers from `input` and printing prompts to stderr (stdout
    /// carries the narrative, which may be JSON).
    pub fn stepping(input: impl AsyncBufRead + Send + Unpin + 'static, prompt: Prompt) -> Gate {
        Gate::with_pauses(None, input, prompt, Options::default())
    }

    /// [`Gate::stepping`] with looks (`s`, `d`, `b`) and a screen to erase footers from.
    pub fn stepping_with(
        input: impl AsyncBufRead + Send + Unpin + 'static,
        prompt: Prompt,
        options: Options,
    ) -> Gate {
        Gate::with_pauses(None, input, prompt, options)
    }

    /// A gate that pauses only at predictions, to read the learner's answers (`--quiz`). Looks
    /// are not offered there (`options.viewer` is not used).
    pub fn quizzing(
        input: impl AsyncBufRead + Send + Unpin + 'static,
        prompt: Prompt,
        options: Options,
    ) -> Gate {
        let options = Options {
            viewer: None,
            ..options
        };
        Gate::with_pauses(Some(Pause::Predict), input, prompt, options)
    }

    fn with_pauses(
        only: Option<Pause>,
        input: impl AsyncBufRead + Send + Unpin + 'static,
        prompt: Prompt,
        options: Options,
    ) -> Gate {
        Gate {
            stepper: Some(Arc::new(Stepper {
                only,
                input: Mutex::new(Box::new(input)),
                prompt,
                options,
                exhausted: AtomicBool::new(false),
                quit: watch::channel(false).0,
            })),
        }
    }

    pub fn is_stepping(&self) -> bool {
        self.stepper.is_some()
    }

    /// Waits for the learner. Returns the line typed (trimmed), or [`Quit`] on `q`.
    pub async fn pause(&self, kind: Pause) -> Result<String, Quit> {
        let nothing = |_: Look| -> SofarFuture<'_> { Box::pin(async { Sofar::default() }) };
        self.pause_at(Place::bare(kind), &nothing).await
    }

    /// [`Gate::pause`] with the progress for the footer and what the looks are made of
    /// (gathered only when a look is asked for).
    pub async fn pause_at<'a>(
        &self,
        place: Place,
        sofar: &'a (dyn Fn(Look) -> SofarFuture<'a> + Sync + 'a),
    ) -> Result<String, Quit> {
        let Some(stepper) = &self.stepper else {
            return Ok(String::new());
        };
        if stepper.only.is_some_and(|only| only != place.pause) {
            return Ok(String::new());
        }
        if *stepper.quit.borrow() {
            return Err(Quit);
        }
        if stepper.exhausted.load(Ordering::SeqCst) {
            return Ok(String::new());
        }
        let mut input = stepper.input.lock().await;
        // Another pause may have read `q` while this one waited for the input.
        if *stepper.quit.borrow() {
            return Err(Quit);
        }
        if stepper.exhausted.load(Ordering::SeqCst) {
            return Ok(String::new());
        }
        let mut stderr = std::io::stderr();
        let mut backs = 0;
        loop {
            if let Some(flush) = &stepper.options.flush {
                flush().await;
            }
            let prompt = (stepper.prompt)(place);
            stepper.options.screen.show(&mut stderr, &prompt);
            let mut line = String::new();
            let read = input.read_line(&mut line).await;
            let answer = line.trim().to_string();
            // A line that ends with Enter; at end of input (Ctrl-D) there is none, so an
            // echoing terminal has not moved the cursor down.
            let entered = line.ends_with('\n');
            stepper
                .options
                .screen
                .erase(&mut stderr, &prompt, &answer, entered);
            match read {
                Ok(0) | Err(_) => {
                    // End of input: the learner piped a finite answer list; run on without
                    // pauses.
                    stepper.exhausted.store(true, Ordering::SeqCst);
                    return Ok(String::new());
                }
                Ok(_) => {}
            }
            if answer.eq_ignore_ascii_case("q") {
                stepper.quit.send_replace(true);
                return Err(Quit);
            }
            // At a prediction the letters are answers (`b` is an option, not "back").
            let look = match (&stepper.options.viewer, place.pause) {
                (Some(viewer), pause) if pause != Pause::Predict => {
                    Look::parse(&answer, backs).map(|look| (viewer, look))
                }
                _ => None,
            };
            let Some((viewer, look)) = look else {
                return Ok(answer);
            };
            if let Look::Back(n) = look {
                backs = n;
            }
            let shown = viewer(look, &sofar(look).await);
            let _ = write!(stderr, "{shown}");
            if !shown.is_empty() && !shown.ends_with('\n') {
                let _ = writeln!(stderr);
            }
            let _ = stderr.flush();
        }
    }

    /// Resolves when the learner has typed `q`; never, when not stepping.
    pub async fn quit_requested(&self) {
        match &self.stepper {
            Some(stepper) => {
                let mut rx = stepper.quit.subscribe();
                let _ = rx.wait_for(|quit| *quit).await;
            }
            None => std::future::pending().await,
        }
    }
}

impl Screen {
    /// Shows a footer. An empty one (the web view's gate, whose prompt is a hook) shows nothing.
    fn show(&self, out: &mut impl std::io::Write, prompt: &str) {
        if prompt.is_empty() {
            return;
        }
        let _ = match self {
            Screen::Lines => writeln!(out, "{prompt}"),
            Screen::Terminal { .. } => write!(out, "{prompt}"),
        };
        let _ = out.flush();
    }

    /// Takes an answered footer off a terminal: the rows it (and an echoed answer) took, cursor
    /// back at the start of the first. On anything else it has ended its line already.
    /// `entered`: the answer ended with Enter (not with the end of input).
    fn erase(&self, out: &mut impl std::io::Write, prompt: &str, answer: &str, entered: bool) {
        let Screen::Terminal { echo, columns } = *self else {
            return;
        };
        // Only an echoed Enter moves the cursor below the footer.
        let echo = echo && entered;
        if prompt.is_empty() {
            return;
        }
        let columns = columns().max(1);
        let width = prompt.chars().count() + if echo { answer.chars().count() } else { 0 };
        // A footer that exactly fills its last row leaves the cursor there; count it once.
        let rows = width.div_ceil(columns).max(1);
        // `\r\x1b[2K`: to the start of the row and clear it; `\x1b[1A`: one row up. With echo,
        // the learner's Enter has already moved the cursor below the footer.
        let mut seq = String::new();
        let ups = if echo { rows } else { rows - 1 };
        seq.push_str("\r\x1b[2K");
        for _ in 0..ups {
            seq.push_str("\x1b[1A\r\x1b[2K");
        }
        let _ = write!(out, "{seq}");
        let _ = out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(input: &'static str) -> Gate {
        Gate::stepping(input.as_bytes(), Box::new(|_| String::new()))
    }

    #[tokio::test]
    async fn enter_continues_and_q_quits() {
        let gate = gate("\nb\nq\n");
        assert_eq!(gate.pause(Pause::Step).await, Ok(String::new()));
        assert_eq!(gate.pause(Pause::Predict).await, Ok("b".to_string()));
        assert_eq!(gate.pause(Pause::Step).await, Err(Quit));
        gate.quit_requested().await;
        assert_eq!(gate.pause(Pause::Step).await, Err(Quit), "quit sticks");
    }

    #[tokio::test]
    async fn end_of_input_stops_pausing() {
        let gate = gate("\n");
        assert!(gate.pause(Pause::Step).await.is_ok());
        assert!(gate.pause(Pause::Step).await.is_ok());
        assert!(gate.pause(Pause::Reveal).await.is_ok());
    }

    #[tokio::test]
    async fn a_quiz_pauses_only_at_predictions() {
        let gate = Gate::quizzing(
            "b\nc\n".as_bytes(),
            Box::new(|_| String::new()),
            Options::default(),
        );
        assert_eq!(gate.pause(Pause::Step).await, Ok(String::new()));
        assert_eq!(gate.pause(Pause::Predict).await, Ok("b".to_string()));
        assert_eq!(gate.pause(Pause::Reveal).await, Ok(String::new()));
        assert_eq!(gate.pause(Pause::Predict).await, Ok("c".to_string()));
    }

    /// A gate whose looks say what they were asked for and how many events they saw.
    fn looking(input: &'static str) -> Gate {
        Gate::stepping_with(
            input.as_bytes(),
            Box::new(|place| format!("[{:?} {}]", place.pause, place.step)),
            Options {
                viewer: Some(Box::new(|look, sofar| {
                    format!("{look:?} of {}", sofar.events.len())
                })),
                screen: Screen::Lines,
                flush: None,
            },
        )
    }

    #[tokio::test]
    async fn looks_show_and_pause_again_until_enter() {
        let gate = looking("s\nd\nb\nb\n\n");
        let sofar = |_: Look| -> SofarFuture<'_> {
            Box::pin(async {
                Sofar {
                    events: vec![crate::Event::Explain, crate::Event::Quiz],
                    now: Vec::new(),
                }
            })
        };
        let place = Place {
            pause: Pause::Step,
            step: 3,
            of: Some(8),
        };
        // Five lines, one pause: the looks do not go on.
        assert_eq!(gate.pause_at(place, &sofar).await, Ok(String::new()));
        assert!(gate.pause(Pause::Step).await.is_ok(), "end of input");
    }

    #[tokio::test]
    async fn at_a_prediction_letters_are_answers_not_looks() {
        let gate = looking("b\ns\n");
        assert_eq!(gate.pause(Pause::Predict).await, Ok("b".to_string()));
        assert_eq!(gate.pause(Pause::Predict).await, Ok("s".to_string()));
    }

    #[test]
    fn back_counts_from_the_last_step() {
        assert_eq!(Look::parse("b", 0), Some(Look::Back(1)));
        assert_eq!(Look::parse("B", 1), Some(Look::Back(2)));
        assert_eq!(Look::parse("s", 3), Some(Look::State));
        assert_eq!(Look::parse("x", 0), None);
    }

    #[test]
    fn a_terminal_footer_is_erased_and_a_piped_one_ends_its_line() {
        let mut out = Vec::new();
        Screen::Lines.show(&mut out, "step 1/2");
        Screen::Lines.erase(&mut out, "step 1/2", "", true);
        assert_eq!(out, b"step 1/2\n");

        fn eighty() -> usize {
            80
        }
        let mut out = Vec::new();
        let typed = Screen::Terminal {
            echo: true,
            columns: eighty,
        };
        typed.show(&mut out, "step 1/2");
        typed.erase(&mut out, "step 1/2", "s", true);
        // The echoed Enter moved the cursor down a row: up one, clear it.
        assert_eq!(out, b"step 1/2\r\x1b[2K\x1b[1A\r\x1b[2K");

        let mut out = Vec::new();
        let piped_in = Screen::Terminal {
            echo: false,
            columns: eighty,
        };
        piped_in.erase(&mut out, &"x".repeat(100), "", true);
        // Two rows, the cursor on the second: clear it, then the one above.
        assert_eq!(out, b"\r\x1b[2K\x1b[1A\r\x1b[2K");

        // Ctrl-D on a terminal: no Enter was echoed, so the cursor is still on the footer's
        // row, and the row above it (the narrative) stays.
        let mut out = Vec::new();
        typed.erase(&mut out, "step 1/2", "", false);
        assert_eq!(out, b"\r\x1b[2K");
    }

    #[tokio::test]
    async fn an_off_gate_never_pauses() {
        let gate = Gate::default();
        assert!(!gate.is_stepping());
        assert_eq!(gate.pause(Pause::Step).await, Ok(String::new()));
    }
}
