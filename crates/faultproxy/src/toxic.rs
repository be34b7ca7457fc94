//! Toxics: long-lived network conditions with Toxiproxy 2.x semantics.
//!
//! A toxic sits on one [`Stream`] of every connection through its proxy:
//! `upstream` is what the client sends to the server, `downstream` is the answer.
//! This module has two halves:
//!
//! * the data model ([`Toxic`], [`ToxicKind`], [`Stream`]) and its Toxiproxy JSON
//!   (`{name, type, stream, toxicity, attributes}`);
//! * [`ToxicChain`]: what one direction of one open connection does with the
//!   toxics, chunk by chunk. It watches the proxy's toxic list, so a toxic added
//!   while a connection is open applies to that connection from its next chunk on.
//!
//! The chain behaves as Toxiproxy's pipeline of toxics does: toxics apply in the order they
//! were added, so two latency toxics add up; removing a toxic lets a chunk it holds go at
//! once, and removing a timeout toxic closes the connection it held; slicer and bandwidth
//! waits are paced ([`Pacer`]) so that microsecond delays stay microseconds.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::{Instant, sleep, sleep_until};

use crate::error::Error;
use crate::rng::Rng;

/// Which way the bytes travel, named from the server's point of view as Toxiproxy does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    /// Client to server: the request.
    Upstream,
    /// Server to client: the response.
    Downstream,
}

impl Stream {
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Upstream => "upstream",
            Stream::Downstream => "downstream",
        }
    }

    fn parse(text: &str) -> Result<Stream, Error> {
        // Toxiproxy lower-cases the stream before parsing it; so do we.
        match text.to_ascii_lowercase().as_str() {
            "upstream" => Ok(Stream::Upstream),
            "downstream" => Ok(Stream::Downstream),
            _ => Err(Error::InvalidStream(text.to_owned())),
        }
    }
}

/// What a toxic does, with its attributes. Times are in milliseconds unless noted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToxicKind {
    /// Does nothing: Toxiproxy's `noop`, handy to check that a client can add and remove toxics.
    Noop,
    /// Delay every chunk by `latency` ms, plus or minus up to `jitter` ms.
    Latency { latency: u64, jitter: u64 },
    /// Stop all data; close the connection after `timeout` ms (0 = never close).
    Timeout { timeout: u64 },
    /// On the first data, wait `timeout` ms, then abort the connection with a TCP RST.
    ResetPeer { timeout: u64 },
    /// Let `bytes` bytes through, then close the connection.
    LimitData { bytes: u64 },
    /// Throttle to `rate` KB/s (1 KB = 1000 bytes, as in Toxiproxy; 0 = unlimited).
    Bandwidth { rate: u64 },
    /// Wait `delay` ms before passing on a close.
    SlowClose { delay: u64 },
    /// Cut data into pieces of `average_size` ± `size_variation` bytes,
    /// `delay` **microseconds** apart.
    Slicer {
        average_size: u64,
        size_variation: u64,
        delay: u64,
    },
}

