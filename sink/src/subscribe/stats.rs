//! What each subscription has sent and how far behind it is: shared
//! between its task, which counts, and the sink's `status`, which reads.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use serde::Serialize;

/// One subscription's progress, shared between its task and `status`.
pub(crate) struct SubscriberStats {
    pub(super) source: String,
    pub(super) globs: Vec<String>,
    pub(super) peer: String,
    pub(super) sent_bytes: AtomicU64,
    pub(super) behind_bytes: AtomicU64,
    /// When the oldest durable byte not yet sent became durable (µs since
    /// the epoch; 0 when caught up).
    pub(super) behind_since_us: AtomicU64,
}

/// A subscription as `status` shows it.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct SubscriptionStatus {
    pub id: u64,
    pub peer: String,
    pub source: String,
    pub globs: Vec<String>,
    pub sent_bytes: u64,
    /// Durable bytes of its files not sent to it yet.
    pub behind_bytes: u64,
    /// How long the oldest of those has been durable.
    pub behind_seconds: f64,
}

impl SubscriberStats {
    pub(super) fn status(&self, id: u64, now: SystemTime) -> SubscriptionStatus {
        let since = self.behind_since_us.load(Ordering::Relaxed);
        let behind_seconds = match since {
            0 => 0.0,
            us => now.duration_since(SystemTime::UNIX_EPOCH).map_or(0.0, |d| {
                (d.as_micros() as u64).saturating_sub(us) as f64 / 1e6
            }),
        };
        SubscriptionStatus {
            id,
            peer: self.peer.clone(),
            source: self.source.clone(),
            globs: self.globs.clone(),
            sent_bytes: self.sent_bytes.load(Ordering::Relaxed),
            behind_bytes: self.behind_bytes.load(Ordering::Relaxed),
            behind_seconds,
        }
    }
}
