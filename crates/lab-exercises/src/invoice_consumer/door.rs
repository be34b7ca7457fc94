//! A consumer's door to Redis: a TCP proxy of the lab's, one per consumer (its `REDIS_URL`), that
//! reads the commands going up (RESP, as every Redis client sends them) so the lab can tell what
//! that consumer asked of Redis, and when.
//!
//! - Every command is written down ([`Command`]: its name and arguments), in the order the
//!   consumer sent it: the lab knows what a consumer did after a moment it staged (read the
//!   stream again, wrote a record) without reading its code.
//! - While the door's ack hold is armed ([`Door::hold_acks`]), an `XACK` stops at the door, and
//!   everything the consumer sends after it on that connection waits behind it: the ack has been
//!   asked for and has not reached Redis. Every `XACK` is held, a retry on a fresh connection too
//!   (the consumer's own retries are part of the schedule). An `XACK` inside `MULTI` is not held
//!   alone: the `EXEC` that carries it is (the ack lands with what the transaction stores, or not
//!   at all).
//! - [`Door::cut`] drops every connection: what a held connection still had to send never
//!   reaches Redis (a queued `MULTI` is discarded by Redis with its connection).
//!
//! A script (`EVAL`) that acks inside is not seen as an ack: the checks that need the ack held
//! say so (an entry acked with no `XACK` held) instead of judging.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tokio::task::{AbortHandle, JoinHandle};

use crate::error::ExerciseError;

/// The longest argument kept in the log: keys and ids are short; a stored value is not needed.
const ARG_LIMIT: usize = 200;

/// One command a consumer sent through its door.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Command {
    /// Its name, upper case (`XACK`, `SET`, `EXEC`).
    pub name: String,
    pub args: Vec<String>,
    /// An `EXEC` whose transaction carries an `XACK`.
    pub carries_ack: bool,
}

impl Command {
    /// Whether it is an ack: an `XACK`, or the `EXEC` of a transaction with one.
    pub fn acks(&self) -> bool {
        self.name == "XACK" || self.carries_ack
    }

    /// Whether it reads the stream (the consumer moved on to its next entries).
    pub fn reads_stream(&self) -> bool {
        matches!(
            self.name.as_str(),
            "XREADGROUP" | "XAUTOCLAIM" | "XCLAIM" | "XPENDING" | "XREAD"
        )
    }
}

/// What went through a door.
#[derive(Default)]
pub(super) struct Log {
    /// Every command that went up, in order (a held one once it went).
    pub sent: Vec<Command>,
    /// The acks held at the door right now, or held before the door was cut.
    pub held: Vec<Command>,
}

impl Log {
    /// Whether a command sent at or after position `from` read the stream: the consumer moved
    /// on to its next entries after that moment.
    pub fn read_stream_since(&self, from: usize) -> bool {
        self.sent
            .get(from..)
            .is_some_and(|later| later.iter().any(Command::reads_stream))
    }
}

struct Shared {
    upstream: String,
    log: Mutex<Log>,
    /// Told on every command logged or held.
    changed: Notify,
    /// `true` while acks pass.
    open: watch::Sender<bool>,
    connections: Mutex<Vec<AbortHandle>>,
}

/// A consumer's door to Redis (see the module's documentation).
pub(super) struct Door {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl Door {
    /// A door in front of Redis at `upstream` (`host:port`), on a loopback port of its own.
    pub async fn open(upstream: &str) -> Result<Door, ExerciseError> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(ExerciseError::io("127.0.0.1"))?;
        let addr = listener
            .local_addr()
            .map_err(ExerciseError::io("127.0.0.1"))?;
        let (open, _) = watch::channel(true);
        let shared = Arc::new(Shared {
            upstream: upstream.to_string(),
            log: Mutex::default(),
            changed: Notify::new(),
            open,
            connections: Mutex::default(),
        });
        let accept = tokio::spawn({
            let shared = shared.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let task = tokio::spawn(serve(shared.clone(), client));
                    shared.connections.lock().push(task.abort_handle());
                }
            }
        });
        Ok(Door {
            addr,
            shared,
            accept,
        })
    }

    /// The `redis://` URL the consumer is given.
    pub fn url(&self) -> String {
        format!("redis://{}/0", self.addr)
    }

    /// From now on every ack stops at the door until [`Door::release`].
    pub fn hold_acks(&self) {
        self.shared.open.send_replace(false);
    }

    /// Lets every held ack go on, and later ones pass.
    pub fn release(&self) {
        self.shared.open.send_replace(true);
    }

    /// The first ack held, once one is, waiting at most `limit`.
    pub async fn held_ack(&self, limit: Duration) -> Option<Command> {
        self.wait(limit, |log| log.held.first().cloned()).await
    }

    /// How many commands went up so far.
    pub fn sent_count(&self) -> usize {
        self.shared.log.lock().sent.len()
    }

    /// Waits at most `limit` until `found` finds something in the log.
    pub async fn wait<T>(&self, limit: Duration, found: impl Fn(&Log) -> Option<T>) -> Option<T> {
        let waiting = async {
            loop {
                let changed = self.shared.changed.notified();
                if let Some(found) = found(&self.shared.log.lock()) {
                    return found;
                }
                changed.await;
            }
        };
        tokio::time::timeout(limit, waiting).await.ok()
    }

    /// Drops every connection through the door: what they still had to send (a held ack) never
    /// reaches Redis. New connections are served as before.
    pub fn cut(&self) {
        for connection in self.shared.connections.lock().drain(..) {
            connection.abort();
        }
    }

    /// Cuts every connection and stops listening.
    pub fn close(&self) {
        self.accept.abort();
        self.cut();
        self.release();
    }
}