impl ToxicKind {
    /// The Toxiproxy `type` string.
    pub fn type_name(&self) -> &'static str {
        match self {
            ToxicKind::Noop => "noop",
            ToxicKind::Latency { .. } => "latency",
            ToxicKind::Timeout { .. } => "timeout",
            ToxicKind::ResetPeer { .. } => "reset_peer",
            ToxicKind::LimitData { .. } => "limit_data",
            ToxicKind::Bandwidth { .. } => "bandwidth",
            ToxicKind::SlowClose { .. } => "slow_close",
            ToxicKind::Slicer { .. } => "slicer",
        }
    }

    /// The Toxiproxy `attributes` object. Every attribute is an integer, which is
    /// also what the `toxiproxy_rust` client expects (`HashMap<String, u32>`).
    fn attributes(&self) -> Map<String, Value> {
        let pairs: &[(&str, u64)] = match *self {
            ToxicKind::Noop => &[],
            ToxicKind::Latency { latency, jitter } => &[("latency", latency), ("jitter", jitter)],
            ToxicKind::Timeout { timeout } | ToxicKind::ResetPeer { timeout } => {
                &[("timeout", timeout)]
            }
            ToxicKind::LimitData { bytes } => &[("bytes", bytes)],
            ToxicKind::Bandwidth { rate } => &[("rate", rate)],
            ToxicKind::SlowClose { delay } => &[("delay", delay)],
            ToxicKind::Slicer {
                average_size,
                size_variation,
                delay,
            } => &[
                ("average_size", average_size),
                ("size_variation", size_variation),
                ("delay", delay),
            ],
        };
        pairs
            .iter()
            .map(|&(name, value)| (name.to_owned(), Value::from(value)))
            .collect()
    }

    /// Builds a kind from its `type` and `attributes`. Like Toxiproxy, a missing
    /// attribute is 0 and an unknown one is ignored; unlike Go's decoder we also
    /// reject negative numbers, which have no meaning for any toxic.
    fn from_attributes(type_name: &str, attributes: &Map<String, Value>) -> Result<Self, Error> {
        let attribute = |name: &str| -> Result<u64, Error> {
            match attributes.get(name) {
                None | Some(Value::Null) => Ok(0),
                Some(value) => value.as_u64().ok_or_else(|| Error::InvalidAttribute {
                    toxic_type: type_name.to_owned(),
                    attribute: name.to_owned(),
                }),
            }
        };
        Ok(match type_name {
            "noop" => ToxicKind::Noop,
            "latency" => ToxicKind::Latency {
                latency: attribute("latency")?,
                jitter: attribute("jitter")?,
            },
            "timeout" => ToxicKind::Timeout {
                timeout: attribute("timeout")?,
            },
            "reset_peer" => ToxicKind::ResetPeer {
                timeout: attribute("timeout")?,
            },
            "limit_data" => ToxicKind::LimitData {
                bytes: attribute("bytes")?,
            },
            "bandwidth" => ToxicKind::Bandwidth {
                rate: attribute("rate")?,
            },
            "slow_close" => ToxicKind::SlowClose {
                delay: attribute("delay")?,
            },
            "slicer" => ToxicKind::Slicer {
                average_size: attribute("average_size")?,
                size_variation: attribute("size_variation")?,
                delay: attribute("delay")?,
            },
            other => return Err(Error::InvalidToxicType(other.to_owned())),
        })
    }
}

/// One named toxic on one stream of a proxy. (De)serialises as Toxiproxy's JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "ToxicJson", into = "ToxicJson")]
pub struct Toxic {
    pub name: String,
    pub kind: ToxicKind,
    pub stream: Stream,
    /// Probability in `0.0..=1.0` that the toxic applies to a given connection.
    pub toxicity: f32,
}

impl Toxic {
    /// A toxic that always applies, named as Toxiproxy names it by default:
    /// `<type>_<stream>`, e.g. `latency_downstream`.
    pub fn new(kind: ToxicKind, stream: Stream) -> Toxic {
        Toxic {
            name: format!("{}_{}", kind.type_name(), stream.as_str()),
            kind,
            stream,
            toxicity: 1.0,
        }
    }

    pub fn named(mut self, name: impl Into<String>) -> Toxic {
        self.name = name.into();
        self
    }

    pub fn with_toxicity(mut self, toxicity: f32) -> Toxic {
        self.toxicity = toxicity;
        self
    }

    /// Parses Toxiproxy's JSON, keeping our precise error (going through serde's
    /// `Deserialize` would flatten it into a message string).
    pub(crate) fn from_json(json: Value) -> Result<Toxic, Error> {
        let json: ToxicJson = serde_json::from_value(json)
            .map_err(|error| Error::BadRequestBody(error.to_string()))?;
        Toxic::try_from(json)
    }

    pub(crate) fn validate(&self) -> Result<(), Error> {
        if self.name.is_empty() {
            return Err(Error::MissingField("name".into()));
        }
        if !(0.0..=1.0).contains(&self.toxicity) {
            return Err(Error::InvalidToxicity(self.toxicity));
        }
        Ok(())
    }

