//! Folding: a service's line that says *why* stays folded until the answer is revealed.
//!
//! A service tells what it did and, often, why ("no Idempotency-Key, so this is a new
//! operation: inserted report 1"). Before a prediction the why is the answer, and a class reads
//! everything on the screen above the question. So a service message whose key `K` has a second
//! text `folded.K` (same arguments) in the catalogues is *foldable*: from the start of a scenario
//! or of one of its parts until the next reveal, every renderer shows `folded.K` (what happened,
//! no reason) in its place, and at the reveal the lines folded so far are shown again in full,
//! under the answer. A part that reveals nothing shows them at its end (the next part, the
//! explanation or the summary).
//!
//! One mechanism for every way a run is shown: [`Fold`] is the one state that decides, and the
//! terminal text (live, `--step`, `lab check`'s narratives), the JSON lines and the web view's
//! texts, and the pictures (`--diagram`, the web view's diagram, the Mermaid of the handouts) each
//! keep one and ask it.

use crate::{Event, Lang, Msg, Texts};

/// The prefix of the folded form of a service message: `folded.reports.inserted_no_key`.
pub const FOLDED: &str = "folded.";

/// A service's line shown folded, to be shown in full at the reveal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Folded {
    /// The step it was told under (0 before the first step).
    pub step: u32,
    /// The service, as in [`Event::Service`].
    pub service: String,
    /// The full message.
    pub text: Msg,
}

/// Which service lines are folded now, and which were folded since the last reveal.
#[derive(Debug, Clone)]
pub struct Fold {
    /// A question may still come before the next reveal: foldable lines fold.
    open: bool,
    step: u32,
    pending: Vec<Folded>,
}

impl Default for Fold {
    fn default() -> Fold {
        Fold::new()
    }
}

impl Fold {
    pub fn new() -> Fold {
        Fold {
            open: true,
            step: 0,
            pending: Vec::new(),
        }
    }

    /// Follows the run: a scenario or a part opens the fold (a question may come), a step
    /// sets the step number lines are told under. Call it for every event, before rendering.
    pub fn see(&mut self, event: &Event) {
        match event {
            Event::Start { .. } => *self = Fold::new(),
            Event::Side { .. } => self.open = true,
            Event::Step { number, .. } => self.step = *number,
            _ => {}
        }
    }

    /// The message a service line shows now: its folded form while the fold is open and the
    /// catalogue has one (the full line is kept for the reveal), else the line itself.
    pub fn service(
        &mut self,
        texts: &Texts,
        scope: &str,
        lang: Lang,
        service: &str,
        text: &Msg,
    ) -> Msg {
        let folded_key = format!("{FOLDED}{}", text.key);
        if !self.open || texts.get(scope, lang, &folded_key).is_none() {
            return text.clone();
        }
        self.pending.push(Folded {
            step: self.step,
            service: service.to_string(),
            text: text.clone(),
        });
        Msg {
            key: folded_key,
            args: text.args.clone(),
        }
    }

    /// The lines to show in full now, and the fold's next state. At a reveal: every line
    /// folded since the last one, and the fold closes until the next part. At the end of a
    /// part that revealed nothing (the next part, the explanation, the summary): the lines it
    /// folded. Otherwise nothing.
    pub fn unfold(&mut self, event: &Event) -> Vec<Folded> {
        match event {
            Event::Reveal { .. } => {
                self.open = false;
                std::mem::take(&mut self.pending)
            }
            Event::Side { .. } | Event::Explain | Event::Summary { .. } => {
                std::mem::take(&mut self.pending)
            }
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::COMMON;

    #[test]
    fn a_why_line_folds_until_the_reveal_and_shows_in_full_there() {
        let mut texts = Texts::new();
        texts
            .add(
                COMMON,
                Lang::En,
                "[s]\nwhy = \"no key, so new: {id}\"\nplain = \"p\"\n[folded.s]\nwhy = \"inserted {id}\"\n",
            )
            .unwrap();
        let line = Msg::new("s.why").arg("id", 1);
        let mut fold = Fold::new();
        fold.see(&Event::Start {
            scenario: "x".into(),
        });
        fold.see(&Event::Step {
            number: 3,
            text: Msg::new("step"),
        });
        let shown = fold.service(&texts, "x", Lang::En, "reports", &line);
        assert_eq!(texts.render("x", Lang::En, &shown), "inserted 1");
        let plain = Msg::new("s.plain");
        assert_eq!(
            fold.service(&texts, "x", Lang::En, "reports", &plain),
            plain
        );
        let reveal = Event::Reveal {
            answer: Msg::new("reveal"),
        };
        let unfolded = fold.unfold(&reveal);
        assert_eq!(unfolded.len(), 1);
        assert_eq!((unfolded[0].step, &unfolded[0].text), (3, &line));
        assert_eq!(
            fold.service(&texts, "x", Lang::En, "reports", &line),
            line,
            "after the reveal, in full"
        );
        fold.see(&Event::Side {
            text: Msg::new("side"),
        });
        assert_ne!(
            fold.service(&texts, "x", Lang::En, "reports", &line),
            line,
            "a new part folds again"
        );
        assert_eq!(fold.unfold(&Event::Explain).len(), 1, "shown at its end");
    }
}
