//! The step gate's input in the web view: lines sent by the page instead of typed on stdin.
//!
//! [`lab_core::Gate`] reads its answers line by line from any async reader. [`LineReader`] is
//! such a reader over a channel: the hub sends `"\n"` for Next and `"b\n"` for the answer b,
//! exactly what a learner would type after `lab run NAME --step`. When the sending side is
//! dropped (the scenario was restarted), the reader ends, and a pause still waiting on it (a
//! request paused inside a service of the abandoned run) goes on without pausing.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncBufRead, AsyncRead, ReadBuf};
use tokio::sync::mpsc;

/// An async reader of the lines sent on a channel.
pub struct LineReader {
    lines: mpsc::UnboundedReceiver<String>,
    buf: Vec<u8>,
    pos: usize,
}

impl LineReader {
    /// A reader and the sender that feeds it.
    pub fn channel() -> (mpsc::UnboundedSender<String>, LineReader) {
        let (tx, rx) = mpsc::unbounded_channel();
        let reader = LineReader {
            lines: rx,
            buf: Vec::new(),
            pos: 0,
        };
        (tx, reader)
    }
}

impl AsyncBufRead for LineReader {
    fn poll_fill_buf(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<&[u8]>> {
        let this = self.get_mut();
        if this.pos >= this.buf.len() {
            match ready!(this.lines.poll_recv(cx)) {
                Some(line) => {
                    this.buf = line.into_bytes();
                    this.pos = 0;
                }
                // Every sender is gone: end of input.
                None => return Poll::Ready(Ok(&[])),
            }
        }
        Poll::Ready(Ok(&this.buf[this.pos..]))
    }

    fn consume(self: Pin<&mut Self>, amt: usize) {
        let this = self.get_mut();
        this.pos = (this.pos + amt).min(this.buf.len());
    }
}

impl AsyncRead for LineReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let available = ready!(self.as_mut().poll_fill_buf(cx))?;
        let n = available.len().min(out.remaining());
        out.put_slice(&available[..n]);
        self.consume(n);
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lab_core::Gate;
    use lab_core::gate::Pause;

    #[tokio::test]
    async fn the_gate_reads_what_the_page_sends_and_runs_on_when_it_is_gone() {
        let (tx, reader) = LineReader::channel();
        let gate = Gate::stepping(reader, Box::new(|_| String::new()));
        tx.send("\n".into()).unwrap();
        tx.send("b\n".into()).unwrap();
        assert_eq!(gate.pause(Pause::Step).await, Ok(String::new()));
        assert_eq!(gate.pause(Pause::Predict).await, Ok("b".into()));
        drop(tx);
        assert_eq!(gate.pause(Pause::Step).await, Ok(String::new()));
        assert_eq!(gate.pause(Pause::Reveal).await, Ok(String::new()));
    }
}