    /// Applies a Toxiproxy toxic update: the given attributes replace the old ones
    /// one by one, `toxicity` replaces the old one; name, type and stream stay.
    pub(crate) fn updated(&self, update: ToxicUpdate) -> Result<Toxic, Error> {
        let mut attributes = self.kind.attributes();
        attributes.extend(update.attributes.unwrap_or_default());
        let updated = Toxic {
            kind: ToxicKind::from_attributes(self.kind.type_name(), &attributes)?,
            toxicity: update.toxicity.unwrap_or(self.toxicity),
            ..self.clone()
        };
        updated.validate()?;
        Ok(updated)
    }
}

/// Toxiproxy's wire format of a toxic; the defaults are Toxiproxy's.
///
/// Every field may also be `null`, which means "not given", as in Go's decoder: the Go
/// client sends `"attributes": null` for a toxic without attributes (a `noop`, or a latency
/// of 0 through `AddToxic(…, nil)`).
#[derive(Serialize, Deserialize)]
struct ToxicJson {
    #[serde(default, deserialize_with = "null_as_default")]
    name: String,
    #[serde(rename = "type", default, deserialize_with = "null_as_default")]
    type_name: String,
    #[serde(default)]
    stream: Option<String>,
    #[serde(default)]
    toxicity: Option<f32>,
    #[serde(default)]
    attributes: Option<Map<String, Value>>,
}

/// Reads `null` as the type's default (`""` for a string), as Go's JSON decoder leaves a
/// field untouched when it meets `null`.
pub(crate) fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

impl TryFrom<ToxicJson> for Toxic {
    type Error = Error;

    fn try_from(json: ToxicJson) -> Result<Toxic, Error> {
        let stream = Stream::parse(json.stream.as_deref().unwrap_or("downstream"))?;
        let attributes = json.attributes.unwrap_or_default();
        let kind = ToxicKind::from_attributes(&json.type_name, &attributes)?;
        let mut toxic = Toxic::new(kind, stream).with_toxicity(json.toxicity.unwrap_or(1.0));
        if !json.name.is_empty() {
            toxic.name = json.name;
        }
        toxic.validate()?;
        Ok(toxic)
    }
}

impl From<Toxic> for ToxicJson {
    fn from(toxic: Toxic) -> ToxicJson {
        ToxicJson {
            type_name: toxic.kind.type_name().to_owned(),
            attributes: Some(toxic.kind.attributes()),
            name: toxic.name,
            stream: Some(toxic.stream.as_str().to_owned()),
            toxicity: Some(toxic.toxicity),
        }
    }
}

/// Body of `POST /proxies/{proxy}/toxics/{toxic}`: only what may change.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ToxicUpdate {
    #[serde(default)]
    pub attributes: Option<Map<String, Value>>,
    #[serde(default)]
    pub toxicity: Option<f32>,
}

// ---------------------------------------------------------------------------
// Applying toxics to one direction of one connection
// ---------------------------------------------------------------------------

/// The longest delay any toxic or fault waits. Longer values (the API accepts any
/// `u64`) are cut to this, because adding them to an `Instant` would overflow.
const LONGEST_DELAY: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// `start + delay`, without overflow for absurd delays.
pub(crate) fn later(start: Instant, delay: Duration) -> Instant {
    start + delay.min(LONGEST_DELAY)
}

/// Bytes read from one side of a connection, stamped with their arrival time.
pub(crate) struct Chunk {
    pub bytes: Vec<u8>,
    pub arrived: Instant,
}

/// What the chain decided for a chunk.
pub(crate) enum Verdict {
    /// Write these bytes (possibly fewer than arrived); then, if `then_close`,
    /// close the connection (limit_data reached its limit).
    Write { bytes: Vec<u8>, then_close: bool },
    /// Drop the bytes (timeout toxic).
    Swallow,
    /// Abort the connection with RST (reset_peer, after its timeout).
    Reset,
}

