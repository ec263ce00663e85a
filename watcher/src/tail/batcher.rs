//! Handing batches over: when an open batch goes to its sink's
//! connections, and the wait for room in a full outbox that a stop ends.

use super::*;

impl Tailer {
    /// Sends batches whose linger time is up. When nothing is in flight the
    /// link is idle and waiting would only add latency, so a batch goes at
    /// once; under load, acks take a while and the linger gathers rows.
    pub(super) fn flush_due(&mut self, now: Instant) {
        let idle = self.in_flight.is_empty();
        for sink in 0..self.batches.len() {
            if let Some(started) = self.batches[sink].started
                && (idle || now >= started + self.config.linger)
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
        let rows = std::mem::take(&mut batch.rows);
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

pub(super) enum NotSent {
    Stopping,
    PoolGone,
}

/// Hands a batch to a sink's connections. Waiting while the outbox is full
/// is the backpressure that bounds memory, but the room comes from the sink
/// acknowledging: a stop must end that wait, or an unresponsive sink holds
/// the watcher forever.
pub(super) fn hand_over(
    outbox: &mpsc::Sender<Outgoing>,
    out: Outgoing,
    stop: &Stop,
) -> Result<(), NotSent> {
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
