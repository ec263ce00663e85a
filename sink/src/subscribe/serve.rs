//! A subscription's task: it sends batches at the consumer's pace while it
//! takes in the commit feed's rounds, and reads what the manifest holds
//! again when it fell so far behind that the feed dropped rounds for it.

use std::sync::Arc;

use arrow_flight::FlightData;
use flight_server::subscription::{
    ConsumerBatchBuilder, CursorUpdate, encode_batch, schema_message,
};
use tokio::sync::{broadcast, mpsc};

use super::subscription::Subscription;
use crate::blocking::run_blocking;
use crate::error::SinkError;
use crate::feed::{CommitRound, DurableSnapshot};

/// What subscriptions read of the manifest (the sink answers). Blocking.
pub(crate) trait DurableFiles: Clone + Send + Sync + 'static {
    /// Whether the manifest holds files of `source`: asked first, without
    /// the commit gate.
    fn knows_source(&self, source: &str) -> Result<bool, SinkError>;
    /// What the manifest holds of every file, read under the commit gate:
    /// where a subscription starts, and what it reads again after the feed
    /// dropped rounds for it.
    fn durable_files(&self) -> Result<DurableSnapshot, SinkError>;
}

/// A message of a subscription's stream, or the error that ends it (the
/// service says it in gRPC terms).
pub(crate) type Sent = Result<FlightData, SinkError>;

/// Runs one subscription until its consumer goes away, it is done (without
/// `follow`), or the sink stops.
pub(super) async fn serve<S: DurableFiles>(
    mut subscription: Subscription,
    snapshot_sequence: u64,
    mut feed: broadcast::Receiver<Arc<CommitRound>>,
    initial: Option<CursorUpdate>,
    tx: &mpsc::Sender<Sent>,
    sink: &S,
) -> Result<(), SinkError> {
    let internal = SinkError::Internal;
    if tx.send(Ok(schema_message())).await.is_err() {
        return Ok(());
    }
    if let Some(update) = initial {
        let empty = ConsumerBatchBuilder::new(&subscription.ticket.source, 0).finish();
        let message = encode_batch(&empty, &update).map_err(|e| internal(e.to_string()))?;
        if tx.send(Ok(message)).await.is_err() {
            return Ok(());
        }
    }
    let mut seen = snapshot_sequence;
    let follow = subscription.ticket.follow;
    loop {
        // Rounds that came meanwhile are taken in first, so a batch reads
        // as far as is durable. Without `follow` the stream sends what was
        // durable when it started, and ends.
        if follow {
            loop {
                let received = match feed.try_recv() {
                    Err(broadcast::error::TryRecvError::Empty) => break,
                    Ok(round) => Ok(round),
                    Err(broadcast::error::TryRecvError::Lagged(n)) => {
                        Err(broadcast::error::RecvError::Lagged(n))
                    }
                    Err(broadcast::error::TryRecvError::Closed) => {
                        Err(broadcast::error::RecvError::Closed)
                    }
                };
                take_in(&mut subscription, sink, &mut seen, received).await?;
            }
        }
        if subscription.has_news() {
            let (batch, subscription_back) = run_blocking(move || {
                let batch = subscription.next_batch();
                (batch, subscription)
            })
            .await
            .map_err(|e| e.context("reading files for a subscriber"))?;
            subscription = subscription_back;
            if let Some((batch, update)) = batch {
                let message = encode_batch(&batch, &update).map_err(|e| internal(e.to_string()))?;
                // The consumer's pace: a full channel waits here (HTTP/2
                // flow control stops it filling beyond that), while the
                // feed's rounds are still taken in, so that its lag shows.
                loop {
                    tokio::select! {
                        permit = tx.reserve() => {
                            let Ok(permit) = permit else {
                                return Ok(());
                            };
                            permit.send(Ok(message));
                            break;
                        }
                        received = feed.recv(), if follow => {
                            take_in(&mut subscription, sink, &mut seen, received).await?;
                        }
                    }
                }
                continue;
            }
        }
        if !follow {
            return Ok(());
        }
        tokio::select! {
            received = feed.recv() => take_in(&mut subscription, sink, &mut seen, received).await?,
            () = tx.closed() => return Ok(()),
        }
    }
}

/// Takes in what the feed said: a round not seen yet, or, when the feed
/// dropped rounds for this subscriber, what the manifest holds now.
async fn take_in<S: DurableFiles>(
    subscription: &mut Subscription,
    sink: &S,
    seen: &mut u64,
    received: Result<Arc<CommitRound>, broadcast::error::RecvError>,
) -> Result<(), SinkError> {
    match received {
        Ok(round) => {
            if round.sequence > *seen {
                *seen = round.sequence;
                subscription.apply(&round);
            }
            Ok(())
        }
        Err(broadcast::error::RecvError::Lagged(_)) => resync(subscription, sink, seen).await,
        Err(broadcast::error::RecvError::Closed) => Err(SinkError::Shutdown),
    }
}

/// The feed dropped rounds for this subscriber (it was that far behind):
/// what the manifest holds now stands in for them.
async fn resync<S: DurableFiles>(
    subscription: &mut Subscription,
    sink: &S,
    seen: &mut u64,
) -> Result<(), SinkError> {
    let reading = sink.clone();
    let snapshot = run_blocking(move || reading.durable_files())
        .await
        .map_err(|e| e.context("reading the manifest"))??;
    *seen = snapshot.sequence;
    subscription.resync(snapshot.files);
    Ok(())
}
