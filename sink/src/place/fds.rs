//! The descriptor cache: destination files stay open between batches, up
//! to a bound (oldest closed first), within the process's descriptor
//! budget; when descriptors run short, new files awaiting their round are
//! flushed early so that they let theirs go.

use std::collections::VecDeque;
use std::sync::{Arc, Weak};

use super::descriptors::{Descriptors, DescriptorsShort};
use crate::SinkError;
use crate::durability::flush::SyncTarget;
use crate::health::Health;
use crate::lock_order::{Rank, Ranked};
use crate::state::{Slot, lock};

/// The open destination files, and the descriptors they and new files take.
pub(super) struct OpenFiles {
    open_files: Ranked<VecDeque<Arc<Slot>>>,
    max_open_files: usize,
    /// The process's descriptors, which new files awaiting their round hold.
    descriptors: Descriptors,
    /// Slots whose creation left flushes pending (and descriptors held for
    /// them): what is flushed early when descriptors run short.
    awaiting_flush: Ranked<Vec<Weak<Slot>>>,
    /// Poisoned by a failed early flush, as by a round's.
    health: Health,
}

impl OpenFiles {
    pub(super) fn new(max_open_files: usize, health: Health) -> Self {
        let descriptors = Descriptors::of_process();
        // The cache of open files may take at most a quarter of the
        // descriptors (a cached file may hold a second one for direct
        // writes): the rest is for files awaiting their round, the
        // manifest, subscriptions and peers.
        let most_cached = descriptors.limit() / 4;
        if max_open_files > most_cached {
            tracing::warn!(
                max_open_files,
                most_cached,
                "the open-file cache may take at most a quarter of the process's descriptor limit (two per file with direct writes); keeping it to that"
            );
        }
        Self {
            open_files: Ranked::new(Rank::OpenFiles, VecDeque::new()),
            max_open_files: max_open_files.min(most_cached).max(16),
            descriptors,
            awaiting_flush: Ranked::new(Rank::AwaitingFlush, Vec::new()),
            health,
        }
    }

    /// Makes room for a batch to start when most descriptors are held.
    /// Holds no slot's state: called where a batch starts.
    pub(super) fn ease_pressure(&self) -> Result<(), SinkError> {
        if self.descriptors.pressed() {
            // What lately created files hold is let go; the cache is cut;
            // and only while a burst of new files still holds descriptors
            // that rounds will release is there anything to wait for.
            let flushed = self.flush_early()?;
            self.trim_open_files(self.max_open_files / 4, None);
            if flushed > 0 {
                self.descriptors.wait_to_start();
            }
        }
        Ok(())
    }

    /// Keeps the number of cached descriptors bounded: the oldest opened is
    /// closed first (a commit still holding it keeps it open until synced).
    pub(super) fn remember_open(&self, slot: &Arc<Slot>) {
        lock(&self.open_files).push_back(slot.clone());
        self.trim_open_files(self.max_open_files, Some(slot));
    }

    /// Closes cached descriptors, oldest first, down to `keep`. The caller
    /// may hold a slot's lock (`current`'s, or another's), so eviction never
    /// waits for one: a busy slot is skipped and stays open a little longer.
    fn trim_open_files(&self, keep: usize, current: Option<&Arc<Slot>>) {
        let mut open = lock(&self.open_files);
        let mut attempts = open.len();
        while open.len() > keep && attempts > 0 {
            attempts -= 1;
            let Some(evicted) = open.pop_front() else {
                break;
            };
            if current.is_some_and(|slot| Arc::ptr_eq(&evicted, slot)) {
                open.push_back(evicted);
                continue;
            }
            // A file being moved keeps its descriptor: reopening it would
            // have to settle the move.
            let closed = match evicted.state.try_lock() {
                Ok(mut state) if !state.moving => {
                    state.close_file();
                    true
                }
                _ => false,
            };
            if !closed {
                open.push_back(evicted);
            }
        }
    }

    /// Room for one more new destination file, or a retryable refusal:
    /// under pressure the cache of open files is cut to a quarter first (a
    /// row holding `slot`'s lock may ask).
    pub(super) fn take_descriptor(&self, slot: Option<&Arc<Slot>>) -> Result<(), DescriptorsShort> {
        self.descriptors
            .take_one(|| self.trim_open_files(self.max_open_files / 4, slot))
    }

    /// Notes a slot whose new file and directories wait for their round's
    /// flush, holding descriptors until then.
    pub(super) fn awaits_flush(&self, slot: &Arc<Slot>) {
        let mut awaiting = lock(&self.awaiting_flush);
        // Forget the slots flushed since, before the list doubles.
        if awaiting.len() >= 1024 && awaiting.len().is_power_of_two() {
            awaiting.retain(|weak| {
                weak.upgrade()
                    .is_some_and(|slot| !lock(&slot.unsynced).is_empty())
            });
        }
        awaiting.push(Arc::downgrade(slot));
    }

    /// Flushes, ahead of their rounds, what the files created lately still
    /// wait for, and lets go of the descriptors held for it. A round flushes
    /// the same targets before it records those files; flushing them
    /// earlier costs a few fsyncs and is never wrong. Without it, a burst of
    /// new files in many directories holds descriptors up to the limit, and
    /// every batch sent again fails on the next new file before any round
    /// can record (and so flush) the files its earlier attempt created.
    /// Holds no slot's state. A failed flush poisons the sink, as a round's
    /// does.
    fn flush_early(&self) -> Result<usize, SinkError> {
        let slots: Vec<Arc<Slot>> = std::mem::take(&mut *lock(&self.awaiting_flush))
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        let mut flushed = 0usize;
        for slot in &slots {
            let pending: Vec<(u64, SyncTarget)> = lock(&slot.unsynced)
                .iter()
                .map(|pending| (pending.token(), pending.target.clone()))
                .collect();
            for (token, target) in pending {
                if let Err(error) = target.sync() {
                    let reason = format!(
                        "flushing a new file of {:?} early (descriptors ran short): {}",
                        slot.id.key,
                        error.into_detail()
                    );
                    self.health.poison(reason.clone());
                    return Err(SinkError::Storage(reason));
                }
                lock(&slot.unsynced).retain(|p| p.token() != token);
                flushed += 1;
            }
        }
        if flushed > 0 {
            tracing::info!(
                files = slots.len(),
                flushed,
                "descriptors ran short: flushed new files and directories ahead of their rounds"
            );
        }
        Ok(flushed)
    }
}
