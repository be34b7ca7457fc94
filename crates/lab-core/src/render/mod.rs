//! Renderers: the same event stream as coloured text or as JSON lines, as pictures of who
//! called whom ([`diagram`]: Mermaid, terminal swimlanes), and as the web view's messages
//! ([`web`]: both languages and the diagram's marks).

pub mod diagram;
mod explain;
pub mod fold;
mod json;
mod text;
pub mod web;

pub use diagram::{mermaid, mermaid_calls, swimlanes};
pub use explain::render_explain;
pub use json::JsonRenderer;
pub use text::{TextRenderer, count_steps, render_text};
pub use web::WebRenderer;

use std::io::Write;

use crate::Event;
use crate::narrator::Sink;

/// Joins the lines of each paragraph, so prose written with line breaks in a TOML file is
/// wrapped afresh to the width it is shown at. A blank line (a paragraph break) stays, and so
/// does a line that starts with a space (indented SQL, a list) and the line before it.
pub(crate) fn reflow(text: &str) -> String {
    let mut out = String::new();
    let mut previous_indented = true;
    for line in text.trim_end().lines() {
        let indented = line.starts_with(' ');
        if line.trim().is_empty() {
            out.push_str("\n\n");
            previous_indented = true;
        } else if out.is_empty() || out.ends_with('\n') {
            out.push_str(line);
            previous_indented = indented;
        } else if indented || previous_indented {
            out.push('\n');
            out.push_str(line);
            previous_indented = indented;
        } else {
            out.push(' ');
            out.push_str(line);
        }
    }
    out
}

/// A renderer of either kind.
pub enum Renderer {
    Text(TextRenderer),
    Json(JsonRenderer),
}

impl Renderer {
    pub fn render(&mut self, event: &Event) -> String {
        match self {
            Renderer::Text(r) => r.render(event),
            Renderer::Json(r) => r.render(event),
        }
    }
}

/// A [`Sink`] that renders each event and writes it out at once (flushing, so a learner in step
/// mode sees the step before the pause).
pub struct WriteSink<W: Write + Send> {
    renderer: Renderer,
    out: W,
}

impl<W: Write + Send> WriteSink<W> {
    pub fn new(renderer: Renderer, out: W) -> Self {
        WriteSink { renderer, out }
    }
}

impl<W: Write + Send> Sink for WriteSink<W> {
    fn emit(&mut self, event: &Event) {
        let text = self.renderer.render(event);
        // A closed stdout (`lab run all | head`) must not panic the run; cleanup still happens.
        let _ = self.out.write_all(text.as_bytes());
        let _ = self.out.flush();
    }
}
