//! Step mode: the lab pauses after every step, inside services, and before each answer is
//! revealed, until the learner presses Enter.
//!
//! Input is read line by line from any async reader (stdin in the CLI), so
//! `yes '' | lab run duplicate --step` works without a terminal. A line `q` quits: the pause
//! returns [`Quit`], and [`Gate::quit_requested`] resolves so the CLI can cancel whatever is still
//! running (a service handler paused inside a request cannot return an error to the scenario)
//! and clean up. End of input means "no more pauses": the run goes on to the end.

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

/// Builds the prompt shown at a pause (the CLI renders it in the learner's language).
pub type Prompt = Box<dyn Fn(Pause) -> String + Send + Sync>;

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
    /// Set at end of input: from then on pauses return at once.
    exhausted: AtomicBool,
    quit: watch::Sender<bool>,
}

impl Gate {
    /// A gate that pauses, reading answers from `input` and printing prompts to stderr (stdout
    /// carries the narrative, which may be JSON).
    pub fn stepping(input: impl AsyncBufRead + Send + Unpin + 'static, prompt: Prompt) -> Gate {
        Gate::with_pauses(None, input, prompt)
    }

    /// A gate that pauses only at predictions, to read the learner's answers (`--quiz`).
    pub fn quizzing(input: impl AsyncBufRead + Send + Unpin + 'static, prompt: Prompt) -> Gate {
        Gate::with_pauses(Some(Pause::Predict), input, prompt)
    }

    fn with_pauses(
        only: Option<Pause>,
        input: impl AsyncBufRead + Send + Unpin + 'static,
        prompt: Prompt,
    ) -> Gate {
        Gate {
            stepper: Some(Arc::new(Stepper {
                only,
                input: Mutex::new(Box::new(input)),
                prompt,
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
        let Some(stepper) = &self.stepper else {
            return Ok(String::new());
        };
        if stepper.only.is_some_and(|only| only != kind) {
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
        let _ = write!(stderr, "{}", (stepper.prompt)(kind));
        let _ = stderr.flush();
        let mut line = String::new();
        match input.read_line(&mut line).await {
            Ok(0) | Err(_) => {
                // End of input: the learner piped a finite answer list; run on without pauses.
                stepper.exhausted.store(true, Ordering::SeqCst);
                let _ = writeln!(stderr);
                Ok(String::new())
            }
            Ok(_) => {
                let line = line.trim().to_string();
                if line.eq_ignore_ascii_case("q") {
                    stepper.quit.send_replace(true);
                    Err(Quit)
                } else {
                    Ok(line)
                }
            }
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
        let gate = Gate::quizzing("b\nc\n".as_bytes(), Box::new(|_| String::new()));
        assert_eq!(gate.pause(Pause::Step).await, Ok(String::new()));
        assert_eq!(gate.pause(Pause::Predict).await, Ok("b".to_string()));
        assert_eq!(gate.pause(Pause::Reveal).await, Ok(String::new()));
        assert_eq!(gate.pause(Pause::Predict).await, Ok("c".to_string()));
    }

    #[tokio::test]
    async fn an_off_gate_never_pauses() {
        let gate = Gate::default();
        assert!(!gate.is_stepping());
        assert_eq!(gate.pause(Pause::Step).await, Ok(String::new()));
    }
}