impl Drop for Door {
    fn drop(&mut self) {
        self.close();
    }
}

/// One connection: commands up, one by one, acks held while the hold is armed; answers down as
/// they come.
async fn serve(shared: Arc<Shared>, client: TcpStream) {
    let Ok(server) = TcpStream::connect(&shared.upstream).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let down = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
    });
    let mut buffer: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 16 * 1024];
    let mut in_transaction = false;
    let mut transaction_acks = false;
    'connection: loop {
        while let Some((length, args)) = parse(&buffer) {
            let name = args
                .first()
                .map(|a| String::from_utf8_lossy(a).to_ascii_uppercase())
                .unwrap_or_default();
            let mut command = Command {
                name: name.clone(),
                args: args.iter().skip(1).map(|a| shown(a)).collect(),
                carries_ack: false,
            };
            match name.as_str() {
                "MULTI" => (in_transaction, transaction_acks) = (true, false),
                "XACK" if in_transaction => transaction_acks = true,
                "EXEC" if in_transaction => {
                    command.carries_ack = transaction_acks;
                    in_transaction = false;
                }
                "DISCARD" => in_transaction = false,
                _ => {}
            }
            let holds = command.acks() && !(command.name == "XACK" && in_transaction);
            if holds && !*shared.open.borrow() {
                shared.log.lock().held.push(command.clone());
                shared.changed.notify_waiters();
                let mut open = shared.open.subscribe();
                if open.wait_for(|open| *open).await.is_err() {
                    break 'connection;
                }
                let mut log = shared.log.lock();
                if let Some(at) = log.held.iter().position(|held| *held == command) {
                    log.held.remove(at);
                }
            }
            shared.log.lock().sent.push(command);
            shared.changed.notify_waiters();
            if server_write.write_all(&buffer[..length]).await.is_err() {
                break 'connection;
            }
            buffer.drain(..length);
        }
        match client_read.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    }
    down.abort();
}

/// An argument as the log keeps it: text, cut at [`ARG_LIMIT`].
fn shown(arg: &[u8]) -> String {
    let text = String::from_utf8_lossy(&arg[..arg.len().min(ARG_LIMIT)]);
    text.into_owned()
}

/// The first whole command in `buffer`: its length in bytes and its arguments; `None` if it has
/// not all arrived. A RESP array of bulk strings (what clients send), or an inline command (a
/// line). Bytes that are neither are passed on as one command with no arguments.
fn parse(buffer: &[u8]) -> Option<(usize, Vec<Vec<u8>>)> {
    let line_end = |from: usize| {
        buffer[from..]
            .windows(2)
            .position(|w| w == b"\r\n")
            .map(|at| from + at)
    };
    if buffer.is_empty() {
        return None;
    }
    if buffer[0] != b'*' {
        let end = line_end(0)?;
        let args = buffer[..end]
            .split(|b| *b == b' ')
            .filter(|part| !part.is_empty())
            .map(<[u8]>::to_vec)
            .collect();
        return Some((end + 2, args));
    }
    let number = |from: usize, to: usize| -> Option<usize> {
        std::str::from_utf8(&buffer[from..to]).ok()?.parse().ok()
    };
    let end = line_end(1)?;
    let Some(count) = number(1, end) else {
        return Some((buffer.len(), Vec::new()));
    };
    let mut at = end + 2;
    let mut args = Vec::with_capacity(count);
    for _ in 0..count {
        if at >= buffer.len() {
            return None;
        }
        if buffer[at] != b'$' {
            return Some((buffer.len(), Vec::new()));
        }
        let end = line_end(at + 1)?;
        let Some(length) = number(at + 1, end) else {
            return Some((buffer.len(), Vec::new()));
        };
        let start = end + 2;
        if buffer.len() < start + length + 2 {
            return None;
        }
        args.push(buffer[start..start + length].to_vec());
        at = start + length + 2;
    }
    Some((at, args))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resp_command_is_read_whole_or_not_at_all() {
        let xack = b"*4\r\n$4\r\nXACK\r\n$1\r\ns\r\n$9\r\ninvoicing\r\n$3\r\n1-0\r\n";
        let (length, args) = parse(xack).unwrap();
        assert_eq!(length, xack.len());
        assert_eq!(args[0], b"XACK");
        assert_eq!(args[3], b"1-0");
        for cut in 1..xack.len() {
            assert_eq!(parse(&xack[..cut]), None, "{cut} bytes");
        }
        let mut two = xack.to_vec();
        two.extend_from_slice(b"*1\r\n$4\r\nPING\r\n");
        assert_eq!(parse(&two).unwrap().0, xack.len());
    }

    #[test]
    fn an_inline_command_is_a_line() {
        assert_eq!(parse(b"PING\r\nrest"), Some((6, vec![b"PING".to_vec()])));
    }

    #[test]
    fn an_ack_is_an_xack_or_a_transaction_with_one() {
        let command = |name: &str, carries_ack| Command {
            name: name.into(),
            args: vec![],
            carries_ack,
        };
        assert!(command("XACK", false).acks());
        assert!(command("EXEC", true).acks());
        assert!(!command("EXEC", false).acks());
        assert!(command("XAUTOCLAIM", false).reads_stream());
        assert!(!command("SET", false).reads_stream());
    }
}