/// A toxic as one connection sees it.
struct AppliedToxic {
    toxic: Toxic,
    /// This connection's toxicity roll. Toxiproxy rolls once per connection, and
    /// again when the toxic is updated.
    rolled_in: bool,
    /// When the toxic started to apply to this connection: the timeout toxic's
    /// countdown starts here, also for a toxic added to an open connection.
    since: Instant,
    /// limit_data's count of bytes let through. Kept across updates of the toxic,
    /// as Toxiproxy keeps it, so raising the limit lets just the difference through.
    bytes_passed: u64,
}

/// The toxics of one stream, as applied to one connection.
pub(crate) struct ToxicChain {
    stream: Stream,
    config: watch::Receiver<Vec<Toxic>>,
    applied: Vec<AppliedToxic>,
    rng: Rng,
    /// A change of the toxic list was seen during a wait and not yet taken in.
    stale: bool,
    /// A timeout toxic that applied to this connection was removed: the connection must close
    /// (see [`Self::must_close`]).
    timeout_removed: bool,
    /// The proxy's count of chunks held by a wait (see `Proxy::held_chunks`).
    held: Arc<AtomicUsize>,
    /// The proxy's total of chunks swallowed (see `Proxy::swallowed_chunks`).
    swallowed: Arc<AtomicUsize>,
    /// The small waits of slicer and bandwidth toxics on this stream.
    pacer: Pacer,
}

impl ToxicChain {
    pub(crate) fn new(
        stream: Stream,
        config: watch::Receiver<Vec<Toxic>>,
        held: Arc<AtomicUsize>,
        swallowed: Arc<AtomicUsize>,
    ) -> ToxicChain {
        let mut chain = ToxicChain {
            stream,
            config,
            applied: Vec::new(),
            rng: Rng::new(),
            stale: false,
            timeout_removed: false,
            held,
            swallowed,
            pacer: Pacer::default(),
        };
        chain.sync_with_config();
        chain
    }

    /// Waits until the proxy's toxic list changes, then takes the change in.
    /// Returns `false` if the proxy is gone.
    pub(crate) async fn changed(&mut self) -> bool {
        if self.config.changed().await.is_err() {
            return false;
        }
        self.sync_with_config();
        true
    }

    fn sync_with_config(&mut self) {
        let config: Vec<Toxic> = self.config.borrow_and_update().clone();
        let mut previous = std::mem::take(&mut self.applied);
        for toxic in config.into_iter().filter(|t| t.stream == self.stream) {
            let known = previous
                .iter()
                .position(|old| old.toxic.name == toxic.name)
                .map(|index| previous.swap_remove(index));
            let applied = match known {
                Some(old) if old.toxic == toxic => old,
                other => AppliedToxic {
                    rolled_in: self.rng.roll() < toxic.toxicity,
                    since: Instant::now(),
                    bytes_passed: other.map_or(0, |old| old.bytes_passed),
                    toxic,
                },
            };
            self.applied.push(applied);
        }
        // What is left in `previous` was removed (by name: an update keeps the name). Toxiproxy
        // closes a connection whose timeout toxic is removed, a `POST /reset` included, rather
        // than let data flow again on a connection that lost some of it: the toxic's "cleanup".
        self.timeout_removed |= previous
            .iter()
            .any(|gone| gone.rolled_in && matches!(gone.toxic.kind, ToxicKind::Timeout { .. }));
    }

    /// Whether this connection must be closed now, because a timeout toxic that applied to it
    /// was removed. The writing side asks after every change of the toxic list it takes in.
    pub(crate) fn must_close(&self) -> bool {
        self.timeout_removed
    }

    /// The toxics that won their toxicity roll, in the order they were added
    /// (Toxiproxy chains them in that order).
    fn active(&self) -> impl Iterator<Item = &ToxicKind> {
        self.applied
            .iter()
            .filter(|applied| applied.rolled_in)
            .map(|applied| &applied.toxic.kind)
    }

