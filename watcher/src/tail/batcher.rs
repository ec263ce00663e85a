//! The way out: each sink's open batch, the batches handed to its
//! connections and not yet answered, and when an open batch goes. The
//! [`Outbound`] owns them; the wait for room in a full outbox ends with a
//! stop.

use std::sync::Arc;
use std::time::{Duration, Instant};

use flight_server::{BatchBuilder, Outgoing, RowKind};
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

use super::files::{FileKey, Map};
use crate::config::WatchConfig;
use crate::stop::Stop;

/// One row of a batch on its way, as the tailer applies its answer.
pub(super) struct RowRef {
    pub(super) file: FileKey,
    pub(super) kind: RowKind,
    pub(super) offset: u64,
    pub(super) len: u64,
    /// A rename's new path.
    pub(super) path: Option<String>,
}

/// A sink's batch being filled.
pub(super) struct OpenBatch {
    pub(super) builder: BatchBuilder,
    pub(super) rows: Vec<RowRef>,
    /// When its first data row was added (the linger counts from there).
    pub(super) started: Option<Instant>,
}

impl OpenBatch {
    fn new(config: &WatchConfig) -> Self {
        Self {
            builder: BatchBuilder::with_capacity(64, config.batch_bytes + config.max_row_bytes),
            rows: Vec::new(),
            started: None,
        }
    }
}

/// The sinks' open batches and the batches in flight, by token.
pub(super) struct Outbound {
    batches: Vec<OpenBatch>,
    outboxes: Vec<mpsc::Sender<Outgoing>>,
    in_flight: Map<u64, Vec<RowRef>>,
    next_token: u64,
    linger: Duration,
    batch_bytes: usize,
    stop: Arc<Stop>,
}

impl Outbound {
    /// An open batch per outbox (one outbox per sink).
    pub(super) fn new(
        config: &WatchConfig,
        outboxes: Vec<mpsc::Sender<Outgoing>>,
        stop: Arc<Stop>,
    ) -> Self {
        Self {
            batches: outboxes.iter().map(|_| OpenBatch::new(config)).collect(),
            outboxes,
            in_flight: Map::default(),
            next_token: 0,
            linger: config.linger,
            batch_bytes: config.batch_bytes,
            stop,
        }
    }

    pub(super) fn batch(&mut self, sink: usize) -> &mut OpenBatch {
        &mut self.batches[sink]
    }

    /// Nothing handed over is waiting for its answer.
    pub(super) fn idle(&self) -> bool {
        self.in_flight.is_empty()
    }

    pub(super) fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// The rows of the batch a sink answered, once.
    pub(super) fn answered(&mut self, token: u64) -> Option<Vec<RowRef>> {
        self.in_flight.remove(&token)
    }

    /// When the earliest open batch's linger is up.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.batches
            .iter()
            .filter_map(|batch| batch.started)
            .min()
            .map(|started| started + self.linger)
    }

    /// Hands a sink's batch over once it reaches the batch size: thousands
    /// of rows at once must not make one message too large for the sink.
    pub(super) fn flush_if_full(&mut self, sink: usize) {
        if self.batches[sink].builder.encoded_bytes() >= self.batch_bytes {
            self.flush(sink);
        }
    }

    /// Sends batches whose linger time is up. When nothing is in flight the
    /// link is idle and waiting would only add latency, so a batch goes at
    /// once; under load, acks take a while and the linger gathers rows.
    pub(super) fn flush_due(&mut self, now: Instant) {
        let idle = self.idle();
        for sink in 0..self.batches.len() {
            if let Some(started) = self.batches[sink].started
                && (idle || now >= started + self.linger)
            {
                self.flush(sink);
            }
        }
    }

    pub(super) fn flush_all(&mut self) {
        for sink in 0..self.batches.len() {
            self.flush(sink);
        }
    }

    /// Hands the open batch of a sink to its connections (blocking while the
    /// queue is full, until a stop: see [`hand_over`]).
    pub(super) fn flush(&mut self, sink: usize) {
        let batch = &mut self.batches[sink];
        if batch.builder.rows() == 0 {
            batch.started = None;
            return;
        }
        let encoded = batch.builder.finish_encoded();
        // The next batch likely holds as many rows: no regrowing from empty.
        let next_rows = Vec::with_capacity(batch.rows.len());
        let rows = std::mem::replace(&mut batch.rows, next_rows);
        batch.started = None;
        let token = self.next_token;
        self.next_token += 1;
        self.in_flight.insert(token, rows);
        let out = Outgoing {
            token,
            batch: encoded,
        };
        if let Err(why) = hand_over(&self.outboxes[sink], out, &self.stop) {
            // Never acknowledged, so never recorded: the next run reads it again.
            self.in_flight.remove(&token);
            match why {
                NotSent::Stopping => {
                    tracing::debug!(sink, "stopping; a batch waiting for room was dropped")
                }
                NotSent::PoolGone => tracing::error!(
                    sink,
                    "the connection pool is gone; batch dropped (it will be re-read after restart)"
                ),
            }
        }
    }
}

enum NotSent {
    Stopping,
    PoolGone,
}

/// Hands a batch to a sink's connections. Waiting while the outbox is full
/// is the backpressure that bounds memory, but the room comes from the sink
/// acknowledging: a stop must end that wait, or an unresponsive sink holds
/// the watcher forever.
fn hand_over(outbox: &mpsc::Sender<Outgoing>, out: Outgoing, stop: &Stop) -> Result<(), NotSent> {
    let out = match outbox.try_send(out) {
        Ok(()) => return Ok(()),
        Err(TrySendError::Closed(_)) => return Err(NotSent::PoolGone),
        Err(TrySendError::Full(out)) => out,
    };
    if stop.is_requested() {
        return Err(NotSent::Stopping);
    }
    // The tailer is a plain thread: a local executor waits for whichever
    // comes first, room or the stop.
    futures::executor::block_on(async {
        tokio::select! {
            biased;
            () = stop.requested() => Err(NotSent::Stopping),
            sent = outbox.send(out) => sent.map_err(|_| NotSent::PoolGone),
        }
    })
}
