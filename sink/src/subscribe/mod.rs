//! Live-tail subscriptions (Flight DoGet): a consumer follows the files of
//! one source as their bytes become durable.
//!
//! Each subscription is a task that owns its position in every file it
//! follows. It learns what became durable from the commit feed (and from
//! the manifest when it starts, or when it fell so far behind that the
//! feed dropped rounds for it) and reads the bytes from the destination
//! files when it sends them: nothing is kept in memory for a consumer, so
//! one that stops reading costs a batch, and simply falls behind. Only
//! bytes below a file's durable contiguous end are sent (read-committed),
//! per file in offset order, never twice in one stream.
//!
//! The parts, each with one job: [`subscription`] is one subscription's
//! state (catch-up from the manifest, live follow of the feed, its
//! batches); [`serve`] its task; [`followed`] one file as it is followed;
//! [`rows`] the rows and bytes of a batch; [`descriptors`] the pool of
//! descriptors kept open between batches; [`stats`] what `status` shows;
//! [`listing`] ListFlights. gRPC statuses are made in `service` only.

mod descriptors;
mod followed;
mod listing;
mod rows;
mod serve;
mod stats;
mod subscription;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use flight_server::subscription::{Globs, Ticket};
use futures::stream::BoxStream;
use tokio::sync::mpsc;

use crate::blocking::run_blocking;
use crate::config::Layout;
use crate::confine::Root;
use crate::error::SinkError;
use crate::feed::FeedHandle;
use crate::state::lock;
use descriptors::SharedDescriptors;
pub(crate) use listing::{Criteria, list_files};
use serve::serve;
pub(crate) use serve::{DurableFiles, Sent};
use stats::SubscriberStats;
pub use stats::SubscriptionStatus;
use subscription::Subscription;

/// Subscriptions served at once; more are refused as unavailable.
pub const MAX_SUBSCRIBERS: usize = 64;

/// What the sink knows of its subscriptions, for `status`.
#[derive(Default)]
pub(crate) struct Subscribers {
    next_id: AtomicU64,
    live: std::sync::Mutex<BTreeMap<u64, Arc<SubscriberStats>>>,
    permits: Option<Arc<tokio::sync::Semaphore>>,
    descriptors: Arc<SharedDescriptors>,
}

impl Subscribers {
    /// `shared_descriptors`: what subscriptions may keep open together
    /// beyond the few each keeps of its own.
    pub fn new(shared_descriptors: usize) -> Self {
        Self {
            permits: Some(Arc::new(tokio::sync::Semaphore::new(MAX_SUBSCRIBERS))),
            descriptors: Arc::new(SharedDescriptors::new(shared_descriptors)),
            ..Self::default()
        }
    }

    pub fn status(&self) -> Vec<SubscriptionStatus> {
        let now = SystemTime::now();
        lock(&self.live)
            .iter()
            .map(|(&id, stats)| stats.status(id, now))
            .collect()
    }
    /// Starts a subscription: the stream of its Flight messages. `manifest`
    /// says what is durable, the files are read under `root`, laid out by
    /// `layout`, and `feed` tells of each commit round.
    pub(crate) async fn open<S: DurableFiles>(
        self: &Arc<Self>,
        manifest: S,
        root: &Arc<Root>,
        layout: Layout,
        feed: &FeedHandle,
        ticket: Ticket,
        peer: String,
    ) -> Result<BoxStream<'static, Sent>, SinkError> {
        let globs = Globs::new(&ticket.source, &ticket.globs).map_err(SinkError::Peer)?;
        // Asked before anything else is read, and without the commit gate.
        let (reading, source) = (manifest.clone(), ticket.source.clone());
        let known = run_blocking(move || reading.knows_source(&source))
            .await
            .map_err(|e| e.context("reading the manifest"))??;
        if !known {
            return Err(SinkError::Peer(format!(
                "source {:?} is unknown to this sink",
                ticket.source
            )));
        }
        let permit = self
            .permits
            .clone()
            .and_then(|permits| permits.try_acquire_owned().ok())
            .ok_or_else(|| {
                SinkError::Storage(format!(
                    "the sink serves its maximum of {MAX_SUBSCRIBERS} subscriptions; retry later"
                ))
            })?;
        // Subscribed before the snapshot is read: no round falls between.
        let feed = feed.subscribe().ok_or(SinkError::Shutdown)?;
        let reading = manifest.clone();
        let snapshot = run_blocking(move || reading.durable_files())
            .await
            .map_err(|e| e.context("reading the manifest"))??;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let stats = Arc::new(SubscriberStats {
            source: ticket.source.clone(),
            globs: ticket.globs.clone(),
            peer,
            sent_bytes: AtomicU64::new(0),
            behind_bytes: AtomicU64::new(0),
            behind_since_us: AtomicU64::new(0),
        });
        let mut subscription = Subscription::new(
            ticket,
            globs,
            root.clone(),
            layout,
            stats.clone(),
            self.descriptors.clone(),
        );
        let initial = subscription.start(snapshot.files)?;
        subscription.update_lag();
        lock(&self.live).insert(id, stats);
        let (tx, rx) = mpsc::channel::<Sent>(2);
        let subscribers = self.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let outcome = serve(
                subscription,
                snapshot.sequence,
                feed,
                initial,
                &tx,
                &manifest,
            )
            .await;
            lock(&subscribers.live).remove(&id);
            if let Err(error) = outcome {
                let _ = tx.send(Err(error)).await;
            }
        });
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }
}