    /// When a timeout toxic will close this connection, if one applies and has a
    /// non-zero timeout.
    pub(crate) fn close_deadline(&self) -> Option<Instant> {
        self.applied
            .iter()
            .filter(|applied| applied.rolled_in)
            .filter_map(|applied| match applied.toxic.kind {
                ToxicKind::Timeout { timeout } if timeout > 0 => {
                    Some(later(applied.since, Duration::from_millis(timeout)))
                }
                _ => None,
            })
            .min()
    }

    /// How long slow_close holds a close back.
    pub(crate) fn close_delay(&self) -> Duration {
        let delay_ms = self.active().fold(0u64, |total, kind| match *kind {
            ToxicKind::SlowClose { delay } => total.saturating_add(delay),
            _ => total,
        });
        Duration::from_millis(delay_ms).min(LONGEST_DELAY)
    }

    /// Runs one chunk through the toxics that delay, drop, cut or reset.
    /// (Bandwidth and slicer act when the bytes are written: [`Self::write_shaped`].)
    pub(crate) async fn process(&mut self, chunk: Chunk) -> Verdict {
        let Chunk { mut bytes, arrived } = chunk;
        // When the chunk is ready for the next toxic. It starts as the chunk's arrival and moves
        // on by each latency it waits out, so that two latency toxics add up (500 + 300 ms is
        // 800 ms, as in Toxiproxy, whose toxics are a pipeline), while a chunk that queued behind
        // a delayed one is not delayed a second time by the same toxic.
        let mut ready = arrived;
        let mut then_close = false;
        for index in 0..self.applied.len() {
            if !self.applied[index].rolled_in {
                continue;
            }
            match self.applied[index].toxic.kind {
                ToxicKind::Latency { latency, jitter } => {
                    let spread = latency as i128 + self.rng.spread(jitter);
                    let delay_ms = spread.clamp(0, u64::MAX as i128) as u64;
                    // Counted from when the chunk was ready, not from now: a chunk that
                    // queued behind a delayed one is not delayed a second time.
                    let deadline = later(ready, Duration::from_millis(delay_ms));
                    ready = if self.wait_while_in_force(index, deadline).await {
                        deadline
                    } else {
                        // Removed while it held the chunk: the rest counts from now.
                        Instant::now()
                    };
                }
                ToxicKind::Timeout { .. } => {
                    self.swallowed.fetch_add(1, Ordering::SeqCst);
                    return Verdict::Swallow;
                }
                ToxicKind::ResetPeer { timeout } => {
                    let deadline = later(Instant::now(), Duration::from_millis(timeout));
                    if self.wait_while_in_force(index, deadline).await {
                        return Verdict::Reset;
                    }
                    // Removed while it counted down: no reset.
                }
                ToxicKind::LimitData { bytes: limit } => {
                    let applied = &mut self.applied[index];
                    let remaining = limit.saturating_sub(applied.bytes_passed);
                    bytes.truncate(usize::try_from(remaining).unwrap_or(usize::MAX));
                    applied.bytes_passed += bytes.len() as u64;
                    then_close |= applied.bytes_passed >= limit;
                }
                ToxicKind::Noop
                | ToxicKind::Bandwidth { .. }
                | ToxicKind::SlowClose { .. }
                | ToxicKind::Slicer { .. } => {}
            }
        }
        // A change seen during a wait is taken in once this chunk is through: indices into
        // `applied` had to stay valid until then.
        if std::mem::take(&mut self.stale) {
            self.sync_with_config();
        }
        Verdict::Write { bytes, then_close }
    }

    /// Waits until `deadline` while the toxic at `index` stays as it is. Returns `false` early
    /// when that toxic is removed or changed (a `DELETE`, a `POST /reset`) or the proxy goes
    /// away: like Toxiproxy, a held chunk is let go at once instead of serving out a delay
    /// nobody asks for any more.
    async fn wait_while_in_force(&mut self, index: usize, deadline: Instant) -> bool {
        let toxic = self.applied[index].toxic.clone();
        let _held = HeldChunk::count(&self.held);
        loop {
            tokio::select! {
                () = sleep_until(deadline) => return true,
                alive = self.config.changed() => {
                    if alive.is_err() {
                        return false;
                    }
                    self.stale = true;
                    if !self.config.borrow().contains(&toxic) {
                        return false;
                    }
                }
            }
        }
    }

