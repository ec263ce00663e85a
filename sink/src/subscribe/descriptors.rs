//! Descriptors subscriptions keep open between batches: each its own few,
//! and beyond those a loan from one pool for the whole sink.

use std::sync::atomic::{AtomicU64, Ordering};

/// Descriptors a subscription may always keep open between batches. It
/// borrows more from [`SharedDescriptors`] while there are any: a
/// subscription that closed and reopened files at every batch spent most
/// of its time doing that (docs/measurements.md). Beyond what it holds,
/// files caught up are closed first, and opened again (and checked) when
/// they grow.
pub(super) const OWN_OPEN_FILES: usize = 64;

/// Descriptors that subscriptions keep open between batches beyond their
/// own, lent from one pool for the whole sink (its `--max-open-files`), so
/// that what many subscriptions of many files hold stays bounded. (While a
/// batch is read, every file it reads from is open too.)
#[derive(Default)]
pub(crate) struct SharedDescriptors {
    limit: usize,
    lent: AtomicU64,
}

impl SharedDescriptors {
    /// A pool of `limit` descriptors, none lent.
    pub(super) fn new(limit: usize) -> Self {
        Self {
            limit,
            lent: AtomicU64::new(0),
        }
    }

    /// Lends up to `wanted`; returns how many it lent.
    pub(super) fn borrow(&self, wanted: usize) -> usize {
        let mut lent = 0;
        let _ = self
            .lent
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                lent = (self.limit as u64).saturating_sub(now).min(wanted as u64);
                (lent > 0).then_some(now + lent)
            });
        lent as usize
    }

    pub(super) fn give_back(&self, count: usize) {
        self.lent.fetch_sub(count as u64, Ordering::AcqRel);
    }
}