    /// Writes bytes to `dest`, sliced by a slicer toxic and paced by a bandwidth toxic.
    pub(crate) async fn write_shaped<W>(&mut self, bytes: &[u8], dest: &mut W) -> io::Result<()>
    where
        W: AsyncWrite + Unpin,
    {
        let mut slicer = None;
        let mut rate_kb_per_s = 0;
        for kind in self.active() {
            match *kind {
                ToxicKind::Slicer {
                    average_size,
                    size_variation,
                    delay,
                } => slicer = Some((average_size, size_variation, delay)),
                ToxicKind::Bandwidth { rate } => rate_kb_per_s = rate,
                _ => {}
            }
        }
        let Some((average_size, size_variation, delay_us)) = slicer else {
            return write_paced(dest, bytes, rate_kb_per_s, &mut self.pacer).await;
        };
        let sizes = slice_sizes(bytes.len(), average_size, size_variation, &mut self.rng);
        let mut rest = bytes;
        for (index, size) in sizes.iter().enumerate() {
            let (slice, remainder) = rest.split_at(*size);
            rest = remainder;
            if index > 0 {
                self.pacer.wait(Duration::from_micros(delay_us)).await;
            }
            write_paced(dest, slice, rate_kb_per_s, &mut self.pacer).await?;
        }
        Ok(())
    }
}

/// Waits out many small delays accurately on a timer that counts whole milliseconds.
///
/// Tokio's timer rounds every sleep up to the next millisecond, so a slicer asking for 10 µs
/// between slices would get 1 ms each (480 slices: half a second instead of 5 ms), and a
/// bandwidth toxic would run slower than its rate. Like Toxiproxy's bandwidth toxic, which
/// carries "the error" of each sleep into the next, the pacer keeps a balance: what is owed
/// accumulates, a sleep pays for as long as it really lasted, and no sleep happens while the
/// balance is not positive (a zero delay never sleeps at all).
#[derive(Default)]
pub(crate) struct Pacer {
    /// Owed minus slept, in nanoseconds; negative when a sleep overshot.
    balance_ns: i128,
}

impl Pacer {
    async fn wait(&mut self, owed: Duration) {
        self.balance_ns = self.balance_ns.saturating_add(owed.as_nanos() as i128);
        if self.balance_ns <= 0 {
            return;
        }
        let started = Instant::now();
        let due = u64::try_from(self.balance_ns).unwrap_or(u64::MAX);
        sleep(Duration::from_nanos(due).min(LONGEST_DELAY)).await;
        self.balance_ns -= started.elapsed().as_nanos() as i128;
    }
}

/// Writes `bytes` at `rate_kb_per_s` KB/s (0 = as fast as possible).
async fn write_paced<W>(
    dest: &mut W,
    bytes: &[u8],
    rate_kb_per_s: u64,
    pacer: &mut Pacer,
) -> io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    if rate_kb_per_s == 0 {
        return dest.write_all(bytes).await;
    }
    let bytes_per_second = rate_kb_per_s.saturating_mul(1000);
    // Send 100 ms worth of budget at a time, each after its share of time, as
    // Toxiproxy does: the transfer looks smooth instead of one late burst.
    let piece_size = usize::try_from(bytes_per_second / 10)
        .unwrap_or(usize::MAX)
        .max(1);
    for piece in bytes.chunks(piece_size) {
        pacer
            .wait(Duration::from_secs_f64(
                piece.len() as f64 / bytes_per_second as f64,
            ))
            .await;
        dest.write_all(piece).await?;
    }
    Ok(())
}

/// Sizes of the slices a slicer cuts `total` bytes into: each within
/// `average ± variation`, at least 1 byte, adding up to exactly `total`.
fn slice_sizes(total: usize, average: u64, variation: u64, rng: &mut Rng) -> Vec<usize> {
    if average == 0 {
        // Toxiproxy would loop forever here; slicing into nothing means no slicing.
        return vec![total];
    }
    // A variation as large as the average could ask for empty slices.
    let variation = variation.min(average - 1);
    let mut sizes = Vec::new();
    let mut left = total;
    while left > 0 {
        let wanted = (average as i128 + rng.spread(variation)).max(1);
        let size = usize::try_from(wanted).unwrap_or(usize::MAX).min(left);
        sizes.push(size);
        left -= size;
    }
    sizes
}

/// Counts a chunk as held for as long as it lives (also when the wait is cancelled).
struct HeldChunk(Arc<AtomicUsize>);

impl HeldChunk {
    fn count(held: &Arc<AtomicUsize>) -> HeldChunk {
        held.fetch_add(1, Ordering::SeqCst);
        HeldChunk(held.clone())
    }
}

impl Drop for HeldChunk {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_add_up_and_respect_bounds() {
        let mut rng = Rng::new();
        for total in [0, 1, 9, 100, 4096] {
            let sizes = slice_sizes(total, 10, 4, &mut rng);
            assert_eq!(sizes.iter().sum::<usize>(), total);
            let (last, body) = sizes.split_last().unwrap_or((&0, &[]));
            assert!(body.iter().all(|size| (6..=14).contains(size)));
            assert!(*last <= 14);
        }
        assert_eq!(slice_sizes(50, 0, 0, &mut rng), vec![50]);
        assert!(
            slice_sizes(50, 1, 5, &mut rng)
                .iter()
                .all(|size| *size == 1)
        );
    }

    /// Each chunk is delayed from its own arrival, not one after the other: chunks that
    /// queued behind a delayed one go out with it (the noxious port took n × latency for
    /// an answer of n chunks). On tokio's paused clock, so the times are exact instead of
    /// measured on a possibly loaded machine; an upper bound on this clock cannot flake.
    #[tokio::test(start_paused = true)]
    async fn latency_counts_from_each_chunks_arrival() {
        let latency = ToxicKind::Latency {
            latency: 300,
            jitter: 0,
        };
        // The sender must live: a closed toxic list would let every chunk go at once.
        let (_config, watched) = watch::channel(vec![Toxic::new(latency, Stream::Downstream)]);
        let mut chain =
            ToxicChain::new(Stream::Downstream, watched, Arc::default(), Arc::default());
        let chunk = |arrived| Chunk {
            bytes: b"x".to_vec(),
            arrived,
        };

        // 13 chunks arrive together (200 kB read 16 kB at a time).
        let arrived = Instant::now();
        for _ in 0..13 {
            let verdict = chain.process(chunk(arrived)).await;
            assert!(matches!(verdict, Verdict::Write { .. }));
            assert_eq!(arrived.elapsed(), Duration::from_millis(300));
        }

        // A chunk that already waited longer than the latency goes out at once.
        let arrived = Instant::now();
        tokio::time::advance(Duration::from_millis(500)).await;
        chain.process(chunk(arrived)).await;
        assert_eq!(arrived.elapsed(), Duration::from_millis(500));
    }

    /// Two latency toxics on one stream add up, as in Toxiproxy's pipeline of toxics.
    #[tokio::test(start_paused = true)]
    async fn latencies_add_up() {
        let latency = |name: &str, latency| {
            Toxic::new(
                ToxicKind::Latency { latency, jitter: 0 },
                Stream::Downstream,
            )
            .named(name)
        };
        let (_config, watched) = watch::channel(vec![latency("a", 500), latency("b", 300)]);
        let mut chain =
            ToxicChain::new(Stream::Downstream, watched, Arc::default(), Arc::default());
        let arrived = Instant::now();
        let bytes = b"x".to_vec();
        chain.process(Chunk { bytes, arrived }).await;
        assert_eq!(arrived.elapsed(), Duration::from_millis(800));
    }

    /// Removing a timeout toxic (not updating it) asks the connection to close.
    #[test]
    fn removing_a_timeout_asks_to_close() {
        let timeout = |timeout| Toxic::new(ToxicKind::Timeout { timeout }, Stream::Upstream);
        let (config, watched) = watch::channel(vec![timeout(0)]);
        let mut chain = ToxicChain::new(Stream::Upstream, watched, Arc::default(), Arc::default());
        config.send_replace(vec![timeout(5)]);
        chain.sync_with_config();
        assert!(!chain.must_close(), "an update keeps the connection");
        config.send_replace(Vec::new());
        chain.sync_with_config();
        assert!(chain.must_close());
    }

    /// A slicer's 10 µs between slices must not become tokio's 1 ms each: 1000 of them take
    /// 10 ms in all, not a second. Zero never sleeps. On the paused clock, so exact.
    #[tokio::test(start_paused = true)]
    async fn pacer_keeps_small_delays_small() {
        let mut pacer = Pacer::default();
        let started = Instant::now();
        for _ in 0..1000 {
            pacer.wait(Duration::ZERO).await;
        }
        assert_eq!(started.elapsed(), Duration::ZERO);
        for _ in 0..1000 {
            pacer.wait(Duration::from_micros(10)).await;
        }
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(10), "{took:?}");
        assert!(took <= Duration::from_millis(11), "{took:?}");
    }

    #[test]
    fn absurd_delays_do_not_overflow() {
        let now = Instant::now();
        assert!(later(now, Duration::MAX) > now);
    }

    #[test]
    fn json_defaults_are_toxiproxys() {
        let toxic: Toxic =
            serde_json::from_str(r#"{"type":"latency","attributes":{"latency":300}}"#).unwrap();
        assert_eq!(toxic.name, "latency_downstream");
        assert_eq!(toxic.stream, Stream::Downstream);
        assert_eq!(toxic.toxicity, 1.0);
        assert_eq!(
            toxic.kind,
            ToxicKind::Latency {
                latency: 300,
                jitter: 0
            }
        );
        let json = serde_json::to_value(&toxic).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"name": "latency_downstream", "type": "latency",
                "stream": "downstream", "toxicity": 1.0,
                "attributes": {"latency": 300, "jitter": 0}})
        );
    }

    #[test]
    fn bad_json_is_rejected_with_the_right_error() {
        let parse = |json: &str| serde_json::from_str::<ToxicJson>(json).map(Toxic::try_from);
        assert!(matches!(
            parse(r#"{"type":"explode"}"#),
            Ok(Err(Error::InvalidToxicType(_)))
        ));
        assert!(matches!(
            parse(r#"{"type":"latency","stream":"sideways"}"#),
            Ok(Err(Error::InvalidStream(_)))
        ));
        assert!(matches!(
            parse(r#"{"type":"latency","attributes":{"latency":-5}}"#),
            Ok(Err(Error::InvalidAttribute { .. }))
        ));
        assert!(matches!(
            parse(r#"{"type":"latency","toxicity":1.5}"#),
            Ok(Err(Error::InvalidToxicity(_)))
        ));
    }

    #[test]
    fn update_merges_attributes_and_keeps_identity() {
        let toxic = Toxic::new(
            ToxicKind::Latency {
                latency: 100,
                jitter: 10,
            },
            Stream::Upstream,
        );
        let update: ToxicUpdate =
            serde_json::from_str(r#"{"attributes":{"latency":500},"toxicity":0.5}"#).unwrap();
        let updated = toxic.updated(update).unwrap();
        assert_eq!(
            updated.kind,
            ToxicKind::Latency {
                latency: 500,
                jitter: 10
            }
        );
        assert_eq!(updated.toxicity, 0.5);
        assert_eq!(
            (updated.name.as_str(), updated.stream),
            ("latency_upstream", Stream::Upstream)
        );
    }
}
